"""The node plugin's reports: a prepared device vanished from its host, so check drift now.

The node plugin (``app/node/plugin.py``, ``app/node/agent.py``) writes a core/v1 Event on the
ResourceClaim when a device it prepared disappears from the host: reason
``DeviceNotPresentOnNode``, type Warning, ``reportingComponent`` and ``source.component``
``fabric-dra-node``. The host losing a device usually means the fabric detached it behind the
controller's back, which the drift check (:mod:`app.claims.drift`) finds only after the next
complete inventory sync, a whole poll interval later. While leading, the controller watches
those Events and asks the inventory loop for a sync at once, so the drift check runs within
seconds of the node noticing.

* :func:`judge` (pure) decides whether one watch event is such a report: the initial list,
  deletions, other reasons, other reporters, Events not about a ResourceClaim, updates that are
  no new occurrence and Events older than the watch's start are not; malformed ones are named.
* :class:`TriggerGate` (pure) rate-limits the syncs the reports ask for: at most one per
  ``min_interval_s``; reports that arrive while a sync is pending join it, so a burst of
  reports (one per device after a fabric manager reset) costs one sync.
* :class:`NodeReportWatch` is the I/O part: an informer on core/v1 Events in every namespace
  with the field selector ``reason=DeviceNotPresentOnNode`` (a selectable field of Events:
  k8s.io/kubernetes pkg/registry/core/event/strategy.go ``ToSelectableFields``; its
  ``reportingComponent`` field is checked here rather than in the selector, which older API
  servers do not accept), the gate, the log line and ``node_reports{reason}``.

A report only starts a sync: whether the device is lost (or moved) is the fabric's answer, read
by the sync and judged by the drift check as for any other sync.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from app.aio import cancel_and_wait
from app.clock import utcnow

if TYPE_CHECKING:  # I/O modules: the pure part (judge, TriggerGate) must load without them
    from app.kube.client import KubeClient
    from app.kube.informer import Informer, InformerSettings
    from app.metrics import ClaimMetrics

log = logging.getLogger(__name__)

NODE_COMPONENT = "fabric-dra-node"
"""``reportingComponent`` of the node plugin's Events (``EVENT_COMPONENT`` in app/node/agent.py)."""
DEVICE_NOT_PRESENT = "DeviceNotPresentOnNode"
"""Reason of the node plugin's Event when a prepared device vanished (app/node/plugin.py)."""
FIELD_SELECTOR = f"reason={DEVICE_NOT_PRESENT}"
"""The watch's field selector (``reason`` is selectable on core/v1 Events in every release)."""

