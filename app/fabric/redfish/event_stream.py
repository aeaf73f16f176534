"""Redfish server-sent events: find the service's stream and read changes from it.

DSP0266 (Redfish Specification), "Server-sent events": ``EventService.ServerSentEventUri``
is opened with GET; ``EventService.SSEFilterPropertiesSupported`` says which ``$filter``
properties the service evaluates. Where ``RegistryPrefix`` is supported, the stream is
filtered to the ResourceEvent registry, the one that reports resources changing; otherwise
every event comes and those that cannot change the inventory are marked irrelevant
(:func:`app.fabric.events.redfish_events`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

from app.fabric.errors import FabricEventsUnsupported, FabricInvalidData
from app.fabric.events import OPENED, FabricEvent, redfish_events, sse_messages
from app.fabric.redfish.reader import ResourceReader

#: The SSE filter asked for when the service supports RegistryPrefix.
RESOURCE_EVENTS_FILTER = "RegistryPrefix eq 'ResourceEvent'"


async def stream_uri(reader: ResourceReader) -> str:
    """The event stream's URI, with ``$filter`` when the service evaluates RegistryPrefix.

    Raises:
        FabricEventsUnsupported: no EventService, the service is disabled, or it names no
            ``ServerSentEventUri``.
        FabricError: the service root or the EventService could not be read.
    """
    root = await reader.service_root()
    ref = root.get("EventService")
    uri = ref.get("@odata.id") if isinstance(ref, Mapping) else None
    if not isinstance(uri, str) or not uri:
        raise FabricEventsUnsupported("the service root has no EventService")
    response = await reader.transport.get(uri)
    body: Any = response.body
    if not isinstance(body, Mapping):
        raise FabricInvalidData(f"GET {uri}: body is not a JSON object")
    if body.get("ServiceEnabled") is False:
        raise FabricEventsUnsupported(f"{uri}: ServiceEnabled is false")
    sse = body.get("ServerSentEventUri")
    if not isinstance(sse, str) or not sse:
        raise FabricEventsUnsupported(
            f"{uri} offers no ServerSentEventUri (push subscriptions only, which need a "
            "listener the service can reach)"
        )
    filters = body.get("SSEFilterPropertiesSupported")
    if isinstance(filters, Mapping) and filters.get("RegistryPrefix") is True:
        sse += ("&" if "?" in sse else "?") + "$filter=" + quote(RESOURCE_EVENTS_FILTER)
    return sse


async def read_events(
    reader: ResourceReader, *, last_event_id: str | None, idle_timeout_s: float
) -> AsyncIterator[FabricEvent | ValueError]:
    """Open the stream, yield :data:`~app.fabric.events.OPENED` once it is open, then each
    event as it comes, or a ``ValueError`` for a message that is not a readable Event (the
    caller counts and logs it; nothing else is lost). Ends when the service ends the stream.

    Raises:
        FabricEventsUnsupported: see :func:`stream_uri`.
        FabricError: the stream could not be opened or broke (see
            :meth:`app.fabric.redfish.transport.RedfishTransport.stream_lines`).
    """
    uri = await stream_uri(reader)
    lines = reader.transport.stream_lines(
        uri, last_event_id=last_event_id, idle_timeout_s=idle_timeout_s
    )
    pending: list[str] = []
    current = last_event_id
    opened = False
    async for line in lines:
        if not opened:
            opened = True
            yield OPENED
            continue
        pending.append(line)
        if line != "":
            continue
        for message in sse_messages(pending, current):
            current = message.id
            try:
                for event in redfish_events(message):
                    yield event
            except ValueError as err:
                yield ValueError(f"event {message.id or '?'}: {err}")
        pending = []
