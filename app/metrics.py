"""Prometheus metrics, registered on a registry the caller owns (never the global one).

Each component gets a small metrics object; :class:`Metrics` builds them all on one registry so
that the admin endpoint can expose it and tests can read values without cross-talk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

NAMESPACE = "fabric_dra"


@dataclass(frozen=True)
class InventoryMetrics:
    """Metrics of the inventory sync.

    * ``syncs{backend, result}``: syncs by result (ok, failed).
    * ``sync_seconds{backend}``: wall time of a sync, listing included.
    * ``rejected{backend, kind}``: vendor items rejected, per sync that saw them.
    * ``devices{backend, state}``: devices present (``present``) and marked removed.
    * ``row_writes{backend, table}``: rows inserted, updated or marked removed.
    * ``stale{backend}``: 1 while the inventory is stale, else 0.
    * ``last_success{backend}``: Unix time of the last complete sync.
    * ``events{backend, result}``: events read from the fabric manager's stream: relevant
      (a sync was asked for), ignored (nothing the inventory holds), malformed.
    * ``events_streaming{backend}``: 1 while the event stream is open, 0 while polling only.
    """

    syncs: Counter
    sync_seconds: Histogram
    rejected: Counter
    devices: Gauge
    row_writes: Counter
    stale: Gauge
    last_success: Gauge
    events: Counter
    events_streaming: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> InventoryMetrics:
        """Register the inventory metrics on ``registry``."""
        return cls(
            syncs=Counter(
                "inventory_syncs",
                "Inventory syncs by result.",
                ["backend", "result"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            sync_seconds=Histogram(
                "inventory_sync_seconds",
                "Wall time of one inventory sync.",
                ["backend"],
                namespace=NAMESPACE,
                registry=registry,
                buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            ),
            rejected=Counter(
                "inventory_rejected",
                "Vendor items rejected by kind of problem.",
                ["backend", "kind"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            devices=Gauge(
                "inventory_devices",
                "Devices in the database by state.",
                ["backend", "state"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            row_writes=Counter(
                "inventory_row_writes",
                "Database rows written by the inventory sync.",
                ["backend", "table"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            stale=Gauge(
                "inventory_stale",
                "1 while the inventory is stale.",
                ["backend"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            last_success=Gauge(
                "inventory_last_success_timestamp_seconds",
                "Unix time of the last complete inventory sync.",
                ["backend"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            events=Counter(
                "inventory_events",
                "Events read from the fabric manager's stream, by result.",
                ["backend", "result"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            events_streaming=Gauge(
                "inventory_events_streaming",
                "1 while the fabric manager's event stream is open, 0 while only polling.",
                ["backend"],
                namespace=NAMESPACE,
                registry=registry,
            ),
        )


@dataclass(frozen=True)
class ClaimMetrics:
    """Metrics of the claim reconciler.

    * ``reconciles{result}``: claim reconciles by result (ok, requeued, error).
    * ``reconcile_seconds``: the controller's own time per reconcile (fabric calls included).
    * ``fabric_operations{operation, result}``: attach and detach calls by result.
    * ``attach_seconds``: time of one successful attach call.
    * ``reservations{state}``: active reservations by state (set by the sweep).
    * ``unmanaged_attachments``: devices the fabric reports attached with no reservation.
    * ``queue_depth``: claims waiting in the work queue.
    * ``node_from_pod``: allocations whose node had to be learnt from the consumer pod
      (binding conditions absent: pods may start before their device is attached).
    * ``drift{kind}``: attached devices the fabric no longer shows on their host: ``lost``
      (free on the fabric, or gone from it: attached again) and ``moved`` (on another host).
    * ``terminal{state}``: reservations that ended ``failed`` (attach) or ``detach-failed``.
    * ``node_reports{reason}``: Events from the node plugin (``DeviceNotPresentOnNode``)
      that made the controller sync the inventory early (app.claims.nodereports).
    """

    reconciles: Counter
    reconcile_seconds: Histogram
    fabric_operations: Counter
    attach_seconds: Histogram
    reservations: Gauge
    unmanaged_attachments: Gauge
    queue_depth: Gauge
    node_from_pod: Counter
    status_conflicts: Counter
    drift: Counter
    terminal: Counter
    node_reports: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ClaimMetrics:
        """Register the claim metrics on ``registry``."""
        fast = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
        return cls(
            reconciles=Counter(
                "claim_reconciles",
                "Claim reconciles by result.",
                ["result"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            reconcile_seconds=Histogram(
                "claim_reconcile_seconds",
                "Time of one claim reconcile.",
                namespace=NAMESPACE,
                registry=registry,
                buckets=fast,
            ),
            fabric_operations=Counter(
                "fabric_operations",
                "Attach and detach calls by result.",
                ["operation", "result"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            attach_seconds=Histogram(
                "attach_seconds",
                "Time of one successful attach call.",
                namespace=NAMESPACE,
                registry=registry,
                buckets=fast,
            ),
            reservations=Gauge(
                "reservations",
                "Active reservations by state.",
                ["state"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            unmanaged_attachments=Gauge(
                "unmanaged_attachments",
                "Devices the fabric reports attached with no reservation behind them.",
                namespace=NAMESPACE,
                registry=registry,
            ),
            queue_depth=Gauge(
                "claim_queue_depth",
                "Claims waiting in the work queue.",
                namespace=NAMESPACE,
                registry=registry,
            ),
            node_from_pod=Counter(
                "claim_node_from_pod",
                "Allocations whose node was learnt from the consumer pod (no binding "
                "conditions: pods may start before their device is attached).",
                namespace=NAMESPACE,
                registry=registry,
            ),
            status_conflicts=Counter(
                "claim_status_conflicts",
                "Claim status writes refused with 409 Conflict (re-read and written again).",
                namespace=NAMESPACE,
                registry=registry,
            ),
            drift=Counter(
                "fabric_drift",
                "Attached devices the fabric no longer showed on their host, by kind (lost: "
                "attached again; moved: on another host).",
                ["kind"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            terminal=Counter(
                "reservations_terminal",
                "Reservations that ended in a terminal state (failed: the attach; "
                "detach-failed: the detach), which only an operator clears.",
                ["state"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            node_reports=Counter(
                "node_reports",
                "Node plugin Events on a claim (a prepared device vanished from its host) "
                "that made the controller sync the inventory early, by reason.",
                ["reason"],
                namespace=NAMESPACE,
                registry=registry,
            ),
        )


class FabricRetryCollector:
    """Exposes ``fabric_retries_total{backend, reason}``: retries the fabric backend made
    inside one call (transient errors, a changed ETag, a write whose outcome was unknown).

    Args:
        source: returns the live backend (or fleet of backends), or None; each backend's
            ``retries`` (a Counter by reason) and ``name`` are read at scrape time. Backends
            without ``retries`` count nothing.
    """

    def __init__(self, source: Callable[[], Any]) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        """Yield the metric family (called by prometheus-client on every scrape)."""
        family = CounterMetricFamily(
            f"{NAMESPACE}_fabric_retries",
            "Retries the fabric backend made inside one call.",
            labels=["backend", "reason"],
        )
        backend = self.source()
        # A fleet of several fabric managers: one series per manager and reason.
        members = getattr(backend, "backends", None) or {None: backend}
        for name, member in members.items():
            label = name or getattr(member, "name", None) or getattr(member, "kind", "?")
            for reason, value in sorted((getattr(member, "retries", None) or {}).items()):
                family.add_metric([str(label), reason], value)
        yield family


@dataclass(frozen=True)
class Metrics:
    """Every metric of one fabric-dra process, on one registry."""

    registry: CollectorRegistry
    inventory: InventoryMetrics
    claims: ClaimMetrics

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        """Build all metrics on ``registry`` (a new one when None)."""
        registry = registry or CollectorRegistry()
        return cls(
            registry=registry,
            inventory=InventoryMetrics.create(registry),
            claims=ClaimMetrics.create(registry),
        )


class _Informerish(Protocol):
    """What :class:`InformerCollector` reads of an informer (see :mod:`app.kube.informer`)."""

    list_count: int
    watch_count: int
    gone_count: int
    restart_count: int

    @property
    def settings(self) -> Any: ...

    def is_healthy(self) -> bool: ...


class InformerCollector:
    """Exposes the live informers' counters at scrape time, summed by informer name.

    * ``informer_lists_total{informer}``: lists (the first one and every re-list).
    * ``informer_watches_total{informer}``: watch connections opened (a dropped watch opens
      another).
    * ``informer_expired_total{informer}``: watches answered 410 Expired (history compacted
      past our resourceVersion), each followed by a re-list.
    * ``informer_crashes_total{informer}``: informer loops that crashed and restarted.
    * ``informer_healthy{informer}``: 1 when every informer of that name is healthy.

    Args:
        source: returns the informers running now (none while this replica stands by).
    """

    def __init__(self, source: Callable[[], Iterable[_Informerish]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        """Yield the metric families (called by prometheus-client on every scrape)."""
        totals: dict[str, list[int]] = {}
        healthy: dict[str, bool] = {}
        for informer in self.source():
            name = str(informer.settings.name)
            counts = totals.setdefault(name, [0, 0, 0, 0])
            for index, value in enumerate(
                (
                    informer.list_count,
                    informer.watch_count,
                    informer.gone_count,
                    informer.restart_count,
                )
            ):
                counts[index] += value
            healthy[name] = healthy.get(name, True) and informer.is_healthy()
        families = [
            CounterMetricFamily(f"{NAMESPACE}_informer_{what}", help_text, labels=["informer"])
            for what, help_text in (
                ("lists", "Lists by informer (the first and every re-list)."),
                ("watches", "Watch connections opened by informer."),
                ("expired", "Watches answered 410 Expired by informer."),
                ("crashes", "Informer loops that crashed and restarted."),
            )
        ]
        for name, counts in sorted(totals.items()):
            for family, value in zip(families, counts, strict=True):
                family.add_metric([name], value)
        yield from families
        gauge = GaugeMetricFamily(
            f"{NAMESPACE}_informer_healthy",
            "1 when the informer is synced and its watch is working.",
            labels=["informer"],
        )
        for name, ok in sorted(healthy.items()):
            gauge.add_metric([name], 1 if ok else 0)
        yield gauge


class _Electorish(Protocol):
    """What :class:`LeaderCollector` reads of a leader elector (see :mod:`app.kube.leader`)."""

    transitions_seen: int
    lost_count: int

    @property
    def leader_identity(self) -> str | None: ...


class LeaderCollector:
    """Exposes leader election at scrape time.

    * ``leader``: 1 while this replica leads (always 1 with leader election off), else 0.
    * ``leader_transitions_total``: holder changes this replica has observed on the Lease
      (a new holder, including itself); a rate of several an hour means the leaders flap.
    * ``leader_lost_total``: times this replica lost leadership while running.

    Args:
        elector: returns the elector, or None when leader election is off.
        leading: returns True while this replica acts as leader.
    """

    def __init__(self, elector: Callable[[], _Electorish | None], leading: Callable[[], bool]):
        self.elector = elector
        self.leading = leading

    def collect(self) -> Iterator[Any]:
        """Yield the metric families (called by prometheus-client on every scrape)."""
        elector = self.elector()
        gauge = GaugeMetricFamily(
            f"{NAMESPACE}_leader", "1 while this replica is the leader, else 0."
        )
        gauge.add_metric([], 1 if self.leading() else 0)
        yield gauge
        transitions = CounterMetricFamily(
            f"{NAMESPACE}_leader_transitions",
            "Lease holder changes this replica has observed.",
        )
        transitions.add_metric([], elector.transitions_seen if elector is not None else 0)
        yield transitions
        lost = CounterMetricFamily(
            f"{NAMESPACE}_leader_lost", "Times this replica lost leadership while running."
        )
        lost.add_metric([], elector.lost_count if elector is not None else 0)
        yield lost
