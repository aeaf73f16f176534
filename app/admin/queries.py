"""Database reads of the admin API: pools, devices, reservations, claims, with filters and pages.

Every function takes the database and plain arguments and returns plain JSON-ready values; the
HTTP layer (:mod:`app.admin.app`) only validates parameters and serialises.

A device's admin *state* is derived, in this order: ``removed`` (gone from the fabric),
``cordoned`` (taken out of service by an operator), ``attached`` (an active reservation is
``attached``), ``reserved`` (another active reservation holds it), ``free``. Lists show present
devices unless the state filter asks for ``removed``.

Pages are ordered by a unique key (device name; reservation id, newest first). A ``continue``
token carries the last key of a page and a digest of the filters it was made for, so a token is
refused for another query instead of silently skipping rows.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, and_, exists, false, func, or_, select, true

from app.claims.model import device_identity_data
from app.db.engine import Database
from app.db.models import ACTIVE_RESERVATION_STATES, Device, DeviceEvent, Reservation
from app.fabric.types import DeviceType, FabricDevice, Location
from app.inventory.queries import host_ambiguities, list_status, location_column, pool_devices
from app.journal import ATTACHED, DETACH_FAILED, FAILED, ClaimRef, ReservationView
from app.pools import (
    HEALTH_UNKNOWN,
    UNHEALTHY,
    PoolConfig,
    desired_pools,
    minimum_slices,
    pool_name,
)

M = TypeVar("M", Device, Reservation)
DEVICE_STATES = ("free", "reserved", "attached", "held-elsewhere", "cordoned", "removed")
"""Admin states of a device. ``held-elsewhere``: the fabric shows it attached to a server while
no reservation of ours holds it (someone else's); it is not offered."""
MAX_DETAIL_ROWS = 100
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
)


def _row_location(row: Device) -> Location:
    """Where a device row is, its fabric manager included."""
    return Location(**{key: getattr(row, key) for key in LOCATION_KEYS}, manager=row.backend)


class BadToken(ValueError):
    """A ``continue`` token that cannot be read or belongs to another query."""


@dataclass(frozen=True, slots=True)
class DeviceFilter:
    """Filters of the device list; None means "any"."""

    pool: str | None = None
    region: str | None = None
    rack: str | None = None
    device_type: str | None = None
    health: str | None = None
    state: str | None = None
    q: str | None = None


