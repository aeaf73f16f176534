"""The structured scheduler stand-in with the real claim reconciler: the Kubernetes API
emulator (v1), the Redfish simulator, the inventory in a real database (SQLite and
PostgreSQL), and slices published with bindsToNode and binding conditions.

Each test checks the end state everywhere: claims, pods, the reservation journal and the
fabric's attachments and history."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import prometheus_client
import pytest
from builders import eventually

from app.claims.reconciler import ClaimReconciler, ClaimSettings
from app.db.engine import Database
from app.fabric.redfish.backend import RedfishBackend
from app.fabric.redfish.transport import RetrySettings
from app.inventory import InventorySync
from app.inventory.queries import pool_devices
from app.journal import ATTACHED, Journal
from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from app.kube.informer import InformerSettings
from app.kube.versions import ResourceApiVersion
from app.kube.workqueue import WorkQueueSettings
from app.metrics import ClaimMetrics
from app.pools import PoolConfig, desired_pools, resource_slice_spec
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator
from fabric_dra_sim.scheduler.common import POD_CLAIM_NAME_ANNOTATION
from fabric_dra_sim.scheduler.structured import (
    DELETE_PROTECTION,
    StructuredScheduler,
    StructuredSettings,
)

DRIVER = "fabric.example.com"
V1 = "resource.k8s.io/v1"
NODES = ["node-us-east-rack-01-1", "node-us-east-rack-01-2"]
RACK_LABELS = {"fabric-dra.io/region": "us-east", "fabric-dra.io/rack": "rack-01"}
FAST_INFORMER = InformerSettings(
    name="x", watch_timeout_s=30, backoff_initial_s=0.05, backoff_max_s=0.2
)
FAST_QUEUE = WorkQueueSettings(base_delay_s=0.02, max_delay_s=0.2)
eventually = partial(eventually, interval_s=0.02)
BINDING_GATES = {"DRADeviceBindingConditions": True}


@dataclass
class Env:
    db: Database
    sim: RedfishSimulator
    backend: RedfishBackend
    emu: KubeEmulator
    client: KubeClient
    blocks: dict[str, str]  # device name -> ResourceBlock URI
    journal: Journal

    # ---- objects
    def node(self, name: str, *, hostname: str | None = None) -> None:
        self.emu.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {"kubernetes.io/hostname": hostname or name, **RACK_LABELS},
                },
            }
        )

    def claim_spec(self, count: int = 1) -> dict[str, Any]:
        return {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu", "count": count}}
                ]
            }
        }

    def create_claim(self, name: str, count: int = 1) -> None:
        self.emu.create(
            {
                "apiVersion": V1,
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": self.claim_spec(count),
            }
        )

    def create_pod(
        self, name: str, *, claim: str | None = None, template: str | None = None
    ) -> None:
        source = {"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template}
        self.emu.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "containers": [{"name": "c", "image": "busybox"}],
                    "resourceClaims": [{"name": "gpu", **source}],
                },
            }
        )

    def claim(self, name: str) -> dict[str, Any]:
        found = self.emu.get(V1, "ResourceClaim", name, "default")
        assert found is not None, f"claim {name} is missing"
        return found

    def pod(self, name: str) -> dict[str, Any]:
        found = self.emu.get("v1", "Pod", name, "default")
        assert found is not None, f"pod {name} is missing"
        return found

    def node_of(self, pod: str) -> str | None:
        return (self.pod(pod).get("spec") or {}).get("nodeName")

    def devices_of(self, claim: str) -> list[str]:
        allocation = (self.claim(claim).get("status") or {}).get("allocation") or {}
        return [r["device"] for r in allocation.get("devices", {}).get("results", [])]

    def attached(self) -> dict[str, str]:
        """device name -> node, for every attached device."""
        by_block = {block: device for device, block in self.blocks.items()}
        return {by_block[b]: node for b, node in self.sim.attachments().items() if node}

    def events(self, reason: str) -> int:
        return sum(1 for e in self.emu.list("v1", "Event", "default") if e["reason"] == reason)

    def history(self) -> list[tuple[str, str, str]]:
        by_block = {block: device for device, block in self.blocks.items()}
        return [(op, by_block[block], node) for op, block, node in self.sim.history]

    async def held(self) -> dict[str, tuple[str, str, str | None]]:
        """device -> (claim name, state, node) of every active reservation."""
        return {r.device_name: (r.claim.name, r.state, r.node) for r in await self.journal.active()}

    # ---- parts
    def reconciler(self) -> ClaimReconciler:
        settings = ClaimSettings(
            driver_name=DRIVER,
            workers=4,
            orphan_grace_s=0.2,
            sweep_interval_s=0.1,
            informer=FAST_INFORMER,
            queue=FAST_QUEUE,
        )
        return ClaimReconciler(
            self.client,
            ResourceApiVersion.V1,
            self.db,
            self.backend,
            settings,
            metrics=ClaimMetrics.create(prometheus_client.CollectorRegistry()),
        )

    def scheduler(self, **changes: Any) -> StructuredScheduler:
        values: dict[str, Any] = {
            "poll_interval_s": 0.05,
            "retry_interval_s": 0.1,
            "binding_timeout_s": 60.0,
            "informer": FAST_INFORMER,
            "queue": FAST_QUEUE,
            **changes,
        }
        return StructuredScheduler(self.client, ResourceApiVersion.V1, StructuredSettings(**values))


@pytest.fixture
async def env(db: Database, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    devices = getattr(request, "param", 4)
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
    journal = Journal(db)
    present = await pool_devices(db)
    blocks = {d.name: (await journal.fabric_device_by_name(d.name)).attach_unit for d in present}
    # Binding conditions are alpha in 1.34: the gate is turned on, as a cluster using them does.
    emu = KubeEmulator(kubernetes_version="1.34", feature_gates=BINDING_GATES)
    emu_url = await emu.start()
    environment = Env(db, sim, backend, emu, None, blocks, journal)  # type: ignore[arg-type]
    for node in NODES:
        environment.node(node)
    emu.create(
        {
            "apiVersion": V1,
            "kind": "DeviceClass",
            "metadata": {"name": "fabric-gpu"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    # What the publisher writes: every device bindsToNode, with binding conditions.
    for pool in desired_pools(present, PoolConfig(driver_name=DRIVER)).values():
        for content in pool.slices:
            emu.create(
                {
                    "apiVersion": V1,
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"{content.index}-{pool.name.replace('/', '-')}"},
                    "spec": resource_slice_spec(DRIVER, pool, content, 1),
                }
            )
    environment.client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emu_url))
    yield environment
    await environment.client.close()
    await emu.stop()
    await backend.close()
    await sim.stop()


@contextlib.asynccontextmanager
async def running(env: Env, **changes: Any) -> AsyncIterator[StructuredScheduler]:
    reconciler = env.reconciler()
    scheduler = env.scheduler(**changes)
    await reconciler.start()
    await scheduler.start()
    try:
        yield scheduler
    finally:
        await scheduler.stop()
        await reconciler.stop()


async def assert_quiet(env: Env, seconds: float = 0.4, within_s: float = 20.0) -> None:
    """The writes settle: within ``within_s`` seconds a window of ``seconds`` passes with
    nothing written to the API server or the fabric. A write loop never settles; a last
    status write still on its way on a busy machine is waited for, not counted as a loop."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        writes, history = len(env.emu.writes()), len(env.sim.history)
        await asyncio.sleep(seconds)
        late = [(w.method, w.path) for w in env.emu.writes()[writes:]]
        if not late and env.sim.history[history:] == []:
            return
        assert asyncio.get_running_loop().time() < deadline, (
            f"still writing after {within_s} s: {late} {env.sim.history[history:]}"
        )


