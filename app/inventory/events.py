"""Event-driven inventory: follow the fabric manager's event stream and sync at once when it
reports a change, with polling kept as the safety net.

The watcher opens the backend's stream (Redfish server-sent events) and, for every event that
can change the inventory, asks the inventory loop for a sync now
(:meth:`app.inventory.sync.InventorySync.trigger`). Triggers coalesce: a flood of events while
a sync runs makes one more sync, not one per event, so the work stays bounded. After every
(re)connect a sync is asked for too, since events may have been missed while the stream was
down. A malformed event is counted and logged and changes nothing.

The stream is opened again after a failure with exponential backoff and ``Last-Event-ID``. A
service without a stream, or a stream that keeps failing, leaves the inventory on polling:
visibly, with one log line, the ``fabric_dra_inventory_events_*`` metrics and the status API
(:meth:`EventWatcher.status`). While the stream is healthy, the inventory loop polls at the
longer ``inventory.events_poll_interval_seconds``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.fabric.errors import FabricError, FabricEventsUnsupported, FabricNotFound
from app.fabric.events import OPENED, FabricEvent

log = logging.getLogger(__name__)

#: Watcher states, as the status API and the ``fabric_dra_inventory_events_streaming`` gauge
#: show them.
STREAMING = "streaming"
CONNECTING = "connecting"
POLLING = "polling"  # no stream (unsupported, or failing): the inventory is polled
OFF = "off"  # inventory.events is false

#: Failed opens in a row after which the watcher says it is polling (it keeps trying).
FAILURES_BEFORE_POLLING = 3
#: How often a service that offers no stream is asked again (it may be upgraded).
UNSUPPORTED_RETRY_S = 600.0


class EventSource(Protocol):
    """What the watcher needs of a backend: :meth:`RedfishBackend.events
    <app.fabric.redfish.backend.RedfishBackend.events>`."""

    def events(
        self, *, last_event_id: str | None, idle_timeout_s: float
    ) -> AsyncIterator[FabricEvent | ValueError]: ...


@dataclass
class EventWatcher:
    """Follows one backend's event stream and triggers inventory syncs.

    Args:
        backend: the fabric backend (one without an ``events`` method is polled).
        trigger: asks the inventory loop for a full sync now (coalescing): after every
            connect, and for each relevant event when ``on_event`` is None.
        kind: the backend's kind, for logs and metrics.
        idle_timeout_s: seconds of silence after which the stream is opened again.
        backoff_s: (first, largest) wait between failed opens, in seconds; doubled each time,
            with jitter.
        metrics: the inventory metrics' ``events`` counter and ``events_streaming`` gauge, or
            None.
        sleep: injected in tests.
    """

    backend: Any
    trigger: Callable[[], None]
    kind: str
    idle_timeout_s: float = 600.0
    backoff_s: tuple[float, float] = (1.0, 60.0)
    metrics: Any = None
    sleep: Callable[[float], Any] = asyncio.sleep
    #: Takes each relevant event (an :class:`EventApplier`'s ``offer``); None: a full sync
    #: is asked for on each.
    on_event: Callable[[FabricEvent], None] | None = None
    state: str = CONNECTING
    events: int = 0
    relevant: int = 0
    malformed: int = 0
    connects: int = 0
    failures_in_a_row: int = 0
    last_event_id: str | None = None
    last_event_at: float | None = None
    last_error: str | None = None
    _said_polling: bool = field(default=False, repr=False)
    #: Set once the first open has succeeded or failed: a sync that begins listing after
    #: it covers what the stream may have missed until then.
    tried: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def healthy(self) -> bool:
        """True while the stream is open: the inventory loop may poll less often."""
        return self.state == STREAMING

    def status(self) -> dict[str, Any]:
        """JSON-ready state for the status API."""
        return {
            "backend": self.kind,
            "state": self.state,
            "events": self.events,
            "relevant": self.relevant,
            "malformed": self.malformed,
            "connects": self.connects,
            "last_event_id": self.last_event_id,
            "last_event_at": (
                None
                if self.last_event_at is None
                else dt.datetime.fromtimestamp(self.last_event_at, dt.UTC).isoformat()
            ),
            "last_error": self.last_error,
        }

    async def run(self) -> None:
        """Follow the stream until cancelled. Never raises for a fabric error."""
        if not callable(getattr(self.backend, "events", None)):
            self._polling(f"backend {self.kind} has no event stream")
            await asyncio.Event().wait()
        attempt = 0
        while True:
            if self.failures_in_a_row < FAILURES_BEFORE_POLLING:
                self._set_state(CONNECTING)
            try:
                delivered = await self._follow()
                self.tried.set()
                self.last_error = "the service ended the stream"
                if delivered:
                    # Open it again at once (and resync, as after every connect).
                    attempt = 0
                    continue
                # Ended before any event: back off, as after a failure, so that a service
                # closing every stream at once is not asked again in a tight loop.
                attempt += 1
                await self.sleep(self._backoff(attempt))
            except FabricEventsUnsupported as err:
                self._polling(str(err))
                await self.sleep(UNSUPPORTED_RETRY_S)
                continue
            except FabricError as err:
                self.tried.set()
                self.failures_in_a_row += 1
                self.last_error = str(err)
                attempt += 1
                if self.failures_in_a_row >= FAILURES_BEFORE_POLLING:
                    self._polling(f"the event stream keeps failing: {err}")
                else:
                    log.info("inventory events of %s: %s; opening again", self.kind, err)
                await self.sleep(self._backoff(attempt))

    def _backoff(self, attempt: int) -> float:
        """Seconds to wait before open number ``attempt + 1``: doubling from the first
        backoff up to the largest, with up to half as much again of jitter."""
        first, most = self.backoff_s
        step: float = min(first * 2.0 ** min(attempt - 1, 20), most)
        return step + random.uniform(0, step / 2)

    async def _follow(self) -> bool:
        """Read the stream until it ends; True when it delivered at least one event."""
        stream = self.backend.events(
            last_event_id=self.last_event_id, idle_timeout_s=self.idle_timeout_s
        )
        opened = delivered = False
        async for item in stream:
            if item is OPENED:
                opened = True
                self._opened()
                continue
            if not opened:  # a backend that does not say when it opens
                opened = True
                self._opened()
            delivered = True
            self._take(item)
        return delivered

    def _opened(self) -> None:
        self.connects += 1
        self.failures_in_a_row = 0
        self.last_error = None
        if self.state != STREAMING:
            log.info("inventory events of %s: streaming (full polls less often)", self.kind)
        self._said_polling = False
        self._set_state(STREAMING)
        # Events may have been missed while the stream was down: sync once now.
        self.trigger()
        self.tried.set()

    def _take(self, item: FabricEvent | ValueError) -> None:
        self.events += 1
        self.last_event_at = time.time()
        if isinstance(item, ValueError):
            self.malformed += 1
            self._count("malformed")
            if self.malformed == 1 or self.malformed % 100 == 0:
                log.warning(
                    "inventory events of %s: malformed event ignored (%d so far): %s",
                    self.kind,
                    self.malformed,
                    item,
                )
            return
        if item.event_id is not None:
            self.last_event_id = item.event_id
        if not item.relevant:
            self._count("ignored")
            return
        self.relevant += 1
        self._count("relevant")
        if self.on_event is not None:
            self.on_event(item)
        else:
            self.trigger()

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.events.labels(self.kind, result).inc()

    def _set_state(self, state: str) -> None:
        if self.state == STREAMING and state != STREAMING:
            # The loop may be waiting out the long interval: poll now, then at the short one.
            self.trigger()
        self.state = state
        if self.metrics is not None:
            self.metrics.events_streaming.labels(self.kind).set(1 if state == STREAMING else 0)

    def _polling(self, why: str) -> None:
        self.tried.set()
        self.last_error = why
        self._set_state(POLLING)
        if not self._said_polling:
            self._said_polling = True
            log.warning("inventory of %s: no event stream (%s); polling instead", self.kind, why)


@dataclass
class EventApplier:
    """Applies events one resource at a time: the resource an event names is read again on
    its own and only its change is written, with the rules of the full sync
    (:meth:`InventorySync.apply_unit <app.inventory.sync.InventorySync.apply_unit>`).

    * A device or a block: the block (its attach unit) is read again; its devices are added,
      changed or removed.
    * A System: the blocks it holds now are compared with the blocks the database says it
      holds; each block that differs is read again.
    * Anything else (an unknown resource, a block that does not say who holds it, a read
      that fails, a backend without single reads, more than ``max_batch`` resources at
      once): a full sync is asked for instead.
    * A device whose holder changed (attached or detached by someone else): applied, and a
      full sync follows, whose drift check compares the journal with the fabric.

    Events are coalesced per resource: a flood about one block reads it once per pass.

    Args:
        inventory: the sync to apply units with (and whose database is read).
        backend: the fabric backend (``read_unit``, ``read_host_units``).
        on_change: awaited with the time the pass began and the attach units it wrote, after
            a pass that wrote something (publish those units' pools, recompute).
        full_sync: asks the inventory loop for a full sync.
        max_batch: resources in one pass above which a full sync is cheaper.
    """

    inventory: Any
    backend: Any
    on_change: Callable[[dt.datetime, frozenset[str]], Awaitable[None]]
    full_sync: Callable[[], None]
    max_batch: int = 256
    applied: int = 0
    fallbacks: int = 0
    unknown: int = 0
    row_writes: int = 0
    _pending: dict[str, FabricEvent] = field(default_factory=dict, repr=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _running: bool = field(default=False, repr=False)

    @property
    def idle(self) -> bool:
        """True when nothing is waiting or being applied."""
        return not self._pending and not self._running

    def offer(self, event: FabricEvent) -> None:
        """Take a relevant event; it is applied by :meth:`run`."""
        if event.origin is None:
            self._fallback()
            return
        self._pending[event.origin] = event
        self._wake.set()

    async def run(self) -> None:
        """Apply what is offered, pass by pass, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, {}
            if len(batch) > self.max_batch:
                self._fallback()
                continue
            wrote = 0
            units: set[str] = set()
            began = dt.datetime.now(dt.UTC)
            self._running = True
            try:
                for origin, event in batch.items():
                    try:
                        wrote += await self._apply(origin, event, units)
                    except FabricError as err:
                        log.info("inventory event about %s: %s; a full sync follows", origin, err)
                        self._fallback()
                if wrote:
                    await self.on_change(began, frozenset(units))
            finally:
                self._running = False
                self.row_writes += wrote

    async def _apply(self, origin: str, event: FabricEvent, written: set[str]) -> int:
        units = await self._units_for(origin, event)
        if units is None:
            self._fallback()
            return 0
        wrote = 0
        for unit in units:
            listed_from = dt.datetime.now(dt.UTC)
            read = await self.backend.read_unit(unit)
            if read is None:
                self._fallback()
                return wrote
            result = await self.inventory.apply_unit(read, listed_from)
            self.applied += 1
            wrote += result.row_writes
            if result.row_writes:
                written.add(unit)
            if result.holders_changed:
                # Someone attached or detached behind our back: the full sync's drift check
                # compares the journal with the fabric, with the listing time its rule needs.
                self._fallback()
        return wrote

    async def _units_for(self, origin: str, event: FabricEvent) -> list[str] | None:
        """The attach units to read again for an event about ``origin``; None: only a full
        sync will do."""
        if not callable(getattr(self.backend, "read_unit", None)):
            return None
        from app.inventory.queries import unit_of, units_held_by

        unit = await unit_of(self.inventory.db, self.backend.name, origin)
        if unit is not None:
            return [unit]
        if event.message == "ResourceCreated":
            return [origin]  # a new block, perhaps: read_unit says None if it is not one
        if callable(getattr(self.backend, "read_host_units", None)):
            try:
                host = await self.backend.read_host_units(origin)
            except FabricNotFound:
                if event.message == "ResourceRemoved":
                    return None  # a System gone: the full sync marks it removed
                # Nothing we hold, and gone or never there: nothing to do.
                self.unknown += 1
                return []
            if host is not None:
                host_id, now_held = host
                before = await units_held_by(self.inventory.db, self.backend.name, host_id)
                return sorted(set(now_held) ^ set(before))
        return None

    def _fallback(self) -> None:
        self.fallbacks += 1
        self.full_sync()
