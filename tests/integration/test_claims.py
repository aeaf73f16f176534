"""The claim reconciler against the Kubernetes API emulator, the Redfish simulator and a real
database (SQLite and PostgreSQL). Allocations are written into claims the way kube-scheduler
writes them; the scheduler stand-in's own cycle is tested in test_scheduler_standin.py."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from builders import eventually
from kubernetes_asyncio.client import CoreV1Api
from sqlalchemy import select

from app.claims.fabric_ops import EventRecorder
from app.claims.model import REPAIR_RETRY_S
from app.claims.reconciler import ClaimReconciler, ClaimSettings
from app.clock import utcnow
from app.db.engine import Database
from app.db.models import Device
from app.fabric.redfish.backend import RedfishBackend
from app.fabric.redfish.transport import RetrySettings
from app.inventory import InventorySync
from app.inventory.queries import pool_devices
from app.journal import ATTACHED, ATTACHING, DETACHING, FAILED, ClaimRef, Journal
from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from app.kube.informer import InformerSettings
from app.kube.versions import ResourceApiVersion
from app.kube.workqueue import WorkQueueSettings
from app.metrics import ClaimMetrics
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

DRIVER = "fabric.example.com"
CLAIMS = "resource.k8s.io/v1"


@dataclass
class Harness:
    db: Database
    sim: RedfishSimulator
    backend: RedfishBackend
    emu: KubeEmulator
    client: KubeClient
    devices: dict[str, Device]  # name -> row

    def reconciler(self, **changes: Any) -> ClaimReconciler:
        values: dict[str, Any] = {
            "driver_name": DRIVER,
            "workers": 4,
            "orphan_grace_s": 0.2,
            "sweep_interval_s": 0.1,
            "informer": InformerSettings(
                name="x", watch_timeout_s=30, backoff_initial_s=0.05, backoff_max_s=0.2
            ),
            "queue": WorkQueueSettings(base_delay_s=0.02, max_delay_s=0.2),
        }
        settings = ClaimSettings(**{**values, **changes})
        return ClaimReconciler(
            self.client,
            ResourceApiVersion.V1,
            self.db,
            self.backend,
            settings,
            metrics=ClaimMetrics.create(__import__("prometheus_client").CollectorRegistry()),
        )

    def device_names(self) -> list[str]:
        return sorted(self.devices)

    def block_of(self, name: str) -> str:
        return self.devices[name].attach_unit

    def claim(self, name: str) -> dict[str, Any] | None:
        return self.emu.get(CLAIMS, "ResourceClaim", name, "default")

    def create_claim(self, name: str, requests: tuple[str, ...] = ("gpu",)) -> dict[str, Any]:
        return self.emu.create(
            {
                "apiVersion": CLAIMS,
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": r, "exactly": {"deviceClassName": "fabric-gpu"}}
                            for r in requests
                        ]
                    }
                },
            }
        )

    def allocate(
        self,
        name: str,
        devices: list[tuple[str, str]],
        node: str | None,
        *,
        config: list[dict[str, Any]] | None = None,
        pod: str | None = None,
    ) -> dict[str, Any]:
        claim = self.claim(name)
        assert claim is not None
        results = [
            {"request": request, "driver": DRIVER, "pool": self.devices[d].pool_name, "device": d}
            for request, d in devices
        ]
        allocation: dict[str, Any] = {"devices": {"results": results, "config": config or []}}
        if node is not None:
            allocation["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        else:
            allocation["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/region",
                                "operator": "In",
                                "values": ["us-east"],
                            }
                        ]
                    }
                ]
            }
        claim["status"] = {
            "allocation": allocation,
            "reservedFor": [
                {"resource": "pods", "name": pod or f"{name}-pod", "uid": str(uuid.uuid4())}
            ],
        }
        return self.emu.update_status(claim)

    def deallocate(self, name: str) -> None:
        claim = self.claim(name)
        assert claim is not None
        claim["status"] = {}
        self.emu.update_status(claim)

    def our_status(self, name: str) -> list[dict[str, Any]]:
        claim = self.claim(name) or {}
        return [
            e for e in (claim.get("status") or {}).get("devices") or [] if e.get("driver") == DRIVER
        ]

    def condition(self, name: str, device: str, type_: str) -> str | None:
        for entry in self.our_status(name):
            if entry["device"] == device:
                for c in entry["conditions"]:
                    if c["type"] == type_:
                        return str(c["status"])
        return None

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.emu.list("v1", "Event", "default") if e.get("reason") == reason]


NODES = ["node-us-east-rack-01-1", "node-us-east-rack-01-2"]


@pytest.fixture
async def harness(db: Database) -> AsyncIterator[Harness]:
    async with build_harness(db, devices=6) as built:
        yield built


@pytest.fixture
async def harness50(db: Database) -> AsyncIterator[Harness]:
    async with build_harness(db, devices=50) as built:
        yield built


@contextlib.asynccontextmanager
async def build_harness(db: Database, devices: int) -> AsyncIterator[Harness]:
    sim = RedfishSimulator(
        spec=InventorySpec(
            regions=1, racks_per_region=1, devices_per_rack=devices, hosts_per_rack=2
        ),
        auth="none",
    )
    url = await sim.start()
    backend = RedfishBackend(
        url,
        auth="none",
        retry=RetrySettings(attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02),
        timeout_s=5,
    )
    await InventorySync(backend, db).sync_once()
    async with db.read() as session:
        rows = {d.name: d for d in (await session.scalars(select(Device))).all()}
    for row in rows.values():
        row.pool_name = f"{row.region}/{row.rack}"  # type: ignore[attr-defined]
    emu = KubeEmulator(served_resource_versions=("v1",))
    emu_url = await emu.start()
    for node in NODES:
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
            }
        )
    client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emu_url))
    yield Harness(db, sim, backend, emu, client, rows)
    await client.close()
    await emu.stop()
    await backend.close()
    await sim.stop()


@contextlib.asynccontextmanager
async def running(reconciler: ClaimReconciler) -> AsyncIterator[ClaimReconciler]:
    await reconciler.start()
    try:
        yield reconciler
    finally:
        await reconciler.stop()


async def test_full_cycle_attach_ready_then_detach_on_deallocation(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.claims.fabric_ops")
    device = harness.device_names()[0]
    harness.create_claim("c1")
    async with running(harness.reconciler()) as reconciler:
        harness.allocate("c1", [("gpu", device)], NODES[0])
        await eventually(
            lambda: harness.condition("c1", device, "FabricDeviceReady") == "True",
            what="binding condition True",
        )
        assert harness.condition("c1", device, "FabricDeviceFailed") == "False"
        assert harness.sim.attachments()[harness.block_of(device)] == NODES[0]
        entry = harness.our_status("c1")[0]
        assert entry["data"]["node"] == NODES[0] and entry["data"]["host"] == NODES[0]
        assert entry["data"]["uuid"] == harness.devices[device].uuid
        # What the node plugin looks for on the host.
        assert entry["data"]["serialNumber"] == harness.devices[device].serial
        assert entry["data"]["deviceType"] == str(harness.devices[device].device_type)
        # Events go out through the background recorder: wait for them, then count.
        await eventually(lambda: len(harness.events("Attached")) >= 1, what="Attached event")
        assert len(harness.events("Attached")) == 1
        (held,) = await reconciler.journal.for_claim(harness.claim("c1")["metadata"]["uid"])
        assert held.state == ATTACHED and held.node == NODES[0]

        # Nothing changes: a second pass, run here to its end, writes nothing to the API
        # server or the fabric.
        writes = len(harness.emu.writes())
        history = len(harness.sim.history)
        await reconciler.reconcile(harness.claim("c1")["metadata"]["uid"])
        assert len(harness.emu.writes()) == writes and len(harness.sim.history) == history

        harness.deallocate("c1")
        await eventually(
            lambda: harness.sim.attachments()[harness.block_of(device)] is None, what="detach"
        )
        await eventually(lambda: len(harness.events("Detached")) == 1, what="Detached event")
        assert await reconciler.journal.for_claim(held.claim.uid) == []
        assert harness.sim.history == [
            ("attach", harness.block_of(device), NODES[0]),
            ("detach", harness.block_of(device), NODES[0]),
        ]
    # One INFO line each for the operator, naming the claim, device, node and host.
    lines = [r.getMessage() for r in caplog.records if r.name == "app.claims.fabric_ops"]
    attached = [m for m in lines if " attached " in m]
    detached = [m for m in lines if " detached " in m]
    assert len(attached) == 1 and len(detached) == 1, lines
    assert re.fullmatch(
        rf"claim default/c1: device {device} attached to node {NODES[0]} "
        rf"\(fabric host {NODES[0]}\) in \d+ ms",
        attached[0],
    ), attached
    assert detached[0] == f"claim default/c1: device {device} detached from fabric host {NODES[0]}"


async def test_many_concurrent_claims_attach_each_device_once(harness: Harness) -> None:
    names = harness.device_names()
    for i in range(len(names)):
        harness.create_claim(f"c{i}")
    async with running(harness.reconciler()):
        for i, device in enumerate(names):
            harness.allocate(f"c{i}", [("gpu", device)], NODES[i % 2])
        await eventually(
            lambda: all(
                harness.condition(f"c{i}", d, "FabricDeviceReady") == "True"
                for i, d in enumerate(names)
            ),
            what="all ready",
        )
    attaches = [h for h in harness.sim.history if h[0] == "attach"]
    assert len(attaches) == len(names) == len({h[1] for h in attaches})


async def test_two_claims_given_one_device_only_the_first_gets_it_the_second_waits(
    harness: Harness,
) -> None:
    device = harness.device_names()[0]
    harness.create_claim("a")
    harness.create_claim("b")
    async with running(harness.reconciler()) as reconciler:
        harness.allocate("a", [("gpu", device)], NODES[0])
        await eventually(lambda: harness.condition("a", device, "FabricDeviceReady") == "True")
        harness.allocate("b", [("gpu", device)], NODES[1])
        # A double allocation: b waits (no failure condition), and says why.
        await eventually(
            lambda: _reason(harness, "b", device) == "WaitingForDetach",
            what="the second claim waiting",
        )
        assert harness.condition("b", device, "FabricDeviceReady") == "False"
        assert harness.condition("b", device, "FabricDeviceFailed") == "False"
        message = harness.our_status("b")[0]["conditions"][0]["message"]
        assert "claim default/a holds it" in message and "allocated twice" in message
        uid = harness.claim("b")["metadata"]["uid"]
        await eventually(lambda: reconciler.queue.num_requeues(uid) >= 3, what="retries")
        await reconciler.events.flush()
        (event,) = harness.events("WaitingForDetach")
        assert event["type"] == "Warning" and event["involvedObject"]["name"] == "b"
        # The scheduler's binding timeout gives b's allocation back: the wait ends.
        harness.deallocate("b")
        await eventually(
            lambda: harness.our_status("b") == [] and not reconciler.status()["waiting"],
            what="the wait ended",
        )
        assert reconciler._release_waiters == {}
    assert harness.sim.attachments()[harness.block_of(device)] == NODES[0]
    assert harness.events("AttachFailed") == []


def _reason(harness: Harness, name: str, device: str) -> str | None:
    for entry in harness.our_status(name):
        if entry["device"] == device:
            return str(entry["conditions"][0]["reason"])
    return None


async def test_a_device_still_detaching_is_waited_for_then_attached_to_the_new_claim(
    harness: Harness,
) -> None:
    device = harness.device_names()[0]
    block = harness.block_of(device)
    harness.create_claim("old")
    harness.create_claim("new")
    async with running(harness.reconciler(max_detach_attempts=100_000)) as reconciler:
        harness.allocate("old", [("gpu", device)], NODES[0])
        await eventually(lambda: harness.condition("old", device, "FabricDeviceReady") == "True")
        old_uid = harness.claim("old")["metadata"]["uid"]
        # Every write to the old claim's server fails (503, transient) until the test lets the
        # detach through.
        for method in ("POST", "PATCH"):
            harness.sim.fail_next(
                10**9, method=method, path_prefix=f"/redfish/v1/Systems/{NODES[0]}", status=503
            )
        harness.deallocate("old")
        await eventually(lambda: _state_is(reconciler, old_uid, DETACHING), what="detaching")
        # The scheduler gives the device to a new claim on the other node meanwhile.
        harness.allocate("new", [("gpu", device)], NODES[1])
        await eventually(
            lambda: _reason(harness, "new", device) == "WaitingForDetach",
            what="the new claim waiting for the detach",
        )
        assert harness.condition("new", device, "FabricDeviceReady") == "False"
        assert harness.condition("new", device, "FabricDeviceFailed") == "False"
        message = harness.our_status("new")[0]["conditions"][0]["message"]
        assert f"waiting for device {device}: claim default/old holds it" in message
        assert "state detaching" in message and f"host {NODES[0]}" in message
        new_uid = harness.claim("new")["metadata"]["uid"]
        await eventually(lambda: reconciler.queue.num_requeues(new_uid) >= 3, what="retries")
        assert reconciler.status()["waiting"] == [{"claim": "default/new", "reason": message}]
        await reconciler.events.flush()
        (event,) = harness.events("WaitingForDetach")
        assert event["type"] == "Normal" and event["involvedObject"]["name"] == "new"
        assert harness.sim.attachments()[block] == NODES[0]

        harness.sim.clear_failures()
        await eventually(
            lambda: harness.condition("new", device, "FabricDeviceReady") == "True",
            what="the new claim ready after the detach",
        )
        assert harness.condition("new", device, "FabricDeviceFailed") == "False"
        assert harness.sim.attachments()[block] == NODES[1]
        assert await reconciler.journal.for_claim(old_uid) == []
        (held,) = await reconciler.journal.for_claim(new_uid)
        assert held.state == ATTACHED and held.host_id == NODES[1]
        assert reconciler.status()["waiting"] == [] and reconciler._release_waiters == {}
    assert [h for h in harness.sim.history if h[1] == block] == [
        ("attach", block, NODES[0]),
        ("detach", block, NODES[0]),
        ("attach", block, NODES[1]),
    ]
    assert harness.events("AttachFailed") == []
    assert len(harness.events("WaitingForDetach")) == 1


async def test_a_waiting_claim_is_queued_when_the_release_completes_not_after_its_backoff(
    harness: Harness,
) -> None:
    # Retries wait two minutes and the sweep runs once: only the journal's release listener
    # can bring the waiting claim back within the test's timeout.
    device = harness.device_names()[1]
    harness.create_claim("a")
    harness.create_claim("b")
    slow = WorkQueueSettings(base_delay_s=120, max_delay_s=120)
    async with running(harness.reconciler(queue=slow, sweep_interval_s=3600)):
        harness.allocate("a", [("gpu", device)], NODES[0])
        await eventually(lambda: harness.condition("a", device, "FabricDeviceReady") == "True")
        harness.allocate("b", [("gpu", device)], NODES[1])
        await eventually(
            lambda: _reason(harness, "b", device) == "WaitingForDetach", what="b waiting"
        )
        # a's release had not run yet when b was allocated; now it does.
        harness.deallocate("a")
        await eventually(
            lambda: harness.condition("b", device, "FabricDeviceReady") == "True",
            what="b ready as soon as a's detach completed",
        )
    assert harness.sim.attachments()[harness.block_of(device)] == NODES[1]


async def test_a_release_written_by_another_process_is_found_by_the_sweep(
    harness: Harness,
    database_url: str,
) -> None:
    # Another process (its own Database, so its own journal feed) holds the device for a
    # control-plane claim, then releases it: this process hears of it from the sweep.
    device = harness.device_names()[2]
    other = Database.connect(database_url)
    try:
        journal = Journal(other)
        held = await journal.reserve(
            ClaimRef("classic-uid", "default", "classic"),
            "gpu",
            device,
            "us-east/rack-01",
            "control-plane",
            NODES[0],
            NODES[0],
        )
        harness.create_claim("b")
        slow = WorkQueueSettings(base_delay_s=120, max_delay_s=120)
        async with running(harness.reconciler(queue=slow, sweep_interval_s=0.1)):
            harness.allocate("b", [("gpu", device)], NODES[1])
            await eventually(
                lambda: _reason(harness, "b", device) == "WaitingForDetach", what="b waiting"
            )
            message = harness.our_status("b")[0]["conditions"][0]["message"]
            assert "claim default/classic (control-plane mode) holds it" in message
            assert await journal.transition(held.id, ["pending"], "released") is not None
            await eventually(
                lambda: harness.condition("b", device, "FabricDeviceReady") == "True",
                what="b ready after the other process's release",
            )
        assert harness.sim.attachments()[harness.block_of(device)] == NODES[1]
    finally:
        await other.dispose()


async def test_fabric_conflict_fails_the_device_and_stops_offering_it(harness: Harness) -> None:
    device = harness.device_names()[1]
    # Someone attached the block to the other server behind our back.
    await harness.backend.attach(
        (await Journal(harness.db).fabric_device_by_name(device)), NODES[1]
    )
    harness.create_claim("c1")
    failed_before = [d for d in await pool_devices(harness.db) if d.attach_failed]
    assert failed_before == []
    async with running(harness.reconciler()) as reconciler:
        harness.allocate("c1", [("gpu", device)], NODES[0])
        await eventually(lambda: harness.condition("c1", device, "FabricDeviceFailed") == "True")
        assert harness.condition("c1", device, "FabricDeviceReady") == "False"
        # Events go out through the background recorder: wait for them, then count.
        await eventually(
            lambda: len(harness.events("AttachFailed")) >= 1, what="AttachFailed event"
        )
        assert len(harness.events("AttachFailed")) == 1
        assert harness.events("AttachFailed")[0]["type"] == "Warning"
        (held,) = await reconciler.journal.for_claim(harness.claim("c1")["metadata"]["uid"])
        assert held.state == FAILED
        assert (held.last_error or "").startswith(f"attach {device} to host {NODES[0]}: ")
        assert [d.name for d in await pool_devices(harness.db) if d.attach_failed] == [device]
        # The scheduler gives the device back: the failed reservation is released.
        harness.deallocate("c1")
        await eventually(
            lambda: _no_reservations(reconciler, held.claim.uid), what="failed reservation released"
        )
    # It was never ours: the other server still holds it.
    assert harness.sim.attachments()[harness.block_of(device)] == NODES[1]


async def _no_reservations(reconciler: ClaimReconciler, uid: str) -> bool:
    return await reconciler.journal.for_claim(uid) == []


async def test_transient_fabric_errors_are_retried(harness: Harness) -> None:
    device = harness.device_names()[2]
    harness.create_claim("c1")
    harness.sim.fail_next(3, method="POST", path_prefix="/redfish/v1/Systems", status=503)
    harness.sim.fail_next(3, method="PATCH", path_prefix="/redfish/v1/Systems", status=503)
    async with running(harness.reconciler()):
        harness.allocate("c1", [("gpu", device)], NODES[0])
        await eventually(lambda: harness.condition("c1", device, "FabricDeviceReady") == "True")
    assert harness.sim.attachments()[harness.block_of(device)] == NODES[0]


async def test_bad_opaque_config_refuses_without_attaching(harness: Harness) -> None:
    device = harness.device_names()[0]
    harness.create_claim("c1")
    config = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "fabric-dra.io/v1alpha1",
                    "kind": "FabricDeviceConfig",
                    "maxAttachAttempts": 500,
                },
            },
        }
    ]
    async with running(harness.reconciler()):
        harness.allocate("c1", [("gpu", device)], NODES[0], config=config)
        await eventually(lambda: harness.condition("c1", device, "FabricDeviceFailed") == "True")
    entry = harness.our_status("c1")[0]
    assert entry["conditions"][1]["reason"] == "InvalidConfig"
    assert "maxAttachAttempts" in entry["conditions"][1]["message"]
    assert harness.events("InvalidConfig")[0]["type"] == "Warning"
    assert harness.sim.history == []


async def test_claim_deleted_during_a_slow_attach_ends_detached(harness: Harness) -> None:
    device = harness.device_names()[3]
    harness.create_claim("c1")
    harness.sim.faults.latency_s = 0.4
    async with running(harness.reconciler()) as reconciler:
        harness.allocate("c1", [("gpu", device)], NODES[0])
        uid = harness.claim("c1")["metadata"]["uid"]
        await eventually(lambda: _state_is(reconciler, uid, ATTACHING), what="attaching")
        harness.emu.delete(CLAIMS, "ResourceClaim", "c1", "default")
        await eventually(
            lambda: _no_reservations(reconciler, uid), timeout_s=20, what="released after deletion"
        )
    harness.sim.faults.latency_s = 0
    assert harness.sim.attachments()[harness.block_of(device)] is None


async def _state_is(reconciler: ClaimReconciler, uid: str, state: str) -> bool:
    return any(r.state == state for r in await reconciler.journal.for_claim(uid))


async def test_node_is_learnt_from_the_pod_when_binding_conditions_are_absent(
    harness: Harness,
) -> None:
    device = harness.device_names()[4]
    harness.create_claim("c1")
    harness.emu.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "consumer", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
    )
    async with running(harness.reconciler()) as reconciler:
        harness.allocate("c1", [("gpu", device)], None, pod="consumer")
        await eventually(lambda: bool(reconciler.status()["waiting"]), what="waiting")
        assert reconciler.status()["waiting"][0]["reason"].startswith("waiting for the node")
        assert harness.sim.history == []
        pod = harness.emu.get("v1", "Pod", "consumer", "default")
        pod["spec"]["nodeName"] = NODES[1]
        harness.emu.update(pod)
        reconciler.queue.add(harness.claim("c1")["metadata"]["uid"])
        await eventually(lambda: harness.sim.attachments()[harness.block_of(device)] == NODES[1])
        assert reconciler.status()["node_learnt_from_pod"] == 1


async def test_restart_recovery_finishes_or_rolls_back_unfinished_intents(
    harness: Harness,
) -> None:
    names = harness.device_names()
    journal = Journal(harness.db)
    for i in range(3):
        harness.create_claim(f"c{i}")
        harness.allocate(f"c{i}", [("gpu", names[i])], NODES[0])
    uids = [harness.claim(f"c{i}")["metadata"]["uid"] for i in range(3)]

    async def intent(i: int, state: str) -> int:
        held = await journal.reserve(
            ClaimRef(uids[i], "default", f"c{i}"),
            "gpu",
            names[i],
            "us-east/rack-01",
            "structured",
            NODES[0],
            NODES[0],
        )
        moved = await journal.transition(held.id, ["pending"], state)
        assert moved is not None
        return held.id

    # c0: crashed after the intent was written, before the attach was sent.
    await intent(0, ATTACHING)
    # c1: crashed after the attach went through, before it was recorded.
    await intent(1, ATTACHING)
    await harness.backend.attach(await journal.fabric_device_by_name(names[1]), NODES[0])
    # c2: crashed during a detach that never reached the fabric; the claim is gone since.
    await intent(2, ATTACHING)
    await harness.backend.attach(await journal.fabric_device_by_name(names[2]), NODES[0])
    third = (await journal.for_claim(uids[2]))[0]
    await journal.transition(third.id, [ATTACHING], ATTACHED)
    await journal.transition(third.id, [ATTACHED], DETACHING)
    harness.emu.delete(CLAIMS, "ResourceClaim", "c2", "default")

    async with running(harness.reconciler()) as reconciler:
        await eventually(
            lambda: all(
                harness.condition(f"c{i}", names[i], "FabricDeviceReady") == "True" for i in (0, 1)
            ),
            what="c0 and c1 ready",
        )
        await eventually(lambda: _no_reservations(reconciler, uids[2]), what="c2 released")
    attachments = harness.sim.attachments()
    assert attachments[harness.block_of(names[0])] == NODES[0]
    assert attachments[harness.block_of(names[1])] == NODES[0]
    assert attachments[harness.block_of(names[2])] is None
    # c1's attach was not sent twice.
    assert [h for h in harness.sim.history if h[1] == harness.block_of(names[1])] == [
        ("attach", harness.block_of(names[1]), NODES[0])
    ]


async def test_orphans_of_claims_that_vanished_while_down_are_detached(
    harness: Harness,
) -> None:
    device = harness.device_names()[5]
    journal = Journal(harness.db)
    held = await journal.reserve(
        ClaimRef("gone-uid", "default", "gone"),
        "gpu",
        device,
        "us-east/rack-01",
        "structured",
        NODES[1],
        NODES[1],
    )
    await journal.transition(held.id, ["pending"], ATTACHING)
    await harness.backend.attach(await journal.fabric_device_by_name(device), NODES[1])
    await journal.transition(held.id, [ATTACHING], ATTACHED)
    async with running(harness.reconciler()) as reconciler:
        await eventually(lambda: _no_reservations(reconciler, "gone-uid"), what="orphan released")
    assert harness.sim.attachments()[harness.block_of(device)] is None


async def test_unmanaged_attachments_are_reported_and_detached_only_when_asked(
    harness: Harness,
) -> None:
    device = harness.device_names()[0]
    journal = Journal(harness.db)
    await harness.backend.attach(await journal.fabric_device_by_name(device), NODES[0])
    await InventorySync(harness.backend, harness.db).sync_once()
    async with running(harness.reconciler()) as reconciler:
        await eventually(lambda: len(reconciler.status()["unmanaged_attachments"]) == 1)
        await asyncio.sleep(0.4)
        assert harness.sim.attachments()[harness.block_of(device)] == NODES[0]
    async with running(harness.reconciler(detach_unmanaged=True)):
        await eventually(
            lambda: harness.sim.attachments()[harness.block_of(device)] is None,
            what="unmanaged device detached",
        )


class Killed(BaseException):
    """Stands for SIGKILL: escapes every handler, nothing is cleaned up."""


@pytest.mark.parametrize("step", ["after-intent", "after-attach", "before-status"])
async def test_killed_at_each_step_then_restarted_converges_without_leaks(
    harness: Harness, step: str
) -> None:
    names = harness.device_names()
    harness.create_claim("c1")
    harness.create_claim("c2")
    killed = asyncio.Event()

    async def crash_once(at: str) -> None:
        if at == step and not killed.is_set():
            killed.set()
            raise Killed(at)

    first = harness.reconciler()
    first._checkpoint = crash_once
    await first.start()
    harness.allocate("c1", [("gpu", names[0])], NODES[0])
    await eventually(killed.is_set, what=f"the crash at {step}")
    await first.stop()

    # While the controller was down, c2 was allocated and c1 let go of its device.
    harness.allocate("c2", [("gpu", names[1])], NODES[1])
    harness.deallocate("c1")
    async with running(harness.reconciler()) as second:
        await eventually(lambda: harness.condition("c2", names[1], "FabricDeviceReady") == "True")
        uid = harness.emu.get(CLAIMS, "ResourceClaim", "c1", "default")["metadata"]["uid"]
        await eventually(lambda: _no_reservations(second, uid), what="c1 released")
    attachments = harness.sim.attachments()
    assert attachments[harness.block_of(names[0])] is None
    assert attachments[harness.block_of(names[1])] == NODES[1]
    assert all(r.claim.name == "c2" for r in await Journal(harness.db).active())


async def test_stop_lets_an_attach_in_flight_finish(harness: Harness) -> None:
    device = harness.device_names()[0]
    harness.create_claim("c1")
    harness.sim.faults.latency_s = 0.3
    reconciler = harness.reconciler()
    await reconciler.start()
    harness.allocate("c1", [("gpu", device)], NODES[0])
    uid = harness.claim("c1")["metadata"]["uid"]
    await eventually(lambda: _state_is(reconciler, uid, ATTACHING), what="attaching")
    await reconciler.stop(drain_s=10)
    harness.sim.faults.latency_s = 0
    (held,) = await Journal(harness.db).for_claim(uid)
    assert held.state == ATTACHED
    assert harness.sim.attachments()[harness.block_of(device)] == NODES[0]


async def test_fifty_concurrent_claims_attach_each_device_exactly_once(harness50: Harness) -> None:
    names = harness50.device_names()
    assert len(names) == 50
    for i in range(50):
        harness50.create_claim(f"c{i}")
    async with running(harness50.reconciler(workers=8)):
        for i, device in enumerate(names):
            harness50.allocate(f"c{i}", [("gpu", device)], NODES[i % 2])
        await eventually(
            lambda: all(
                harness50.condition(f"c{i}", d, "FabricDeviceReady") == "True"
                for i, d in enumerate(names)
            ),
            timeout_s=60,
            what="fifty claims ready",
        )
        for i in range(50):
            harness50.deallocate(f"c{i}")
        await eventually(
            lambda: all(v is None for v in harness50.sim.attachments().values()),
            timeout_s=60,
            what="fifty detaches",
        )
    history = harness50.sim.history
    assert sorted(h[1] for h in history if h[0] == "attach") == sorted(
        harness50.block_of(d) for d in names
    )
    assert sorted(h[1] for h in history if h[0] == "detach") == sorted(
        harness50.block_of(d) for d in names
    )
    held: dict[str, str] = {}
    for operation, block, system in history:
        if operation == "attach":
            assert block not in held, f"{block} attached twice"
            held[block] = system
        else:
            assert held.pop(block) == system


async def test_an_attach_that_times_out_is_retried_then_reported_failed(
    harness: Harness,
) -> None:
    device = harness.device_names()[0]
    harness.create_claim("c1")
    config = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "fabric-dra.io/v1alpha1",
                    "kind": "FabricDeviceConfig",
                    "attachTimeoutSeconds": 1,
                    "maxAttachAttempts": 2,
                },
            },
        }
    ]
    harness.sim.faults.latency_s = 1.5
    async with running(harness.reconciler()) as reconciler:
        harness.allocate("c1", [("gpu", device)], NODES[0], config=config)
        await eventually(
            lambda: harness.condition("c1", device, "FabricDeviceFailed") == "True",
            timeout_s=30,
            what="failure after two timed-out attempts",
        )
        (held,) = await reconciler.journal.for_claim(harness.claim("c1")["metadata"]["uid"])
        assert held.state == FAILED and held.attempts == 2
        assert "no answer within 1s" in (held.last_error or "")
        harness.sim.faults.latency_s = 0
        harness.deallocate("c1")
        await eventually(lambda: _no_reservations(reconciler, held.claim.uid), timeout_s=20)
    # Whatever the slow attaches did in the end, nothing stays attached.
    await eventually(
        lambda: harness.sim.attachments()[harness.block_of(device)] is None, timeout_s=10
    )


async def test_events_are_sent_in_the_background_and_dropped_only_past_the_limit(
    harness: Harness,
) -> None:
    claim = harness.create_claim("c1")
    recorder = EventRecorder(
        CoreV1Api(harness.client.api), "test", "resource.k8s.io/v1", max_queued=3
    )
    harness.emu.latency_s = 0.05
    for i in range(5):
        # Returns at once: nothing is sent before the caller yields.
        await recorder.record(claim, "Normal", "Probe", f"message {i}")
    assert (recorder.pending(), recorder.dropped, harness.events("Probe")) == (3, 2, [])
    await recorder.close()
    assert sorted(e["message"] for e in harness.events("Probe")) == [
        "message 0",
        "message 1",
        "message 2",
    ]
    assert (recorder.sent, recorder.pending()) == (3, 0)
    # After close an Event is sent at once, in the caller's task; opened again, it queues.
    await recorder.record(claim, "Warning", "Probe", "late")
    assert len(harness.events("Probe")) == 4
    recorder.open()
    await recorder.record(claim, "Warning", "Probe", "queued")
    assert recorder.pending() == 1
    await recorder.close()
    assert len(harness.events("Probe")) == 5
    harness.emu.latency_s = 0


async def test_an_event_the_server_refuses_is_logged_and_the_rest_still_go(
    harness: Harness,
) -> None:
    claim = harness.create_claim("c1")
    recorder = EventRecorder(CoreV1Api(harness.client.api), "test", "resource.k8s.io/v1")
    harness.emu.fail_next(1, method="POST", path_regex="/events", status=500)
    await recorder.record(claim, "Normal", "Probe", "refused")
    await recorder.record(claim, "Normal", "Probe", "accepted")
    await recorder.flush()
    assert [e["message"] for e in harness.events("Probe")] == ["accepted"]
    assert recorder.sent == 1
    await recorder.close()


async def test_events_left_at_a_timed_out_close_are_dropped_and_later_ones_still_go(
    harness: Harness,
) -> None:
    claim = harness.create_claim("c1")
    recorder = EventRecorder(
        CoreV1Api(harness.client.api), "test", "resource.k8s.io/v1", max_queued=2
    )
    harness.emu.latency_s = 0.5  # the API server is slow
    for i in range(4):
        await recorder.record(claim, "Normal", "Probe", f"old {i}")
        await asyncio.sleep(0)
    await recorder.close(timeout_s=0.1)
    assert recorder.pending() == 0
    # One refused by the full queue, one cut off in flight, two left queued at the close.
    assert recorder.dropped == 4
    harness.emu.latency_s = 0
    recorder.open()
    await recorder.record(claim, "Normal", "Probe", "new")
    await recorder.flush()
    assert [e["message"] for e in harness.events("Probe")] == ["new"]
    await recorder.close()
    await asyncio.sleep(0.6)  # the emulator's handler of the request cut off ends


async def test_an_attach_never_sent_is_never_counted(harness: Harness) -> None:
    # Two devices: both are held first, each attach is journalled only as it is sent. A pass
    # cut off after the first intent leaves the second one pending with no attempt.
    names = harness.device_names()
    harness.create_claim("c1", ("a", "b"))
    stopped = asyncio.Event()

    async def stop_once(at: str) -> None:
        if at == "after-intent" and not stopped.is_set():
            stopped.set()
            raise RuntimeError("cut off after the first intent")

    reconciler = harness.reconciler()
    reconciler._checkpoint = stop_once
    async with running(reconciler):
        harness.allocate("c1", [("a", names[0]), ("b", names[1])], NODES[0])
        await eventually(stopped.is_set, what="the cut")
        uid = harness.claim("c1")["metadata"]["uid"]
        await eventually(
            lambda: harness.condition("c1", names[1], "FabricDeviceReady") == "True",
            what="both attached by the next pass",
        )
        held = {r.device_name: r for r in await reconciler.journal.for_claim(uid)}
    # The first device had its attempt counted twice (the cut one and the real one), the
    # second once: it was never counted before it was sent.
    assert (held[names[0]].attempts, held[names[1]].attempts) == (2, 1)


async def test_claim_status_is_written_with_strict_field_validation(harness: Harness) -> None:
    # A device status field the server does not know must fail the write, not vanish with
    # only a Warning header (app/claims/status.py ClaimStatusWriter.write).
    device = harness.device_names()[0]
    harness.create_claim("c1")
    async with running(harness.reconciler()):
        harness.allocate("c1", [("gpu", device)], NODES[0])
        await eventually(
            lambda: harness.condition("c1", device, "FabricDeviceReady") == "True",
            what="binding condition True",
        )
    status_writes = [
        r for r in harness.emu.writes("/resourceclaims/c1/status") if r.method == "PUT"
    ]
    assert status_writes
    assert all("fieldValidation=Strict" in r.query for r in status_writes)


async def test_a_deleted_event_for_a_claim_that_exists_detaches_nothing(harness: Harness) -> None:
    # A replayed or out-of-order DELETED: the cache says the claim is gone, the API server
    # still has it. The devices stay attached until the server confirms the deletion.
    device = harness.device_names()[0]
    harness.create_claim("c1")
    async with running(harness.reconciler()) as reconciler:
        harness.allocate("c1", [("gpu", device)], NODES[0])
        await eventually(
            lambda: harness.condition("c1", device, "FabricDeviceReady") == "True",
            what="binding condition True",
        )
        claim = harness.claim("c1")
        uid = claim["metadata"]["uid"]
        cached = reconciler.claim_by_uid
        reconciler.claim_by_uid = lambda u: None if u == uid else cached(u)  # type: ignore
        await reconciler._on_claim("DELETED", claim, None)
        await asyncio.sleep(0.5)
        assert harness.sim.attachments()[harness.block_of(device)] == NODES[0]
        (held,) = await reconciler.journal.for_claim(uid)
        assert held.state == ATTACHED
        assert ("detach", harness.block_of(device), NODES[0]) not in harness.sim.history

        # Once the server confirms it (404), the devices are released.
        harness.emu.delete(CLAIMS, "ResourceClaim", "c1", "default")
        await eventually(lambda: _no_reservations(reconciler, uid), what="released")
        assert harness.sim.attachments()[harness.block_of(device)] is None


async def test_the_host_index_is_read_once_for_workers_together_and_not_for_node_status(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.claims.reconciler as reconciler_module

    reads: list[int] = []
    real = reconciler_module.host_refs

    async def counted(db: Database) -> Any:
        reads.append(1)
        await asyncio.sleep(0.05)  # the workers that find the index stale meet here
        return await real(db)

    monkeypatch.setattr(reconciler_module, "host_refs", counted)
    async with running(harness.reconciler(hosts_refresh_s=60)) as reconciler:
        await eventually(lambda: reconciler.nodes.get(NODES[0]) is not None)
        found = await asyncio.gather(*(reconciler._host_for(NODES[0]) for _ in range(8)))
        assert {ref.host_id for ref in found if ref is not None} == {NODES[0]}
        assert len(reads) == 1

        # A status update (a kubelet's report): the index stays, nothing is read again.
        node = harness.emu.get("v1", "Node", NODES[0])
        assert node is not None
        node["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
        written = harness.emu.update_status(node)
        version = written["metadata"]["resourceVersion"]
        await eventually(
            lambda: (reconciler.nodes.get(NODES[0]) or {})["metadata"]["resourceVersion"] == version
        )
        assert "status" not in (reconciler.nodes.get(NODES[0]) or {})
        await reconciler._host_for(NODES[0])
        assert len(reads) == 1

        # A label change may map the node to another host: the index is read again.
        node = harness.emu.get("v1", "Node", NODES[0])
        assert node is not None
        node["metadata"]["labels"]["kubernetes.io/hostname"] = NODES[1]
        version = harness.emu.update(node)["metadata"]["resourceVersion"]
        await eventually(
            lambda: (reconciler.nodes.get(NODES[0]) or {})["metadata"]["resourceVersion"] == version
        )
        ref = await reconciler._host_for(NODES[0])
        assert ref is not None and ref.host_id == NODES[1]
        assert len(reads) == 2


async def test_a_claim_waiting_for_its_host_goes_on_as_soon_as_a_sync_writes_the_host(
    harness: Harness,
) -> None:
    from sqlalchemy import update

    from app.db.models import Host

    async def set_removed(removed: bool) -> None:
        async with harness.db.write() as session:
            await session.execute(
                update(Host)
                .where(Host.host_id == NODES[1])
                .values(removed_at=utcnow() if removed else None)
            )

    await set_removed(True)  # the fabric manager does not report this server (yet)
    device = harness.device_names()[0]
    harness.create_claim("c1")
    async with running(harness.reconciler(hosts_refresh_s=60)) as reconciler:
        harness.allocate("c1", [("gpu", device)], NODES[1])
        uid = harness.claim("c1")["metadata"]["uid"]
        await eventually(lambda: "maps to no fabric host" in reconciler._waiting.get(uid, ""))
        await set_removed(False)
        await asyncio.sleep(0.5)  # the index is remembered for a minute: still waiting
        assert uid in reconciler._waiting and not harness.sim.history
        reconciler.hosts_changed()  # what the service calls when a sync wrote host rows
        await eventually(
            lambda: harness.condition("c1", device, "FabricDeviceReady") == "True",
            what="attached once the host is known",
        )
        assert harness.sim.attachments()[harness.block_of(device)] == NODES[1]


async def test_a_failed_repair_is_attached_again_once_due_and_says_so(harness: Harness) -> None:
    # The device was attached, lost, and could not be attached again (the fabric manager
    # acknowledged attaches without doing them for a while): the reservation ended failed.
    # Its pod is bound, so the claim is looked at again and, once due, the attach is tried
    # again with fresh tries: the fabric works now, and the device comes back.
    device = harness.device_names()[0]
    block = harness.block_of(device)
    harness.create_claim("c1")
    async with running(harness.reconciler()) as reconciler:
        harness.allocate("c1", [("gpu", device)], NODES[0])
        await eventually(lambda: harness.condition("c1", device, "FabricDeviceReady") == "True")
        uid = harness.claim("c1")["metadata"]["uid"]
        (held,) = await reconciler.journal.for_claim(uid)
        harness.sim.detach_out_of_band(block)
        failed = await reconciler.journal.transition(
            held.id,
            [ATTACHED],
            FAILED,
            error=f"device {device} lost its attachment to host {NODES[0]} again: not effective",
        )
        assert failed is not None and failed.attached_at is not None
        await reconciler.reconcile(uid)  # not due yet: reported failed, nothing sent
        assert harness.condition("c1", device, "FabricDeviceFailed") == "True"
        assert harness.sim.attachments()[block] is None
        later = utcnow() + dt.timedelta(seconds=REPAIR_RETRY_S + 1)
        reconciler.clock = lambda: later
        await reconciler.reconcile(uid)
        assert harness.sim.attachments()[block] == NODES[0]
        (again,) = await reconciler.journal.for_claim(uid)
        assert again.id == held.id and again.state == ATTACHED and again.attempts == 1
        assert harness.condition("c1", device, "FabricDeviceReady") == "True"
        assert harness.condition("c1", device, "FabricDeviceFailed") == "False"
        await eventually(
            lambda: any(
                "trying again" in (e.get("message") or "") for e in harness.events("DeviceLost")
            ),
            what="a DeviceLost Event saying it is tried again",
        )
