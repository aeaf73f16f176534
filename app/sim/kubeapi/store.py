"""The object store: one global resourceVersion counter, objects per group-resource, a bounded
event history and the open watches fed from it.

Like etcd behind kube-apiserver, every write gets the next resourceVersion; a watch can resume
from any version still in the history window and gets 410 Expired otherwise
(k8s.io/apiserver pkg/storage/cacher: "too old resource version").
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

ObjectKey = tuple[str, str]  # (namespace or "", name)
GroupResource = tuple[str, str]  # (group, plural)


@dataclass(frozen=True)
class StoreEvent:
    """One change: ``rv`` it produced, ``type`` ADDED/MODIFIED/DELETED, the object after the
    change (for DELETED: the last state with the new resourceVersion) and the one before.
    """

    rv: int
    type: str
    group_resource: GroupResource
    obj: dict[str, Any]
    old: dict[str, Any] | None


@dataclass(eq=False)
class Watcher:
    """An open watch: the events routed to it and how it should end.

    ``accepts`` decides which store events reach ``queue``; ``None`` in the queue ends the
    stream; ``abort`` asks the HTTP layer to cut the connection instead of ending it cleanly.
    """

    group_resource: GroupResource
    accepts: Callable[[StoreEvent], bool]
    queue: asyncio.Queue[StoreEvent | None] = field(default_factory=asyncio.Queue)
    abort: bool = False


class Store:
    """In-memory objects with a global resourceVersion; not thread-safe (one event loop).

    ``history_size`` bounds the retained events; older versions are "compacted".
    """

    def __init__(self, history_size: int = 1000) -> None:
        self.history_size = history_size
        self.rv = 0
        self.compacted_rv = 0
        self._objects: dict[GroupResource, dict[ObjectKey, dict[str, Any]]] = {}
        self._history: deque[StoreEvent] = deque()
        self.watchers: set[Watcher] = set()

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

    def put(self, gr: GroupResource, key: ObjectKey, obj: dict[str, Any], event_type: str,
            old: dict[str, Any] | None) -> None:
        """Store ``obj`` (its metadata.resourceVersion already set) and publish the event.

        Stored objects are never changed in place (every operation changes a copy and puts
        that), so the event shares them instead of copying them: a write then costs one copy
        fewer per version kept."""
        self._objects.setdefault(gr, {})[key] = obj
        self._publish(StoreEvent(int(obj["metadata"]["resourceVersion"]), event_type, gr,
                                 obj, old or None))

    def remove(self, gr: GroupResource, key: ObjectKey, last: dict[str, Any]) -> None:
        """Drop the object and publish DELETED with ``last`` (carrying the new version)."""
        self._objects.get(gr, {}).pop(key, None)
        self._publish(StoreEvent(int(last["metadata"]["resourceVersion"]), "DELETED", gr,
                                 last, None))

    def _publish(self, event: StoreEvent) -> None:
        self._history.append(event)
        while len(self._history) > self.history_size:
            self.compacted_rv = self._history.popleft().rv
        for watcher in list(self.watchers):
            if watcher.group_resource == event.group_resource and watcher.accepts(event):
                watcher.queue.put_nowait(event)

    def events_since(self, gr: GroupResource, rv: int) -> list[StoreEvent] | None:
        """Events of ``gr`` after ``rv``, or None when ``rv`` is older than the history."""
        if rv < self.compacted_rv:
            return None
        return [e for e in self._history if e.rv > rv and e.group_resource == gr]

    def compact(self) -> None:
        """Forget all history: only watches from the current version can resume."""
        self._history.clear()
        self.compacted_rv = self.rv

    def clear(self) -> None:
        """Lose every object and the history but keep the counter moving forward, so that a
        client resuming from an old version is told to relist (410) rather than misled.
        """
        self._objects.clear()
        # Step past every version a client may hold, so even a watch from the very last one
        # must relist.
        self.rv += 1
        self.compact()
