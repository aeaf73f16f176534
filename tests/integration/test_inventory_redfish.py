"""The inventory sync over real HTTP: Redfish backend -> Redfish simulator -> database.

Runs on SQLite and PostgreSQL. The simulator's own behaviour is tested in test_sim_redfish.py and
the backend's in test_fabric_redfish.py; here they work together with the database.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest
from builders import REDFISH_DATA
from sqlalchemy import select

from app.db.engine import Database
from app.db.models import Device, Host
from app.fabric.redfish.backend import RedfishBackend
from app.fabric.redfish.transport import RetrySettings
from app.inventory import InventorySync
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

DATA = REDFISH_DATA
FAST_RETRY = RetrySettings(attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02)


@pytest.fixture
async def fabric() -> AsyncIterator[tuple[RedfishSimulator, RedfishBackend]]:
    sim = RedfishSimulator(
        spec=InventorySpec(regions=2, racks_per_region=4, devices_per_rack=16, hosts_per_rack=4),
        username="admin",
        password="password",
        auth="session",
    )
    url = await sim.start()
    backend = RedfishBackend(
        url, username="admin", password="password", retry=FAST_RETRY, timeout_s=5
    )
    yield sim, backend
    await backend.close()
    await sim.stop()


async def stored_devices(db: Database, *, present: bool = True) -> list[Device]:
    query = select(Device)
    if present:
        query = query.where(Device.removed_at.is_(None))
    async with db.read() as session:
        return list((await session.scalars(query)).all())


async def test_two_regions_of_four_racks_of_sixteen_gpus_land_with_locations(
    db: Database, fabric: tuple[RedfishSimulator, RedfishBackend]
) -> None:
    _, backend = fabric
    result = await InventorySync(backend, db).sync_once()
    assert result.ok and result.added == 128 and not result.rejected
    devices = await stored_devices(db)
    assert len(devices) == 128
    assert Counter((d.region, d.rack) for d in devices) == {
        (region, f"rack-{k:02d}"): 16 for region in ("us-east", "us-west") for k in range(1, 5)
    }
    assert {d.device_type for d in devices} == {"gpu"}
    assert all(d.health == "OK" and d.memory_mib and d.uuid and d.slot for d in devices)
    async with db.read() as session:
        hosts = list((await session.scalars(select(Host))).all())
    assert len(hosts) == 32
    assert {h.hostname for h in hosts} == {
        f"node-{region}-rack-{k:02d}-{i}"
        for region in ("us-east", "us-west")
        for k in range(1, 5)
        for i in range(1, 5)
    }

    again = await InventorySync(backend, db).sync_once()
    assert again.ok and again.row_writes == 0


async def test_fabric_changes_are_reflected(
    db: Database, fabric: tuple[RedfishSimulator, RedfishBackend]
) -> None:
    sim, backend = fabric
    sync = InventorySync(backend, db)
    await sync.sync_once()
    blocks = sim.block_uris()
    devices = {d.attach_unit: d for d in await stored_devices(db)}
    sick = devices[blocks[0]]
    sim.set_health(sick.vendor_id, "Critical")
    sim.remove_block(blocks[1])
    new_block = sim.add_block("us-west", "rack-03", "gpu")

    result = await sync.sync_once()
    assert (result.added, result.removed, result.health_changed) == (1, 1, 1)
    rows = {d.attach_unit: d for d in await stored_devices(db, present=False)}
    assert rows[blocks[0]].health == "Critical"
    assert rows[blocks[1]].removed_at is not None
    assert (rows[new_block].region, rows[new_block].rack) == ("us-west", "rack-03")


async def test_attachment_seen_by_the_fabric_is_recorded(
    db: Database, fabric: tuple[RedfishSimulator, RedfishBackend]
) -> None:
    sim, backend = fabric
    sync = InventorySync(backend, db)
    await sync.sync_once()
    device = (await backend.list_devices()).items[0]
    host_id = sim.system_ids()[0]
    await backend.attach(device, host_id)
    await sync.sync_once()
    rows = {d.vendor_id: d for d in await stored_devices(db)}
    assert rows[device.vendor_id].host_id == host_id
    async with db.read() as session:
        host = (await session.scalars(select(Host).where(Host.host_id == host_id))).one()
    assert device.attach_unit in host.attached_units


async def test_fabric_manager_down_keeps_the_last_inventory(
    db: Database, fabric: tuple[RedfishSimulator, RedfishBackend]
) -> None:
    sim, backend = fabric
    sync = InventorySync(backend, db, stale_after_failures=2)
    await sync.sync_once()
    await sim.stop()
    assert not (await sync.sync_once()).ok
    second = await sync.sync_once()
    assert not second.ok and second.stale
    assert len(await stored_devices(db)) == 128


async def test_a_listing_that_fails_part_way_removes_nothing(
    db: Database, fabric: tuple[RedfishSimulator, RedfishBackend]
) -> None:
    sim, backend = fabric
    sync = InventorySync(backend, db)
    await sync.sync_once()
    # Every read of one block answers 503, more times than the backend retries: the listing
    # is incomplete, so the sync fails as a whole.
    sim.fail_next(10, method="GET", path_prefix=sim.block_uris()[40], status=503)
    result = await sync.sync_once()
    assert not result.ok
    assert len(await stored_devices(db)) == 128


async def test_a_block_that_answers_500_is_rejected_and_its_device_kept(
    db: Database, fabric: tuple[RedfishSimulator, RedfishBackend]
) -> None:
    sim, backend = fabric
    sync = InventorySync(backend, db)
    await sync.sync_once()
    # Real services answer 500 for resources that do not exist: after one retry that is the
    # block's own failure, not the listing's, and the device keeps its last known state.
    block = sim.block_uris()[40]
    sim.fail_next(10, method="GET", path_prefix=block, status=500)
    result = await sync.sync_once()
    assert result.ok
    assert [(r.vendor_id, r.kind) for r in result.rejected] == [(block, "fetch-failed")]
    assert len(await stored_devices(db)) == 128


@pytest.mark.parametrize(
    "body", ['{"Members": [{"@odata.id": "/redfish/v1/Compo', "<html>proxy error</html>"]
)
async def test_a_malformed_block_is_rejected_and_its_device_kept(
    db: Database, fabric: tuple[RedfishSimulator, RedfishBackend], body: str
) -> None:
    sim, backend = fabric
    sync = InventorySync(backend, db)
    await sync.sync_once()
    block = sim.block_uris()[40]
    sim.fail_next(10, method="GET", path_prefix=block, status=200, body=body)
    result = await sync.sync_once()
    assert result.ok and result.removed == 0 and result.devices == 128
    assert [r.vendor_id for r in result.rejected] == [block]
    assert "not valid JSON" in result.rejected[0].reason
    assert len(await stored_devices(db)) == 128


async def test_dmtf_composability_mockup_is_inventoried(db: Database) -> None:
    sim = RedfishSimulator(mockup_dir=DATA / "dmtf-public-composability", auth="none")
    url = await sim.start()
    backend = RedfishBackend(url, auth="none", retry=FAST_RETRY)
    try:
        result = await InventorySync(backend, db).sync_once()
    finally:
        await backend.close()
        await sim.stop()
    assert result.ok
    devices = {d.vendor_id.rsplit("/", 1)[-1]: d for d in await stored_devices(db)}
    gpu = devices["Block9GPU"]
    assert gpu.device_type == "gpu" and gpu.chassis == "ComposableModule6"
    drives = [d for d in devices.values() if d.device_type in ("nvme", "drive")]
    assert len(drives) >= 5
    assert all(d.capacity.get("capacity_bytes", 0) > 0 for d in drives)
    assert devices["Block3Slot0"].host_id == "ComposedSystem"
    assert devices["Block10Slot4"].host_id == "SystemAfterAddResourceAction"


async def test_dmtf_bladed_partitions_mockup_is_inventoried(db: Database) -> None:
    sim = RedfishSimulator(mockup_dir=DATA / "dmtf-public-bladed-partitions", auth="none")
    url = await sim.start()
    backend = RedfishBackend(url, auth="none", retry=FAST_RETRY)
    try:
        result = await InventorySync(backend, db).sync_once()
    finally:
        await backend.close()
        await sim.stop()
    assert result.ok
    devices = await stored_devices(db)
    assert len(devices) == 2
    assert {d.host_id for d in devices} == {"ComposedPartition3"}
    assert {d.chassis for d in devices} == {"Blade8"}
