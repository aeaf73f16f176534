"""The inventory sync against real databases (SQLite and PostgreSQL), with an in-memory backend.

The same sync is tested over real HTTP with the Redfish backend and simulator in
test_inventory_redfish.py; here the backend is a plain double so every case is exact.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import pytest
from builders import MemoryBackend, eventually, gpu, host
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError

from app.db.engine import Database
from app.db.models import Device, DeviceEvent, Host, InventoryStatus
from app.fabric.errors import FabricUnavailable
from app.fabric.types import Health, Listing, Rejected, UnitRead
from app.inventory import InventorySync
from app.inventory.queries import list_status
from app.metrics import InventoryMetrics
from app.naming import is_dns_label


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        self.now += dt.timedelta(minutes=1)
        return self.now


def inventory(regions: int = 2, racks: int = 4, per_rack: int = 16) -> MemoryBackend:
    names = ["us-east", "us-west", "eu-central"][:regions]
    devices = [
        gpu(i, region=r, rack=f"rack-{k:02d}")
        for r in names
        for k in range(1, racks + 1)
        for i in range(per_rack)
    ]
    hosts = [
        host(i, region=r, rack=f"rack-{k:02d}")
        for r in names
        for k in range(1, racks + 1)
        for i in range(1, 3)
    ]
    return MemoryBackend(devices, hosts)


def make_sync(backend: MemoryBackend, db: Database, **kw) -> tuple[InventorySync, InventoryMetrics]:
    metrics = InventoryMetrics.create(CollectorRegistry())
    return InventorySync(backend, db, metrics=metrics, clock=Clock(), **kw), metrics


async def devices_by_vendor_id(db: Database) -> dict[str, Device]:
    async with db.read() as s:
        return {d.vendor_id: d for d in (await s.scalars(select(Device))).all()}


async def count(db: Database, model) -> int:
    async with db.read() as s:
        return int(await s.scalar(select(func.count()).select_from(model)) or 0)


async def test_first_sync_lands_every_device_with_its_location(db: Database) -> None:
    backend = inventory()
    sync, metrics = make_sync(backend, db)
    result = await sync.sync_once()
    assert result.ok and result.added == 128 and result.devices == 128
    rows = await devices_by_vendor_id(db)
    assert len(rows) == 128
    sample = rows[gpu(3, region="us-west", rack="rack-02").vendor_id]
    assert (sample.region, sample.rack, sample.row) == ("us-west", "rack-02", "row-1")
    assert sample.health == "OK" and sample.device_type == "gpu"
    assert sample.memory_mib == 81920 and sample.removed_at is None
    assert sample.first_seen.tzinfo is not None
    assert all(is_dns_label(d.name) for d in rows.values())
    assert len({d.name for d in rows.values()}) == 128
    assert await count(db, Host) == 16
    assert metrics.devices.labels("memory", "present")._value.get() == 128


async def test_a_second_sync_with_no_change_writes_no_row(db: Database) -> None:
    sync, _ = make_sync(inventory(), db)
    await sync.sync_once()
    before = await devices_by_vendor_id(db)
    result = await sync.sync_once()
    assert result.ok and result.row_writes == 0 and result.added == result.changed == 0
    after = await devices_by_vendor_id(db)
    assert {k: v.last_seen for k, v in after.items()} == {k: v.last_seen for k, v in before.items()}
    assert await count(db, DeviceEvent) == 128  # only the "added" events of the first sync


async def test_additions_removals_and_health_changes_are_reflected(db: Database) -> None:
    backend = inventory(regions=1, racks=1, per_rack=4)
    sync, _ = make_sync(backend, db)
    await sync.sync_once()
    names_before = {k: v.name for k, v in (await devices_by_vendor_id(db)).items()}

    gone = backend.devices.pop(0)
    backend.devices[0] = replace(backend.devices[0], health=Health.CRITICAL)
    backend.devices.append(gpu(99))
    result = await sync.sync_once()
    assert (result.added, result.changed, result.removed, result.health_changed) == (1, 1, 1, 1)
    assert result.row_writes == 3

    rows = await devices_by_vendor_id(db)
    assert rows[gone.vendor_id].removed_at is not None
    assert rows[backend.devices[0].vendor_id].health == "Critical"
    assert rows[backend.devices[0].vendor_id].health_changed_at is not None
    async with db.read() as s:
        kinds = sorted(
            (await s.scalars(select(DeviceEvent.kind).where(DeviceEvent.kind != "added"))).all()
        )
    assert kinds == ["health", "removed"]

    # The removed device comes back: same row, same name, no longer removed.
    backend.devices.append(gone)
    result = await sync.sync_once()
    assert result.returned == 1
    rows = await devices_by_vendor_id(db)
    assert rows[gone.vendor_id].removed_at is None
    assert rows[gone.vendor_id].name == names_before[gone.vendor_id]


class ChangesWhileListing(MemoryBackend):
    """Lists as :class:`MemoryBackend` does, then awaits ``during`` (once) before answering:
    the listing is taken, and the world moves on before the sync writes it."""

    during: Callable[[], Awaitable[None]] | None = None

    async def list_devices(self) -> Listing:
        listing = await super().list_devices()
        during, self.during = self.during, None
        if during is not None:
            await during()
        return listing


async def test_a_unit_an_event_wrote_while_a_full_sync_listed_is_kept(db: Database) -> None:
    first = inventory(regions=1, racks=1, per_rack=4)
    backend = ChangesWhileListing(first.devices, first.hosts)
    sync, _ = make_sync(backend, db)
    await sync.sync_once()
    critical = replace(backend.devices[0], health=Health.CRITICAL)
    gone = backend.devices[1]
    added = gpu(50)

    async def events_applied() -> None:
        # The fabric changes after the listing was taken; each change's event has its unit
        # read again and written (EventApplier) before the full sync writes its listing.
        backend.devices[0] = critical
        backend.devices.remove(gone)
        backend.devices.append(added)
        for unit, devices in (
            (critical.attach_unit, (critical,)),
            (gone.attach_unit, ()),
            (added.attach_unit, (added,)),
        ):
            read = UnitRead(unit, Listing(devices), gone=not devices)
            assert (await sync.apply_unit(read, sync.clock())).row_writes == 1

    backend.during = events_applied
    result = await sync.sync_once()
    assert result.ok and result.row_writes == 0  # its listing is older than those rows
    rows = await devices_by_vendor_id(db)
    assert rows[critical.vendor_id].health == "Critical"
    assert rows[gone.vendor_id].removed_at is not None
    assert rows[added.vendor_id].removed_at is None
    async with db.read() as s:
        status = await s.get(InventoryStatus, "memory")
    assert status is not None and status.device_count == 4
    # The next listing agrees with them: nothing to write.
    assert (await sync.sync_once()).row_writes == 0


@pytest.fixture
async def other_db(database_url: str) -> AsyncIterator[Database]:
    """A second Database on the test's database: another process's connections."""
    database = Database.connect(database_url)
    yield database
    await database.dispose()


def controller_of(backend: MemoryBackend, database: Database) -> InventorySync:
    """The running controller's sync of ``backend``'s fabric, on ``database``."""
    return make_sync(MemoryBackend(list(backend.devices), backend.hosts), database)[0]


async def test_a_unit_another_process_wrote_while_a_one_off_sync_listed_is_kept(
    db: Database, other_db: Database
) -> None:
    # ``fabric-dra sync`` run by hand while the controller applies events: two processes,
    # each with its own sync and its own connections to one database.
    first = inventory(regions=1, racks=1, per_rack=3)
    backend = ChangesWhileListing(first.devices, first.hosts)
    one_off, _ = make_sync(backend, db)
    await one_off.sync_once()
    controller = controller_of(backend, other_db)
    critical = replace(backend.devices[0], health=Health.CRITICAL)

    async def event_applied_elsewhere() -> None:
        backend.devices[0] = critical
        read = UnitRead(critical.attach_unit, Listing((critical,)))
        assert (await controller.apply_unit(read, controller.clock())).row_writes == 1

    backend.during = event_applied_elsewhere
    result = await one_off.sync_once()
    assert result.ok and result.row_writes == 0
    assert (await devices_by_vendor_id(db))[critical.vendor_id].health == "Critical"
    async with db.read() as s:
        status = await s.get(InventoryStatus, "memory")
    assert status is not None and status.unit_writes == 1 and status.device_count == 3

    # A listing that begins after the unit write is newer than it, and wins.
    backend.devices[0] = replace(critical, health=Health.OK)
    assert (await one_off.sync_once()).row_writes == 1
    assert (await devices_by_vendor_id(db))[critical.vendor_id].health == "OK"


async def test_a_unit_write_waits_for_a_full_sync_of_another_process_to_commit(
    db: Database, other_db: Database
) -> None:
    # Under READ COMMITTED (PostgreSQL), a unit write landing between a full sync's read of
    # the rows and its write would be overwritten: both lock the status row first.
    backend = inventory(regions=1, racks=1, per_rack=2)
    one_off, _ = make_sync(backend, db)
    await one_off.sync_once()
    controller = controller_of(backend, other_db)
    critical = replace(backend.devices[0], health=Health.CRITICAL)
    read = UnitRead(critical.attach_unit, Listing((critical,)))
    async with db.write() as session:
        await one_off._lock_status(session)  # as a full sync's transaction does
        unit = asyncio.create_task(controller.apply_unit(read, controller.clock()))
        await asyncio.sleep(0.5)
        assert not unit.done()
    assert (await asyncio.wait_for(unit, 10)).row_writes == 1


async def test_a_unit_write_before_any_full_sync_makes_the_status_row_and_counts(
    db: Database,
) -> None:
    backend = inventory(regions=1, racks=1, per_rack=2)
    sync, _ = make_sync(backend, db)
    device = backend.devices[0]
    read = UnitRead(device.attach_unit, Listing((device,)))
    assert (await sync.apply_unit(read, sync.clock())).row_writes == 1
    assert (await sync.apply_unit(read, sync.clock())).row_writes == 0  # nothing new: no count
    async with db.read() as s:
        status = await s.get(InventoryStatus, "memory")
        row = (await s.scalars(select(Device))).one()
    assert status is not None and status.unit_writes == 1 and status.last_success_at is None
    assert row.unit_write == 1
    assert await list_status(db) == []  # not synced yet: no status to show
    # The first full sync keeps the row the unit write made and adds the rest.
    result = await sync.sync_once()
    assert result.ok and result.added == 1 and result.devices == 2
    assert [(s.backend, s.device_count) for s in await list_status(db)] == [("memory", 2)]


async def test_a_row_from_a_clock_ahead_is_still_corrected_by_a_full_sync(db: Database) -> None:
    # Another replica with a clock a day ahead wrote the rows: only this process's own unit
    # writes during a listing are kept from it, never rows that merely look newer.
    backend = inventory(regions=1, racks=1, per_rack=2)
    sync, _ = make_sync(backend, db)
    await sync.sync_once()
    async with db.write() as s:
        await s.execute(
            Device.__table__.update().values(last_seen=dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
        )
    backend.devices[0] = replace(backend.devices[0], health=Health.CRITICAL)
    assert (await sync.sync_once()).row_writes == 1
    assert (await devices_by_vendor_id(db))[backend.devices[0].vendor_id].health == "Critical"


async def test_a_trigger_before_a_listing_is_answered_by_it_one_during_it_asks_again(
    db: Database,
) -> None:
    first = inventory(regions=1, racks=1, per_rack=1)
    backend = ChangesWhileListing(first.devices, first.hosts)
    sync, _ = make_sync(backend, db)
    sync.trigger()  # before the first listing: it answers this
    task = asyncio.create_task(sync.run(interval_seconds=3600))
    try:
        await eventually(lambda: sync.last_result is not None, what="the first sync")
        await asyncio.sleep(0.3)
        assert backend.list_calls == 1

        async def trigger() -> None:
            sync.trigger()  # while listing: events may be missed by this listing

        backend.during = trigger
        sync.trigger()
        await eventually(lambda: backend.list_calls == 3, what="a sync after the one asked")
        await asyncio.sleep(0.3)
        assert backend.list_calls == 3
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_bad_vendor_data_rejects_only_the_offending_devices(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    backend = inventory(regions=1, racks=1, per_rack=4)
    backend.devices += [
        replace(gpu(50), serial="bad\x00serial"),
        replace(gpu(51), memory_mib=-4),
        gpu(52),
        gpu(52),
        replace(gpu(53), model="Карта 🚀"),
    ]
    backend.device_rejects = [
        Rejected("/redfish/v1/x/broken", "Processor has no @odata.id", "missing-field")
    ]
    sync, metrics = make_sync(backend, db)
    with caplog.at_level(logging.WARNING):
        result = await sync.sync_once()
    assert result.ok and result.devices == 5
    assert sorted(r.kind for r in result.rejected) == [
        "bad-value",
        "bad-value",
        "duplicate",
        "duplicate",
        "missing-field",
    ]
    rows = await devices_by_vendor_id(db)
    assert set(rows) == {d.vendor_id for d in backend.devices[:4]} | {gpu(53).vendor_id}
    assert "bad\\x00serial" not in caplog.text
    assert "serial contains control characters" in caplog.text
    assert metrics.rejected.labels("memory", "duplicate")._value.get() == 2
    async with db.read() as s:
        status = await s.get(InventoryStatus, "memory")
    assert status is not None and status.rejected_count == 5
    assert {r["kind"] for r in status.last_rejects} == {"bad-value", "duplicate", "missing-field"}

    # The same problems on the next sync are not logged again.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        await sync.sync_once()
    assert "rejected" not in caplog.text


async def test_a_device_that_turns_bad_keeps_its_last_known_state(db: Database) -> None:
    backend = inventory(regions=1, racks=1, per_rack=2)
    sync, _ = make_sync(backend, db)
    await sync.sync_once()
    backend.devices[0] = replace(backend.devices[0], memory_mib=-1)
    result = await sync.sync_once()
    assert result.removed == 0 and len(result.rejected) == 1
    row = (await devices_by_vendor_id(db))[backend.devices[0].vendor_id]
    assert row.removed_at is None and row.memory_mib == 81920


async def test_backend_down_keeps_the_inventory_and_turns_stale(db: Database) -> None:
    backend = inventory(regions=1, racks=1, per_rack=3)
    sync, metrics = make_sync(backend, db, stale_after_failures=2)
    await sync.sync_once()
    backend.fail_with = FabricUnavailable("connection refused")
    first = await sync.sync_once()
    assert not first.ok and not first.stale and "connection refused" in (first.error or "")
    second = await sync.sync_once()
    assert second.stale
    rows = await devices_by_vendor_id(db)
    assert len(rows) == 3 and all(r.removed_at is None for r in rows.values())
    async with db.read() as s:
        status = await s.get(InventoryStatus, "memory")
    assert status is not None and status.stale and status.consecutive_failures == 2
    assert metrics.stale.labels("memory")._value.get() == 1

    backend.fail_with = None
    result = await sync.sync_once()
    assert result.ok and result.row_writes == 0
    async with db.read() as s:
        status = await s.get(InventoryStatus, "memory")
    assert status is not None and not status.stale and status.consecutive_failures == 0
    assert metrics.stale.labels("memory")._value.get() == 0


async def test_a_one_off_sync_records_its_failures_but_leaves_staleness_to_the_controller(
    db: Database,
) -> None:
    backend = inventory(regions=1, racks=1, per_rack=3)
    controller, _ = make_sync(backend, db, stale_after_failures=2)
    await controller.sync_once()
    backend.fail_with = FabricUnavailable("connection refused")
    one_off, _ = make_sync(backend, db, stale_after_failures=2, marks_stale=False)
    for _ in range(3):
        result = await one_off.sync_once()
        assert not result.ok and not result.stale
    async with db.read() as s:
        status = await s.get(InventoryStatus, "memory")
    assert status is not None and not status.stale and status.consecutive_failures == 3
    assert "connection refused" in (status.last_error or "")
    # The controller's own failure judges with the failures in a row so far.
    assert (await controller.sync_once()).stale
    # A one-off failure leaves a stale mark the controller set, too.
    assert (await one_off.sync_once()).stale


async def test_hosts_are_added_changed_and_removed(db: Database) -> None:
    backend = inventory(regions=1, racks=1, per_rack=1)
    sync, _ = make_sync(backend, db)
    await sync.sync_once()
    backend.hosts[0] = replace(backend.hosts[0], attached_units=("/rb/1",))
    removed = backend.hosts.pop()
    result = await sync.sync_once()
    assert result.hosts_written == 2
    async with db.read() as s:
        rows = {h.host_id: h for h in (await s.scalars(select(Host))).all()}
    assert rows[backend.hosts[0].host_id].attached_units == ["/rb/1"]
    assert rows[removed.host_id].removed_at is not None


async def test_the_loop_syncs_on_trigger_and_survives_errors(db: Database) -> None:
    import asyncio

    backend = inventory(regions=1, racks=1, per_rack=1)
    sync, _ = make_sync(backend, db)
    task = asyncio.create_task(sync.run(interval_seconds=3600))
    try:
        for _ in range(200):
            if sync.last_result is not None:
                break
            await asyncio.sleep(0.01)
        assert sync.last_result is not None and sync.last_result.ok
        backend.fail_with = FabricUnavailable("down")
        sync.trigger()
        for _ in range(200):
            if not sync.last_result.ok:
                break
            await asyncio.sleep(0.01)
        assert not sync.last_result.ok
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_pool_devices_and_host_refs_come_from_present_rows(db: Database) -> None:
    from app.inventory.queries import host_refs, pool_devices

    backend = inventory(regions=1, racks=1, per_rack=3)
    sync, _ = make_sync(backend, db)
    await sync.sync_once()
    backend.devices.pop()
    await sync.sync_once()
    devices = await pool_devices(db)
    assert len(devices) == 2
    assert {d.location.rack for d in devices} == {"rack-01"}
    assert all(not d.cordoned and not d.attach_failed for d in devices)
    refs = await host_refs(db)
    assert {r.hostname for r in refs} == {"node-us-east-rack-01-1", "node-us-east-rack-01-2"}


async def _planner_rows(db: Database) -> float | None:
    """PostgreSQL's idea of the devices table's size (``pg_class.reltuples``: -1 before any
    ANALYZE); None on SQLite."""
    if db.dialect != "postgresql":
        return None
    async with db.read() as session:
        return float(
            (
                await session.execute(
                    text("SELECT reltuples FROM pg_class WHERE relname = 'devices'")
                )
            ).scalar_one()
        )


async def test_a_bulk_change_refreshes_the_planner_statistics(db: Database) -> None:
    backend = MemoryBackend([gpu(i) for i in range(60)])
    sync = InventorySync(backend, db)
    assert (await sync.sync_once()).added == 60
    if db.dialect == "postgresql":
        # Analyzed at once: 60 rows, not the "never analyzed" of a table filled from empty.
        assert await _planner_rows(db) == 60
    # A change below the threshold leaves the statistics to autovacuum.
    backend.devices.append(gpu(60))
    assert (await sync.sync_once()).added == 1
    if db.dialect == "postgresql":
        assert await _planner_rows(db) == 60
    with pytest.raises(ValueError, match="not a table name"):
        await db.analyze("devices; DROP TABLE devices")
    await db.analyze("devices")  # on SQLite a no-op
    if db.dialect == "postgresql":
        assert await _planner_rows(db) == 61


async def test_a_failed_analyze_is_logged_and_the_sync_stands(
    db: Database, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refuse(table: str) -> None:
        raise OperationalError("ANALYZE", {}, Exception("permission denied"))

    monkeypatch.setattr(db, "analyze", refuse)
    backend = MemoryBackend([gpu(i) for i in range(60)])
    with caplog.at_level(logging.WARNING, logger="app.inventory.sync"):
        result = await InventorySync(backend, db).sync_once()
    assert result.ok and result.added == 60
    assert "ANALYZE devices failed" in caplog.text and "permission denied" in caplog.text
    async with db.read() as session:
        assert (await session.execute(select(func.count()).select_from(Device))).scalar() == 60
