"""The whole service: inventory, publishing, claims, admin endpoint and leader election, over
real HTTP against the Kubernetes API emulator and the Redfish simulator."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from builders import eventually

from app.config import Settings
from app.configload import load_settings
from app.service import Service
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

DRIVER = "fabric.example.com"
CLAIMS = "resource.k8s.io/v1"
NODES = ["node-us-east-rack-01-1", "node-us-east-rack-01-2"]
eventually = partial(eventually, timeout_s=20)


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[KubeEmulator, RedfishSimulator]]:
    """The emulator with two labelled Nodes, and the simulator (its URL in ``URLS``)."""
    sim = RedfishSimulator(
        spec=InventorySpec(regions=1, racks_per_region=1, devices_per_rack=4, hosts_per_rack=2),
        username="ops",
        password="s3cret-pw",
        auth="session",
    )
    URLS[id(sim)] = await sim.start()
    # The service publishes taints and binding conditions: alpha gates, off by default in 1.34.
    emu = KubeEmulator(served_resource_versions=("v1",), feature_gates=all_gates_on("1.34"))
    await emu.start()
    for node in NODES:
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node,
                    "labels": {
                        "kubernetes.io/hostname": node,
                        "topology.kubernetes.io/region": "us-east",
                        "fabric-dra.io/rack": "rack-01",
                    },
                },
            }
        )
    yield emu, sim
    await emu.stop()
    await sim.stop()


def settings_for(
    tmp_path: Path, emu: KubeEmulator, sim: RedfishSimulator, database: str, **extra: str
) -> Settings:
    (tmp_path / "user").write_text("ops\n")
    (tmp_path / "password").write_text("s3cret-pw\n")
    (tmp_path / "token").write_text("admin-token-123\n")
    environ = {
        "FABRIC_DRA_DATABASE__URL": database,
        "FABRIC_DRA_FABRIC__URL": sim_url(sim),
        "FABRIC_DRA_FABRIC__USERNAME_FILE": str(tmp_path / "user"),
        "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(tmp_path / "password"),
        "FABRIC_DRA_FABRIC__RETRY_ATTEMPTS": "2",
        "FABRIC_DRA_KUBE__MODE": "url",
        "FABRIC_DRA_KUBE__URL": emu.url,
        "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
        "FABRIC_DRA_ADMIN__PORT": "0",
        "FABRIC_DRA_ADMIN__TOKEN_FILE": str(tmp_path / "token"),
        "FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS": "1",
        # Syncs every second with the event stream on too (the drift checks here ride on them).
        "FABRIC_DRA_INVENTORY__EVENTS_POLL_INTERVAL_SECONDS": "1",
        "FABRIC_DRA_LEADER__NAMESPACE": "default",
        "FABRIC_DRA_LEADER__LEASE_DURATION_SECONDS": "3",
        "FABRIC_DRA_LEADER__RENEW_DEADLINE_SECONDS": "2",
        "FABRIC_DRA_LEADER__RETRY_PERIOD_SECONDS": "0.5",
        **extra,
    }
    # An empty value in ``extra`` drops that setting.
    return load_settings(environ={k: v for k, v in environ.items() if v != ""})


URLS: dict[int, str] = {}


def sim_url(sim: RedfishSimulator) -> str:
    return URLS[id(sim)]


def slices(emu: KubeEmulator) -> list[dict[str, Any]]:
    return [s for s in emu.list(CLAIMS, "ResourceSlice") if s["spec"]["driver"] == DRIVER]


async def get_json(port: int, path: str, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as response,
    ):
        return response.status, await response.json(content_type=None)


async def test_the_service_inventories_publishes_attaches_and_stops_cleanly(
    tmp_path: Path, cluster: tuple[KubeEmulator, RedfishSimulator]
) -> None:
    emu, sim = cluster
    settings = settings_for(
        tmp_path,
        emu,
        sim,
        f"sqlite+aiosqlite:///{tmp_path}/fd.db",
        FABRIC_DRA_LEADER__IDENTITY="replica-a",
    )
    service = Service(settings)
    await service.start()
    try:
        await eventually(lambda: len(slices(emu)) == 1, what="the pool's slice")
        published = slices(emu)[0]["spec"]
        assert published["pool"]["name"] == "us-east/rack-01"
        assert len(published["devices"]) == 4
        assert service.admin_port
        await eventually(lambda: _ready(service.admin_port), what="readiness")
        status, body = await get_json(service.admin_port, "/api/v1/status")
        assert status == 200 and body["service"]["leader"]["is_leader"] is True

        device = published["devices"][0]["name"]
        emu.create(
            {
                "apiVersion": CLAIMS,
                "kind": "ResourceClaim",
                "metadata": {"name": "c1", "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]
                    }
                },
            }
        )
        claim = emu.get(CLAIMS, "ResourceClaim", "c1", "default")
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": "us-east/rack-01",
                            "device": device,
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODES[0]]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}],
        }
        emu.update_status(claim)
        await eventually(lambda: _ready_condition(emu, "c1"), what="device ready on the claim")
        assert NODES[0] in sim.attachments().values()
        assert "s3cret-pw" not in str(await service.status())
    finally:
        await service.stop(deadline_s=10)
    lease = emu.get("coordination.k8s.io/v1", "Lease", "fabric-dra", "default")
    assert lease is not None and not lease["spec"].get("holderIdentity")


async def test_the_service_notices_a_device_detached_behind_its_back_and_attaches_it_again(
    tmp_path: Path, cluster: tuple[KubeEmulator, RedfishSimulator]
) -> None:
    emu, sim = cluster
    settings = settings_for(tmp_path, emu, sim, f"sqlite+aiosqlite:///{tmp_path}/fd.db")
    service = Service(settings)
    await service.start()
    try:
        await eventually(lambda: len(slices(emu)) == 1, what="the pool's slice")
        device = slices(emu)[0]["spec"]["devices"][0]["name"]
        allocate(emu, "default", "c1", device, NODES[0])
        await eventually(lambda: _ready_condition(emu, "c1"), what="device ready on the claim")
        [block] = [b for b, h in sim.attachments().items() if h == NODES[0]]
        sim.detach_out_of_band(block)  # the fabric manager lost it
        # The next inventory sync (every second here) notices, and the device comes back.
        await eventually(
            lambda: any(
                e.get("reason") == "DeviceLost" for e in emu.list("v1", "Event", "default")
            ),
            what="a DeviceLost Event",
        )
        await eventually(lambda: sim.attachments()[block] == NODES[0], what="attached again")
        await eventually(lambda: _ready_condition(emu, "c1"), what="ready again")
        assert service.admin_port
        _, metrics_text = await _text(service.admin_port, "/metrics")
        drift = [
            line
            for line in metrics_text.splitlines()
            if line.startswith("fabric_dra_fabric_drift_total")
        ]
        assert 'fabric_dra_fabric_drift_total{kind="lost"} 1.0' in drift, drift

        # The world matches the journal again: a later check finds nothing.
        async def no_drift() -> bool:
            return (await service.status())["drift"] == []

        await eventually(no_drift, what="a drift check that finds nothing")
    finally:
        await service.stop(deadline_s=10)


async def test_a_force_released_device_of_a_live_claim_is_attached_again_at_once(
    tmp_path: Path, cluster: tuple[KubeEmulator, RedfishSimulator]
) -> None:
    # The claim still has the device allocated: the controller works on it right after the
    # release (not at its next resync), attaches the device again and says so on the claim.
    emu, sim = cluster
    settings = settings_for(tmp_path, emu, sim, f"sqlite+aiosqlite:///{tmp_path}/fd.db")
    service = Service(settings)
    await service.start()
    try:
        await eventually(lambda: len(slices(emu)) == 1, what="the pool's slice")
        device = slices(emu)[0]["spec"]["devices"][0]["name"]
        allocate(emu, "default", "c1", device, NODES[0])
        await eventually(lambda: _ready_condition(emu, "c1"), what="device ready on the claim")
        assert service.admin_port
        _, listed = await get_json(
            service.admin_port, "/api/v1/reservations?state=active", "admin-token-123"
        )
        (first,) = listed["items"]
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"http://127.0.0.1:{service.admin_port}/api/v1/reservations/{first['id']}/release",
                headers={"Authorization": "Bearer admin-token-123"},
            ) as response,
        ):
            assert response.status == 200, await response.text()

        async def attached_again() -> bool:
            _, now = await get_json(
                service.admin_port, "/api/v1/reservations?state=attached", "admin-token-123"
            )
            return [(r["device_name"], r["id"] != first["id"]) for r in now["items"]] == [
                (device, True)
            ]

        await eventually(attached_again, what="a new reservation, attached")
        await eventually(lambda: _ready_condition(emu, "c1"), what="ready on the claim again")
        assert NODES[0] in sim.attachments().values()
    finally:
        await service.stop(deadline_s=10)


async def _ready(port: int | None) -> bool:
    assert port is not None
    status, _ = await get_json(port, "/readyz")
    return status == 200


def _ready_condition(emu: KubeEmulator, name: str) -> bool:
    claim = emu.get(CLAIMS, "ResourceClaim", name, "default") or {}
    return any(
        c["type"] == "FabricDeviceReady" and c["status"] == "True"
        for e in (claim.get("status") or {}).get("devices") or []
        for c in e.get("conditions") or []
    )


async def test_two_replicas_one_leader_and_failover(
    tmp_path: Path, cluster: tuple[KubeEmulator, RedfishSimulator]
) -> None:
    emu, sim = cluster
    database = f"sqlite+aiosqlite:///{tmp_path}/shared.db"
    first = Service(
        settings_for(tmp_path, emu, sim, database, FABRIC_DRA_LEADER__IDENTITY="replica-a")
    )
    second = Service(
        settings_for(
            tmp_path,
            emu,
            sim,
            database,
            FABRIC_DRA_LEADER__IDENTITY="replica-b",
            FABRIC_DRA_DATABASE__MIGRATE_ON_START="false",
        )
    )
    await first.start()
    await eventually(lambda: first.leading is not None, what="replica-a leads")
    await second.start()
    try:
        await asyncio.sleep(1.5)
        assert second.leading is None
        assert await _ready(second.admin_port)  # a standby is ready: it knows the leader
        _, body = await get_json(second.admin_port, "/api/v1/status")
        assert body["service"]["leader"] == {
            "enabled": True,
            "is_leader": False,
            "holder": "replica-a",
            "transitions": 1,
            "lost_count": 0,
            "lost_at": None,
        }
        _, metrics_text = await _text(second.admin_port or 0, "/metrics")
        assert "fabric_dra_leader 0.0" in metrics_text
        assert "fabric_dra_leader_transitions_total 1.0" in metrics_text
        writes_before = len(emu.writes("resourceslices"))
        await first.stop(deadline_s=10)
        await eventually(
            lambda: second.leading is not None, timeout_s=10, what="replica-b takes over"
        )
        # The new leader adopts the slices: once its publishers have the desired state and are
        # idle, and after one more full pass run here, nothing was rewritten.
        await eventually(lambda: _publishers_settled(second), what="replica-b's publishers")
        assert second.leading is not None
        for publisher in second.leading.publishers.values():
            publisher.resync_all()
            await publisher.wait_idle(20)
        assert len(emu.writes("resourceslices")) == writes_before
    finally:
        await second.stop(deadline_s=10)
        await first.stop(deadline_s=1)


async def test_a_fabric_manager_that_is_down_shows_in_readiness_and_status(
    tmp_path: Path, cluster: tuple[KubeEmulator, RedfishSimulator]
) -> None:
    emu, sim = cluster
    service = Service(
        settings_for(
            tmp_path,
            emu,
            sim,
            f"sqlite+aiosqlite:///{tmp_path}/x.db",
            FABRIC_DRA_LEADER__ENABLED="false",
            FABRIC_DRA_INVENTORY__STALE_AFTER_FAILURES="1",
        )
    )
    await service.start()
    try:
        await eventually(lambda: _ready(service.admin_port or 0), what="ready")
        await sim.stop()

        async def stale() -> bool:
            _, body = await get_json(service.admin_port or 0, "/api/v1/status")
            inventory = body["service"]["inventory"]
            return bool(inventory) and inventory[0]["stale"]

        await eventually(stale, what="the inventory marked stale")
        # The dashboard's history was sampled at start, on its own loop.
        assert len(service.history) >= 1
        status, metrics_text = await _text(service.admin_port or 0, "/metrics")
        assert status == 200 and 'fabric_dra_inventory_stale{backend="redfish"} 1.0' in metrics_text
        assert "fabric_dra_leader 1.0" in metrics_text  # leader election off: always leads
        # Deliberately still ready (an alert, not a restart), and /readyz says why.
        status, ready = await get_json(service.admin_port or 0, "/readyz")
        assert status == 200, ready
        [check] = [c for c in ready["checks"] if c["name"] == "inventory redfish"]
        assert check["ok"] is True and "stale" in check["message"]
        assert "fabric_dra_inventory_stale" in check["message"]
        status, page = await _text(service.admin_port or 0, "/")
        assert status == 200 and 'id="banner-stale-redfish"' in page
        assert "The inventory of fabric manager redfish is stale." in page
        assert '<div class="cards stale">' in page and 'id="cards-stale"' in page
    finally:
        await service.stop(deadline_s=5)


async def test_slices_are_left_alone_until_the_first_inventory_sync_succeeds(
    tmp_path: Path,
    cluster: tuple[KubeEmulator, RedfishSimulator],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A new database and an unreachable fabric manager: no inventory is not an empty fabric,
    # so the driver's slices already in the cluster must stay (the publisher used to get an
    # empty desired state on its first tick and delete them all).
    emu, sim = cluster
    kept = {
        "apiVersion": CLAIMS,
        "kind": "ResourceSlice",
        "metadata": {"name": "kept"},
        "spec": {
            "driver": DRIVER,
            "allNodes": True,
            "devices": [{"name": "gpu-0"}],
            "pool": {"name": "us-east/rack-01", "generation": 1, "resourceSliceCount": 1},
        },
    }
    emu.create(kept)
    await sim.stop()
    service = Service(
        settings_for(
            tmp_path,
            emu,
            sim,
            f"sqlite+aiosqlite:///{tmp_path}/n.db",
            FABRIC_DRA_LEADER__ENABLED="false",
        )
    )
    await service.start()
    try:
        await eventually(
            lambda: "no inventory yet" in caplog.text,
            what="the publisher waiting for the first sync",
        )
        await asyncio.sleep(6)  # past the publish loop's 5 s re-check
        assert [s["metadata"]["name"] for s in slices(emu)] == ["kept"]
        assert not emu.writes("/resourceslices")
        # /readyz says what the publisher waits for, and why it still waits.
        status, ready = await get_json(service.admin_port or 0, "/readyz")
        assert status == 503, ready
        [check] = [c for c in ready["checks"] if c["name"] == "publisher v1"]
        assert check["message"].startswith(
            "waiting for the first inventory sync; it failed: redfish: "
        ), check
    finally:
        await service.stop(deadline_s=5)


def _publishers_settled(service: Service) -> bool:
    """The service leads and each of its publishers has its desired state and is idle."""
    leading = service.leading
    return (
        leading is not None
        and bool(leading.publishers)
        and all(p.status().synced and p.idle() for p in leading.publishers.values())
    )


async def _text(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERVICE_ACCOUNT = "system:serviceaccount:fabric-dra:fabric-dra"


def allocate(emu: KubeEmulator, namespace: str, name: str, device: str, node: str) -> None:
    emu.create(
        {
            "apiVersion": CLAIMS,
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]
                }
            },
        }
    )
    claim = emu.get(CLAIMS, "ResourceClaim", name, namespace)
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER,
                        "pool": "us-east/rack-01",
                        "device": device,
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}],
    }
    emu.update_status(claim)


def ready_on(emu: KubeEmulator, namespace: str, name: str) -> bool:
    claim = emu.get(CLAIMS, "ResourceClaim", name, namespace) or {}
    return any(
        c["type"] == "FabricDeviceReady" and c["status"] == "True"
        for e in (claim.get("status") or {}).get("devices") or []
        for c in e.get("conditions") or []
    )


async def test_the_whole_cycle_works_with_only_the_rbac_of_deploy(tmp_path: Path) -> None:
    """The API emulator enforces deploy/base/rbac.yaml for the controller's service account: any
    call the ClusterRole or the leader-election Role does not allow fails with 403."""
    from fabric_dra_sim.kubeapi import RbacPolicy

    sim = RedfishSimulator(
        spec=InventorySpec(regions=1, racks_per_region=1, devices_per_rack=4, hosts_per_rack=2),
        username="ops",
        password="s3cret-pw",
        auth="session",
    )
    URLS[id(sim)] = await sim.start()
    emu = KubeEmulator(
        served_resource_versions=("v1",),
        feature_gates=all_gates_on("1.34"),
        token="cluster-admin",
        tokens={"sa-token": SERVICE_ACCOUNT},
        rbac=RbacPolicy.from_manifests([DEPLOY / "base" / "rbac.yaml"]),
    )
    await emu.start()
    (tmp_path / "sa-token").write_text("sa-token\n")
    try:
        for node in NODES:
            emu.create(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
                }
            )
        emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}})
        settings = settings_for(
            tmp_path,
            emu,
            sim,
            f"sqlite+aiosqlite:///{tmp_path}/r.db",
            FABRIC_DRA_KUBE__TOKEN_FILE=str(tmp_path / "sa-token"),
            FABRIC_DRA_LEADER__NAMESPACE="fabric-dra",
        )
        service = Service(settings)
        await service.start()
        try:
            await eventually(lambda: len(slices(emu)) == 1, what="slices under RBAC")
            device = slices(emu)[0]["spec"]["devices"][0]["name"]
            allocate(emu, "apps", "c1", device, NODES[1])
            await eventually(lambda: ready_on(emu, "apps", "c1"), what="ready under RBAC")
            claim = emu.get(CLAIMS, "ResourceClaim", "c1", "apps")
            claim["status"] = {}
            emu.update_status(claim)
            await eventually(
                lambda: NODES[1] not in sim.attachments().values(), what="detach under RBAC"
            )
            assert await _ready(service.admin_port)
        finally:
            await service.stop(deadline_s=10)
        denied = [r for r in emu.requests if r.status == 403]
        assert denied == [], f"calls the RBAC of deploy/ does not allow: {denied}"
        events = emu.list("v1", "Event", "apps")
        assert {e["reason"] for e in events} >= {"Attached", "Detached"}
    finally:
        await emu.stop()
        await sim.stop()


async def test_sigterm_lets_the_attach_in_flight_finish_then_releases_the_lease(
    tmp_path: Path, cluster: tuple[KubeEmulator, RedfishSimulator]
) -> None:
    import os
    import signal
    import socket
    import sys

    from app.db.engine import Database
    from app.journal import ATTACHED, ATTACHING, Journal

    emu, sim = cluster
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    database = f"sqlite+aiosqlite:///{tmp_path}/run.db"
    settings_for(tmp_path, emu, sim, database)  # writes the credential files
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
    env.update(
        {
            "FABRIC_DRA_DATABASE__URL": database,
            "FABRIC_DRA_FABRIC__URL": sim_url(sim),
            "FABRIC_DRA_FABRIC__USERNAME_FILE": str(tmp_path / "user"),
            "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(tmp_path / "password"),
            "FABRIC_DRA_KUBE__MODE": "url",
            "FABRIC_DRA_KUBE__URL": emu.url,
            "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
            "FABRIC_DRA_ADMIN__PORT": str(port),
            "FABRIC_DRA_LEADER__NAMESPACE": "default",
            "FABRIC_DRA_LEADER__IDENTITY": "proc",
            "FABRIC_DRA_LOG__JSON_FORMAT": "true",
        }
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        "run",
        "--shutdown-deadline",
        "20",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    db = Database.connect(database)
    try:

        async def ready() -> bool:
            try:
                return await _ready(port)
            except aiohttp.ClientError:
                return False

        await eventually(ready, timeout_s=30, what="the process ready")
        await eventually(lambda: len(slices(emu)) == 1, what="slices")
        device = slices(emu)[0]["spec"]["devices"][0]["name"]
        sim.faults.latency_s = 1.5  # every fabric call is slow: the attach is in flight
        allocate(emu, "default", "c1", device, NODES[0])
        journal = Journal(db)

        async def attaching() -> bool:
            return any(r.state == ATTACHING for r in await journal.active())

        await eventually(attaching, what="an attach in flight")
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 30)
        assert code == 0, (await process.stderr.read()).decode()[-2000:]
        (held,) = await journal.active()
        assert held.state == ATTACHED
        lease = emu.get("coordination.k8s.io/v1", "Lease", "fabric-dra", "default")
        assert lease is not None and not lease["spec"].get("holderIdentity")
        logs = (await process.stderr.read()).decode()
        assert all(line.startswith("{") for line in logs.splitlines() if line.strip())
        assert "s3cret-pw" not in logs
        # The command runs on uvloop (event_loop auto), and drained on SIGTERM above.
        assert "starting (driver fabric.example.com, event loop uvloop)" in logs
    finally:
        sim.faults.latency_s = 0
        if process.returncode is None:
            process.kill()
            await process.wait()
        await db.dispose()


@pytest.mark.parametrize(
    ("host", "warned"),
    [("0.0.0.0", True), ("127.0.0.1", False)],
)
async def test_the_log_says_starting_the_admin_address_and_open_reads_before_stopped(
    tmp_path: Path,
    cluster: tuple[KubeEmulator, RedfishSimulator],
    caplog: pytest.LogCaptureFixture,
    host: str,
    warned: bool,
) -> None:
    emu, sim = cluster
    caplog.set_level("INFO", logger="app.service")
    service = Service(
        settings_for(
            tmp_path,
            emu,
            sim,
            f"sqlite+aiosqlite:///{tmp_path}/l.db",
            FABRIC_DRA_LEADER__ENABLED="false",
            FABRIC_DRA_ADMIN__HOST=host,
        )
    )
    await service.start()
    await service.stop(deadline_s=5)
    lines = [r.getMessage() for r in caplog.records if r.name == "app.service"]
    order = [
        next(i for i, line in enumerate(lines) if needle in line)
        for needle in ("starting", "admin endpoint listening on", " started:", " stopped")
    ]
    assert order == sorted(order), lines
    # pytest runs the test on asyncio's own loop, and the log says so.
    assert any("starting (driver fabric.example.com, event loop asyncio)" in line for line in lines)
    assert f"admin endpoint listening on http://{host}:{service.admin_port}" in lines
    open_reads = [line for line in lines if "reads need no token" in line]
    assert bool(open_reads) is warned, lines


async def test_not_ready_until_the_leaders_parts_have_started(
    tmp_path: Path, cluster: tuple[KubeEmulator, RedfishSimulator], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without leader election the replica leads from its start; its publisher is held back
    # here, so that /readyz is asked in the window before the leader's parts exist.
    from app.publisher.publisher import Publisher

    release = asyncio.Event()
    original = Publisher.start

    async def held_start(self: Publisher) -> None:
        await release.wait()
        await original(self)

    monkeypatch.setattr(Publisher, "start", held_start)
    emu, sim = cluster
    service = Service(
        settings_for(
            tmp_path,
            emu,
            sim,
            f"sqlite+aiosqlite:///{tmp_path}/x.db",
            FABRIC_DRA_LEADER__ENABLED="false",
        )
    )
    await service.start()
    try:
        status, ready = await get_json(service.admin_port or 0, "/readyz")
        assert status == 503, ready
        [check] = [c for c in ready["checks"] if c["name"] == "leading"]
        assert check["ok"] is False and "starting" in check["message"]
        release.set()
        await eventually(lambda: _ready(service.admin_port or 0), what="ready")
        _, ready = await get_json(service.admin_port or 0, "/readyz")
        assert not [c for c in ready["checks"] if c["name"] == "leading"]
    finally:
        release.set()
        await service.stop(deadline_s=5)


async def test_a_stop_past_its_deadline_cancels_the_attach_in_flight_and_leaves_no_task(
    tmp_path: Path, cluster: tuple[KubeEmulator, RedfishSimulator]
) -> None:
    # The attach in flight outlasts the stop's deadline: the step-down's drain is cut short.
    # Everything the leader ran must still be cancelled and awaited by stop(), and no database
    # connection left checked out (an aiosqlite connection keeps a process from ending).
    from app.journal import ATTACHING, Journal

    emu, sim = cluster
    service = Service(settings_for(tmp_path, emu, sim, f"sqlite+aiosqlite:///{tmp_path}/d.db"))
    await service.start()
    stopped = False
    try:
        await eventually(lambda: len(slices(emu)) == 1, what="slices")
        device = slices(emu)[0]["spec"]["devices"][0]["name"]
        sim.faults.latency_s = 30.0
        allocate(emu, "default", "c1", device, NODES[0])
        journal = Journal(service.db)

        async def attaching() -> bool:
            return any(r.state == ATTACHING for r in await journal.active())

        await eventually(attaching, what="an attach in flight")
        pools = [engine.pool for engine in service.db.engines]
        await asyncio.wait_for(service.stop(deadline_s=1.0), 15)
        stopped = True
        left = [
            t.get_name()
            for t in asyncio.all_tasks()
            if t is not asyncio.current_task()
            and not t.done()
            and t.get_name().startswith(("claims-", "supervised-", "event-recorder", "leading"))
        ]
        assert left == []
        assert [pool.checkedout() for pool in pools] == [0] * len(pools)
        assert service.leading is None
    finally:
        sim.faults.latency_s = 0
        if not stopped:
            await service.stop(deadline_s=5)


async def test_two_fabric_managers_lose_and_regain_leadership(
    tmp_path: Path, cluster: tuple[KubeEmulator, RedfishSimulator]
) -> None:
    # Each fabric manager has its own inventory loop ("inventory a", "inventory b"); a step-down
    # must stop them all, or the next term cannot start them again.
    emu, sim = cluster
    service = Service(
        settings_for(
            tmp_path,
            emu,
            sim,
            f"sqlite+aiosqlite:///{tmp_path}/m.db",
            FABRIC_DRA_FABRIC__URL="",
            FABRIC_DRA_FABRIC__USERNAME_FILE="",
            FABRIC_DRA_FABRIC__PASSWORD_FILE="",
            FABRIC_DRA_FABRIC__RETRY_ATTEMPTS="",
            FABRIC_DRA_FABRICS=json.dumps(
                [
                    {
                        "name": name,
                        "url": sim_url(sim),
                        "username_file": str(tmp_path / "user"),
                        "password_file": str(tmp_path / "password"),
                    }
                    for name in ("a", "b")
                ]
            ),
        )
    )
    await service.start()
    try:
        await eventually(lambda: service.leading is not None and service.leading.started)
        names = {state.name for state in service.supervisor.states()}
        assert {"inventory a", "inventory b"} <= names, names
        await service._on_stopped_leading()
        names = {state.name for state in service.supervisor.states()}
        assert not {n for n in names if n.startswith(("inventory", "publish"))}, names
        await service._on_started_leading()
        await eventually(lambda: service.leading is not None and service.leading.started)
        names = {state.name for state in service.supervisor.states()}
        assert {"inventory a", "inventory b", "publish"} <= names, names
    finally:
        await service.stop(deadline_s=5)


async def test_readiness_says_once_in_one_line_when_the_schema_is_gone(
    tmp_path: Path, cluster: tuple[KubeEmulator, RedfishSimulator]
) -> None:
    # An operator ran `db downgrade base` under a running controller: the database still
    # answers, the inventory status cannot be read.
    from sqlalchemy import text

    emu, sim = cluster
    service = Service(
        settings_for(
            tmp_path,
            emu,
            sim,
            f"sqlite+aiosqlite:///{tmp_path}/g.db",
            FABRIC_DRA_LEADER__ENABLED="false",
        )
    )
    await service.start()
    try:
        await eventually(lambda: _ready(service.admin_port), what="ready")
        async with service.db.engine.begin() as connection:
            await connection.execute(text("DROP TABLE inventory_status"))
        status, ready = await get_json(service.admin_port or 0, "/readyz")
        assert status == 503, ready
        named = {c["name"]: c for c in ready["checks"]}
        assert [c["name"] for c in ready["checks"]].count("database") == 1
        assert named["database"]["ok"] is True
        check = named["inventory status"]
        assert check["ok"] is False and "inventory_status" in check["message"]
        assert "\n" not in check["message"] and check["message"].endswith("at head?)")
    finally:
        await service.stop(deadline_s=5)
