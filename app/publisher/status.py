"""What the :class:`~app.publisher.publisher.Publisher` reports about itself: immutable
snapshots of the whole publisher (:class:`PublisherStatus`) and of each pool
(:class:`PoolStatus`), each with a JSON-ready form for the admin API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.jsontypes import JsonDict


@dataclass(frozen=True)
class PoolStatus:
    """What the publisher knows about one pool.

    Attributes:
        name: the pool.
        desired: True when the pool is in the desired state (False: being removed).
        generation: the highest ``pool.generation`` among its slices; None without slices.
        resource_slices: names of its slices on the API server (as last seen or written).
        devices: devices in the desired pool (0 when not desired).
        last_error: the last failed sync's error; None after a successful sync.
        dropped_paths: field paths the API server dropped from this pool's slices.
    """

    name: str
    desired: bool
    generation: int | None
    resource_slices: tuple[str, ...]
    devices: int
    last_error: str | None
    dropped_paths: tuple[str, ...]

    def to_json(self) -> JsonDict:
        """A JSON-ready dict."""
        return {
            "name": self.name,
            "desired": self.desired,
            "generation": self.generation,
            "resource_slices": list(self.resource_slices),
            "devices": self.devices,
            "last_error": self.last_error,
            "dropped_paths": list(self.dropped_paths),
        }


@dataclass(frozen=True)
class PublisherStatus:
    """A snapshot of the publisher.

    Attributes:
        synced: the informer has listed and a desired state was given (writes may happen).
        queue_depth: pools queued, delayed or being synced.
        writes: successful API writes by verb (create, update, delete) since start.
        dropped_paths: every field path the API server dropped from our writes.
        taints_dropped / binding_conditions_dropped: see
            :class:`~app.publisher.publisher.Publisher`.
        pools: pool name -> :class:`PoolStatus`, desired pools and pools with slices.
        resyncs: full resyncs (:meth:`~app.publisher.publisher.Publisher.resync`) completed
            since start.
        resync_corrections: slices those resyncs found wrong in the local view (missing,
            outdated, or gone from the API server).
    """

    synced: bool
    queue_depth: int
    writes: Mapping[str, int]
    dropped_paths: tuple[str, ...]
    taints_dropped: bool
    binding_conditions_dropped: bool
    pools: Mapping[str, PoolStatus]
    resyncs: int = 0
    resync_corrections: int = 0

    def to_json(self) -> JsonDict:
        """A JSON-ready dict."""
        return {
            "synced": self.synced,
            "queue_depth": self.queue_depth,
            "writes": dict(self.writes),
            "dropped_paths": list(self.dropped_paths),
            "taints_dropped": self.taints_dropped,
            "binding_conditions_dropped": self.binding_conditions_dropped,
            "pools": {name: pool.to_json() for name, pool in self.pools.items()},
            "resyncs": self.resyncs,
            "resync_corrections": self.resync_corrections,
        }
