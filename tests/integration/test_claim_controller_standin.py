"""The claim controller stand-in against emulated clusters that exist: Kubernetes 1.34
(resource.k8s.io v1, and v1beta1 through the version conversion) and 1.31 (v1alpha3, classic
DRA). Each test checks the objects it leaves behind and that a settled controller writes
nothing more."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
from builders import eventually

from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from app.kube.informer import InformerSettings
from app.kube.versions import ResourceApiVersion
from app.kube.workqueue import WorkQueueSettings
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.scheduler.claim_controller import ClaimController, ClaimControllerSettings
from fabric_dra_sim.scheduler.common import DELETE_PROTECTION, POD_CLAIM_NAME_ANNOTATION

DRIVER = "fabric.example.com"
NS = "default"
eventually = partial(eventually, interval_s=0.02)
FAST = ClaimControllerSettings(
    informer=InformerSettings(
        name="x", watch_timeout_s=30, backoff_initial_s=0.05, backoff_max_s=0.2
    ),
    queue=WorkQueueSettings(base_delay_s=0.02, max_delay_s=0.2),
)


class Cluster:
    def __init__(self, emu: KubeEmulator, client: KubeClient, version: str) -> None:
        self.emu, self.client, self.version = emu, client, version
        self.api_version = f"resource.k8s.io/{version}"

    def controller(self) -> ClaimController:
        return ClaimController(self.client, ResourceApiVersion(self.version), FAST)

    def request(self) -> dict[str, Any]:
        if self.version in ("v1", "v1beta2"):
            return {"name": "gpu", "exactly": {"deviceClassName": "gpu"}}
        return {"name": "gpu", "deviceClassName": "gpu"}

    def template(self, name: str = "one-gpu", **labels: str) -> None:
        self.emu.create(
            {
                "apiVersion": self.api_version,
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "metadata": {"labels": labels} if labels else {},
                    "spec": {"devices": {"requests": [self.request()]}},
                },
            }
        )

    def claim(self, name: str, **spec: Any) -> dict[str, Any]:
        return self.emu.create(
            {
                "apiVersion": self.api_version,
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"devices": {"requests": [self.request()]}, **spec},
            }
        )

    def pod(
        self,
        name: str,
        *,
        template: str | None = None,
        claim: str | None = None,
        node: str | None = None,
    ) -> dict[str, Any]:
        source = (
            {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
        )
        spec: dict[str, Any] = {
            "containers": [{"name": "c", "image": "busybox"}],
            "resourceClaims": [{"name": "gpu", **source}],
        }
        if node:
            spec["nodeName"] = node
        return self.emu.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NS},
                "spec": spec,
            }
        )

    def get_pod(self, name: str) -> dict[str, Any] | None:
        return self.emu.get("v1", "Pod", name, NS)

    def get_claim(self, name: str) -> dict[str, Any] | None:
        return self.emu.get(self.api_version, "ResourceClaim", name, NS)

    def claims(self) -> list[dict[str, Any]]:
        return self.emu.list(self.api_version, "ResourceClaim", NS)

    def allocate(self, name: str, *, reserved_for: list[dict[str, Any]], finalizer: bool) -> None:
        claim = self.get_claim(name)
        assert claim is not None
        if finalizer:
            claim["metadata"]["finalizers"] = [DELETE_PROTECTION]
            claim = self.emu.update(claim)
        result = {"request": "gpu", "driver": DRIVER, "pool": "pool-a", "device": "gpu-0"}
        allocation: dict[str, Any] = {"devices": {"results": [result]}}
        if self.version == "v1alpha3":
            allocation["controller"] = DRIVER
        claim["status"] = {"allocation": allocation, "reservedFor": reserved_for}
        self.emu.update_status(claim)

    def settled(self, controller: ClaimController) -> bool:
        """The controller's caches hold what the server holds, nothing is queued or in work."""

        def versions(objects: list[dict[str, Any]]) -> dict[str, str]:
            return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in objects}

        return (
            versions(controller.pods.objects()) == versions(self.emu.list("v1", "Pod", NS))
            and versions(controller.claims.objects()) == versions(self.claims())
            and len(controller.queue) == 0
            and controller.queue.processing_count == 0
        )

    async def quiet(self, controller: ClaimController) -> None:
        """Once the controller has settled, one more pass over every pod and claim, run here
        to its end, writes nothing."""
        await eventually(lambda: self.settled(controller), what="a settled controller")
        before = len(self.emu.writes())
        for pod in self.emu.list("v1", "Pod", NS):
            await controller.sync_pod(NS, pod["metadata"]["name"])
        for claim in self.claims():
            await controller.sync_claim(NS, claim["metadata"]["name"])
        assert [(w.method, w.path) for w in self.emu.writes()[before:]] == []


