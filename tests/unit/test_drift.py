"""Drift between the journal and the fabric: the pure comparison."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from app.claims.drift import FabricView, find_drift
from app.reservations import (
    ATTACHED,
    ATTACHING,
    DETACHING,
    FAILED,
    PENDING,
    ClaimRef,
    ReservationView,
)

BEFORE = dt.datetime(2026, 1, 2, 3, 0, 0, tzinfo=dt.UTC)
LISTED = dt.datetime(2026, 1, 2, 3, 1, 0, tzinfo=dt.UTC)


def held(
    i: int,
    *,
    host: str | None = "h1",
    state: str = ATTACHED,
    exclusive: bool = True,
    updated: dt.datetime = BEFORE,
) -> ReservationView:
    return ReservationView(
        id=i,
        claim=ClaimRef(f"u{i}", "ns", f"c{i}"),
        request="gpu",
        mode="structured",
        device_id=100 + i,
        device_name=f"gpu-{i}",
        pool="p",
        exclusive=exclusive,
        node="n1",
        host_id=host,
        state=state,
        attempts=1,
        last_error=None,
        operation_id=None,
        created_at=BEFORE,
        updated_at=updated,
        attached_at=BEFORE,
        released_at=None,
    )


def test_a_device_the_fabric_still_shows_on_its_host_is_no_drift() -> None:
    assert find_drift([held(1)], {101: FabricView("h1")}, LISTED) == []


def test_a_device_the_fabric_shows_free_is_lost() -> None:
    [drift] = find_drift([held(1)], {101: FabricView(None)}, LISTED)
    assert drift.kind == "lost" and "no host" in drift.reason and drift.holder is None


def test_a_device_gone_from_the_fabric_is_lost() -> None:
    assert [d.kind for d in find_drift([held(1)], {}, LISTED)] == ["lost"]
    [drift] = find_drift([held(1)], {101: FabricView("h1", removed=True)}, LISTED)
    assert drift.kind == "lost" and "gone" in drift.reason


def test_a_device_on_another_host_has_moved_and_names_it() -> None:
    [drift] = find_drift([held(1)], {101: FabricView("h9")}, LISTED)
    assert drift.kind == "moved" and drift.holder == "h9" and "h9" in drift.reason


def test_a_reservation_written_after_the_listing_began_is_left_alone() -> None:
    # The listing may predate our own attach: it cannot contradict it.
    assert find_drift([held(1, updated=LISTED)], {101: FabricView(None)}, LISTED) == []


def test_only_exclusive_attached_reservations_are_compared() -> None:
    others = [held(1, state=state) for state in (PENDING, ATTACHING, DETACHING, FAILED)]
    others.append(held(2, exclusive=False))
    assert find_drift(others, {}, LISTED) == []


@given(
    st.lists(
        st.tuples(st.sampled_from([None, "h1", "h2"]), st.booleans(), st.booleans(), st.booleans()),
        max_size=12,
    )
)
def test_every_attached_reservation_is_drift_exactly_when_the_fabric_disagrees(
    rows: list[tuple[str | None, bool, bool, bool]],
) -> None:
    reservations = []
    fabric = {}
    for i, (holder, listed, removed, late) in enumerate(rows):
        reservation = held(i, updated=LISTED if late else BEFORE)
        reservations.append(reservation)
        if listed:
            fabric[reservation.device_id] = FabricView(holder, removed)
    drifts = {d.reservation.id: d for d in find_drift(reversed(reservations), fabric, LISTED)}
    for reservation in reservations:
        view = fabric.get(reservation.device_id)
        agrees = view is not None and not view.removed and view.host_id == reservation.host_id
        late = reservation.updated_at >= LISTED
        assert (reservation.id in drifts) == (not agrees and not late)
        if reservation.id in drifts:
            expected = "moved" if view is not None and not view.removed and view.host_id else "lost"
            assert drifts[reservation.id].kind == expected
    assert list(drifts) == sorted(drifts)
