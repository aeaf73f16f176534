"""What one control-plane allocation decision reads: our pools, the device classes, the nodes
and their fabric hosts, which pools reach which node, and our devices in use.

:class:`SnapshotCache` keeps the parts built from the informers between decisions and hands
out a :class:`Snapshot`. Event handlers only say what changed (:meth:`SnapshotCache.changed`);
the next snapshot rebuilds those parts and reuses the others, and the cached parts are replaced
as one immutable value, never field by field. Every await (the host map may read the database,
the in-use devices may read the journal) comes before the build, and the build awaits nothing:
an event handled while an await waits marks a part changed and is seen by the build that
follows, so a snapshot is never assembled from parts of two different moments.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from app.allocator import (
    DeviceClass,
    Node,
    Pool,
    device_class_from_json,
    gather_pools,
    node_from_json,
)
from app.allocator.model import DeviceId
from app.controlplane import plan as cp
from app.heap import HeapSettler
from app.heldfeed import HeldFeed
from app.hostmap import HostIndex, HostRef, host_ref_for_node
from app.kube.informer import Informer
from app.reservations import HeldDevice

Source = Literal["slices", "classes", "nodes", "hosts"]
SOURCES: tuple[Source, ...] = ("slices", "classes", "nodes", "hosts")
HELD_MAX_AGE_S = 2.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent view for an allocation decision.

    Attributes:
        pools: our driver's pools from the ResourceSlices, in allocation order.
        classes: device classes by name.
        class_selectors: each class's v1alpha3 ``suitableNodes`` (a core NodeSelector), for
            the classes that have one.
        in_use: our devices in use, the claims being decided left out.
        nodes: nodes by name.
        hosts: node name -> fabric host id, for the nodes that map to a host.
        reachable: node name -> the pools reaching it, in allocation order.
    """

    pools: tuple[Pool, ...]
    classes: Mapping[str, DeviceClass]
    class_selectors: Mapping[str, Mapping[str, Any]]
    in_use: Collection[DeviceId]
    nodes: Mapping[str, Node]
    hosts: Mapping[str, str]
    reachable: Mapping[str, tuple[Pool, ...]]


@dataclass(frozen=True, slots=True)
class _Parts:
    """The cached parts and the change count of each source they were built at."""

    versions: Mapping[Source, int]
    pools: tuple[Pool, ...]
    classes: Mapping[str, DeviceClass]
    class_selectors: Mapping[str, Mapping[str, Any]]
    nodes: Mapping[str, Node]
    reachable: Mapping[str, tuple[Pool, ...]]


@dataclass(frozen=True, slots=True)
class _HostMap:
    version: int
    built_at: float
    hosts: Mapping[str, str]
    # node -> the fabric manager of its host (only for hosts whose manager is known)
    managers: Mapping[str, str]


