"""The activity charts' geometry (onceonly.dashboard.chart): no I/O."""

from __future__ import annotations

import pytest

from onceonly.dashboard.chart import (
    BOTTOM,
    HEIGHT,
    LEFT,
    RIGHT,
    TOP,
    WIDTH,
    activity_charts,
    nice_ceiling,
)
from onceonly.store.activity import MinuteActivity

BASELINE = HEIGHT - BOTTOM


def minute(
    n: int, received: int = 0, processed: int = 0, lag: float | None = None
) -> MinuteActivity:
    return MinuteActivity(
        minute=29_000_000 + n,
        received=received,
        processed=processed,
        duplicates=0,
        failed=0,
        lag_p50=lag,
        lag_max=None if lag is None else lag * 2,
    )


def pairs(points: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in (p.split(",") for p in points.split())]


@pytest.mark.parametrize(
    ("value", "ceiling"),
    [(0, 1), (1, 1), (3, 5), (7, 10), (10, 10), (11, 20), (0.3, 0.5), (420, 500)],
)
def test_the_scale_tops_at_one_two_or_five_times_a_power_of_ten(
    value: float, ceiling: float
) -> None:
    assert nice_ceiling(value) == pytest.approx(ceiling)


def test_one_point_per_minute_from_the_left_edge_to_the_right_on_a_shared_scale() -> None:
    counts, lag = activity_charts(
        [minute(0, received=4), minute(1), minute(2, processed=2, lag=1.5)]
    )
    lines = {s.name: pairs(s.points) for s in counts.series}
    assert [s.count for s in counts.series] == [3, 3, 3, 3]
    assert [x for x, _ in lines["received"]] == [
        LEFT,
        LEFT + (WIDTH - RIGHT - LEFT) / 2,
        WIDTH - RIGHT,
    ]
    # 4 is the top of the scale (a nice ceiling of 4 is 5): 4/5 of the height.
    assert counts.y_max == "5"
    assert lines["received"][0][1] == pytest.approx(BASELINE - 0.8 * (BASELINE - TOP), abs=0.1)
    assert lines["received"][1][1] == BASELINE
    assert lines["processed"][2][1] == pytest.approx(BASELINE - 0.4 * (BASELINE - TOP), abs=0.1)
    # The lag has points only where something was processed.
    assert [s.count for s in lag.series] == [1, 1]
    assert lag.y_max == "5 s"
    assert counts.x_first == "21:20"
    assert "21:20 to 21:22 UTC" in counts.description


def test_a_quiet_window_lies_on_the_axis_and_one_minute_sits_in_the_middle() -> None:
    (counts, _) = activity_charts([minute(0)])
    (only,) = pairs(counts.series[0].points)
    assert only == (LEFT + (WIDTH - RIGHT - LEFT) / 2, BASELINE)
    with pytest.raises(ValueError, match="at least one minute"):
        activity_charts([])
