"""The reservation journal: which device is held for which claim, and what was sent to the fabric.

Rules it keeps (DESIGN.md invariants 1 and 2):

* A device has at most one active exclusive reservation. The database enforces it with the
  partial unique index ``uq_reservations_active_device``; :meth:`Journal.reserve` turns the
  index's refusal into :class:`DeviceHeld`.
* Every state change is a compare-and-set (``UPDATE ... WHERE id = ? AND state IN (...)``), so
  two workers, or a worker and the recovery pass, cannot both move one reservation.
* ``attaching`` and ``detaching`` are written before the fabric call is sent; after a crash
  they say which calls may have been half done.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from app.clock import utcnow
from app.db.engine import Database
from app.db.models import ACTIVE_RESERVATION_STATES, Device, Reservation
from app.fabric.types import DeviceType, FabricDevice

PENDING = "pending"
ATTACHING = "attaching"
ATTACHED = "attached"
DETACHING = "detaching"
RELEASED = "released"
FAILED = "failed"
STATES = (PENDING, ATTACHING, ATTACHED, DETACHING, RELEASED, FAILED)
MAX_ERROR_LENGTH = 2000



class DeviceHeld(Exception):
    """The device already has an active exclusive reservation for another claim.

    Attributes:
        device: the device name.
        holder: ``namespace/name`` of the claim holding it, if known.
    """

    def __init__(self, device: str, holder: str | None) -> None:
        super().__init__(
            f"device {device} is held by claim {holder}" if holder else f"device {device} is held"
        )
        self.device = device
        self.holder = holder


class UnknownDevice(Exception):
    """No present device has that name."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A ResourceClaim's identity."""

    uid: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ReservationView:
    """One journal row as a plain value (see :class:`app.db.models.Reservation`)."""

    id: int
    claim: ClaimRef
    request: str
    mode: str
    device_id: int
    device_name: str
    pool: str
    exclusive: bool
    node: str | None
    host_id: str | None
    state: str
    attempts: int
    last_error: str | None
    operation_id: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    attached_at: dt.datetime | None
    released_at: dt.datetime | None

    @property
    def active(self) -> bool:
        """True unless released."""
        return self.state != RELEASED

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601 in UTC)."""
        data: dict[str, Any] = {
            k: getattr(self, k) for k in self.__slots__ if k != "claim"
        }
        data["claim"] = {"uid": self.claim.uid, "namespace": self.claim.namespace,
                         "name": self.claim.name}
        for key in ("created_at", "updated_at", "attached_at", "released_at"):
            data[key] = data[key].isoformat() if data[key] else None
        return data


def _view(row: Reservation) -> ReservationView:
    return ReservationView(
        id=row.id,
        claim=ClaimRef(row.claim_uid, row.claim_namespace, row.claim_name),
        request=row.request, mode=row.mode, device_id=row.device_id,
        device_name=row.device_name, pool=row.pool, exclusive=row.exclusive, node=row.node,
        host_id=row.host_id, state=row.state, attempts=row.attempts, last_error=row.last_error,
        operation_id=row.operation_id, created_at=row.created_at, updated_at=row.updated_at,
        attached_at=row.attached_at, released_at=row.released_at,
    )


class Journal:
    """Reads and writes reservations. Each method is one short database transaction.

    Args:
        db: the database.
        clock: returns the current aware UTC time.
    """

    def __init__(self, db: Database, clock: Callable[[], dt.datetime] = utcnow) -> None:
        self.db = db
        self.clock = clock

    async def reserve(
        self,
        claim: ClaimRef,
        request: str,
        device_name: str,
        pool: str,
        mode: str,
        node: str | None,
        host_id: str | None,
    ) -> ReservationView:
        """Hold ``device_name`` for ``claim``'s ``request`` (state ``pending``).

        Idempotent: when ``claim`` already holds the device for that request, the existing
        active reservation is returned.

        Raises:
            UnknownDevice: no present device has that name.
            DeviceHeld: another claim holds the device.
        """
        try:
            # One transaction for the check and the insert (BEGIN IMMEDIATE on SQLite); the
            # time is taken inside it, so journal times follow commit order.
            async with self.db.write() as session:
                now = self.clock()
                device = (await session.execute(
                    select(Device.id, Device.shareable)
                    .where(Device.name == device_name, Device.removed_at.is_(None))
                )).one_or_none()
                if device is None:
                    raise UnknownDevice(f"device {device_name} is not in the inventory")
                existing = (await session.scalars(
                    select(Reservation).where(
                        Reservation.device_id == device.id,
                        Reservation.state.in_(ACTIVE_RESERVATION_STATES),
                    )
                )).all()
                for row in existing:
                    if row.claim_uid == claim.uid and row.request == request:
                        return _view(row)
                exclusive = not device.shareable
                if exclusive and existing:
                    first = existing[0]
                    raise DeviceHeld(device_name,
                                     f"{first.claim_namespace}/{first.claim_name}")
                inserted = await session.scalar(
                    insert(Reservation).returning(Reservation).values(
                        claim_uid=claim.uid, claim_namespace=claim.namespace,
                        claim_name=claim.name, request=request, mode=mode,
                        device_id=device.id, device_name=device_name, pool=pool,
                        exclusive=exclusive, node=node, host_id=host_id, state=PENDING,
                        attempts=0, created_at=now, updated_at=now,
                    )
                )
                assert inserted is not None
                return _view(inserted)
        except IntegrityError as err:
            # A concurrent reserve (another process, or PostgreSQL's weaker isolation) won
            # the race for the device; the index said no.
            holder = await self._holder_of(device_name)
            raise DeviceHeld(device_name, holder) from err

    async def _holder_of(self, device_name: str) -> str | None:
        async with self.db.read() as session:
            row = (await session.execute(
                select(Reservation.claim_namespace, Reservation.claim_name).where(
                    Reservation.device_name == device_name,
                    Reservation.state.in_(ACTIVE_RESERVATION_STATES),
                )
            )).first()
        return f"{row[0]}/{row[1]}" if row else None

    async def transition(
        self,
        reservation_id: int,
        expected: Collection[str],
        state: str,
        *,
        error: str | None = None,
        count_attempt: bool = False,
        node: str | None = None,
        host_id: str | None = None,
        operation_id: str | None = None,
    ) -> ReservationView | None:
        """Move a reservation to ``state`` if it is in one of ``expected`` states.

        Args:
            error: stored as ``last_error`` (cut to 2,000 characters); None clears it.
            count_attempt: add one to ``attempts``.
            node, host_id, operation_id: stored when given.

        Returns:
            The updated reservation, or None when it was not in an ``expected`` state (someone
            else moved it) or does not exist.

        Raises:
            ValueError: an unknown state.
        """
        if state not in STATES or not set(expected) <= set(STATES):
            raise ValueError(f"unknown reservation state in {state!r} / {sorted(expected)}")
        values: dict[str, Any] = {
            "state": state,
            "last_error": error[:MAX_ERROR_LENGTH] if error else None,
        }
        if count_attempt:
            values["attempts"] = Reservation.attempts + 1
        for key, value in (("node", node), ("host_id", host_id), ("operation_id", operation_id)):
            if value is not None:
                values[key] = value
        async with self.db.write() as session:
            # Taken inside the transaction, so journal times follow commit order.
            now = self.clock()
            values["updated_at"] = now
            if state == ATTACHED:
                values["attached_at"] = now
            if state == RELEASED:
                values["released_at"] = now
            row = await session.scalar(
                update(Reservation)
                .where(Reservation.id == reservation_id, Reservation.state.in_(tuple(expected)))
                .values(**values)
                .returning(Reservation)
                .execution_options(synchronize_session=False, populate_existing=True)
            )
            return _view(row) if row is not None else None

    async def get(self, reservation_id: int) -> ReservationView | None:
        """One reservation by id."""
        async with self.db.read() as session:
            row = await session.get(Reservation, reservation_id)
            return _view(row) if row else None

    async def for_claim(self, claim_uid: str, *, active_only: bool = True) -> list[ReservationView]:
        """The reservations of one claim, oldest first."""
        query = select(Reservation).where(Reservation.claim_uid == claim_uid)
        if active_only:
            query = query.where(Reservation.state.in_(ACTIVE_RESERVATION_STATES))
        async with self.db.read() as session:
            rows = (await session.scalars(query.order_by(Reservation.id))).all()
        return [_view(r) for r in rows]

    async def active(self, states: Collection[str] = ACTIVE_RESERVATION_STATES) -> list[
        ReservationView
    ]:
        """Every reservation in one of ``states`` (default: every active one), by id."""
        async with self.db.read() as session:
            rows = (await session.scalars(
                select(Reservation).where(Reservation.state.in_(tuple(states)))
                .order_by(Reservation.id)
            )).all()
        return [_view(r) for r in rows]

    async def recent(self, limit: int = 100, offset: int = 0) -> list[ReservationView]:
        """The newest reservations first (released ones included), for the admin API."""
        async with self.db.read() as session:
            rows = (await session.scalars(
                select(Reservation).order_by(Reservation.id.desc()).limit(limit).offset(offset)
            )).all()
        return [_view(r) for r in rows]

    async def fabric_device(self, reservation: ReservationView) -> FabricDevice:
        """The fabric's view of the reserved device, enough for attach and detach calls.

        Raises:
            UnknownDevice: the device row is gone.
        """
        async with self.db.read() as session:
            row = await session.get(Device, reservation.device_id)
        if row is None:
            raise UnknownDevice(f"device {reservation.device_name} is not in the inventory")
        return _fabric_device(row)

    async def fabric_device_by_name(self, name: str) -> FabricDevice:
        """The fabric's view of the device named ``name`` (present or removed).

        Raises:
            UnknownDevice: no device has that name.
        """
        async with self.db.read() as session:
            row = (await session.scalars(select(Device).where(Device.name == name))).first()
        if row is None:
            raise UnknownDevice(f"device {name} is not in the inventory")
        return _fabric_device(row)


def _fabric_device(row: Device) -> FabricDevice:
    return FabricDevice(
        vendor_id=row.vendor_id, attach_unit=row.attach_unit,
        device_type=DeviceType(row.device_type), uuid=row.uuid, host_id=row.host_id,
        shareable=row.shareable, name=row.vendor_name,
    )
