"""The whole claim cycle against every Redfish simulator profile (behaviours of real
composability services): inventory, reserve, attach (verified), ready, deallocate, detach
(verified), released. Real HTTP, SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import prometheus_client
import pytest
from builders import eventually

from app.claims.drift import DriftWatch
from app.claims.reconciler import ClaimReconciler, ClaimSettings
from app.db.engine import Database
from app.fabric.redfish.backend import RedfishBackend
from app.fabric.redfish.transport import RetrySettings
from app.inventory import InventorySync
from app.inventory.queries import pool_devices
from app.journal import FAILED, Journal
from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from app.kube.informer import InformerSettings
from app.kube.versions import ResourceApiVersion
from app.kube.workqueue import WorkQueueSettings
from app.metrics import ClaimMetrics
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator
from fabric_dra_sim.redfish_profiles import PROFILE_NAMES

DRIVER = "fabric.example.com"
CLAIMS = "resource.k8s.io/v1"
NODES = ["node-us-east-rack-01-1", "node-us-east-rack-01-2"]
HOST_LABEL = "fabric-dra.io/host-id"


@dataclass(frozen=True)
class Case:
    """How the cycle goes on one profile."""

    sim_options: dict[str, Any] = field(default_factory=dict)
    noop_attaches: int | None = 0
    match: str = "hostname"  # how nodes map to hosts
    fails_with: str | None = None  # the attach cannot succeed; its failure names this


TASKS = {"task_mode": True, "task_polls": 1}
CASES: dict[str, Case] = {
    # Every System has the same HostName: nodes are mapped by label instead.
    "placeholder-identity": Case(match="label"),
    "real-service": Case(match="label"),
    # The first attach is answered with success and changes nothing: verification catches
    # it and the next try works.
    "attach-noop": Case(noop_attaches=1),
    "task-200-body": Case(TASKS),
    "task-purged": Case(TASKS),
    "task-killed": Case(TASKS, fails_with="Killed"),
}


@dataclass
class Cycle:
    db: Database
    sim: RedfishSimulator
    backend: RedfishBackend
    emu: KubeEmulator
    client: KubeClient
    case: Case

    def reconciler(self) -> ClaimReconciler:
        return ClaimReconciler(
            self.client,
            ResourceApiVersion.V1,
            self.db,
            self.backend,
            ClaimSettings(
                driver_name=DRIVER,
                workers=2,
                orphan_grace_s=0.2,
                sweep_interval_s=0.1,
                host_match=self.case.match,
                host_key=HOST_LABEL,
                informer=InformerSettings(
                    name="x", watch_timeout_s=30, backoff_initial_s=0.05, backoff_max_s=0.2
                ),
                queue=WorkQueueSettings(base_delay_s=0.02, max_delay_s=0.2),
            ),
            metrics=ClaimMetrics.create(prometheus_client.CollectorRegistry()),
        )

    def claim(self) -> dict[str, Any]:
        found = self.emu.get(CLAIMS, "ResourceClaim", "c1", "default")
        assert found is not None
        return found

    def condition(self, device: str, type_: str) -> str | None:
        for entry in (self.claim().get("status") or {}).get("devices") or []:
            if entry.get("driver") == DRIVER and entry["device"] == device:
                for condition in entry["conditions"]:
                    if condition["type"] == type_:
                        return f"{condition['status']}: {condition['message']}"
        return None

    def ready(self, device: str) -> bool:
        return (self.condition(device, "FabricDeviceReady") or "").startswith("True")


@contextlib.asynccontextmanager
async def cycle_for(db: Database, profile: str) -> AsyncIterator[Cycle]:
    case = CASES.get(profile, Case())
    sim = RedfishSimulator(
        spec=InventorySpec(regions=1, racks_per_region=1, devices_per_rack=4, hosts_per_rack=2),
        auth="none",
        profiles=(profile,),
        **case.sim_options,
    )
    sim.noop_attaches = case.noop_attaches
    url = await sim.start()
    # Built before anything can fail, so that the finally below closes everything.
    backend = RedfishBackend(
        url,
        auth="none",
        retry=RetrySettings(attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02),
        timeout_s=5,
        task_poll_interval_s=0.05,
        verify_poll_s=0.05,
        verify_timeout_s=1.0,
    )
    emu = KubeEmulator(served_resource_versions=("v1",))
    emu_url = await emu.start()
    for node in NODES:
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node,
                    "labels": {"kubernetes.io/hostname": node, HOST_LABEL: node},
                },
            }
        )
    client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emu_url))
    try:
        yield Cycle(db, sim, backend, emu, client, case)
    finally:
        await client.close()
        await emu.stop()
        await backend.close()
        await sim.stop()


@pytest.mark.parametrize("profile", PROFILE_NAMES)
async def test_the_claim_cycle_works_on_every_profile(db: Database, profile: str) -> None:
    async with cycle_for(db, profile) as cycle:
        result = await InventorySync(cycle.backend, db).sync_once()
        assert result.ok, result.error
        devices = sorted(d.name for d in await pool_devices(db))
        # Only the four fabric GPUs are devices: never a server's own compute block.
        assert len(devices) == 4, devices
        device = devices[0]
        journal = Journal(db)
        block = (await journal.fabric_device_by_name(device)).attach_unit
        own_blocks = {s: [b for b, h in cycle.sim.attachments().items() if h == s] for s in NODES}
        cycle.emu.create(
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
        claim = cycle.claim()
        pool = next(d for d in await pool_devices(db) if d.name == device)
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "device": device,
                            "pool": f"{pool.location.region}/{pool.location.rack}",
                        }
                    ],
                    "config": [],
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
            "reservedFor": [{"resource": "pods", "name": "p1", "uid": str(uuid.uuid4())}],
        }
        cycle.emu.update_status(claim)
        uid = str(claim["metadata"]["uid"])
        reconciler = cycle.reconciler()
        await reconciler.start()
        try:
            if cycle.case.fails_with is not None:
                await eventually(
                    lambda: (cycle.condition(device, "FabricDeviceFailed") or "").startswith(
                        "True"
                    ),
                    what="failure condition",
                )
                assert cycle.case.fails_with in (
                    cycle.condition(device, "FabricDeviceFailed") or ""
                )
                (held,) = await journal.for_claim(uid)
                assert held.state == FAILED
                assert cycle.sim.holders(block) == []
                return
            await eventually(lambda: cycle.ready(device), what=f"ready on {profile}")
            assert cycle.sim.holders(block) == [NODES[0]]
            if profile in ("volatile-state", "real-service"):
                # The fabric manager restarts and forgets the attachment: drift.
                cycle.sim.restart()
                assert cycle.sim.holders(block) == []
                since = dt.datetime.now(dt.UTC)
                assert (await InventorySync(cycle.backend, db).sync_once()).ok
                watch = DriftWatch(journal, db, {"structured": reconciler.drift_target()})
                assert [d.kind for d in await watch.check(since)] == ["lost"]
                await eventually(
                    lambda: cycle.sim.holders(block) == [NODES[0]],
                    what="attached again after the restart",
                )
                await eventually(lambda: cycle.ready(device), what="ready again", timeout_s=5)
            claim = cycle.claim()
            claim["status"] = {}
            cycle.emu.update_status(claim)
            await eventually(lambda: cycle.sim.holders(block) == [], what="detached")
            await eventually(lambda: _released(journal, uid), what="released")
            # The servers keep what was theirs (their own compute blocks, on those profiles).
            for system, blocks in own_blocks.items():
                for own in blocks:
                    assert cycle.sim.holders(own) == [system]
        finally:
            await reconciler.stop()


async def _released(journal: Journal, uid: str) -> bool:
    return await journal.for_claim(uid) == []
