"""Stopping background tasks (:func:`app.aio.cancel_and_wait`) and the event loop the
commands run on (:func:`app.aio.run`)."""

from __future__ import annotations

import asyncio

import pytest

from app import aio
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


# -- the event loop (app.aio.run, loop_factory; the event_loop setting) ------------------------


async def _loop_name() -> str:
    return aio.running_loop_name()


def test_auto_runs_on_uvloop_when_it_is_installed() -> None:
    assert aio.uvloop_installed()
    assert aio.run(_loop_name()) == "uvloop"
    assert aio.run(_loop_name(), "uvloop") == "uvloop"


def test_asyncio_runs_on_asyncio_s_own_loop() -> None:
    assert aio.run(_loop_name(), "asyncio") == "asyncio"


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aio, "uvloop_installed", lambda: False)
    assert aio.run(_loop_name()) == "asyncio"


def test_uvloop_asked_for_but_missing_is_an_error_and_the_coroutine_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aio, "uvloop_installed", lambda: False)
    main = _loop_name()
    with pytest.raises(aio.EventLoopUnavailable, match="uvloop is not installed"):
        aio.run(main, "uvloop")
    # Closed, never started: no "coroutine was never awaited" warning (an error here).
    assert main.cr_frame is None


def test_an_unknown_loop_is_refused() -> None:
    main = _loop_name()
    with pytest.raises(ValueError, match="expected auto, uvloop or asyncio"):
        aio.run(main, "trio")  # type: ignore[arg-type]
    assert main.cr_frame is None


def test_run_cancels_what_is_left_and_closes_the_loop() -> None:
    left: list[asyncio.Task[None]] = []
    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> int:
        loops.append(asyncio.get_running_loop())
        left.append(asyncio.create_task(asyncio.sleep(3600)))
        await asyncio.sleep(0)
        return 7

    assert aio.run(main()) == 7
    assert left[0].cancelled()
    assert loops[0].is_closed()


def test_run_to_end_closes_the_caller_s_coroutine_when_the_loop_cannot_be_had(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.db.engine import run_to_end

    monkeypatch.setattr(aio, "uvloop_installed", lambda: False)
    main = _loop_name()
    with pytest.raises(aio.EventLoopUnavailable):
        run_to_end(main, "uvloop")
    assert main.cr_frame is None
    unknown = _loop_name()
    with pytest.raises(ValueError, match="expected auto, uvloop or asyncio"):
        run_to_end(unknown, "trio")  # type: ignore[arg-type]
    assert unknown.cr_frame is None
    assert run_to_end(_loop_name(), "auto") == "asyncio"


def test_running_loop_name_outside_a_loop_raises() -> None:
    with pytest.raises(RuntimeError):
        aio.running_loop_name()


# ------------------------------------------------------------------ start-up unless stopped
async def test_start_up_that_ends_first_is_awaited() -> None:
    stop = asyncio.Event()
    ran: list[str] = []

    async def start() -> None:
        await asyncio.sleep(0)
        ran.append("started")

    assert await aio.unless_stopped(start(), stop) is True
    assert ran == ["started"]


async def test_start_up_error_is_raised_when_it_comes_first() -> None:
    async def start() -> None:
        raise ValueError("no API server")

    with pytest.raises(ValueError, match="no API server"):
        await aio.unless_stopped(start(), asyncio.Event())


async def test_stop_during_start_up_cancels_it_and_waits_for_its_end() -> None:
    # A start-up waiting on a server that never answers: SIGTERM (the stop event) must end
    # it, and its clean-up must have run before unless_stopped returns.
    stop = asyncio.Event()
    ended: list[str] = []
    waiting = asyncio.Event()

    async def start() -> None:
        waiting.set()
        await _slow_to_stop(ended, "start")

    async def signal_when_waiting() -> None:
        await waiting.wait()
        stop.set()

    setter = asyncio.create_task(signal_when_waiting())
    assert await aio.unless_stopped(start(), stop) is False
    assert ended == ["start"]
    await setter


async def test_an_error_while_start_up_ends_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = asyncio.Event()

    async def start() -> None:
        try:
            stop.set()
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("half-open connection")

    assert await aio.unless_stopped(start(), stop) is False
    assert "start-up failed while it was stopped" in caplog.text
    assert "half-open connection" in caplog.text


async def test_cancelling_the_caller_cancels_start_up_too() -> None:
    ended: list[str] = []
    outer = asyncio.create_task(aio.unless_stopped(_slow_to_stop(ended, "start"), asyncio.Event()))
    await asyncio.sleep(0.01)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert ended == ["start"]
