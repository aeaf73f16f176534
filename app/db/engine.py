"""Engine and session factory for SQLite (aiosqlite) and PostgreSQL (asyncpg).

SQLite is set up for a service: WAL journal, a busy timeout, foreign keys on, and transactions
that BEGIN explicitly. pysqlite would otherwise start a transaction only at the first write, so a
read-then-write would not be isolated; :meth:`Database.write` begins with ``BEGIN IMMEDIATE`` to
take the write lock up front (PITFALLS.md, "SQLAlchemy 2.1 async + Alembic").

Short transactions on the claim path run as a whole: :meth:`Database.run_write` and
:meth:`Database.run_read` take a function of a synchronous Core connection. On SQLite it runs
on one thread of its own with its own pysqlite connection, one hand-over to that thread per
transaction; through aiosqlite every statement costs four (cursor, execute, fetch, close) plus
begin and commit, and those hand-overs were the largest part of a claim's database time.
The journal's transactions of a few rows by key (``brief=True``) skip that thread too when
SQLite's lock is free at once, and run on the event loop's thread (see :class:`_SqliteThread`).
On PostgreSQL the function runs, with the pool's check-out and check-in around it, in one greenlet
(SQLAlchemy's bridge from its synchronous core to asyncpg): asyncpg is asynchronous itself, so
there is no thread to save. ``AsyncConnection`` would start three greenlets per transaction
(check-out, the work, check-in), about 80 µs of CPU more per statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import re
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, SQLAlchemyError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import NullPool, QueuePool, StaticPool
from sqlalchemy.sql.expression import Executable
from sqlalchemy.util import greenlet_spawn

from app import aio
from app.aio import EventLoopChoice
from app.config import redact_url
from app.db.direct import DirectStatements

SQLITE_BUSY_TIMEOUT_MS = 15_000
# PostgreSQL: a pooled connection idle this long (seconds) is pinged before use.
PING_AFTER_IDLE_S = 2.0
_BEGIN_MODE = "fabric_dra_sqlite_begin"
# PostgreSQL connections kept per pool (database.pool_size).
DEFAULT_POOL_SIZE = 5
T = TypeVar("T")


class DatabaseUnavailable(Exception):
    """The database cannot be reached, refused the connection, or is not a usable database.

    From :func:`check_usable` and :func:`unusable` the message is one line: ``database <URL
    without credentials>: <the driver's reason>``.
    """


def unusable(engine: AsyncEngine, err: BaseException) -> DatabaseUnavailable:
    """The :class:`DatabaseUnavailable` for ``err`` (a SQLAlchemy or driver error, or an
    OSError, at connect or first use): one line naming the URL without credentials and the
    driver's own reason (``role "x" does not exist``, ``file is not a database``)."""
    # A DBAPIError's own text adds the statement and "(Background on this error at: ...)".
    cause = err.orig if isinstance(err, DBAPIError) and err.orig is not None else err
    lines = str(cause).strip().splitlines()
    if lines:
        first = lines[0]
    elif isinstance(cause, TimeoutError) and engine.dialect.name == "postgresql":
        first = f"no answer within {POSTGRESQL_CONNECT_TIMEOUT_S:.0f} s (TimeoutError)"
    else:
        first = type(cause).__name__
    return DatabaseUnavailable(f"database {_shown(engine)}: {redact_url(first)}")


def _shown(engine: AsyncEngine) -> str:
    # str(URL) masks the password; redact_url hides the user name too, as every error does.
    return redact_url(str(engine.url))


def _sqlite_path_problem(engine: AsyncEngine) -> str | None:
    """Why SQLite cannot open its file, checked before connecting: a failed connect leaves
    aiosqlite's worker thread reporting to the loop after it may have closed."""
    if engine.dialect.name != "sqlite" or not engine.url.database:
        return None
    path = Path(engine.url.database)
    if path.is_dir():
        return f"{path} is a directory, not a database file"
    if not path.parent.exists():
        return f"directory {path.parent} does not exist"
    if not path.parent.is_dir():
        return f"{path.parent} is not a directory"
    return None


