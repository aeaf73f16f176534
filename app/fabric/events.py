"""Fabric events: what a backend's push channel says changed, and the server-sent events
wire format it arrives in. Pure: no I/O.

:func:`sse_messages` reads ``text/event-stream`` lines as the WHATWG HTML standard's "event
stream interpretation" does (fields ``id``, ``data``, ``event``, ``retry``; a blank line
dispatches; lines starting with ``:`` are comments; several ``data`` lines join with a newline;
an ``id`` holding NUL is ignored). :func:`redfish_events` reads the ``data`` of one message as a
DSP0266 Event (``Events[]`` with ``MessageId`` and ``OriginOfCondition``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

#: ResourceEvent registry messages that change what the inventory holds (DMTF ResourceEvent
#: registry); matched on the part after the registry name and version.
INVENTORY_MESSAGES = (
    "ResourceChanged",
    "ResourceCreated",
    "ResourceRemoved",
    "ResourceStatusChangedOK",
    "ResourceStatusChangedWarning",
    "ResourceStatusChangedCritical",
    "ResourceStateChanged",
)
#: Where the composition tree lives: events about anything else are not the inventory's.
INVENTORY_ROOTS = (
    "/redfish/v1/CompositionService",
    "/redfish/v1/Systems",
    "/redfish/v1/Chassis",
)


@dataclass(frozen=True, slots=True)
class SseMessage:
    """One dispatched server-sent event: ``id`` (the last id seen on the stream, None before
    any), ``event`` (type, ``message`` by default) and ``data``."""

    id: str | None
    event: str
    data: str


@dataclass(frozen=True, slots=True)
class FabricEvent:
    """One change a fabric manager reported.

    Attributes:
        message: the registry message without registry and version (``ResourceChanged``).
        origin: the resource it is about (a URI), or None when the event names none.
        event_id: the stream's id of the message that carried it (for ``Last-Event-ID``).
        relevant: whether it can change the inventory (:data:`INVENTORY_MESSAGES` about a
            resource under :data:`INVENTORY_ROOTS`).
    """

    message: str
    origin: str | None
    event_id: str | None
    relevant: bool


#: Yielded by a backend's event iterator once its stream is open, before any event.
OPENED = FabricEvent("StreamOpened", None, None, False)


def sse_messages(lines: Iterable[str], last_id: str | None = None) -> Iterator[SseMessage]:
    """The messages in ``lines`` (each without its line ending), as the WHATWG event stream
    interpretation dispatches them. ``last_id`` is the id in force before the first line.
    A message with no ``data`` field is not dispatched; an unfinished last message is kept
    back (a stream cut mid-message loses it)."""
    data: list[str] = []
    event = ""
    current = last_id
    for line in lines:
        if line == "":
            if data:
                yield SseMessage(current, event or "message", "\n".join(data))
            data, event = [], ""
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id" and "\0" not in value:
            current = value
        # "retry" and unknown fields change nothing we use.


def _message_key(message_id: str) -> str:
    """``ResourceEvent.1.0.ResourceChanged`` -> ``ResourceChanged``."""
    return message_id.rsplit(".", 1)[-1]


def redfish_events(message: SseMessage) -> list[FabricEvent]:
    """The events of one SSE message whose data is a DSP0266 Event resource.

    Raises:
        ValueError: the data is not JSON, not an object, or its ``Events`` is not a list of
            objects with a string ``MessageId``.
    """
    try:
        body = json.loads(message.data)
    except json.JSONDecodeError as err:
        raise ValueError(f"event data is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise ValueError("event data is not a JSON object")
    records = body.get("Events")
    if not isinstance(records, list):
        raise ValueError("event has no Events array")
    found = []
    for index, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("MessageId"), str):
            raise ValueError(f"Events[{index}] has no string MessageId")
        origin_ref = record.get("OriginOfCondition")
        origin = origin_ref.get("@odata.id") if isinstance(origin_ref, dict) else None
        origin = origin.rstrip("/") if isinstance(origin, str) and origin else None
        key = _message_key(record["MessageId"])
        relevant = key in INVENTORY_MESSAGES and (
            origin is None
            or any(origin == r or origin.startswith(r + "/") for r in INVENTORY_ROOTS)
        )
        found.append(FabricEvent(key, origin, message.id, relevant))
    return found
