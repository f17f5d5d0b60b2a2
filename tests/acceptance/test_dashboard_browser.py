"""The dashboard in real headless Chromium, against ``onceonly serve --worker``.

An event whose handler fails until a marker file exists goes dead; the
operator signs in with the token, finds it, sees why it failed, "deploys the
fix" (creates the marker), presses Replay and watches it become processed.
Without the token the dashboard refuses, in the browser and to plain HTTP.

Debian's ``chromium`` and ``chromium-driver`` drive it. Where they are
missing these tests are skipped with a reason that says how to run them, and
the run's summary says so again; CI sets ``ONCEONLY_TEST_REQUIRE_BROWSER=1``
(and installs them), which makes a missing browser a failure.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from support import (
    CHROMEDRIVER,
    CHROMIUM,
    REQUIRE_BROWSER,
    STRIPE_SECRET,
    Server,
    browser_missing,
    stripe_delivery,
)

APP = """
import os
from pathlib import Path

from onceonly import Onceonly

# Two attempts, retried at once: the event is dead within a second.
app = Onceonly(max_attempts=2, retry_base=0.05, retry_cap=0.1)


@app.handler("stripe")
def settle(event, ctx):
    if not Path(os.environ["LEDGER_MARKER"]).exists():
        raise RuntimeError("ledger closed: the fix is not deployed yet")