def missing_sqlite_file(engine: AsyncEngine) -> Path | None:
    """The SQLite file ``engine`` would create at its first connection, if it does not exist
    yet in an existing directory (None for PostgreSQL, for an existing file, and where
    :func:`check_usable` names a problem): read-only commands say so instead of creating it."""
    if engine.dialect.name != "sqlite" or not engine.url.database:
        return None
    path = Path(engine.url.database)
    return None if path.exists() or not path.parent.is_dir() else path


async def check_usable(engine: AsyncEngine) -> None:
    """Open a connection and run ``SELECT 1`` (on SQLite the connection's PRAGMAs read the
    file's header first), so that a command fails at once with one clear line instead of a
    driver traceback at its first query.

    Raises:
        DatabaseUnavailable: see :func:`unusable`.
    """
    problem = _sqlite_path_problem(engine)
    if problem is not None:
        raise DatabaseUnavailable(f"database {_shown(engine)}: {problem}")
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except (SQLAlchemyError, OSError) as err:
        if engine.dialect.name == "sqlite":
            # Let aiosqlite's worker thread finish the failed connection while the loop runs.
            await asyncio.sleep(0.05)
        raise unusable(engine, err) from err


def _setup_sqlite(
    engine: Engine,
    *,
    begin_event: bool = True,
    busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
    autocheckpoint: bool = True,
) -> None:
    """SQLite's PRAGMAs on every new connection of ``engine``, and with ``begin_event`` its
    BEGIN (mode from the ``_BEGIN_MODE`` execution option) emitted when a transaction starts.

    Without ``begin_event`` the caller emits BEGIN itself (:func:`_emit_begin`): an engine with
    a listener of its own dispatches every connection event of every statement (before and
    after execute, before and after the cursor's), about 10 % of a journal transaction's CPU.
    ``busy_timeout_ms``: how long a statement waits for SQLite's lock (0: SQLITE_BUSY at once).
    Without ``autocheckpoint`` the connection's commits never checkpoint the WAL
    (``wal_autocheckpoint=0``): another connection must.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # BEGIN comes from us (below, or the caller) instead of pysqlite's lazy one.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        if not autocheckpoint:
            cursor.execute("PRAGMA wal_autocheckpoint=0")
        cursor.close()

    if begin_event:

        @event.listens_for(engine, "begin")
        def _on_begin(connection: Any) -> None:
            _emit_begin(connection, connection.get_execution_options().get(_BEGIN_MODE, "DEFERRED"))


def _emit_begin(connection: Connection, mode: str) -> None:
    """Send ``BEGIN <mode>`` on ``connection``'s driver connection, in the transaction
    SQLAlchemy just began (it sends none on SQLite).

    On the driver's own cursor: through ``exec_driver_sql`` the BEGIN cost a third of a small
    transaction's CPU (about 12 µs). The driver's error is wrapped as SQLAlchemy wraps those of
    the statements (``DBAPIError.instance``).

    Raises:
        DBAPIError: the driver's error (SQLITE_BUSY when the lock was not had in time).
    """
    statement = f"BEGIN {mode}"
    cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(statement)
    except Exception as err:
        dbapi = connection.dialect.loaded_dbapi
        raise DBAPIError.instance(statement, None, err, dbapi.Error) from err
    finally:
        cursor.close()


def _ping_idle_connections(engine: Engine) -> None:
    """Ping a pooled connection at checkout when it sat idle for ``PING_AFTER_IDLE_S`` or more
    (SQLAlchemy's ``pool_pre_ping``, for idle connections only): a connection the server
    dropped meanwhile (a restart, a fail-over, an idle timeout) is replaced before use. A
    connection in steady use is not pinged: the ping was one more round trip for every
    transaction, a tenth of a claim's CPU on PostgreSQL; a connection lost while in use
    fails its transaction either way, and the pool replaces it."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as err:  # the driver's own error for a dead connection
            raise DisconnectionError(f"idle connection lost: {err}") from err
        if not alive:
            raise DisconnectionError("idle connection lost")


class _CancelledResetFilter(logging.Filter):
    """Keeps SQLAlchemy's "Exception during reset or similar" off the log when the exception
    is a cancellation.

    A task cancelled in the middle of a session (the service stopping) has the rollback of
    the connection it returns cancelled too. The pool then logs that with a traceback,
    discards the connection, and lets the cancellation go on
    (sqlalchemy/pool/base.py ``_finalize_fairy``): nothing is lost, and a traceback on stderr
    at a clean stop would read as a crash. Such a record becomes one debug line here; any
    other error of a reset is logged as SQLAlchemy logs it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, asyncio.CancelledError):
            logging.getLogger(__name__).debug(
                "a pooled connection's reset was cancelled; the pool discarded the connection"
            )
            return False
        return True


_CANCELLED_RESET_FILTER = _CancelledResetFilter()


def _quiet_cancelled_resets(engine: AsyncEngine) -> AsyncEngine:
    """Put :class:`_CancelledResetFilter` on the logger of ``engine``'s pool (its class's
    logger; with ``echo_pool`` an instance logger wrapping one). Returns ``engine``."""
    pool_logger: Any = getattr(engine.sync_engine.pool, "logger", None)
    target = getattr(pool_logger, "logger", pool_logger)
    if isinstance(target, logging.Logger) and _CANCELLED_RESET_FILTER not in target.filters:
        target.addFilter(_CANCELLED_RESET_FILTER)
    return engine


def make_engine(url: str, *, pool_size: int = DEFAULT_POOL_SIZE, echo: bool = False) -> AsyncEngine:
    """Create an async engine for ``url`` (``sqlite+aiosqlite://`` or ``postgresql+asyncpg://``).

    The engine belongs to the running event loop: create and dispose it within one loop.

    Raises:
        ValueError: the URL names another database, or an in-memory SQLite database (its one
            shared connection breaks session isolation; use a file).
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ValueError("in-memory SQLite is not supported; give a file path")
        engine = create_async_engine(
            url, echo=echo, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        )
        _setup_sqlite(engine.sync_engine)
        return _quiet_cancelled_resets(engine)
    if backend == "postgresql":
        return _postgresql_engine(url, pool_size, echo)
    raise ValueError(f"unsupported database {backend!r}: use SQLite or PostgreSQL")


POSTGRESQL_CONNECT_TIMEOUT_S = 15.0
"""The longest a new PostgreSQL connection may take to open, seconds (asyncpg's own default
is 60 s): a server that accepts TCP and never answers fails a command or a transaction in
this time instead of a minute."""


def _postgresql_engine(
    url: str | URL, pool_size: int, echo: bool, *, max_overflow: int | None = None, **options: Any
) -> AsyncEngine:
    # A pool of pool_size connections that opens max_overflow more under load (as many
    # again by default), pings connections that sat idle, and keeps cancelled resets off
    # the log; ``options`` go to the engine.
    engine = create_async_engine(
        url,
        echo=echo,
        pool_size=pool_size,
        max_overflow=pool_size if max_overflow is None else max_overflow,
        connect_args={"timeout": POSTGRESQL_CONNECT_TIMEOUT_S},
        **options,
    )
    _ping_idle_connections(engine.sync_engine)
    return _quiet_cancelled_resets(engine)


def _autocommit_engine(engine: AsyncEngine) -> AsyncEngine:
    """The autocommit engine beside PostgreSQL ``engine``: the same URL, and a pool that
    keeps every connection it opens, up to as many as ``engine``'s pool may open (its size
    and as much overflow again: twice its size), instead of a pool of the same size with
    the same overflow.

    This engine carries :meth:`Database.run_read`, one check-out per statement from every
    worker at once, so its concurrency may stand above the pool's size (8 claim workers
    against the default 5; the claim path's hottest statements have since moved to
    :meth:`Database.fetch`). A QueuePool closes a
    connection checked in while its size is reached (sqlalchemy/pool/impl.py
    ``QueuePool._do_return_conn``), so under such load it opened
    and closed a connection every few bursts: about 4 ms of CPU each (1.3 ms in this
    process, 2.7 ms in the server's new backend) and a connect's wait in some claim's
    path (bench.controlplane on PostgreSQL: 9 connects in a 4 s window; pod to bind p99
    62.9-79.5 ms before and 57.8-65.5 ms with the connections kept, three pairs of runs).
    """
    return _postgresql_engine(
        engine.url,
        _most_open(engine),
        engine.echo,
        max_overflow=0,
        isolation_level="AUTOCOMMIT",
    )


def _most_open(engine: AsyncEngine) -> int:
    """The most connections PostgreSQL ``engine``'s pool may open: its size and as much
    overflow again (:func:`_postgresql_engine`), twice its size."""
    pool = engine.pool
    return 2 * (pool.size() if isinstance(pool, QueuePool) else DEFAULT_POOL_SIZE)


def _direct_statements(engine: AsyncEngine) -> DirectStatements:
    """The held connections of :meth:`Database.fetch` beside PostgreSQL ``engine``: as many
    as the autocommit engine's pool may open (twice ``engine``'s pool size), each opened by
    an engine of the same URL without a pool of its own (``NullPool``), so that SQLAlchemy's
    dialect sets the connection up (its JSON codecs) and :mod:`app.db.direct` keeps it."""
    return DirectStatements(
        create_async_engine(engine.url, echo=engine.echo, poolclass=NullPool),
        _most_open(engine),
        PING_AFTER_IDLE_S,
    )


_TABLE_NAME = re.compile(r"[a-z_]+")


def _in_transaction(engine: Engine, work: Callable[[Connection], T]) -> T:
    # Runs in a greenlet of greenlet_spawn: the synchronous engine's I/O awaits asyncpg there.
    with engine.begin() as conn:
        return work(conn)


def _on_connection(engine: Engine, work: Callable[[Connection], T]) -> T:
    # As _in_transaction, on an engine in autocommit: no BEGIN, no COMMIT.
    with engine.connect() as conn:
        return work(conn)


class _SqliteThread:
    """One thread with one pysqlite connection of its own, for whole transactions
    (:meth:`Database.run_write`, :meth:`Database.run_read`).

    The connection is made in that thread at first use, kept open, and only ever used there
    (pysqlite's ``check_same_thread`` holds), with the same PRAGMAs and BEGIN handling as the
    async engine's connections: ``BEGIN IMMEDIATE`` for a writer's transactions, ``BEGIN
    DEFERRED`` for a reader's. Transactions on it run one after another, in submission order.
    A transaction that fails drops the connection; the next one opens it again.

    The loop and the thread meet through a queue and ``call_soon_threadsafe``: a transaction
    costs one wake-up each way, without ``run_in_executor``'s concurrent future chained to an
    asyncio one, and without a pool check-out and reset per transaction (the thread keeps its
    connection). Together those were most of a small read's CPU.

    A *brief* transaction (a few rows by key, see :meth:`run`) skips the thread: it runs on the
    event loop's thread, on a second connection whose busy timeout is 0, when nothing is
    queued for the thread (a writer's transactions stay in submission order) and SQLite's
    lock is free at once. The two thread switches and the hand-over of the GIL cost about
    60-110 µs of CPU, more than such a transaction itself (about 45 µs). When the lock is
    taken (another process, or another connection of this one, writes), ``BEGIN IMMEDIATE``
    fails at once with SQLITE_BUSY, nothing has run yet, and the transaction goes to the
    thread, which waits for the lock with the usual busy timeout: the loop never waits for
    SQLite's lock. That connection does no automatic checkpoint (it would copy the WAL into
    the database and sync it on the loop's thread); every :data:`CHECKPOINT_EVERY` commits
    of it, the thread runs a passive checkpoint instead ("Checkpointing" and
    ``wal_autocheckpoint`` in SQLite's "Write-Ahead Logging" page).
    """

    def __init__(self, url: URL, *, write: bool) -> None:
        self._url = url.set(drivername="sqlite+pysqlite")
        self._write = write
        self._begin = "IMMEDIATE" if write else "DEFERRED"
        self._jobs: queue.SimpleQueue[_Job | None] | None = None  # started at first use
        self._thread: threading.Thread | None = None
        self._engine: Engine | None = None
        self._conn: Connection | None = None  # the thread's own
        # Jobs handed to the thread and not yet settled (counted on the loop's side).
        self._pending = 0
        # The loop thread's connection for brief transactions, and its commits since the
        # last checkpoint the thread ran.
        self._inline_engine: Engine | None = None
        self._inline_conn: Connection | None = None
        self._inline_commits = 0
        # Passive checkpoints run for the brief transactions' commits (for tests and metrics).
        self.checkpoints = 0

    def _new_engine(self, *, busy_timeout_ms: int, autocheckpoint: bool) -> Engine:
        """A pysqlite engine of one connection, sending BEGIN itself (:func:`_emit_begin`)."""
        engine = create_engine(
            self._url, poolclass=StaticPool, connect_args={"timeout": busy_timeout_ms / 1000}
        )
        _setup_sqlite(
            engine,
            begin_event=False,
            busy_timeout_ms=busy_timeout_ms,
            autocheckpoint=autocheckpoint,
        )
        return engine

    def _connection(self) -> Connection:
        if self._conn is None:
            if self._engine is None:
                self._engine = self._new_engine(
                    busy_timeout_ms=SQLITE_BUSY_TIMEOUT_MS, autocheckpoint=True
                )
            self._conn = self._engine.connect()
        return self._conn

    def _transaction(self, work: Callable[[Connection], T]) -> T:
        """``work`` in one transaction (one snapshot for a reader's several statements)."""
        conn = self._connection()
        try:
            with conn.begin():
                _emit_begin(conn, self._begin)
                return work(conn)
        except BaseException:
            self._drop()
            raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                conn.close()

    def _serve(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        while (job := jobs.get()) is not None:
            call, loop, future = job
            try:
                outcome: tuple[bool, Any] = (True, call())
            except BaseException as err:  # handed to the waiting coroutine
                outcome = (False, err)
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._settled, future, outcome)

    def _settled(self, future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
        self._pending -= 1
        _settle(future, outcome)

    def _submit(self, call: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``call()`` for the thread (started at first use); the future of its outcome."""
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            self._thread = threading.Thread(
                target=self._serve, args=(self._jobs,), name="fabric-dra-sqlite", daemon=True
            )
            self._thread.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._pending += 1
        self._jobs.put((call, loop, future))
        return future

    async def _call(self, call: Callable[[], T]) -> T:
        """``call()`` in the thread (started at first use); its result or its error."""
        future = self._submit(call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # The transaction goes on to its end in the thread (a commit cannot be stopped
            # half way): wait for it, so that a caller's lock is held until then.
            await asyncio.wait({future})
            raise

    async def run(self, work: Callable[[Connection], T], *, brief: bool = False) -> T:
        """``work`` in one transaction; what it returned, or its error.

        ``brief``: ``work`` reads or writes a few rows by key. It then runs on the loop's
        thread when it can (see the class); a brief read that meets SQLITE_BUSY there is run
        again on the thread, so it must not mind running twice.
        """
        if brief and (not self._write or self._pending == 0):
            ran, result = self._run_inline(work)
            if ran:
                return cast(T, result)
        return await self._call(lambda: self._transaction(work))

    def _inline_connection(self) -> Connection:
        if self._inline_conn is None:
            if self._inline_engine is None:
                # Never wait for the lock here, never checkpoint here (see the class).
                self._inline_engine = self._new_engine(busy_timeout_ms=0, autocheckpoint=False)
            self._inline_conn = self._inline_engine.connect()
        return self._inline_conn

    def _run_inline(self, work: Callable[[Connection], T]) -> tuple[bool, Any]:
        """(True, what ``work`` returned) when it ran here; (False, None) when SQLite was busy
        before anything was written (the thread must run it)."""
        conn = self._inline_connection()
        transaction = conn.begin()
        try:
            _emit_begin(conn, self._begin)
        except DBAPIError as err:
            transaction.rollback()
            if _sqlite_busy(err):  # no transaction began: the connection is fine as it is
                return False, None
            self._drop_inline()
            raise
        try:
            with transaction:
                result = work(conn)
        except DBAPIError as err:
            if not self._write and _sqlite_busy(err):  # rolled back, nothing written
                return False, None
            self._drop_inline()
            raise
        except BaseException:
            self._drop_inline()
            raise
        if self._write:
            self._inline_commits += 1
            if self._inline_commits >= CHECKPOINT_EVERY:
                self._inline_commits = 0
                # Not awaited: the thread's next jobs wait behind it, the loop does not.
                self._submit(self._checkpoint)
        return True, result

    def _checkpoint(self) -> None:
        """A passive checkpoint, outside any transaction (runs in the thread)."""
        try:
            raw = self._connection().connection.dbapi_connection
            assert raw is not None
            raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except Exception:  # the next one, or another connection's, catches up
            logging.getLogger(__name__).warning("SQLite: a WAL checkpoint failed", exc_info=True)
            self._drop()
            return
        self.checkpoints += 1

    def _drop_inline(self) -> None:
        conn, self._inline_conn = self._inline_conn, None
        if conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                conn.close()

    def _close(self) -> None:
        self._drop()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    async def dispose(self) -> None:
        """Close the connection in its thread and stop the thread (a later use starts
        another); a no-op when it was never used."""
        self._drop_inline()
        if self._inline_engine is not None:
            self._inline_engine.dispose()
            self._inline_engine = None
        jobs, thread = self._jobs, self._thread
        if jobs is None or thread is None:
            return
        try:
            await self._call(self._close)
        finally:
            self._jobs = self._thread = None
            jobs.put(None)
            await asyncio.get_running_loop().run_in_executor(None, thread.join)


_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]

# Commits of brief transactions between two checkpoints (SQLite's automatic checkpoint comes
# at 1,000 WAL pages; such a commit writes a few pages).
CHECKPOINT_EVERY = 200


def _sqlite_busy(err: DBAPIError) -> bool:
    """True when SQLite refused for a lock (SQLITE_BUSY, any extended code)."""
    code = getattr(err.orig, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_BUSY


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    """Hand a thread's outcome (ok, result or error) to ``future``, unless it was cancelled."""
    if future.cancelled():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


@dataclass
class Database:
    """An engine with its session factory. Close it with :meth:`dispose`."""

    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    # SQLite has one writer at a time; waiting for its lock means polling with sleeps that grow
    # to 100 ms. Queueing writers here instead keeps them in order at no cost.
    _write_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    # The journal's feed of held devices (app.heldfeed.HeldFeed), created by the journal.
    held_feed: Any = field(default=None, repr=False)
    # SQLite only: the threads that run whole transactions, one for run_write and one for
    # run_read, so that a read never waits behind a write that waits for SQLite's lock.
    _thread: _SqliteThread | None = field(default=None, repr=False)
    _reader: _SqliteThread | None = field(default=None, repr=False)
    # PostgreSQL only: an engine without transactions, for run_read, with
    # a pool of its own whose connections stay in autocommit. Switching a pooled connection
    # to autocommit at each check-out and back at each check-in (execution_options on the
    # same pool) cost about 50 µs of CPU per statement. See _autocommit_engine for its size.
    _autocommit: AsyncEngine | None = field(default=None, repr=False)
    # PostgreSQL only: the connections of fetch (app.db.direct), as many as the autocommit
    # engine's pool may open.
    _direct: DirectStatements | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.engine.dialect.name == "sqlite":
            self._thread = _SqliteThread(self.engine.url, write=True)
            self._reader = _SqliteThread(self.engine.url, write=False)
        else:
            self._autocommit = _autocommit_engine(self.engine)
            self._direct = _direct_statements(self.engine)

    @classmethod
    def connect(
        cls, url: str, *, pool_size: int = DEFAULT_POOL_SIZE, echo: bool = False
    ) -> Database:
        """Build a Database for ``url`` (no connection is opened until first use)."""
        engine = make_engine(url, pool_size=pool_size, echo=echo)
        return cls(engine=engine, sessions=async_sessionmaker(engine, expire_on_commit=False))

    @property
    def engines(self) -> tuple[AsyncEngine, ...]:
        """Every engine this Database sends statements through: :attr:`engine`, and on
        PostgreSQL the autocommit engine of :meth:`run_read` (for event listeners that must
        see every statement; :meth:`fetch`'s statements have :func:`app.db.direct.listen`)."""
        return (self.engine,) if self._autocommit is None else (self.engine, self._autocommit)

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        """A session for reading; its transaction is rolled back at the end."""
        async with self.sessions() as session:
            yield session

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        """A session in one transaction, committed at the end or rolled back on error.

        On SQLite the transaction starts with ``BEGIN IMMEDIATE`` so that what it reads cannot
        change before it writes, and writers of this process take turns (an asyncio lock).
        """
        if self.dialect != "sqlite":
            async with self.sessions() as session, session.begin():
                yield session
            return
        async with self._write_lock, self.sessions() as session, session.begin():
            await session.connection(execution_options={_BEGIN_MODE: "IMMEDIATE"})
            yield session

    async def run_write(self, work: Callable[[Connection], T], *, brief: bool = False) -> T:
        """Run ``work`` (a function of a synchronous Core connection, doing no I/O but the
        database's) in one transaction, committed when it returns and rolled back when it
        raises; return what it returned. On SQLite it runs on the database's own thread after
        ``BEGIN IMMEDIATE``, in turn with this process's other writers (the lock of
        :meth:`write`); on PostgreSQL on a pooled connection, in one greenlet with the
        check-out and check-in.

        ``brief``: ``work`` touches a few rows by key (tens of microseconds). On SQLite it
        then runs on the event loop's thread when SQLite's lock is free at once, and on the
        database's thread otherwise (see :class:`_SqliteThread`); no effect on PostgreSQL.

        Raises:
            whatever ``work`` raises, and the driver's errors (SQLAlchemyError).
        """
        if self._thread is None:
            return await greenlet_spawn(_in_transaction, self.engine.sync_engine, work)
        async with self._write_lock:
            return await self._thread.run(work, brief=brief)

    async def run_read(self, work: Callable[[Connection], T], *, brief: bool = False) -> T:
        """Run ``work`` as :meth:`run_write` does, for reading: one statement, or several that
        need no common snapshot. On SQLite in a read transaction on the database's thread
        (not behind :meth:`write`'s lock, which only writers take); on PostgreSQL in
        autocommit, which saves the BEGIN and the ROLLBACK around the statement (two round
        trips to the server). Use :meth:`read` when statements must see one snapshot.

        ``brief``: as for :meth:`run_write`; ``work`` may then run twice (again on the
        database's thread when SQLite answered busy), so it must only read."""
        if self._autocommit is not None:
            return await greenlet_spawn(_on_connection, self._autocommit.sync_engine, work)
        assert self._reader is not None
        return await self._reader.run(work, brief=brief)

    async def fetch(
        self, statement: Executable, params: Mapping[str, Any], *, writes: bool = False
    ) -> list[Sequence[Any]]:
        """Run ``statement``, a Core statement built once and kept (on PostgreSQL its compiled
        form is kept beside it), with ``params``; return its rows as tuples in the
        statement's column order.

        On PostgreSQL it is sent straight to asyncpg on a connection held for such
        statements, in autocommit, without SQLAlchemy's execution layer (a third of the
        CPU; see :mod:`app.db.direct`). On SQLite it runs as :meth:`run_write` (``writes``)
        or :meth:`run_read` does with ``brief``.

        Raises:
            SQLAlchemyError: ``StatementError`` for a parameter without a value or a value
                its type refuses (its ``orig`` says which), ``IntegrityError`` for a
                constraint, other ``DBAPIError`` when the database failed.
        """
        if self._direct is not None:
            return await self._direct.fetch(statement, params)  # type: ignore[return-value]

        def rows(conn: Connection) -> list[Sequence[Any]]:
            return list(conn.execute(statement, params).all())

        if writes:
            return await self.run_write(rows, brief=True)
        return await self.run_read(rows, brief=True)

    @property
    def direct(self) -> DirectStatements | None:
        """PostgreSQL: the connections of :meth:`fetch`; None on SQLite."""
        return self._direct

    async def analyze(self, table: str) -> None:
        """Refresh the planner's statistics of ``table`` (PostgreSQL's ``ANALYZE``), after a
        bulk change: until autovacuum's own ANALYZE runs (up to a minute later, "The
        Autovacuum Daemon" in the PostgreSQL manual), a table filled from empty is planned as
        if it were tiny, and a lookup by a unique name scanned every row. The manual's
        "Populating a Database" says to run ANALYZE after a bulk load. A no-op on SQLite,
        whose planner uses the unique indexes without statistics.

        Raises:
            ValueError: ``table`` is not a plain lower-case table name.
            SQLAlchemyError: the database failed (an unknown table, too).
        """
        if not _TABLE_NAME.fullmatch(table):
            raise ValueError(f"not a table name: {table!r}")
        if self._autocommit is None:
            return
        async with self._autocommit.connect() as conn:
            await conn.execute(text(f"ANALYZE {table}"))

    async def ping(self) -> None:
        """Run ``SELECT 1``.

        Raises:
            DatabaseUnavailable: with the driver's reason (no credentials in it).
        """
        try:
            async with self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception as err:
            raise DatabaseUnavailable(f"database unreachable: {type(err).__name__}") from err

    async def dispose(self) -> None:
        """Close every pooled connection (and on SQLite stop the transaction thread), then
        end the closes of connections whose work was cancelled (see
        :func:`_end_cancelled_closes`)."""
        for thread in (self._thread, self._reader):
            if thread is not None:
                await thread.dispose()
        if self._direct is not None:
            await self._direct.dispose()
        if self._autocommit is not None:
            await self._autocommit.dispose()
        await self.engine.dispose()
        await _end_cancelled_closes(CLOSE_WAIT_S)


# How long a close of a connection whose work was cancelled may take before it is given up.
CLOSE_WAIT_S = 1.0
CANCEL_ROUNDS = 4


async def _end_cancelled_closes(timeout_s: float) -> None:
    """Wait until SQLAlchemy's closes of connections whose work was cancelled have ended, at
    most ``timeout_s`` seconds, and cancel those that have not.

    When a task is cancelled in the middle of a statement, SQLAlchemy's asyncio connector
    invalidates the connection: it starts a graceful close in a shielded task of its own,
    and when the wait for it is cancelled too, it closes the connection by force
    (sqlalchemy/connectors/asyncio.py, ``terminate``). With aiosqlite the two race: the
    force close stops the driver's thread right behind the graceful close, and the graceful
    close then asks the stopped thread to stop again (aiosqlite/core.py, ``close`` calls
    ``stop``), a request nothing ever answers. That task would run until the process ends,
    and a close that does end answers a closed event loop from its thread if the loop goes
    first. The connection is closed either way, so cancelling what is left loses nothing.
    Waits at most ``timeout_s`` plus 0.1 s per round of :data:`CANCEL_ROUNDS`.
    Found by their coroutine's name; none found, no wait.
    """
    closing = [
        task
        for task in asyncio.all_tasks()
        if not task.done()
        and getattr(task.get_coro(), "__qualname__", "").endswith("_terminate_graceful_close")
    ]
    if not closing:
        return
    _, left = await asyncio.wait(closing, timeout=timeout_s)
    # A cancelled close stops waiting for its first answer and waits, in a ``finally``, for
    # the second that never comes either: a second cancel ends it. Bounded all the same.
    for _ in range(CANCEL_ROUNDS):
        if not left:
            return
        for task in left:
            task.cancel()
        _, left = await asyncio.wait(left, timeout=0.1)
    logging.getLogger(__name__).warning(
        "%d database connection closes did not end when cancelled", len(left)
    )


# aiosqlite names no thread; Python names it after its target.
_DRIVER_THREAD = "(_connection_worker_thread)"


async def driver_threads_ended(timeout_s: float = 2.0) -> bool:
    """Wait until the SQLite driver's connection threads have ended, at most ``timeout_s``
    seconds; True when none is left.

    aiosqlite hands the result of a connection's last step (its close, also after a failed
    connect) back to the event loop from its own thread. If the loop is closed first, that
    thread dies with "Exception in thread ..." on stderr: a second line after a command's
    one-line error, or noise after a clean stop.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while any(t.is_alive() and t.name.endswith(_DRIVER_THREAD) for t in threading.enumerate()):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def run_to_end(main: Coroutine[Any, Any, T], event_loop: EventLoopChoice = "auto") -> T:
    """``asyncio.run(main)`` on a loop of ``event_loop`` (:func:`app.aio.run`), with the loop
    kept open until the SQLite driver's threads have ended (:func:`driver_threads_ended`),
    whether ``main`` returned or raised.

    Raises:
        app.aio.EventLoopUnavailable: ``event_loop`` is ``uvloop`` and uvloop is missing.
        ValueError: ``event_loop`` is not a loop's name.
        Exception: what ``main`` raised.

    ``main`` is closed, never started, when the loop cannot be had.
    """

    async def ended() -> T:
        try:
            return await main
        finally:
            if not await driver_threads_ended():
                # A connection never closed: its thread keeps the process from exiting.
                logging.getLogger(__name__).warning(
                    "a database connection is still open at exit; the process may not end "
                    "until it is closed"
                )

    try:
        return aio.run(ended(), event_loop)
    finally:
        # Finished by now, or never started when the loop could not be had (aio.run closes
        # ended() then, which leaves main): closing a finished coroutine does nothing.
        main.close()
