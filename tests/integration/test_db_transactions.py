"""Database.run_write and run_read: whole transactions on a real SQLite file and PostgreSQL.

On SQLite they run on threads of the database's own, one for writes and one for reads (one
hand-over per transaction); on PostgreSQL in ``run_sync``, reads in autocommit. Either way a
transaction commits when its function returns and rolls back when it raises, and what it
committed is what the next reader and the async sessions see.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from sqlalchemy import Connection, func, insert, select, text
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


async def test_a_write_that_raises_leaves_nothing_behind(db: Database) -> None:
    class Refused(Exception):
        pass

    def half(conn: Connection) -> None:
        _add_host(conn, "h1")
        raise Refused

    with pytest.raises(Refused):
        await db.run_write(half)
    assert await db.run_read(_count) == 0
    # The connection is usable again after the rollback.
    await db.run_write(lambda conn: _add_host(conn, "h2"))
    assert await db.run_read(_count) == 1


async def test_a_database_error_reaches_the_caller_and_the_next_transaction_works(
    db: Database,
) -> None:
    await db.run_write(lambda conn: _add_host(conn, "h1"))
    with pytest.raises(IntegrityError):
        await db.run_write(lambda conn: _add_host(conn, "h1"))  # the same host id again
    assert await db.run_read(_count) == 1


async def test_concurrent_writes_all_land(db: Database) -> None:
    ids = await asyncio.gather(
        *(db.run_write(lambda c, i=i: _add_host(c, f"h{i}")) for i in range(20))
    )
    assert sorted(ids) == sorted(f"h{i}" for i in range(20))
    assert await db.run_read(_count) == 20


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