def condition(claim: dict[str, Any], device: str, type_: str) -> str | None:
    for entry in (claim.get("status") or {}).get("devices") or []:
        if entry["device"] == device:
            for c in entry["conditions"]:
                if c["type"] == type_:
                    return str(c["status"])
    return None


async def test_a_pod_goes_from_pending_to_allocated_attached_ready_and_bound(env: Env) -> None:
    first = sorted(env.blocks)[0]
    env.create_claim("c1")
    env.create_pod("p1", claim="c1")
    async with running(env) as scheduler:
        await eventually(lambda: scheduler.scheduled("p1") is not None, what="bound")
        await assert_quiet(env)
    assert scheduler.scheduled("p1") == NODES[0] == env.node_of("p1")
    claim = env.claim("c1")
    status = claim["status"]
    assert status["allocation"]["devices"]["results"] == [
        {
            "request": "gpu",
            "driver": DRIVER,
            "pool": "us-east/rack-01",
            "device": first,
            "bindingConditions": ["FabricDeviceReady"],
            "bindingFailureConditions": ["FabricDeviceFailed"],
        }
    ]
    assert status["allocation"]["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODES[0]]}]}
        ]
    }
    assert status["allocation"]["allocationTimestamp"].endswith("Z")
    assert status["reservedFor"] == [
        {"resource": "pods", "name": "p1", "uid": env.pod("p1")["metadata"]["uid"]}
    ]
    assert DELETE_PROTECTION in claim["metadata"]["finalizers"]
    assert condition(claim, first, "FabricDeviceReady") == "True"
    assert condition(claim, first, "FabricDeviceFailed") == "False"
    assert await env.held() == {first: ("c1", ATTACHED, NODES[0])}
    assert env.attached() == {first: NODES[0]}
    assert env.history() == [("attach", first, NODES[0])]
    assert env.events("Attached") == 1
    counters = scheduler.counters
    assert (counters.allocations, counters.binds, counters.failures) == (1, 1, 0)
    # A stand-in started on the settled cluster has nothing to do.
    again = env.scheduler()
    await again.start()
    try:
        await assert_quiet(env)
    finally:
        await again.stop()
    assert again.counters == type(again.counters)()
    # Order on the wire: finalizer, then one status write with the allocation, and the
    # binding only after the driver's status write made the condition True.
    writes = [
        (w.method, w.path.rsplit("/", 2)[-2:])
        for w in env.emu.writes()
        if "/c1" in w.path or "/p1" in w.path
    ]
    assert writes[0] == ("PUT", ["resourceclaims", "c1"])
    assert writes[1] == ("PUT", ["c1", "status"])
    assert writes[-1] == ("POST", ["p1", "binding"])
    # Between the two: the driver's status write (the condition), and nothing of ours.
    assert [w[1] for w in writes[2:-1]] == [["c1", "status"]]


