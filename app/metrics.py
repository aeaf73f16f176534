"""Prometheus metrics, registered on a registry the caller owns (never the global one).

Each component gets a small metrics object; :class:`Metrics` builds them all on one registry so
that the admin endpoint can expose it and tests can read values without cross-talk.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
    """

    syncs: Counter
    sync_seconds: Histogram
    rejected: Counter
    devices: Gauge
    row_writes: Counter
    stale: Gauge
    last_success: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> InventoryMetrics:
        """Register the inventory metrics on ``registry``."""
        return cls(
            syncs=Counter(
                "inventory_syncs", "Inventory syncs by result.", ["backend", "result"],
                namespace=NAMESPACE, registry=registry,
            ),
            sync_seconds=Histogram(
                "inventory_sync_seconds", "Wall time of one inventory sync.", ["backend"],
                namespace=NAMESPACE, registry=registry,
                buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            ),
            rejected=Counter(
                "inventory_rejected", "Vendor items rejected by kind of problem.",
                ["backend", "kind"], namespace=NAMESPACE, registry=registry,
            ),
            devices=Gauge(
                "inventory_devices", "Devices in the database by state.", ["backend", "state"],
                namespace=NAMESPACE, registry=registry,
            ),
            row_writes=Counter(
                "inventory_row_writes", "Database rows written by the inventory sync.",
                ["backend", "table"], namespace=NAMESPACE, registry=registry,
            ),
            stale=Gauge(
                "inventory_stale", "1 while the inventory is stale.", ["backend"],
                namespace=NAMESPACE, registry=registry,
            ),
            last_success=Gauge(
                "inventory_last_success_timestamp_seconds",
                "Unix time of the last complete inventory sync.", ["backend"],
                namespace=NAMESPACE, registry=registry,
            ),
        )


@dataclass(frozen=True)
class Metrics:
    """Every metric of one fabric-dra process, on one registry."""

    registry: CollectorRegistry
    inventory: InventoryMetrics

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        """Build all metrics on ``registry`` (a new one when None)."""
        registry = registry or CollectorRegistry()
        return cls(registry=registry, inventory=InventoryMetrics.create(registry))