class SnapshotCache:
    """Builds :class:`Snapshot` values; see the module docstring.

    Args:
        slices, classes, nodes: the informers the parts are built from (slices in the v1
            shape).
        driver_name: our driver; only its pools are used.
        host_refs: reads every fabric host (:func:`app.inventory.queries.host_refs`).
        held: reads every device held in the journal (:meth:`app.journal.Journal.held`).
        feed: this process's journal feed, to follow held devices without a read.
        host_match, host_key: node -> fabric host rule (see :mod:`app.hostmap`).
        hosts_refresh_s: how long a host map is reused.
        answers: the answer memo; cleared whenever pools, classes or nodes are rebuilt.
        heap: told when the pools were rebuilt, and ticked at every build (see
            :class:`app.heap.HeapSettler`); None leaves the collector alone.
        now: monotonic seconds.
    """

    def __init__(
        self,
        slices: Informer,
        classes: Informer,
        nodes: Informer,
        *,
        driver_name: str,
        host_refs: Callable[[], Awaitable[Sequence[HostRef]]],
        held: Callable[[], Awaitable[list[HeldDevice]]],
        feed: HeldFeed,
        host_match: str,
        host_key: str,
        hosts_refresh_s: float,
        answers: cp.NodeAnswers,
        heap: HeapSettler | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slices = slices
        self._classes = classes
        self._nodes = nodes
        self.driver_name = driver_name
        self._host_refs = host_refs
        self._held = held
        self._feed = feed
        self.host_match = host_match
        self.host_key = host_key
        self.hosts_refresh_s = hosts_refresh_s
        self.answers = answers
        self._heap = heap
        self._now = now
        self._changes: dict[Source, int] = dict.fromkeys(SOURCES, 0)
        self._parts: _Parts | None = None
        self._host_map: _HostMap | None = None
        # Our devices in use: claims' allocations from the claim events (the controller calls
        # in_use.set_claim), the journal's held devices from its feed (see refresh_held).
        self.in_use = cp.InUse()
        self._held_version = 0
        self._held_read_at = -1e9

    def changed(self, *sources: Source) -> None:
        """Say that ``sources`` changed: the parts built from them are rebuilt next time."""
        for source in sources:
            self._changes[source] += 1

    @property
    def pools(self) -> tuple[Pool, ...] | None:
        """The pools of the last snapshot, or None before the first."""
        return self._parts.pools if self._parts is not None else None

    async def snapshot(self, exclude_uids: Collection[str]) -> Snapshot:
        """A consistent snapshot, with the devices of claims ``exclude_uids`` not in use.

        Raises:
            SQLAlchemyError: the host map or the held devices could not be read.
        """
        # The awaits come first: an event handled while one waits may mark any part changed,
        # so from here on nothing awaits and the parts are built and read as one value.
        hosts = await self.host_map()
        await self.refresh_held()
        return self.build(hosts, self.in_use.view(set(exclude_uids)))

    def build(self, hosts: Mapping[str, str], in_use: Collection[DeviceId]) -> Snapshot:
        """The snapshot from the cached parts, rebuilding those whose sources changed; awaits
        nothing (see the module docstring)."""
        old = self._parts
        versions = dict(self._changes)

        def fresh(*sources: Source) -> bool:
            return old is not None and all(old.versions[s] == versions[s] for s in sources)

        rebuilt = not fresh("slices")
        if old is not None and not rebuilt:
            pools = old.pools
        else:
            pools = gather_pools(
                s
                for s in self._slices.objects()
                if (s.get("spec") or {}).get("driver") == self.driver_name
            )
        if old is not None and fresh("classes"):
            classes, selectors = old.classes, old.class_selectors
        else:
            classes, selectors = _device_classes(self._classes.objects())
        if old is not None and fresh("nodes"):
            nodes = old.nodes
        else:
            nodes = {n.name: n for n in map(node_from_json, self._nodes.objects())}
        if old is not None and fresh("slices", "nodes") and old.reachable:
            reachable = old.reachable
        else:
            # Which pools reach which node changes only with slices or nodes: worked out once.
            reachable = {
                name: tuple(p for p in pools if p.reaches_node(node))
                for name, node in nodes.items()
            }
        if not fresh("slices", "classes", "nodes"):
            self.answers.clear()
        self._parts = _Parts(versions, pools, classes, selectors, nodes, reachable)
        if self._heap is not None:
            if rebuilt:
                self._heap.rebuilt()  # the old pools are unreachable now: freed at once
            else:
                self._heap.tick()
        return Snapshot(pools, classes, selectors, in_use, nodes, hosts, reachable)

    async def host_map(self) -> Mapping[str, str]:
        """Node name -> fabric host id, for the nodes that map to a host; reused for
        ``hosts_refresh_s`` unless nodes or hosts changed.

        Raises:
            SQLAlchemyError: the hosts could not be read.
        """
        now = self._now()
        current = self._host_map
        if (
            current is None
            or current.version != self._changes["hosts"]
            or now - current.built_at > self.hosts_refresh_s
        ):
            index = HostIndex.build(await self._host_refs(), match=self.host_match)
            # Built from the nodes as they are after the await, so a change during it is in.
            version = self._changes["hosts"]
            hosts: dict[str, str] = {}
            managers: dict[str, str] = {}
            for node in self._nodes.objects():
                host = host_ref_for_node(node, index, self.host_match, self.host_key)
                if host is not None:
                    name = str((node.get("metadata") or {}).get("name"))
                    hosts[name] = host.host_id
                    if host.backend:
                        managers[name] = host.backend
            current = self._host_map = _HostMap(version, now, hosts, managers)
        return current.hosts

    def manager_of(self, node: str) -> str | None:
        """The fabric manager of ``node``'s host as of the last :meth:`host_map`, or None
        when unknown."""
        current = self._host_map
        return None if current is None else current.managers.get(node)

    async def refresh_held(self) -> None:
        """Bring the journal's part of :attr:`in_use` up to date: from the feed of this
        process's journal writes when it has every change since the last look, else (and at
        least every ``HELD_MAX_AGE_S``: another process, the admin command say, may write the
        journal) by reading every held device. Something stale is safe: the journal's unique
        index refuses a device held meanwhile (DeviceHeld), and the context is answered again
        from a fresh read.

        Raises:
            SQLAlchemyError: the journal could not be read.
        """
        now = self._now()
        feed = self._feed
        changes = (
            None if now - self._held_read_at >= HELD_MAX_AGE_S else feed.since(self._held_version)
        )
        if changes is None:
            version = feed.version
            self.in_use.set_held(await self._held(), self.driver_name)
            self._held_version, self._held_read_at = version, now
            return
        for held, device in changes:
            if held:
                self.in_use.hold(device, self.driver_name)
            else:
                self.in_use.release(device, self.driver_name)
        self._held_version = feed.version


def _device_classes(
    objects: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, DeviceClass], dict[str, Mapping[str, Any]]]:
    """Device classes by name, and the ``suitableNodes`` selector of those that have one."""
    classes: dict[str, DeviceClass] = {}
    selectors: dict[str, Mapping[str, Any]] = {}
    for obj in objects:
        parsed = device_class_from_json(obj)
        classes[parsed.name] = parsed
        suitable = (obj.get("spec") or {}).get("suitableNodes")
        if isinstance(suitable, Mapping):
            selectors[parsed.name] = suitable
    return classes, selectors


__all__ = ["HELD_MAX_AGE_S", "SOURCES", "Snapshot", "SnapshotCache", "Source"]
