"""The Django admin for onceonly's events: read them, replay them.

Read-only: nobody adds, changes or deletes an event here (old events go with
``manage.py onceonly_purge``). Who sees what is Django's permissions:

- ``onceonly.view_event``: the list, its filters and search, an event's
  page with its attempts and its payload (redacted as the dashboard does);
- ``onceonly.replay_event``: also the "Replay" action, which puts events
  back in line through the work queue's own statement
  (:func:`onceonly.operations.replay`), never an ORM update.

Superusers have both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..._exceptions import OnceonlyError, PayloadPurged
from ...dashboard.redaction import Redactor
from ...operations import replay
from .conf import database_alias, get_app
from .models import REPLAY_PERMISSION, Attempt, Event

__all__ = ["AttemptInline", "EventAdmin"]

if TYPE_CHECKING:
    _EventAdmin = admin.ModelAdmin[Event]
    _AttemptInline = admin.StackedInline[Attempt, Event]
else:  # Django's admin classes are generic only in its stubs.
    _EventAdmin = admin.ModelAdmin
    _AttemptInline = admin.StackedInline


def _has_perm(request: HttpRequest, codename: str) -> bool:
    # The admin's users have has_perm (it refuses a user model without it);
    # Django's stubs type request.user as the base class, which has not.
    has_perm = getattr(request.user, "has_perm", None)
    return bool(has_perm is not None and has_perm(f"{Event._meta.app_label}.{codename}"))


def _may_view(request: HttpRequest) -> bool:
    # Events are read-only, so change_event (which Django's default reads as
    # "may view too") grants nothing here: viewing needs view_event.
    return _has_perm(request, "view_event")


def _redactor() -> Redactor:
    """The dashboard's rules with the project's fields to hide (``dashboard_redact``)."""
    return Redactor(get_app().dashboard_redact)


class AttemptInline(_AttemptInline):
    """The attempts of the event shown, oldest first: part of what ``view_event`` shows."""

    model = Attempt
    fields = (
        "attempt",
        "outcome",
        "worker",
        "finished_at",
        "error_type",
        "error_message",
        "shown_traceback",
    )
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    verbose_name_plural = "attempts"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Attempt]:
        return super().get_queryset(request).using(database_alias())

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _may_view(request)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="traceback")
    def shown_traceback(self, attempt: Attempt) -> str:
        if not attempt.traceback:
            return "-"
        return format_html("<pre>{}</pre>", attempt.traceback)


@admin.register(Event)
class EventAdmin(_EventAdmin):
    list_display = (
        "id",
        "provider",
        "event_id",
        "event_type",
        "status",
        "attempts",
        "received_at",
        "processed_at",
    )
    list_display_links = ("id", "event_id")
    list_filter = ("provider", "status", "event_type")
    # The search box; what it matches is get_search_results'.
    search_fields = ("event_id",)
    search_help_text = "An event id as the provider sent it, PROVIDER:EVENT_ID, or a row id."
    # One count per page, not two: the table is the whole inbox.
    show_full_result_count = False
    list_per_page = 50
    actions = ("replay_events",)
    inlines = (AttemptInline,)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("provider", "event_id"),
                    ("event_type", "status"),
                    ("attempts", "lease_owner"),
                    ("received_at", "processed_at"),
                    "handler",
                    "last_error",
                    ("duplicates", "last_duplicate_at"),
                )
            },
        ),
        ("Payload", {"fields": ("payload_purged_at", "shown_headers", "shown_body")}),
    )
    readonly_fields = ("shown_headers", "shown_body")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Event]:
        # onceonly's database, whatever the project's routers say.
        return super().get_queryset(request).using(database_alias())

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Event], search_term: str
    ) -> tuple[QuerySet[Event], bool]:
        # Exact matches: an event id is looked up, not browsed, and an exact
        # match on (provider, event_id) uses the unique index.
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(event_id=term)
        provider, sep, event_id = term.partition(":")
        if sep and provider and event_id:
            match |= Q(provider=provider, event_id=event_id)
        if term.isdigit() and len(term) < 19:  # within BIGINT
            match |= Q(pk=int(term))
        return queryset.filter(match), False

    # Read-only for everyone, superusers included.

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _may_view(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_replay_permission(self, request: HttpRequest) -> bool:
        """Who gets the Replay action (the admin looks this method up by name)."""
        return _has_perm(request, REPLAY_PERMISSION)

    # The payload, never shown raw.

    @admin.display(description="headers")
    def shown_headers(self, event: Event) -> SafeString | str:
        headers = event.headers if isinstance(event.headers, dict) else {}
        if not headers:
            return "-"
        return format_html_join(
            "\n",
            "<div><code>{}</code>: {}</div>",
            ((h.name, h.value) for h in _redactor().headers(headers)),
        )

    @admin.display(description="body")
    def shown_body(self, event: Event) -> SafeString | str:
        if event.payload_purged_at is not None:
            return "(purged with onceonly purge)"
        headers = event.headers if isinstance(event.headers, dict) else {}
        content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), None)
        raw = None if event.body is None else bytes(event.body)
        shown = _redactor().body(raw, content_type)
        if shown.kind == "empty":
            return "(empty)"
        note = f"{shown.redacted} value(s) hidden" if shown.redacted else ""
        if shown.kind == "binary":
            note = "binary, shown as base64"
        return format_html("<pre>{}</pre>{}", shown.text, note)

    # The one write.

    @admin.action(description="Replay the selected events", permissions=["replay"])
    def replay_events(self, request: HttpRequest, queryset: QuerySet[Event]) -> None:
        """Put the selected finished events back in line, each in its own
        transaction of the work queue's replay statement: a failed, dead or
        processed event goes back to pending with its attempt count reset (its
        attempt history stays); a pending or processing one is already in line;
        one whose payload was purged cannot run again."""
        app = get_app()
        requeued: list[int] = []
        in_line: list[int] = []
        purged: list[int] = []
        try:
            for pk in list(queryset.order_by("id").values_list("id", flat=True)):
                try:
                    done = replay(app.engine, app.engine_kind, id=pk)
                except PayloadPurged:
                    purged.append(pk)
                    continue
                (requeued if done else in_line).append(pk)
        except OnceonlyError as exc:  # the database went away mid-way
            self.message_user(
                request, f"Replay stopped after {len(requeued)} event(s): {exc}", messages.ERROR
            )
            return
        self.message_user(
            request,
            f"Requeued {len(requeued)} event(s){_ids(requeued)}.",
            messages.SUCCESS if requeued else messages.WARNING,
        )
        if purged:
            self.message_user(
                request,
                f"Could not replay {len(purged)} event(s) whose payload was purged{_ids(purged)}.",
                messages.WARNING,
            )
        if in_line:
            self.message_user(
                request,
                f"{len(in_line)} event(s) already in line (pending or processing){_ids(in_line)}.",
                messages.INFO,
            )


def _ids(pks: list[int], shown: int = 20) -> str:
    if not pks:
        return ""
    more = f" and {len(pks) - shown} more" if len(pks) > shown else ""
    return ": " + ", ".join(str(pk) for pk in pks[:shown]) + more
