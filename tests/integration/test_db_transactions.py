"""Database.run_write and run_read: whole transactions on a real SQLite file and PostgreSQL.

On SQLite they run on threads of the database's own, one for writes and one for reads (one
hand-over per transaction), and point reads on the event loop's thread unless SQLite is busy;
on PostgreSQL in ``run_sync``, reads in autocommit. Either way a
transaction commits when its function returns and rolls back when it raises, and what it
committed is what the next reader and the async sessions see.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
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


def _write_lock_holder(db: Database) -> sqlite3.Connection:
    """Another connection to the SQLite file, holding its write lock until it commits."""
    path = db.engine.url.database
    assert path is not None
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    return holder


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


async def test_sqlite_writes_and_point_reads_run_on_the_loop_and_other_reads_on_a_thread(
    db: Database, database_kind: str
) -> None:
    if database_kind != "sqlite":
        pytest.skip("PostgreSQL transactions run on the event loop (asyncpg)")
    here = threading.current_thread().name
    assert await db.run_write(lambda _conn: threading.current_thread().name) == here
    assert await db.run_point_read(lambda _conn: threading.current_thread().name) == here
    names = {await db.run_read(lambda _conn: threading.current_thread().name) for _ in range(3)}
    assert len(names) == 1
    (name,) = names
    assert name.startswith("fabric-dra-sqlite") and name != here


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

    # Another connection holds the write lock: the write goes to the database's thread.
    holder = _write_lock_holder(db)
    task = asyncio.ensure_future(db.run_write(slow))
    await asyncio.sleep(0.05)
    holder.execute("COMMIT")
    holder.close()
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


async def test_a_point_read_sees_what_was_committed_on_both_databases(db: Database) -> None:
    assert await db.run_point_read(_count) == 0
    await db.run_write(lambda conn: _add_host(conn, "h1"))
    assert await db.run_point_read(_count) == 1
    await db.run_write(lambda conn: _add_host(conn, "h2"))
    assert await db.run_point_read(_count) == 2


async def test_sqlite_point_reads_run_on_the_event_loop_thread(
    db: Database, database_kind: str
) -> None:
    if database_kind != "sqlite":
        pytest.skip("PostgreSQL reads run on the event loop anyway (asyncpg)")
    here = threading.current_thread().name
    assert await db.run_point_read(lambda _conn: threading.current_thread().name) == here
    # The other reads still go to the read thread.
    assert await db.run_read(lambda _conn: threading.current_thread().name) != here


async def test_a_busy_sqlite_sends_the_point_read_to_the_read_thread_without_blocking_the_loop(
    db: Database, database_kind: str
) -> None:
    if database_kind != "sqlite":
        pytest.skip("SQLite's locks")
    await db.run_write(lambda conn: _add_host(conn, "h1"))
    # Another process's connection in exclusive locking mode keeps every reader out of a WAL
    # database while it holds its lock (it can take it only while no other connection is
    # open): the inline read must not wait for it on the loop.
    await db.dispose()
    path = db.engine.url.database
    assert path is not None
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE hosts SET hostname = 'held' WHERE host_id = 'h1'")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.ensure_future(tick())
    try:
        read = asyncio.ensure_future(
            db.run_point_read(
                lambda conn: (
                    threading.current_thread().name,
                    conn.execute(text("SELECT hostname FROM hosts")).scalar_one(),
                )
            )
        )
        await asyncio.sleep(0.3)
        assert not read.done()  # waiting on the read thread for the lock
        assert ticks >= 10  # ...while the loop went on
        holder.execute("COMMIT")
        holder.close()
        thread, hostname = await asyncio.wait_for(read, 10)
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
    assert thread.startswith("fabric-dra-sqlite")
    assert hostname == "held"
    # Once the lock is gone, point reads are inline again.
    here = threading.current_thread().name
    assert await db.run_point_read(lambda _conn: threading.current_thread().name) == here


async def test_a_point_read_from_another_thread_goes_to_the_read_thread(
    db: Database, database_kind: str
) -> None:
    if database_kind != "sqlite":
        pytest.skip("SQLite's inline connection")
    await db.run_write(lambda conn: _add_host(conn, "h1"))
    assert await db.run_point_read(_count) == 1  # made on this loop's thread

    def elsewhere() -> str:
        return asyncio.run(db.run_point_read(lambda _conn: threading.current_thread().name))

    name = await asyncio.get_running_loop().run_in_executor(None, elsewhere)
    assert name.startswith("fabric-dra-sqlite")


async def test_a_write_while_another_process_writes_goes_to_the_write_thread_and_lands(
    db: Database, database_kind: str
) -> None:
    if database_kind != "sqlite":
        pytest.skip("SQLite's locks")
    await db.run_write(lambda conn: _add_host(conn, "h0"))  # the loop's connection is open
    holder = _write_lock_holder(db)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.ensure_future(tick())
    try:
        write = asyncio.ensure_future(
            db.run_write(lambda conn: (threading.current_thread().name, _add_host(conn, "h1")))
        )
        await asyncio.sleep(0.3)
        assert not write.done()  # waiting on the write thread for the lock
        assert ticks >= 10  # ...while the loop went on
        holder.execute("COMMIT")
        holder.close()
        thread, _ = await asyncio.wait_for(write, 10)
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
    assert thread.startswith("fabric-dra-sqlite")
    assert await db.run_point_read(_count) == 2
    here = threading.current_thread().name
    assert await db.run_write(lambda _conn: threading.current_thread().name) == here


async def test_writes_on_the_loop_checkpoint_the_wal_on_the_write_thread(
    db: Database, database_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if database_kind != "sqlite":
        pytest.skip("SQLite's WAL")
    monkeypatch.setattr(engine_module, "CHECKPOINT_EVERY", 5)
    checkpoints: list[str] = []
    checkpoint = engine_module._SqliteThread._checkpoint

    def spy(self: engine_module._SqliteThread) -> None:
        checkpoints.append(threading.current_thread().name)
        checkpoint(self)

    monkeypatch.setattr(engine_module._SqliteThread, "_checkpoint", spy)

    def add(conn: Connection, host_id: str) -> str:
        _add_host(conn, host_id)
        return threading.current_thread().name

    threads = [await db.run_write(lambda conn, i=i: add(conn, f"h{i}")) for i in range(12)]
    here = threading.current_thread().name
    # Writes 1-5 on the loop, a checkpoint queued on the write thread, and write 6 (which
    # restarts the WAL and syncs its header) behind it on that thread; then 7-11 on the loop
    # and 12 on the thread.
    on_thread = [i for i, name in enumerate(threads, 1) if name != here]
    assert on_thread == [6, 12]
    assert all(threads[i - 1].startswith("fabric-dra-sqlite") for i in on_thread)
    assert len(checkpoints) == 2
    assert all(name.startswith("fabric-dra-sqlite") for name in checkpoints)
    assert await db.run_point_read(_count) == 12


async def test_a_failed_checkpoint_is_logged_and_fails_no_write(
    db: Database,
    database_kind: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if database_kind != "sqlite":
        pytest.skip("SQLite's WAL")
    monkeypatch.setattr(engine_module, "CHECKPOINT_EVERY", 2)

    def broken(self: engine_module._SqliteThread) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(engine_module._SqliteThread, "_checkpoint", broken)
    for i in range(4):
        await db.run_write(lambda conn, i=i: _add_host(conn, f"h{i}"))
    assert await db.run_point_read(_count) == 4
    assert "SQLite WAL checkpoint failed: disk I/O error" in caplog.text


def test_every_busy_and_locked_code_counts_as_busy() -> None:
    # The extended codes keep the primary code in their low byte
    # (https://www.sqlite.org/rescode.html): SQLITE_BUSY_RECOVERY while another process
    # recovers the WAL must send the transaction to the thread that waits, like SQLITE_BUSY.
    def error(code: int) -> OperationalError:
        orig = sqlite3.OperationalError("database is locked")
        orig.sqlite_errorcode = code  # type: ignore[attr-defined]
        return OperationalError("SELECT 1", {}, orig)

    busy_recovery, busy_snapshot, locked_sharedcache = 5 | 1 << 8, 5 | 2 << 8, 6 | 1 << 8
    for code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, busy_recovery, busy_snapshot):
        assert engine_module.sqlite_busy(error(code)), code
    assert engine_module.sqlite_busy(error(locked_sharedcache))
    for code in (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_READONLY):
        assert not engine_module.sqlite_busy(error(code)), code


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
