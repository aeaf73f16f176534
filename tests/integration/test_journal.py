"""The reservation journal on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from builders import MemoryBackend, gpu
from sqlalchemy import delete, event, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from app.db import direct
from app.db.engine import Database
from app.db.models import Device, Reservation
from app.heldfeed import HeldFeed
from app.inventory import InventorySync
from app.journal import (
    _ACTIVE,
    _DEVICE_AND_HOLDERS,
    ATTACHED,
    ATTACHING,
    DETACHING,
    PENDING,
    RELEASED,
    STATES,
    ClaimRef,
    DeviceHeld,
    HeldDevice,
    Journal,
    UnknownDevice,
    WrongManager,
    _move_statement,
    _new_reservation,
    _reserve_free_statement,
    _state_in,
    _Wanted,
)


@pytest.fixture
async def names(db: Database) -> list[str]:
    """Three GPUs in the inventory, the second one shareable; their names."""
    backend = MemoryBackend([gpu(1), gpu(2, shareable=True), gpu(3)])
    await InventorySync(backend, db).sync_once()
    async with db.read() as session:
        rows = (await session.execute(select(Device.vendor_id, Device.name))).all()
    by_vendor = dict(rows)
    return [by_vendor[gpu(i).vendor_id] for i in (1, 2, 3)]


def claim(i: int) -> ClaimRef:
    return ClaimRef(f"uid-{i}", "default", f"claim-{i}")


async def test_reserve_is_idempotent_and_exclusive(db: Database, names: list[str]) -> None:
    journal = Journal(db)
    first = await journal.reserve(
        claim(1), "gpu", names[0], "us-east/rack-01", "structured", "node-a", "host-a"
    )
    assert first.state == PENDING and first.exclusive and first.attempts == 0
    again = await journal.reserve(
        claim(1), "gpu", names[0], "us-east/rack-01", "structured", "node-a", "host-a"
    )
    assert again.id == first.id
    with pytest.raises(DeviceHeld, match="held by claim default/claim-1"):
        await journal.reserve(claim(2), "gpu", names[0], "p", "structured", None, None)


async def test_shareable_devices_take_several_claims(db: Database, names: list[str]) -> None:
    journal = Journal(db)
    a = await journal.reserve(claim(1), "gpu", names[1], "p", "structured", None, None)
    b = await journal.reserve(claim(2), "gpu", names[1], "p", "structured", None, None)
    assert a.id != b.id and not a.exclusive


async def test_unknown_device_is_refused(db: Database, names: list[str]) -> None:
    with pytest.raises(UnknownDevice):
        await Journal(db).reserve(claim(1), "gpu", "no-such-device", "p", "structured", None, None)


async def test_transitions_are_compare_and_set(db: Database, names: list[str]) -> None:
    journal = Journal(db)
    held = await journal.reserve(claim(1), "gpu", names[0], "p", "structured", "n", "h")
    attaching = await journal.transition(held.id, [PENDING], ATTACHING, count_attempt=True)
    assert attaching is not None and attaching.state == ATTACHING and attaching.attempts == 1
    # A second worker expecting PENDING loses.
    assert await journal.transition(held.id, [PENDING], ATTACHING) is None
    attached = await journal.transition(held.id, [ATTACHING], ATTACHED, operation_id="task-1")
    assert attached is not None and attached.attached_at is not None
    assert attached.operation_id == "task-1" and attached.last_error is None
    failed_msg = "x" * 5000
    detaching = await journal.transition(held.id, [ATTACHED], DETACHING, error=failed_msg)
    assert detaching is not None and len(detaching.last_error or "") == 2000
    released = await journal.transition(held.id, [DETACHING], RELEASED)
    assert released is not None and released.released_at is not None and not released.active
    # Released: the device is free for another claim.
    other = await journal.reserve(claim(2), "gpu", names[0], "p", "structured", None, None)
    assert other.state == PENDING
    with pytest.raises(ValueError, match="unknown reservation state"):
        await journal.transition(held.id, [RELEASED], "gone")


async def test_many_concurrent_claims_get_one_device_once(db: Database, names: list[str]) -> None:
    journal = Journal(db)

    async def attempt(i: int) -> str:
        try:
            await journal.reserve(claim(i), "gpu", names[2], "p", "structured", None, None)
        except DeviceHeld:
            return "held"
        return "won"

    outcomes = await asyncio.gather(*(attempt(i) for i in range(50)))
    assert outcomes.count("won") == 1 and outcomes.count("held") == 49
    assert len(await journal.active()) == 1


async def test_the_database_itself_refuses_a_second_active_reservation(
    db: Database, names: list[str]
) -> None:
    journal = Journal(db)
    held = await journal.reserve(claim(1), "gpu", names[0], "p", "structured", None, None)
    row = _reservation_row("x", held.device_id, names[0], ATTACHED, mode="control-plane")
    with pytest.raises(IntegrityError):
        async with db.write() as session:
            await session.execute(insert(Reservation).values(**row))
    # A released one may coexist.
    async with db.write() as session:
        await session.execute(insert(Reservation).values(**replace_state(row, RELEASED)))


def replace_state(row: dict, state: str) -> dict:
    return {**row, "state": state}


def _reservation_row(
    name: str, device_id: int, device_name: str, state: str, *, mode: str = "structured"
) -> dict[str, Any]:
    """A reservations row of claim ``default/<name>`` for one device, written as another
    writer would."""
    now = dt.datetime.now(dt.UTC)
    return dict(
        claim_uid=f"uid-{name}",
        claim_namespace="default",
        claim_name=name,
        request="gpu",
        mode=mode,
        device_id=device_id,
        device_name=device_name,
        pool="p",
        exclusive=True,
        state=state,
        attempts=0,
        created_at=now,
        updated_at=now,
    )


async def test_queries(db: Database, names: list[str]) -> None:
    journal = Journal(db)
    a = await journal.reserve(claim(1), "gpu", names[0], "p", "structured", "n", "h")
    await journal.reserve(claim(1), "gpu2", names[2], "p", "structured", "n", "h")
    await journal.transition(a.id, [PENDING], RELEASED)
    assert [r.device_name for r in await journal.for_claim("uid-1")] == [names[2]]
    assert len(await journal.for_claim("uid-1", active_only=False)) == 2
    assert [r.state for r in await journal.recent()] == [PENDING, RELEASED]
    device = await journal.fabric_device(a)
    assert device.vendor_id == gpu(1).vendor_id and device.attach_unit == gpu(1).attach_unit
    assert (await journal.get(a.id)) == replace(
        a,
        state=RELEASED,
        updated_at=(await journal.get(a.id)).updated_at,
        released_at=(await journal.get(a.id)).released_at,
    )
    assert a.to_json()["claim"] == {"uid": "uid-1", "namespace": "default", "name": "claim-1"}


async def test_reserve_for_attach_journals_the_attach_in_the_same_transaction(
    db: Database, names: list[str]
) -> None:
    journal = Journal(db)
    version = journal.feed.version
    view, device = await journal.reserve_for_attach(
        claim(1), "gpu", names[0], "p", "structured", "node-a", "host-a"
    )
    assert (view.state, view.attempts, view.node, view.host_id) == (
        ATTACHING,
        1,
        "node-a",
        "host-a",
    )
    assert device is not None and device.vendor_id == gpu(1).vendor_id
    assert journal.feed.since(version) == [(True, HeldDevice(view.claim.uid, "p", names[0]))]
    # Already held by the same claim and request: the existing one, nothing new to send.
    again, none = await journal.reserve_for_attach(
        claim(1), "gpu", names[0], "p", "structured", "node-a", "host-a"
    )
    assert (again.id, none) == (view.id, None)
    with pytest.raises(DeviceHeld, match="claim default/claim-1"):
        await journal.reserve_for_attach(
            claim(2), "gpu", names[0], "p", "structured", "node-a", "host-a"
        )
    with pytest.raises(UnknownDevice):
        await journal.reserve_for_attach(
            claim(2), "gpu", "no-such-device", "p", "structured", "node-a", "host-a"
        )


async def test_begin_attach_and_detach_move_and_read_the_device_together(
    db: Database, names: list[str]
) -> None:
    journal = Journal(db)
    pending = await journal.reserve(claim(1), "gpu", names[2], "p", "structured", "n", "h")
    begun = await journal.begin_attach(pending.id)
    assert begun is not None
    moving, device = begun
    assert (moving.state, moving.attempts, device.vendor_id) == (ATTACHING, 1, gpu(3).vendor_id)
    assert await journal.transition(moving.id, [ATTACHING], ATTACHED) is not None
    assert await journal.begin_attach(moving.id) is None  # attached: not moved again
    detaching = await journal.begin_detach(moving.id)
    assert detaching is not None
    # Attempts count per phase: the detach is its first attempt, not the claim's second.
    assert (detaching[0].state, detaching[0].attempts) == (DETACHING, 1)
    # The verified attach made the reservation's host the device's holder.
    assert detaching[1] == replace(device, host_id="h")
    again = await journal.begin_detach(moving.id)
    assert again is not None and again[0].attempts == 2
    released = await journal.transition(moving.id, [DETACHING], RELEASED)
    assert released is not None and released.attached_at is not None
    assert released.released_at is not None
    assert await journal.begin_detach(moving.id) is None


async def test_held_lists_active_exclusive_reservations(db: Database, names: list[str]) -> None:
    journal = Journal(db)
    a = await journal.reserve(claim(1), "gpu", names[0], "p1", "structured", None, None)
    await journal.reserve(claim(2), "gpu", names[1], "p2", "control-plane", None, None)
    c = await journal.reserve(claim(3), "gpu", names[2], "p3", "control-plane", None, None)
    await journal.transition(c.id, [PENDING], RELEASED)
    held = await journal.held()
    assert [(h.claim_uid, h.pool, h.device_name) for h in held] == [(a.claim.uid, "p1", names[0])]
    assert await journal.count_active() == 2


async def test_the_held_feed_follows_holds_and_releases_and_says_when_to_read_again(
    db: Database, names: list[str]
) -> None:
    journal = Journal(db)
    assert Journal(db).feed is journal.feed  # one feed per database
    start = journal.feed.version
    a = await journal.reserve(claim(1), "gpu", names[0], "p", "structured", None, None)
    await journal.reserve(claim(2), "gpu", names[1], "p", "structured", None, None)  # shared
    await journal.reserve(claim(1), "gpu", names[0], "p", "structured", None, None)  # again
    moved = await journal.transition(a.id, [PENDING], ATTACHING)
    assert moved is not None
    await journal.transition(a.id, [ATTACHING], RELEASED)
    held_a = HeldDevice(a.claim.uid, "p", names[0])
    assert journal.feed.since(start) == [(True, held_a), (False, held_a)]
    assert journal.feed.since(journal.feed.version) == []
    c = await journal.reserve(claim(4), "gpu", names[2], "p", "structured", None, None)
    version = journal.feed.version
    # Refused reservations change nothing.
    with pytest.raises(UnknownDevice):
        await journal.reserve(claim(3), "gpu", "no-such", "p", "structured", None, None)
    with pytest.raises(DeviceHeld):
        await journal.reserve(claim(3), "gpu", names[2], "p", "structured", None, None)
    assert journal.feed.since(version) == []
    assert journal.feed.since(version - 1) == [(True, HeldDevice(c.claim.uid, "p", names[2]))]


def test_a_feed_that_dropped_entries_or_was_reset_asks_for_a_full_read() -> None:
    feed = HeldFeed(max_entries=2)
    view = _fake_view()
    for _ in range(3):
        feed.hold(view)
    assert feed.since(0) is None  # the first entry was dropped
    assert feed.since(1) == [(True, HeldDevice("u", "p", "d"))] * 2
    feed.reset()
    assert feed.since(2) is None
    assert feed.since(feed.version) == []
    assert feed.since(feed.version + 5) is None


def _fake_view() -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(claim=ClaimRef("u", "ns", "c"), pool="p", device_name="d")


def test_the_states_of_the_claim_path_statements_are_written_into_their_sql() -> None:
    # An IN of bound values is expanded again on every execution; the fixed state sets are
    # written in instead, and nothing but a state name can be.
    sql = str(_move_statement((ATTACHING,), (ATTACHING, ATTACHED)).compile())
    assert "IN ('attaching')" in sql and "IN ('attaching', 'attached')" in sql
    assert "POSTCOMPILE" not in sql
    with pytest.raises(ValueError, match="not a reservation state"):
        _state_in(Reservation.__table__.c.state, ["x'); DROP TABLE reservations; --"])


@contextlib.contextmanager
def _count_statements(db: Database) -> Iterator[list[str]]:
    """The statements ``db`` sends in the block (the list fills as they go): through its
    engines and straight through asyncpg (app.db.direct)."""
    sent: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    for engine in db.engines:
        event.listen(engine.sync_engine, "before_cursor_execute", before)
    direct.listen(sent.append)
    try:
        yield sent
    finally:
        direct.unlisten(sent.append)
        for engine in db.engines:
            event.remove(engine.sync_engine, "before_cursor_execute", before)


async def _device_holder(db: Database, name: str) -> str | None:
    async with db.read() as session:
        return (await session.execute(select(Device.host_id).where(Device.name == name))).scalar()


async def test_the_claim_path_moves_the_device_holder_with_the_journal(
    db: Database, names: list[str]
) -> None:
    journal = Journal(db)
    view, device = await journal.reserve_for_attach(
        claim(1), "gpu", names[0], "p", "structured", "node-a", "host-a"
    )
    assert device is not None and device.host_id is None
    assert await _device_holder(db, names[0]) is None
    attached = await journal.transition(view.id, [ATTACHING], ATTACHED, clear_operation=True)
    assert attached is not None and attached.attached_at is not None
    assert await _device_holder(db, names[0]) == "host-a"
    detaching = await journal.begin_detach(view.id)
    assert detaching is not None and detaching[1] is not None
    assert (detaching[0].state, detaching[1].host_id) == (DETACHING, "host-a")
    released = await journal.transition(view.id, [DETACHING], RELEASED, detached=True)
    assert released is not None and released.state == RELEASED
    assert await _device_holder(db, names[0]) is None
    # A move that does not apply writes nothing, the device row included.
    assert await journal.transition(view.id, [ATTACHING], ATTACHED) is None
    assert await _device_holder(db, names[0]) is None

    # A detach is not taken for the device's new holder: the row keeps another host.
    again, _ = await journal.reserve_for_attach(
        claim(2), "gpu", names[0], "p", "structured", "node-b", "host-b"
    )
    await journal.transition(again.id, [ATTACHING], ATTACHED)
    async with db.write() as session:
        await session.execute(
            update(Device).where(Device.name == names[0]).values(host_id="host-c")
        )
    await journal.begin_detach(again.id)
    await journal.transition(again.id, [DETACHING], RELEASED, detached=True)
    assert await _device_holder(db, names[0]) == "host-c"


async def test_a_device_on_another_fabric_manager_is_refused_and_nothing_is_written(
    db: Database, names: list[str]
) -> None:
    journal = Journal(db)
    with pytest.raises(WrongManager, match="is on fabric manager"):
        await journal.reserve_for_attach(
            claim(1), "gpu", names[0], "p", "structured", "n", "h", manager="elsewhere"
        )
    assert await journal.for_claim(claim(1).uid) == []
    manager = (
        await journal.reserve_for_attach(claim(1), "gpu", names[0], "p", "structured", "n", "h")
    )[1]
    assert manager is not None
    view, device = await journal.reserve_for_attach(
        claim(2), "gpu", names[2], "p", "structured", "n", "h", manager=manager.location.manager
    )
    assert device is not None and view.state == ATTACHING


async def test_on_postgresql_each_write_of_the_claim_path_is_one_statement(
    db: Database, names: list[str]
) -> None:
    if db.dialect != "postgresql":
        pytest.skip("SQLite has no data-modifying WITH; its transactions cost no round trip")
    journal = Journal(db)
    with _count_statements(db) as sent:
        view, device = await journal.reserve_for_attach(
            claim(1), "gpu", names[0], "p", "structured", "node-a", "host-a"
        )
        assert device is not None and len(sent) == 1
        await journal.transition(view.id, [ATTACHING], ATTACHED)
        assert await journal.begin_detach(view.id) is not None
        await journal.transition(view.id, [DETACHING], RELEASED, detached=True)
        assert len(sent) == 4, sent
        # Outside the common case (a device someone holds) the transaction tells why.
        held, _ = await journal.reserve_for_attach(
            claim(2), "gpu", names[2], "p", "structured", "node-a", "host-a"
        )
        sent.clear()
        with pytest.raises(DeviceHeld, match="claim default/claim-2"):
            await journal.reserve_for_attach(
                claim(3), "gpu", names[2], "p", "structured", "node-a", "host-a"
            )
        assert len(sent) == 2  # the one statement wrote nothing; then the transaction's read
    assert [r.id for r in await journal.for_claim(claim(3).uid)] == []
    assert [r.id for r in await journal.for_claim(claim(2).uid)] == [held.id]


async def test_begin_attach_of_a_device_whose_row_is_gone_keeps_the_reservation(
    db: Database, names: list[str]
) -> None:
    journal = Journal(db)
    pending = await journal.reserve(claim(1), "gpu", names[0], "p", "structured", "n", "h")
    # The foreign key keeps a reserved device's row; switched off here to reach the case.
    if db.dialect == "postgresql":
        async with db.engine.connect() as conn:
            await conn.execute(text("SET session_replication_role = replica"))
            await conn.execute(delete(Device).where(Device.name == names[0]))
            await conn.commit()
    else:
        # A connection of its own: SQLite enforces foreign keys only where they are switched on.
        with contextlib.closing(sqlite3.connect(str(db.engine.url.database))) as raw:
            raw.execute("DELETE FROM devices WHERE name = ?", (names[0],))
            raw.commit()
    with pytest.raises(UnknownDevice, match="not in the inventory"):
        await journal.begin_attach(pending.id)
    kept = await journal.get(pending.id)
    assert kept is not None and (kept.state, kept.attempts) == (PENDING, 0)
    # The detach side goes on without the row (no device to read).
    assert await journal.transition(pending.id, [PENDING], ATTACHING) is not None
    moved = await journal.begin_detach(pending.id)
    assert moved is not None and moved[0].state == DETACHING and moved[1] is None


async def test_a_reserve_that_loses_the_race_in_its_one_statement_says_held(
    db: Database, names: list[str]
) -> None:
    if db.dialect != "postgresql":
        pytest.skip("SQLite writers take turns (BEGIN IMMEDIATE): no such race")
    journal = Journal(db)
    free = await journal.reserve(claim(9), "gpu", names[0], "p", "structured", None, None)
    await journal.transition(free.id, [PENDING], RELEASED)  # the device id, and free again
    async with db.engine.connect() as other:
        # Another writer's reservation, not committed yet: the one statement cannot see it,
        # and its INSERT waits on the unique index until the other commits.
        await other.execute(
            insert(Reservation).values(
                **_reservation_row("other", free.device_id, names[0], PENDING)
            )
        )
        racing = asyncio.create_task(
            journal.reserve_for_attach(claim(1), "gpu", names[0], "p", "structured", "n", "h")
        )
        async with asyncio.timeout(10):
            while not await _a_backend_waits_on_a_lock(db):
                assert not racing.done(), racing
                await asyncio.sleep(0.02)
        await other.commit()
    with pytest.raises(DeviceHeld, match="claim default/other"):
        await racing
    assert await journal.for_claim(claim(1).uid) == []


async def _a_backend_waits_on_a_lock(db: Database) -> bool:
    async with db.engine.connect() as conn:
        waiting = await conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        )
        return bool(waiting.scalar())


def test_the_active_states_are_every_state_but_released() -> None:
    # _active writes "state != 'released'" for them: the term of the partial index.
    assert set(_ACTIVE) == set(STATES) - {RELEASED}


async def _plan(db: Database, statement: Any, params: dict[str, Any]) -> str:
    compiled = statement.compile(dialect=db.engine.dialect)
    values = compiled.construct_params(params)
    args = tuple(values[name] for name in compiled.positiontup or ())
    async with db.engine.connect() as conn:
        if db.dialect == "sqlite":
            rows = await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", args)
            return "\n".join(str(row[-1]) for row in rows)
        # A table of a few rows is read whole whatever its indexes: planned as if large.
        await conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        rows = await conn.exec_driver_sql(f"EXPLAIN (COSTS OFF) {compiled}", args)
        return "\n".join(str(row[0]) for row in rows)


async def test_whether_a_device_is_held_is_looked_up_by_its_active_reservations_index(
    db: Database,
) -> None:
    # Not by a walk of every active reservation (ix_reservations_state), which grew with the
    # devices attached: 0.37 ms of a 0.59 ms reserve on PostgreSQL with 2,000 of them.
    plan = await _plan(db, _DEVICE_AND_HOLDERS, {"b_name": "gpu-1"})
    assert "ix_reservations_active_device_id" in plan, plan
    if db.dialect != "postgresql":
        return  # the one-statement reserve is PostgreSQL's
    wanted = _Wanted(claim(1), "gpu", "gpu-1", "pool", "structured", "node-a", "host-a", None)
    params = {
        **_new_reservation(wanted, False, dt.datetime.now(dt.UTC)),
        "operation_id": None,
        "last_error": None,
        "attached_at": None,
        "released_at": None,
        "b_manager": "m",
    }
    for with_manager in (False, True):
        plan = await _plan(db, _reserve_free_statement(with_manager), params)
        assert "ix_reservations_active_device_id" in plan, plan
