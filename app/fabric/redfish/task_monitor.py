"""Following long-running Redfish operations: a write answered 202 hands over a task monitor.

DSP0266 "Asynchronous operations": the monitor (the 202's ``Location``) answers 202 while the
task runs and then the operation's own final status; some services answer a Task resource
instead, whose ``TaskState`` decides (:func:`app.fabric.redfish.parse.tasks.parse_task`). The
monitor reaches the caller's ``on_operation`` before the first poll, so that
:meth:`app.fabric.redfish.backend.RedfishBackend.resume` can follow it after a restart instead
of sending again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.fabric.errors import (
    FabricAuthError,
    FabricError,
    FabricInvalidData,
    FabricNotFound,
    FabricTimeout,
    FabricUnavailable,
)
from app.fabric.redfish.parse.errors import classify_message_ids, message_ids
from app.fabric.redfish.parse.headers import parse_retry_after
from app.fabric.redfish.parse.tasks import is_task, parse_task
from app.fabric.redfish.transport import RedfishTransport, Response
from app.fabric.types import Operation, OperationState

logger = logging.getLogger(__name__)

OnOperation = Callable[[str], Awaitable[None]]
"""Called with a task monitor URI before it is first polled (the caller journals it)."""


class FabricTaskTimeout(FabricTimeout):
    """A Redfish task did not finish within the task timeout.

    Attributes:
        op_id: the task monitor URI; pass it to
            :meth:`app.fabric.redfish.backend.RedfishBackend.operation_status`.
    """

    def __init__(self, message: str, *, op_id: str) -> None:
        super().__init__(message)
        self.op_id = op_id


@dataclass(frozen=True, slots=True)
class TaskEnd:
    """How a followed task ended: its operation (COMPLETED or FAILED), the monitor's last
    body, and for a failure answered with an error status, the error to raise."""

    operation: Operation
    body: Any
    error: FabricError | None


class TaskMonitor:
    """Follows the task monitors of one service.

    Args:
        transport: the service's transport.
        poll_interval_s: seconds between polls when the service gives no ``Retry-After``.
        timeout_s: seconds to wait for a task before :class:`FabricTaskTimeout`.
    """

    def __init__(
        self, transport: RedfishTransport, *, poll_interval_s: float, timeout_s: float
    ) -> None:
        self._transport = transport
        self._poll_s = poll_interval_s
        self._task_timeout_s = timeout_s

    def monitor_of(self, accepted: Response, what: str) -> str:
        """The task monitor path of a 202 (or running-Task) answer: its ``Location``, else
        the body's ``TaskMonitor`` or ``@odata.id`` (Task.v1)."""
        monitor_ref = accepted.headers.get("Location")
        if monitor_ref is None and isinstance(accepted.body, Mapping):
            for key in ("TaskMonitor", "@odata.id"):
                raw_id = accepted.body.get(key)
                if isinstance(raw_id, str):
                    monitor_ref = raw_id
                    break
        if monitor_ref is None:
            raise FabricInvalidData(
                f"{what}: HTTP {accepted.status} task answer without a task monitor Location"
            )
        return self._transport.path(monitor_ref)

    async def follow(
        self, monitor: str, what: str, *, delay: float | None, immediately: bool = False
    ) -> TaskEnd | None:
        """Poll a task monitor until the task ends.

        Args:
            monitor: the monitor (or Task) path.
            what: the operation, for messages.
            delay: seconds before the first poll (the write's ``Retry-After``), else the
                poll interval.
            immediately: poll at once (resuming a task that may have ended long ago).

        Returns:
            How the task ended (COMPLETED, or FAILED with the error to raise), or None when
            the monitor is gone (404/410) before saying how it ended.

        Raises:
            FabricTaskTimeout: not finished within the task timeout, or the monitor could not
                be read (``op_id`` is the monitor either way).
            FabricAuthError, FabricInvalidData: as the reads.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._task_timeout_s
        first = True
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise FabricTaskTimeout(
                    f"{what}: task {monitor} not finished within {self._task_timeout_s} s",
                    op_id=monitor,
                )
            if not (first and immediately):
                # A service answering "Retry-After: 0" forever must not be polled in a busy
                # loop.
                pause = self._poll_s if delay is None else max(delay, self._poll_s / 10)
                await asyncio.sleep(min(pause, self._transport.retry.max_retry_after_s, remaining))
            first = False
            try:
                response = await self._transport.get(monitor)
            except FabricNotFound:
                logger.warning("%s: task monitor %s is gone; reading the state", what, monitor)
                return None
            except FabricUnavailable as err:
                # The task may still run: hand out its monitor so the caller can ask later.
                raise FabricTaskTimeout(
                    f"{what}: task {monitor} could not be followed: {err}", op_id=monitor
                ) from err
            except (FabricAuthError, FabricInvalidData):
                raise
            except FabricError as err:
                # The monitor answers the operation's own final status: it failed.
                failed = Operation(monitor, OperationState.FAILED, str(err))
                error = type(err)(
                    f"{what}: task failed: {err}", status=err.status, vendor_code=err.vendor_code
                )
                return TaskEnd(failed, None, error)
            operation = task_outcome(response, monitor)
            if operation.state is OperationState.RUNNING:
                delay = parse_retry_after(response.headers.get("Retry-After"))
                continue
            return TaskEnd(operation, response.body, None)

    async def status(self, op_id: str) -> Operation:
        """The state of task monitor (or Task) ``op_id``; as
        :meth:`app.fabric.redfish.backend.RedfishBackend.operation_status`."""
        monitor = self._transport.path(op_id)
        try:
            response = await self._transport.get(monitor)
        except (FabricNotFound, FabricUnavailable, FabricAuthError, FabricInvalidData):
            raise
        except FabricError as err:
            return Operation(monitor, OperationState.FAILED, str(err))
        return task_outcome(response, monitor)


def is_task_answer(response: Response) -> bool:
    """True for a write answer that hands over a task: 202 (DSP0266 "Asynchronous
    operations"), or a 200/201 whose body is a Task still running (seen in the wild)."""
    if response.status == 202:
        return True
    if not is_task(response.body):
        return False
    try:
        return parse_task(response.body, "").state is OperationState.RUNNING
    except FabricInvalidData:
        return False


def task_outcome(response: Response, monitor: str) -> Operation:
    """A monitor's answer as an operation: a Task body decides by its TaskState whatever the
    status (a 200 with a running Task is RUNNING); else 202 is RUNNING and any other success
    COMPLETED (the monitor answers the operation's own final status, DSP0266)."""
    if is_task(response.body):
        return parse_task(response.body, monitor)
    if response.status == 202:
        return Operation(monitor, OperationState.RUNNING)
    return Operation(monitor, OperationState.COMPLETED)


def task_error(body: Any, what: str, operation: Operation) -> FabricError:
    """The error to raise for a task that ended FAILED: the class its Base MessageIds name
    (:func:`~app.fabric.redfish.parse.errors.classify_message_ids`), else FabricError."""
    ids = message_ids(body)
    known = classify_message_ids(ids)
    error_class, code = known if known is not None else (FabricError, ids[0] if ids else None)
    return error_class(
        f"{what}: task {operation.op_id} failed: {operation.message or 'no message'}",
        vendor_code=code,
    )
