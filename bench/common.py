"""Helpers shared by the benchmarks: a simulator in its own process, memory and timing."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from sqlalchemy.engine import make_url

from app import aio
from app.db import direct

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """User plus system CPU seconds used by this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class ServerProcess:
    """A server started by :func:`server_process`: its base ``url`` and process ``pid``."""

    url: str
    pid: int

    def cpu_seconds(self) -> float:
        """User plus system CPU seconds the server process has used so far (Linux /proc)."""
        return process_cpu_seconds(self.pid)


@contextlib.asynccontextmanager
async def server_process(what: str, command: Sequence[str]) -> AsyncIterator[ServerProcess]:
    """Run ``fabric-dra COMMAND --port N`` in its own process; yield it once it answers."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        *command,
        "--port",
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                await writer.wait_closed()
                break
            except OSError:
                if process.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {what} did not start") from None
                await asyncio.sleep(0.2)
        yield ServerProcess(url, process.pid)
    finally:
        # A busy server may take a while to act on SIGTERM: then it is killed, never left.
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


@contextlib.asynccontextmanager
async def _server_process(what: str, command: Sequence[str]) -> AsyncIterator[str]:
    async with server_process(what, command) as server:
        yield server.url


def redfish_simulator_process(args: Sequence[str]) -> contextlib.AbstractAsyncContextManager[str]:
    """Run ``fabric-dra sim redfish ARGS`` in its own process; yield its URL once it answers."""
    return _server_process("Redfish simulator", ["sim", "redfish", *args])


def redfish_simulator_server(
    args: Sequence[str],
) -> contextlib.AbstractAsyncContextManager[ServerProcess]:
    """As :func:`redfish_simulator_process`, yielding the :class:`ServerProcess` (URL and pid,
    for the simulator's own CPU)."""
    return server_process("Redfish simulator", ["sim", "redfish", *args])


def cpu_bound_rate(cpu_seconds_per_item: float) -> float:
    """Items per second that this machine's CPUs allow when every process taking part
    (controller, emulator, simulators, stand-ins) uses ``cpu_seconds_per_item`` between them:
    they share the machine's cores, so no run goes faster than cores / CPU per item."""
    return (os.cpu_count() or 1) / cpu_seconds_per_item if cpu_seconds_per_item > 0 else 0.0


DRIVER_GATES = "DRADeviceBindingConditions=true,DRADeviceTaints=true"


def kube_emulator_process(
    args: Sequence[str] = (), *, validate: bool = False
) -> contextlib.AbstractAsyncContextManager[str]:
    """Run ``fabric-dra sim kube ARGS`` (the Kubernetes API emulator) in its own process; yield
    its URL once it answers.

    The emulator stands in for kube-apiserver, which checks writes against their schemas in
    compiled Go on cores of its own; this Python emulator's checks (jsonschema) took about
    half of its CPU in the claim benchmarks, on the same two cores as the controller. So the
    benchmarks run it with ``--no-validation`` unless ``validate`` is set; the tests run it
    with every check on, so what the controller writes is still checked.
    """
    return _server_process("Kubernetes API emulator", _emulator_command(args, validate))


def kube_emulator_server(
    args: Sequence[str] = (), *, validate: bool = False
) -> contextlib.AbstractAsyncContextManager[ServerProcess]:
    """As :func:`kube_emulator_process`, yielding the :class:`ServerProcess` (URL and pid, for
    the emulator's own CPU)."""
    return server_process("Kubernetes API emulator", _emulator_command(args, validate))


def _emulator_command(args: Sequence[str], validate: bool) -> list[str]:
    extra = [] if validate else ["--no-validation"]
    if "--kubernetes-version" not in args and "--feature-gates" not in args:
        # A 1.34 cluster set up for this driver: the alpha gates for binding conditions and
        # device taints on, as the deployment guide asks.
        extra += ["--feature-gates", DRIVER_GATES]
    return ["sim", "kube", *args, *extra]


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used so far (Linux /proc)."""
    fields = _proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- databases --------------------------------------------------------------------------------

PG_ADMIN_URL = os.environ.get(
    "FABRIC_DRA_BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@contextlib.asynccontextmanager
async def bench_database(kind: str, folder: Path) -> AsyncIterator[str]:
    """The URL of an empty database for one benchmark run: ``sqlite`` a file in ``folder``;
    ``postgresql`` a database created for the run on the server of ``PG_ADMIN_URL``
    (``FABRIC_DRA_BENCH_PG_ADMIN_URL``, default the local server on 127.0.0.1:5432) and
    dropped afterwards.

    Raises:
        ValueError: another kind.
        RuntimeError: PostgreSQL cannot be reached (one line, with the server's reason).
    """
    if kind == "sqlite":
        yield f"sqlite+aiosqlite:///{folder / 'bench.db'}"
        return
    if kind != "postgresql":
        raise ValueError(f"unknown database {kind!r}: sqlite or postgresql")
    import asyncpg

    name = f"fabric_dra_bench_{os.getpid()}_{int(time.time())}"

    async def admin(statement: str) -> None:
        try:
            conn = await asyncpg.connect(PG_ADMIN_URL)
        except (OSError, asyncpg.PostgresError) as err:
            raise RuntimeError(f"PostgreSQL at {PG_ADMIN_URL}: {err}") from None
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    await admin(f'CREATE DATABASE "{name}"')
    try:
        base = PG_ADMIN_URL.rpartition("/")[0].replace("postgresql://", "postgresql+asyncpg://", 1)
        yield f"{base}/{name}"
    finally:
        await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def database_server_cpu_seconds(url: str) -> float:
    """CPU seconds the PostgreSQL server of ``url`` has used so far: its postmaster, every
    live process it started (backends, WAL writer, checkpointer, ...) and the ones that
    exited (the postmaster's children times), read from /proc, so the server must run on
    this machine. A difference of two readings is the server's CPU in between, whichever
    database it served (the benchmark's own readings add a backend each, a few
    milliseconds). 0.0 for SQLite, which runs inside the controller's own process (its CPU
    is the controller's).

    Raises:
        RuntimeError: PostgreSQL cannot be reached (one line, with the server's reason).
    """
    if make_url(url).get_backend_name() != "postgresql":
        return 0.0
    import asyncpg

    try:
        conn = await asyncpg.connect(PG_ADMIN_URL)
    except (OSError, asyncpg.PostgresError) as err:
        raise RuntimeError(f"PostgreSQL at {PG_ADMIN_URL}: {err}") from None
    try:
        backend = int(await conn.fetchval("SELECT pg_backend_pid()"))
        postmaster = int(_proc_stat(backend)[1])
    finally:
        await conn.close()
    return _process_tree_cpu_seconds(postmaster)


class StatementCount:
    """Statements and transactions every SQLAlchemy engine of this process sends to its
    database, counted from :meth:`start` (a listener on the ``Engine`` class, so the SQLite
    threads' own engines and the event loop's connection count too), and the statements sent
    straight through asyncpg (:func:`app.db.direct.listen`; each one is its own transaction,
    and counts as one). Rolled-back transactions
    count as transactions; SQLite's PRAGMAs on a new connection count as statements."""

    def __init__(self) -> None:
        self.statements = 0
        self.transactions = 0
        self._on = False

    def _statement(self, *_: Any) -> None:
        self.statements += 1

    def _begin(self, *_: Any) -> None:
        self.transactions += 1

    def _direct(self, _sql: str) -> None:
        self.statements += 1
        self.transactions += 1

    def start(self) -> None:
        """Reset the counts to zero and count from now on."""
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        self.statements = self.transactions = 0
        if not self._on:
            event.listen(Engine, "before_cursor_execute", self._statement)
            event.listen(Engine, "begin", self._begin)
            direct.listen(self._direct)
            self._on = True

    def stop(self) -> None:
        """Stop counting; the counts stay."""
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        if self._on:
            event.remove(Engine, "before_cursor_execute", self._statement)
            event.remove(Engine, "begin", self._begin)
            direct.unlisten(self._direct)
            self._on = False


def _process_tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of process ``pid``, of its live children and of its children that
    exited (its cutime and cstime)."""
    fields = _proc_stat(pid)
    total = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    children = " ".join(
        Path(task, "children").read_text() for task in Path(f"/proc/{pid}/task").iterdir()
    ).split()
    for child in children:
        with contextlib.suppress(OSError):  # exited since
            total += process_cpu_seconds(int(child))
    return total


def _proc_stat(pid: int) -> list[str]:
    """The fields of /proc/``pid``/stat after the command name (state, ppid, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


# --- the reference workload -------------------------------------------------------------------
#
# CPU seconds depend on the machine, so the suite also states every CPU figure as a ratio to a
# fixed workload run in the same process just before the benchmark: "reference units". One
# reference unit is the CPU time this process takes for :func:`reference_workload`, which
# builds 20,000 device-like records (dicts of strings and numbers), encodes them as JSON,
# decodes them again, sorts them by serial and hashes the result with SHA-256 -- the mix of
# pure-Python object work and C helpers that the controller itself spends its time on. The
# reference is run REFERENCE_ROUNDS times and the fastest round counts, which keeps a busy
# neighbour from inflating it.

REFERENCE_RECORDS = 20_000
REFERENCE_ROUNDS = 3


def reference_workload(records: int = REFERENCE_RECORDS) -> str:
    """The fixed CPU workload behind "reference units"; returns a digest so it cannot be
    optimised away."""
    items = [
        {
            "name": f"gpu-{i:06d}",
            "serial": f"SN{(i * 7919) % records:08d}",
            "index": i,
            "region": f"region-{i % 4}",
            "rack": f"rack-{i // 64:04d}",
            "memory_mib": 81920,
            "healthy": i % 50 != 7,
            "attributes": {"model": "X100", "firmware": f"1.{i % 9}.3"},
        }
        for i in range(records)
    ]
    decoded = json.loads(json.dumps(items))
    decoded.sort(key=lambda item: item["serial"])
    return hashlib.sha256(json.dumps(decoded, sort_keys=True).encode()).hexdigest()


def reference_cpu_seconds(rounds: int = REFERENCE_ROUNDS) -> float:
    """CPU seconds of this process for one :func:`reference_workload` (fastest of ``rounds``)."""
    best = math.inf
    for _ in range(rounds):
        started = time.process_time()
        reference_workload()
        best = min(best, time.process_time() - started)
    return best


def reference_units(cpu: float, reference: float) -> float:
    """``cpu`` seconds in reference units (see :func:`reference_cpu_seconds`)."""
    return cpu / reference if reference > 0 else math.nan


def write_figures(path: Path | None, figures: list[dict[str, Any]]) -> None:
    """Print each figure line as JSON and, when ``path`` is given, write them all there."""
    for line in figures:
        print(json.dumps(line), flush=True)
    if path is not None:
        path.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


# --- profiling ------------------------------------------------------------------------------


class WindowProfile:
    """cProfile over the measured window only (``--profile FILE``): :meth:`start` and
    :meth:`stop` bracket the window; :meth:`stop` writes the statistics to ``path`` (``pstats``
    format, for ``python -m pstats FILE`` or snakeviz) and prints the 25 costliest functions by
    own time to stderr. With ``path`` None both are no-ops. Only this process's event-loop
    thread is profiled: a worker thread's own work (aiosqlite's) shows as the waits for it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._profile: Any = None

    def start(self) -> None:
        if self.path is not None:
            import cProfile

            self._profile = cProfile.Profile()
            self._profile.enable()

    def stop(self) -> None:
        if self._profile is None:
            return
        import pstats

        self._profile.disable()
        self._profile.dump_stats(str(self.path))
        pstats.Stats(self._profile, stream=sys.stderr).sort_stats("tottime").print_stats(25)
        self._profile = None


# --- command lines ----------------------------------------------------------------------------


def command_line(doc: str | None, prog: str) -> argparse.ArgumentParser:
    """An argument parser for ``python -m PROG`` described by ``doc``'s first paragraph;
    SIGTERM is handled like Ctrl-C from then on (see :func:`stop_on_sigterm`), and
    :func:`run_benchmark` names ``PROG`` when a run is stopped."""
    global _prog
    _prog = f"python -m {prog.removeprefix('python -m ')}"
    stop_on_sigterm()
    summary = " ".join((doc or "").split("\n\n")[0].split())
    return argparse.ArgumentParser(
        prog=_prog,
        description=summary,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )


_prog = "python -m bench"


def stop_on_sigterm() -> None:
    """Handle SIGTERM like Ctrl-C: raise KeyboardInterrupt. This covers the time outside the
    event loop (start-up, argument parsing); while :func:`run_benchmark` runs the loop, SIGTERM
    cancels the benchmark's main task instead. (Sending ourselves SIGINT would not do: a job
    started in the background has SIGINT ignored.)"""

    def interrupt(_signum: int, _frame: object) -> None:
        global _sigterm
        _sigterm = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


# SIGTERM arrived (in or outside the event loop): :func:`run_benchmark` names it.
_sigterm = False


def run_benchmark(main: Coroutine[Any, Any, T], event_loop: aio.EventLoopChoice = "auto") -> T:
    """Run a benchmark's ``main`` on a loop of ``event_loop`` (:func:`app.aio.run`).

    Ctrl-C (asyncio's own handling) or SIGTERM (a handler on the loop) cancels ``main``, so its
    ``finally`` blocks and context managers stop the simulator, emulator and stand-in
    processes it started, and no task is interrupted half way. The process then ends with
    one line on stderr (``python -m bench.X: stopped by SIGTERM``) and status 128 + the
    signal's number (130 for Ctrl-C, 143 for SIGTERM), not a traceback.

    Raises:
        SystemExit: the run was stopped.
        Exception: what ``main`` raised.
    """

    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def stop() -> None:
            global _sigterm
            _sigterm = True
            task.cancel()

        loop.add_signal_handler(signal.SIGTERM, stop)
        try:
            return await main
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            stop_on_sigterm()

    try:
        result = aio.run(guarded(), event_loop)
    except (KeyboardInterrupt, asyncio.CancelledError):
        _stopped(_sigterm)
    if _sigterm:  # the benchmark ended on its own meanwhile: its figures are not whole
        _stopped(True)
    return result


def _stopped(by_sigterm: bool) -> NoReturn:
    how, signum = ("SIGTERM", signal.SIGTERM) if by_sigterm else ("Ctrl-C", signal.SIGINT)
    print(f"{_prog}: stopped by {how}", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def add_database_option(parser: argparse.ArgumentParser) -> None:
    """``--database sqlite|postgresql`` (default sqlite): the database :func:`bench_database`
    makes for the run."""
    parser.add_argument(
        "--database",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="a temporary SQLite file, or a database created for the run on the local "
        "PostgreSQL server (FABRIC_DRA_BENCH_PG_ADMIN_URL)",
    )


def add_event_loop_option(parser: argparse.ArgumentParser) -> None:
    """``--event-loop auto|uvloop|asyncio`` (default auto, as the ``event_loop`` setting): the
    loop the controller runs on in the benchmark's process, to compare one with the other. The
    simulators and stand-ins it starts run on their default (uvloop when installed)."""
    parser.add_argument(
        "--event-loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="the controller's event loop (the event_loop setting)",
    )


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse type: a number greater than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number greater than 0, got {text}")
    return value
