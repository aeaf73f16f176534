"""The publisher's local view of our driver's ResourceSlices: what the informer saw and what our
own writes returned, by slice name, as the small :class:`~app.publisher.plan.ExistingSlice`
records the plan needs. Pure: no I/O, the :class:`~app.publisher.publisher.Publisher` feeds it.

Our own writes are kept at once (like client-go's mutation cache), so the watch echo of a write
is recognised by its resourceVersion and neither re-queues the pool nor makes a later sync work
from a stale copy. resourceVersions are compared as integers, as client-go's
``IntegerResourceVersionMutationCache`` does; one that is not an integer never wins a
comparison.

Two bounded records keep late news from undoing what is known:

* **tombstones**: the names we deleted, with the resourceVersion deleted, until the watch
  delivers the DELETED: an event of the slice from before our delete is not stored again;
* **deleted-at**: the resourceVersion each name was last seen deleted at (watch or resync).
  The watch may deliver ADDED and DELETED before a create's answer arrives: an answer, a read
  or an event not newer than the deletion is not stored, so the deletion is not hidden and the
  pool is synced again (the slice is recreated).

:meth:`SliceView.correct` makes the view agree with a fresh list (the publisher's periodic
resync), leaving alone what was written or seen after the list was served.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from app.jsontypes import JsonDict
from app.publisher.plan import ExistingSlice, existing_slice

CONTENT_KEY = "fabric-dra.io/contentKey"
"""Where a slim cached slice (the publisher's informer converter) keeps its content key."""
MAX_NAMES = 10_000
"""Names kept in each of the tombstones and the deleted-at record; the oldest go first."""


def parse_resource_version(value: object) -> int | None:
    """``value`` (a resourceVersion) as an integer; None when absent or not an integer."""
    try:
        return int(str(value))
    except ValueError:
        return None


def resource_version_of(obj: Mapping[str, Any]) -> int | None:
    """``metadata.resourceVersion`` of ``obj`` as an integer, or None (see
    :func:`parse_resource_version`)."""
    return parse_resource_version((obj.get("metadata") or {}).get("resourceVersion"))


def slice_name(obj: Mapping[str, Any]) -> str:
    """``metadata.name`` of a ResourceSlice; "" when missing."""
    return str((obj.get("metadata") or {}).get("name") or "")


def pool_of(obj: Mapping[str, Any]) -> str:
    """``spec.pool.name`` of a ResourceSlice; "" when missing."""
    return str(((obj.get("spec") or {}).get("pool") or {}).get("name") or "")


class SliceView:
    """The slices of ``driver_name`` as last seen or written, by name and by pool.

    Args:
        driver_name: our DRA driver (see :func:`~app.publisher.plan.existing_slice`).
        max_names: bound of the tombstones and of the deleted-at record (>= 1).
    """

    def __init__(self, driver_name: str, max_names: int = MAX_NAMES) -> None:
        self.driver_name = driver_name
        self._max_names = max_names
        self._slices: dict[str, ExistingSlice] = {}
        self._by_pool: dict[str, set[str]] = {}
        # Our deletes not yet seen by the watch: name -> resourceVersion deleted (or None).
        self._tombstones: dict[str, int | None] = {}
        # The resourceVersion each name was last seen deleted at, oldest first.
        self._deleted_at: dict[str, int] = {}
        # Highest generation seen per pool in this run (see plan_pool's floor_generation).
        self._generations: dict[str, int] = {}

    # ----------------------------------------------------------------- reading
    def get(self, name: str) -> ExistingSlice | None:
        """The record of slice ``name``, or None."""
        return self._slices.get(name)

    def names(self, pool_name: str) -> list[str]:
        """The names of ``pool_name``'s slices, sorted."""
        return sorted(self._by_pool.get(pool_name, ()))

    def existing(self, pool_name: str) -> list[ExistingSlice]:
        """The records of ``pool_name``'s slices, by name: what the plan gathers."""
        return [self._slices[name] for name in self.names(pool_name)]

    def pools_with_slices(self) -> set[str]:
        """Every pool that has at least one slice in the view."""
        return {pool for pool, names in self._by_pool.items() if names}

    def has_slices(self, pool_name: str) -> bool:
        """True when ``pool_name`` has at least one slice in the view."""
        return bool(self._by_pool.get(pool_name))

    def floor_generation(self, pool_name: str) -> int | None:
        """The highest ``pool.generation`` seen for ``pool_name`` in this run, or None."""
        return self._generations.get(pool_name)

    def discard_pool(self, pool_name: str) -> None:
        """Forget an empty pool's index entry (a pool gone from the desired state and the
        server)."""
        if not self._by_pool.get(pool_name):
            self._by_pool.pop(pool_name, None)

    # ----------------------------------------------------------------- changes
    def store(self, obj: JsonDict, key: str | None = None) -> None:
        """Keep slim slice ``obj`` (v1 shape), with content key ``key`` (default: the one
        under :data:`CONTENT_KEY` in its spec)."""
        if key is None:
            found = (obj.get("spec") or {}).get(CONTENT_KEY)
            key = found if isinstance(found, str) else None
        record = existing_slice(obj, self.driver_name, key)
        name, pool_name = record.name, record.pool_name
        old = self._slices.get(name)
        if old is not None and old.pool_name != pool_name:
            self._by_pool.get(old.pool_name, set()).discard(name)
        self._slices[name] = record
        self._by_pool.setdefault(pool_name, set()).add(name)
        if record.generation > self._generations.get(pool_name, -1):
            self._generations[pool_name] = record.generation

    def forget(self, name: str, resource_version: int | None, *, tombstone: bool) -> None:
        """Drop slice ``name``; with ``tombstone``, it was deleted by us (at
        ``resource_version``, if known) or found gone by our read."""
        old = self._slices.pop(name, None)
        if old is not None:
            self._by_pool.get(old.pool_name, set()).discard(name)
        if tombstone:
            if len(self._tombstones) >= self._max_names:
                del self._tombstones[next(iter(self._tombstones))]
            self._tombstones[name] = resource_version

    def on_event(
        self, event_type: Literal["ADDED", "MODIFIED", "DELETED"], obj: JsonDict
    ) -> list[str]:
        """Take a watch event of slim slice ``obj``.

        Returns:
            The pools to sync, in order: a slice someone else changed or deleted (not the
            echo of our own write or delete, nor an event from before a deletion seen).
        """
        name = slice_name(obj)
        if event_type == "DELETED":
            self._note_deleted(name, resource_version_of(obj))
            ours = name in self._tombstones
            self._tombstones.pop(name, None)
            current = self._slices.get(name)
            if current is not None:
                self.forget(name, None, tombstone=False)
            return [current.pool_name] if current is not None and not ours else []
        if name in self._tombstones:
            return []  # an event from before our delete
        theirs = resource_version_of(obj)
        if self._deleted_since(name, theirs):
            return []  # an event from before a deletion already seen (a replay)
        current = self._slices.get(name)
        if current is not None:
            mine = parse_resource_version(current.resource_version)
            if mine is not None and theirs is not None and theirs <= mine:
                return []  # the echo of our own write, or older
        self.store(obj)
        pools = [pool_of(obj)]
        if current is not None and current.pool_name != pool_of(obj):
            pools.append(current.pool_name)
        return pools

    def on_answer(self, obj: JsonDict, key: str) -> bool:
        """Take the object a create or update returned (slim or not, v1 shape), with its
        content key.

        Returns:
            False when the slice was seen deleted at or after the answer's resourceVersion:
            the watch delivered this write and then a DELETED before the answer was handled.
            Nothing is stored (it would hide the deletion); the caller syncs the pool again.
        """
        name, theirs = slice_name(obj), resource_version_of(obj)
        if self._deleted_since(name, theirs):
            return False
        current = self._slices.get(name)
        if current is not None:
            mine = parse_resource_version(current.resource_version)
            if mine is not None and theirs is not None and theirs < mine:
                return True  # the watch already delivered something newer
        self.store(obj, key)
        return True

    def on_read(self, obj: JsonDict) -> None:
        """Take a fresh copy read from the API server (after a conflict)."""
        name = slice_name(obj)
        if self._deleted_since(name, resource_version_of(obj)):
            return  # deleted after this read was served: the plan recreates it
        self._tombstones.pop(name, None)
        self.store(obj)

    def correct(self, listed: list[JsonDict], list_rv: int | None) -> int:
        """Make the view agree with a fresh list of slim slices served at ``list_rv``.
        resourceVersions that cannot be compared leave an entry alone.

        Returns:
            How many slices were corrected: missing or outdated (stored from the list), or
            gone from the server (dropped, noted deleted at ``list_rv``).
        """
        wrong = 0
        fresh: dict[str, JsonDict] = {slice_name(obj): obj for obj in listed}
        for name, obj in fresh.items():
            theirs = resource_version_of(obj)
            if name in self._tombstones:
                ours = self._tombstones[name]
                if ours is None or theirs is None or theirs <= ours:
                    continue  # our own delete, served after the list
            deleted = self._deleted_at.get(name)
            if deleted is not None and (theirs is None or theirs <= deleted):
                continue  # seen deleted after the list was served
            current = self._slices.get(name)
            if current is not None:
                mine = parse_resource_version(current.resource_version)
                if mine is None or theirs is None or mine >= theirs:
                    continue  # the view is as new (or newer)
            self.store(obj)
            wrong += 1
        for name in [n for n in self._slices if n not in fresh]:
            mine = parse_resource_version(self._slices[name].resource_version)
            if mine is None or list_rv is None or mine > list_rv:
                continue  # written or seen after the list was served
            self.forget(name, None, tombstone=False)
            self._note_deleted(name, list_rv)
            wrong += 1
        return wrong

    def _note_deleted(self, name: str, resource_version: int | None) -> None:
        """Remember that ``name`` was gone at ``resource_version`` (the highest one seen)."""
        if resource_version is None:
            return
        known = self._deleted_at.pop(name, None)
        if known is not None:
            resource_version = max(known, resource_version)
        elif len(self._deleted_at) >= self._max_names:
            del self._deleted_at[next(iter(self._deleted_at))]
        self._deleted_at[name] = resource_version

    def _deleted_since(self, name: str, resource_version: int | None) -> bool:
        """True when ``name`` was seen deleted at or after ``resource_version``."""
        deleted = self._deleted_at.get(name)
        return deleted is not None and resource_version is not None and resource_version <= deleted


__all__ = [
    "CONTENT_KEY",
    "MAX_NAMES",
    "SliceView",
    "parse_resource_version",
    "pool_of",
    "resource_version_of",
    "slice_name",
]