# Timestamps of a core/v1 Event, newest occurrence first in meaning; the newest value counts.
_TIME_FIELDS: tuple[tuple[str, ...], ...] = (
    ("lastTimestamp",),
    ("eventTime",),
    ("series", "lastObservedTime"),
    ("firstTimestamp",),
    ("metadata", "creationTimestamp"),
)


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One node report the controller acts on.

    Attributes:
        event: the Event's ``namespace/name``.
        reason: the Event's reason (``DeviceNotPresentOnNode``).
        namespace, claim, claim_uid: the ResourceClaim it is about (uid may be "").
        node: the reporting node (``source.host``, else ``reportingInstance``; may be "").
        message: the Event's message (which device, what the host saw).
        at: the newest of the Event's timestamps (aware UTC), or None when it has none.
    """

    event: str
    reason: str
    namespace: str
    claim: str
    claim_uid: str
    node: str
    message: str
    at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class Skip:
    """A watch event that is no report to act on.

    Attributes:
        why: one line naming the Event and the reason it is skipped.
        malformed: the Event itself is bad (logged as a warning); otherwise it is simply
            not ours or not new (logged at debug level).
    """

    why: str
    malformed: bool = False


class _Malformed(ValueError):
    """A field of the Event that cannot be read; the message names it."""


def _text(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def _path(obj: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    current: Any = obj
    for key in path:
        if not isinstance(current, Mapping):
            return None
        current = current.get(key)
    return current


def parse_time(value: Any, field: str) -> dt.datetime | None:
    """Parse one Event timestamp.

    Args:
        value: an RFC 3339 string (``2026-01-02T03:04:05Z``, or a MicroTime with a fraction)
            or None / "" (absent).
        field: the field's dotted name, for the error.

    Returns:
        An aware UTC datetime, or None when absent.

    Raises:
        ValueError: not an RFC 3339 time with a zone, naming ``field`` and the value.
    """
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _Malformed(f"{field} {value!r} is not a string")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError as err:
        raise _Malformed(f"{field} {value!r} is not an RFC 3339 time") from err
    if parsed.tzinfo is None:
        raise _Malformed(f"{field} {value!r} has no time zone")
    return parsed.astimezone(dt.UTC)


def event_time(event: Mapping[str, Any]) -> dt.datetime | None:
    """The newest of the Event's timestamps (``lastTimestamp``, ``eventTime``,
    ``series.lastObservedTime``, ``firstTimestamp``, ``metadata.creationTimestamp``), aware UTC;
    None when it has none.

    Raises:
        ValueError: one of them is present but malformed (the message names it).
    """
    found = [parse_time(_path(event, path), ".".join(path)) for path in _TIME_FIELDS]
    present = [t for t in found if t is not None]
    return max(present) if present else None


def _occurrence(event: Mapping[str, Any]) -> tuple[Any, ...]:
    """What changes when the same Event records a new occurrence (count, last time, series)."""
    series = event.get("series")
    series_count = series.get("count") if isinstance(series, Mapping) else None
    return (event.get("count"), event.get("lastTimestamp"), event.get("eventTime"), series_count)


def _name_of(event: Mapping[str, Any]) -> str:
    metadata = event.get("metadata")
    if not isinstance(metadata, Mapping):
        return "?/?"
    return f"{_text(metadata, 'namespace') or '?'}/{_text(metadata, 'name') or '?'}"


def judge(
    event_type: str,
    event: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    *,
    since: dt.datetime,
    initial: bool,
    clock_skew_s: float = 30.0,
) -> NodeReport | Skip:
    """Decide whether one watch event of a core/v1 Event is a node report to act on.

    Args:
        event_type: ``ADDED``, ``MODIFIED`` or ``DELETED`` (as the informer delivers them).
        event: the Event (core/v1 JSON).
        old: the cached Event before a ``MODIFIED``; None otherwise.
        since: when the watch started (aware UTC); older Events are history.
        initial: the event comes from the informer's first list (history, never acted on).
        clock_skew_s: how far the reporting node's clock (and the second-precision timestamps)
            may lag ours before an Event counts as older than ``since``, seconds (>= 0).

    Returns:
        A :class:`NodeReport`, or a :class:`Skip` saying why not (``malformed`` for an Event
        whose involvedObject or timestamps cannot be read). Never raises on bad input.
    """
    name = _name_of(event)
    if initial:
        return Skip(f"event {name}: listed at start (history)")
    if event_type not in ("ADDED", "MODIFIED"):
        return Skip(f"event {name}: {event_type.lower()}")
    reason = _text(event, "reason")
    if reason != DEVICE_NOT_PRESENT:
        return Skip(f"event {name}: reason {reason!r} is not {DEVICE_NOT_PRESENT}")
    component = _text(event, "reportingComponent")
    if component != NODE_COMPONENT:
        return Skip(f"event {name}: reported by {component or 'nobody'!r}, not {NODE_COMPONENT}")
    involved = event.get("involvedObject")
    if not isinstance(involved, Mapping):
        return Skip(f"event {name}: involvedObject is not an object", malformed=True)
    kind = _text(involved, "kind")
    if kind != "ResourceClaim":
        return Skip(f"event {name}: about a {kind or 'nameless kind'}, not a ResourceClaim")
    claim = _text(involved, "name")
    if not claim:
        return Skip(f"event {name}: involvedObject has no name", malformed=True)
    if event_type == "MODIFIED" and old is not None and _occurrence(old) == _occurrence(event):
        return Skip(f"event {name}: updated without a new occurrence")
    try:
        at = event_time(event)
    except ValueError as err:
        return Skip(f"event {name}: {err}", malformed=True)
    if at is not None and at < since - dt.timedelta(seconds=clock_skew_s):
        return Skip(f"event {name}: from {at.isoformat()}, before the watch started")
    source = event.get("source")
    node = _text(source, "host") if isinstance(source, Mapping) else ""
    return NodeReport(
        event=name,
        reason=reason,
        namespace=_text(involved, "namespace") or name.split("/", 1)[0],
        claim=claim,
        claim_uid=_text(involved, "uid"),
        node=node or _text(event, "reportingInstance"),
        message=_text(event, "message"),
        at=at,
    )


class TriggerGate:
    """At most one triggered sync per ``min_interval_s``; reports in between join the pending one.

    Times are monotonic seconds. Use: ``at = gate.offer(now)``; when ``at`` is not None, fire at
    monotonic time ``at`` (or later) by calling :meth:`fire` and then the trigger; when it is
    None a sync is already pending and the report joins it.

    Args:
        min_interval_s: the least time between two fires, seconds (> 0).
        gather_s: how long the first report of a burst waits for the rest, seconds (>= 0),
            so a burst that arrives within it costs one sync.

    Raises:
        ValueError: a setting out of range (named in the message).
    """

    def __init__(self, min_interval_s: float = 5.0, gather_s: float = 0.5) -> None:
        if not min_interval_s > 0:
            raise ValueError(f"min_interval_s must be > 0, not {min_interval_s}")
        if not gather_s >= 0:
            raise ValueError(f"gather_s must be >= 0, not {gather_s}")
        self.min_interval_s = min_interval_s
        self.gather_s = gather_s
        self.last_fired: float | None = None
        self.pending_at: float | None = None

    def offer(self, now: float) -> float | None:
        """Record one report at ``now``.

        Returns:
            When to fire (``>= now``), or None when a fire is already pending (this report
            joins it).
        """
        if self.pending_at is not None:
            return None
        at = now + self.gather_s
        if self.last_fired is not None:
            at = max(at, self.last_fired + self.min_interval_s)
        self.pending_at = at
        return at

    def fire(self, now: float) -> None:
        """Record that the pending fire happened at ``now``; later reports start a new one."""
        self.last_fired = now
        self.pending_at = None


@dataclass(frozen=True)
class NodeReportSettings:
    """Settings of :class:`NodeReportWatch`.

    Attributes:
        min_interval_s: at most one triggered sync per this many seconds (> 0).
        gather_s: the first report of a burst waits this long for the rest, seconds (>= 0).
        clock_skew_s: see :func:`judge` (>= 0).
        informer: the Event informer's settings; None for the defaults. Its name, namespace
            (all) and field selector are set by the watch.
    """

    min_interval_s: float = 5.0
    gather_s: float = 0.5
    clock_skew_s: float = 30.0
    informer: InformerSettings | None = None

    def __post_init__(self) -> None:
        if not self.min_interval_s > 0:
            raise ValueError(f"node reports: min_interval_s must be > 0, not {self.min_interval_s}")
        if not self.gather_s >= 0:
            raise ValueError(f"node reports: gather_s must be >= 0, not {self.gather_s}")
        if not self.clock_skew_s >= 0:
            raise ValueError(f"node reports: clock_skew_s must be >= 0, not {self.clock_skew_s}")


class NodeReportWatch:
    """Watches the node plugin's ``DeviceNotPresentOnNode`` Events and triggers inventory syncs.

    Args:
        kube: the Kubernetes client (needs list and watch on core/v1 events, all namespaces).
        trigger: asks the inventory loop for a sync now (``InventorySync.trigger``); it must
            not block.
        settings: see :class:`NodeReportSettings`.
        metrics: ``node_reports{reason}`` is counted per report acted on.
        clock: aware UTC now (the watch's start, against the Events' timestamps).
        now, sleep: monotonic seconds and async sleep, for the rate limit.

    Use: ``await start()`` (returns at once; the informer syncs in the background),
    ``await stop()``. :attr:`reports` counts the reports acted on, :attr:`triggered` the
    syncs asked for.
    """

    def __init__(
        self,
        kube: KubeClient,
        trigger: Callable[[], None],
        settings: NodeReportSettings | None = None,
        *,
        metrics: ClaimMetrics | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        # Imported here so that importing this module (judge, TriggerGate) loads no I/O library.
        from kubernetes_asyncio.client import CoreV1Api

        from app.kube.informer import Informer, InformerSettings

        self.settings = settings or NodeReportSettings()
        self.trigger = trigger
        self.metrics = metrics
        self.clock = clock
        self.now = now
        self.sleep = sleep
        self.gate = TriggerGate(self.settings.min_interval_s, self.settings.gather_s)
        base = self.settings.informer or InformerSettings(name="node-reports")
        self.events: Informer = Informer(
            CoreV1Api(kube.api).list_event_for_all_namespaces,
            replace(base, name="node-reports", namespace=None, field_selector=FIELD_SELECTOR),
        )
        self.events.add_handler(self._on_event)
        self.since = self.clock()
        self.reports = 0
        self.triggered = 0
        self.last_report: NodeReport | None = None
        self._fire_task: asyncio.Task[None] | None = None

    def informers(self) -> list[Informer]:
        """The informer, for the informer metrics."""
        return [self.events]

    async def start(self) -> None:
        """Start watching; Events before now are history."""
        self.since = self.clock()
        self.events.start()

    async def stop(self) -> None:
        """Stop the informer and drop a pending trigger (a stopped leader syncs nothing)."""
        await self.events.stop()
        task, self._fire_task = self._fire_task, None
        await cancel_and_wait(task)

    async def _on_event(
        self, event_type: str, event: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        # The first list runs the handlers before has_synced is set: that is history.
        verdict = judge(
            event_type,
            event,
            old,
            since=self.since,
            initial=not self.events.has_synced.is_set(),
            clock_skew_s=self.settings.clock_skew_s,
        )
        if isinstance(verdict, Skip):
            if verdict.malformed:
                log.warning("node report ignored: %s", verdict.why)
            else:
                log.debug("node report ignored: %s", verdict.why)
            return
        self.reports += 1
        self.last_report = verdict
        if self.metrics is not None:
            self.metrics.node_reports.labels(verdict.reason).inc()
        log.warning(
            "node %s reports a device of claim %s/%s gone from the host (%s): syncing the "
            "inventory to check drift",
            verdict.node or "?",
            verdict.namespace,
            verdict.claim,
            verdict.message or verdict.reason,
        )
        at = self.gate.offer(self.now())
        if at is not None:
            self._fire_task = asyncio.create_task(self._fire_at(at), name="node-report-trigger")

    async def _fire_at(self, at: float) -> None:
        delay = at - self.now()
        if delay > 0:
            await self.sleep(delay)
        self.gate.fire(self.now())
        self.triggered += 1
        self.trigger()


__all__ = [
    "DEVICE_NOT_PRESENT",
    "FIELD_SELECTOR",
    "NODE_COMPONENT",
    "NodeReport",
    "NodeReportSettings",
    "NodeReportWatch",
    "Skip",
    "TriggerGate",
    "event_time",
    "judge",
    "parse_time",
]
