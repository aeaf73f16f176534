"""Reads of the stored inventory, for the CLI and the admin API.

Rows are converted here into plain value types, so callers do not hold ORM objects.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Text, and_, cast, false, func, or_, select, true

from app.db.engine import Database
from app.db.models import (
    ACTIVE_RESERVATION_STATES,
    Device,
    Host,
    InventoryStatus,
    Reservation,
)
from app.fabric.types import Location
from app.hostmap import Ambiguity, HostIndex, HostRef, ambiguities
from app.pools import PoolDevice


@dataclass(frozen=True, slots=True)
class DeviceView:
    """A stored device as shown to people (CLI table, JSON, admin API)."""

    name: str
    vendor_id: str
    device_type: str
    vendor: str | None
    model: str | None
    memory_mib: int | None
    region: str | None
    zone: str | None
    row: str | None
    rack: str | None
    chassis: str | None
    slot: str | None
    fabric: str | None
    health: str
    state: str | None
    host_id: str | None
    removed_at: dt.datetime | None
    serial: str | None = None
    firmware_version: str | None = None
    backend: str | None = None
    """The fabric manager that reports it."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601 strings in UTC)."""
        data = {k: getattr(self, k) for k in self.__slots__}
        data["removed_at"] = self.removed_at.isoformat() if self.removed_at else None
        return data


