"""Settling the heap: the collector's view is frozen after long-lived state is rebuilt, at most
once per interval, and a settle frees frozen objects left in reference cycles."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from app.heap import HeapSettler


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Leave the test process's collector as it was: nothing frozen."""
    yield
    gc.unfreeze()


def test_a_rebuild_settles_at_once_then_waits_out_the_interval() -> None:
    now = [0.0]
    settles: list[float] = []
    heap = HeapSettler(30.0, now=lambda: now[0], settle=lambda: settles.append(now[0]))
    heap.tick()
    assert settles == [], "nothing rebuilt yet"
    heap.rebuilt()
    assert settles == [0.0] and heap.settles == 1
    now[0] = 29.9
    heap.rebuilt()
    heap.rebuilt()
    assert settles == [0.0]
    now[0] = 30.0
    heap.tick()
    assert settles == [0.0, 30.0], "two rebuilds inside the interval share one settle"
    now[0] = 100.0
    heap.tick()
    assert settles == [0.0, 30.0]


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan")])
def test_the_interval_must_be_positive(interval: float) -> None:
    with pytest.raises(ValueError, match="min_interval_s must be > 0"):
        HeapSettler(interval)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_a_settle_frees_a_cycle_frozen_by_the_last_one(unfrozen: None) -> None:
    first, second = Node(), Node()
    first.other, second.other = second, first
    alive = weakref.ref(first)
    gc.collect()
    gc.freeze()  # as a settle before: the cycle is out of the collector's view
    del first, second
    gc.collect()
    assert alive() is not None, "a frozen cycle is not collected"
    HeapSettler().rebuilt()
    assert alive() is None
    assert gc.get_freeze_count() > 0, "what is alive is frozen again"
