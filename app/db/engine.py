"""Engine and session factory for SQLite (aiosqlite) and PostgreSQL (asyncpg).

SQLite is set up for a service: WAL journal, a busy timeout, foreign keys on, and transactions
that BEGIN explicitly. pysqlite would otherwise start a transaction only at the first write, so a
read-then-write would not be isolated; :meth:`Database.write` begins with ``BEGIN IMMEDIATE`` to
take the write lock up front (PITFALLS.md, "SQLAlchemy 2.1 async + Alembic").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.config import redact_url

SQLITE_BUSY_TIMEOUT_MS = 15_000
_BEGIN_MODE = "fabric_dra_sqlite_begin"


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
    first = lines[0] if lines else type(err).__name__
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


def _setup_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below emit BEGIN instead of pysqlite's lazy one.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(_BEGIN_MODE, "DEFERRED")
        if mode != "NONE":
            connection.exec_driver_sql(f"BEGIN {mode}")


def make_engine(url: str, *, pool_size: int = 5, echo: bool = False) -> AsyncEngine:
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
        _setup_sqlite(engine)
        return engine
    if backend == "postgresql":
        return create_async_engine(
            url, echo=echo, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
        )
    raise ValueError(f"unsupported database {backend!r}: use SQLite or PostgreSQL")


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
    # The same engine (and pool) with the SQLite BEGIN mode preset, built once.
    _immediate: AsyncEngine | None = field(default=None, repr=False)
    _autocommit: AsyncEngine | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.engine.dialect.name == "sqlite":
            self._immediate = self.engine.execution_options(**{_BEGIN_MODE: "IMMEDIATE"})
            self._autocommit = self.engine.execution_options(**{_BEGIN_MODE: "NONE"})

    @classmethod
    def connect(cls, url: str, *, pool_size: int = 5, echo: bool = False) -> Database:
        """Build a Database for ``url`` (no connection is opened until first use)."""
        engine = make_engine(url, pool_size=pool_size, echo=echo)
        return cls(engine=engine, sessions=async_sessionmaker(engine, expire_on_commit=False))

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

    @asynccontextmanager
    async def read_statement(self) -> AsyncIterator[AsyncConnection]:
        """A Core connection for one read-only statement (cheaper than a session).

        On SQLite no transaction is begun: one statement is consistent by itself, and not
        opening a transaction saves three round trips to the driver's thread. Use
        :meth:`read` when several statements must see one snapshot.
        """
        async with (self._autocommit or self.engine).connect() as conn:
            yield conn

    @asynccontextmanager
    async def write_connection(self) -> AsyncIterator[AsyncConnection]:
        """A Core connection in one transaction, committed at the end or rolled back on error;
        the Core counterpart of :meth:`write` (same lock and ``BEGIN IMMEDIATE`` on SQLite)."""
        if self._immediate is None:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with self._write_lock, self._immediate.begin() as conn:
            yield conn

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
        """Close every pooled connection."""
        await self.engine.dispose()
