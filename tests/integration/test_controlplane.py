"""The control-plane (classic DRA) controller against the Kubernetes API emulator serving only
resource.k8s.io/v1alpha3, the Redfish simulator, a real database (SQLite and PostgreSQL) and
the classic scheduler stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from builders import eventually
from sqlalchemy import select, update

from app.claims.model import REPAIR_RETRY_S
from app.clock import utcnow
from app.controlplane import ControlPlaneController, ControlPlaneSettings
from app.controlplane import plan as cp
from app.controlplane import snapshot as snapshot_module
from app.db.engine import Database
from app.db.models import Device
from app.fabric.redfish.backend import RedfishBackend
from app.fabric.redfish.transport import RetrySettings
from app.inventory import InventorySync
from app.inventory.queries import pool_devices
from app.journal import ATTACHED, FAILED, ClaimRef, DeviceHeld, Journal
from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from app.kube.informer import InformerSettings
from app.kube.versions import ResourceApiVersion, slice_to_wire
from app.kube.workqueue import WorkQueueSettings
from app.modes import ModeError, Modes, discover_modes
from app.pools import PoolConfig, desired_pools, resource_slice_spec
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator
from fabric_dra_sim.scheduler.classic import ClassicScheduler, ClassicSchedulerSettings

DRIVER = "fabric.example.com"
FINALIZER = f"{DRIVER}/deletion-protection"
RESOURCE = "resource.k8s.io/v1alpha3"
NODES = ["node-us-east-rack-01-1", "node-us-east-rack-01-2"]
NO_HOST = "node-without-fabric-host"
LABELS = {"topology.kubernetes.io/region": "us-east", "fabric-dra.io/rack": "rack-01"}
FAST = InformerSettings(name="x", watch_timeout_s=30, backoff_initial_s=0.05, backoff_max_s=0.2)


@dataclass
class Harness:
    db: Database
    sim: RedfishSimulator
    backend: RedfishBackend
    emu: KubeEmulator
    client: KubeClient
    devices: dict[str, Device]
    generation: int = 0
    slice_names: list[str] = field(default_factory=list)

    def controller(self, **changes: Any) -> ControlPlaneController:
        settings = ControlPlaneSettings(
            driver_name=DRIVER,
            workers=4,
            resync_interval_s=0.5,
            hosts_refresh_s=0.2,
            informer=FAST,
            queue=WorkQueueSettings(base_delay_s=0.02, max_delay_s=0.2),
        )
        return ControlPlaneController(self.client, self.db, self.backend, settings, **changes)

    def scheduler(self) -> ClassicScheduler:
        return ClassicScheduler(
            self.client,
            ClassicSchedulerSettings(
                answer_timeout_s=5, allocation_timeout_s=3, retry_interval_s=0.1, informer=FAST
            ),
        )

    async def publish(self) -> None:
        """(Re)publish the inventory as v1alpha3 slices at a new pool generation."""
        for name in self.slice_names:
            self.emu.delete(RESOURCE, "ResourceSlice", name)
        self.slice_names.clear()
        config = PoolConfig(
            DRIVER,
            binds_to_node=False,
            node_labels={"region": "topology.kubernetes.io/region", "rack": "fabric-dra.io/rack"},
        )
        for pool in desired_pools(await pool_devices(self.db), config).values():
            for content in pool.slices:
                name = f"{pool.name.replace('/', '-')}-{content.index}-g{self.generation}"
                body = {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": name},
                    "spec": resource_slice_spec(DRIVER, pool, content, self.generation),
                }
                self.emu.create(slice_to_wire(body, ResourceApiVersion.V1ALPHA3))
                self.slice_names.append(name)
        self.generation += 1

    def uuid_of(self, device: str) -> str:
        return str(self.devices[device].uuid)

    def block_of(self, device: str) -> str:
        return self.devices[device].attach_unit

    def create_claim(self, name: str, *, device: str | None = None) -> dict[str, Any]:
        request: dict[str, Any] = {"name": "dev", "deviceClassName": "fabric"}
        if device is not None:
            request["selectors"] = [
                {
                    "cel": {
                        "expression": f'device.attributes["{DRIVER}"].uuid '
                        f'== "{self.uuid_of(device)}"'
                    }
                }
            ]
        return self.emu.create(
            {
                "apiVersion": RESOURCE,
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"controller": DRIVER, "devices": {"requests": [request]}},
            }
        )

    def create_pod(self, name: str, claim: str) -> dict[str, Any]:
        return self.emu.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "containers": [{"name": "c", "image": "busybox"}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                },
            }
        )

    def create_context(self, pod: dict[str, Any], potential: list[str]) -> dict[str, Any]:
        meta = pod["metadata"]
        return self.emu.create(
            {
                "apiVersion": RESOURCE,
                "kind": "PodSchedulingContext",
                "metadata": {
                    "name": meta["name"],
                    "namespace": "default",
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": {"potentialNodes": potential},
            }
        )

    def claim(self, name: str) -> dict[str, Any] | None:
        return self.emu.get(RESOURCE, "ResourceClaim", name, "default")

    def context(self, name: str) -> dict[str, Any] | None:
        return self.emu.get(RESOURCE, "PodSchedulingContext", name, "default")

    def pod(self, name: str) -> dict[str, Any] | None:
        return self.emu.get("v1", "Pod", name, "default")

    def answers(self, pod: str) -> dict[str, list[str]] | None:
        context = self.context(pod)
        entries = ((context or {}).get("status") or {}).get("resourceClaims")
        if entries is None:
            return None
        return {e["name"]: list(e.get("unsuitableNodes") or []) for e in entries}

    def allocated_device(self, claim: str) -> str | None:
        status = (self.claim(claim) or {}).get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        return str(results[0]["device"]) if results else None

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.emu.list("v1", "Event", "default") if e.get("reason") == reason]

    def attaches(self, device: str) -> list[tuple[str, str, str]]:
        return [h for h in self.sim.history if h[1] == self.block_of(device)]


@pytest.fixture
async def harness(db: Database) -> AsyncIterator[Harness]:
    sim = RedfishSimulator(
        spec=InventorySpec(regions=1, racks_per_region=1, devices_per_rack=4, hosts_per_rack=2),
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
    emu = KubeEmulator(served_resource_versions=("v1alpha3",), git_version="v1.31.0")
    emu_url = await emu.start()
    for node in [*NODES, NO_HOST]:
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node, "labels": {**LABELS, "kubernetes.io/hostname": node}},
            }
        )
    emu.create(
        {
            "apiVersion": RESOURCE,
            "kind": "DeviceClass",
            "metadata": {"name": "fabric"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emu_url))
    harness = Harness(db, sim, backend, emu, client, rows)
    await harness.publish()
    yield harness
    await client.close()
    await emu.stop()
    await backend.close()
    await sim.stop()


@contextlib.asynccontextmanager
async def running(*parts: ControlPlaneController | ClassicScheduler) -> AsyncIterator[None]:
    started: list[ControlPlaneController | ClassicScheduler] = []
    try:
        for part in parts:
            await part.start()
            started.append(part)
        yield
    finally:
        for part in reversed(started):
            await part.stop()


async def test_full_protocol_cycle_answers_allocates_attaches_and_binds(
    harness: Harness,
) -> None:
    harness.create_claim("c1")
    pod = harness.create_pod("p1", "c1")
    controller = harness.controller()
    async with running(controller):
        harness.create_context(pod, [*NODES, NO_HOST])
        await eventually(
            lambda: harness.answers("p1") == {"gpu": [NO_HOST]}, what="unsuitableNodes answered"
        )

        # Nothing changed: answering again (a pass run here to its end) writes nothing.
        writes = len(harness.emu.writes())
        await controller.sync_context("default", "p1")
        assert len(harness.emu.writes()) == writes

        context = harness.context("p1")
        assert context is not None
        context["spec"]["selectedNode"] = NODES[1]
        harness.emu.update(context)
        await eventually(lambda: harness.allocated_device("c1") is not None, what="allocation")
        claim = harness.claim("c1")
        assert claim is not None
        assert FINALIZER in claim["metadata"]["finalizers"]
        allocation = claim["status"]["allocation"]
        assert allocation["controller"] == DRIVER
        (result,) = allocation["devices"]["results"]
        assert result["request"] == "dev" and result["driver"] == DRIVER
        assert result["pool"] == "us-east/rack-01"
        assert claim["status"]["reservedFor"] == [
            {"resource": "pods", "name": "p1", "uid": pod["metadata"]["uid"]}
        ]
        device = result["device"]
        await eventually(
            lambda: harness.sim.attachments()[harness.block_of(device)] == NODES[1],
            what="device attached to the selected node",
        )
        await eventually(lambda: len(harness.events("Attached")) == 1, what="Attached event")
        (held,) = await Journal(harness.db).for_claim(claim["metadata"]["uid"])
        assert (held.mode, held.node, held.host_id) == ("control-plane", NODES[1], NODES[1])
        await eventually(lambda: _state_is(harness, claim["metadata"]["uid"], ATTACHED))

        # The claim once more (passes run here to their end): nothing is written to the API
        # server or the fabric.
        writes, history = len(harness.emu.writes()), len(harness.sim.history)
        await controller.sync_claim(claim["metadata"]["uid"])
        await controller.sync_context("default", "p1")
        assert len(harness.emu.writes()) == writes and len(harness.sim.history) == history

        async with running(harness.scheduler()):
            await eventually(
                lambda: (harness.pod("p1") or {})["spec"].get("nodeName") == NODES[1],
                what="pod bound",
            )
            await eventually(lambda: harness.context("p1") is None, what="context deleted")
    assert harness.attaches(device) == [("attach", harness.block_of(device), NODES[1])]


async def _state_is(harness: Harness, uid: str, state: str) -> bool:
    held = await Journal(harness.db).for_claim(uid)
    return bool(held) and held[0].state == state


async def test_two_pods_compete_for_the_last_device_one_binds_one_stays_pending(
    harness: Harness,
) -> None:
    device = sorted(harness.devices)[0]
    harness.create_claim("a", device=device)
    harness.create_claim("b", device=device)
    harness.create_pod("pa", "a")
    harness.create_pod("pb", "b")
    scheduler = harness.scheduler()
    async with running(harness.controller(), scheduler):
        await eventually(lambda: len(scheduler.bound) == 1, what="one pod bound")
        winner = next(iter(scheduler.bound)).split("/")[1]
        loser = "pb" if winner == "pa" else "pa"
        await eventually(
            lambda: harness.answers(loser) == {"gpu": sorted([*NODES, NO_HOST])},
            what="every node unsuitable for the other pod",
        )
        await asyncio.sleep(0.5)
        assert not (harness.pod(loser) or {})["spec"].get("nodeName")
        assert harness.allocated_device("b" if loser == "pb" else "a") is None
        assert "unsuitable" in scheduler.unschedulable[f"default/{loser}"]
        await eventually(
            lambda: harness.sim.attachments()[harness.block_of(device)] in NODES, what="attached"
        )
    assert len([h for h in harness.attaches(device) if h[0] == "attach"]) == 1


async def test_inventory_change_refreshes_the_answers_of_an_open_context(
    harness: Harness,
) -> None:
    device = sorted(harness.devices)[1]
    harness.create_claim("c1", device=device)
    pod = harness.create_pod("p1", "c1")
    async with running(harness.controller()):
        harness.create_context(pod, NODES)
        await eventually(lambda: harness.answers("p1") == {"gpu": []}, what="first answer")
        harness.sim.remove_block(harness.block_of(device))
        await InventorySync(harness.backend, harness.db).sync_once()
        await harness.publish()
        await eventually(
            lambda: harness.answers("p1") == {"gpu": NODES},
            what="answer refreshed after the device left",
        )


async def _bound_cycle(harness: Harness, scheduler: ClassicScheduler) -> tuple[str, str]:
    harness.create_claim("c1")
    harness.create_pod("p1", "c1")
    await eventually(lambda: "default/p1" in scheduler.bound, what="pod bound")
    device = harness.allocated_device("c1")
    assert device is not None
    node = scheduler.bound["default/p1"]
    await eventually(
        lambda: harness.sim.attachments()[harness.block_of(device)] == node, what="attached"
    )
    return device, node


async def test_deallocation_requested_after_the_pod_is_gone(harness: Harness) -> None:
    scheduler = harness.scheduler()
    async with running(harness.controller(), scheduler):
        device, node = await _bound_cycle(harness, scheduler)
        harness.emu.delete("v1", "Pod", "p1", "default")
        await eventually(
            lambda: harness.sim.attachments()[harness.block_of(device)] is None, what="detached"
        )
        await eventually(
            lambda: (
                "allocation" not in (harness.claim("c1") or {})["status"]
                and FINALIZER not in (harness.claim("c1") or {})["metadata"].get("finalizers", [])
            ),
            what="allocation and finalizer cleared",
        )
        status = (harness.claim("c1") or {})["status"]
        assert "deallocationRequested" not in status and "reservedFor" not in status
        uid = (harness.claim("c1") or {})["metadata"]["uid"]
        assert await Journal(harness.db).for_claim(uid) == []
    assert harness.attaches(device) == [
        ("attach", harness.block_of(device), node),
        ("detach", harness.block_of(device), node),
    ]


async def test_deleted_claim_is_detached_then_its_finalizer_removed(harness: Harness) -> None:
    scheduler = harness.scheduler()
    async with running(harness.controller(), scheduler):
        device, node = await _bound_cycle(harness, scheduler)
        harness.emu.delete(RESOURCE, "ResourceClaim", "c1", "default")
        assert (harness.claim("c1") or {})["metadata"]["deletionTimestamp"]
        await asyncio.sleep(0.3)
        # Still in use by the pod: nothing is detached yet.
        assert harness.sim.attachments()[harness.block_of(device)] == node
        harness.emu.delete("v1", "Pod", "p1", "default")
        await eventually(lambda: harness.claim("c1") is None, what="claim gone")
    assert harness.sim.attachments()[harness.block_of(device)] is None
    assert harness.attaches(device)[-1] == ("detach", harness.block_of(device), node)
    assert await Journal(harness.db).active() == []


async def test_a_failed_attach_is_journalled_and_reported_with_a_warning(
    harness: Harness,
) -> None:
    device = sorted(harness.devices)[2]
    # Someone attached the block to the other server behind our back.
    await harness.backend.attach(await Journal(harness.db).fabric_device_by_name(device), NODES[1])
    harness.create_claim("c1", device=device)
    pod = harness.create_pod("p1", "c1")
    republished: list[bool] = []
    controller = harness.controller(on_failed_device=lambda: republished.append(True))
    async with running(controller):
        context = harness.create_context(pod, NODES)
        context["spec"]["selectedNode"] = NODES[0]
        harness.emu.update(context)
        await eventually(lambda: len(harness.events("AttachFailed")) == 1, what="AttachFailed")
        assert republished == [True]  # the failed device is withheld at the next publish
        assert harness.events("AttachFailed")[0]["type"] == "Warning"
        uid = (harness.claim("c1") or {})["metadata"]["uid"]
        (held,) = await Journal(harness.db).for_claim(uid)
        assert held.state == FAILED
        assert (held.last_error or "").startswith(f"attach {device} to host {NODES[0]}: ")
    assert harness.sim.attachments()[harness.block_of(device)] == NODES[1]


class Killed(BaseException):
    """Stands for SIGKILL: escapes every handler, nothing is cleaned up."""


@pytest.mark.parametrize("step", ["after-reserve", "after-intent"])
async def test_restart_in_the_middle_of_an_allocation_converges_without_double_attach(
    harness: Harness,
    step: str,
) -> None:
    killed = asyncio.Event()

    async def crash_once(at: str) -> None:
        if at == step and not killed.is_set():
            killed.set()
            raise Killed(at)

    harness.create_claim("c1")
    pod = harness.create_pod("p1", "c1")
    first = harness.controller(checkpoint=crash_once)
    await first.start()
    try:
        harness.create_context(pod, NODES)
        await eventually(lambda: harness.answers("p1") is not None, what="answer")
        context = harness.context("p1")
        assert context is not None
        context["spec"]["selectedNode"] = NODES[0]
        harness.emu.update(context)
        await eventually(killed.is_set, what=f"the crash at {step}")
    finally:
        await first.stop()

    scheduler = harness.scheduler()
    second = harness.controller()
    async with running(second, scheduler):
        try:
            await eventually(
                lambda: (harness.pod("p1") or {})["spec"].get("nodeName") in NODES,
                what="pod bound after the restart",
            )
        except AssertionError as err:
            raise AssertionError(
                f"{err}: scheduler {scheduler.unschedulable}, controller "
                f"{second.status()}, claim {harness.claim('c1')}, context "
                f"{harness.context('p1')}"
            ) from None
        device = harness.allocated_device("c1")
        assert device is not None
        node = (harness.pod("p1") or {})["spec"]["nodeName"]
        uid = (harness.claim("c1") or {})["metadata"]["uid"]
        await eventually(lambda: _state_is(harness, uid, ATTACHED), what="attached")
    attaches = [h for h in harness.sim.history if h[0] == "attach"]
    assert attaches == [("attach", harness.block_of(device), node)]
    active = await Journal(harness.db).active()
    assert [(r.claim.name, r.device_name, r.state) for r in active] == [("c1", device, ATTACHED)]


# Clusters that exist: 1.31 serves v1alpha3 (with PodSchedulingContexts), 1.34 serves v1 (and
# the betas, each of which can be the only one served) and never PodSchedulingContexts.
@pytest.mark.parametrize(
    ("kubernetes", "served", "expected"),
    [
        ("1.31", ("v1alpha3",), Modes(None, True)),
        ("1.34", ("v1", "v1beta2", "v1beta1"), Modes(ResourceApiVersion.V1, False)),
        ("1.34", ("v1beta1",), Modes(ResourceApiVersion.V1BETA1, False)),
    ],
)
async def test_auto_mode_comes_from_discovery(
    kubernetes: str, served: tuple[str, ...], expected: Modes
) -> None:
    emu = KubeEmulator(kubernetes_version=kubernetes, served_resource_versions=served)
    url = await emu.start()
    try:
        async with await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=url)) as client:
            assert await discover_modes(client.api, "auto") == expected
            if not expected.control_plane:
                with pytest.raises(ModeError, match="v1alpha3"):
                    await discover_modes(client.api, "control-plane")
    finally:
        await emu.stop()


async def test_written_answers_and_finalizers_are_not_worked_on_again(harness: Harness) -> None:
    harness.create_claim("c1")
    pod = harness.create_pod("p1", "c1")
    controller = harness.controller()
    # No periodic resync during the test: it looks at everything again on purpose.
    controller.settings = dataclasses.replace(controller.settings, resync_interval_s=60)
    passes: list[tuple[str, ...]] = []
    sync_context, sync_claim = controller.sync_context, controller.sync_claim

    finished: list[tuple[str, ...]] = []

    async def counted_context(namespace: str, name: str) -> bool:
        passes.append(("context", name))
        try:
            return await sync_context(namespace, name)
        finally:
            finished.append(("context", name))

    async def counted_claim(uid: str) -> bool:
        passes.append(("claim", uid))
        return await sync_claim(uid)

    controller.sync_context = counted_context  # type: ignore[method-assign]
    controller.sync_claim = counted_claim  # type: ignore[method-assign]
    async with running(controller):
        harness.create_context(pod, [*NODES, NO_HOST])
        await eventually(
            lambda: harness.answers("p1") == {"gpu": [NO_HOST]}, what="unsuitableNodes answered"
        )
        # Our own answer came back (a status-only change we wrote): no pass for it.
        answered = passes.count(("context", "p1"))
        await asyncio.sleep(0.3)
        assert passes.count(("context", "p1")) == answered
        seen = len(passes)
        # A finalizer someone else adds changes nothing a claim pass acts on.
        claim = harness.claim("c1")
        assert claim is not None
        claim["metadata"]["finalizers"] = ["example.com/keep"]
        harness.emu.update(claim)
        await asyncio.sleep(0.3)
        assert passes[seen:] == []
        # Someone else's change to the status gets a look (ours might have been overwritten),
        # which here writes nothing.
        writes = len(harness.emu.writes())
        context = harness.context("p1")
        assert context is not None
        context["status"]["resourceClaims"].append({"name": "other", "unsuitableNodes": []})
        done = len(finished)
        harness.emu.update_status(context)
        await eventually(lambda: ("context", "p1") in passes[seen:], what="looked at")
        await eventually(lambda: ("context", "p1") in finished[done:], what="the look ended")
        assert len(harness.emu.writes()) == writes  # nothing written by us
        seen = len(passes)
        # A new question (the scheduler changed the spec) is answered.
        context = harness.context("p1")
        assert context is not None
        context["spec"]["potentialNodes"] = NODES
        harness.emu.update(context)
        await eventually(lambda: ("context", "p1") in passes[seen:], what="answered again")


@pytest.mark.parametrize("echo_first", [False, True])
async def test_the_echo_of_our_allocation_write_queues_no_second_claim_pass(
    harness: Harness, echo_first: bool
) -> None:
    # The allocation's write queues the claim pass at once; the informer's delivery of that
    # same write (one resourceVersion) adds nothing, also when it comes before the write's
    # answer. Someone else's write still gets a look.
    harness.create_claim("c1")
    pod = harness.create_pod("p1", "c1")
    controller = harness.controller()
    controller.settings = dataclasses.replace(controller.settings, resync_interval_s=60)
    passes: list[str] = []
    sync_claim = controller.sync_claim

    async def counted_claim(uid: str) -> bool:
        passes.append(uid)
        return await sync_claim(uid)

    controller.sync_claim = counted_claim  # type: ignore[method-assign]
    async with running(controller):
        harness.create_context(pod, NODES)
        await eventually(lambda: harness.answers("p1") is not None, what="answered")
        uid = str(harness.claim("c1")["metadata"]["uid"])  # type: ignore[index]
        seen = len(passes)  # the start looks at every claim once
        hold = harness.emu.hold_response(method="PUT", path_regex="/resourceclaims/c1/status$")
        if not echo_first:
            hold.release()
        _select(harness, "p1", NODES[0])
        if echo_first:
            await hold.reached.wait()
            await eventually(
                lambda: (
                    controller.claims.get("c1", "default") is not None
                    and cp.allocation_of(controller.claims.get("c1", "default") or {}) is not None
                ),
                what="the echo delivered before the answer",
            )
            hold.release()
        await eventually(lambda: _state_is(harness, uid, ATTACHED), what="attached")
        written_rv = harness.claim("c1")["metadata"]["resourceVersion"]  # type: ignore[index]
        await asyncio.sleep(0.3)
        assert passes[seen:] == [uid]
        assert harness.claim("c1")["metadata"]["resourceVersion"] == written_rv  # type: ignore[index]
        # Another client's status write (a new resourceVersion) is looked at.
        claim = harness.claim("c1")
        assert claim is not None
        claim["status"]["reservedFor"] = []
        harness.emu.update_status(claim)
        await eventually(lambda: len(passes) == seen + 2, what="the other write looked at")


async def test_a_bound_or_going_pod_or_a_pod_condition_queues_no_context_pass(
    harness: Harness,
) -> None:
    # Its context pass would do nothing (SchedulingPass.sync returns at once for them).
    harness.create_claim("c1")
    pod = harness.create_pod("p1", "c1")
    controller = harness.controller()
    added: list[Any] = []
    controller.queue.add = added.append  # type: ignore[method-assign]
    async with running(controller):
        harness.create_context(pod, NODES)
        await eventually(lambda: controller.contexts.get("p1", "default") is not None)
        added.clear()
        waiting = controller.pods.get("p1", "default")
        assert waiting is not None
        assert "containers" not in waiting["spec"]  # the informer keeps what is read
        await controller._on_pod("ADDED", waiting, None)
        assert added == [("context", "default", "p1")]
        # A status condition (the scheduler's PodScheduled=False) changes nothing read.
        added.clear()
        conditioned = harness.pod("p1")
        assert conditioned is not None
        conditioned["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
        conditioned["metadata"]["resourceVersion"] = "999999"
        await controller._on_pod("MODIFIED", cp.pod_view(conditioned), waiting)
        assert added == []
        # A claim generated for the pod (resourceClaimStatuses) is read: the pass runs.
        generated = copy.deepcopy(waiting)
        generated.setdefault("status", {})["resourceClaimStatuses"] = [
            {"name": "dev", "resourceClaimName": "p1-dev-x"}
        ]
        await controller._on_pod("MODIFIED", generated, waiting)
        assert added == [("context", "default", "p1")]
        bound = copy.deepcopy(waiting)
        bound["spec"]["nodeName"] = NODES[0]
        going = copy.deepcopy(waiting)
        going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        added.clear()
        await controller._on_pod("MODIFIED", bound, waiting)
        await controller._on_pod("MODIFIED", going, waiting)
        assert added == []


async def test_an_answer_is_corrected_even_while_the_cache_lags_our_last_write(
    harness: Harness,
) -> None:
    harness.create_claim("c1")
    pod = harness.create_pod("p1", "c1")
    controller = harness.controller()
    controller.settings = dataclasses.replace(controller.settings, resync_interval_s=60)
    async with running(controller):
        harness.create_context(pod, [NODES[0]])
        await eventually(lambda: harness.answers("p1") == {"gpu": []}, what="first answer")
        await asyncio.sleep(0.3)
        # From now on the contexts' watch events reach the controller 0.6 s late.
        handle = controller.contexts._handle_line

        async def late(line: bytes, what: str) -> None:
            await asyncio.sleep(0.6)
            await handle(line, what)

        controller.contexts._handle_line = late  # type: ignore[method-assign]
        pools = controller.snapshots.pools
        assert pools is not None
        every = frozenset(d.device_id for p in pools for d in p.devices)
        controller.in_use.set_claim("someone-else", every)
        controller._enqueue_contexts()
        await eventually(
            lambda: harness.answers("p1") == {"gpu": [NODES[0]]},
            what="node unsuitable while every device is taken",
        )
        # Free again before the cache has seen the answer just written.
        controller.in_use.set_claim("someone-else", frozenset())
        controller._enqueue_contexts()
        await eventually(
            lambda: harness.answers("p1") == {"gpu": []}, timeout_s=5, what="the answer corrected"
        )
        # Another driver's answer needs a look, ours coming back does not.
        await asyncio.sleep(1.0)
        controller.contexts._handle_line = handle  # type: ignore[method-assign]


async def test_reservations_of_an_allocation_whose_write_failed_are_released_at_once(
    harness: Harness,
) -> None:
    harness.create_claim("c1")
    pod = harness.create_pod("p1", "c1")
    controller = harness.controller()
    controller.settings = dataclasses.replace(controller.settings, resync_interval_s=60)
    uid = (harness.claim("c1") or {})["metadata"]["uid"]
    async with running(controller):
        harness.create_context(pod, NODES)
        await eventually(lambda: harness.answers("p1") is not None, what="answered")
        # Every allocation write fails: the reservations made for it must not stay.
        harness.emu.fail_next(1000, method="PUT", path_regex="resourceclaims/c1/status", status=500)
        context = harness.context("p1")
        assert context is not None
        context["spec"]["selectedNode"] = NODES[1]
        harness.emu.update(context)
        await eventually(
            lambda: any("update ResourceClaim" in e.message for e in controller.recent_errors),
            what="write failed",
        )
        # The pod goes away: no retry of the allocation will come to release them.
        harness.emu.delete(RESOURCE, "PodSchedulingContext", "p1", "default")
        harness.emu.delete("v1", "Pod", "p1", "default")
        await eventually(
            lambda: _none_held(harness, uid), timeout_s=5, what="reservations released"
        )


async def _none_held(harness: Harness, uid: str) -> bool:
    return not await Journal(harness.db).for_claim(uid)


async def test_the_allocation_is_written_with_strict_field_validation(harness: Harness) -> None:
    # A field of our allocation the server does not know must fail the write, not vanish
    # with only a Warning header (scheduling.py _write_allocation).
    scheduler = harness.scheduler()
    async with running(harness.controller(), scheduler):
        await _bound_cycle(harness, scheduler)
    status_writes = [
        r for r in harness.emu.writes("/resourceclaims/c1/status") if r.method == "PUT"
    ]
    assert status_writes
    assert all("fieldValidation=Strict" in r.query for r in status_writes)


async def test_a_slice_event_while_the_snapshot_waits_does_not_break_it(
    harness: Harness,
) -> None:
    # A slice event resets the cached pools; one that lands while the snapshot awaits the
    # journal used to leave it iterating None ("'NoneType' object is not iterable").
    controller = harness.controller()
    async with running(controller):
        refresh = controller.snapshots.refresh_held

        async def refresh_with_a_slice_event() -> None:
            await refresh()
            await controller._on_slice("MODIFIED", {}, None)

        controller.snapshots.refresh_held = (  # type: ignore[method-assign]
            refresh_with_a_slice_event
        )
        snapshot = await controller.snapshots.snapshot(set())
        assert snapshot.pools, "the snapshot holds the published pools"
        assert all(isinstance(p, tuple) for p in snapshot.reachable.values())


async def test_a_selected_node_outside_the_potential_nodes_is_answered(harness: Harness) -> None:
    # The scheduler selected a node it did not list. It cannot serve the claim (no fabric
    # host), so the answer must name it as unsuitable, or the scheduler waits forever.
    harness.create_claim("c1")
    pod = harness.create_pod("p1", "c1")
    context = harness.create_context(pod, NODES[:1])
    context["spec"]["selectedNode"] = NO_HOST
    harness.emu.update(context)
    async with running(harness.controller()):
        await eventually(
            lambda: harness.answers("p1") == {"gpu": [NO_HOST]},
            what="the selected node answered as unsuitable",
        )
        assert harness.allocated_device("c1") is None


async def test_the_scheduler_stand_in_lists_no_node_cordoned_since_its_last_pod(
    harness: Harness,
) -> None:
    # The stand-in remembers each pod's potential nodes until a node changes: a node cordoned
    # after the first pod must be missing from the next pod's context.
    harness.create_claim("c1")
    harness.create_pod("p1", "c1")
    scheduler = harness.scheduler()
    async with running(harness.controller(), scheduler):
        await eventually(lambda: len(scheduler.bound) == 1, what="p1 bound")
        for name in NODES:
            node = harness.emu.get("v1", "Node", name)
            assert node is not None
            node["spec"] = {"unschedulable": True}
            harness.emu.update(node)
        harness.create_claim("c2")
        harness.create_pod("p2", "c2")
        await eventually(
            lambda: (
                (harness.context("p2") or {}).get("spec", {}).get("potentialNodes") == [NO_HOST]
            ),
            what="only the node left schedulable listed",
        )
        await eventually(lambda: "default/p2" in scheduler.unschedulable, what="p2 waits")
    assert not (harness.pod("p2") or {})["spec"].get("nodeName")


async def test_the_scheduler_stand_in_shares_its_pod_and_claim_informers_with_its_claim_controller(
    harness: Harness,
) -> None:
    # One process, one list and one watch per resource (client-go's SharedInformerFactory):
    # the claim controller stand-in inside the scheduler stand-in uses the scheduler's
    # informers, and still does its work (a claim of a pod that is gone is deallocated).
    def lists(plural: str) -> int:
        return sum(
            1
            for r in harness.emu.requests
            if r.method == "GET" and r.path.endswith(f"/{plural}") and "watch" not in r.query
        )

    harness.create_claim("c1")
    harness.create_pod("p1", "c1")
    scheduler = harness.scheduler()
    assert scheduler.claim_controller is not None
    async with running(harness.controller(), scheduler):
        await eventually(lambda: len(scheduler.bound) == 1, what="p1 bound")
        assert scheduler.claim_controller.pods is scheduler.pods
        assert scheduler.claim_controller.claims is scheduler.claims
        # The controller lists each once too.
        assert lists("pods") == 2
        assert lists("resourceclaims") == 2
        harness.emu.delete("v1", "Pod", "p1", "default")
        await eventually(
            lambda: (
                ((harness.claim("c1") or {}).get("status") or {}).get("deallocationRequested")
                or not ((harness.claim("c1") or {}).get("status") or {}).get("allocation")
            ),
            what="the claim of the deleted pod let go",
        )


async def test_slices_that_disagree_on_their_count_leave_the_pool_unused_and_say_why(
    harness: Harness,
) -> None:
    # One more slice of the published pool and generation, claiming the pool has 2 slices
    # while the first says 1: neither count can be trusted.
    (published,) = [harness.emu.get(RESOURCE, "ResourceSlice", n) for n in harness.slice_names]
    assert published is not None
    extra = {
        "apiVersion": RESOURCE,
        "kind": "ResourceSlice",
        "metadata": {"name": "extra-slice"},
        "spec": {
            **published["spec"],
            "devices": [{"name": "extra-gpu", "basic": {"attributes": {}}}],
            "pool": {**published["spec"]["pool"], "resourceSliceCount": 2},
        },
    }
    harness.emu.create(extra)
    pool = published["spec"]["pool"]["name"]
    reason = (
        f"the slices of generation {published['spec']['pool']['generation']} disagree "
        f"on resourceSliceCount: 1 (slice '{published['metadata']['name']}'); "
        "2 (slice 'extra-slice')"
    )
    harness.create_claim("c1")
    pod = harness.create_pod("p1", "c1")
    context = harness.create_context(pod, NODES)
    async with running(harness.controller()):
        await eventually(
            lambda: harness.answers("p1") == {"gpu": NODES}, what="every node unsuitable"
        )
        context = harness.context("p1") or {}
        context["spec"]["selectedNode"] = NODES[0]
        harness.emu.update(context)
        await eventually(
            lambda: bool(harness.events("AllocationFailed")),
            what="the allocation failure reported on the claim",
        )
        message = harness.events("AllocationFailed")[0]["message"]
        assert f"{DRIVER}/{pool} ({reason})" in message
        assert harness.allocated_device("c1") is None
    assert await Journal(harness.db).active() == []


def _select(harness: Harness, pod: str, node: str) -> None:
    context = harness.context(pod)
    assert context is not None
    context["spec"]["selectedNode"] = node
    harness.emu.update(context)


async def test_a_decision_does_not_wait_for_the_journal_write_of_the_one_before(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Decisions are serialised, journal writes are not (scheduling.py _choose, _reserve):
    # while one allocation's reservation waits, another context is answered, and it sees the
    # device the first one chose as in use.
    # Every snapshot reads the whole journal again (as one does every HELD_MAX_AGE_S): that
    # read, made before the reservation commits, must not drop the decision's hold.
    monkeypatch.setattr(snapshot_module, "HELD_MAX_AGE_S", 0.0)
    device = sorted(harness.devices)[0]
    harness.create_claim("a", device=device)
    harness.create_claim("b", device=device)
    pod_a = harness.create_pod("pa", "a")
    pod_b = harness.create_pod("pb", "b")
    controller = harness.controller()
    reserve = controller.journal.reserve
    go_on = asyncio.Event()

    async def waiting_reserve(*args: Any, **kwargs: Any) -> Any:
        await go_on.wait()
        return await reserve(*args, **kwargs)

    controller.journal.reserve = waiting_reserve  # type: ignore[method-assign]
    async with running(controller):
        harness.create_context(pod_a, NODES)
        await eventually(lambda: harness.answers("pa") == {"gpu": []}, what="pa answered")
        _select(harness, "pa", NODES[0])
        await eventually(
            lambda: device in {d for _, _, d in controller.snapshots.in_use.view()},
            what="the chosen device held in memory",
        )
        harness.create_context(pod_b, NODES)
        await eventually(
            lambda: harness.answers("pb") == {"gpu": sorted(NODES)},
            what="pb answered while pa's reservation waits, with its device in use",
        )
        assert harness.allocated_device("a") is None
        go_on.set()
        await eventually(lambda: harness.allocated_device("a") == device, what="pa allocated")
        # Once written, the allocation holds the device (the decision's hold has ended).
        await eventually(lambda: not controller.snapshots.in_use._pending, what="holds ended")
        assert device in {d for _, _, d in controller.snapshots.in_use.view()}
    assert not harness.events("DeviceTaken")


async def test_a_refused_reservation_lets_go_of_the_devices_held_in_memory(
    harness: Harness,
) -> None:
    # The journal refuses the device (another process holds it, which this one has not read
    # yet): the memory hold of the decision is taken back, and the context answered again.
    device = sorted(harness.devices)[0]
    harness.create_claim("a", device=device)
    pod = harness.create_pod("pa", "a")
    controller = harness.controller()

    async def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise DeviceHeld(device, "default/elsewhere")

    controller.journal.reserve = refused  # type: ignore[method-assign]
    async with running(controller):
        harness.create_context(pod, NODES)
        await eventually(lambda: harness.answers("pa") == {"gpu": []}, what="answered")
        _select(harness, "pa", NODES[0])
        await eventually(lambda: bool(harness.events("DeviceTaken")), what="DeviceTaken")
    assert not controller.snapshots.in_use.holders((DRIVER, "us-east/rack-01", device))
    assert harness.allocated_device("a") is None
    assert not await Journal(harness.db).for_claim((harness.claim("a") or {})["metadata"]["uid"])


async def test_a_leftover_reservation_of_an_earlier_attempt_is_released_by_the_claim_pass(
    harness: Harness,
) -> None:
    # An earlier allocation attempt stopped after reserving another device: once the claim
    # is allocated, its own pass releases what the allocation does not name.
    first, second = sorted(harness.devices)[:2]
    claim = harness.create_claim("a", device=second)
    uid = claim["metadata"]["uid"]
    await Journal(harness.db).reserve(
        ClaimRef(uid, "default", "a"),
        "dev",
        first,
        "us-east/rack-01",
        "control-plane",
        NODES[0],
        NODES[0],
    )
    pod = harness.create_pod("pa", "a")
    async with running(harness.controller()):
        harness.create_context(pod, NODES)
        await eventually(lambda: harness.answers("pa") == {"gpu": []}, what="answered")
        _select(harness, "pa", NODES[0])
        await eventually(lambda: harness.allocated_device("a") == second, what="allocated")
        await eventually(
            lambda: _held_devices(harness, uid, {second}), what="only the allocated device held"
        )
    assert not harness.attaches(first)


async def _held_devices(harness: Harness, uid: str, devices: set[str]) -> bool:
    held = await Journal(harness.db).for_claim(uid)
    return {r.device_name for r in held if r.released_at is None} == devices


async def test_a_shareable_device_is_not_given_twice_while_the_first_allocation_is_written(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shareable device's reservation is not exclusive: the journal's unique index does not
    # refuse a second claim, so the decision's memory hold is what keeps the device from
    # being chosen again until the first claim's allocation is written.
    monkeypatch.setattr(snapshot_module, "HELD_MAX_AGE_S", 0.0)
    device = sorted(harness.devices)[0]
    async with harness.db.write() as session:
        await session.execute(update(Device).where(Device.name == device).values(shareable=True))
    harness.create_claim("a", device=device)
    harness.create_claim("b", device=device)
    pod_a = harness.create_pod("pa", "a")
    pod_b = harness.create_pod("pb", "b")
    go_on = asyncio.Event()
    waiting = asyncio.Event()

    async def checkpoint(step: str) -> None:
        if step == "after-reserve" and not waiting.is_set():
            waiting.set()
            await go_on.wait()  # a's status write has not happened yet

    controller = harness.controller(checkpoint=checkpoint)
    async with running(controller):
        harness.create_context(pod_a, NODES)
        await eventually(lambda: harness.answers("pa") == {"gpu": []}, what="pa answered")
        _select(harness, "pa", NODES[0])
        await eventually(waiting.is_set, what="a reserved, its allocation not written")
        harness.create_context(pod_b, NODES)
        await eventually(
            lambda: harness.answers("pb") == {"gpu": sorted(NODES)},
            what="pb answered with a's device in use",
        )
        _select(harness, "pb", NODES[1])
        await asyncio.sleep(0.3)
        assert harness.allocated_device("b") is None
        go_on.set()
        await eventually(lambda: harness.allocated_device("a") == device, what="a allocated")
    assert harness.allocated_device("b") is None


async def test_a_node_status_update_answers_no_context_again_but_a_label_change_does(
    harness: Harness,
) -> None:
    # Kubelets report node status at least every 5 minutes each, and the attach-detach
    # controller writes status.volumesAttached: on a big cluster most node events are these.
    # None of them changes a pool's reach or a host, so none may cost a rebuild.
    harness.create_claim("c1")
    pod = harness.create_pod("p1", "c1")
    controller = harness.controller()
    async with running(controller):
        harness.create_context(pod, NODES)
        await eventually(lambda: harness.answers("p1") is not None)
        changes = dict(controller.snapshots._changes)
        added: list[Any] = []
        controller.queue.add = added.append  # type: ignore[method-assign]
        node = harness.emu.get("v1", "Node", NODES[0])
        assert node is not None
        node["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
        written = harness.emu.update_status(node)
        await eventually(
            lambda: (
                (controller.nodes.get(NODES[0]) or {}).get("metadata", {}).get("resourceVersion")
                == written["metadata"]["resourceVersion"]
            )
        )
        cached = controller.nodes.get(NODES[0])
        assert cached is not None
        assert "status" not in cached  # the informer keeps what is read, not the status
        assert controller.snapshots._changes == changes
        assert added == []

        relabelled = harness.emu.get("v1", "Node", NODES[0])
        assert relabelled is not None
        relabelled["metadata"]["labels"]["fabric-dra.io/rack"] = "rack-99"
        harness.emu.update(relabelled)
        await eventually(lambda: ("context", "default", "p1") in added)
        assert controller.snapshots._changes["nodes"] == changes["nodes"] + 1


async def test_a_failed_repair_is_attached_again_once_due(harness: Harness) -> None:
    # As in structured mode (tests/integration/test_claims.py): a lost attachment that could
    # not be attached again is tried again once due, with fresh tries.
    harness.create_claim("c1")
    pod = harness.create_pod("p1", "c1")
    controller = harness.controller()
    async with running(controller):
        harness.create_context(pod, NODES)
        await eventually(lambda: harness.answers("p1") is not None, what="answers")
        _select(harness, "p1", NODES[0])
        await eventually(lambda: harness.allocated_device("c1") is not None, what="allocation")
        claim = harness.claim("c1")
        assert claim is not None
        uid = claim["metadata"]["uid"]
        await eventually(lambda: _state_is(harness, uid, ATTACHED), what="attached")
        device = harness.allocated_device("c1")
        assert device is not None
        block = harness.block_of(device)
        journal = Journal(harness.db)
        (held,) = await journal.for_claim(uid)
        harness.sim.detach_out_of_band(block)
        failed = await journal.transition(
            held.id, [ATTACHED], FAILED, error=f"device {device} lost its attachment again"
        )
        assert failed is not None and failed.attached_at is not None
        await controller.sync_claim(uid)  # not due yet: nothing sent
        assert harness.sim.attachments()[block] is None
        later = utcnow() + dt.timedelta(seconds=REPAIR_RETRY_S + 1)
        controller.clock = lambda: later
        await controller.sync_claim(uid)
        assert harness.sim.attachments()[block] == NODES[0]
        (again,) = await journal.for_claim(uid)
        assert again.id == held.id and again.state == ATTACHED and again.attempts == 1
