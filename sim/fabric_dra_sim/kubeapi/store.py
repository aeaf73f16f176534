"""The object store: one global resourceVersion counter, objects per group-resource, a bounded
event history per group-resource and the open watches fed from it.

Like etcd behind kube-apiserver, every write gets the next resourceVersion. Each group-resource
keeps its own ring of recent events, as the watch cache does per resource
(k8s.io/apiserver pkg/storage/cacher/watch_cache_history.go): a watch can resume from any
version still covered by its resource's ring and gets 410 Expired otherwise ("too old resource
version: <rv> (<oldest>)"). The same ring serves the consistent snapshots of paged and exact
lists (etcd's MVCC history in k8s.io/apiserver pkg/storage/etcd3/store.go GetList), by undoing
the events newer than the snapshot's version.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

ObjectKey = tuple[str, str]  # (namespace or "", name)
GroupResource = tuple[str, str]  # (group, plural)

# k8s.io/apiserver pkg/storage/etcd3/errors.go interpretWatchError: a watch whose history
# was compacted under it.
WATCH_TOO_OLD = "The resourceVersion for the provided watch is too old."


@dataclass(frozen=True)
class StoreEvent:
    """One change: ``rv`` it produced, ``type`` ADDED/MODIFIED/DELETED, the object after the
    change (for DELETED: the last state with the new resourceVersion), ``old`` the object
    before it as the writer saw it (MODIFIED only), and ``prev`` the stored object this change
    replaced (None for ADDED), from which older snapshots are rebuilt.
    """

    rv: int
    type: str
    group_resource: GroupResource
    obj: dict[str, Any]
    old: dict[str, Any] | None
    prev: dict[str, Any] | None = None


@dataclass(frozen=True)
class WatchExpired:
    """Queued to a watcher instead of an event: end the stream with an ERROR 410 carrying
    ``message`` (a watcher that fell behind its resource's window, or an injected fault)."""

    message: str


WatchItem = StoreEvent | WatchExpired | None


@dataclass
class EventDrop:
    """Keep the next ``remaining`` events of ``group_resource`` of ``event_type`` (of the
    object ``name``, or any when None) from the live watches: they are still recorded in the
    history, so only a watch open when they happen loses them (a lost event)."""

    remaining: int
    group_resource: GroupResource
    event_type: str
    name: str | None

    def matches(self, event: StoreEvent) -> bool:
        """True when ``event`` is one this rule drops."""
        meta = event.obj.get("metadata") or {}
        return (
            event.group_resource == self.group_resource
            and event.type == self.event_type
            and (self.name is None or meta.get("name") == self.name)
        )


@dataclass(eq=False)
class Watcher:
    """An open watch: the events routed to it and how it should end.

    ``accepts`` decides which store events reach ``queue``; ``None`` in the queue ends the
    stream, a :class:`WatchExpired` ends it with an ERROR 410; ``abort`` asks the HTTP layer
    to cut the connection instead of ending it cleanly. ``expired`` is set once a
    WatchExpired was queued: nothing more is queued after it.
    """

    group_resource: GroupResource
    accepts: Callable[[StoreEvent], bool]
    queue: asyncio.Queue[WatchItem] = field(default_factory=asyncio.Queue)
    abort: bool = False
    expired: bool = False

    def expire(self, message: str = WATCH_TOO_OLD) -> None:
        """Queue the ERROR 410 end of this watch (once)."""
        if not self.expired:
            self.expired = True
            self.queue.put_nowait(WatchExpired(message))


class History:
    """The event ring of one group-resource (the watch cache's ``watchCacheHistory``).

    ``capacity`` events are kept; ``start_rv`` is the version the ring was (re)started at,
    like the watch cache's list resourceVersion. While no event was evicted, any version from
    ``start_rv`` on is resumable; after an eviction only versions from the oldest kept event
    minus one (k8s.io/apiserver pkg/storage/cacher/watch_cache_history.go GetIntervalLocked).
    ``watch_start_rv`` is where the watch cache itself restarted (an API server restart keeps
    etcd's history, and so snapshots, but loses the watch cache's).
    """

    def __init__(self, capacity: int, start_rv: int) -> None:
        self.capacity = max(1, capacity)
        self.start_rv = start_rv
        self.watch_start_rv = start_rv
        self.evicted = False
        self.events: deque[StoreEvent] = deque()

    def append(self, event: StoreEvent) -> None:
        """Keep ``event``, evicting the oldest when full."""
        self.events.append(event)
        while len(self.events) > self.capacity:
            self.events.popleft()
            self.evicted = True

    def resize(self, capacity: int) -> None:
        """Change the capacity, evicting the oldest events that no longer fit."""
        self.capacity = max(1, capacity)
        while len(self.events) > self.capacity:
            self.events.popleft()
            self.evicted = True

    @property
    def oldest_rv(self) -> int:
        """The oldest version a snapshot or list can be rebuilt at."""
        if self.evicted and self.events:
            return self.events[0].rv - 1
        return self.start_rv

    @property
    def oldest_watch_rv(self) -> int:
        """The oldest version a watch can resume from."""
        return max(self.oldest_rv, self.watch_start_rv)

    def since(self, rv: int) -> list[StoreEvent]:
        """The kept events newer than ``rv``, oldest first."""
        out: list[StoreEvent] = []
        for event in reversed(self.events):
            if event.rv <= rv:
                break
            out.append(event)
        out.reverse()
        return out


class Store:
    """In-memory objects with a global resourceVersion; not thread-safe (one event loop).

    ``history_size`` is the capacity of each group-resource's event ring (the watch cache's
    per-resource history); :meth:`set_history_size` changes it for one resource.
    """

    def __init__(self, history_size: int = 1000) -> None:
        self.history_size = history_size
        self.rv = 0
        self._base_rv = 0
        self._watch_base_rv = 0
        self._objects: dict[GroupResource, dict[ObjectKey, dict[str, Any]]] = {}
        self._histories: dict[GroupResource, History] = {}
        self._sizes: dict[GroupResource, int] = {}
        self.watchers: set[Watcher] = set()
        self.event_drops: list[EventDrop] = []

    def next_rv(self) -> int:
        """Allocate and return the next resourceVersion."""
        self.rv += 1
        return self.rv

    def get(self, gr: GroupResource, key: ObjectKey) -> dict[str, Any] | None:
        """The stored object (not a copy: callers must not mutate it) or None."""
        return self._objects.get(gr, {}).get(key)

    def items(self, gr: GroupResource) -> Iterator[tuple[ObjectKey, dict[str, Any]]]:
        """All objects of a group-resource sorted by (namespace, name)."""
        bucket = self._objects.get(gr, {})
        for key in sorted(bucket):
            yield key, bucket[key]

    def group_resources(self) -> list[GroupResource]:
        """Every group-resource that holds objects."""
        return list(self._objects)

    # -- history ------------------------------------------------------------------------
    def history(self, gr: GroupResource) -> History:
        """The event ring of ``gr`` (created, starting now, on first use)."""
        ring = self._histories.get(gr)
        if ring is None:
            ring = History(self._sizes.get(gr, self.history_size), self._base_rv)
            ring.watch_start_rv = max(self._base_rv, self._watch_base_rv)
            self._histories[gr] = ring
        return ring

    def set_history_size(self, gr: GroupResource, size: int) -> None:
        """Give ``gr`` its own ring capacity (>= 1); raises ValueError otherwise."""
        if size < 1:
            raise ValueError("history size must be at least 1")
        self._sizes[gr] = size
        self.history(gr).resize(size)

    def watch_events_since(self, gr: GroupResource, rv: int) -> list[StoreEvent] | None:
        """Events of ``gr`` after ``rv`` for a watch, or None when ``rv`` is older than the
        watch window (410 "too old resource version")."""
        ring = self.history(gr)
        if rv < ring.oldest_watch_rv:
            return None
        return ring.since(rv)

    def snapshot(
        self, gr: GroupResource, rv: int
    ) -> Iterator[tuple[ObjectKey, dict[str, Any]]] | None:
        """The objects of ``gr`` as they were at version ``rv``, sorted by key, or None when
        the history no longer reaches back that far.

        Cheap when little changed: only the keys touched after ``rv`` are looked up in the
        history (the state before the first such change wins); the rest are the stored
        objects themselves (not copies: callers must not mutate them).
        """
        ring = self.history(gr)
        if rv < ring.oldest_rv:
            return None
        changed = ring.since(rv)
        if not changed:
            return self.items(gr)
        overlay: dict[ObjectKey, dict[str, Any] | None] = {}
        for event in changed:
            key = _key_of(event.obj)
            if key not in overlay:
                overlay[key] = event.prev
        bucket = self._objects.get(gr, {})
        return self._merged(bucket, overlay)

    @staticmethod
    def _merged(
        bucket: dict[ObjectKey, dict[str, Any]],
        overlay: dict[ObjectKey, dict[str, Any] | None],
    ) -> Iterator[tuple[ObjectKey, dict[str, Any]]]:
        for key in sorted(bucket.keys() | overlay.keys()):
            obj = overlay[key] if key in overlay else bucket[key]
            if obj is not None:
                yield key, obj

    # -- writes -------------------------------------------------------------------------
    def put(
        self,
        gr: GroupResource,
        key: ObjectKey,
        obj: dict[str, Any],
        event_type: str,
        old: dict[str, Any] | None,
    ) -> None:
        """Store ``obj`` (its metadata.resourceVersion already set) and publish the event.

        Stored objects are never changed in place (every operation changes a copy and puts
        that), so the event shares them instead of copying them: a write then costs one copy
        fewer per version kept."""
        bucket = self._objects.setdefault(gr, {})
        prev = bucket.get(key)
        bucket[key] = obj
        self._publish(
            StoreEvent(
                int(obj["metadata"]["resourceVersion"]), event_type, gr, obj, old or None, prev
            )
        )

    def remove(self, gr: GroupResource, key: ObjectKey, last: dict[str, Any]) -> None:
        """Drop the object and publish DELETED with ``last`` (carrying the new version)."""
        prev = self._objects.get(gr, {}).pop(key, None)
        self._publish(
            StoreEvent(int(last["metadata"]["resourceVersion"]), "DELETED", gr, last, None, prev)
        )

    def _publish(self, event: StoreEvent) -> None:
        ring = self.history(event.group_resource)
        ring.append(event)
        if self._take_drop(event):
            return
        for watcher in list(self.watchers):
            if watcher.group_resource != event.group_resource or watcher.expired:
                continue
            if not watcher.accepts(event):
                continue
            if watcher.queue.qsize() >= ring.capacity:
                # The watcher is a whole window behind: what it has not read yet is no
                # longer in the history, so it must relist.
                watcher.expire()
                continue
            watcher.queue.put_nowait(event)

    def _take_drop(self, event: StoreEvent) -> bool:
        for rule in self.event_drops:
            if rule.matches(event):
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self.event_drops.remove(rule)
                return True
        return False

    def deliver(self, event: StoreEvent) -> int:
        """Queue ``event`` (usually an old one) to every live watcher of its resource, past
        their version filter and without recording it (a misbehaving server or proxy);
        returns how many watchers got it."""
        count = 0
        for watcher in list(self.watchers):
            if watcher.group_resource == event.group_resource and not watcher.expired:
                watcher.queue.put_nowait(event)
                count += 1
        return count

    def expire_watchers(self, gr: GroupResource | None, message: str = WATCH_TOO_OLD) -> int:
        """End every live watcher (of ``gr``, or all) with an ERROR 410; returns how many."""
        count = 0
        for watcher in list(self.watchers):
            if (gr is None or watcher.group_resource == gr) and not watcher.expired:
                watcher.expire(message)
                count += 1
        return count

    # -- resets -------------------------------------------------------------------------
    @property
    def compacted_rv(self) -> int:
        """The version every resource's history reaches back to at least."""
        return self._base_rv

    def restart_watch_cache(self) -> None:
        """An API server restart: the watch cache starts again at the current version (old
        versions get 410 on watch) while etcd's history, and the snapshots, stay."""
        for ring in self._histories.values():
            ring.watch_start_rv = self.rv
        self._watch_base_rv = self.rv

    def compact(self) -> None:
        """Forget all history: only watches and lists from the current version can resume."""
        self._histories.clear()
        self._base_rv = self._watch_base_rv = self.rv

    def clear(self) -> None:
        """Lose every object and the history but keep the counter moving forward, so that a
        client resuming from an old version is told to relist (410) rather than misled.
        """
        self._objects.clear()
        # Step past every version a client may hold, so even a watch from the very last one
        # must relist.
        self.rv += 1
        self.compact()


def _key_of(obj: dict[str, Any]) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
