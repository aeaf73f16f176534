"""Redfish Tasks (Task.v1): the state of a long-running operation as an :class:`Operation`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.fabric.errors import FabricInvalidData
from app.fabric.redfish.parse.common import show
from app.fabric.redfish.parse.errors import message_text
from app.fabric.types import Operation, OperationState

_RUNNING_TASK_STATES = frozenset(
    {"New", "Starting", "Running", "Suspended", "Interrupted", "Pending", "Stopping", "Service"}
)
_FAILED_TASK_STATES = frozenset({"Exception", "Killed", "Cancelled"})


def is_task(body: Any) -> bool:
    """True when ``body`` is a Redfish Task (it carries ``TaskState``)."""
    return isinstance(body, Mapping) and "TaskState" in body


def parse_task(body: Any, op_id: str) -> Operation:
    """Fold a Task resource into an :class:`Operation`.

    Redfish Task.v1: TaskState New/Starting/Running/Suspended/Interrupted/Pending/Stopping/
    Service -> RUNNING; Exception/Killed/Cancelled -> FAILED; Completed -> COMPLETED unless
    ``TaskStatus`` is Critical (then FAILED). This holds whatever the HTTP status that carried
    the Task (services answer a running task's monitor with 200 and the Task as well as with
    202). A FAILED operation's message starts with the TaskState (``TaskState Killed: ...``),
    then the Task's messages.

    Raises:
        FabricInvalidData: not an object, or ``TaskState`` missing or unknown.
    """
    if not isinstance(body, Mapping):
        raise FabricInvalidData(f"task {op_id}: body is not a JSON object")
    task_state = body.get("TaskState")
    message = message_text(body)
    if task_state in _RUNNING_TASK_STATES:
        return Operation(op_id, OperationState.RUNNING, message)
    if task_state in _FAILED_TASK_STATES:
        said = f"TaskState {task_state}"
        return Operation(op_id, OperationState.FAILED, f"{said}: {message}" if message else said)
    if task_state == "Completed":
        if body.get("TaskStatus") == "Critical":
            said = "TaskState Completed with TaskStatus Critical"
            return Operation(
                op_id, OperationState.FAILED, f"{said}: {message}" if message else said
            )
        return Operation(op_id, OperationState.COMPLETED, message)
    raise FabricInvalidData(f"task {op_id}: TaskState {show(task_state)} is not a task state")