"""

# A payload written by an attacker: markup that must show as text, a card
# number the operator configured as redacted.
HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
CARD = "4242424242424242"


def _executable(path: str) -> str:
    found = shutil.which(path)
    if found is None:
        reason = browser_missing() or f"{path} not found"
        if REQUIRE_BROWSER:
            pytest.fail(f"{reason}; ONCEONLY_TEST_REQUIRE_BROWSER is set, so this fails")
        pytest.skip(reason)
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = _executable(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(_executable(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def token() -> str:
    return secrets.token_urlsafe(24)


@pytest.fixture
def served(database_url: str, tmp_path: Path, token: str) -> Iterator[tuple[Server, Path]]:
    (tmp_path / "ledger_app.py").write_text(APP)
    marker = tmp_path / "fix-deployed"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")},
        "ONCEONLY_DATABASE_URL": database_url,
        "ONCEONLY_STRIPE_SECRET": STRIPE_SECRET,
        "ONCEONLY_DASHBOARD_TOKEN": token,
        "ONCEONLY_DASHBOARD_REDACT": "data.card.number",
        "LEDGER_MARKER": str(marker),
    }
    server = Server(env, tmp_path, "--app", "ledger_app:app", "--worker")
    try:
        yield server, marker
    finally:
        server.stop()


def _wait_dead(url: str, token: str, event_id: str) -> int:
    """Poll the JSON endpoint (as a script would) until the worker gave up."""
    deadline = time.monotonic() + 20
    with httpx.Client(headers={"authorization": f"Bearer {token}"}) as client:
        while time.monotonic() < deadline:
            rows = client.get(f"{url}/dashboard/api/events", params={"status": "dead"}).json()
            for row in rows:
                if row["event_id"] == event_id:
                    return int(row["id"])
            time.sleep(0.1)
    raise AssertionError(f"{event_id} never went dead")


def test_replay_a_dead_event_from_the_browser(
    browser: WebDriver, served: tuple[Server, Path], token: str
) -> None:
    server, marker = served
    body, headers = stripe_delivery(
        "evt_dashboard_1",
        extra={"note": HOSTILE, "card": {"number": CARD}, "object": {"id": "pi_dashboard"}},
    )
    assert httpx.post(f"{server.url}/webhooks/stripe", content=body, headers=headers).is_success
    pk = _wait_dead(server.url, token, "evt_dashboard_1")
    wait = WebDriverWait(browser, 15)
    browser.delete_all_cookies()

    # Sign in: the first page is the login form, not the dashboard.
    browser.get(f"{server.url}/dashboard/")
    token_field = wait.until(ec.presence_of_element_located((By.ID, "token")))
    assert "evt_dashboard_1" not in browser.page_source
    token_field.send_keys(token)
    browser.find_element(By.ID, "sign-in").click()

    # The overview lists the dead event; open it.
    dead_table = wait.until(ec.presence_of_element_located((By.ID, "dead-events")))
    _check_the_chart(browser)
    dead_table.find_element(By.LINK_TEXT, "evt_dashboard_1").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "event-status"), "dead"))
    assert browser.current_url.endswith(f"/dashboard/events/{pk}")
    assert "ledger closed" in browser.find_element(By.ID, "event-last-error").text
    attempts = browser.find_elements(By.CSS_SELECTOR, "#attempts tbody tr")
    assert len(attempts) == 2
    # The hostile payload is text on the page, and it did not run.
    assert "<script>document.title='pwned'</script>" in browser.find_element(By.ID, "payload").text
    assert browser.title != "pwned"
    assert CARD not in browser.page_source
    signature = browser.find_element(By.XPATH, "//table[@id='headers']//tr[th='stripe-signature']")
    assert "[redacted]" in signature.text

    # Deploy the fix, replay, and watch the page follow the worker.
    marker.touch()
    browser.find_element(By.CSS_SELECTOR, "#replay-box button[data-replay]").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "notice"), "Put back in line"))
    wait.until(ec.text_to_be_present_in_element((By.ID, "event-status"), "processed"))
    assert not browser.find_element(By.ID, "replay-box").is_displayed()
    _check_the_search(browser, wait)

    # Live counts: a new delivery shows up on the open overview without a reload.
    browser.get(f"{server.url}/dashboard/")
    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, '[data-count="*|total"]'), "1"))
    assert browser.find_element(By.CSS_SELECTOR, '[data-count="*|dead"]').text == "0"
    assert browser.find_elements(By.ID, "no-dead")
    body2, headers2 = stripe_delivery("evt_dashboard_2")
    assert httpx.post(f"{server.url}/webhooks/stripe", content=body2, headers=headers2).is_success
    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, '[data-count="*|total"]'), "2"))

    # Signed out (no cookie), the event page is the login form again.
    browser.delete_all_cookies()
    browser.get(f"{server.url}/dashboard/events/{pk}")
    wait.until(ec.presence_of_element_located((By.ID, "token")))
    assert "evt_dashboard_1" not in browser.page_source
    browser.find_element(By.ID, "token").send_keys("not-the-token-at-all")
    browser.find_element(By.ID, "sign-in").click()
    wait.until(ec.presence_of_element_located((By.ID, "login-error")))
    assert "evt_dashboard_1" not in browser.page_source


def _check_the_search(browser: WebDriver, wait: WebDriverWait[WebDriver]) -> None:
    """From the event page: its object id links to every event about that
    payment, and the search box finds it too."""
    browser.find_element(By.CSS_SELECTOR, "#event-object a").click()
    wait.until(ec.presence_of_element_located((By.ID, "events")))
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#events a.event-link")] == [
        "evt_dashboard_1"
    ]
    search = browser.find_element(By.ID, "object-search")
    search.clear()
    search.send_keys("pi_nobody", Keys.ENTER)
    wait.until(ec.presence_of_element_located((By.ID, "no-match")))


# What the browser made of the chart, read in one round trip: the points as
# it parsed them, the stroke the stylesheet gave each line, the drawn width.
_CHART = """
const svg = document.getElementById("activity-chart");
const lines = {};
for (const line of svg.querySelectorAll("polyline")) {
  const ys = [];
  for (let i = 0; i < line.points.numberOfItems; i++) ys.push(line.points.getItem(i).y);
  lines[line.dataset.series] = {
    ys: ys, stroke: getComputedStyle(line).stroke, width: line.getBBox().width,
  };
}
return {
  width: svg.getBoundingClientRect().width,
  title: svg.querySelector("title").textContent,
  baseline: svg.querySelector("line.axis").y1.baseVal.value,
  lines: lines,
  rows: document.querySelectorAll("#activity-table tbody tr").length,
};
"""


def _check_the_chart(browser: WebDriver) -> None:
    """The overview draws the activity chart: one point per minute of the
    default hour in each line, styled by the stylesheet (the CSP forbids
    inline styles), the received and failed lines off the baseline."""
    chart = browser.execute_script(_CHART)
    assert chart["width"] > 300
    assert chart["title"] == "Events per minute"
    lines = chart["lines"]
    assert set(lines) == {"received", "duplicates", "processed", "failed"}
    baseline = chart["baseline"]
    for name, line in lines.items():
        assert len(line["ys"]) == 60, name
        assert line["stroke"] not in ("none", ""), name
        assert line["width"] > 300, name
    # The delivery, and its two failed attempts (it went dead), rise off the
    # axis; the quiet minutes sit on it.
    for name in ("received", "failed"):
        assert min(lines[name]["ys"]) < baseline, name
        assert max(lines[name]["ys"]) == baseline, name
    assert set(lines["processed"]["ys"]) == {baseline}
    # The table fallback holds the same minutes.
    assert chart["rows"] == 60


def test_without_the_token_the_dashboard_refuses(served: tuple[Server, Path], token: str) -> None:
    server, _ = served
    body, headers = stripe_delivery("evt_dashboard_secret")
    httpx.post(f"{server.url}/webhooks/stripe", content=body, headers=headers)
    pk = _wait_dead(server.url, token, "evt_dashboard_secret")
    base = f"{server.url}/dashboard"
    with httpx.Client() as anonymous:
        for path in ("/", "/events", f"/events/{pk}", "/api/counts", f"/api/events/{pk}"):
            response = anonymous.get(base + path)
            assert response.status_code == 401, path
            assert "evt_dashboard_secret" not in response.text
        wrong = {"authorization": "Bearer " + token[:-1] + ("x" if token[-1] != "x" else "y")}
        assert anonymous.get(f"{base}/api/counts", headers=wrong).status_code == 401
        assert anonymous.post(f"{base}/events/{pk}/replay").status_code == 401
        assert anonymous.post(f"{base}/replay-dead").status_code == 401
    # The cookie holds a MAC of the token, not the token: the token itself is no cookie.
    with httpx.Client(cookies={"onceonly_dashboard": token}) as forged:
        assert forged.get(f"{base}/").status_code == 401
    with httpx.Client() as anonymous:
        # The event stayed dead: nothing was replayed.
        ok = {"authorization": f"Bearer {token}"}
        assert anonymous.get(f"{base}/api/events/{pk}", headers=ok).json()["status"] == "dead"
