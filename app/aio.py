"""The event loop the commands run on, and stopping background tasks without losing the
stopper's own cancellation."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]
"""``auto``: uvloop when it is installed (a dependency everywhere but Windows), else
asyncio's own loop; ``uvloop``: uvloop or an error; ``asyncio``: asyncio's own loop."""


UVLOOP_MISSING = (
    "uvloop is not installed; install it (pip install uvloop) or choose auto or asyncio"
)
"""The error for ``event_loop: uvloop`` where uvloop is missing (settings check and :func:`run`)."""


class EventLoopUnavailable(RuntimeError):
    """The event loop asked for is not installed."""


def uvloop_installed() -> bool:
    """True when the uvloop package can be imported."""
    return importlib.util.find_spec("uvloop") is not None


def loop_factory(choice: EventLoopChoice = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new event loop of ``choice`` (see :data:`EventLoopChoice`).

    uvloop runs asyncio's loop, sockets and transports in C (libuv). On the control-plane
    benchmark (``bench.controlplane``, PostgreSQL) it took about 10 % off the controller's CPU
    per allocation: 5.1 against 5.5-5.8 ms.

    Raises:
        EventLoopUnavailable: ``choice`` is ``uvloop`` and uvloop is not installed.
        ValueError: ``choice`` is none of the three.
    """
    if choice == "asyncio":
        return asyncio.new_event_loop
    if choice not in ("auto", "uvloop"):
        raise ValueError(f"event loop {choice!r}: expected auto, uvloop or asyncio")
    if not uvloop_installed():
        if choice == "uvloop":
            raise EventLoopUnavailable(f"event_loop is uvloop, but {UVLOOP_MISSING}")
        return asyncio.new_event_loop
    import uvloop

    return uvloop.new_event_loop


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: which kind of event loop runs the caller.

    Raises:
        RuntimeError: no event loop runs in this thread.
    """
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.split(".")[0] == "uvloop" else "asyncio"


def run(main: Coroutine[Any, Any, T], event_loop: EventLoopChoice = "auto") -> T:
    """``asyncio.run(main)`` on a loop of ``event_loop`` (:func:`loop_factory`): the loop is
    closed at the end, after the tasks left are cancelled and the async generators and the
    default executor shut down.

    Raises:
        EventLoopUnavailable: as :func:`loop_factory` (``main`` is closed, never started).
        Exception: what ``main`` raised.
    """
    try:
        factory = loop_factory(event_loop)
    except (EventLoopUnavailable, ValueError):
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


class OwnCancellation:
    """Tells a cancellation of the current task, requested from now on, from a
    ``CancelledError`` that a task it awaits ended with (both arrive as the same exception).

    Made before the awaits; :meth:`requested` after catching the exception. It compares the
    current task's ``Task.cancelling()`` count with the count at creation, so a cancellation
    already under way (a stop called in a ``finally``) does not count.
    """

    def __init__(self) -> None:
        self._task = asyncio.current_task()
        self._before = self._task.cancelling() if self._task is not None else 0

    def requested(self) -> bool:
        """True when the current task was asked to cancel since this was made."""
        return self._task is not None and self._task.cancelling() > self._before


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` (None entries are skipped) and wait until each has ended.

    A task's own ``CancelledError`` is what was asked for and is not raised. A cancellation of
    the caller *while it waits here* is raised, as ``contextlib.suppress(CancelledError)``
    around the ``await`` would not: a supervisor that cancels a stop that takes too long must
    see the stop end (Python's asyncio docs: code that swallows its ``CancelledError`` breaks
    ``asyncio.timeout`` and ``TaskGroup``). Both arrive as the same exception; the caller's
    ``Task.cancelling()`` count, taken on entry and again, tells them apart, so that a stop
    called in a ``finally`` after an earlier cancellation still waits for every task. The
    tasks left when the caller is cancelled are cancelled already.

    Raises:
        asyncio.CancelledError: the caller was cancelled.
        Exception: what a task ended with, when it ended with an error (the first such task
            in ``tasks`` order; the others are still waited for first).
    """
    pending = [task for task in tasks if task is not None]
    own = OwnCancellation()
    for task in pending:
        task.cancel()
    failure: BaseException | None = None
    for task in pending:
        try:
            await task
        except asyncio.CancelledError:
            if own.requested():
                raise
        except Exception as err:
            failure = failure or err
    if failure is not None:
        raise failure


async def unless_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Await ``work`` (a service's start-up) unless ``stop`` is set first, as SIGTERM or
    Ctrl-C sets it while start-up still waits on a server that does not answer.

    Returns:
        True when ``work`` finished; False when ``stop`` was set first: ``work`` was then
        cancelled and has ended (an error it raised while ending is logged, not raised).

    Raises:
        Exception: what ``work`` raised, when it ended before ``stop`` was set.
        asyncio.CancelledError: the caller was cancelled (``work`` is cancelled too).
    """
    task: asyncio.Task[None] = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        await asyncio.gather(cancel_and_wait(task, waiter), return_exceptions=True)
        raise
    if task.done():
        waiter.cancel()
        task.result()  # raises what start-up raised
        return True
    try:
        await cancel_and_wait(task, waiter)
    except Exception:
        logging.getLogger(__name__).warning("start-up failed while it was stopped", exc_info=True)
    return False
