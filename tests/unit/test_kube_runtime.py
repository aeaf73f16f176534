"""The controller runtime without a server: the worker loop settles each pass (forget, requeue
with the key's backoff, retry a failure rate-limited), the error ring, the metrics hook, drain
on stop, and health. Backoff runs on a hand-moved clock: nothing waits for real time."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from builders import eventually

from app.kube.runtime import Controller, ErrorRing, Pass, RecentError, RuntimeSettings
from app.kube.workqueue import QueueClock, WorkQueue, WorkQueueSettings

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


class HandClock:
    """Time moves only in :meth:`move`; a sleeper wakes once its deadline has passed."""

    def __init__(self) -> None:
        self.t = 50.0
        self._moved = asyncio.Event()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        deadline = self.t + seconds
        while self.t < deadline:
            moved = self._moved
            await moved.wait()

    def move(self, seconds: float) -> None:
        self.t += seconds
        self._moved.set()
        self._moved = asyncio.Event()


class Script:
    """A reconciler whose answers per key are given in advance (True: requeue; an exception:
    raise it); afterwards it answers False. Records every pass."""

    def __init__(self, answers: dict[str, list[bool | Exception]]) -> None:
        self.answers = answers
        self.passes: list[str] = []

    async def reconcile(self, key: str) -> bool:
        self.passes.append(key)
        queue = self.answers.get(key) or []
        answer = queue.pop(0) if queue else False
        if isinstance(answer, Exception):
            raise answer
        return answer


def make(reconciler: Script, clock: HandClock, **hooks: object) -> Controller[str]:
    queue: WorkQueue[str] = WorkQueue(
        WorkQueueSettings(name="test", base_delay_s=0.5, max_delay_s=100.0),
        clock=QueueClock(now=clock.now, sleep=clock.sleep),
    )
    return Controller(
        reconciler, RuntimeSettings("test", workers=2), queue, clock=lambda: NOW, **hooks
    )  # type: ignore[arg-type]


async def test_a_key_asking_to_be_requeued_waits_its_doubling_backoff_and_is_then_forgotten() -> (
    None
):
    clock = HandClock()
    script = Script({"a": [True, True]})
    delays: list[tuple[str, float]] = []
    done: list[str] = []
    runtime = make(
        script, clock, on_requeue=lambda k, d: delays.append((k, d)), on_done=done.append
    )
    await runtime.start()
    try:
        runtime.queue.add("a")
        await eventually(lambda: delays == [("a", 0.5)], what="first requeue")
        assert script.passes == ["a"]
        clock.move(0.5)
        await eventually(lambda: delays == [("a", 0.5), ("a", 1.0)], what="second requeue")
        assert script.passes == ["a", "a"]
        clock.move(0.9)
        await asyncio.sleep(0.05)
        assert script.passes == ["a", "a"], "not before its backoff has passed"
        clock.move(0.1)
        await eventually(lambda: done == ["a"], what="third pass settles the key")
        assert runtime.queue.num_requeues("a") == 0
    finally:
        await runtime.stop()


async def test_a_failed_pass_is_recorded_retried_and_the_worker_goes_on() -> None:
    clock = HandClock()
    script = Script({"bad": [ValueError("boom")]})
    passes: list[Pass[str]] = []
    runtime = make(script, clock, describe=lambda k: f"thing {k}", observe=passes.append)
    await runtime.start()
    try:
        runtime.queue.add("bad")
        runtime.queue.add("good")
        await eventually(lambda: len(passes) == 2, what="both passes")
        assert sorted((p.key, p.result) for p in passes) == [("bad", "error"), ("good", "ok")]
        assert all(p.seconds >= 0 and p.queue_depth >= 0 for p in passes)
        assert list(runtime.errors) == [RecentError(NOW, "thing bad", "ValueError: boom")]
        assert runtime.queue.num_requeues("bad") == 1
        clock.move(0.5)
        await eventually(lambda: script.passes.count("bad") == 2, what="retried")
        assert runtime.is_healthy()
    finally:
        await runtime.stop()


async def test_a_custom_error_hook_replaces_the_default_record() -> None:
    script = Script({"k": [RuntimeError("nope")]})
    seen: list[tuple[str, str]] = []
    runtime = make(script, HandClock(), on_error=lambda k, e: seen.append((k, str(e))))
    await runtime.start()
    try:
        runtime.queue.add("k")
        await eventually(lambda: seen == [("k", "nope")], what="hook called")
        assert len(runtime.errors) == 0
    finally:
        await runtime.stop()


async def test_stop_lets_an_in_flight_pass_finish_within_the_drain_time() -> None:
    release = asyncio.Event()
    finished: list[str] = []

    class Slow:
        async def reconcile(self, key: str) -> bool:
            await release.wait()
            finished.append(key)
            return False

    runtime: Controller[str] = Controller(
        Slow(), RuntimeSettings("slow", workers=1), WorkQueue(WorkQueueSettings(name="slow"))
    )
    await runtime.start()
    runtime.queue.add("k")
    await eventually(lambda: runtime.queue.is_processing("k"), what="in flight")
    stopping = asyncio.create_task(runtime.stop(drain_s=60))
    await asyncio.sleep(0.05)
    assert not stopping.done(), "stop waits for the pass"
    release.set()
    await stopping
    assert finished == ["k"]


class Stuck:
    """A reconciler whose pass never ends until cancelled; records the cancelled keys and
    the flush step's calls."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled: list[str] = []
        self.flushed: list[str] = []

    async def reconcile(self, key: str) -> bool:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(key)
            raise
        return False

    async def flush(self) -> None:
        self.flushed.append("events")

    async def running(self) -> Controller[str]:
        """A started controller of one worker, with key ``k`` in its pass."""
        runtime: Controller[str] = Controller(
            self, RuntimeSettings("stuck", workers=1), WorkQueue(WorkQueueSettings(name="stuck"))
        )
        await runtime.start()
        runtime.queue.add("k")
        await self.started.wait()
        return runtime


