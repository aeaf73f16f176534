"""The dashboard's recent past: the bounded ring of samples and the chart geometry."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.admin.history import (
    History,
    Sample,
    attach_delta,
    chart,
    charts,
    utilisation,
    waiting_count,
)


def _points(text: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in (p.split(",") for p in text.split())]


def test_the_ring_keeps_one_window_and_is_bounded() -> None:
    history = History(window_s=60, interval_s=10)
    for second in range(0, 300, 10):
        history.add(Sample(at=float(second)))
    kept = [s.at for s in history.samples()]
    assert kept == [230.0, 240.0, 250.0, 260.0, 270.0, 280.0, 290.0]
    # Many samples at once (a stalled loop catching up) stay within the bound too.
    for _ in range(100):
        history.add(Sample(at=290.0))
    assert len(history) == 60 // 10 + 1


def test_a_clock_stepped_back_drops_the_samples_from_the_future() -> None:
    history = History(window_s=60, interval_s=10)
    for at in (100.0, 110.0, 120.0):
        history.add(Sample(at=at))
    history.add(Sample(at=105.0))
    assert [s.at for s in history.samples()] == [100.0, 105.0]


@pytest.mark.parametrize(("window", "interval"), [(0, 1), (10, 0), (5, 10), (10, -1)])
def test_a_bad_window_or_interval_is_refused(window: float, interval: float) -> None:
    with pytest.raises(ValueError, match="history window"):
        History(window_s=window, interval_s=interval)


values = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-10, max_value=1e6),
)


@given(
    st.lists(st.tuples(st.floats(min_value=-100, max_value=4000), values), max_size=50),
    st.sampled_from([None, 1.0, 100.0]),
)
def test_every_point_lies_in_the_box_and_time_runs_left_to_right(
    series: list[tuple[float, float | None]], ceiling: float | None
) -> None:
    ordered = sorted(series, key=lambda p: p[0])
    drawn = chart(ordered, now=3600.0, window_s=3600.0, width=240, height=48, ceiling=ceiling)
    points = _points(drawn.points)
    kept = [v for t, v in ordered if v is not None and math.isfinite(v) and 0.0 <= t <= 3600.0]
    assert len(points) == len(kept)
    assert all(0 <= x <= 240 and 0 <= y <= 48 for x, y in points)
    assert [x for x, _ in points] == sorted(x for x, _ in points)
    if kept:
        assert drawn.latest == max(0.0, kept[-1]) and drawn.peak == max(max(kept), 0.0)
    else:
        assert drawn.points == "" and drawn.latest is None and drawn.peak is None


def test_values_scale_to_the_peak_or_the_ceiling() -> None:
    drawn = chart([(0.0, 0.0), (50.0, 2.0), (100.0, 4.0)], now=100.0, window_s=100.0, width=100)
    assert _points(drawn.points) == [(0.0, 48.0), (50.0, 24.0), (100.0, 0.0)]
    capped = chart([(100.0, 250.0)], now=100.0, window_s=100.0, height=10, ceiling=100.0)
    assert capped.points == "240.0,0.0" and capped.peak == 250.0
    small = chart([(100.0, 0.5)], now=100.0, window_s=100.0, height=10)
    assert small.points == "240.0,5.0"  # below 1, the scale stays at 1


def test_charts_give_percent_per_pool_and_a_sample_count() -> None:
    history = History(window_s=100, interval_s=10)
    history.add(Sample(at=90.0, utilisation={"a": 0.5}, claims_waiting=3, attach_seconds=2.0))
    history.add(Sample(at=100.0, utilisation={"a": 1.0, "b": 0.25}, claims_waiting=1))
    drawn = charts(history, 100.0, ["a", "b", "c"])
    # Up for 10 s of a 100 s window: the charts cover those 10 s, full width.
    assert drawn["samples"] == 2 and drawn["span"] == "10 s"
    assert _points(drawn["attach"].points) == [(0.0, 0.0)]
    assert _points(drawn["waiting"].points) == [(0.0, 0.0), (240.0, 32.0)]
    assert drawn["utilisation"]["a"].latest == 100.0 and drawn["utilisation"]["b"].peak == 25.0
    assert drawn["utilisation"]["c"].points == ""
    assert drawn["attach"].latest == 2.0 and drawn["waiting"].peak == 3.0


def test_attach_delta_is_the_mean_of_the_attaches_between_readings() -> None:
    assert attach_delta(None, (5.0, 2.0)) == (None, 0)
    assert attach_delta((5.0, 2.0), (5.0, 2.0)) == (None, 0)
    assert attach_delta((5.0, 2.0), (11.0, 5.0)) == (2.0, 3)
    assert attach_delta((11.0, 5.0), (1.0, 1.0)) == (None, 0)  # a registry that started over


def test_utilisation_and_waiting_read_the_admin_apis_shapes() -> None:
    pools = [
        {"name": "r1", "published": 4, "reserved": 1},
        {"name": "r2", "published": 0, "reserved": 0},
        {"name": "r3", "published": 2, "reserved": 5},
    ]
    assert utilisation(pools) == {"r1": 0.25, "r2": 0.0, "r3": 1.0}
    counts = {"reservations": {"by_state": {"pending": 2, "attaching": 1, "attached": 9}}}
    service = {"claims": {"waiting": [{"claim": "a/b"}]}}
    assert waiting_count(service, counts) == 4
    assert waiting_count(None, {}) == 0
    assert waiting_count({"claims": {"waiting": "odd"}}, counts) == 3


def test_a_full_window_is_spanned_whole_and_said_in_minutes_or_hours() -> None:
    history = History(window_s=3600, interval_s=30)
    for at in range(0, 7200, 30):
        history.add(Sample(at=float(at)))
    assert charts(history, 7200.0, [])["span"] == "60 min"
    day = History(window_s=86400, interval_s=600)
    for at in range(0, 90000, 600):
        day.add(Sample(at=float(at)))
    assert charts(day, 90000.0, [])["span"] == "24.0 h"
    assert charts(History(), 0.0, [])["span"] == "60 min"
