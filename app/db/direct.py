"""PostgreSQL: the claim path's hottest statements sent straight to asyncpg.

A statement through SQLAlchemy's execution layer (a greenlet, the pool's check-out and
check-in, the execution context, the result's wrapping, as :meth:`Database.run_read` sends
one in autocommit) cost about 230 µs of CPU on the controller's event loop, where asyncpg
alone on a connection held open spent about 70 µs on the same prepared statement (bench
notes of the journal's statements, on uvloop). An allocation sends four such statements. So
the journal's one-statement moves, its reserve of a free device and its reads by claim go
through :class:`DirectStatements`:

* The statement is still built with SQLAlchemy Core and compiled once by the engine's own
  dialect (:class:`DirectQuery`): the same SQL text, with ``$n`` parameters and their casts,
  the same bind and result processing of each column's type (``UtcDateTime`` included).
* Its connections come from a SQLAlchemy engine of the same URL, so the URL's options, the
  connect arguments and the dialect's set-up of each new connection (asyncpg's JSON codecs)
  are SQLAlchemy's own; each is then detached from the engine's pool and kept here, idle
  connections last in, first out. Up to ``size`` are open at once; more callers wait.
* Each statement runs on its own (autocommit: asyncpg starts no transaction), as the
  journal's single statements did before on SQLAlchemy's autocommit engine.

What SQLAlchemy's pool did and this keeps:

* **Errors.** asyncpg's exceptions are raised as SQLAlchemy's (:func:`translate`), so that
  callers keep catching ``IntegrityError`` (the partial unique index refusing a second
  reserve of a device) and ``SQLAlchemyError``. The driver's error is ``orig``.
* **Lost connections.** A connection that failed for any reason but an error the server
  answered with (a constraint, a bad value) is closed and dropped, never reused; the error
  says ``connection_invalidated``. A connection idle for ``PING_AFTER_IDLE_S`` is pinged
  before use, and replaced if the ping fails (the server restarted meanwhile). One the
  server ended a moment ago, whose protocol asyncpg finds still reading the server's last
  message, refuses the statement before sending it: the statement goes on another
  connection (:func:`_refused_before_sending`).
* **Cancellation.** When the task awaiting a statement is cancelled, asyncpg sends the
  server a CancelRequest for it (on a connection of its own: the server stops the statement
  rather than running it to its end), and its next statement on the connection waits until
  the server has answered the cancelled one. The connection goes back to the idle ones
  marked for a ping, so that it is checked, and replaced if need be, before its next use.
  Only another kind of interruption (``KeyboardInterrupt``, a generator closed) closes it.
* **Watchers.** Each statement's SQL is passed to the functions given to :func:`listen`
  before it is sent, as SQLAlchemy's ``before_cursor_execute`` event does for the others
  (statement counts in tests and benchmarks).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import exc
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement, Executable

_LISTENERS: list[Callable[[str], None]] = []
# How long a graceful close of a connection may take at dispose (seconds).
CLOSE_TIMEOUT_S = 2.0
# The most compiled statements kept per DirectStatements (the journal has a few dozen).
MAX_QUERIES = 256


def listen(listener: Callable[[str], None]) -> None:
    """Call ``listener(sql)`` before each statement any :class:`DirectStatements` sends."""
    _LISTENERS.append(listener)


def unlisten(listener: Callable[[str], None]) -> None:
    """Stop calling ``listener``; a listener not given is ignored."""
    if listener in _LISTENERS:
        _LISTENERS.remove(listener)


Processor = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class DirectQuery:
    """A Core statement compiled for one PostgreSQL dialect, ready for asyncpg.

    Attributes:
        sql: the statement's text, parameters as ``$1``, ``$2``... (asyncpg's style).
        names: the bound parameters' names, in the order of their numbers.
        defaults: a value for each name the statement itself gives (``column == value``);
            names without one must be given at each call.
        binds: ``(position, processor)`` of each parameter whose type converts its value
            (SQLAlchemy's ``bind_processor`` for the dialect).
        results: ``(position, processor)`` of each result column whose type converts it
            (``result_processor``), for columns in the statement's order.
    """

    sql: str
    names: tuple[str, ...]
    defaults: Mapping[str, Any]
    binds: tuple[tuple[int, Processor], ...]
    results: tuple[tuple[int, Processor], ...]

    @classmethod
    def compile(cls, statement: Executable, dialect: Dialect) -> DirectQuery:
        """Compile ``statement`` with ``dialect`` (the asyncpg dialect of an engine).

        Raises:
            ValueError: the statement needs rendering at each call (an IN of a bound list,
                an "expanding" parameter), or its dialect does not number its parameters.
        """
        if not isinstance(statement, ClauseElement):
            raise ValueError(f"not a Core statement: {type(statement).__name__}")
        compiled = statement.compile(dialect=dialect)
        if (
            dialect.paramstyle != "numeric_dollar"
            or not isinstance(compiled, SQLCompiler)
            or compiled.positiontup is None
        ):
            raise ValueError(f"dialect {dialect.name} does not number its parameters as $n")
        if "POSTCOMPILE" in compiled.string:
            raise ValueError("an expanding parameter (IN of a bound list) cannot be sent as is")
        names = tuple(compiled.positiontup)
        binds = []
        defaults = {}
        for position, name in enumerate(names):
            bind = compiled.binds[name]
            if not bind.required:
                defaults[name] = bind.effective_value
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                binds.append((position, processor))
        results = []
        for position, column in enumerate(getattr(statement, "exported_columns", ())):
            processor = column.type.dialect_impl(dialect).result_processor(dialect, None)
            if processor is not None:
                results.append((position, processor))
        return cls(compiled.string, names, defaults, tuple(binds), tuple(results))

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        """The positional arguments for ``params`` (values by parameter name), each through
        its type's bind processor.

        Raises:
            ValueError: a parameter has no value (neither in ``params`` nor the statement's).
            whatever a bind processor raises (``UtcDateTime`` refuses a naive datetime).
        """
        try:
            values = [
                params[name] if name in params else self.defaults[name] for name in self.names
            ]
        except KeyError as err:
            raise ValueError(f"no value for bound parameter {err.args[0]!r}") from None
        for position, processor in self.binds:
            values[position] = processor(values[position])
        return values

    def row(self, record: Sequence[Any]) -> tuple[Any, ...]:
        """One result row as a tuple, each column through its type's result processor."""
        if not self.results:
            return tuple(record)
        values = list(record)
        for position, processor in self.results:
            values[position] = processor(values[position])
        return tuple(values)


# Errors that leave the connection usable: the server refused the statement (in autocommit
# its implicit transaction ended with it), or asyncpg refused a value before sending it.
_STATEMENT_ERRORS: tuple[tuple[type[BaseException], type[exc.DBAPIError]], ...] = (
    (asyncpg.IntegrityConstraintViolationError, exc.IntegrityError),  # SQLSTATE class 23
    (asyncpg.DataError, exc.DataError),  # class 22
    (asyncpg.SyntaxOrAccessError, exc.ProgrammingError),  # class 42
)
# Errors that end the connection: the server shutting down or ending the session (class
# 57P but a cancelled statement), the connection lost (class 08), asyncpg's own state.
_CONNECTION_ERRORS = (
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
)


def translate(
    err: BaseException, sql: str, arguments: Sequence[Any]
) -> tuple[exc.DBAPIError, bool]:
    """``err`` from asyncpg as SQLAlchemy's error, and whether the connection is still usable.

    The classes follow SQLAlchemy's own asyncpg adapter
    (sqlalchemy/dialects/postgresql/asyncpg.py, ``AsyncAdapt_asyncpg_dbapi``) and the
    server's SQLSTATE classes (PostgreSQL manual, Appendix A "PostgreSQL Error Codes"): a
    constraint the server refused is ``IntegrityError``, a value ``DataError``, bad SQL or a
    missing privilege ``ProgrammingError``, and any other error the server answered a
    statement with ``DatabaseError`` (a statement timeout, say). A lost or ending connection
    (a shutdown, class 08, asyncpg's interface errors, ``OSError``, a timeout) is
    ``OperationalError`` with ``connection_invalidated``.
    """
    for source, target in _STATEMENT_ERRORS:
        if isinstance(err, source):
            return target(sql, arguments, err), True
    if isinstance(err, asyncpg.InterfaceError) and isinstance(err, ValueError):
        # asyncpg's own DataError: it could not encode a value, and sent nothing.
        return exc.DataError(sql, arguments, err), True
    if isinstance(err, asyncpg.PostgresError) and not isinstance(err, _CONNECTION_ERRORS):
        return exc.DatabaseError(sql, arguments, err), True
    return exc.OperationalError(sql, arguments, err, connection_invalidated=True), False


class DirectStatements:
    """Up to ``size`` asyncpg connections of ``engine``'s URL, each held open for statements
    sent straight through asyncpg (see the module's notes). Close them with :meth:`dispose`.

    Args:
        engine: a SQLAlchemy engine of the asyncpg dialect; its connections are taken from
            it and detached from its pool (a ``NullPool`` engine keeps nothing of its own).
        size: the most connections open at once (> 0).
        ping_after_idle_s: a connection idle this long is pinged before use.

    Raises:
        ValueError: ``size`` is not positive, or the engine is not on asyncpg.
    """

    def __init__(self, engine: AsyncEngine, size: int, ping_after_idle_s: float) -> None:
        if size < 1:
            raise ValueError(f"size must be positive, not {size}")
        if engine.dialect.driver != "asyncpg":
            raise ValueError(f"direct statements need asyncpg, not {engine.dialect.driver}")
        self.engine = engine
        self.size = size
        self.ping_after_idle_s = ping_after_idle_s
        self._slots = asyncio.Semaphore(size)
        # (connection, idle since on the monotonic clock), most recently used last.
        self._idle: list[tuple[asyncpg.Connection, float]] = []
        self._busy: set[asyncpg.Connection] = set()
        self._queries: dict[int, tuple[Executable, DirectQuery]] = {}
        self._closed = False
        self.opened = 0  # connections opened so far (for tests and figures)

    @property
    def idle_connections(self) -> tuple[asyncpg.Connection, ...]:
        """The connections open and waiting for a statement, most recently used last."""
        return tuple(conn for conn, _since in self._idle)

    def query(self, statement: Executable) -> DirectQuery:
        """``statement`` compiled for this engine's dialect, once per statement object (up
        to ``MAX_QUERIES`` kept: build statements once, not per call)."""
        kept = self._queries.get(id(statement))
        if kept is not None and kept[0] is statement:
            return kept[1]
        compiled = DirectQuery.compile(statement, self.engine.dialect)
        if len(self._queries) >= MAX_QUERIES:
            # Statements built per call would only fill this: start again.
            self._queries.clear()
        self._queries[id(statement)] = (statement, compiled)
        return compiled

    async def fetch(
        self, statement: Executable, params: Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        """Run ``statement`` with ``params`` on its own (autocommit); return every row.

        Raises:
            sqlalchemy.exc.StatementError: a parameter without a value, or a value its type
                refuses; ``orig`` is the ValueError (nothing was sent).
            sqlalchemy.exc.DBAPIError: the database failed (see :func:`translate`);
                ``IntegrityError`` for a constraint, ``OperationalError`` when the
                connection was lost (and dropped).
            RuntimeError: after :meth:`dispose`.
            asyncio.CancelledError: the task was cancelled; the server is told to stop the
                statement, which may have written nonetheless (it may have ended first).
        """
        query = self.query(statement)
        try:
            arguments = query.arguments(params)
        except Exception as err:  # as SQLAlchemy wraps what its bind processing raises
            raise exc.StatementError(str(err), query.sql, params, err) from err
        for listener in _LISTENERS:
            listener(query.sql)
        await self._slots.acquire()
        try:
            while True:
                conn, reused = await self._connection()
                try:
                    records = await conn.fetch(query.sql, *arguments)
                    break
                except asyncpg.InternalClientError as err:
                    self._put_back(conn, False)
                    if reused and _refused_before_sending(err):
                        continue
                    error, _ = translate(err, query.sql, arguments)
                    raise error from err
                except Exception as err:
                    error, usable = translate(err, query.sql, arguments)
                    self._put_back(conn, usable)
                    raise error from err
                except asyncio.CancelledError:
                    self._put_back(conn, True, ping=True)
                    raise
                except BaseException:
                    self._put_back(conn, False)
                    raise
            self._put_back(conn, True)
        finally:
            self._slots.release()
        return [query.row(record) for record in records]

    async def _connection(self) -> tuple[asyncpg.Connection, bool]:
        """An idle connection (True: it was used before), else a new one (False)."""
        if self._closed:
            raise RuntimeError("direct statements disposed")
        now = time.monotonic()
        while self._idle:
            conn, since = self._idle.pop()
            if conn.is_closed():
                continue
            if now - since >= self.ping_after_idle_s:
                try:
                    await _ping(conn)
                except Exception:  # lost while idle (a restart, an idle timeout): replace it
                    conn.terminate()
                    continue
                except BaseException:  # cancelled mid-ping: its state is unknown
                    conn.terminate()
                    raise
            self._busy.add(conn)
            return conn, True
        conn = await self._open()
        self._busy.add(conn)
        return conn, False

    async def _open(self) -> asyncpg.Connection:
        try:
            fairy = await self.engine.raw_connection()
        except exc.DBAPIError:
            raise
        except Exception as err:  # asyncpg's or the OS's error for a failed connect
            raise exc.OperationalError(None, None, err, connection_invalidated=True) from err
        conn = fairy.driver_connection
        # Ours from now on: the engine's pool forgets it (a NullPool kept nothing anyway).
        fairy.detach()
        self.opened += 1
        return conn

    def _put_back(self, conn: asyncpg.Connection, usable: bool, *, ping: bool = False) -> None:
        # ``ping``: idle "since forever", so that its next use pings it first.
        self._busy.discard(conn)
        if usable and not self._closed and not conn.is_closed():
            self._idle.append((conn, -math.inf if ping else time.monotonic()))
        else:
            conn.terminate()

    async def dispose(self) -> None:
        """Close every idle connection (gracefully and all at once, within
        ``CLOSE_TIMEOUT_S``) and every connection in use (at once: a statement on it fails
        as lost), then dispose of the engine. Later :meth:`fetch` calls raise RuntimeError.
        Cancelled meanwhile, the connections not yet closed are ended at once (asyncpg
        aborts a close that is cancelled)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in self._busy:
            conn.terminate()
        self._busy.clear()
        await asyncio.gather(*(_close(conn) for conn, _since in idle))
        await self.engine.dispose()


def _refused_before_sending(err: asyncpg.InternalClientError) -> bool:
    """True for asyncpg's refusal to start a statement on a connection whose protocol is not
    idle: the server ended it while it sat idle (its FATAL message read, the end of the
    stream not yet), so the next statement found it busy reading an error. asyncpg checks
    the state before it writes anything (``CoreProtocol._set_state``, asyncpg 0.29-0.32:
    "cannot switch to state N; another operation (M) is in progress"), so the statement can
    go on another connection. Any other internal error may come after sending: not this."""
    return str(err).startswith("cannot switch to state")


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await conn.close(timeout=CLOSE_TIMEOUT_S)
    except Exception:  # lost already, or too slow: end it at once
        conn.terminate()


async def _ping(conn: asyncpg.Connection) -> None:
    """One round trip on ``conn``: ``SELECT 1``."""
    await conn.fetchval("SELECT 1")
