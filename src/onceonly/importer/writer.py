"""Writing a batch: the importer's policy over the store's bulk upsert.

The database decides what is new, what changed and what stays as it is (one
upsert per batch, :mod:`onceonly.store.bulk`); this module decides what to do
when it refuses a batch: write it again one row at a time, each row in its own
savepoint, so only the refused rows are left out, each with the database's own
reason, and stop where the refusals go over what the import allows.

A batch is its own transaction (or, when the whole import is one
transaction, a savepoint in it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .._exceptions import StoreRejected
from ..store.bulk import Outcome, Refused, UpsertSession

__all__ = ["BatchResult", "Writer"]

Row = Sequence[object]


@dataclass
class BatchResult:
    """What one batch did. `rejected` holds (index in the batch, reason);
    `stopped_at` is the index of the row at which the rejections went over
    what was allowed (that row and the ones after it were not written)."""

    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)
    stopped_at: int | None = None

    def count(self, outcome: Outcome) -> None:
        if outcome is Outcome.INSERTED:
            self.inserted += 1
        elif outcome is Outcome.UPDATED:
            self.updated += 1
        else:
            self.unchanged += 1


class Writer:
    """Upserts batches through one store session (:class:`UpsertSession`).

    Life cycle: :meth:`write` and :meth:`commit` as often as needed, then
    :meth:`close`, which rolls back whatever was not committed.
    """

    def __init__(self, session: UpsertSession) -> None:
        self.session = session
        # Whether batches come with their rows as text too (made while reading),
        # and whether writing them in a thread of their own pays.
        self.row_text: Callable[[Sequence[object]], str] | None = session.row_text
        self.threaded = session.threaded

    def write(
        self,
        rows: Sequence[Row],
        allowed: int,
        skipped_before: Sequence[int] | None = None,
        text: str | None = None,
    ) -> BatchResult:
        """Upsert `rows` (values in plan column order, keys unique within the
        batch; `text` the same rows as `row_text` made them, when wanted).

        Rows the database refuses are left out, as long as the rejections stay
        within `allowed`; `skipped_before[i]` counts rows rejected before
        they got here that come before row i in the file (they count too).
        Once the count goes over, the batch stops there (`stopped_at`)."""
        try:
            counts = self.session.write_batch(rows, text)
        except StoreRejected:
            return self._write_rows(rows, allowed, skipped_before)
        return BatchResult(
            inserted=counts.inserted, updated=counts.updated, unchanged=counts.unchanged
        )

    def _write_rows(
        self, rows: Sequence[Row], allowed: int, skipped_before: Sequence[int] | None
    ) -> BatchResult:
        result = BatchResult()
        for i, row in enumerate(rows):
            earlier = len(result.rejected) + (skipped_before[i] if skipped_before else 0)
            if earlier > allowed:
                result.stopped_at = i
                break
            outcome = self.session.write_row(row)
            if isinstance(outcome, Refused):
                result.rejected.append((i, outcome.reason))
                if earlier + 1 > allowed:
                    result.stopped_at = i
                    break
                continue
            result.count(outcome)
        return result

    def commit(self) -> None:
        self.session.commit()

    def rollback(self) -> None:
        self.session.rollback()

    def close(self) -> None:
        """Roll back what was not committed; the session gives its connection back."""
        self.session.close()
