"""Event-driven inventory over real HTTP: the Redfish simulator's server-sent events (with
their faults), the backend's stream, the watcher, and the whole service reacting to a health
change long before its next poll."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from builders import eventually
from sqlalchemy import select

from app.configload import load_settings
from app.db.engine import Database
from app.db.models import Device, InventoryStatus
from app.fabric.events import FabricEvent
from app.fabric.redfish.backend import RedfishBackend
from app.inventory import InventorySync
from app.inventory.events import CONNECTING, POLLING, STREAMING, EventApplier, EventWatcher
from app.service import Service
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator
from fabric_dra_sim.redfish_events import EVENT_SERVICE, SSE_URI

DRIVER = "fabric.example.com"
V1 = "resource.k8s.io/v1"
NODE = "node-us-east-rack-01-1"
WAIT_S = 30.0
BASIC = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret-pw").decode()}


@pytest.fixture
async def sim() -> AsyncIterator[tuple[RedfishSimulator, str]]:
    simulator = RedfishSimulator(
        spec=InventorySpec(regions=1, racks_per_region=1, devices_per_rack=4, hosts_per_rack=2),
        username="ops",
        password="s3cret-pw",
        auth="any",  # the backend logs in with a session; the raw tests use Basic
    )
    url = await simulator.start()
    yield simulator, url
    await simulator.stop()


async def _read(response: aiohttp.ClientResponse, count: int) -> list[tuple[str, dict[str, Any]]]:
    """``count`` messages of an SSE response as (id, decoded data)."""
    found: list[tuple[str, dict[str, Any]]] = []
    event_id, data = "", ""
    while len(found) < count:
        line = (await asyncio.wait_for(response.content.readline(), 5)).decode().rstrip("\n")
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and data:
            found.append((event_id, json.loads(data)))
            data = ""
    return found


def _message_ids(messages: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [
        (e["MessageId"].rsplit(".", 1)[1], e["OriginOfCondition"]["@odata.id"])
        for _, body in messages
        for e in body["Events"]
    ]


# -- the simulator's EventService ------------------------------------------------------------


async def test_the_simulator_streams_an_event_for_every_change(
    sim: tuple[RedfishSimulator, str],
) -> None:
    simulator, url = sim
    blocks = simulator.block_uris()
    system = simulator.system_ids()[0]
    async with aiohttp.ClientSession(headers=BASIC) as http:
        async with http.get(url + "/redfish/v1/") as response:
            root = await response.json()
        assert root["EventService"] == {"@odata.id": EVENT_SERVICE}
        async with http.get(url + EVENT_SERVICE) as response:
            service = await response.json()
        assert service["ServerSentEventUri"] == SSE_URI
        assert service["SSEFilterPropertiesSupported"]["RegistryPrefix"] is True
        params = {"$filter": "RegistryPrefix eq 'ResourceEvent'"}
        async with http.get(url + SSE_URI, params=params) as stream:
            assert stream.status == 200
            assert stream.headers["Content-Type"] == "text/event-stream"
            simulator.set_health(blocks[0], "Critical")
            simulator.set_health(blocks[0], "Critical")  # no change, no event
            simulator.attach_out_of_band(blocks[1], system)
            simulator.detach_out_of_band(blocks[1])
            added = simulator.add_block("us-east", "rack-01")
            simulator.remove_block(blocks[2])
            messages = await _read(stream, 7)
        system_uri = f"/redfish/v1/Systems/{system}"
        assert _message_ids(messages) == [
            ("ResourceStatusChangedCritical", blocks[0]),
            ("ResourceChanged", blocks[1]),
            ("ResourceChanged", system_uri),
            ("ResourceChanged", blocks[1]),
            ("ResourceChanged", system_uri),
            ("ResourceCreated", added),
            ("ResourceRemoved", blocks[2]),
        ]
        assert [int(i) for i, _ in messages] == list(range(1, 8))
        assert messages[0][1]["Events"][0]["MessageSeverity"] == "Critical"

        # Last-Event-ID: what was missed since event 5 comes first.
        async with http.get(url + SSE_URI, headers={"Last-Event-ID": "5"}) as stream:
            replayed = await _read(stream, 2)
        assert [i for i, _ in replayed] == ["6", "7"]

        # A filter the service does not evaluate is refused, as the EventService says.
        async with http.get(url + SSE_URI, params={"$filter": "ResourceType eq 'Processor'"}) as r:
            assert r.status == 400
            assert "ResourceType is not supported" in (await r.json())["error"]["message"]
        async with http.post(url + SSE_URI, json={}) as r:
            assert r.status == 405
    async with aiohttp.ClientSession() as anonymous, anonymous.get(url + SSE_URI) as r:
        assert r.status == 401


async def test_stream_faults_duplicates_unknown_resources_drops_and_slow_consumers(
    sim: tuple[RedfishSimulator, str],
) -> None:
    simulator, url = sim
    block = simulator.block_uris()[0]
    faults = simulator.events.faults
    async with aiohttp.ClientSession(headers=BASIC) as http:
        faults.duplicate = True
        faults.unknown_every = 2
        async with http.get(url + SSE_URI) as stream:
            simulator.set_health(block, "Warning")
            simulator.set_health(block, "OK")
            messages = await _read(stream, 4)
        assert [i for i, _ in messages] == ["1", "1", "2", "2"]
        assert _message_ids(messages)[2][1] == "/redfish/v1/Chassis/Gone-2"
        faults.duplicate, faults.unknown_every = False, 0

        faults.drop_after = 1
        async with http.get(url + SSE_URI) as stream:
            simulator.set_health(block, "Critical")
            await _read(stream, 1)
            assert await asyncio.wait_for(stream.content.read(), 5) == b""  # closed
        faults.drop_after = None

        faults.queue_size = 2
        async with http.get(url + SSE_URI) as stream:
            await eventually(lambda: simulator.events.open_streams == 1, what="stream open")
            for health in ("OK", "Warning", "OK", "Warning"):
                simulator.set_health(block, health)
            # Cut off with its queue full; what was queued is still delivered, then the end.
            assert simulator.events.open_streams == 0
            rest = await asyncio.wait_for(stream.content.read(), 5)
        assert rest.count(b"data: ") <= 2


# -- the backend's stream and the watcher ------------------------------------------------------


def _backend(url: str) -> RedfishBackend:
    return RedfishBackend(url, username="ops", password="s3cret-pw", timeout_s=5.0)


async def test_the_watcher_triggers_a_sync_per_relevant_event_and_after_each_connect(
    sim: tuple[RedfishSimulator, str], caplog: pytest.LogCaptureFixture
) -> None:
    simulator, url = sim
    backend = _backend(url)
    triggers: list[float] = []
    watcher = EventWatcher(
        backend, lambda: triggers.append(time.monotonic()), kind="redfish", backoff_s=(0.05, 0.2)
    )
    assert not watcher.tried.is_set()
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: watcher.state == STREAMING, what="streaming")
        assert len(triggers) == 1  # the resync after connecting
        assert watcher.tried.is_set()  # a first sync may list now: it covers the gap
        block = simulator.block_uris()[0]
        simulator.set_health(block, "Critical")
        await eventually(lambda: len(triggers) == 2, what="a sync for the event")
        assert watcher.last_event_id == "1" and watcher.relevant == 1

        # A malformed event is counted and logged once, and asks for nothing.
        simulator.events.faults.malformed_every = 2
        with caplog.at_level(logging.WARNING, logger="app.inventory.events"):
            simulator.set_health(block, "OK")
            await eventually(lambda: watcher.malformed == 1, what="the malformed event")
        assert len(triggers) == 2
        assert "malformed event ignored (1 so far)" in caplog.text
        simulator.events.faults.malformed_every = 0

        # The service restarts: the stream ends (a sync is asked for at once, as polling
        # takes over), is opened again with a new session, and a resync is asked for since
        # events may have been missed meanwhile.
        simulator.restart()
        await eventually(lambda: watcher.connects == 2, what="the reconnect")
        await eventually(lambda: len(triggers) == 4, what="the syncs for the gap")
        simulator.set_health(block, "Warning")
        await eventually(lambda: len(triggers) == 5, what="events after the reconnect")
        assert watcher.status()["state"] == STREAMING and watcher.status()["connects"] == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await backend.close()


async def test_without_an_event_service_the_watcher_says_it_polls_once(
    sim: tuple[RedfishSimulator, str], caplog: pytest.LogCaptureFixture
) -> None:
    simulator, url = sim
    del simulator.tree[EVENT_SERVICE]
    del simulator.tree["/redfish/v1"]["EventService"]
    backend = _backend(url)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(0.01)

    watcher = EventWatcher(backend, lambda: None, kind="redfish", sleep=sleep)
    with caplog.at_level(logging.WARNING, logger="app.inventory.events"):
        task = asyncio.create_task(watcher.run())
        try:
            await eventually(lambda: len(sleeps) >= 3, what="three discovery rounds")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await backend.close()
    assert watcher.state == POLLING and watcher.healthy is False
    assert watcher.tried.is_set()  # no stream: the first sync waits no longer
    assert "no EventService" in (watcher.last_error or "")
    assert caplog.text.count("no event stream") == 1
    assert sleeps[0] == 600.0


async def test_a_stream_that_keeps_failing_falls_back_to_polling_with_backoff(
    sim: tuple[RedfishSimulator, str],
) -> None:
    simulator, url = sim
    backend = _backend(url)
    simulator.fail_next(50, path_prefix=SSE_URI, status=500)
    sleeps: list[float] = []
    tried: list[bool] = []  # watcher.tried at each backoff

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        tried.append(watcher.tried.is_set())
        await asyncio.sleep(0.01)

    watcher = EventWatcher(backend, lambda: None, kind="redfish", backoff_s=(1.0, 8.0), sleep=sleep)
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: len(sleeps) >= 6, what="six failed opens")
        # The first open failed (still connecting, not yet polling): the first sync of the
        # term waits for it no longer.
        assert tried[0] is True
        assert watcher.state == POLLING and "500" in (watcher.last_error or "")
        assert [s >= b for s, b in zip(sleeps, (1, 2, 4, 8, 8, 8), strict=False)] == [True] * 6
        assert all(s <= 12 for s in sleeps)
        simulator.clear_failures()
        await eventually(lambda: watcher.state == STREAMING, what="streaming again")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await backend.close()
    assert watcher.state in (STREAMING, CONNECTING)


# -- the whole service ---------------------------------------------------------------------------


async def test_a_device_turning_critical_is_tainted_long_before_the_next_poll(
    sim: tuple[RedfishSimulator, str], tmp_path: Path
) -> None:
    simulator, url = sim
    emu = KubeEmulator(kubernetes_version="1.34", feature_gates=all_gates_on("1.34"))
    await emu.start()
    emu.create(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "labels": {
                    "kubernetes.io/hostname": NODE,
                    "topology.kubernetes.io/region": "us-east",
                    "fabric-dra.io/rack": "rack-01",
                },
            },
        }
    )
    (tmp_path / "user").write_text("ops\n")
    (tmp_path / "password").write_text("s3cret-pw\n")
    settings = load_settings(
        environ={
            "FABRIC_DRA_DATABASE__URL": f"sqlite+aiosqlite:///{tmp_path}/events.db",
            "FABRIC_DRA_FABRIC__URL": url,
            "FABRIC_DRA_FABRIC__USERNAME_FILE": str(tmp_path / "user"),
            "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(tmp_path / "password"),
            "FABRIC_DRA_KUBE__MODE": "url",
            "FABRIC_DRA_KUBE__URL": emu.url,
            "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
            "FABRIC_DRA_ADMIN__PORT": "0",
            "FABRIC_DRA_LEADER__ENABLED": "false",
            # Polls far apart: only the event can make the change show in time.
            "FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS": "3600",
            "FABRIC_DRA_INVENTORY__EVENTS_POLL_INTERVAL_SECONDS": "3600",
        }
    )
    service = Service(settings)
    await service.start()
    try:

        def slices() -> list[dict[str, Any]]:
            return [s for s in emu.list(V1, "ResourceSlice") if s["spec"]["driver"] == DRIVER]

        def tainted() -> list[str]:
            return [d["name"] for s in slices() for d in s["spec"]["devices"] if d.get("taints")]

        await eventually(
            lambda: (
                slices()
                and service.leading
                and service.leading.managers["redfish"].events
                and service.leading.managers["redfish"].events.healthy
            ),
            timeout_s=WAIT_S,
            what="published, streaming",
        )
        assert tainted() == []
        started = time.monotonic()
        simulator.set_health(simulator.block_uris()[0], "Critical")
        await eventually(lambda: len(tainted()) == 1, timeout_s=WAIT_S, what="the taint")
        took = time.monotonic() - started
        assert took < 60, took  # the poll is an hour away
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{service.admin_port}/api/v1/status") as response,
        ):
            status = (await response.json())["service"]["inventory_events"]
        assert status["state"] == STREAMING and status["relevant"] >= 1
        # Applied by reading the one block again, not by a full sync.
        assert status["applied"] >= 1 and status["full_syncs_asked"] == 0
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{service.admin_port}/metrics") as response,
        ):
            text = await response.text()
        assert 'fabric_dra_inventory_events_streaming{backend="redfish"} 1.0' in text
        # One full listing in all: the first sync waited for the stream to open, so that it
        # covers what the stream missed before (no second listing right after it).
        assert 'fabric_dra_inventory_syncs_total{backend="redfish",result="ok"} 1.0' in text
        assert 'fabric_dra_inventory_events_total{backend="redfish",result="relevant"}' in text

        # More changes, each published by laying out only its pools: the desired state the
        # publisher holds equals what a full pass over every device gives.
        blocks = simulator.block_uris()
        simulator.set_health(blocks[0], "OK")
        simulator.remove_block(blocks[1])
        added = simulator.add_block("us-east", "rack-01", "nvme")
        leading = service.leading
        assert leading is not None and leading.managers["redfish"].applier is not None
        publisher = next(iter(leading.publishers.values()))

        async def applied() -> bool:
            async with service.db.read() as session:
                rows = (
                    await session.scalars(
                        select(Device).where(Device.attach_unit.in_([blocks[1], added]))
                    )
                ).all()
            return {(r.attach_unit, r.removed_at is None) for r in rows} == {
                (blocks[1], False),
                (added, True),
            }

        await eventually(applied, timeout_s=WAIT_S, what="the changes in the database")

        async def settled() -> bool:
            return (
                leading.managers["redfish"].applier is not None
                and leading.managers["redfish"].applier.idle
                and not leading.publish_partial.is_set()
                and dict(publisher.desired()) == await service.published_pools()
            )

        await eventually(settled, timeout_s=WAIT_S, what="the pools laid out by units")
        removed_name = (await _device(service.db, blocks[1])).name
        added_name = (await _device(service.db, added)).name

        def published() -> bool:
            names = {d["name"] for s in slices() for d in s["spec"]["devices"]}
            return removed_name not in names and added_name in names and tainted() == []

        await eventually(published, timeout_s=WAIT_S, what="the slices written")
    finally:
        await service.stop(deadline_s=5)
        await emu.stop()


# -- one resource at a time, into the database ---------------------------------------------------


async def _device(db: Database, unit: str) -> Device:
    async with db.read() as session:
        return (await session.scalars(select(Device).where(Device.attach_unit == unit))).one()


async def test_each_event_rereads_only_its_resource_and_writes_only_its_change(
    db: Database, sim: tuple[RedfishSimulator, str]
) -> None:
    simulator, url = sim
    backend = _backend(url)
    inventory = InventorySync(backend, db)
    assert (await inventory.sync_once()).ok
    async with db.read() as session:
        synced_at = (await session.scalars(select(InventoryStatus))).one().last_success_at
    full_syncs: list[int] = []
    changes: list[int] = []

    async def changed(_: object, units: frozenset[str]) -> None:
        assert units
        changes.append(1)

    applier = EventApplier(
        inventory, backend, on_change=changed, full_sync=lambda: full_syncs.append(1)
    )
    watcher = EventWatcher(
        backend, lambda: None, kind="redfish", backoff_s=(0.05, 0.2), on_event=applier.offer
    )
    tasks = [asyncio.create_task(watcher.run()), asyncio.create_task(applier.run())]
    blocks = simulator.block_uris()
    system = simulator.system_ids()[1]
    try:
        await eventually(lambda: watcher.healthy, what="streaming")

        simulator.set_health(blocks[0], "Critical")
        await eventually(lambda: applier.row_writes == 1, what="one row written")
        assert (await _device(db, blocks[0])).health == "Critical"

        simulator.attach_out_of_band(blocks[1], system)  # block and System events
        await eventually(
            lambda: watcher.relevant == 3 and applier.idle, what="the block and the System"
        )
        assert (await _device(db, blocks[1])).host_id == system
        # The block was read again; the System's event found its blocks as the database
        # has them now, so nothing more was read or written. A holder changed behind our
        # back: a full sync is asked for, whose drift check judges the journal.
        assert applier.applied == 2 and applier.row_writes == 2
        assert full_syncs == [1]

        simulator.remove_block(blocks[2])
        await eventually(lambda: applier.row_writes == 3, what="the removal")
        assert (await _device(db, blocks[2])).removed_at is not None

        added = simulator.add_block("us-east", "rack-01", "nvme")
        await eventually(lambda: applier.row_writes == 4, what="the new block")
        assert (await _device(db, added)).device_type == "nvme"

        # An event about a resource the service does not have changes nothing, and asks for
        # no full sync; neither does a duplicate.
        simulator.events.faults.unknown_every = 1
        simulator.events.faults.duplicate = True
        simulator.set_health(blocks[3], "Warning")
        await eventually(lambda: applier.unknown >= 1, what="the unknown resource")
        assert applier.row_writes == 4
        assert full_syncs == [1] and len(changes) == 4
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await backend.close()
    async with db.read() as session:
        status = (await session.scalars(select(InventoryStatus))).one()
    # None of it was a full sync: the last complete listing is still the first.
    assert status.last_success_at == synced_at
    # The safety net: a full sync finds only what no event told. The unknown-resource fault
    # replaced the origin of the last change, so that event was lost: the poll brings it.
    # Host rows (the blocks each server holds) are refreshed by full syncs only; the
    # devices' holders were already right.
    again = await InventorySync(backend := _backend(url), db).sync_once()
    await backend.close()
    assert again.ok and (again.changed, again.health_changed, again.hosts_written) == (1, 1, 1)
    assert (await _device(db, blocks[3])).health == "Warning"


async def test_a_block_that_does_not_name_its_holders_asks_for_a_full_sync(
    db: Database, sim: tuple[RedfishSimulator, str]
) -> None:
    simulator, url = sim
    backend = _backend(url)
    inventory = InventorySync(backend, db)
    assert (await inventory.sync_once()).ok
    block = simulator.block_uris()[0]
    del simulator.tree[block]["Links"]["ComputerSystems"]
    full_syncs: list[int] = []

    async def changed(_: object, __: object) -> None:
        pass

    applier = EventApplier(
        inventory, backend, on_change=changed, full_sync=lambda: full_syncs.append(1)
    )
    task = asyncio.create_task(applier.run())
    try:
        applier.offer(FabricEvent("ResourceChanged", block, "1", True))
        await eventually(lambda: full_syncs == [1], what="the fallback")
        # Too many resources at once: one full sync instead of reading each.
        applier.max_batch = 2
        for uri in simulator.block_uris()[1:5]:
            applier.offer(FabricEvent("ResourceChanged", uri, "2", True))
        await eventually(lambda: full_syncs == [1, 1], what="the flood's full sync")
        assert applier.applied == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await backend.close()


async def test_a_failing_fabric_manager_is_polled_at_the_short_interval_despite_the_stream(
    sim: tuple[RedfishSimulator, str], tmp_path: Path
) -> None:
    simulator, url = sim
    emu = KubeEmulator(kubernetes_version="1.34", feature_gates=all_gates_on("1.34"))
    await emu.start()
    (tmp_path / "user").write_text("ops\n")
    (tmp_path / "password").write_text("s3cret-pw\n")
    service = Service(
        load_settings(
            environ={
                "FABRIC_DRA_DATABASE__URL": f"sqlite+aiosqlite:///{tmp_path}/fail.db",
                "FABRIC_DRA_FABRIC__URL": url,
                "FABRIC_DRA_FABRIC__USERNAME_FILE": str(tmp_path / "user"),
                "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(tmp_path / "password"),
                "FABRIC_DRA_FABRIC__RETRY_ATTEMPTS": "1",
                "FABRIC_DRA_KUBE__MODE": "url",
                "FABRIC_DRA_KUBE__URL": emu.url,
                "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
                "FABRIC_DRA_ADMIN__PORT": "0",
                "FABRIC_DRA_LEADER__ENABLED": "false",
                "FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS": "0.5",
                "FABRIC_DRA_INVENTORY__EVENTS_POLL_INTERVAL_SECONDS": "3600",
                "FABRIC_DRA_INVENTORY__STALE_AFTER_FAILURES": "3",
            }
        )
    )
    await service.start()
    try:
        await eventually(
            lambda: (
                service.leading is not None
                and service.leading.managers["redfish"].events is not None
                and service.leading.managers["redfish"].events.healthy
                and service.last_inventory is not None
            ),
            timeout_s=WAIT_S,
            what="streaming after a sync",
        )
        # The REST side fails while the stream stays open; the next event's read fails,
        # a full sync follows and fails, and from then on syncs come every 0.5 s until the
        # inventory is stale, as they would without events.
        simulator.fail_next(10_000, path_prefix="/redfish/v1/CompositionService", status=500)
        simulator.fail_next(10_000, path_prefix="/redfish/v1/Systems", status=500)
        simulator.set_health(simulator.block_uris()[0], "Critical")

        async def stale() -> bool:
            status = await service.status()
            return bool(status["inventory"]) and status["inventory"][0]["stale"]

        await eventually(stale, timeout_s=WAIT_S, what="stale after three quick failed syncs")
        assert (
            service.leading is not None and service.leading.managers["redfish"].events is not None
        )
        assert service.leading.managers["redfish"].events.healthy  # the stream itself never broke
    finally:
        await service.stop(deadline_s=5)
        await emu.stop()
