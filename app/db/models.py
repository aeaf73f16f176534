"""SQLAlchemy models: hosts, devices, their history, and the inventory sync status.

Times are stored in UTC. SQLite keeps no time zone, so :class:`UtcDateTime` gives every value
back as an aware UTC datetime on both databases.

``last_seen`` is written only when a device is added, changes or is removed, so that a sync that
finds no change writes nothing; for a device that is present (``removed_at`` is NULL) the time it
was last seen is the backend's ``InventoryStatus.last_success_at``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

VENDOR_ID_LENGTH = 1024
TEXT_LENGTH = 255


class UtcDateTime(TypeDecorator[dt.datetime]):
    """A timezone-aware UTC datetime on every database.

    Raises:
        ValueError: when given a naive datetime (ambiguous; callers must use UTC).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given; store aware UTC datetimes")
        return value.astimezone(dt.UTC)

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    """Declarative base with a naming convention for every constraint (Alembic needs names)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class LocationColumns:
    """Location columns shared by hosts and devices (see :class:`app.fabric.types.Location`)."""

    region: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    zone: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    site: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    row: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    rack: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    chassis: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    slot: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    fabric: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    fabric_zone: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))


class Host(LocationColumns, Base):
    """A server devices can be attached to, as the fabric manager reports it."""

    __tablename__ = "hosts"
    __table_args__ = (UniqueConstraint("backend", "host_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    backend: Mapped[str] = mapped_column(String(32))
    host_id: Mapped[str] = mapped_column(String(VENDOR_ID_LENGTH))
    name: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    hostname: Mapped[str | None] = mapped_column(String(TEXT_LENGTH), index=True)
    uuid: Mapped[str | None] = mapped_column(String(64))
    serial: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    health: Mapped[str] = mapped_column(String(16))
    attached_units: Mapped[list[str]] = mapped_column(JSON)
    content_hash: Mapped[str] = mapped_column(String(64))
    first_seen: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    last_seen: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    removed_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())


class Device(LocationColumns, Base):
    """A composable device and its last known state.

    ``name`` is the Kubernetes device name (a DNS label), derived once from ``vendor_id`` by
    :func:`app.naming.device_name` and kept for life, unique across the table so that it is
    unique in any pool.
    """

    __tablename__ = "devices"
    __table_args__ = (
        UniqueConstraint("backend", "vendor_id"),
        UniqueConstraint("name"),
        Index("ix_devices_region_rack", "region", "rack"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    backend: Mapped[str] = mapped_column(String(32))
    vendor_id: Mapped[str] = mapped_column(String(VENDOR_ID_LENGTH))
    name: Mapped[str] = mapped_column(String(63))
    attach_unit: Mapped[str] = mapped_column(String(VENDOR_ID_LENGTH))
    device_type: Mapped[str] = mapped_column(String(32))
    vendor_name: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    vendor: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    model: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    serial: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    uuid: Mapped[str | None] = mapped_column(String(64))
    part_number: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    firmware_version: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    memory_mib: Mapped[int | None] = mapped_column(BigInteger)
    capacity: Mapped[dict[str, int]] = mapped_column(JSON)
    attributes: Mapped[dict[str, Any]] = mapped_column(JSON)
    health: Mapped[str] = mapped_column(String(16))
    state: Mapped[str | None] = mapped_column(String(64))
    host_id: Mapped[str | None] = mapped_column(String(VENDOR_ID_LENGTH))
    shareable: Mapped[bool] = mapped_column(Boolean)
    content_hash: Mapped[str] = mapped_column(String(64))
    first_seen: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    last_seen: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    health_changed_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    removed_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    cordoned_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    cordon_reason: Mapped[str | None] = mapped_column(String(TEXT_LENGTH))
    # The backend's InventoryStatus.unit_writes when an event's unit read last wrote this row
    # (None: only full syncs wrote it). A full sync whose listing began at a lower count
    # leaves the row alone: it is newer than that listing.
    unit_write: Mapped[int | None] = mapped_column(BigInteger)


class DeviceEvent(Base):
    """One recorded change of a device: added, removed, returned, health, host or changed.

    ``old`` and ``new`` are short strings (a health value, a host id) or None.
    """

    __tablename__ = "device_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), index=True)
    at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    old: Mapped[str | None] = mapped_column(String(VENDOR_ID_LENGTH))
    new: Mapped[str | None] = mapped_column(String(VENDOR_ID_LENGTH))


class InventoryStatus(Base):
    """The state of the inventory sync of one backend.

    ``stale`` becomes true after ``inventory.stale_after_failures`` failed syncs in a row and
    false again on the next complete one. ``last_rejects`` holds at most 100 recent rejected
    vendor items as ``[{"vendor_id", "kind", "reason"}]``.
    """

    __tablename__ = "inventory_status"

    backend: Mapped[str] = mapped_column(String(32), primary_key=True)
    last_attempt_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    last_success_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    stale: Mapped[bool] = mapped_column(Boolean, default=False)
    last_error: Mapped[str | None] = mapped_column(Text)
    device_count: Mapped[int] = mapped_column(Integer, default=0)
    host_count: Mapped[int] = mapped_column(Integer, default=0)
    rejected_count: Mapped[int] = mapped_column(Integer, default=0)
    last_rejects: Mapped[list[dict[str, str]]] = mapped_column(JSON, default=list)
    # Counts the unit writes (an event's unit read again and written) of this backend, by
    # any process; see Device.unit_write.
    unit_writes: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))


ACTIVE_RESERVATION_STATES = (
    "pending",
    "attaching",
    "attached",
    "detaching",
    "failed",
    "detach-failed",
)
"""States in which a reservation holds its device (everything but ``released``)."""


class Reservation(Base):
    """The journal: our record that a device is held for a claim, and the fabric operation on it.

    Every attach is written as ``attaching`` and every detach as ``detaching`` before the call
    is sent (DESIGN.md, invariant 2), so after a crash the journal says what may be half done.

    States: ``pending`` (held, nothing sent) -> ``attaching`` -> ``attached`` -> ``detaching``
    -> ``released``; ``failed`` holds the device after an attach that cannot succeed, until it
    is rolled back through ``detaching``; ``detach-failed`` holds it after a detach that the
    fabric refused for good (or that failed too often): nothing is retried until an operator
    fixes the hardware and *forgets* the reservation (released without a detach). At most one
    active (not ``released``) exclusive reservation per device: the partial unique index
    ``uq_reservations_active_device`` enforces it on SQLite and PostgreSQL alike (invariant 1).
    Reservations of shareable devices are not exclusive.
    """

    __tablename__ = "reservations"
    __table_args__ = (
        Index(
            "uq_reservations_active_device",
            "device_id",
            unique=True,
            sqlite_where=text("exclusive AND state != 'released'"),
            postgresql_where=text("exclusive AND state != 'released'"),
        ),
        # Whether a device is held, by any active reservation, shareable or not: one look-up
        # instead of a walk of every active reservation (journal.py's reserve).
        Index(
            "ix_reservations_active_device_id",
            "device_id",
            sqlite_where=text("state != 'released'"),
            postgresql_where=text("state != 'released'"),
        ),
        Index("ix_reservations_claim_uid", "claim_uid"),
        Index("ix_reservations_state", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    claim_uid: Mapped[str] = mapped_column(String(64))
    claim_namespace: Mapped[str] = mapped_column(String(63))
    claim_name: Mapped[str] = mapped_column(String(253))
    request: Mapped[str] = mapped_column(String(TEXT_LENGTH))
    mode: Mapped[str] = mapped_column(String(16))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    device_name: Mapped[str] = mapped_column(String(63))
    pool: Mapped[str] = mapped_column(String(253))
    exclusive: Mapped[bool] = mapped_column(Boolean)
    node: Mapped[str | None] = mapped_column(String(253))
    host_id: Mapped[str | None] = mapped_column(String(VENDOR_ID_LENGTH))
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    operation_id: Mapped[str | None] = mapped_column(String(VENDOR_ID_LENGTH))
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    attached_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    released_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
