"""Database.run_write and run_read: whole transactions on a real SQLite file and PostgreSQL.

On SQLite they run on threads of the database's own, one for writes and one for reads (one
hand-over per transaction); on PostgreSQL in ``run_sync``, reads in autocommit. Either way a
transaction commits when its function returns and rolls back when it raises, and what it
committed is what the next reader and the async sessions see.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading

import pytest
from sqlalchemy import Connection, event, func, insert, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.clock import utcnow
from app.db import engine as engine_module
from app.db.engine import Database
from app.db.models import Host

_HOSTS = Host.__table__


def _add_host(conn: Connection, host_id: str) -> str:
    now = utcnow()
    conn.execute(
        insert(_HOSTS).values(
            backend="redfish",
            host_id=host_id,
            hostname=host_id,
            health="OK",
            attached_units=[],
            content_hash="x",
            first_seen=now,
            last_seen=now,
        )
    )
    return host_id


def _count(conn: Connection) -> int:
    return int(conn.execute(select(func.count()).select_from(_HOSTS)).scalar_one())


async def test_a_write_commits_when_it_returns_and_readers_see_it(db: Database) -> None:
    assert await db.run_write(lambda conn: _add_host(conn, "h1")) == "h1"
    assert await db.run_read(_count) == 1
    # The async sessions of the rest of the service see the same rows.
    async with db.read() as session:
        assert (await session.execute(select(func.count()).select_from(_HOSTS))).scalar_one() == 1


@pytest.mark.parametrize("brief", [False, True])
async def test_a_write_that_raises_leaves_nothing_behind(db: Database, brief: bool) -> None:
    class Refused(Exception):
        pass

    def half(conn: Connection) -> None:
        _add_host(conn, "h1")
        raise Refused

    with pytest.raises(Refused):
        await db.run_write(half, brief=brief)
    assert await db.run_read(_count, brief=brief) == 0
    # The connection is usable again after the rollback.
    await db.run_write(lambda conn: _add_host(conn, "h2"), brief=brief)
    assert await db.run_read(_count, brief=brief) == 1


async def test_a_database_error_reaches_the_caller_and_the_next_transaction_works(
    db: Database,
) -> None:
    await db.run_write(lambda conn: _add_host(conn, "h1"))
    with pytest.raises(IntegrityError):
        await db.run_write(lambda conn: _add_host(conn, "h1"))  # the same host id again
    assert await db.run_read(_count) == 1


async def test_concurrent_writes_all_land(db: Database) -> None:
    # Brief and other writes mixed: the brief ones run on the loop's thread while the
    # database's thread is idle, and behind its queue otherwise.
    ids = await asyncio.gather(
        *(db.run_write(lambda c, i=i: _add_host(c, f"h{i}"), brief=i % 3 != 0) for i in range(30))
    )
    assert sorted(ids) == sorted(f"h{i}" for i in range(30))
    assert await db.run_read(_count) == 30
    assert await db.run_read(_count, brief=True) == 30


async def test_sqlite_transactions_run_on_threads_of_their_own(
    db: Database, database_kind: str
) -> None:
    if database_kind != "sqlite":
        pytest.skip("PostgreSQL transactions run on the event loop (asyncpg)")
    names = {await db.run_read(lambda _conn: threading.current_thread().name) for _ in range(3)} | {
        await db.run_write(lambda _conn: threading.current_thread().name)
    }
    assert len(names) == 1
    (name,) = names
    assert name.startswith("fabric-dra-sqlite") and name != threading.current_thread().name


def _thread_name(_conn: Connection) -> str:
    return threading.current_thread().name


def _busy_error() -> OperationalError:
    # What pysqlite raises when SQLite answers SQLITE_BUSY, as SQLAlchemy wraps it.
    err = sqlite3.OperationalError("database is locked")
    err.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
    return OperationalError("SELECT 1", {}, err)


async def test_brief_sqlite_transactions_run_on_the_loops_thread(
    db: Database, database_kind: str
) -> None:
    if database_kind != "sqlite":
        pytest.skip("PostgreSQL transactions run on the event loop (asyncpg)")
    here = threading.current_thread().name
    assert await db.run_write(_thread_name, brief=True) == here
    assert await db.run_read(_thread_name, brief=True) == here
    assert (await db.run_write(_thread_name)).startswith("fabric-dra-sqlite")
    # Written on the loop's thread, seen by the database's threads and the async sessions.
    await db.run_write(lambda conn: _add_host(conn, "h1"), brief=True)
    assert await db.run_read(_count) == 1
    async with db.read() as session:
        assert (await session.execute(select(func.count()).select_from(_HOSTS))).scalar_one() == 1


async def test_a_brief_write_waits_on_the_thread_while_another_connection_holds_the_lock(
    db: Database, database_kind: str
) -> None:
    # The loop never waits for SQLite's lock: BEGIN IMMEDIATE fails at once on the loop's
    # connection, and the write goes to the thread, which waits with the busy timeout.
    if database_kind != "sqlite":
        pytest.skip("SQLite's lock")
    other = sqlite3.connect(str(db.engine.url.database), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        ran_on: list[str] = []

        def add(conn: Connection) -> str:
            ran_on.append(threading.current_thread().name)
            return _add_host(conn, "h1")

        loop = asyncio.get_running_loop()
        started = loop.time()
        task = asyncio.ensure_future(db.run_write(add, brief=True))
        for _ in range(10):
            await asyncio.sleep(0.01)
        # The loop ran on while the write waited: had it waited for the lock itself, these
        # sleeps would have ended only after the 15 s busy timeout.
        assert loop.time() - started < engine_module.SQLITE_BUSY_TIMEOUT_MS / 1000 / 2
        assert not task.done()
        other.execute("COMMIT")
        assert await task == "h1"
    finally:
        other.close()
    assert len(ran_on) == 1 and ran_on[0].startswith("fabric-dra-sqlite")
    assert await db.run_read(_count, brief=True) == 1
    # The lock is free again: the next brief write runs on the loop's thread.
    assert await db.run_write(_thread_name, brief=True) == threading.current_thread().name


async def test_a_brief_read_that_meets_a_busy_database_runs_again_on_the_thread(
    db: Database, database_kind: str
) -> None:
    if database_kind != "sqlite":
        pytest.skip("SQLite's lock")
    calls: list[str] = []

    def read(conn: Connection) -> int:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise _busy_error()
        return _count(conn)

    assert await db.run_read(read, brief=True) == 0
    assert calls[0] == threading.current_thread().name
    assert len(calls) == 2 and calls[1].startswith("fabric-dra-sqlite")


async def test_a_brief_write_that_meets_a_busy_database_after_begin_is_not_run_twice(
    db: Database, database_kind: str
) -> None:
    # Once BEGIN IMMEDIATE has the lock SQLite does not answer busy; if it did, the work may
    # have done part of its job: the error goes to the caller, nothing is run again.
    if database_kind != "sqlite":
        pytest.skip("SQLite's lock")
    calls = 0

    def write(conn: Connection) -> None:
        nonlocal calls
        calls += 1
        _add_host(conn, "h1")
        raise _busy_error()

    with pytest.raises(OperationalError):
        await db.run_write(write, brief=True)
    assert calls == 1
    assert await db.run_read(_count, brief=True) == 0


async def test_brief_sqlite_writes_are_checkpointed_by_the_thread(
    db: Database, database_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if database_kind != "sqlite":
        pytest.skip("SQLite's write-ahead log")
    monkeypatch.setattr(engine_module, "CHECKPOINT_EVERY", 5)
    for i in range(12):
        await db.run_write(lambda conn, i=i: _add_host(conn, f"h{i}"), brief=True)
    # A write on the thread runs after the checkpoints queued before it.
    await db.run_write(_count)
    writer = db._thread
    assert writer is not None and writer.checkpoints == 2
    # The loop's connection never checkpoints on its own.
    assert writer._inline_conn is not None
    assert writer._inline_conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
    assert await db.run_read(_count) == 12


async def test_a_sqlite_thread_keeps_its_connection_until_a_transaction_fails(
    db: Database, database_kind: str
) -> None:
    if database_kind != "sqlite":
        pytest.skip("PostgreSQL connections come from the engine's pool")

    def connection_of(conn: Connection) -> int:
        return id(conn.connection.dbapi_connection)

    first = {await db.run_write(connection_of) for _ in range(3)}
    assert len(first) == 1  # no check-out and reset per transaction

    def fails(conn: Connection) -> None:
        conn.execute(text("SELECT * FROM no_such_table"))

    with pytest.raises(OperationalError):
        await db.run_write(fails)
    # The failed transaction dropped the connection; the next one opens it again.
    await db.run_write(lambda conn: _add_host(conn, "h1"))
    assert await db.run_read(_count) == 1


async def test_a_cancelled_caller_waits_for_the_transaction_it_started(
    db: Database, database_kind: str
) -> None:
    if database_kind != "sqlite":
        pytest.skip("on PostgreSQL cancellation is asyncpg's (the transaction is rolled back)")
    started, release = threading.Event(), threading.Event()

    def slow(conn: Connection) -> str:
        started.set()
        release.wait(10)
        return _add_host(conn, "h1")

    task = asyncio.ensure_future(db.run_write(slow))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
    task.cancel()
    await asyncio.sleep(0.05)
    # Still waiting: the commit cannot be stopped half way, and the writers' lock is held.
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The transaction ran to its end.
    assert await db.run_read(_count) == 1


async def test_a_disposed_database_can_be_used_again(db: Database) -> None:
    await db.run_write(lambda conn: _add_host(conn, "h1"))
    await db.dispose()
    await db.dispose()  # twice is harmless
    assert await db.run_read(_count) == 1
    async with db.read() as session:
        assert (await session.execute(text("SELECT 1"))).scalar_one() == 1


async def _drop_other_connections(db: Database) -> int:
    """Have PostgreSQL end every other connection to the test database (as a restart or an
    idle timeout would); returns how many it ended."""
    other = create_async_engine(db.engine.url, poolclass=NullPool)
    try:
        async with other.connect() as conn:
            ended = await conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
            return int(ended.scalar_one())
    finally:
        await other.dispose()


async def test_postgresql_pings_an_idle_connection_and_replaces_it_when_the_server_dropped_it(
    db: Database, database_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if database_kind != "postgresql":
        pytest.skip("PostgreSQL's pool")
    assert await db.run_read(_count) == 0  # a pooled connection, now idle
    assert await _drop_other_connections(db) >= 1
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 0.0)
    assert await db.run_read(_count) == 0
    await db.run_write(lambda conn: _add_host(conn, "h1"))
    assert await db.run_read(_count) == 1


async def test_postgresql_does_not_ping_a_connection_in_steady_use(
    db: Database, database_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if database_kind != "postgresql":
        pytest.skip("PostgreSQL's pool")
    assert await db.run_read(_count) == 0
    assert await _drop_other_connections(db) >= 1
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 3600.0)
    # Not pinged: the dropped connection fails the transaction, and the pool replaces it.
    with pytest.raises(DBAPIError) as caught:
        await db.run_read(_count)
    assert caught.value.connection_invalidated
    assert await db.run_read(_count) == 0


async def test_postgresql_keeps_the_statement_connections_it_opens_under_concurrency(
    db: Database, database_kind: str
) -> None:
    if database_kind != "postgresql":
        pytest.skip("PostgreSQL's pool")
    engines = db.engines
    assert len(engines) == 2
    statements = engines[1]
    size = engines[0].sync_engine.pool.size()
    opened: list[object] = []
    event.listen(statements.sync_engine, "connect", lambda conn, _record: opened.append(conn))
    # More statements in flight than the main pool's size (the claim workers outnumber it),
    # within the most it may open (its size and as much overflow).
    in_flight = 2 * size
    gate = asyncio.Barrier(in_flight)

    async def one() -> int:
        await gate.wait()
        return await db.run_read(lambda conn: conn.execute(text("SELECT pg_sleep(0.02)")).scalar())

    for burst in range(4):
        await asyncio.gather(*(one() for _ in range(in_flight)))
        assert len(opened) <= in_flight, burst
    # Every burst after the first found its connections kept: none was closed on return.
    first = len(opened)
    for _ in range(3):
        await asyncio.gather(*(one() for _ in range(in_flight)))
    assert len(opened) == first
    assert statements.sync_engine.pool.checkedin() == first


class _StuckConnection:
    """Stands for SQLAlchemy's aiosqlite adapter whose graceful close lost the race with the
    forced one: it waits for an answer, and when cancelled waits again in a ``finally``
    (aiosqlite's ``close`` awaits ``stop``)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def _terminate_graceful_close(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.Event().wait()


async def test_closes_stuck_after_a_cancelled_statement_are_ended_by_dispose(
    db: Database,
) -> None:
    stuck = _StuckConnection()
    task = asyncio.create_task(stuck._terminate_graceful_close())
    await stuck.started.wait()
    await asyncio.wait_for(db.dispose(), timeout=10)
    assert task.done() and task.cancelled()


async def test_a_cancelled_reset_of_a_pooled_connection_is_not_logged_as_an_error(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    # SQLAlchemy's pool logs a reset that fails, traceback included, and discards the
    # connection; a cancellation there (the service stopping mid-session) loses nothing.
    for engine in db.engines:
        pool_logger = engine.sync_engine.pool.logger
        for error in (asyncio.CancelledError(), ValueError("broken")):
            try:
                raise error
            except BaseException:
                pool_logger.error("Exception during reset or similar", exc_info=True)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [type(r.exc_info[1]) for r in errors if r.exc_info] == [ValueError] * len(db.engines)