@pytest.mark.parametrize("env", [3], indirect=True)
async def test_two_pods_competing_for_the_last_device_one_is_bound_one_waits(env: Env) -> None:
    devices = sorted(env.blocks)
    env.create_claim("big", count=2)
    env.create_pod("holder", claim="big")
    async with running(env) as scheduler:
        await eventually(lambda: scheduler.scheduled("holder") is not None, what="holder bound")
        env.create_claim("a")
        env.create_claim("b")
        env.create_pod("pa", claim="a")
        env.create_pod("pb", claim="b")
        await eventually(
            lambda: bool(scheduler.scheduled("pa") or scheduler.scheduled("pb")),
            what="one competitor bound",
        )
        await eventually(lambda: len(scheduler.unschedulable) == 1, what="one waits")
        await asyncio.sleep(0.5)  # the loser keeps trying and keeps failing
        winner, loser = ("pa", "pb") if scheduler.scheduled("pa") else ("pb", "pa")
        assert scheduler.scheduled(loser) is None
        assert "no node fits" in scheduler.unschedulable[("default", loser)]
    claims = {"pa": "a", "pb": "b"}
    assert env.node_of(winner) == NODES[0] and env.node_of(loser) is None
    assert env.devices_of("big") == devices[:2]
    assert env.devices_of(claims[winner]) == devices[2:]
    assert env.claim(claims[loser]).get("status") in (None, {})
    assert DELETE_PROTECTION not in (env.claim(claims[loser])["metadata"].get("finalizers") or [])
    assert await env.held() == {
        devices[0]: ("big", ATTACHED, NODES[0]),
        devices[1]: ("big", ATTACHED, NODES[0]),
        devices[2]: (claims[winner], ATTACHED, NODES[0]),
    }
    assert env.attached() == dict.fromkeys(devices, NODES[0])
    assert sorted(env.history()) == sorted(("attach", d, NODES[0]) for d in devices)
    assert scheduler.counters.binds == 2 and scheduler.counters.failures == 0


