"""The supervisor restarts crashed loops with backoff and reports them."""

from __future__ import annotations

import asyncio

from app.supervisor import Supervisor


async def test_a_crashed_loop_is_restarted_and_reported() -> None:
    sleeps: list[float] = []
    runs = 0
    gate = asyncio.Event()

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)
        await asyncio.sleep(0)

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs <= 3:
            raise RuntimeError(f"boom {runs}")
        gate.set()
        await asyncio.Event().wait()

    supervisor = Supervisor(backoff_initial_s=1, backoff_max_s=3, sleep=fake_sleep)
    supervisor.spawn("flaky", flaky)
    await asyncio.wait_for(gate.wait(), 5)
    (state,) = supervisor.states()
    assert state.running and state.restarts == 3 and state.crashes_in_a_row == 3
    assert state.last_error == "RuntimeError: boom 3"
    # Backoff doubles from 1 s, is capped at 3 s, and has at most 50% jitter.
    assert 1 <= sleeps[0] <= 1.5 and 2 <= sleeps[1] <= 3 and 3 <= sleeps[2] <= 4.5
    assert supervisor.down() == [] and supervisor.crash_looping() == []
    await supervisor.stop()
    assert supervisor.states() == []


async def test_crash_loops_are_reported_as_such() -> None:
    async def fake_sleep(delay: float) -> None:
        await asyncio.sleep(0)

    async def broken() -> None:
        raise ValueError("never works")

    supervisor = Supervisor(crash_loop_after=3, sleep=fake_sleep)
    supervisor.spawn("broken", broken)
    for _ in range(50):
        await asyncio.sleep(0)
    assert [s.name for s in supervisor.crash_looping()] == ["broken"]
    await supervisor.stop()


async def test_names_are_unique_and_stop_one_forgets() -> None:
    supervisor = Supervisor()

    async def forever() -> None:
        await asyncio.Event().wait()

    supervisor.spawn("a", forever)
    try:
        supervisor.spawn("a", forever)
    except ValueError as err:
        assert "already supervised" in str(err)
    else:
        raise AssertionError("a second loop named a was accepted")
    await supervisor.stop_one("a")
    await supervisor.stop_one("missing")
    assert supervisor.states() == []
