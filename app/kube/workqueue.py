"""A rate-limited work queue with per-key de-duplication, modelled on client-go's workqueue.

Semantics follow ``k8s.io/client-go/util/workqueue`` (``Typed``, ``delayingType``,
``rateLimitingType`` and the default controller rate limiter):

* a key is queued at most once: adding a key that is already waiting is a no-op;
* a key handed out by :meth:`WorkQueue.get` is "processing" until :meth:`WorkQueue.done`;
  adding it meanwhile marks it dirty, and ``done`` queues it again, so no key is ever held by two
  workers at once and every add is followed by at least one processing that starts after it;
* :meth:`WorkQueue.add_after` queues a key after a delay (the earliest pending time wins);
* :meth:`WorkQueue.add_rate_limited` delays by the larger of a per-key exponential backoff
  (``base * 2**failures``, capped) and an overall token bucket (``qps``, ``burst``), like
  ``DefaultControllerRateLimiter``; :meth:`WorkQueue.forget` resets the key's backoff.

Time comes from an injected :class:`QueueClock` (monotonic seconds plus an async sleep), so tests
drive delays with a fake clock instead of waiting.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class ShutDown(Exception):
    """The queue was shut down: :meth:`WorkQueue.get` has nothing more to hand out."""


class Empty(Exception):
    """:meth:`WorkQueue.get_nowait` found no key ready."""


@dataclass(frozen=True)
class QueueClock:
    """Where the queue takes time from.

    Attributes:
        now: returns monotonic seconds (``time.monotonic`` by default).
        sleep: waits the given seconds (``asyncio.sleep`` by default); the queue cancels it when
            something else wakes the waiter first.
    """

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


@dataclass(frozen=True)
class WorkQueueSettings:
    """Rate-limit settings of a :class:`WorkQueue`.

    Defaults are client-go's ``DefaultControllerRateLimiter``: 5 ms doubling per failure up to
    1000 s per key, and an overall bucket of 10 adds per second with a burst of 100.

    Attributes:
        name: used in log lines and metric labels.
        base_delay_s: first per-key backoff, seconds (> 0).
        max_delay_s: cap of the per-key backoff, seconds (>= base_delay_s).
        qps: overall token-bucket refill rate for rate-limited adds, per second (> 0).
        burst: token-bucket capacity (>= 1).
    """

    name: str = "default"
    base_delay_s: float = 0.005
    max_delay_s: float = 1000.0
    qps: float = 10.0
    burst: int = 100

    def __post_init__(self) -> None:
        if self.base_delay_s <= 0:
            raise ValueError(f"work queue {self.name!r}: base_delay_s must be > 0")
        if self.max_delay_s < self.base_delay_s:
            raise ValueError(f"work queue {self.name!r}: max_delay_s must be >= base_delay_s")
        if self.qps <= 0:
            raise ValueError(f"work queue {self.name!r}: qps must be > 0")
        if self.burst < 1:
            raise ValueError(f"work queue {self.name!r}: burst must be >= 1")


@dataclass
class _TokenBucket:
    """client-go's ``BucketRateLimiter`` (golang.org/x/time/rate ``Reserve``): tokens may go
    negative, and a reservation then waits until its token has been refilled."""

    qps: float
    burst: int
    tokens: float
    last: float

    def reserve(self, now: float) -> float:
        """Take one token; return the seconds until it is available (0 when one is at hand)."""
        elapsed = max(0.0, now - self.last)
        self.tokens = min(float(self.burst), self.tokens + elapsed * self.qps)
        self.last = now
        self.tokens -= 1.0
        if self.tokens >= 0:
            return 0.0
        return -self.tokens / self.qps


@dataclass
class _Delayed(Generic[K]):
    ready_at: dict[K, float] = field(default_factory=dict)
    heap: list[tuple[float, int, K]] = field(default_factory=list)


class WorkQueue(Generic[K]):
    """An asyncio work queue of hashable keys; see the module docstring for the semantics.

    Not thread-safe: use it from one event loop. ``len(queue)`` is the number of keys ready to
    be handed out (client-go's ``Len``), the figure to export as queue depth.
    """

    def __init__(
        self, settings: WorkQueueSettings | None = None, *, clock: QueueClock | None = None
    ) -> None:
        self.settings = settings or WorkQueueSettings()
        self._clock = clock or QueueClock()
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._delayed: _Delayed[K] = _Delayed()
        self._seq = itertools.count()
        self._failures: dict[K, int] = {}
        self._bucket = _TokenBucket(
            self.settings.qps, self.settings.burst, float(self.settings.burst), self._clock.now()
        )
        self._shutting_down = False
        self._draining = False
        # Replaced on every notification: a waiter holds the event current when it started
        # waiting, so a wake-up between its check and its wait is never lost.
        self._changed = asyncio.Event()

    # ----------------------------------------------------------------- inspection
    def __len__(self) -> int:
        return len(self._queue)

    @property
    def delayed_count(self) -> int:
        """Number of keys waiting for their delay to pass (add_after / add_rate_limited)."""
        return len(self._delayed.ready_at)

    @property
    def processing_count(self) -> int:
        """Number of keys handed out and not yet marked done."""
        return len(self._processing)

    def is_processing(self, key: K) -> bool:
        """True while ``key`` is held by a worker (between ``get`` and ``done``)."""
        return key in self._processing

    def num_requeues(self, key: K) -> int:
        """How many rate-limited adds ``key`` had since it was last forgotten."""
        return self._failures.get(key, 0)

    # ----------------------------------------------------------------- adding
    def add(self, key: K) -> None:
        """Queue ``key`` now. A no-op if it is already queued or the queue is shut down; if it is
        being processed it is queued again when the worker calls :meth:`done`."""
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return
        self._queue.append(key)
        self._notify()

    def add_after(self, key: K, delay_s: float) -> None:
        """Queue ``key`` once ``delay_s`` seconds have passed (at once when ``delay_s <= 0``).

        When the key already waits for a later time, the earlier time wins (client-go's
        ``AddAfter``). Ignored after shutdown.
        """
        if self._shutting_down:
            return
        if delay_s <= 0:
            self.add(key)
            return
        ready_at = self._clock.now() + delay_s
        current = self._delayed.ready_at.get(key)
        if current is not None and current <= ready_at:
            return
        self._delayed.ready_at[key] = ready_at
        heapq.heappush(self._delayed.heap, (ready_at, next(self._seq), key))
        self._notify()

    def when(self, key: K) -> float:
        """Record a failure of ``key`` and return the delay, seconds, before its next try.

        The delay is ``max(base * 2**(failures-1) capped at max_delay, token-bucket wait)``.
        """
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        # Cap the exponent before computing so huge failure counts cannot overflow a float.
        exponent = min(failures, 64)
        per_key = min(self.settings.base_delay_s * (2.0**exponent), self.settings.max_delay_s)
        overall = self._bucket.reserve(self._clock.now())
        return max(per_key, overall)

    def add_rate_limited(self, key: K) -> None:
        """Queue ``key`` after its rate-limited delay (see :meth:`when`)."""
        if self._shutting_down:
            return
        self.add_after(key, self.when(key))

    def forget(self, key: K) -> None:
        """Reset ``key``'s failure count (call after it was processed successfully)."""
        self._failures.pop(key, None)

    # ----------------------------------------------------------------- taking
    def get_nowait(self) -> K:
        """Hand out the next ready key without waiting.

        Raises:
            ShutDown: the queue is shut down (and, when draining, nothing is left to hand out).
            Empty: no key is ready now.
        """
        if self._shutting_down and not self._draining:
            raise ShutDown(self.settings.name)
        self._promote_due()
        if not self._queue:
            if self._shutting_down:
                raise ShutDown(self.settings.name)
            raise Empty(self.settings.name)
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        return key

    async def get(self) -> K:
        """Wait for the next ready key and mark it processing; call :meth:`done` after.

        Raises:
            ShutDown: when the queue is shut down (waiting callers are woken to receive it).
        """
        while True:
            changed = self._changed
            try:
                return self.get_nowait()
            except Empty:
                pass
            await self._wait(changed, self._next_ready_in())

    def done(self, key: K) -> None:
        """Mark ``key`` finished; if it was added while processing, queue it again."""
        self._processing.discard(key)
        if key in self._dirty and not (self._shutting_down and not self._draining):
            self._queue.append(key)
        self._notify()

    # ----------------------------------------------------------------- stopping
    def shutdown(self) -> None:
        """Stop at once: every current and future :meth:`get` raises :class:`ShutDown`; adds are
        ignored; queued and delayed keys are dropped."""
        self._shutting_down = True
        self._draining = False
        self._queue.clear()
        self._dirty.clear()
        self._delayed = _Delayed()
        self._notify()

    async def shutdown_with_drain(self) -> None:
        """Stop accepting adds, let workers take the keys already queued, and return once no key
        is queued or processing. Delayed keys are dropped (client-go ``ShutDownWithDrain``)."""
        self._shutting_down = True
        self._draining = True
        self._delayed = _Delayed()
        self._notify()
        while self._queue or self._processing:
            changed = self._changed
            await self._wait(changed, None)
        self._draining = False
        self._notify()

    # ----------------------------------------------------------------- internals
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _promote_due(self) -> None:
        """Move delayed keys whose time has come into the queue."""
        now = self._clock.now()
        heap = self._delayed.heap
        while heap and heap[0][0] <= now:
            ready_at, _, key = heapq.heappop(heap)
            # Stale heap entries (superseded by an earlier add_after) are skipped.
            if self._delayed.ready_at.get(key) != ready_at:
                continue
            del self._delayed.ready_at[key]
            self.add(key)

    def _next_ready_in(self) -> float | None:
        heap = self._delayed.heap
        while heap and self._delayed.ready_at.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
        if not heap:
            return None
        return max(0.0, heap[0][0] - self._clock.now())

    async def _wait(self, changed: asyncio.Event, timeout_s: float | None) -> None:
        """Wait until ``changed`` fires or ``timeout_s`` passes on the injected clock."""
        if timeout_s is None:
            await changed.wait()
            return
        waiter = asyncio.ensure_future(changed.wait())
        sleeper = asyncio.ensure_future(self._clock.sleep(timeout_s))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiter, sleeper):
                if not task.done():
                    task.cancel()
            await asyncio.gather(waiter, sleeper, return_exceptions=True)
