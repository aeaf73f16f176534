"""Helpers shared by the benchmarks: a simulator in its own process, memory and timing."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence


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


@contextlib.asynccontextmanager
async def _server_process(what: str, command: Sequence[str]) -> AsyncIterator[str]:
    """Run ``fabric-dra COMMAND --port N`` in its own process; yield its URL once it answers."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app", *command, "--port", str(port),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
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
        yield url
    finally:
        process.terminate()
        with contextlib.suppress(ProcessLookupError):
            await asyncio.wait_for(process.wait(), 10)


def redfish_simulator_process(args: Sequence[str]) -> contextlib.AbstractAsyncContextManager[str]:
    """Run ``fabric-dra sim redfish ARGS`` in its own process; yield its URL once it answers."""
    return _server_process("Redfish simulator", ["sim", "redfish", *args])


def kube_emulator_process(args: Sequence[str] = ()) -> contextlib.AbstractAsyncContextManager[str]:
    """Run ``fabric-dra sim kube ARGS`` (the Kubernetes API emulator) in its own process; yield
    its URL once it answers."""
    return _server_process("Kubernetes API emulator", ["sim", "kube", *args])
