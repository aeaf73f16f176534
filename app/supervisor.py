"""Runs the service's long-lived loops and restarts any that crashes, with backoff.

A loop that raises is logged with its traceback, shown as down (readiness false, and liveness
false once it has crashed ``crash_loop_after`` times in a row), and started again after a
capped, jittered exponential backoff. A loop that has run for ``healthy_after_s`` since its
last start counts as recovered and its crash count resets.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class _Supervised:
    name: str
    factory: Callable[[], Awaitable[None]]
    task: asyncio.Task[None] | None = None
    running: bool = False
    crashes: int = 0
    restarts: int = 0
    last_error: str | None = None
    started_at: float = 0.0


@dataclass(frozen=True, slots=True)
class TaskState:
    """The state of one supervised loop, for health checks and the admin status."""

    name: str
    running: bool
    crashes_in_a_row: int
    restarts: int
    last_error: str | None


class Supervisor:
    """Starts loops, restarts them when they crash, stops them all on shutdown.

    Args:
        backoff_initial_s, backoff_max_s: restart delay: initial * 2**(crashes-1), capped, with
            up to 50% random jitter.
        crash_loop_after: crashes in a row after which liveness fails.
        healthy_after_s: run time after which a loop's crash count resets.
        sleep, now, rng: injectable for tests.
    """

    def __init__(
        self,
        *,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        crash_loop_after: int = 5,
        healthy_after_s: float = 120.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        now: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.crash_loop_after = crash_loop_after
        self.healthy_after_s = healthy_after_s
        self._sleep = sleep
        self._now = now
        self._rng = rng or random.Random()
        self._loops: dict[str, _Supervised] = {}

    def spawn(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        """Run ``factory()`` as loop ``name`` until :meth:`stop`; restart it when it ends.

        A loop that returns is restarted too (loops are meant to run until cancelled).

        Raises:
            ValueError: a loop of that name exists.
        """
        if name in self._loops:
            raise ValueError(f"a loop named {name!r} is already supervised")
        entry = _Supervised(name, factory)
        self._loops[name] = entry
        entry.task = asyncio.create_task(self._keep(entry), name=f"supervised-{name}")

    async def _keep(self, entry: _Supervised) -> None:
        while True:
            entry.running = True
            entry.started_at = self._now()
            try:
                await entry.factory()
                message = "returned"
                log.error("loop %s returned; starting it again", entry.name)
            except asyncio.CancelledError:
                entry.running = False
                raise
            except Exception as err:
                message = f"{type(err).__name__}: {err}"
                log.error("loop %s crashed: %s", entry.name, message, exc_info=True)
            entry.running = False
            if self._now() - entry.started_at >= self.healthy_after_s:
                entry.crashes = 0
            entry.crashes += 1
            entry.restarts += 1
            entry.last_error = message
            delay = min(self.backoff_max_s, self.backoff_initial_s * 2 ** (entry.crashes - 1))
            await self._sleep(delay * (1 + 0.5 * self._rng.random()))

    def states(self) -> list[TaskState]:
        """Every loop's state, by name."""
        return [
            TaskState(e.name, e.running, e.crashes, e.restarts, e.last_error)
            for e in sorted(self._loops.values(), key=lambda e: e.name)
        ]

    def down(self) -> list[TaskState]:
        """Loops that are not running right now (crashed, waiting to restart)."""
        return [s for s in self.states() if not s.running]

    def crash_looping(self) -> list[TaskState]:
        """Loops that crashed ``crash_loop_after`` times or more in a row."""
        return [s for s in self.states() if s.crashes_in_a_row >= self.crash_loop_after]

    async def stop_one(self, name: str) -> None:
        """Cancel loop ``name`` and wait for it; forget it. Unknown names are ignored."""
        entry = self._loops.pop(name, None)
        if entry is None or entry.task is None:
            return
        entry.task.cancel()
        await asyncio.gather(entry.task, return_exceptions=True)

    async def stop(self) -> None:
        """Cancel every loop and wait for all of them."""
        for name in list(self._loops):
            await self.stop_one(name)