async def test_stop_without_drain_cancels_the_pass_and_runs_the_flush_step() -> None:
    stuck = Stuck()
    runtime = await stuck.running()
    await runtime.stop(before_informers=stuck.flush)
    assert stuck.cancelled == ["k"] and stuck.flushed == ["events"]


async def test_a_stop_cancelled_mid_drain_still_cancels_the_pass_and_a_second_stop_ends_it() -> (
    None
):
    # A service's deadline cancels its step-down while the drain waits: the pass must not be
    # left running (it would hold its database connection past the process's end).
    stuck = Stuck()
    runtime = await stuck.running()
    stopping = asyncio.create_task(runtime.stop(drain_s=60, before_informers=stuck.flush))
    await asyncio.sleep(0.05)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    await eventually(lambda: stuck.cancelled == ["k"], what="the pass cancelled")
    assert stuck.flushed == []
    await runtime.stop(before_informers=stuck.flush)
    assert stuck.flushed == ["events"]


async def test_a_stop_cancelled_while_a_pass_cleans_up_ends_and_a_second_stop_waits() -> None:
    # A pass that takes long to clean up once cancelled (a write it finishes): a deadline
    # that cancels the stop meanwhile must end the stop, not be swallowed by it.
    cleaned = asyncio.Event()
    release = asyncio.Event()

    async def cleanup() -> None:
        await release.wait()
        cleaned.set()

    class SlowCleanup:
        async def reconcile(self, key: str) -> bool:
            try:
                await asyncio.Event().wait()
            finally:
                await asyncio.shield(cleanup())
            return False

    runtime: Controller[str] = Controller(
        SlowCleanup(), RuntimeSettings("slow", workers=1), WorkQueue(WorkQueueSettings(name="s"))
    )
    await runtime.start()
    runtime.queue.add("k")
    await eventually(lambda: runtime.queue.is_processing("k"), what="in flight")
    stopping = asyncio.create_task(runtime.stop())
    await asyncio.sleep(0.05)
    assert not stopping.done()
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(stopping, 5)
    assert not cleaned.is_set()
    release.set()
    await runtime.stop()
    await asyncio.wait_for(cleaned.wait(), 5)


async def test_a_loop_that_ends_makes_the_controller_unhealthy() -> None:
    runtime = make(Script({}), HandClock())
    ended = asyncio.Event()

    async def short_loop() -> None:
        ended.set()

    runtime.add_loop("short", short_loop)
    order: list[str] = []

    async def prepare() -> None:
        order.append("prepare")

    await runtime.start(prepare)
    try:
        assert order == ["prepare"] and runtime.started.is_set()
        await ended.wait()
        await eventually(lambda: not runtime.is_healthy(), what="unhealthy")
    finally:
        await runtime.stop()


def test_the_error_ring_keeps_the_newest_entries_in_order() -> None:
    ring = ErrorRing(RecentError, lambda: NOW, maxlen=3)
    for i in range(5):
        ring.record(f"s{i}", f"m{i}")
    assert [e.subject for e in ring] == ["s2", "s3", "s4"]
    assert [e.message for e in ring.latest(2)] == ["m3", "m4"]
    assert ring.latest(0) == [] and len(ring) == 3


@pytest.mark.parametrize("changes", [{"workers": 0}, {"max_recent_errors": 0}])
def test_settings_refuse_nonsense(changes: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        RuntimeSettings("x", **changes)
