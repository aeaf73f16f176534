"""A small controller runtime: informers, a work queue, workers that reconcile keys, and the
bookkeeping around them, so that a controller holds only its decisions.

Modelled on the shape every client-go controller has (``k8s.io/client-go`` ``util/workqueue``
with the worker loop of ``k8s.io/sample-controller`` ``controller.go``: ``processNextWorkItem``
forgets a key that reconciled cleanly and requeues one that failed with its per-key backoff),
and on the resource slice controller of ``k8s.io/dynamic-resource-allocation``
(``resourceslice/resourceslicecontroller.go``), which does the same with one key per pool.

A controller gives :class:`Controller` a :class:`Reconciler` (``reconcile(key) -> requeue``),
its informers and its work queue; the runtime then:

* starts the informers, waits for their first lists, runs the controller's own ``prepare``
  step (recovery, the first keys), and starts the workers and any periodic loops;
* in each worker, takes a key, reconciles it and settles it: a clean pass forgets the key's
  backoff, ``requeue=True`` queues it again after its backoff (``WorkQueue.when``), an
  exception is recorded in the recent-error ring and the key is queued rate-limited; a worker
  never dies of a failed reconcile;
* reports each pass to a metrics hook (result ``ok``, ``requeued`` or ``error``, seconds,
  queue depth);
* on stop, shuts the queue, lets in-flight passes finish for up to ``drain_s`` seconds,
  cancels what is left and stops the informers.

Health is "every informer synced and healthy, and no worker or loop has died".
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from app.aio import OwnCancellation
from app.kube.informer import Informer
from app.kube.workqueue import ShutDown, WorkQueue

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)
E = TypeVar("E")
Result = Literal["ok", "requeued", "error"]
DEFAULT_MAX_RECENT_ERRORS = 100


class Reconciler(Protocol[K_contra]):
    """What a controller gives the runtime: one pass over one key."""

    async def reconcile(self, key: K_contra) -> bool:
        """Bring the object named by ``key`` to its desired state.

        Returns:
            True to look at the key again after its backoff (waiting for something that is
            not an event), False when done.

        Raises:
            Exception: any failure; the runtime records it and retries the key rate-limited.
        """
        ...


@dataclass(frozen=True)
class RuntimeSettings:
    """Settings of a :class:`Controller`.

    Attributes:
        name: names the tasks (``<name>-worker-<i>``) and log lines.
        workers: keys reconciled at once (>= 1); one key is never held by two workers.
        max_recent_errors: size of the recent-error ring (>= 1).
    """

    name: str
    workers: int = 8
    max_recent_errors: int = DEFAULT_MAX_RECENT_ERRORS

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"controller {self.name!r}: workers must be >= 1")
        if self.max_recent_errors < 1:
            raise ValueError(f"controller {self.name!r}: max_recent_errors must be >= 1")


@dataclass(frozen=True, slots=True)
class RecentError:
    """A recent problem: when, with what (a claim, a scheduling context), and what."""

    at: dt.datetime
    subject: str
    message: str


@dataclass(frozen=True, slots=True)
class Pass(Generic[K]):
    """One finished reconcile, for the metrics hook.

    Attributes:
        key: the key reconciled.
        result: ``ok``, ``requeued`` or ``error``.
        seconds: the pass's own time (monotonic).
        queue_depth: keys ready in the queue afterwards (``len(queue)``).
    """

    key: K
    result: Result
    seconds: float
    queue_depth: int


class ErrorRing(Generic[E]):
    """The last ``maxlen`` problems, oldest first, for the admin view.

    Args:
        entry: makes an entry from (time, subject, message); a dataclass with those three
            fields in that order does (:class:`RecentError` by default).
        clock: aware UTC time of each entry.
        maxlen: how many entries are kept (older ones are dropped).
    """

    def __init__(
        self,
        entry: Callable[[dt.datetime, str, str], E],
        clock: Callable[[], dt.datetime],
        maxlen: int = DEFAULT_MAX_RECENT_ERRORS,
    ) -> None:
        self._entry = entry
        self._clock = clock
        self._entries: deque[E] = deque(maxlen=maxlen)

    def record(self, subject: str, message: str) -> E:
        """Add an entry stamped now; returns it."""
        entry = self._entry(self._clock(), subject, message)
        self._entries.append(entry)
        return entry

    def latest(self, count: int) -> list[E]:
        """The newest ``count`` entries, oldest first."""
        return list(self._entries)[-count:] if count > 0 else []

    def __iter__(self) -> Iterator[E]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)


LoopFunction = Callable[[], Coroutine[Any, Any, None]]


class Controller(Generic[K]):
    """Runs a :class:`Reconciler` over a :class:`WorkQueue` with informers; see the module
    docstring.

    Args:
        reconciler: called as ``await reconciler.reconcile(key)`` (looked up on each pass, so
            a subclass's override is used).
        settings: see :class:`RuntimeSettings`.
        queue: the work queue (the controller adds keys to it from its event handlers).
        informers: started by :meth:`start`, stopped by :meth:`stop`, and part of health.
        errors: the recent-error ring; a ring of :class:`RecentError` by default.
        describe: names a key in errors and logs (``str`` by default).
        on_error: called with (key, exception) when a pass raised, instead of the default
            (record ``"<Type>: <message>"`` in ``errors`` under ``describe(key)`` and log a
            warning, with the traceback unless the exception is one of ``expected``).
        expected: exception types whose default log line leaves out the traceback (the
            controller's own I/O errors, say).
        on_requeue: called with (key, delay in seconds) when a pass asked to be requeued,
            before the key is queued again.
        on_done: called with the key after a pass that asked for nothing more.
        observe: the metrics hook, called after every pass with a :class:`Pass`.
        clock: aware UTC time, for the default ring.
    """

    def __init__(
        self,
        reconciler: Reconciler[K],
        settings: RuntimeSettings,
        queue: WorkQueue[K],
        *,
        informers: Sequence[Informer] = (),
        errors: ErrorRing[Any] | None = None,
        describe: Callable[[K], str] = str,
        on_error: Callable[[K, Exception], None] | None = None,
        expected: tuple[type[BaseException], ...] = (),
        on_requeue: Callable[[K, float], None] | None = None,
        on_done: Callable[[K], None] | None = None,
        observe: Callable[[Pass[K]], None] | None = None,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.settings = settings
        self.queue = queue
        self.informers = tuple(informers)
        self.errors: ErrorRing[Any] = (
            errors
            if errors is not None
            else ErrorRing(
                RecentError, clock or (lambda: dt.datetime.now(dt.UTC)), settings.max_recent_errors
            )
        )
        self.describe = describe
        self._on_error = on_error
        self._expected = expected
        self._on_requeue = on_requeue
        self._on_done = on_done
        self._observe = observe
        self._loops: list[tuple[str, LoopFunction]] = []
        self._workers: list[asyncio.Task[None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.started = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle
    def add_loop(self, name: str, loop: LoopFunction) -> None:
        """Run ``loop()`` as a task named ``name`` beside the workers (a sweep, a resync);
        register before :meth:`start`. It is cancelled by :meth:`stop`, and health turns
        False if it ends."""
        self._loops.append((name, loop))

    async def start(self, prepare: Callable[[], Awaitable[None]] | None = None) -> None:
        """Start the informers, wait until each has listed, await ``prepare()`` (recover,
        queue the first keys), then start the workers and the loops. Returns once they run."""
        for informer in self.informers:
            informer.start()
        for informer in self.informers:
            await informer.has_synced.wait()
        if prepare is not None:
            await prepare()
        self._workers = [
            asyncio.create_task(self._worker(), name=f"{self.settings.name}-worker-{i}")
            for i in range(self.settings.workers)
        ]
        self._tasks = [
            *self._workers,
            *(asyncio.create_task(loop(), name=name) for name, loop in self._loops),
        ]
        self.started.set()

    async def stop(
        self, drain_s: float = 0.0, before_informers: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Stop taking work; let in-flight passes finish for up to ``drain_s`` seconds (then
        they are cancelled); cancel the loops; await ``before_informers()`` (flush what the
        passes queued, Events say); stop the informers. A task that had died is logged, and
        does not stop the shutdown. Cancellation-safe: the tasks are cancelled even when this
        stop is, and calling it again finishes the stop."""
        self.queue.shutdown()
        try:
            if self._workers and drain_s > 0:
                await asyncio.wait(self._workers, timeout=drain_s)
        finally:
            # Even when this stop is itself cancelled mid-drain (a deadline): a pass left
            # running would hold its database connection past the process's end. A second
            # stop() awaits them.
            for task in self._tasks:
                task.cancel()
        own = OwnCancellation()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                if own.requested():
                    raise  # this stop was cancelled: a second stop() awaits the rest
            except BaseException as err:  # a task that died must not stop the shutdown
                log.error("%s task %s had died: %r", self.settings.name, task.get_name(), err)
        self._tasks = []
        self._workers = []
        if before_informers is not None:
            await before_informers()
        for informer in self.informers:
            await informer.stop()

    def synced(self) -> bool:
        """True once every informer has listed."""
        return all(i.has_synced.is_set() for i in self.informers)

    def is_healthy(self) -> bool:
        """True while every informer is synced and healthy and no worker or loop has died
        (False before :meth:`start`, as the informers have not listed)."""
        return all(i.has_synced.is_set() and i.is_healthy() for i in self.informers) and not any(
            t.done() for t in self._tasks
        )

    # ------------------------------------------------------------------ workers
    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            started = time.monotonic()
            try:
                requeue = await self.reconciler.reconcile(key)
            except Exception as err:
                # Recorded and retried with backoff; a worker never dies of it.
                self._failed(key, err)
                self.queue.add_rate_limited(key)
                self._count(key, "error", started)
            else:
                if requeue:
                    delay = self.queue.when(key)
                    if self._on_requeue is not None:
                        self._on_requeue(key, delay)
                    self.queue.add_after(key, delay)
                else:
                    if self._on_done is not None:
                        self._on_done(key)
                    self.queue.forget(key)
                self._count(key, "requeued" if requeue else "ok", started)
            finally:
                self.queue.done(key)

    def _failed(self, key: K, err: Exception) -> None:
        if self._on_error is not None:
            self._on_error(key, err)
            return
        subject = self.describe(key)
        self.errors.record(subject, f"{type(err).__name__}: {err}")
        log.warning(
            "%s: reconcile failed: %s", subject, err, exc_info=not isinstance(err, self._expected)
        )

    def _count(self, key: K, result: Result, started: float) -> None:
        if self._observe is not None:
            self._observe(Pass(key, result, time.monotonic() - started, len(self.queue)))


__all__ = [
    "Controller",
    "ErrorRing",
    "Pass",
    "RecentError",
    "Reconciler",
    "RuntimeSettings",
]
