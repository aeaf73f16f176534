"""The work queue: de-duplication, dirty re-queue, delays, per-key backoff, token bucket,
shutdown, driven by a fake clock (no real waiting)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.kube.workqueue import Empty, QueueClock, ShutDown, WorkQueue, WorkQueueSettings


class FakeClock:
    """Monotonic time that moves only when the test says so; sleepers wake on advance()."""

    def __init__(self) -> None:
        self.t = 1000.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.t + seconds, future))
        await future

    async def advance(self, seconds: float) -> None:
        self.t += seconds
        for deadline, future in list(self._sleepers):
            if deadline <= self.t and not future.done():
                future.set_result(None)
        self._sleepers = [(d, f) for d, f in self._sleepers if not f.done()]
        for _ in range(5):
            await asyncio.sleep(0)

    def as_queue_clock(self) -> QueueClock:
        return QueueClock(now=self.now, sleep=self.sleep)


def make_queue(
    clock: FakeClock | None = None,
    *,
    base_delay_s: float = 0.005,
    max_delay_s: float = 1000.0,
    qps: float = 10.0,
    burst: int = 100,
) -> WorkQueue[str]:
    fake = clock or FakeClock()
    queue_settings = WorkQueueSettings(
        name="test", base_delay_s=base_delay_s, max_delay_s=max_delay_s, qps=qps, burst=burst
    )
    return WorkQueue(queue_settings, clock=fake.as_queue_clock())


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_adding_a_queued_key_again_is_a_no_op() -> None:
    queue = make_queue()
    queue.add("a")
    queue.add("b")
    queue.add("a")
    assert len(queue) == 2
    assert queue.get_nowait() == "a"
    assert queue.get_nowait() == "b"
    with pytest.raises(Empty):
        queue.get_nowait()


def test_keys_come_out_in_the_order_they_were_first_added() -> None:
    queue = make_queue()
    for key in ["c", "a", "c", "b", "a"]:
        queue.add(key)
    assert [queue.get_nowait() for _ in range(3)] == ["c", "a", "b"]


def test_a_key_added_while_processing_is_not_handed_out_until_done() -> None:
    queue = make_queue()
    queue.add("a")
    assert queue.get_nowait() == "a"
    queue.add("a")
    queue.add("a")
    assert len(queue) == 0
    with pytest.raises(Empty):
        queue.get_nowait()
    queue.done("a")
    assert len(queue) == 1
    assert queue.get_nowait() == "a"
    queue.done("a")
    with pytest.raises(Empty):
        queue.get_nowait()


def test_done_without_a_new_add_does_not_requeue() -> None:
    queue = make_queue()
    queue.add("a")
    key = queue.get_nowait()
    queue.done(key)
    assert len(queue) == 0
    assert not queue.is_processing("a")


async def test_get_waits_for_an_add() -> None:
    queue = make_queue()
    getter = asyncio.create_task(queue.get())
    await settle()
    assert not getter.done()
    queue.add("x")
    assert await asyncio.wait_for(getter, 1) == "x"
    assert queue.is_processing("x")


async def test_two_waiting_workers_never_get_the_same_key() -> None:
    queue = make_queue()
    first = asyncio.create_task(queue.get())
    second = asyncio.create_task(queue.get())
    await settle()
    queue.add("k")
    await settle()
    assert first.done() != second.done()
    queue.add("k")
    await settle()
    # "k" is processing: the second add only marks it dirty, the other worker keeps waiting.
    assert not (first.done() and second.done())
    queue.done("k")
    await settle()
    assert first.done()
    assert second.done()
    assert first.result() == second.result() == "k"


async def test_add_after_hands_the_key_out_only_when_the_delay_has_passed() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    queue.add_after("a", 5.0)
    assert queue.delayed_count == 1
    getter = asyncio.create_task(queue.get())
    await clock.advance(4.9)
    assert not getter.done()
    await clock.advance(0.1)
    assert await asyncio.wait_for(getter, 1) == "a"
    assert queue.delayed_count == 0


async def test_add_after_keeps_the_earliest_time() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    queue.add_after("a", 10.0)
    queue.add_after("a", 2.0)
    queue.add_after("a", 7.0)
    assert queue.delayed_count == 1
    await clock.advance(2.0)
    assert queue.get_nowait() == "a"
    queue.done("a")
    await clock.advance(10.0)
    with pytest.raises(Empty):
        queue.get_nowait()


def test_add_after_with_no_delay_adds_at_once() -> None:
    queue = make_queue()
    queue.add_after("a", 0)
    queue.add_after("b", -1)
    assert len(queue) == 2


async def test_a_delayed_key_already_queued_is_not_duplicated() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    queue.add("a")
    queue.add_after("a", 1.0)
    await clock.advance(1.0)
    assert queue.get_nowait() == "a"
    with pytest.raises(Empty):
        queue.get_nowait()


async def test_a_waiting_worker_wakes_for_an_earlier_delayed_key() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    queue.add_after("late", 100.0)
    getter = asyncio.create_task(queue.get())
    await settle()
    queue.add_after("early", 1.0)
    await clock.advance(1.0)
    assert await asyncio.wait_for(getter, 1) == "early"


def test_rate_limited_backoff_doubles_per_key_and_is_capped() -> None:
    queue = make_queue(base_delay_s=0.01, max_delay_s=0.05, qps=1e9, burst=1_000_000)
    delays = [queue.when("a") for _ in range(5)]
    assert delays == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.05])
    assert queue.num_requeues("a") == 5
    # Other keys have their own backoff.
    assert queue.when("b") == pytest.approx(0.01)
    queue.forget("a")
    assert queue.num_requeues("a") == 0
    assert queue.when("a") == pytest.approx(0.01)


def test_huge_failure_counts_do_not_overflow() -> None:
    queue = make_queue(base_delay_s=1.0, max_delay_s=300.0, qps=1e9, burst=1_000_000)
    for _ in range(2000):
        delay = queue.when("a")
    assert delay == 300.0


async def test_token_bucket_limits_overall_rate_after_the_burst() -> None:
    clock = FakeClock()
    queue = make_queue(clock, base_delay_s=0.001, max_delay_s=0.001, qps=2.0, burst=3)
    delays = [queue.when(f"k{i}") for i in range(6)]
    # Three tokens at hand, then one every 0.5 s.
    assert delays == pytest.approx([0.001, 0.001, 0.001, 0.5, 1.0, 1.5])
    await clock.advance(10.0)
    # The bucket refilled (up to the burst) while time passed.
    assert queue.when("fresh") == pytest.approx(0.001)


async def test_add_rate_limited_delays_the_key() -> None:
    clock = FakeClock()
    queue = make_queue(clock, base_delay_s=1.0, max_delay_s=8.0)
    queue.add_rate_limited("a")
    assert len(queue) == 0
    await clock.advance(0.99)
    with pytest.raises(Empty):
        queue.get_nowait()
    await clock.advance(0.01)
    assert queue.get_nowait() == "a"
    queue.done("a")
    queue.add_rate_limited("a")
    await clock.advance(1.0)
    with pytest.raises(Empty):
        queue.get_nowait()
    await clock.advance(1.0)
    assert queue.get_nowait() == "a"


async def test_shutdown_wakes_every_waiter_with_shutdown() -> None:
    queue = make_queue()
    waiters = [asyncio.create_task(queue.get()) for _ in range(3)]
    await settle()
    queue.shutdown()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(result, ShutDown) for result in results)
    queue.add("late")
    assert len(queue) == 0
    with pytest.raises(ShutDown):
        await queue.get()


async def test_shutdown_also_wakes_a_worker_waiting_for_a_delayed_key() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    queue.add_after("a", 50.0)
    getter = asyncio.create_task(queue.get())
    await settle()
    queue.shutdown()
    with pytest.raises(ShutDown):
        await asyncio.wait_for(getter, 1)


async def test_shutdown_with_drain_hands_out_queued_keys_then_waits_for_done() -> None:
    queue = make_queue()
    queue.add("a")
    queue.add("b")
    first = queue.get_nowait()
    drain = asyncio.create_task(queue.shutdown_with_drain())
    await settle()
    queue.add("c")
    assert queue.get_nowait() == "b"
    with pytest.raises(ShutDown):
        queue.get_nowait()
    assert not drain.done()
    queue.done(first)
    queue.done("b")
    await asyncio.wait_for(drain, 1)
    with pytest.raises(ShutDown):
        await queue.get()


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="base_delay_s"):
        WorkQueueSettings(base_delay_s=0)
    with pytest.raises(ValueError, match="max_delay_s"):
        WorkQueueSettings(base_delay_s=2, max_delay_s=1)
    with pytest.raises(ValueError, match="qps"):
        WorkQueueSettings(qps=0)
    with pytest.raises(ValueError, match="burst"):
        WorkQueueSettings(burst=0)


# Operations: ("add", key), ("get", worker), ("done", worker).
operation = st.one_of(
    st.tuples(st.just("add"), st.sampled_from("abcd")),
    st.tuples(st.just("get"), st.integers(0, 2)),
    st.tuples(st.just("done"), st.integers(0, 2)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=60))
def test_no_key_is_held_twice_and_every_add_is_followed_by_a_processing(
    operations: list[tuple[str, object]],
) -> None:
    queue: WorkQueue[str] = WorkQueue(WorkQueueSettings(name="prop"))
    held: dict[int, str] = {}
    # For each key: the step of its last add, and the step its latest processing started.
    last_add: dict[str, int] = {}
    last_start: dict[str, int] = {}

    def take(worker: int, step: int) -> None:
        key = queue.get_nowait()
        assert key not in held.values(), f"{key} handed to two workers"
        held[worker] = key
        last_start[key] = step

    for step, (op, arg) in enumerate(operations):
        if op == "add":
            assert isinstance(arg, str)
            queue.add(arg)
            last_add[arg] = step
        elif op == "get":
            assert isinstance(arg, int)
            if arg in held:
                continue
            with contextlib.suppress(Empty):
                take(arg, step)
        else:
            assert isinstance(arg, int)
            if arg in held:
                queue.done(held.pop(arg))
    # Drain: finish everything held, then process what is left with one worker.
    step = len(operations)
    for worker in list(held):
        queue.done(held.pop(worker))
    while True:
        step += 1
        try:
            take(0, step)
        except Empty:
            break
        queue.done(held.pop(0))
    assert len(queue) == 0
    for key, added_at in last_add.items():
        assert last_start.get(key, -1) > added_at, f"{key} not processed after its last add"
