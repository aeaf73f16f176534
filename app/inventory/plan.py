"""What an inventory sync must write, computed from what is stored and what was listed. Pure.

The plan is the whole difference between the database and one complete, validated listing:
new items, changed items (including items that come back after removal), and removed items.
Items whose vendor data was rejected in this listing are neither changed nor removed: their last
known state stays. An item whose content hash did not change produces no write at all, which is
what makes a no-change sync write nothing (DESIGN.md, invariant 4).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import asdict, dataclass
from typing import Any

from app.fabric.types import FabricDevice, FabricHost
from app.naming import device_name


@dataclass(frozen=True, slots=True)
class StoredItem:
    """What the plan needs to know of a stored device or host.

    Attributes:
        id: the row's primary key.
        key: the vendor id (devices) or host id (hosts).
        content_hash: :func:`content_hash` of the item when it was last written.
        removed: True when the item is marked removed.
        health: its last health value.
        host_id: the host it was attached to (devices only).
        name: its Kubernetes name (devices only).
        unit: its attach unit (devices only): a rejection naming the unit covers the device.
    """

    id: int
    key: str
    content_hash: str
    removed: bool
    health: str
    host_id: str | None = None
    name: str | None = None
    unit: str | None = None


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item to insert. ``name`` is the derived Kubernetes name (devices only)."""

    item: FabricDevice | FabricHost
    content_hash: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ChangedItem:
    """An item to update. ``returned`` is True when it was marked removed before."""

    stored: StoredItem
    item: FabricDevice | FabricHost
    content_hash: str
    returned: bool


@dataclass(frozen=True, slots=True)
class Event:
    """A recorded change: ``kind`` is added, removed, returned, health, host or changed."""

    key: str
    kind: str
    old: str | None = None
    new: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything one sync writes for one kind of item."""

    inserts: tuple[NewItem, ...] = ()
    updates: tuple[ChangedItem, ...] = ()
    removals: tuple[StoredItem, ...] = ()
    events: tuple[Event, ...] = ()

    @property
    def row_writes(self) -> int:
        """Rows inserted, updated or marked removed (events not counted)."""
        return len(self.inserts) + len(self.updates) + len(self.removals)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in sorted(value.items())}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def content_hash(item: FabricDevice | FabricHost) -> str:
    """SHA-256 (hex) of a canonical JSON form of every field of ``item``."""
    payload = json.dumps(_jsonable(asdict(item)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


def plan_devices(
    stored: Iterable[StoredItem],
    devices: Sequence[FabricDevice],
    rejected_keys: Set[str],
    taken_names: Set[str],
    name_scope: str | None = None,
) -> Plan:
    """Plan the device writes for one complete, validated listing.

    Args:
        stored: every stored device of this backend (removed ones included).
        devices: the valid listed devices, unique by vendor id.
        rejected_keys: vendor ids (or attach units) rejected in this listing; the stored rows
            they name, or whose attach unit they name, are kept as they are.
        taken_names: Kubernetes names already used in the database (all backends).
        name_scope: hashed into new names (:func:`app.naming.device_name`): the fabric
            manager's name when several are configured, else None.

    Returns:
        The :class:`Plan`; new devices get names from :func:`app.naming.device_name`,
        unique against ``taken_names`` and each other.
    """
    by_key = {s.key: s for s in stored}
    names = set(taken_names)
    inserts: list[NewItem] = []
    updates: list[ChangedItem] = []
    events: list[Event] = []
    listed: set[str] = set()
    for device in devices:
        listed.add(device.vendor_id)
        digest = content_hash(device)
        old = by_key.get(device.vendor_id)
        if old is None:
            name = device_name(device.vendor_id, names, name_scope)
            names.add(name)
            inserts.append(NewItem(device, digest, name))
            events.append(Event(device.vendor_id, "added", None, str(device.health)))
            continue
        if old.content_hash == digest and not old.removed:
            continue
        updates.append(ChangedItem(old, device, digest, returned=old.removed))
        events.extend(_device_events(old, device))
    removals = _removals(by_key.values(), listed, rejected_keys)
    events.extend(Event(s.key, "removed", s.health, None) for s in removals)
    return Plan(tuple(inserts), tuple(updates), removals, tuple(events))


def _device_events(old: StoredItem, device: FabricDevice) -> list[Event]:
    events: list[Event] = []
    if old.removed:
        events.append(Event(device.vendor_id, "returned", None, str(device.health)))
    if old.health != device.health:
        events.append(Event(device.vendor_id, "health", old.health, str(device.health)))
    if old.host_id != device.host_id:
        events.append(Event(device.vendor_id, "host", old.host_id, device.host_id))
    if not events:
        events.append(Event(device.vendor_id, "changed"))
    return events


def plan_hosts(
    stored: Iterable[StoredItem], hosts: Sequence[FabricHost], rejected_keys: Set[str]
) -> Plan:
    """Plan the host writes for one complete, validated listing (no events are recorded).

    Args:
        stored: every stored host of this backend.
        hosts: the valid listed hosts, unique by host id.
        rejected_keys: host ids rejected in this listing; their rows are kept.
    """
    by_key = {s.key: s for s in stored}
    inserts: list[NewItem] = []
    updates: list[ChangedItem] = []
    listed: set[str] = set()
    for host in hosts:
        listed.add(host.host_id)
        digest = content_hash(host)
        old = by_key.get(host.host_id)
        if old is None:
            inserts.append(NewItem(host, digest))
        elif old.content_hash != digest or old.removed:
            updates.append(ChangedItem(old, host, digest, returned=old.removed))
    removals = _removals(by_key.values(), listed, rejected_keys)
    return Plan(tuple(inserts), tuple(updates), removals)


def _removals(
    stored: Iterable[StoredItem], listed: Set[str], rejected_keys: Set[str]
) -> tuple[StoredItem, ...]:
    # A rejected item is not "gone": its vendor data was bad this time, so it keeps its row.
    # A backend that cannot read a whole attach unit rejects the unit, covering its devices.
    return tuple(
        s
        for s in stored
        if not s.removed
        and s.key not in listed
        and s.key not in rejected_keys
        and (s.unit is None or s.unit not in rejected_keys)
    )
