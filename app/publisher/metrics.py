"""Metrics of the ResourceSlice publisher, registered on a registry the caller owns."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.metrics import NAMESPACE


@dataclass(frozen=True)
class PublisherMetrics:
    """Metrics of the publisher.

    * ``api_writes{verb, result}``: ResourceSlice writes (create, update, delete) by result
      (``ok``, ``conflict``, ``not_found``, ``error``).
    * ``pool_sync_seconds``: seconds from a pool needing a sync (desired change or watch event)
      to the end of the sync that left it in sync.
    * ``pool_syncs{result}``: pool syncs by result (``ok``, ``retry``, ``failed``).
    * ``dropped_fields{path}``: 1 for every field path the API server dropped from our writes.
    * ``queue_depth``: pools waiting for a sync (ready, delayed or in progress).
    * ``pools``: pools in the desired state.
    * ``resyncs{result}``: full resyncs (a LIST of our slices, every pool synced) by result
      (``ok``, ``failed``).
    * ``resync_corrections``: slices a resync found wrong in the publisher's view (missing,
      outdated, or gone from the API server: a lost watch event).
    """

    api_writes: Counter
    pool_sync_seconds: Histogram
    pool_syncs: Counter
    dropped_fields: Gauge
    queue_depth: Gauge
    pools: Gauge
    resyncs: Counter
    resync_corrections: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> PublisherMetrics:
        """Register the publisher metrics on ``registry``."""
        return cls(
            api_writes=Counter(
                "publisher_api_writes",
                "ResourceSlice writes by verb and result.",
                ["verb", "result"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            pool_sync_seconds=Histogram(
                "publisher_pool_sync_seconds",
                "Seconds from a pool needing a sync to the sync that left it in sync.",
                namespace=NAMESPACE,
                registry=registry,
                buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            ),
            pool_syncs=Counter(
                "publisher_pool_syncs",
                "Pool syncs by result.",
                ["result"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            dropped_fields=Gauge(
                "publisher_dropped_fields",
                "1 for each ResourceSlice field path the API server dropped from our writes.",
                ["path"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            queue_depth=Gauge(
                "publisher_queue_depth",
                "Pools queued, delayed or being synced.",
                namespace=NAMESPACE,
                registry=registry,
            ),
            pools=Gauge(
                "publisher_pools",
                "Pools in the desired state.",
                namespace=NAMESPACE,
                registry=registry,
            ),
            resyncs=Counter(
                "publisher_resyncs",
                "Full resyncs of the ResourceSlices by result.",
                ["result"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            resync_corrections=Counter(
                "publisher_resync_corrections",
                "ResourceSlices a full resync found wrong in the publisher's view.",
                namespace=NAMESPACE,
                registry=registry,
            ),
        )
