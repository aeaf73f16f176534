"""The inventory sync: keeps the database equal to what the fabric manager reports.

Each sync gathers (lists hosts and devices from the backend, outside any database transaction),
validates (pure), plans (pure, :mod:`app.inventory.plan`) and applies the plan in one database
transaction, then records the outcome (status row, metrics, logs). A listing that fails, even
part-way, changes no device: the last known inventory stays, and after
``stale_after_failures`` failures in a row the backend's inventory is marked stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from app.clock import utcnow
from app.db.engine import Database
from app.db.models import Device, DeviceEvent, Host, InventoryStatus, Reservation
from app.fabric.backend import FabricBackend
from app.fabric.errors import FabricError
from app.fabric.types import FabricDevice, FabricHost, Location, Rejected, UnitRead
from app.inventory.plan import Plan, StoredItem, plan_devices, plan_hosts
from app.inventory.validate import split_valid_devices, split_valid_hosts
from app.metrics import InventoryMetrics

log = logging.getLogger(__name__)

MAX_STORED_REJECTS = 100
_CHUNK = 500
# A sync that adds or removes at least this many devices, and a tenth of those present, has
# the devices table analyzed (autovacuum's own threshold: 50 rows and a tenth of the table).
ANALYZE_AFTER_ROWS = 50


@dataclass(frozen=True)
class SyncResult:
    """The outcome of one sync.

    Attributes:
        ok: True when the listing was complete and the plan applied.
        error: one line saying why not, when ``ok`` is False.
        added, changed, removed, returned, health_changed: device counts.
        hosts_written: host rows inserted, updated or marked removed.
        rejected: the vendor items rejected in this listing.
        row_writes: device and host rows written (0 for a sync that found no change).
        devices: devices present after the sync.
        seconds: wall time of the sync.
        holders_changed: devices whose holder (the host they are attached to) changed.
    """

    ok: bool
    error: str | None = None
    added: int = 0
    changed: int = 0
    removed: int = 0
    returned: int = 0
    health_changed: int = 0
    hosts_written: int = 0
    rejected: tuple[Rejected, ...] = ()
    row_writes: int = 0
    devices: int = 0
    seconds: float = 0.0
    stale: bool = False
    holders_changed: int = 0


def _public_name(err: Exception) -> str:
    """The name of the nearest class of ``err`` that the backend interface defines
    (:mod:`app.fabric.errors`, e.g. ``FabricUnavailable``): backends raise subclasses of their
    own, which say nothing to an operator. Any other error: the nearest public class."""
    for cls in type(err).__mro__:
        if cls.__module__ == FabricError.__module__:
            return cls.__name__
    for cls in type(err).__mro__:
        if not cls.__name__.startswith("_"):
            return cls.__name__
    return type(err).__name__


def _location_values(location: Location) -> dict[str, str | None]:
    return {
        "region": location.region,
        "zone": location.zone,
        "site": location.site,
        "row": location.row,
        "rack": location.rack,
        "chassis": location.chassis,
        "slot": location.slot,
        "fabric": location.fabric,
        "fabric_zone": location.fabric_zone,
    }


def device_values(device: FabricDevice) -> dict[str, Any]:
    """The ``devices`` columns for ``device`` (identity, times and name excluded)."""
    return {
        "attach_unit": device.attach_unit,
        "device_type": str(device.device_type),
        "vendor_name": device.name,
        "vendor": device.vendor,
        "model": device.model,
        "serial": device.serial,
        "uuid": device.uuid,
        "part_number": device.part_number,
        "firmware_version": device.firmware_version,
        "memory_mib": device.memory_mib,
        "capacity": dict(device.capacity),
        "attributes": dict(device.attributes),
        "health": str(device.health),
        "state": device.state,
        "host_id": device.host_id,
        "shareable": device.shareable,
        **_location_values(device.location),
    }


def host_values(host: FabricHost) -> dict[str, Any]:
    """The ``hosts`` columns for ``host`` (identity and times excluded)."""
    return {
        "name": host.name,
        "hostname": host.hostname,
        "uuid": host.uuid,
        "serial": host.serial,
        "health": str(host.health),
        "attached_units": list(host.attached_units),
        **_location_values(host.location),
    }


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass
class InventorySync:
    """Syncs one backend's inventory into the database.

    Args:
        backend: the fabric backend to list from.
        db: the database.
        stale_after_failures: failed syncs in a row before the inventory is marked stale.
        metrics: where to count; optional.
        clock: returns the current aware UTC time (injected in tests).
        name_scope: hashed into the names of new devices (:func:`app.naming.device_name`):
            the manager's name when several fabric managers are configured, else None.
        log_failures: log a failed sync as a warning (a command that reports the failure
            itself turns it off, so that a person does not read it twice).
        marks_stale: failures may mark the inventory stale. The controller's loop does; a
            one-off sync from the command line records its failure (last error, failures in
            a row) but leaves staleness to the controller that polls, so that a mistaken
            manual run (other credentials, say) does not flag a running controller's
            inventory stale behind its back.
    """

    backend: FabricBackend
    db: Database
    stale_after_failures: int = 3
    metrics: InventoryMetrics | None = None
    clock: Callable[[], dt.datetime] = utcnow
    name_scope: str | None = None
    log_failures: bool = True
    marks_stale: bool = True
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _known_rejects: set[tuple[str, str]] = field(default_factory=set, init=False, repr=False)
    # This process's full-sync writes and unit writes (apply_unit) take turns here before
    # they queue for the status row's lock in the database (see _lock_status).
    _turn: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    last_result: SyncResult | None = field(default=None, init=False)

    def trigger(self) -> None:
        """Ask the running loop to sync now instead of waiting for the interval."""
        self._wake.set()

    async def wait_trigger(self, timeout_s: float) -> None:
        """Wait ``timeout_s`` seconds, or less when :meth:`trigger` is called; then re-arm."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=timeout_s)
        self._wake.clear()

    async def run(self, interval_seconds: float) -> None:
        """Sync every ``interval_seconds`` (or sooner on :meth:`trigger`) until cancelled.

        Never raises because of a failed sync: errors are recorded and the loop goes on.
        """
        while True:
            try:
                await self.sync_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug must not stop the loop; it is logged with its traceback and counted.
                log.exception("inventory sync of backend %s failed unexpectedly", self.backend.name)
                if self.metrics:
                    self.metrics.syncs.labels(self.backend.name, "failed").inc()
            await self.wait_trigger(interval_seconds)

    async def sync_once(self) -> SyncResult:
        """List the backend and make the database match it.

        A :meth:`trigger` that came before the listing began is answered by it (cleared); one
        that comes while it lists stays set, for a sync after this one. A device that
        :meth:`apply_unit` wrote after the listing began (after an event), in this process or
        in any other (a controller while ``fabric-dra sync`` runs), is newer than what the
        listing says of it and is left as it is: the backend's count of unit writes
        (``InventoryStatus.unit_writes``) is read before the listing, and a row whose
        ``unit_write`` is higher was written after it began. A count, not a time: a clock
        that moved (or another replica's) cannot make a row look newer than it is.

        Returns:
            The :class:`SyncResult`; ``ok`` is False when the listing failed (the database
            then keeps every device as it was).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed; nothing was half-written.
        """
        self._wake.clear()
        started = time.monotonic()
        now = self.clock()
        units_before = await self._unit_writes()
        try:
            hosts_listing = await self.backend.list_hosts()
            devices_listing = await self.backend.list_devices()
        except FabricError as err:
            result = await self._record_failure(now, f"{_public_name(err)}: {err}")
            return self._finish(result, started)

        hosts, host_rejects = split_valid_hosts(hosts_listing.items)
        devices, device_rejects = split_valid_devices(devices_listing.items)
        rejected = (
            *hosts_listing.rejected,
            *host_rejects,
            *devices_listing.rejected,
            *device_rejects,
        )
        result = await self._apply(now, hosts, devices, rejected, units_before)
        self._log_rejects(rejected)
        return self._finish(result, started)

    async def _unit_writes(self) -> int:
        """The backend's count of unit writes so far (0 before any)."""
        kind = self.backend.name

        def read(conn: Connection) -> int:
            count = conn.execute(
                select(InventoryStatus.unit_writes).where(InventoryStatus.backend == kind)
            ).scalar()
            return int(count or 0)

        return await self.db.run_read(read)

    async def _lock_status(self, session: AsyncSession) -> InventoryStatus:
        """The backend's status row, created when missing, locked until the transaction ends
        (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already makes
        writers take turns). Full syncs and unit writes of every process take it first, so
        that what each reads of the device rows cannot change before it writes: READ
        COMMITTED would let another process's write land in between."""
        kind = self.backend.name
        status = await session.get(InventoryStatus, kind, with_for_update=True)
        if status is None:
            await session.execute(_insert_missing(self.db.dialect, kind))
            status = await session.get(InventoryStatus, kind, with_for_update=True)
            assert status is not None
        return status

    async def apply_unit(self, read: UnitRead, listed_from: dt.datetime) -> SyncResult:
        """Make the database match one attach unit read again on its own (after an event):
        its devices are added, changed or marked removed as a full sync would, with the same
        validation, rejections, naming and journal rules, in one transaction; nothing
        outside the unit changes, and the backend's sync status is left alone (this is not
        a complete listing).

        Args:
            read: the unit as the backend read it (:meth:`RedfishBackend.read_unit
                <app.fabric.redfish.backend.RedfishBackend.read_unit>`).
            listed_from: when the read began (holders the journal moved since are kept).

        Returns:
            A :class:`SyncResult` for the unit (``row_writes`` 0 when nothing changed).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed; nothing was half-written.
        """
        started = time.monotonic()
        now = self.clock()
        kind = self.backend.name
        devices, device_rejects = split_valid_devices(read.devices.items)
        rejected = (*read.devices.rejected, *device_rejects)
        rejected_keys = {r.vendor_id for r in rejected}
        async with self._turn:
            plan, devices = await self._apply_unit(read, listed_from, devices, rejected_keys, now)
        if self.metrics:
            self.metrics.row_writes.labels(kind, "devices").inc(plan.row_writes)
            for item in rejected:
                self.metrics.rejected.labels(kind, item.kind).inc()
        self._log_rejects(rejected)
        kinds = [e.kind for e in plan.events]
        return SyncResult(
            ok=True,
            added=len(plan.inserts),
            changed=sum(1 for u in plan.updates if not u.returned),
            removed=len(plan.removals),
            returned=sum(1 for u in plan.updates if u.returned),
            health_changed=kinds.count("health"),
            holders_changed=kinds.count("host"),
            rejected=rejected,
            row_writes=plan.row_writes,
            devices=len(devices),
            seconds=time.monotonic() - started,
        )

    async def _apply_unit(
        self,
        read: UnitRead,
        listed_from: dt.datetime,
        devices: list[FabricDevice],
        rejected_keys: set[str],
        now: dt.datetime,
    ) -> tuple[Plan, list[FabricDevice]]:
        """:meth:`apply_unit`'s transaction: the plan it wrote, and the devices it planned
        with (holders the journal moved since ``listed_from`` kept)."""
        kind = self.backend.name
        listed_keys = {d.vendor_id for d in devices}
        async with self.db.write() as session:
            status = await self._lock_status(session)
            previous_success = status.last_success_at
            stored = [
                StoredItem(
                    row.id,
                    row.vendor_id,
                    row.content_hash,
                    row.removed_at is not None,
                    row.health,
                    row.host_id,
                    row.name,
                    row.attach_unit,
                )
                for row in await session.execute(
                    select(
                        Device.id,
                        Device.vendor_id,
                        Device.content_hash,
                        Device.removed_at,
                        Device.health,
                        Device.host_id,
                        Device.name,
                        Device.attach_unit,
                    ).where(
                        Device.backend == kind,
                        # The unit's devices, and any listed device stored under another unit
                        # (moved): an update, never a second row.
                        (Device.attach_unit == read.unit)
                        | Device.vendor_id.in_(sorted(listed_keys) or [""]),
                    )
                )
            ]
            devices = await self._keep_journal_holders(session, listed_from, stored, devices)
            stored_keys = {item.key for item in stored}
            taken: set[str] = set()
            if any(d.vendor_id not in stored_keys for d in devices):
                taken = set((await session.scalars(select(Device.name))).all())
            plan = plan_devices(stored, devices, rejected_keys, taken, self.name_scope)
            unit_write = None
            if plan.row_writes:
                # Counted, and the rows marked, so that a full sync whose listing began
                # before this leaves them alone (sync_once).
                unit_write = status.unit_writes = (status.unit_writes or 0) + 1
            await self._write_devices(session, plan, now, previous_success, unit_write)
        return plan, devices

    async def _apply(
        self,
        now: dt.datetime,
        hosts: list[FabricHost],
        devices: list[FabricDevice],
        rejected: tuple[Rejected, ...],
        units_before: int,
    ) -> SyncResult:
        kind = self.backend.name
        rejected_keys = {r.vendor_id for r in rejected}
        async with self._turn, self.db.write() as session:
            status = await self._lock_status(session)
            previous_success = status.last_success_at

            stored_hosts = [
                StoredItem(
                    row.id, row.host_id, row.content_hash, row.removed_at is not None, row.health
                )
                for row in await session.execute(
                    select(
                        Host.id, Host.host_id, Host.content_hash, Host.removed_at, Host.health
                    ).where(Host.backend == kind)
                )
            ]
            host_plan = plan_hosts(stored_hosts, hosts, rejected_keys)

            stored_devices = []
            # Devices a unit write (after an event, by any process) wrote since this listing
            # began: newer than what the listing says of them, so the plan leaves them out
            # (kept as they are).
            newer: dict[str, bool] = {}  # vendor id -> present
            for row in await session.execute(
                select(
                    Device.id,
                    Device.vendor_id,
                    Device.content_hash,
                    Device.removed_at,
                    Device.health,
                    Device.host_id,
                    Device.name,
                    Device.attach_unit,
                    Device.unit_write,
                ).where(Device.backend == kind)
            ):
                if row.unit_write is not None and row.unit_write > units_before:
                    newer[row.vendor_id] = row.removed_at is None
                    continue
                stored_devices.append(
                    StoredItem(
                        row.id,
                        row.vendor_id,
                        row.content_hash,
                        row.removed_at is not None,
                        row.health,
                        row.host_id,
                        row.name,
                        row.attach_unit,
                    )
                )
            if newer:
                devices = [d for d in devices if d.vendor_id not in newer]
            devices = await self._keep_journal_holders(session, now, stored_devices, devices)
            stored_keys = {s.key for s in stored_devices}
            taken: set[str] = set()
            if any(d.vendor_id not in stored_keys for d in devices):
                taken = set((await session.scalars(select(Device.name))).all())
            device_plan = plan_devices(
                stored_devices, devices, rejected_keys, taken, self.name_scope
            )

            await self._write_hosts(session, host_plan, now, previous_success)
            await self._write_devices(session, device_plan, now, previous_success)

            removed_keys = {s.key for s in device_plan.removals}
            listed_keys = {d.vendor_id for d in devices}
            present = (
                len(devices)
                + sum(
                    1
                    for s in stored_devices
                    if not s.removed and s.key not in listed_keys and s.key not in removed_keys
                )
                + sum(newer.values())
            )
            status.last_attempt_at = now
            status.last_success_at = now
            status.consecutive_failures = 0
            status.stale = False
            status.last_error = None
            status.device_count = present
            status.host_count = len(hosts)
            status.rejected_count = len(rejected)
            status.last_rejects = [
                {"vendor_id": r.vendor_id, "kind": r.kind, "reason": r.reason}
                for r in rejected[:MAX_STORED_REJECTS]
            ]
            removed_total = await session.scalar(
                select(func.count())
                .select_from(Device)
                .where(Device.backend == kind, Device.removed_at.is_not(None))
            )

        bulk = len(device_plan.inserts) + len(device_plan.removals)
        if bulk >= ANALYZE_AFTER_ROWS and bulk * 10 >= present:
            # The planner's statistics of a table filled (or emptied) in bulk are wrong until
            # autovacuum analyzes it; refresh them now (Database.analyze). Best effort.
            try:
                await self.db.analyze("devices")
            except SQLAlchemyError as err:
                log.warning("inventory sync of backend %s: ANALYZE devices failed: %s", kind, err)
        if self.metrics:
            self.metrics.devices.labels(kind, "present").set(present)
            self.metrics.devices.labels(kind, "removed").set(removed_total or 0)
            self.metrics.row_writes.labels(kind, "devices").inc(device_plan.row_writes)
            self.metrics.row_writes.labels(kind, "hosts").inc(host_plan.row_writes)
            self.metrics.stale.labels(kind).set(0)
            self.metrics.last_success.labels(kind).set(now.timestamp())
            for item in rejected:
                self.metrics.rejected.labels(kind, item.kind).inc()
        kinds = [e.kind for e in device_plan.events]
        return SyncResult(
            ok=True,
            added=len(device_plan.inserts),
            changed=sum(1 for u in device_plan.updates if not u.returned),
            removed=len(device_plan.removals),
            returned=sum(1 for u in device_plan.updates if u.returned),
            health_changed=kinds.count("health"),
            hosts_written=host_plan.row_writes,
            rejected=rejected,
            row_writes=device_plan.row_writes + host_plan.row_writes,
            devices=present,
        )

    @staticmethod
    async def _keep_journal_holders(
        session: Any,
        listed_from: dt.datetime,
        stored: Sequence[StoredItem],
        devices: list[FabricDevice],
    ) -> list[FabricDevice]:
        """The listing, with the stored holder kept for each device whose reservation moved
        after the listing began.

        The journal records a verified attach or detach as the device's holder at once; a
        listing taken before it would otherwise write the old holder back (a free device shown
        as held by another server, an attached one as free) until the next sync.
        """
        moved = set(
            (
                await session.scalars(
                    select(Reservation.device_id).where(Reservation.updated_at >= listed_from)
                )
            ).all()
        )
        if not moved:
            return devices
        holder = {s.key: s.host_id for s in stored if s.id in moved}
        return [
            dataclasses.replace(d, host_id=holder[d.vendor_id])
            if d.vendor_id in holder and holder[d.vendor_id] != d.host_id
            else d
            for d in devices
        ]

    async def _write_hosts(
        self, session: Any, plan: Plan, now: dt.datetime, previous_success: dt.datetime | None
    ) -> None:
        kind = self.backend.name
        rows = []
        for new in plan.inserts:
            assert isinstance(new.item, FabricHost)
            rows.append(
                {
                    "backend": kind,
                    "host_id": new.item.host_id,
                    "content_hash": new.content_hash,
                    "first_seen": now,
                    "last_seen": now,
                    "removed_at": None,
                    **host_values(new.item),
                }
            )
        for chunk in _chunks(rows):
            await session.execute(insert(Host), list(chunk))
        updates = []
        for changed in plan.updates:
            assert isinstance(changed.item, FabricHost)
            updates.append(
                {
                    "id": changed.stored.id,
                    "content_hash": changed.content_hash,
                    "last_seen": now,
                    "removed_at": None,
                    **host_values(changed.item),
                }
            )
        for chunk in _chunks(updates):
            await session.execute(update(Host), list(chunk))
        removed_ids = [s.id for s in plan.removals]
        for chunk in _chunks(removed_ids):
            await session.execute(
                update(Host)
                .where(Host.id.in_(chunk))
                .values(removed_at=now, last_seen=previous_success or now)
                .execution_options(synchronize_session=False)
            )

    async def _write_devices(
        self,
        session: Any,
        plan: Plan,
        now: dt.datetime,
        previous_success: dt.datetime | None,
        unit_write: int | None = None,
    ) -> None:
        """Write ``plan``; with ``unit_write`` (a unit write's count) every row written is
        marked with it."""
        kind = self.backend.name
        marked = {} if unit_write is None else {"unit_write": unit_write}
        ids: dict[str, int] = {c.stored.key: c.stored.id for c in plan.updates}
        ids.update({s.key: s.id for s in plan.removals})
        rows = []
        for new in plan.inserts:
            assert isinstance(new.item, FabricDevice)
            rows.append(
                {
                    "backend": kind,
                    "vendor_id": new.item.vendor_id,
                    "name": new.name,
                    "content_hash": new.content_hash,
                    "first_seen": now,
                    "last_seen": now,
                    "health_changed_at": None,
                    "removed_at": None,
                    **marked,
                    **device_values(new.item),
                }
            )
        for chunk in _chunks(rows):
            result = await session.execute(
                insert(Device).returning(Device.id, Device.vendor_id), list(chunk)
            )
            ids.update({vendor_id: row_id for row_id, vendor_id in result.all()})

        health_moved = {e.key for e in plan.events if e.kind == "health"}
        updates = []
        for changed in plan.updates:
            assert isinstance(changed.item, FabricDevice)
            values = {
                "id": changed.stored.id,
                "content_hash": changed.content_hash,
                "last_seen": now,
                "removed_at": None,
                **marked,
                **device_values(changed.item),
            }
            if changed.stored.key in health_moved:
                values["health_changed_at"] = now
            updates.append(values)
        # Rows with and without health_changed_at go in separate batches: a bulk UPDATE by
        # primary key needs the same columns in every row of one batch.
        for batch in (
            [u for u in updates if "health_changed_at" in u],
            [u for u in updates if "health_changed_at" not in u],
        ):
            for chunk in _chunks(batch):
                await session.execute(update(Device), list(chunk))

        removed_ids = [s.id for s in plan.removals]
        for chunk in _chunks(removed_ids):
            await session.execute(
                update(Device)
                .where(Device.id.in_(chunk))
                .values(removed_at=now, last_seen=previous_success or now, **marked)
                .execution_options(synchronize_session=False)
            )
        events = [
            {"device_id": ids[e.key], "at": now, "kind": e.kind, "old": e.old, "new": e.new}
            for e in plan.events
            if e.key in ids
        ]
        for chunk in _chunks(events):
            await session.execute(insert(DeviceEvent), list(chunk))

    async def _record_failure(self, now: dt.datetime, error: str) -> SyncResult:
        kind = self.backend.name
        async with self.db.write() as session:
            status = await self._lock_status(session)
            status.last_attempt_at = now
            status.consecutive_failures = (status.consecutive_failures or 0) + 1
            status.last_error = error[:2000]
            if self.marks_stale:
                status.stale = status.consecutive_failures >= self.stale_after_failures
            stale = bool(status.stale)
            failures = status.consecutive_failures
        if self.log_failures:
            log.warning(
                "inventory sync of backend %s failed (%d in a row%s): %s; keeping the last known "
                "inventory",
                kind,
                failures,
                ", inventory is stale" if stale else "",
                error,
            )
        if self.metrics:
            self.metrics.stale.labels(kind).set(1 if stale else 0)
        return SyncResult(ok=False, error=error, stale=stale)

    def _log_rejects(self, rejected: tuple[Rejected, ...]) -> None:
        # Each distinct problem is logged once when it appears, not on every sync.
        current = {(r.vendor_id, r.reason) for r in rejected}
        for item in rejected:
            if (item.vendor_id, item.reason) not in self._known_rejects:
                log.warning(
                    "backend %s: rejected %s: %s", self.backend.name, item.vendor_id, item.reason
                )
        self._known_rejects = current

    def _finish(self, result: SyncResult, started: float) -> SyncResult:
        seconds = time.monotonic() - started
        result = dataclasses.replace(result, seconds=seconds)
        kind = self.backend.name
        if self.metrics:
            self.metrics.syncs.labels(kind, "ok" if result.ok else "failed").inc()
            self.metrics.sync_seconds.labels(kind).observe(seconds)
        if result.ok:
            log.info(
                "inventory sync of backend %s: %d devices (%d added, %d changed, %d removed, "
                "%d returned, %d rejected), %d rows written in %.2fs",
                kind,
                result.devices,
                result.added,
                result.changed,
                result.removed,
                result.returned,
                len(result.rejected),
                result.row_writes,
                seconds,
            )
        self.last_result = result
        return result


def _insert_missing(dialect: str, backend: str) -> Any:
    """``INSERT`` of a new status row for ``backend`` that does nothing when another
    transaction made it first (``ON CONFLICT DO NOTHING``, in both databases' dialects)."""
    if dialect == "postgresql":
        return postgresql_insert(InventoryStatus).values(backend=backend).on_conflict_do_nothing()
    return sqlite_insert(InventoryStatus).values(backend=backend).on_conflict_do_nothing()