async def test_a_device_taken_behind_our_back_fails_the_bind_and_another_is_allocated(
    env: Env,
) -> None:
    taken, other = sorted(env.blocks)[:2]
    # Someone attached the first device to the other server directly on the fabric.
    await env.backend.attach(await env.journal.fabric_device_by_name(taken), NODES[1])
    env.create_claim("c1")
    env.create_pod("p1", claim="c1")
    async with running(env) as scheduler:
        await eventually(lambda: scheduler.scheduled("p1") is not None, what="bound")
        await assert_quiet(env)
    assert scheduler.counters.failures == 1
    assert scheduler.counters.allocations == 2 and scheduler.counters.binds == 1
    assert env.node_of("p1") == NODES[0]
    assert env.devices_of("c1") == [other]
    claim = env.claim("c1")
    assert condition(claim, other, "FabricDeviceReady") == "True"
    assert [e["device"] for e in claim["status"]["devices"]] == [other]
    assert await env.held() == {other: ("c1", ATTACHED, NODES[0])}
    assert env.attached() == {taken: NODES[1], other: NODES[0]}
    assert env.history() == [("attach", taken, NODES[1]), ("attach", other, NODES[0])]
    assert env.events("AttachFailed") == 1 and env.events("Attached") == 1


async def test_a_bind_that_times_out_is_given_back_and_the_pod_goes_elsewhere(env: Env) -> None:
    # This node sorts first, reaches the pool, but is no fabric host: nothing ever attaches.
    env.node("node-a-no-host", hostname="node-a-no-host")
    first, second = sorted(env.blocks)[:2]
    env.create_claim("c1")
    env.create_pod("p1", claim="c1")
    async with running(env, binding_timeout_s=2.0) as scheduler:
        await eventually(lambda: env.devices_of("c1") == [first], what="first allocation")
        assert env.claim("c1")["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0][
            "matchFields"
        ][0]["values"] == ["node-a-no-host"]
        # Cordon it now: the pod waits in PreBind regardless, then must go elsewhere.
        node = env.emu.get("v1", "Node", "node-a-no-host")
        assert node is not None
        node["spec"] = {"unschedulable": True}
        env.emu.update(node)
        await eventually(lambda: scheduler.counters.failures == 1, what="binding timeout")
        await eventually(lambda: scheduler.scheduled("p1") is not None, what="bound")
        await assert_quiet(env)
    assert env.node_of("p1") == NODES[0]
    # The timed-out device is avoided for a while, so another one was taken.
    assert env.devices_of("c1") == [second]
    assert scheduler.counters.allocations == 2 and scheduler.counters.binds == 1
    assert await env.held() == {second: ("c1", ATTACHED, NODES[0])}
    assert env.attached() == {second: NODES[0]}
    assert env.history() == [("attach", second, NODES[0])]


async def test_a_deleted_pod_frees_its_claim_and_the_device_is_detached(env: Env) -> None:
    first = sorted(env.blocks)[0]
    env.create_claim("c1")
    env.create_pod("p1", claim="c1")
    async with running(env) as scheduler:
        await eventually(lambda: scheduler.scheduled("p1") is not None, what="bound")
        env.emu.delete("v1", "Pod", "p1", "default")
        await eventually(lambda: env.events("Detached") == 1, what="detached")
        await eventually(
            lambda: not env.claim("c1")["metadata"].get("finalizers"), what="finalizer removed"
        )
        await assert_quiet(env)
    claim = env.claim("c1")
    assert claim.get("status") in (None, {})
    assert scheduler.claim_controller is not None
    assert scheduler.claim_controller.counters.deallocations == 1
    assert await env.held() == {}
    assert env.history() == [("attach", first, NODES[0]), ("detach", first, NODES[0])]


