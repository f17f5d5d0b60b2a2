// onceonly dashboard: live counts and live event status.
// Everything written into the page goes through textContent, never innerHTML:
// the values come from webhook senders.
"use strict";

(function () {
  const body = document.body;
  const base = body.dataset.base || "";
  const every = 2000;
  const live = document.getElementById("live");

  function mark(ok) {
    if (!live) return;
    live.hidden = false;
    live.textContent = ok ? "live" : "offline";
    live.className = ok ? "live" : "live offline";
  }

  async function getJSON(path) {
    const response = await fetch(base + path, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
      cache: "no-store",
    });
    if (!response.ok) throw new Error(String(response.status));
    return response.json();
  }

  function setCount(key, value) {
    document.querySelectorAll('[data-count="' + CSS.escape(key) + '"]').forEach(function (el) {
      el.textContent = String(value);
    });
  }

  async function refreshCounts() {
    try {
      const counts = await getJSON("/api/counts");
      setCount("*|total", counts.total);
      Object.entries(counts.by_status).forEach(function ([status, n]) {
        setCount("*|" + status, n);
      });
      Object.entries(counts.by_provider).forEach(function ([provider, statuses]) {
        Object.entries(statuses).forEach(function ([status, n]) {
          setCount(provider + "|" + status, n);
        });
      });
      if (counts.duplicates) {
        setCount("*|duplicates", counts.duplicates.total);
        Object.entries(counts.duplicates.by_provider).forEach(function ([provider, n]) {
          setCount(provider + "|duplicates", n);
        });
      }
      mark(true);
    } catch (e) {
      mark(false);
    }
  }

  async function refreshEvent(id) {
    try {
      const event = await getJSON("/api/events/" + encodeURIComponent(id));
      const status = document.getElementById("event-status");
      if (status) {
        status.textContent = event.status;
        status.className = "status status-" + event.status;
      }
      const fields = {
        "event-attempts": String(event.attempts),
        "event-last-error": event.last_error || "-",
        "event-processed-at": event.processed_at || "-",
      };
      Object.entries(fields).forEach(function ([elementId, text]) {
        const el = document.getElementById(elementId);
        if (el) el.textContent = text;
      });
      const replay = document.getElementById("replay-box");
      if (replay) replay.hidden = !event.replayable;
      mark(true);
    } catch (e) {
      mark(false);
    }
  }

  function poll(fn) {
    fn();
    setInterval(function () {
      if (!document.hidden) fn();
    }, every);
  }

  if (body.dataset.liveCounts) poll(refreshCounts);
  if (body.dataset.event) {
    const id = body.dataset.event;
    poll(function () {
      return refreshEvent(id);
    });
  }
})();
