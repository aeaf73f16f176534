"""The held-device feed (:class:`app.heldfeed.HeldFeed`): what a reader gets after any run of
holds, releases and resets, against a model that keeps every entry."""

from __future__ import annotations

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from app.heldfeed import HeldFeed
from app.reservations import ClaimRef, HeldDevice, ReservationView

# One step: ("hold" | "release", device number) or ("reset", 0).
STEPS = st.lists(
    st.tuples(st.sampled_from(["hold", "release", "reset"]), st.integers(0, 5)), max_size=60
)


def reservation(number: int) -> ReservationView:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return ReservationView(
        id=number,
        claim=ClaimRef(f"uid-{number}", "ns", f"claim-{number}"),
        request="req",
        mode="structured",
        device_id=number,
        device_name=f"dev-{number}",
        pool="rack-1",
        exclusive=True,
        node="node-1",
        host_id="host-1",
        state="attached",
        attempts=0,
        last_error=None,
        operation_id=None,
        created_at=at,
        updated_at=at,
        attached_at=at,
        released_at=None,
    )


def expected(
    log: list[tuple[bool, HeldDevice | None]], kept: int, version: int
) -> list[tuple[bool, HeldDevice]] | None:
    """What a reader that saw ``version`` must get, from the whole ``log``."""
    now = len(log)
    if version == now:
        return []
    if version > now or version < max(0, now - kept):
        return None  # from the future, before the first entry, or entries after it dropped
    out: list[tuple[bool, HeldDevice]] = []
    for held, device in log[version:]:
        if device is None:
            return None
        out.append((held, device))
    return out


@settings(max_examples=300, deadline=None)
@given(steps=STEPS, max_entries=st.integers(1, 8), data=st.data())
def test_since_gives_every_change_after_a_version_or_none(
    steps: list[tuple[str, int]], max_entries: int, data: st.DataObject
) -> None:
    feed = HeldFeed(max_entries=max_entries)
    log: list[tuple[bool, HeldDevice | None]] = []
    for kind, number in steps:
        if kind == "hold":
            feed.hold(reservation(number))
            log.append((True, HeldDevice(f"uid-{number}", "rack-1", f"dev-{number}")))
        elif kind == "release":
            feed.release(reservation(number))
            log.append((False, HeldDevice(f"uid-{number}", "rack-1", f"dev-{number}")))
        else:
            feed.reset()
            log.append((False, None))
        seen = data.draw(st.integers(-1, len(log) + 1), label="reader's version")
        assert feed.version == len(log)
        assert feed.since(seen) == expected(log, max_entries, seen)


def test_a_full_feed_gives_only_the_newest_entries() -> None:
    feed = HeldFeed(max_entries=1000)
    for number in range(5000):
        feed.hold(reservation(number))
    assert feed.since(4999) == [(True, HeldDevice("uid-4999", "rack-1", "dev-4999"))]
    assert feed.since(3999) is None  # version 4000 was dropped
    assert len(feed.since(4000) or []) == 1000
