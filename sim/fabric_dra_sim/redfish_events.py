"""The Redfish simulator's EventService: server-sent events for every change it makes.

DSP0266 (Redfish Specification), "Server-sent events": a client opens
``EventService.ServerSentEventUri`` with GET and reads a ``text/event-stream``; each message
carries ``id:`` (the event id, for ``Last-Event-ID`` on reconnect) and ``data:`` with an Event
resource (Event.v1: ``Id``, ``Name``, ``Context``, ``Events[]`` of ``EventId``,
``EventTimestamp``, ``MessageId``, ``Message``, ``MessageArgs``, ``MessageSeverity``,
``OriginOfCondition``). ``$filter`` is the SSE filter of DSP0266 (``RegistryPrefix``,
``MessageId``, ``OriginResource``, joined by ``or``); the simulator advertises what it supports
in ``SSEFilterPropertiesSupported``. The message ids come from DMTF's ResourceEvent registry
(``ResourceChanged``, ``ResourceCreated``, ``ResourceRemoved``,
``ResourceStatusChangedOK|Warning|Critical``).

A service keeps a bounded history: a reconnect with a ``Last-Event-ID`` still in it gets the
events it missed first; an older id gets nothing of the gap (the client must resync, as
DSP0266 warns that events can be lost).

Fault knobs (:class:`EventFaults`) model what real streams do: a dropped stream, duplicate
events, events about unknown resources, malformed payloads, and a slow consumer cut off when
its queue fills.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

EVENT_SERVICE = "/redfish/v1/EventService"
SSE_URI = f"{EVENT_SERVICE}/SSE"
SUBSCRIPTIONS = f"{EVENT_SERVICE}/Subscriptions"
REGISTRY = "ResourceEvent.1.0"
#: Filter properties this simulator evaluates (EventService.SSEFilterPropertiesSupported).
FILTER_PROPERTIES = ("MessageId", "OriginResource", "RegistryPrefix")

_CLAUSE = re.compile(r"^\s*(\w+)\s+eq\s+'([^']*)'\s*$")


def event_service() -> dict[str, Any]:
    """The EventService resource (EventService.v1_8_0) with its SSE URI and filters."""
    return {
        "@odata.id": EVENT_SERVICE,
        "@odata.type": "#EventService.v1_8_0.EventService",
        "Id": "EventService",
        "Name": "Event Service",
        "ServiceEnabled": True,
        "DeliveryRetryAttempts": 3,
        "DeliveryRetryIntervalSeconds": 60,
        "ServerSentEventUri": SSE_URI,
        "SSEFilterPropertiesSupported": {
            "EventFormatType": False,
            "MessageId": True,
            "MetricReportDefinition": False,
            "OriginResource": True,
            "RegistryPrefix": True,
            "ResourceType": False,
            "SubordinateResources": False,
        },
        "Status": {"State": "Enabled", "Health": "OK"},
        "Subscriptions": {"@odata.id": SUBSCRIPTIONS},
    }


def subscriptions() -> dict[str, Any]:
    """The (empty) EventDestination collection: push subscriptions are not simulated."""
    return {
        "@odata.id": SUBSCRIPTIONS,
        "@odata.type": "#EventDestinationCollection.EventDestinationCollection",
        "Name": "Event Subscriptions",
        "Members": [],
        "Members@odata.count": 0,
    }


class FilterError(ValueError):
    """A ``$filter`` this service cannot evaluate (answered 400)."""


def parse_filter(text: str | None) -> list[tuple[str, str]]:
    """``RegistryPrefix eq 'ResourceEvent' or OriginResource eq '/redfish/v1/...'`` as
    ``[(property, value), ...]``; empty for no filter.

    Raises:
        FilterError: a clause is not ``<property> eq '<value>'`` or names a property the
            simulator does not support.
    """
    if text is None or not text.strip():
        return []
    clauses = []
    for part in re.split(r"\s+or\s+", text.strip()):
        match = _CLAUSE.match(part)
        if match is None:
            raise FilterError(f"cannot parse $filter clause {part!r}")
        name, value = match.groups()
        if name not in FILTER_PROPERTIES:
            raise FilterError(f"$filter property {name} is not supported")
        clauses.append((name, value))
    return clauses


def matches(record: dict[str, Any], clauses: list[tuple[str, str]]) -> bool:
    """Whether an event record passes the filter (any clause; no clause passes all)."""
    if not clauses:
        return True
    message_id = str(record.get("MessageId", ""))
    origin = str((record.get("OriginOfCondition") or {}).get("@odata.id", ""))
    for name, value in clauses:
        if name == "RegistryPrefix" and message_id.split(".", 1)[0] == value:
            return True
        if name == "MessageId" and (message_id == value or message_id.endswith("." + value)):
            return True
        if name == "OriginResource" and (origin == value or origin.startswith(value + "/")):
            return True
    return False


@dataclass
class EventFaults:
    """What a real event stream does to a client.

    Attributes:
        drop_after: close every open stream after this many more events (None: never);
            the count resets for each connection.
        duplicate: send every event twice (same id).
        unknown_every: every n-th event names a resource the service does not have.
        malformed_every: every n-th message's data is not an Event (invalid JSON).
        queue_size: events a slow consumer may lag behind before its stream is closed.
        history: events kept for ``Last-Event-ID`` replay.
    """

    drop_after: int | None = None
    duplicate: bool = False
    unknown_every: int = 0
    malformed_every: int = 0
    queue_size: int = 1000
    history: int = 1000


@dataclass
class EventHub:
    """Fans the simulator's changes out to every open SSE stream."""

    faults: EventFaults = field(default_factory=EventFaults)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _history: collections.deque[tuple[int, str]] = field(init=False)
    _streams: set[asyncio.Queue[tuple[int, str] | None]] = field(default_factory=set)
    emitted: int = 0
    connections: int = 0

    def __post_init__(self) -> None:
        self._history = collections.deque(maxlen=self.faults.history)

    @property
    def open_streams(self) -> int:
        """Streams connected now."""
        return len(self._streams)

    def emit(self, message: str, origin: str, severity: str = "OK") -> None:
        """Send ResourceEvent ``message`` (``ResourceChanged``, ...) about ``origin`` (a
        resource URI) to every stream; keep it for replay."""
        number = next(self._ids)
        self.emitted += 1
        faults = self.faults
        if faults.unknown_every and number % faults.unknown_every == 0:
            origin = f"/redfish/v1/Chassis/Gone-{number}"
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        record = {
            "EventId": str(number),
            "EventTimestamp": now,
            "MessageId": f"{REGISTRY}.{message}",
            "Message": f"The resource {origin} changed ({message}).",
            "MessageArgs": [origin],
            "MessageSeverity": severity,
            "OriginOfCondition": {"@odata.id": origin},
        }
        if faults.malformed_every and number % faults.malformed_every == 0:
            data = '{"Events": [ not json'
        else:
            data = json.dumps(
                {
                    "@odata.type": "#Event.v1_7_0.Event",
                    "Id": str(number),
                    "Name": "Resource event",
                    "Context": "fabric-dra-sim",
                    "Events": [record],
                },
                separators=(",", ":"),
            )
        entry = (number, data)
        self._history.append(entry)
        for queue in list(self._streams):
            self._offer(queue, entry)
            if faults.duplicate:
                self._offer(queue, entry)

    def _offer(self, queue: asyncio.Queue[tuple[int, str] | None], entry: tuple[int, str]) -> None:
        try:
            queue.put_nowait(entry)
        except asyncio.QueueFull:
            # A consumer this far behind is cut off, as real services do; it reconnects with
            # Last-Event-ID and resyncs.
            self._streams.discard(queue)
            with contextlib.suppress(asyncio.QueueFull):
                queue.get_nowait()
            queue.put_nowait(None)

    def close_all(self) -> None:
        """End every open stream (a service restart, or a dropped connection)."""
        for queue in list(self._streams):
            self._streams.discard(queue)
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Serve one SSE connection until the client goes, a fault drops it, or the hub
        closes it.

        Raises:
            FilterError: ``$filter`` cannot be evaluated (the caller answers 400).
        """
        clauses = parse_filter(request.query.get("$filter"))
        last = request.headers.get("Last-Event-ID")
        queue: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue(self.faults.queue_size)
        replay: list[tuple[int, str]] = []
        if last is not None and last.strip().isdigit():
            replay = [e for e in self._history if e[0] > int(last)][-self.faults.queue_size :]
        self._streams.add(queue)
        self.connections += 1
        response = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        sent = 0
        try:
            await response.prepare(request)
            for old in replay:
                queue.put_nowait(old)
            while True:
                entry = await queue.get()
                if entry is None:
                    break
                number, data = entry
                if clauses and not _passes(data, clauses):
                    continue
                await response.write(f"id: {number}\ndata: {data}\n\n".encode())
                sent += 1
                if self.faults.drop_after is not None and sent >= self.faults.drop_after:
                    break
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._streams.discard(queue)
        return response


def _passes(data: str, clauses: list[tuple[str, str]]) -> bool:
    try:
        events = json.loads(data).get("Events") or []
    except (ValueError, AttributeError):
        return True  # a malformed message is sent as it is: the client must cope
    return any(isinstance(e, dict) and matches(e, clauses) for e in events)
