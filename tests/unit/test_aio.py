"""Stopping background tasks: :func:`app.aio.cancel_and_wait`."""

from __future__ import annotations

import asyncio

import pytest

from app.aio import cancel_and_wait


async def _slow_to_stop(ended: list[str], name: str, cleanup_s: float = 0.05) -> None:
    """Runs until cancelled, then takes ``cleanup_s`` to clean up (shielded from a second
    cancel, as a task finishing a write would be)."""

    async def cleanup() -> None:
        await asyncio.sleep(cleanup_s)
        ended.append(name)

    try:
        await asyncio.sleep(3600)
    finally:
        await asyncio.shield(cleanup())


async def test_every_task_is_cancelled_and_waited_for() -> None:
    ended: list[str] = []
    first = asyncio.create_task(_slow_to_stop(ended, "first"))
    second = asyncio.create_task(_slow_to_stop(ended, "second"))
    done = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    await cancel_and_wait(first, None, second, done)
    assert sorted(ended) == ["first", "second"]
    assert first.cancelled() and second.cancelled() and done.done()


async def test_the_callers_own_cancellation_while_waiting_is_raised() -> None:
    ended: list[str] = []
    worker = asyncio.create_task(_slow_to_stop(ended, "worker", cleanup_s=0.2))
    await asyncio.sleep(0.01)
    stopper = asyncio.create_task(cancel_and_wait(worker))
    await asyncio.sleep(0.05)
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert stopper.cancelled()
    await asyncio.sleep(0.3)
    assert ended == ["worker"] and worker.cancelled()


async def test_a_stop_in_a_finally_after_an_earlier_cancellation_still_waits() -> None:
    ended: list[str] = []
    workers: list[asyncio.Task[None]] = []

    async def service() -> None:
        workers.extend(asyncio.create_task(_slow_to_stop(ended, name)) for name in ("a", "b", "c"))
        try:
            await asyncio.sleep(3600)
        finally:
            await cancel_and_wait(*workers)
            ended.append("service")

    task = asyncio.create_task(service())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended == ["a", "b", "c", "service"]


async def test_a_task_that_failed_is_raised_after_the_others_are_waited_for() -> None:
    ended: list[str] = []

    async def broken() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(broken())
    await asyncio.sleep(0)
    other = asyncio.create_task(_slow_to_stop(ended, "other"))
    await asyncio.sleep(0.01)
    with pytest.raises(RuntimeError, match="boom"):
        await cancel_and_wait(failed, other)
    assert ended == ["other"]