@dataclass(frozen=True, slots=True)
class ReservationFilter:
    """Filters of the reservation list; None means "any"."""

    state: str | None = None
    claim_namespace: str | None = None
    claim_name: str | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list.

    Attributes:
        items: JSON-ready rows.
        total: rows matching the filters, over all pages.
        next_token: the ``continue`` token of the next page, None on the last one.
    """

    items: list[dict[str, Any]]
    total: int
    next_token: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- tokens
def _digest(scope: str, filters: object) -> str:
    return hashlib.sha256(f"{scope}:{filters!r}".encode()).hexdigest()[:16]


def encode_token(scope: str, filters: object, key: str | int) -> str:
    """An opaque ``continue`` token: the last key of a page, bound to its query."""
    raw = json.dumps({"k": key, "f": _digest(scope, filters)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(scope: str, filters: object, token: str) -> str | int:
    """The last key carried by ``token``.

    Raises:
        BadToken: unreadable, or made for other filters.
    """
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError) as err:
        raise BadToken("parameter 'continue': not a token this API gave out") from err
    if not isinstance(data, dict) or not isinstance(data.get("k"), str | int):
        raise BadToken("parameter 'continue': not a token this API gave out")
    if data.get("f") != _digest(scope, filters):
        raise BadToken("parameter 'continue': the token belongs to a query with other filters")
    key: str | int = data["k"]
    return key


# --------------------------------------------------------------------------- devices
def _active() -> ColumnElement[bool]:
    return exists().where(
        Reservation.device_id == Device.id, Reservation.state.in_(ACTIVE_RESERVATION_STATES)
    )


def _attached() -> ColumnElement[bool]:
    return exists().where(Reservation.device_id == Device.id, Reservation.state == ATTACHED)


def _state_condition(state: str | None) -> ColumnElement[bool]:
    present = Device.removed_at.is_(None)
    in_service = and_(present, Device.cordoned_at.is_(None))
    if state is None:
        return present
    if state == "removed":
        return Device.removed_at.is_not(None)
    if state == "cordoned":
        return and_(present, Device.cordoned_at.is_not(None))
    if state == "attached":
        return and_(in_service, _attached())
    if state == "reserved":
        return and_(in_service, _active(), ~_attached())
    if state == "held-elsewhere":
        return and_(in_service, ~_active(), Device.host_id.is_not(None))
    if state == "free":
        return and_(in_service, ~_active(), Device.host_id.is_(None))
    raise ValueError(f"unknown device state {state!r}; one of {', '.join(DEVICE_STATES)}")


async def _pool_condition(db: Database, pool: str, config: PoolConfig) -> ColumnElement[bool]:
    """Devices whose location makes ``pool``. Pool names are computed in Python (segments may be
    sanitised and hashed), so the distinct locations are read first: there are few of them."""
    columns = [location_column(key) for key in config.grouping_keys]
    async with db.read() as session:
        rows = (await session.execute(select(*columns).distinct())).all()
    terms = []
    for row in rows:
        location = Location(**dict(zip(config.grouping_keys, row, strict=True)))
        if pool_name(location, config.grouping_keys) == pool:
            terms.append(
                and_(
                    *(
                        column.is_(None) if value is None else column == value
                        for column, value in zip(columns, row, strict=True)
                    )
                )
            )
    return or_(*terms) if terms else false()


async def _device_conditions(
    db: Database, filters: DeviceFilter, config: PoolConfig
) -> list[ColumnElement[bool]]:
    conditions = [_state_condition(filters.state)]
    if filters.pool is not None:
        conditions.append(await _pool_condition(db, filters.pool, config))
    if filters.region is not None:
        conditions.append(Device.region == filters.region)
    if filters.rack is not None:
        conditions.append(Device.rack == filters.rack)
    if filters.device_type is not None:
        conditions.append(Device.device_type == filters.device_type)
    if filters.health is not None:
        conditions.append(Device.health == filters.health)
    if filters.q:
        conditions.append(
            or_(
                Device.name.icontains(filters.q, autoescape=True),
                Device.model.icontains(filters.q, autoescape=True),
            )
        )
    return conditions


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def device_state(row: Device, reservation_states: Sequence[str]) -> str:
    """The admin state of ``row`` given the states of its active reservations."""
    if row.removed_at is not None:
        return "removed"
    if row.cordoned_at is not None:
        return "cordoned"
    if ATTACHED in reservation_states:
        return "attached"
    if reservation_states:
        return "reserved"
    return "held-elsewhere" if row.host_id is not None else "free"


def device_json(
    row: Device, reservation_states: Sequence[str], config: PoolConfig
) -> dict[str, Any]:
    """A device row as JSON, with its pool and admin state."""
    location = _row_location(row)
    return {
        "name": row.name,
        "pool": pool_name(location, config.grouping_keys),
        "state": device_state(row, reservation_states),
        "type": row.device_type,
        "health": row.health,
        "vendor_id": row.vendor_id,
        "vendor": row.vendor,
        "model": row.model,
        "serial": row.serial,
        "firmware_version": row.firmware_version,
        "memory_mib": row.memory_mib,
        "shareable": row.shareable,
        "fabric_state": row.state,
        "host_id": row.host_id,
        "location": {key: getattr(row, key) for key in LOCATION_KEYS},
        "capacity": dict(row.capacity or {}),
        "attributes": dict(row.attributes or {}),
        "cordoned_at": _iso(row.cordoned_at),
        "cordon_reason": row.cordon_reason,
        "reservations": list(reservation_states),
        "first_seen": _iso(row.first_seen),
        "last_seen": _iso(row.last_seen),
        "health_changed_at": _iso(row.health_changed_at),
        "removed_at": _iso(row.removed_at),
    }


async def _reservation_states(db: Database, device_ids: Sequence[int]) -> dict[int, list[str]]:
    states: dict[int, list[str]] = {}
    if not device_ids:
        return states
    async with db.read() as session:
        rows = (
            await session.execute(
                select(Reservation.device_id, Reservation.state)
                .where(
                    Reservation.device_id.in_(device_ids),
                    Reservation.state.in_(ACTIVE_RESERVATION_STATES),
                )
                .order_by(Reservation.id)
            )
        ).all()
    for device_id, state in rows:
        states.setdefault(device_id, []).append(state)
    return states


async def _page(
    db: Database,
    model: type[M],
    conditions: Sequence[ColumnElement[bool]],
    order: Any,
    after: ColumnElement[bool] | None,
    *,
    limit: int,
    offset: int,
) -> tuple[list[M], int, bool]:
    """One page of the ``model`` rows matching ``conditions``, in ``order``, past ``after``
    (a ``continue`` token's keyset condition) when given.

    Returns:
        (at most ``limit`` rows, the count of all matching rows, whether more rows follow).
    """
    query = select(model).where(*conditions)
    if after is not None:
        query = query.where(after)
    async with db.read() as session:
        total = int(
            await session.scalar(select(func.count()).select_from(model).where(*conditions)) or 0
        )
        rows = list(
            (await session.scalars(query.order_by(order).limit(limit + 1).offset(offset))).all()
        )
    return rows[:limit], total, len(rows) > limit


async def list_devices(
    db: Database,
    filters: DeviceFilter,
    config: PoolConfig,
    *,
    limit: int,
    offset: int = 0,
    token: str | None = None,
) -> Page:
    """One page of devices matching ``filters``, by name.

    Raises:
        BadToken: ``token`` is not valid for these filters.
    """
    conditions = await _device_conditions(db, filters, config)
    after = None
    if token is not None:
        after = Device.name > str(decode_token("devices", filters, token))
    rows, total, more = await _page(
        db, Device, conditions, Device.name, after, limit=limit, offset=offset
    )
    states = await _reservation_states(db, [r.id for r in rows])
    items = [device_json(r, states.get(r.id, []), config) for r in rows]
    next_token = encode_token("devices", filters, rows[-1].name) if more and rows else None
    return Page(items, total, next_token)


async def device_detail(db: Database, name: str, config: PoolConfig) -> dict[str, Any] | None:
    """One device (present or removed) with its newest events and reservations; None if unknown."""
    async with db.read() as session:
        row = (await session.scalars(select(Device).where(Device.name == name))).first()
        if row is None:
            return None
        events = (
            await session.scalars(
                select(DeviceEvent)
                .where(DeviceEvent.device_id == row.id)
                .order_by(DeviceEvent.id.desc())
                .limit(MAX_DETAIL_ROWS)
            )
        ).all()
        reservations = (
            await session.scalars(
                select(Reservation)
                .where(Reservation.device_id == row.id)
                .order_by(Reservation.id.desc())
                .limit(MAX_DETAIL_ROWS)
            )
        ).all()
    active = [
        r.state
        for r in sorted(reservations, key=lambda r: r.id)
        if r.state in ACTIVE_RESERVATION_STATES
    ]
    data = device_json(row, active, config)
    data["events"] = [
        {"at": _iso(e.at), "kind": e.kind, "old": e.old, "new": e.new} for e in events
    ]
    data["reservation_history"] = [reservation_json(r) for r in reservations]
    return data


async def device_summary(db: Database, name: str, config: PoolConfig) -> dict[str, Any] | None:
    """One device as in the device list (no history); None if unknown."""
    async with db.read() as session:
        row = (await session.scalars(select(Device).where(Device.name == name))).first()
    if row is None:
        return None
    states = await _reservation_states(db, [row.id])
    return device_json(row, states.get(row.id, []), config)


# --------------------------------------------------------------------------- reservations
def reservation_json(row: Reservation) -> dict[str, Any]:
    """A reservation row in the journal's JSON shape (:meth:`ReservationView.to_json`)."""
    return ReservationView(
        id=row.id,
        claim=ClaimRef(row.claim_uid, row.claim_namespace, row.claim_name),
        request=row.request,
        mode=row.mode,
        device_id=row.device_id,
        device_name=row.device_name,
        pool=row.pool,
        exclusive=row.exclusive,
        node=row.node,
        host_id=row.host_id,
        state=row.state,
        attempts=row.attempts,
        last_error=row.last_error,
        operation_id=row.operation_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        attached_at=row.attached_at,
        released_at=row.released_at,
    ).to_json()


def _reservation_conditions(filters: ReservationFilter) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = [true()]
    if filters.state == "active":
        conditions.append(Reservation.state.in_(ACTIVE_RESERVATION_STATES))
    elif filters.state is not None:
        conditions.append(Reservation.state == filters.state)
    if filters.claim_namespace is not None:
        conditions.append(Reservation.claim_namespace == filters.claim_namespace)
    if filters.claim_name is not None:
        conditions.append(Reservation.claim_name == filters.claim_name)
    return conditions


async def list_reservations(
    db: Database,
    filters: ReservationFilter,
    *,
    limit: int,
    offset: int = 0,
    token: str | None = None,
) -> Page:
    """One page of reservations matching ``filters``, newest first.

    Raises:
        BadToken: ``token`` is not valid for these filters.
    """
    conditions = _reservation_conditions(filters)
    after = None
    if token is not None:
        last = decode_token("reservations", filters, token)
        if not isinstance(last, int):
            raise BadToken("parameter 'continue': not a token this API gave out")
        after = Reservation.id < last
    rows, total, more = await _page(
        db, Reservation, conditions, Reservation.id.desc(), after, limit=limit, offset=offset
    )
    next_token = encode_token("reservations", filters, rows[-1].id) if more and rows else None
    return Page([reservation_json(r) for r in rows], total, next_token)


async def claim_reservations(db: Database, namespace: str, name: str) -> dict[str, Any]:
    """A claim's reservations (newest first, released ones too) and the fabric state of their
    devices as the inventory knows it."""
    async with db.read() as session:
        rows = (
            await session.scalars(
                select(Reservation)
                .where(Reservation.claim_namespace == namespace, Reservation.claim_name == name)
                .order_by(Reservation.id.desc())
                .limit(MAX_DETAIL_ROWS)
            )
        ).all()
        device_ids = sorted({r.device_id for r in rows})
        devices = (
            (
                await session.scalars(
                    select(Device).where(Device.id.in_(device_ids)).order_by(Device.name)
                )
            ).all()
            if device_ids
            else []
        )
    wanted_host = {r.device_id: r.host_id for r in rows if r.state in ACTIVE_RESERVATION_STATES}
    fabric = [
        {
            "device": d.name,
            "host_id": d.host_id,
            "health": d.health,
            "removed": d.removed_at is not None,
            "reserved_for_host": wanted_host.get(d.id),
            "attached_as_reserved": d.id in wanted_host
            and d.host_id is not None
            and d.host_id == wanted_host[d.id],
        }
        for d in devices
    ]
    errors = [
        {
            "reservation": r.id,
            "device": r.device_name,
            "at": _iso(r.updated_at),
            "message": r.last_error,
        }
        for r in rows
        if r.last_error
    ]
    return {"reservations": [reservation_json(r) for r in rows], "fabric": fabric, "errors": errors}


def identity_device(row: Device) -> FabricDevice:
    """The identity parts of a device row as a :class:`FabricDevice` (type, serial, uuid,
    attributes, location), enough for :func:`app.claims.model.device_identity_data`. A stored
    type this version does not know becomes ``other``."""
    try:
        device_type = DeviceType(row.device_type)
    except ValueError:
        device_type = DeviceType.OTHER
    return FabricDevice(
        vendor_id=row.vendor_id,
        attach_unit=row.attach_unit,
        device_type=device_type,
        serial=row.serial,
        uuid=row.uuid,
        attributes=dict(row.attributes or {}),
        location=_row_location(row),
        host_id=row.host_id,
        shareable=row.shareable,
    )


async def claim_devices(db: Database, claim_uid: str, config: PoolConfig) -> dict[str, Any]:
    """The devices the journal holds for the claim with UID ``claim_uid``: what the node plugin
    asks for a claim without ``status.devices`` (classic DRA, Kubernetes 1.31).

    Returns:
        ``{"claim": {"uid", "namespace", "name"}, "devices": [{"pool", "device", "request",
        "state", "node", "host", "data"}]}``, one device per reservation that is not
        released, oldest first. ``state`` is the journal's own (``pending`` ... ``detach-failed``);
        ``data`` is :func:`app.claims.model.device_identity_data` of the device row (None when
        the row is gone); ``pool`` is the reservation's pool, or the pool the device's location
        makes under ``config`` for a reservation stored without one. A claim with no such
        reservation has an empty list and a null namespace and name: an unknown claim and
        one not yet reserved look the same.
    """
    async with db.read() as session:
        rows = (
            await session.execute(
                select(Reservation, Device)
                .outerjoin(Device, Device.id == Reservation.device_id)
                .where(
                    Reservation.claim_uid == claim_uid,
                    Reservation.state.in_(ACTIVE_RESERVATION_STATES),
                )
                .order_by(Reservation.id)
            )
        ).all()
    claim: dict[str, Any] = {"uid": claim_uid, "namespace": None, "name": None}
    devices = []
    for reservation, device in rows:
        if claim["namespace"] is None:
            claim.update(namespace=reservation.claim_namespace, name=reservation.claim_name)
        identity = identity_device(device) if device is not None else None
        pool = reservation.pool
        if not pool and identity is not None:
            pool = pool_name(identity.location, config.grouping_keys)
        devices.append(
            {
                "pool": pool,
                "device": reservation.device_name,
                "request": reservation.request,
                "state": reservation.state,
                "node": reservation.node,
                "host": reservation.host_id,
                "data": device_identity_data(identity) if identity is not None else None,
            }
        )
    return {"claim": claim, "devices": devices}


# --------------------------------------------------------------------------- counts
async def ambiguous_hosts(db: Database) -> list[dict[str, Any]]:
    """Identities shared by several present hosts, which map no node:
    ``[{"key": "hostname" | "short hostname" | "host id", "value", "hosts": [host id]}]``."""
    return [a.to_json() for a in await host_ambiguities(db)]


async def counts(db: Database) -> dict[str, Any]:
    """Devices by admin state, type and health, reservations by state, the sync status, and
    the host identities shared by several hosts (``ambiguousHosts``, see
    :func:`ambiguous_hosts`)."""
    async with db.read() as session:
        by_type = {
            key: int(n)
            for key, n in (
                await session.execute(
                    select(Device.device_type, func.count())
                    .where(Device.removed_at.is_(None))
                    .group_by(Device.device_type)
                )
            ).all()
        }
        by_health = {
            key: int(n)
            for key, n in (
                await session.execute(
                    select(Device.health, func.count())
                    .where(Device.removed_at.is_(None))
                    .group_by(Device.health)
                )
            ).all()
        }
        by_state: dict[str, int] = {}
        for state in DEVICE_STATES:
            by_state[state] = int(
                await session.scalar(
                    select(func.count()).select_from(Device).where(_state_condition(state))
                )
                or 0
            )
        reservations = {
            key: int(n)
            for key, n in (
                await session.execute(
                    select(Reservation.state, func.count()).group_by(Reservation.state)
                )
            ).all()
        }
    present = sum(by_type.values())
    return {
        "devices": {
            "present": present,
            "by_state": by_state,
            "by_type": dict(sorted(by_type.items())),
            "by_health": dict(sorted(by_health.items())),
        },
        "reservations": {
            "by_state": dict(sorted(reservations.items())),
            "active": sum(n for s, n in reservations.items() if s in ACTIVE_RESERVATION_STATES),
        },
        "inventory": [s.to_json() for s in await list_status(db)],
        "ambiguousHosts": await ambiguous_hosts(db),
    }


# --------------------------------------------------------------------------- pools
@dataclass
class _Tally:
    """Counts of one pool, summed from grouped rows."""

    location: dict[str, str | None]
    devices: int = 0
    unhealthy: int = 0
    cordoned: int = 0
    attach_failed: int = 0
    out_of_service: int = 0
    held_elsewhere: int = 0
    reserved: int = 0
    attached: int = 0
    free: int = 0
    by_type: Counter[str] = field(default_factory=Counter)


async def _tallies(
    db: Database, config: PoolConfig, condition: ColumnElement[bool] | None = None
) -> dict[str, _Tally]:
    """Per-pool counts, grouped in the database: one row per location, type, health and
    reservation flags, however many devices there are, so a dashboard refresh stays cheap."""
    keys = config.grouping_keys
    failed = exists().where(
        Reservation.device_id == Device.id, Reservation.state.in_((FAILED, DETACH_FAILED))
    )
    per_device = (
        select(
            *(location_column(key).label(key) for key in keys),
            Device.device_type.label("device_type"),
            Device.health.label("health"),
            Device.cordoned_at.is_not(None).label("is_cordoned"),
            _active().label("is_held"),
            _attached().label("is_attached"),
            failed.label("is_failed"),
            Device.host_id.is_not(None).label("has_host"),
        )
        .where(Device.removed_at.is_(None), condition if condition is not None else true())
        .subquery()
    )
    columns = [
        per_device.c[name]
        for name in (
            *keys,
            "device_type",
            "health",
            "is_cordoned",
            "is_held",
            "is_attached",
            "is_failed",
            "has_host",
        )
    ]
    async with db.read() as session:
        rows = (
            await session.execute(
                select(*columns, func.count()).group_by(*columns).order_by(*columns[: len(keys)])
            )
        ).all()
    tallies: dict[str, _Tally] = {}
    for row in rows:
        values = tuple(row)
        location = dict(zip(keys, values[: len(keys)], strict=True))
        device_type, health, cordoned, held, attached, failed_, has_host, count = values[
            len(keys) :
        ]
        name = pool_name(Location(**location), keys)
        tally = tallies.setdefault(name, _Tally(location))
        unhealthy = health in UNHEALTHY
        elsewhere = bool(has_host) and not held
        unknown = health == HEALTH_UNKNOWN and config.unknown_health != "offer"
        out = unhealthy or unknown or bool(cordoned) or bool(failed_) or elsewhere
        tally.held_elsewhere += count if elsewhere else 0
        tally.devices += count
        tally.unhealthy += count if unhealthy else 0
        tally.cordoned += count if cordoned else 0
        tally.attach_failed += count if failed_ else 0
        tally.out_of_service += count if out else 0
        tally.reserved += count if held else 0
        tally.attached += count if attached else 0
        tally.free += count if not held and not out else 0
        tally.by_type[device_type] += count
    return tallies


def _pool_json(
    name: str, tally: _Tally, config: PoolConfig, publisher: Mapping[str, Any] | None
) -> dict[str, Any]:
    # The same rule as desired_pools: out-of-service devices are tainted, or withheld.
    withhold = config.unhealthy == "withhold" or not config.taints_supported
    withheld = tally.out_of_service if withhold else 0
    published = tally.devices - withheld
    tainted = 0 if withhold else tally.out_of_service
    return {
        "name": name,
        "location": tally.location,
        "region": tally.location.get("region"),
        "rack": tally.location.get("rack"),
        "devices": tally.devices,
        "published": published,
        "withheld": withheld,
        "healthy": tally.devices - tally.unhealthy,
        "unhealthy": tally.unhealthy,
        "cordoned": tally.cordoned,
        "attach_failed": tally.attach_failed,
        "held_elsewhere": tally.held_elsewhere,
        "reserved": tally.reserved,
        "attached": tally.attached,
        "free": tally.free,
        "utilisation": round(tally.reserved / published, 4) if published else 0.0,
        "by_type": dict(sorted(tally.by_type.items())),
        "resource_slice_count": minimum_slices(tainted, published - tainted),
        "publisher": dict(publisher) if publisher is not None else None,
    }


async def pools(
    db: Database, config: PoolConfig, publisher: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every pool made of present devices, by name, with counts, utilisation (reserved /
    published) and the publisher's status of it."""
    publisher = publisher or {}
    tallies = await _tallies(db, config)
    return [
        _pool_json(name, tallies[name], config, publisher.get(name)) for name in sorted(tallies)
    ]


async def pool_detail(
    db: Database, name: str, config: PoolConfig, publisher: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """One pool with its devices and slices; None when no present device makes it."""
    condition = await _pool_condition(db, name, config)
    tally = (await _tallies(db, config, condition)).get(name)
    if tally is None:
        return None
    devices = [
        d for d in await pool_devices(db) if pool_name(d.location, config.grouping_keys) == name
    ]
    pool = desired_pools(devices, config)[name]
    data = _pool_json(name, tally, config, (publisher or {}).get(name))
    page = await list_devices(db, DeviceFilter(pool=name), config, limit=max(1, tally.devices))
    data["node_selector"] = pool.node_selector
    data["slices"] = [
        {
            "index": s.index,
            "device_count": len(s.devices),
            "devices": [d["name"] for d in s.devices],
            "content_hash": s.content_hash,
        }
        for s in pool.slices
    ]
    data["withheld_devices"] = list(pool.withheld)
    data["dropped_attributes"] = [
        {"device": d.device, "attribute": d.attribute, "reason": d.reason} for d in pool.dropped
    ]
    data["device_list"] = page.items
    return data


async def attention(db: Database, config: PoolConfig, limit: int = 50) -> dict[str, Any]:
    """What needs a person: devices not healthy or cordoned (present ones, by name),
    reservations still settling, ``detach-failed`` reservations (an operator fixes the
    hardware, then forgets them), and devices held by another server with no reservation of
    ours (``held_elsewhere``, not offered). At most ``limit`` of each."""
    async with db.read() as session:
        unhealthy = (
            await session.scalars(
                select(Device)
                .where(Device.removed_at.is_(None), Device.health != "OK")
                .order_by(Device.name)
                .limit(limit)
            )
        ).all()
        cordoned = (
            await session.scalars(
                select(Device)
                .where(Device.removed_at.is_(None), Device.cordoned_at.is_not(None))
                .order_by(Device.name)
                .limit(limit)
            )
        ).all()
        waiting = (
            await session.scalars(
                select(Reservation)
                .where(
                    Reservation.state.in_(
                        [s for s in ACTIVE_RESERVATION_STATES if s not in (ATTACHED, DETACH_FAILED)]
                    )
                )
                .order_by(Reservation.id)
                .limit(limit)
            )
        ).all()
        stuck = (
            await session.scalars(
                select(Reservation)
                .where(Reservation.state == DETACH_FAILED)
                .order_by(Reservation.id)
                .limit(limit)
            )
        ).all()
        elsewhere = (
            await session.scalars(
                select(Device)
                .where(_state_condition("held-elsewhere"))
                .order_by(Device.name)
                .limit(limit)
            )
        ).all()
    states = await _reservation_states(db, [r.id for r in [*unhealthy, *cordoned]])
    return {
        "unhealthy": [device_json(r, states.get(r.id, []), config) for r in unhealthy],
        "cordoned": [device_json(r, states.get(r.id, []), config) for r in cordoned],
        "unsettled_reservations": [reservation_json(r) for r in waiting],
        "detach_failed": [reservation_json(r) for r in stuck],
        "held_elsewhere": [device_json(r, [], config) for r in elsewhere],
    }
