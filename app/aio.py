"""Stopping background tasks without losing the stopper's own cancellation."""

from __future__ import annotations

import asyncio
from typing import Any


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