async def test_template_claims_are_made_for_the_pod_and_deleted_with_it(env: Env) -> None:
    first, second = sorted(env.blocks)[:2]
    env.emu.create(
        {
            "apiVersion": V1,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": "default"},
            "spec": {"metadata": {"labels": {"app": "train"}}, "spec": env.claim_spec()},
        }
    )
    env.create_pod("p1", template="one-gpu")
    env.create_pod("p2", template="one-gpu")
    async with running(env) as scheduler:
        await eventually(
            lambda: bool(scheduler.scheduled("p1") and scheduler.scheduled("p2")), what="both bound"
        )
        claims = {c["metadata"]["name"]: c for c in env.emu.list(V1, "ResourceClaim", "default")}
        assert len(claims) == 2
        for pod_name in ("p1", "p2"):
            pod = env.pod(pod_name)
            (entry,) = pod["status"]["resourceClaimStatuses"]
            assert entry["name"] == "gpu"
            claim = claims[entry["resourceClaimName"]]
            assert claim["metadata"]["name"].startswith(f"{pod_name}-gpu-")
            assert claim["metadata"]["labels"] == {"app": "train"}
            assert claim["metadata"]["annotations"][POD_CLAIM_NAME_ANNOTATION] == "gpu"
            assert claim["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": pod["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
            assert claim["status"]["reservedFor"][0]["name"] == pod_name
        p1_claim = env.pod("p1")["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        p1_device = env.devices_of(p1_claim)[0]
        # p2 finishes, p1 is deleted: both claims go away, both devices come back.
        p2 = env.pod("p2")
        p2["status"]["phase"] = "Succeeded"
        env.emu.update_status(p2)
        env.emu.delete("v1", "Pod", "p1", "default")
        await eventually(
            lambda: env.emu.list(V1, "ResourceClaim", "default") == [],
            what="template claims deleted",
        )
        await eventually(lambda: env.events("Detached") == 2, what="detached")
        await assert_quiet(env)
    assert env.attached() == {}
    assert scheduler.claim_controller is not None
    assert scheduler.counters.allocations == 2
    assert scheduler.claim_controller.counters.deallocations == 2
    assert scheduler.claim_controller.counters.created == 2
    assert scheduler.claim_controller.counters.deleted == 2
    assert {first, second} == {d for _, d, _ in env.history()}
    assert sorted(env.history()) == sorted(
        [
            ("attach", first, NODES[0]),
            ("attach", second, NODES[0]),
            ("detach", first, NODES[0]),
            ("detach", second, NODES[0]),
        ]
    )
    assert p1_device in (first, second)
    assert await env.held() == {}
    assert env.node_of("p2") == NODES[0]


async def test_conflicts_and_server_errors_on_each_write_are_retried(env: Env) -> None:
    first = sorted(env.blocks)[0]
    env.create_claim("c1")
    env.create_pod("p1", claim="c1")
    env.emu.fail_next(1, method="PUT", path_regex=r"/resourceclaims/c1$", status=409)
    env.emu.fail_next(1, method="PUT", path_regex=r"/resourceclaims/c1/status$", status=409)
    env.emu.fail_next(1, method="PUT", path_regex=r"/resourceclaims/c1/status$", status=500)
    env.emu.fail_next(1, method="POST", path_regex=r"/pods/p1/binding$", status=500)
    async with running(env) as scheduler:
        await eventually(lambda: scheduler.scheduled("p1") is not None, what="bound")
        await assert_quiet(env)
    failed = [(w.method, w.path, w.status) for w in env.emu.writes() if w.status >= 400]
    assert [s for _, _, s in failed] == [409, 409, 500, 500]
    assert env.node_of("p1") == NODES[0]
    claim = env.claim("c1")
    assert env.devices_of("c1") == [first]
    assert claim["metadata"]["finalizers"] == [DELETE_PROTECTION]
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["p1"]
    assert scheduler.counters.allocations == 1 and scheduler.counters.failures == 0
    assert await env.held() == {first: ("c1", ATTACHED, NODES[0])}
    assert env.history() == [("attach", first, NODES[0])]


async def test_a_missing_claim_waits_and_a_claim_that_cannot_be_met_does_not_stop_others(
    env: Env,
) -> None:
    first, second = sorted(env.blocks)[:2]
    env.emu.create(
        {
            "apiVersion": V1,
            "kind": "ResourceClaim",
            "metadata": {"name": "bad", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "no-such-class"}}]
                }
            },
        }
    )
    env.create_pod("p-bad", claim="bad")
    env.create_pod("p-later", claim="later")
    env.create_claim("ok")
    env.create_pod("p-ok", claim="ok")
    async with running(env) as scheduler:
        await eventually(lambda: scheduler.scheduled("p-ok") is not None, what="p-ok bound")
        await eventually(lambda: len(scheduler.unschedulable) == 2, what="two waiting")
        assert scheduler.unschedulable[("default", "p-later")] == (
            "waiting for ResourceClaim default/later"
        )
        assert "no-such-class" in scheduler.unschedulable[("default", "p-bad")]
        env.create_claim("later")
        await eventually(lambda: scheduler.scheduled("p-later") is not None, what="p-later bound")
        await assert_quiet(env)
    assert env.node_of("p-bad") is None
    assert env.claim("bad").get("status") in (None, {})
    assert not env.claim("bad")["metadata"].get("finalizers")
    assert list(scheduler.unschedulable) == [("default", "p-bad")]
    assert await env.held() == {
        first: ("ok", ATTACHED, NODES[0]),
        second: ("later", ATTACHED, NODES[0]),
    }
    assert env.attached() == {first: NODES[0], second: NODES[0]}