def consumer(pod: dict[str, Any]) -> dict[str, Any]:
    return {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}


async def _cluster(**emulator: Any) -> AsyncIterator[Cluster]:
    version = emulator.pop("version")
    emu = KubeEmulator(**emulator)
    url = await emu.start()
    client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=url))
    try:
        yield Cluster(emu, client, version)
    finally:
        await client.close()
        await emu.stop()


@pytest.fixture(
    params=[
        {"kubernetes_version": "1.34", "version": "v1"},
        {
            "kubernetes_version": "1.34",
            "served_resource_versions": ("v1beta1",),
            "version": "v1beta1",
        },
    ],
    ids=["1.34-v1", "1.34-v1beta1"],
)
async def structured(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    async for cluster in _cluster(**request.param):
        yield cluster


@pytest.fixture
async def classic() -> AsyncIterator[Cluster]:
    async for cluster in _cluster(kubernetes_version="1.31", version="v1alpha3"):
        yield cluster


async def running(controller: ClaimController) -> ClaimController:
    await controller.start()
    return controller


async def test_a_template_claim_is_made_named_owned_and_recorded_once(
    structured: Cluster,
) -> None:
    cluster = structured
    cluster.template(app="train")
    pod = cluster.pod("trainer", template="one-gpu")
    controller = await running(cluster.controller())
    try:
        await eventually(
            lambda: (
                (cluster.get_pod("trainer") or {}).get("status", {}).get("resourceClaimStatuses")
            ),
            what="recorded in the pod status",
        )
        await cluster.quiet(controller)
    finally:
        await controller.stop()
    (made,) = cluster.claims()
    meta = made["metadata"]
    assert meta["name"].startswith("trainer-gpu-") and len(meta["name"]) == len("trainer-gpu-") + 5
    assert meta["generateName"] == "trainer-gpu-"
    assert meta["labels"] == {"app": "train"}
    assert meta["annotations"] == {POD_CLAIM_NAME_ANNOTATION: "gpu"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "trainer",
            "uid": pod["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    template = cluster.emu.get(cluster.api_version, "ResourceClaimTemplate", "one-gpu", NS)
    assert template is not None
    assert made["spec"] == template["spec"]["spec"]  # as stored, defaults included
    recorded = (cluster.get_pod("trainer") or {})["status"]["resourceClaimStatuses"]
    assert recorded == [{"name": "gpu", "resourceClaimName": meta["name"]}]
    assert controller.counters.created == 1


async def test_an_orphan_claim_from_before_a_crash_is_recorded_not_made_again(
    structured: Cluster,
) -> None:
    cluster = structured
    cluster.template()
    pod = cluster.pod("trainer", template="one-gpu")
    cluster.emu.create(
        {
            "apiVersion": cluster.api_version,
            "kind": "ResourceClaim",
            "metadata": {
                "name": "trainer-gpu-abcde",
                "namespace": NS,
                "annotations": {POD_CLAIM_NAME_ANNOTATION: "gpu"},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": "trainer",
                        "uid": pod["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {"devices": {"requests": [cluster.request()]}},
        }
    )
    controller = await running(cluster.controller())
    try:
        await eventually(
            lambda: (
                (cluster.get_pod("trainer") or {}).get("status", {}).get("resourceClaimStatuses")
            ),
            what="recorded",
        )
        await cluster.quiet(controller)
    finally:
        await controller.stop()
    assert [c["metadata"]["name"] for c in cluster.claims()] == ["trainer-gpu-abcde"]
    assert controller.counters.created == 0


async def test_a_missing_template_is_retried_until_it_exists(structured: Cluster) -> None:
    cluster = structured
    cluster.pod("trainer", template="later")
    controller = await running(cluster.controller())
    try:
        await asyncio.sleep(0.3)
        assert cluster.claims() == []
        cluster.template("later")
        await eventually(lambda: len(cluster.claims()) == 1, what="made once it exists")
    finally:
        await controller.stop()


async def test_a_deleted_pod_is_released_its_claim_deallocated_and_deleted(
    structured: Cluster,
) -> None:
    cluster = structured
    cluster.template()
    pod = cluster.pod("trainer", template="one-gpu", node="n1")
    controller = await running(cluster.controller())
    try:
        await eventually(lambda: len(cluster.claims()) == 1, what="made")
        name = cluster.claims()[0]["metadata"]["name"]
        cluster.allocate(name, reserved_for=[consumer(pod)], finalizer=True)
        await cluster.quiet(controller)
        cluster.emu.delete("v1", "Pod", "trainer", NS)
        await eventually(lambda: cluster.claims() == [], what="claim deleted")
        await cluster.quiet(controller)
    finally:
        await controller.stop()
    writes = [
        (w.method, w.path.rsplit("/", 2)[-2:]) for w in cluster.emu.writes() if name in w.path
    ]
    # Release and deallocate in one status update, drop the finalizer, then delete.
    assert writes[-3:] == [
        ("PUT", [name, "status"]),
        ("PUT", ["resourceclaims", name]),
        ("DELETE", ["resourceclaims", name]),
    ]
    counters = controller.counters
    assert (counters.released, counters.deallocations, counters.deleted) == (1, 1, 1)


async def test_a_finished_pod_lets_go_of_a_shared_claim_and_its_own_claim_goes(
    structured: Cluster,
) -> None:
    cluster = structured
    cluster.template()
    cluster.claim("shared")
    first = cluster.pod("first", claim="shared", node="n1")
    second = cluster.pod("second", claim="shared", node="n1")
    own = cluster.pod("own", template="one-gpu", node="n1")
    controller = await running(cluster.controller())
    try:
        await eventually(lambda: len(cluster.claims()) == 2, what="template claim made")
        own_claim = next(c for c in cluster.claims() if c["metadata"]["name"] != "shared")
        cluster.allocate(
            own_claim["metadata"]["name"], reserved_for=[consumer(own)], finalizer=True
        )
        cluster.allocate("shared", reserved_for=[consumer(first), consumer(second)], finalizer=True)
        await cluster.quiet(controller)
        for name in ("first", "own"):
            done = cluster.get_pod(name)
            assert done is not None
            done["status"]["phase"] = "Succeeded"
            cluster.emu.update_status(done)
        await eventually(
            lambda: [c["metadata"]["name"] for c in cluster.claims()] == ["shared"],
            what="the finished pod's own claim deleted",
        )
        await cluster.quiet(controller)
    finally:
        await controller.stop()
    shared = cluster.get_claim("shared")
    assert shared is not None
    assert shared["status"]["reservedFor"] == [consumer(second)]
    assert shared["status"]["allocation"]  # still used by the second pod
    assert shared["metadata"]["finalizers"] == [DELETE_PROTECTION]
    # The finished pod gets no claim made again (cleanup only).
    assert controller.counters.created == 1


async def test_a_pod_bound_without_the_scheduler_gets_its_allocated_claim_reserved(
    structured: Cluster,
) -> None:
    cluster = structured
    cluster.claim("c1")
    cluster.allocate("c1", reserved_for=[], finalizer=True)
    pod = cluster.pod("p1", claim="c1", node="n1")
    controller = await running(cluster.controller())
    try:
        await eventually(
            lambda: (cluster.get_claim("c1") or {}).get("status", {}).get("reservedFor"),
            what="reserved",
        )
        await cluster.quiet(controller)
    finally:
        await controller.stop()
    assert (cluster.get_claim("c1") or {})["status"]["reservedFor"] == [consumer(pod)]
    assert controller.counters.reserved == 1


async def test_1_31_a_deleted_pod_asks_the_driver_to_deallocate_its_classic_claim(
    classic: Cluster,
) -> None:
    cluster = classic
    cluster.claim("c1", controller=DRIVER)
    pod = cluster.pod("p1", claim="c1", node="n1")
    cluster.allocate("c1", reserved_for=[consumer(pod)], finalizer=False)
    cluster.emu.create(
        {
            "apiVersion": cluster.api_version,
            "kind": "PodSchedulingContext",
            "metadata": {
                "name": "p1",
                "namespace": NS,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": "p1",
                        "uid": pod["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {"selectedNode": "n1"},
        }
    )
    controller = await running(cluster.controller())
    try:
        await cluster.quiet(controller)
        cluster.emu.delete("v1", "Pod", "p1", NS)
        await eventually(
            lambda: (cluster.get_claim("c1") or {}).get("status", {}).get("deallocationRequested"),
            what="deallocation requested",
        )
        await eventually(
            lambda: cluster.emu.get(cluster.api_version, "PodSchedulingContext", "p1", NS) is None,
            what="context deleted",
        )
        await cluster.quiet(controller)
    finally:
        await controller.stop()
    status = (cluster.get_claim("c1") or {})["status"]
    assert status["allocation"]["controller"] == DRIVER  # the driver deallocates, not us
    assert "reservedFor" not in status
    assert controller.counters.deallocation_requests == 1
    assert controller.counters.deallocations == 0


async def test_1_31_a_bound_pod_with_an_unallocated_classic_claim_selects_its_node(
    classic: Cluster,
) -> None:
    cluster = classic
    cluster.claim("c1", controller=DRIVER)
    pod = cluster.pod("p1", claim="c1", node="n1")
    controller = await running(cluster.controller())
    try:
        await eventually(
            lambda: cluster.emu.get(cluster.api_version, "PodSchedulingContext", "p1", NS),
            what="context made",
        )
        await cluster.quiet(controller)
    finally:
        await controller.stop()
    context = cluster.emu.get(cluster.api_version, "PodSchedulingContext", "p1", NS)
    assert context is not None
    assert context["spec"]["selectedNode"] == "n1"
    assert context["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]


async def test_1_31_template_claims_are_made_in_v1alpha3(classic: Cluster) -> None:
    cluster = classic
    cluster.template()
    cluster.pod("p1", template="one-gpu")
    controller = await running(cluster.controller())
    try:
        await eventually(lambda: len(cluster.claims()) == 1, what="made")
        await cluster.quiet(controller)
    finally:
        await controller.stop()
    template = cluster.emu.get(cluster.api_version, "ResourceClaimTemplate", "one-gpu", NS)
    assert template is not None
    assert cluster.claims()[0]["spec"] == template["spec"]["spec"]


async def test_the_command_runs_until_interrupted_and_errors_are_one_line(
    classic: Cluster,
) -> None:
    cluster = classic
    cluster.template()
    cluster.pod("p1", template="one-gpu")
    url = cluster.emu.url
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        "sim",
        "claim-controller",
        "--kube-url",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await eventually(
            lambda: len(cluster.claims()) == 1, timeout_s=30, what="made by the command"
        )
    finally:
        process.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    assert "resource.k8s.io/v1alpha3" in out.decode()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        "sim",
        "claim-controller",
        "--kube-url",
        url,
        "--resource-api-version",
        "v1",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    lines = err.decode().strip().splitlines()
    assert process.returncode == 1
    assert lines == ["Error: resource.k8s.io/v1 is not served (the API server serves v1alpha3)"]