@dataclass(frozen=True, slots=True)
class StatusView:
    """The inventory sync status of one backend."""

    backend: str
    last_attempt_at: dt.datetime | None
    last_success_at: dt.datetime | None
    consecutive_failures: int
    stale: bool
    last_error: str | None
    device_count: int
    host_count: int
    rejected_count: int
    last_rejects: tuple[dict[str, str], ...]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601 strings in UTC)."""
        data = {k: getattr(self, k) for k in self.__slots__}
        for key in ("last_attempt_at", "last_success_at"):
            data[key] = data[key].isoformat() if data[key] else None
        data["last_rejects"] = list(self.last_rejects)
        return data


async def list_devices(db: Database, *, include_removed: bool = False) -> list[DeviceView]:
    """Every stored device, ordered by fabric manager, region, rack, name (unknown locations
    last)."""
    query = select(Device)
    if not include_removed:
        query = query.where(Device.removed_at.is_(None))
    async with db.read() as session:
        rows = (await session.scalars(query)).all()
    views = [
        DeviceView(
            name=r.name,
            vendor_id=r.vendor_id,
            device_type=r.device_type,
            vendor=r.vendor,
            model=r.model,
            memory_mib=r.memory_mib,
            region=r.region,
            zone=r.zone,
            row=r.row,
            rack=r.rack,
            chassis=r.chassis,
            slot=r.slot,
            fabric=r.fabric,
            health=r.health,
            state=r.state,
            host_id=r.host_id,
            removed_at=r.removed_at,
            serial=r.serial,
            firmware_version=r.firmware_version,
            backend=r.backend,
        )
        for r in rows
    ]
    views.sort(
        key=lambda v: (
            v.backend or "",
            v.region is None,
            v.region or "",
            v.rack is None,
            v.rack or "",
            v.name,
        )
    )
    return views


async def list_status(db: Database) -> list[StatusView]:
    """The sync status of every backend that has synced at least once."""
    async with db.read() as session:
        # A row an event's unit write made before the backend's first sync is left out.
        rows = (
            await session.scalars(
                select(InventoryStatus).where(InventoryStatus.last_attempt_at.is_not(None))
            )
        ).all()
    return [
        StatusView(
            backend=r.backend,
            last_attempt_at=r.last_attempt_at,
            last_success_at=r.last_success_at,
            consecutive_failures=r.consecutive_failures,
            stale=r.stale,
            last_error=r.last_error,
            device_count=r.device_count,
            host_count=r.host_count,
            rejected_count=r.rejected_count,
            last_rejects=tuple(r.last_rejects or ()),
        )
        for r in rows
    ]


_POOL_COLUMNS = (
    Device.id,
    Device.name,
    Device.device_type,
    Device.region,
    Device.zone,
    Device.site,
    Device.row,
    Device.rack,
    Device.chassis,
    Device.slot,
    Device.fabric,
    Device.fabric_zone,
    Device.health,
    Device.vendor,
    Device.model,
    Device.uuid,
    Device.serial,
    Device.part_number,
    Device.firmware_version,
    Device.memory_mib,
    # As their stored text: decoded only when it changed (PoolDeviceCache).
    cast(Device.capacity, Text).label("capacity"),
    cast(Device.attributes, Text).label("attributes"),
    Device.cordoned_at,
    Device.host_id,
    Device.backend.label("manager"),
)


LOCATION_KEYS = (
    "region",
    "zone",
    "site",
    "row",
    "rack",
    "chassis",
    "slot",
    "fabric",
    "fabric_zone",
    "manager",
)


def location_column(key: str) -> Any:
    """The devices column that holds location ``key`` (``manager`` is ``backend``)."""
    return Device.backend if key == "manager" else getattr(Device, key)


_LOCATION_COLUMNS = tuple(location_column(key).label(key) for key in LOCATION_KEYS)


class PoolDeviceCache:
    """The :class:`PoolDevice` values :func:`pool_devices` made last time, by the row they
    were made from: an unchanged row gives the same object again instead of being decoded and
    built anew (after one change, one row differs). Also remembers decoded JSON texts."""

    __slots__ = ("_devices", "_json")

    def __init__(self) -> None:
        self._devices: dict[tuple[Any, ...], PoolDevice] = {}
        self._json: dict[str, Any] = {}

    def get(self, key: tuple[Any, ...]) -> PoolDevice | None:
        """The value made from the row ``key`` last time, if any."""
        return self._devices.get(key)

    def replace(self, devices: dict[tuple[Any, ...], PoolDevice]) -> None:
        """Keep exactly ``devices`` (row -> value) for the next call."""
        self._devices = devices

    def decode(self, text: str | None) -> dict[str, Any]:
        """The JSON object ``text`` holds ({} for none), decoded once per distinct text."""
        if not text:
            return {}
        found = self._json.get(text)
        if found is None:
            if len(self._json) > 200_000:
                self._json.clear()
            found = self._json[text] = json.loads(text)
        return dict(found)


async def unit_locations(db: Database, units: Iterable[str]) -> list[tuple[str, Location, bool]]:
    """``(name, location, removed)`` of every stored device of the attach ``units`` (removed
    ones included), for a publish pass over the pools they are in."""
    wanted = sorted(set(units))
    if not wanted:
        return []
    query = select(Device.name, *_LOCATION_COLUMNS, Device.removed_at).where(
        Device.attach_unit.in_(wanted)
    )
    async with db.read() as session:
        rows = (await session.execute(query)).all()
    return [
        (r.name, Location(**{k: getattr(r, k) for k in LOCATION_KEYS}), r.removed_at is not None)
        for r in rows
    ]


def located_in(locations: Iterable[Mapping[str, str | None]]) -> ColumnElement[bool]:
    """A condition on devices: at any of ``locations`` (location key -> value; a None value
    means no value)."""
    terms = []
    for location in locations:
        parts = [
            # A missing value may be stored as NULL or as an empty string.
            or_(location_column(key).is_(None), location_column(key) == "")
            if not value
            else location_column(key) == value
            for key, value in location.items()
        ]
        terms.append(and_(*parts) if parts else true())
    return or_(*terms) if terms else false()


async def pool_devices(
    db: Database,
    backend: str | None = None,
    cache: PoolDeviceCache | None = None,
    where: ColumnElement[bool] | None = None,
    managers: Iterable[str] | None = None,
) -> list[PoolDevice]:
    """Every present device as a :class:`app.pools.PoolDevice`, for publishing.

    ``attach_failed`` is True for devices whose active reservation is in state ``failed``,
    ``detach_failed`` for ``detach-failed``; ``held_by`` names the host of a device the fabric
    shows attached while no active reservation of ours holds it (someone else's server).
    ``cache`` (kept by the caller between calls) reuses the values of unchanged rows.
    ``managers``: only devices of these fabric managers (the configured ones: rows left by a
    manager no longer configured are not offered); None: every manager.
    """
    # Columns, not ORM objects: a publish pass reads every device, and building ORM
    # instances cost about as much as the rest of the pass.
    query = select(*_POOL_COLUMNS).where(Device.removed_at.is_(None))
    if backend is not None:
        query = query.where(Device.backend == backend)
    if where is not None:
        query = query.where(where)
    if managers is not None:
        query = query.where(Device.backend.in_(sorted(managers)))
    async with db.read() as session:
        rows = (await session.execute(query)).all()
        states: dict[int, set[str]] = {}
        for device_id, state in (
            await session.execute(
                select(Reservation.device_id, Reservation.state).where(
                    Reservation.state.in_(ACTIVE_RESERVATION_STATES)
                )
            )
        ).all():
            states.setdefault(device_id, set()).add(state)
    failed = {d for d, held in states.items() if "failed" in held}
    detach_failed = {d for d, held in states.items() if "detach-failed" in held}
    cache = cache if cache is not None else PoolDeviceCache()
    fresh: dict[tuple[Any, ...], PoolDevice] = {}
    out = []
    for r in rows:
        key = (*r, r.id in failed, r.id in detach_failed, r.id in states)
        device = cache.get(key)
        if device is None:
            device = PoolDevice(
                name=r.name,
                device_type=r.device_type,
                location=Location(
                    region=r.region,
                    zone=r.zone,
                    site=r.site,
                    row=r.row,
                    rack=r.rack,
                    chassis=r.chassis,
                    slot=r.slot,
                    fabric=r.fabric,
                    fabric_zone=r.fabric_zone,
                    manager=r.manager,
                ),
                health=r.health,
                vendor=r.vendor,
                model=r.model,
                uuid=r.uuid,
                serial=r.serial,
                part_number=r.part_number,
                firmware_version=r.firmware_version,
                memory_mib=r.memory_mib,
                capacity=cache.decode(r.capacity),
                attributes=cache.decode(r.attributes),
                cordoned=r.cordoned_at is not None,
                attach_failed=r.id in failed,
                detach_failed=r.id in detach_failed,
                held_by=r.host_id if r.host_id is not None and r.id not in states else None,
            )
        fresh[key] = device
        out.append(device)
    cache.replace(fresh)
    return out


async def unconfigured_managers(db: Database, configured: Iterable[str]) -> dict[str, int]:
    """Fabric managers that have present devices in the database but are not ``configured``
    (renamed or removed from the settings) -> how many devices each has."""
    query = (
        select(Device.backend, func.count())
        .where(Device.removed_at.is_(None), Device.backend.not_in(sorted(configured)))
        .group_by(Device.backend)
    )
    async with db.read() as session:
        return {str(b): int(n) for b, n in (await session.execute(query)).all()}


async def host_refs(db: Database) -> list[HostRef]:
    """Every present host as a :class:`app.hostmap.HostRef`."""
    query = select(Host.host_id, Host.hostname, Host.backend, Host.serial).where(
        Host.removed_at.is_(None)
    )
    # One statement, read whole on the database's side (Database.run_read): with thousands
    # of hosts, fetching the rows through the async driver one hand-over at a time held up
    # every claim waiting on the event loop.
    return await db.run_read(
        lambda conn: [
            HostRef(host_id, hostname, backend, serial)
            for host_id, hostname, backend, serial in conn.execute(query)
        ]
    )


async def host_ambiguities(db: Database) -> tuple[Ambiguity, ...]:
    """The identities (hostname, short hostname, host id) shared by several present hosts, as
    :func:`app.hostmap.ambiguities` reports them. Logs nothing: callers show them."""
    return ambiguities(HostIndex.build(await host_refs(db), report=None))


async def unmanaged_attachments(db: Database) -> list[dict[str, str]]:
    """Present devices the fabric reports attached to a host with no active reservation.

    Returns:
        ``[{"name", "vendor_id", "attach_unit", "device_type", "host_id", "backend"}]`` by
        name (``backend``: the fabric manager that reports it).
    """
    held = select(Reservation.device_id).where(Reservation.state.in_(ACTIVE_RESERVATION_STATES))
    async with db.read() as session:
        rows = (
            await session.execute(
                select(
                    Device.name,
                    Device.vendor_id,
                    Device.attach_unit,
                    Device.device_type,
                    Device.host_id,
                    Device.backend,
                )
                .where(
                    Device.removed_at.is_(None), Device.host_id.is_not(None), Device.id.not_in(held)
                )
                .order_by(Device.name)
            )
        ).all()
    return [
        {
            "name": n,
            "vendor_id": v,
            "attach_unit": u,
            "device_type": t,
            "host_id": str(h),
            "backend": b,
        }
        for n, v, u, t, h, b in rows
    ]


async def still_unmanaged(
    db: Database, vendor_id: str, host_id: str, backend: str | None = None
) -> bool:
    """True when the present device ``vendor_id`` is still shown on ``host_id`` with no active
    reservation: read again right before an unmanaged device is detached, so that a device
    reserved (or a holder changed) since the sweep listed it is left alone. ``backend``: the
    fabric manager that reports it (None: any)."""
    held = select(Reservation.device_id).where(Reservation.state.in_(ACTIVE_RESERVATION_STATES))
    async with db.read() as session:
        found = (
            await session.execute(
                select(Device.id).where(
                    Device.vendor_id == vendor_id,
                    Device.host_id == host_id,
                    Device.removed_at.is_(None),
                    Device.id.not_in(held),
                    true() if backend is None else Device.backend == backend,
                )
            )
        ).first()
    return found is not None


async def unit_of(db: Database, backend: str, resource: str) -> str | None:
    """The attach unit ``resource`` names: itself when it is a stored unit, else the unit of
    the stored device whose vendor id it is; None when it is neither."""
    async with db.read() as session:
        found = await session.scalar(
            select(Device.attach_unit)
            .where(
                Device.backend == backend,
                (Device.attach_unit == resource) | (Device.vendor_id == resource),
            )
            .limit(1)
        )
    return found


async def units_held_by(db: Database, backend: str, host_id: str) -> list[str]:
    """The attach units of present devices that the database says ``host_id`` holds."""
    async with db.read() as session:
        rows = await session.scalars(
            select(Device.attach_unit)
            .where(
                Device.backend == backend,
                Device.host_id == host_id,
                Device.removed_at.is_(None),
            )
            .distinct()
        )
        return sorted(set(rows.all()))
