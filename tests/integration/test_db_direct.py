"""Database.fetch: on PostgreSQL straight through asyncpg on held connections
(app.db.direct), on SQLite through the database's threads; real databases."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import socket
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import Float, bindparam, exc, func, insert, select, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db import direct
from app.db.direct import DirectStatements
from app.db.engine import Database
from app.db.models import Device, Reservation
from app.journal import _FOR_CLAIM

_R = Reservation.__table__.c  # type: ignore[attr-defined]
_D = Device.__table__.c  # type: ignore[attr-defined]
NOW = dt.datetime(2026, 12, 6, 4, 0, tzinfo=dt.UTC)
_DEVICE = {
    "name": "gpu-1",
    "vendor_id": "/redfish/v1/x/gpu-1",
    "attach_unit": "/redfish/v1/x/gpu-1",
    "device_type": "gpu",
    "uuid": None,
    "serial": None,
    "slot": None,
    "model": "m",
    "vendor_name": None,
    "region": "r",
    "rack": "k",
    "health": "OK",
    "host_id": None,
    "shareable": False,
    "capacity": {},
    "attributes": {"pcieGen": 5, "tags": ["a", "b"]},
    "backend": "default",
    "content_hash": "",
    "first_seen": NOW,
    "last_seen": NOW,
    "removed_at": None,
}
_INSERT_RESERVATION = (
    insert(Reservation.__table__)
    .values({c.name: bindparam(f"b_{c.name}", type_=c.type) for c in _R if c.name != "id"})
    .returning(_R.id)
)
_SLEEP = select(func.pg_sleep(bindparam("b_seconds", type_=Float())))
_BACKEND_PID = select(func.pg_backend_pid())
_DEVICE_ROW = select(_D.name, _D.attributes, _D.first_seen).where(_D.name == bindparam("b_name"))


def _reservation(claim_uid: str, device_id: int, state: str) -> dict[str, Any]:
    return {f"b_{name}": value for name, value in _columns(claim_uid, device_id, state).items()}


def _columns(claim_uid: str, device_id: int, state: str) -> dict[str, Any]:
    return {
        "claim_uid": claim_uid,
        "claim_namespace": "default",
        "claim_name": "c",
        "request": "gpu",
        "mode": "structured",
        "device_id": device_id,
        "device_name": "gpu-1",
        "pool": "p",
        "exclusive": False,
        "node": None,
        "host_id": None,
        "state": state,
        "attempts": 0,
        "last_error": None,
        "operation_id": None,
        "created_at": NOW,
        "updated_at": NOW,
        "attached_at": None,
        "released_at": None,
    }


async def _device_id(db: Database) -> int:
    async with db.write() as session:
        return int(
            (await session.execute(insert(Device).returning(Device.id), [_DEVICE])).scalar_one()
        )


def _direct(db: Database) -> DirectStatements:
    if db.direct is None:
        pytest.skip("statements go straight to asyncpg on PostgreSQL only")
    return db.direct


async def _pg_stat(db: Database, pid: int) -> int:
    async with db.engine.connect() as conn:
        return int(
            (
                await conn.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
                )
            ).scalar_one()
        )


async def _terminate(db: Database, pid: int) -> None:
    async with db.engine.connect() as conn:
        await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})


async def test_fetch_gives_the_rows_sqlalchemy_gives(db: Database) -> None:
    device_id = await _device_id(db)
    for uid, state in (("u-1", "attached"), ("u-1", "released"), ("u-2", "pending")):
        await db.fetch(_INSERT_RESERVATION, _reservation(uid, device_id, state), writes=True)
    fetched = await db.fetch(_FOR_CLAIM, {"b_uid": "u-1"})
    expected = await db.run_read(lambda conn: conn.execute(_FOR_CLAIM, {"b_uid": "u-1"}).all())
    assert [tuple(row) for row in fetched] == [tuple(row) for row in expected]
    assert [row[12] for row in fetched] == ["attached", "released"]
    # Times come back aware, in UTC; JSON comes back decoded.
    assert fetched[0][16] == NOW and fetched[0][16].tzinfo == dt.UTC
    (row,) = await db.fetch(_DEVICE_ROW, {"b_name": "gpu-1"})
    assert tuple(row) == ("gpu-1", {"pcieGen": 5, "tags": ["a", "b"]}, NOW)
    assert await db.fetch(_FOR_CLAIM, {"b_uid": "nobody"}) == []


async def test_a_refused_constraint_is_an_integrity_error_and_keeps_the_connection(
    db: Database,
) -> None:
    device_id = await _device_id(db)
    values = {**_reservation("u-1", device_id, "attached"), "b_exclusive": True}
    await db.fetch(_INSERT_RESERVATION, values, writes=True)
    # The partial unique index: one active exclusive reservation per device.
    with pytest.raises(exc.IntegrityError) as caught:
        await db.fetch(_INSERT_RESERVATION, {**values, "b_claim_uid": "u-2"}, writes=True)
    assert not caught.value.connection_invalidated
    assert len(await db.fetch(_FOR_CLAIM, {"b_uid": "u-1"})) == 1
    assert await db.fetch(_FOR_CLAIM, {"b_uid": "u-2"}) == []
    if db.direct is not None:
        assert isinstance(caught.value.orig, asyncpg.UniqueViolationError)
        assert db.direct.opened == 1


async def test_a_bad_value_is_refused_before_anything_is_sent(db: Database) -> None:
    naive = {**_reservation("u", 1, "pending"), "b_updated_at": NOW.replace(tzinfo=None)}
    with pytest.raises(exc.StatementError) as caught:
        await db.fetch(_INSERT_RESERVATION, naive, writes=True)
    assert isinstance(caught.value.orig, ValueError)
    assert "naive datetime" in str(caught.value.orig)
    with pytest.raises(exc.StatementError) as caught:
        await db.fetch(_FOR_CLAIM, {})
    assert "b_uid" in str(caught.value)
    if db.direct is not None:
        assert db.direct.opened == 0
    assert await db.fetch(_FOR_CLAIM, {"b_uid": "u"}) == []


async def test_a_value_asyncpg_cannot_encode_is_a_data_error(db: Database) -> None:
    statement = _direct(db)
    with pytest.raises(exc.DataError) as caught:
        await db.fetch(select(_R.id).where(_R.id == bindparam("b_id")), {"b_id": "seven"})
    assert not caught.value.connection_invalidated
    assert await db.fetch(_BACKEND_PID, {}) and statement.opened == 1


async def test_connections_are_held_and_reused(db: Database) -> None:
    statements = _direct(db)
    pids = {row[0] for _ in range(20) for row in await db.fetch(_BACKEND_PID, {})}
    assert len(pids) == 1 and statements.opened == 1
    # At most `size` at once; callers beyond it wait for one.
    in_flight = statements.size + 3
    rows = await asyncio.gather(*(db.fetch(_SLEEP, {"b_seconds": 0.05}) for _ in range(in_flight)))
    assert len(rows) == in_flight
    assert statements.opened == statements.size


async def test_a_connection_the_server_ended_while_idle_is_replaced(db: Database) -> None:
    statements = _direct(db)
    ((pid,),) = await db.fetch(_BACKEND_PID, {})
    await _terminate(db, pid)
    for _ in range(100):
        if await _pg_stat(db, pid) == 0:
            break
        await asyncio.sleep(0.02)
    ((new_pid,),) = await db.fetch(_BACKEND_PID, {})
    assert new_pid != pid and statements.opened == 2


@pytest.mark.parametrize(
    ("message", "replaced"),
    [
        # What asyncpg says when the server's FATAL has been read and the close not yet.
        ("cannot switch to state 12; another operation (2) is in progress", True),
        ('cannot switch to state 12; protocol is in the "failed" state', True),
        # Any other internal error may come after the statement was sent: never sent again.
        ("waiter is not done while handling critical protocol error", False),
    ],
)
async def test_an_idle_connection_found_reading_the_servers_goodbye_is_replaced(
    db: Database, monkeypatch: pytest.MonkeyPatch, message: str, replaced: bool
) -> None:
    statements = _direct(db)
    ((pid,),) = await db.fetch(_BACKEND_PID, {})
    (held,) = statements.idle_connections
    real = asyncpg.connection.Connection.fetch
    refused: list[str] = []

    async def fetch(self: asyncpg.Connection, *args: Any, **kwargs: Any) -> Any:
        if self is held:
            refused.append(message)
            raise asyncpg.InternalClientError(message)
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(asyncpg.connection.Connection, "fetch", fetch)
    if replaced:
        ((new_pid,),) = await db.fetch(_BACKEND_PID, {})
        assert new_pid != pid and statements.opened == 2
    else:
        with pytest.raises(exc.OperationalError, match="critical protocol error"):
            await db.fetch(_BACKEND_PID, {})
        assert statements.opened == 1
    assert refused == [message] and held.is_closed()


async def test_a_new_connection_that_refuses_its_first_statement_is_not_tried_forever(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    statements = _direct(db)
    await db.fetch(_BACKEND_PID, {})

    async def fetch(self: asyncpg.Connection, *args: Any, **kwargs: Any) -> Any:
        raise asyncpg.InternalClientError(
            "cannot switch to state 12; another operation (2) is in progress"
        )

    monkeypatch.setattr(asyncpg.connection.Connection, "fetch", fetch)
    with pytest.raises(exc.OperationalError, match="cannot switch to state"):
        await db.fetch(_BACKEND_PID, {})
    # The idle one was replaced once; the new one's refusal is the caller's error.
    assert statements.opened == 2 and statements.idle_connections == ()


async def test_an_idle_connection_is_pinged_and_replaced_when_the_ping_fails(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    statements = _direct(db)
    ((pid,),) = await db.fetch(_BACKEND_PID, {})
    (held,) = statements.idle_connections
    pinged: list[asyncpg.Connection] = []

    async def lost(conn: asyncpg.Connection) -> None:
        pinged.append(conn)
        if conn is held:
            raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(direct, "_ping", lost)
    statements.ping_after_idle_s = 0.0
    ((new_pid,),) = await db.fetch(_BACKEND_PID, {})
    assert new_pid != pid and held.is_closed() and statements.opened == 2
    assert pinged == [held]  # a new connection is not pinged
    # Within the idle time no ping is sent.
    statements.ping_after_idle_s = 60.0
    await db.fetch(_BACKEND_PID, {})
    assert pinged == [held]


async def test_a_connection_lost_mid_statement_fails_it_and_is_dropped(db: Database) -> None:
    statements = _direct(db)
    ((pid,),) = await db.fetch(_BACKEND_PID, {})
    sleeping = asyncio.create_task(db.fetch(_SLEEP, {"b_seconds": 30.0}))
    # Ended while the server runs the statement (its session active), not before it is sent.
    for _ in range(500):
        if await _activity(db, pid) == "active":
            break
        await asyncio.sleep(0.02)
    await _terminate(db, pid)
    with pytest.raises(exc.OperationalError) as caught:
        await asyncio.wait_for(sleeping, 10)
    assert caught.value.connection_invalidated
    ((new_pid,),) = await db.fetch(_BACKEND_PID, {})
    assert new_pid != pid and statements.opened == 2


async def _activity(db: Database, pid: int) -> str | None:
    async with db.engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT state FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            )
        ).scalar()


async def test_a_cancelled_statement_is_stopped_on_the_server_and_its_connection_kept(
    db: Database,
) -> None:
    statements = _direct(db)
    ((pid,),) = await db.fetch(_BACKEND_PID, {})
    sleeping = asyncio.create_task(db.fetch(_SLEEP, {"b_seconds": 30.0}))
    for _ in range(250):
        if await _activity(db, pid) == "active":
            break
        await asyncio.sleep(0.02)
    sleeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeping
    # asyncpg's CancelRequest stops the statement: the session is idle again within
    # moments, not after 30 s.
    for _ in range(250):
        if await _activity(db, pid) == "idle":
            break
        await asyncio.sleep(0.02)
    assert await _activity(db, pid) == "idle"
    # The connection is kept, checked before its next use.
    assert len(statements.idle_connections) == 1
    assert await db.fetch(_BACKEND_PID, {}) == [(pid,)]
    assert statements.opened == 1


async def test_a_statement_cancelled_at_once_leaves_a_connection_that_works(
    db: Database,
) -> None:
    # Cancelled before the server could answer: the next statement waits for the
    # cancellation's answer and does not read the cancelled statement's rows.
    statements = _direct(db)
    for seconds in (0.0, 0.001, 0.01):
        task = asyncio.create_task(db.fetch(_SLEEP, {"b_seconds": seconds}))
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        rows = await db.fetch(_FOR_CLAIM, {"b_uid": "nobody"})
        assert rows == []
        assert len(await db.fetch(_BACKEND_PID, {})) == 1
    assert statements.opened <= 2


async def test_dispose_closes_every_connection_and_refuses_later_statements(
    db: Database,
) -> None:
    statements = _direct(db)
    await asyncio.gather(*(db.fetch(_SLEEP, {"b_seconds": 0.02}) for _ in range(3)))
    held = statements.idle_connections
    assert len(held) == 3
    await statements.dispose()
    assert all(conn.is_closed() for conn in held)
    with pytest.raises(RuntimeError, match="disposed"):
        await db.fetch(_BACKEND_PID, {})


@pytest.fixture
def sent() -> Iterator[list[str]]:
    """The SQL of each statement sent straight through asyncpg while the test runs."""
    statements: list[str] = []
    direct.listen(statements.append)
    yield statements
    direct.unlisten(statements.append)


async def test_listeners_see_each_statement_before_it_is_sent(
    db: Database, sent: list[str]
) -> None:
    _direct(db)
    await db.fetch(_BACKEND_PID, {})
    await db.fetch(_FOR_CLAIM, {"b_uid": "u"})
    assert len(sent) == 2 and "pg_backend_pid" in sent[0] and "$1" in sent[1]
    direct.unlisten(sent.append)
    direct.unlisten(sent.append)  # a listener not given: nothing happens
    await db.fetch(_BACKEND_PID, {})
    assert len(sent) == 2


async def test_a_server_that_cannot_be_reached_is_an_operational_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    statements = DirectStatements(
        create_async_engine(f"postgresql+asyncpg://nobody@127.0.0.1:{port}/x", poolclass=NullPool),
        size=1,
        ping_after_idle_s=2.0,
    )
    try:
        for _ in range(2):  # the one slot is given back after a failed connect
            with pytest.raises(exc.OperationalError) as caught:
                await asyncio.wait_for(statements.fetch(_BACKEND_PID, {}), 10)
            assert caught.value.connection_invalidated
            assert isinstance(caught.value.orig, OSError)
        assert statements.opened == 0
    finally:
        await statements.dispose()


def test_only_asyncpg_engines_and_a_positive_size_are_taken() -> None:
    sqlite_engine = create_async_engine("sqlite+aiosqlite:///unused.db")
    with pytest.raises(ValueError, match="need asyncpg, not aiosqlite"):
        DirectStatements(sqlite_engine, 1, 2.0)
    pg = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:1/x", poolclass=NullPool)
    with pytest.raises(ValueError, match="size must be positive, not 0"):
        DirectStatements(pg, 0, 2.0)
