"""``onceonly demo``: the Friday-evening incident, naive endpoint versus onceonly."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from .._click import FORMAT
from ..dev.delivery import DeliveryStats
from .incident import Incident, IncidentResult, run_incident

__all__ = ["demo_command"]

#: What a run writes in its directory.
_OUTPUTS = {"naive.db", "onceonly.db", "outbox-naive.jsonl", "outbox-onceonly.jsonl"}

_ROWS = [
    ("payments recorded", "payments_recorded"),
    ("access released", "access_released"),
    ("e-mails sent", "emails_sent"),
    ("customers charged twice", "customers_charged_twice"),
]


@click.command("demo")
@click.option(
    "--events",
    default=300,
    show_default=True,
    type=click.IntRange(10, 5000),
    help="Payments the gateway delivers to each side.",
)
@click.option(
    "--seed",
    default=2024,
    show_default=True,
    type=int,
    help="Same seed, same bad day (which events hit which trouble).",
)
@FORMAT
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    help="Work in this directory and keep it (the two SQLite files, the mail outboxes). "
    "Without it a temporary directory is used and removed.",
)
def demo_command(events: int, seed: int, fmt: str, keep: Path | None) -> None:
    """Watch one evening of webhooks double a naive shop, and not onceonly.

    A simulated Stripe gateway delivers the same payments, with the same bad
    day, first to an endpoint written the way most are (record the payment,
    release access, send the receipt, all inside the request), then to
    onceonly's receiver and worker. The bad day: the mail provider is slow for
    a few receipts (the gateway times out and sends again), the gateway sends
    some events twice at once, and the proxy in front answers 502 after the
    app committed. Stripe's retry schedule is sped up; the servers are real,
    on loopback, and the table is counted from each side's tables and mail
    outbox afterwards.

    \b
    Examples:
      onceonly demo
      onceonly demo --events 1000 --seed 7
      onceonly demo --format json | jq .naive.customers_charged_twice
      onceonly demo --keep ./demo-run     # keep the databases to look at
    """
    incident = Incident(events=events, seed=seed)
    show_progress = fmt == "table"
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        earlier = sorted(p.name for p in keep.iterdir() if p.name in _OUTPUTS)
        if earlier:
            # Counting on top of an earlier run's rows would be a lie.
            raise click.UsageError(
                f"{keep} already holds a demo run ({', '.join(earlier)}): choose an empty directory"
            )
        result = _run(incident, keep, show_progress)
    else:
        with tempfile.TemporaryDirectory(prefix="onceonly-demo-") as tmp:
            result = _run(incident, Path(tmp), show_progress)
    if fmt == "json":
        data = result.to_dict()
        if keep is not None:
            data["kept"] = str(keep.resolve())
        click.echo(json.dumps(data, indent=2))
        return
    _print_table(result, keep)


def _run(incident: Incident, workdir: Path, show_progress: bool) -> IncidentResult:
    if not show_progress:
        return run_incident(incident, workdir)
    errors = Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description:<8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        console=errors,
    )
    tasks = {
        side: progress.add_task(label, total=incident.events, detail="", start=False)
        for side, label in (("naive", "naive"), ("onceonly", "onceonly"))
    }
    last = 0.0

    def update(side: str, phase: str, stats: DeliveryStats) -> None:
        nonlocal last
        now = time.monotonic()
        if phase == "delivering" and now - last < 0.1 and stats.finished < incident.events:
            return  # redrawing on every answer costs more than it shows
        last = now
        task = tasks[side]
        progress.start_task(task)
        detail = (
            f"{stats.requests} sent, {stats.retries} resent, {stats.timeouts} timed out, "
            f"{stats.statuses.get(502, 0)} got 502"
        )
        if stats.duplicates_answered:
            detail += f", {stats.duplicates_answered} dup"
        if phase != "delivering":
            detail += f" ({phase})"
        progress.update(task, completed=stats.acknowledged, detail=detail)

    with progress:
        return run_incident(incident, workdir, update)


def _print_table(result: IncidentResult, keep: Path | None) -> None:
    console = Console()
    incident = result.incident
    naive, protected = result.naive, result.onceonly
    table = Table(
        title=f"One evening, {incident.events} payments, the same bad day for both",
        title_justify="left",
    )
    table.add_column("")
    table.add_column("naive endpoint", justify="right")
    table.add_column("onceonly", justify="right")
    table.add_row("payments made at the gateway", str(incident.events), str(incident.events))
    table.add_row(
        "deliveries sent (with resends)",
        str(naive.deliveries.requests),
        str(protected.deliveries.requests),
    )
    for label, key in _ROWS:
        cells = []
        for side in (naive, protected):
            value = side.state[key]
            expected = 0 if key == "customers_charged_twice" else incident.events
            colour = "green" if value == expected else "red"
            cells.append(f"[{colour}]{value}[/{colour}]")
        table.add_row(label, *cells)
    console.print(table)
    console.print(
        f"The bad day: {result.slow_receipts} slow receipts (the gateway timed out and sent "
        f"again), {result.bad_gateway_events} events answered 502 by the proxy after the "
        f"commit, {naive.deliveries.concurrent_copies} sent twice at the same moment; "
        "Stripe's retry schedule sped up. Counted from each side's tables and mail outbox."
    )
    console.print(
        f"onceonly answered {protected.deliveries.duplicates_answered} resends as duplicates "
        "and its worker ran each payment once. "
        f"Took {result.seconds:.1f} s."
    )
    if keep is not None:
        console.print(f"Files kept in {keep.resolve()}")
    if sys.stdout.isatty():
        console.print("Next: README.md, 'Handle each event once'.")