async def test_the_command_schedules_until_interrupted() -> None:
    emu = KubeEmulator(served_resource_versions=("v1",))
    url = await emu.start()
    try:
        emu.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        emu.create(
            {
                "apiVersion": V1,
                "kind": "DeviceClass",
                "metadata": {"name": "fabric-gpu"},
                "spec": {},
            }
        )
        emu.create(
            {
                "apiVersion": V1,
                "kind": "ResourceSlice",
                "metadata": {"name": "s0"},
                "spec": {
                    "driver": DRIVER,
                    "allNodes": True,
                    "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
                    "devices": [{"name": "d0"}],
                },
            }
        )
        emu.create(
            {
                "apiVersion": V1,
                "kind": "ResourceClaim",
                "metadata": {"name": "c1", "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]
                    }
                },
            }
        )
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p1", "namespace": "default"},
                "spec": {
                    "containers": [{"name": "c", "image": "busybox"}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
                },
            }
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app",
            "sim",
            "scheduler",
            "--kube-url",
            url,
            "--poll-interval",
            "0.05",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await eventually(
                lambda: bool(
                    (emu.get("v1", "Pod", "p1", "default") or {}).get("spec", {}).get("nodeName")
                ),
                timeout_s=30,
                what="bound by the command",
            )
        finally:
            process.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0, err.decode()
        assert "resource.k8s.io/v1" in out.decode()
        claim = emu.get(V1, "ResourceClaim", "c1", "default")
        assert claim is not None
        assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["d0"]
    finally:
        await emu.stop()


@pytest.mark.parametrize(
    ("version", "gates", "copied"),
    [
        ("1.36", None, True),
        ("1.35", "all", True),
        ("1.34", "all", False),
        ("1.34", None, False),
    ],
)
async def test_a_tolerating_claim_gets_a_tainted_device_and_its_tolerations_in_the_results(
    version: str,
    gates: str | None,
    copied: bool,
) -> None:
    # 1.36: DRADeviceTaints is on by default, the results keep the request's tolerations (what
    # device taint eviction reads); so does 1.35 with the gate on. The 1.34 scheduler never
    # copied them, gate on or off; with the gate off the server drops taints and tolerations.
    toleration = {
        "key": f"{DRIVER}/unhealthy",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 60,
    }
    emu = KubeEmulator(
        kubernetes_version=version, feature_gates=all_gates_on(version) if gates else None
    )
    url = await emu.start()
    client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=url))
    try:
        emu.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        emu.create(
            {
                "apiVersion": V1,
                "kind": "DeviceClass",
                "metadata": {"name": "fabric-gpu"},
                "spec": {},
            }
        )
        emu.create(
            {
                "apiVersion": V1,
                "kind": "ResourceSlice",
                "metadata": {"name": "s0"},
                "spec": {
                    "driver": DRIVER,
                    "allNodes": True,
                    "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
                    "devices": [
                        {
                            "name": "d0",
                            "taints": [{"key": f"{DRIVER}/unhealthy", "effect": "NoExecute"}],
                        }
                    ],
                },
            }
        )
        emu.create(
            {
                "apiVersion": V1,
                "kind": "ResourceClaim",
                "metadata": {"name": "c1", "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": "fabric-gpu",
                                    "tolerations": [toleration],
                                },
                            }
                        ]
                    }
                },
            }
        )
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p1", "namespace": "default"},
                "spec": {
                    "containers": [{"name": "c", "image": "busybox"}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
                },
            }
        )
        scheduler = StructuredScheduler(
            client,
            ResourceApiVersion.V1,
            StructuredSettings(
                poll_interval_s=0.05, retry_interval_s=0.1, informer=FAST_INFORMER, queue=FAST_QUEUE
            ),
        )
        await scheduler.start()
        try:
            await eventually(
                lambda: scheduler.scheduled("p1") is not None, timeout_s=30, what="bound"
            )
        finally:
            await scheduler.stop()
        claim = emu.get(V1, "ResourceClaim", "c1", "default")
        assert claim is not None
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "d0"
        assert scheduler.kubernetes_minor == int(version.split(".")[1])
        if copied:
            assert result["tolerations"] == [toleration]
        else:
            assert "tolerations" not in result
        if version == "1.34" and gates is None:
            assert "tolerations" not in claim["spec"]["devices"]["requests"][0]["exactly"]
    finally:
        await client.close()
        await emu.stop()
