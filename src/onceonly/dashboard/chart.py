"""The activity charts' geometry: per-minute figures turned into SVG coordinates.

Drawn on the server as inline SVG (the template writes the elements): no
script library to ship, nothing for the Content-Security-Policy to allow,
and the page shows its chart even with scripts off. Colours come from the
stylesheet by class, never from a ``style`` attribute (which the policy
refuses).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..store.activity import MinuteActivity

__all__ = ["Chart", "Series", "activity_charts", "nice_ceiling"]

WIDTH = 720
HEIGHT = 180
#: Room for the axis labels around the plot.
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 10, 22


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a chart."""

    name: str
    label: str
    #: SVG ``points``: ``"x,y x,y ..."``, one pair per minute that has a value.
    points: str
    #: The (x, y) of each pair, for dots where a line alone would not show.
    dots: tuple[tuple[float, float], ...]

    @property
    def count(self) -> int:
        return len(self.dots)


@dataclass(frozen=True, slots=True)
class Chart:
    """One chart: its lines, its scale and what a screen reader says of it."""

    id: str
    title: str
    description: str
    series: tuple[Series, ...]
    #: The top of the value axis, as written on it.
    y_max: str
    #: The first and last minutes (``HH:MM`` UTC), under the time axis.
    x_first: str
    x_last: str
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    top: int = TOP
    right: int = WIDTH - RIGHT
    bottom: int = HEIGHT - BOTTOM


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten at or above `value` (1 for 0)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power * (1 + 1e-9):
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop ends at 10


def _label(value: float) -> str:
    return f"{value:g}"


def _series(
    minutes: Sequence[MinuteActivity],
    name: str,
    label: str,
    value: Callable[[MinuteActivity], float | None],
    scale: float,
) -> Series:
    span = WIDTH - RIGHT - LEFT
    height = HEIGHT - BOTTOM - TOP
    step = span / (len(minutes) - 1) if len(minutes) > 1 else 0.0
    dots = []
    for i, minute in enumerate(minutes):
        v = value(minute)
        if v is None:
            continue
        x = LEFT + (i * step if len(minutes) > 1 else span / 2)
        y = TOP + height - (v / scale) * height
        dots.append((round(x, 1), round(y, 1)))
    return Series(name, label, " ".join(f"{x:g},{y:g}" for x, y in dots), tuple(dots))


def activity_charts(minutes: Sequence[MinuteActivity]) -> tuple[Chart, Chart]:
    """The events chart (received, duplicates, processed, failed per minute)
    and the lag chart (median and largest seconds to processing)."""
    if not minutes:
        raise ValueError("a chart needs at least one minute")
    first = minutes[0].start.strftime("%H:%M")
    last = minutes[-1].start.strftime("%H:%M")
    top = nice_ceiling(max(max(m.received, m.processed, m.duplicates, m.failed) for m in minutes))
    counts = Chart(
        id="activity-chart",
        title="Events per minute",
        description=(
            f"Received, duplicated, processed and failed events per minute, {first} to"
            f" {last} UTC; the table below holds the same figures."
        ),
        series=(
            _series(minutes, "received", "received", lambda m: m.received, top),
            _series(minutes, "duplicates", "duplicated*", lambda m: m.duplicates, top),
            _series(minutes, "processed", "processed", lambda m: m.processed, top),
            _series(minutes, "failed", "failed attempts", lambda m: m.failed, top),
        ),
        y_max=_label(top),
        x_first=first,
        x_last=last,
    )
    lag_top = nice_ceiling(max((m.lag_max or 0.0) for m in minutes))
    lag = Chart(
        id="lag-chart",
        title="Processing lag (seconds)",
        description=(
            f"Median and largest seconds from receipt to processing of the events"
            f" processed in each minute, {first} to {last} UTC; minutes without a"
            " processed event have no point."
        ),
        series=(
            _series(minutes, "lag-p50", "median", lambda m: m.lag_p50, lag_top),
            _series(minutes, "lag-max", "largest", lambda m: m.lag_max, lag_top),
        ),
        y_max=_label(lag_top) + " s",
        x_first=first,
        x_last=last,
    )
    return counts, lag
