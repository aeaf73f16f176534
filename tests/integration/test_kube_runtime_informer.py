"""The controller runtime with a real informer on the Kubernetes API emulator: start lists
before the controller's prepare step and the workers, events become keys reconciled by uid,
health follows the informer, and stop stops it."""

from __future__ import annotations

from typing import Any

from builders import eventually
from kubernetes_asyncio.client import ResourceV1Api

from app.kube.client import KubeClient
from app.kube.informer import Informer, InformerSettings
from app.kube.runtime import Controller, RuntimeSettings
from app.kube.workqueue import WorkQueue, WorkQueueSettings
from fabric_dra_sim.kubeapi import KubeEmulator

RESOURCE = "resource.k8s.io/v1"


def resource_slice(name: str) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE,
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "fabric.example.com",
            "allNodes": True,
            "devices": [{"name": "d0"}],
            "pool": {"name": name, "generation": 0, "resourceSliceCount": 1},
        },
    }


class ByUid:
    """Reconciles slices by uid: records the name the informer's uid index gives."""

    def __init__(self, informer: Informer) -> None:
        self.informer = informer
        self.seen: list[str | None] = []

    async def reconcile(self, uid: str) -> bool:
        obj = self.informer.by_uid(uid)
        self.seen.append(obj["metadata"]["name"] if obj is not None else None)
        return False


async def test_the_runtime_lists_first_reconciles_events_by_uid_and_stops_its_informer(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    emu.create(resource_slice("before"))
    informer = Informer(
        ResourceV1Api(client.api).list_resource_slice,
        InformerSettings(name="resourceslices", backoff_initial_s=0.02, backoff_max_s=0.1),
    )
    reconciler = ByUid(informer)
    queue: WorkQueue[str] = WorkQueue(WorkQueueSettings(name="slices"))

    async def on_slice(event: str, obj: dict[str, Any], old: Any) -> None:
        queue.add(obj["metadata"]["uid"])

    informer.add_handler(on_slice)
    runtime = Controller(
        reconciler, RuntimeSettings("slices", workers=2), queue, informers=(informer,)
    )
    prepared: list[bool] = []

    async def prepare() -> None:
        prepared.append(informer.has_synced.is_set())

    await runtime.start(prepare)
    try:
        assert prepared == [True], "prepare runs once the informer has listed"
        assert runtime.synced() and runtime.is_healthy()
        await eventually(lambda: reconciler.seen == ["before"], what="listed slice reconciled")
        emu.create(resource_slice("after"))
        await eventually(lambda: "after" in reconciler.seen, what="new slice reconciled")
        emu.delete(RESOURCE, "ResourceSlice", "after")
        await eventually(lambda: None in reconciler.seen, what="deleted slice reconciled")
    finally:
        await runtime.stop()
    assert not informer.is_healthy() and not runtime.is_healthy()
