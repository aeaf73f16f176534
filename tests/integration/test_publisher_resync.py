"""The publisher never lets its own write hide a DELETED the watch delivered, and its periodic
full resync (a LIST of the slices) repairs what a lost event left wrong, writing nothing when
nothing is wrong. Races are ordered with the emulator's hooks (a held answer, a dropped event),
never with sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from builders import eventually
from prometheus_client import CollectorRegistry

from app.fabric.types import Location
from app.kube.client import KubeClient
from app.kube.informer import InformerEvent, InformerSettings
from app.kube.versions import ResourceApiVersion
from app.pools import DesiredPool, PoolConfig, PoolDevice, desired_pools, resource_slice_spec
from app.publisher.metrics import PublisherMetrics
from app.publisher.publisher import Publisher
from app.publisher.settings import PublisherSettings
from fabric_dra_sim.kubeapi import KubeEmulator

DRIVER = "fabric.example.com"
CONFIG = PoolConfig(driver_name=DRIVER)
V1 = "resource.k8s.io/v1"
POOL = "us-east/rack-1"
WAIT_S = 30.0


def fast_settings(**changes: Any) -> PublisherSettings:
    values: dict[str, Any] = {
        "debounce_s": 0.01,
        "workers": 4,
        "retry_base_s": 0.02,
        "retry_max_s": 0.2,
        "request_timeout_s": 30.0,
        "informer": InformerSettings(
            name="resourceslices",
            watch_timeout_s=5.0,
            watch_timeout_jitter=0.2,
            client_timeout_margin_s=2.0,
            list_timeout_s=5.0,
            backoff_initial_s=0.02,
            backoff_max_s=0.1,
        ),
    }
    values.update(changes)
    return PublisherSettings(**values)


def gpus(count: int, *, rack: str = "rack-1", warning: tuple[int, ...] = ()) -> list[PoolDevice]:
    return [
        PoolDevice(
            name=f"gpu-{rack}-{i:04d}",
            device_type="gpu",
            location=Location(region="us-east", rack=rack),
            vendor="Example",
            model="X100",
            memory_mib=81920,
            health="Warning" if i in warning else "OK",
        )
        for i in range(count)
    ]


def pools(*groups: list[PoolDevice]) -> dict[str, DesiredPool]:
    return desired_pools([d for group in groups for d in group], CONFIG)


# ``emu`` (Kubernetes 1.34, every DRA gate on) and ``client`` are in
# tests/integration/conftest.py.


@contextlib.asynccontextmanager
async def running(
    client: KubeClient, *, metrics: PublisherMetrics | None = None, **changes: Any
) -> AsyncIterator[Publisher]:
    publisher = Publisher(client, ResourceApiVersion.V1, DRIVER, fast_settings(**changes), metrics)
    await publisher.start()
    try:
        yield publisher
    finally:
        await publisher.stop()


def slices(emu: KubeEmulator) -> list[dict[str, Any]]:
    return [o for o in emu.list(V1, "ResourceSlice") if o["spec"]["driver"] == DRIVER]


def writes(emu: KubeEmulator) -> Counter[str]:
    return Counter(r.method for r in emu.writes("resourceslices"))


def slice_lists(emu: KubeEmulator) -> int:
    """LIST requests of ResourceSlices served (watches excluded)."""
    return sum(
        1
        for r in emu.requests
        if r.method == "GET" and r.path.endswith("/resourceslices") and "watch=" not in r.query
    )


async def publish(publisher: Publisher, desired: dict[str, DesiredPool]) -> None:
    publisher.set_desired(desired)
    await publisher.wait_idle(WAIT_S)


def assert_matches(emu: KubeEmulator, desired: dict[str, DesiredPool]) -> None:
    """The emulator holds exactly the desired slices of our driver (one per pool here)."""
    found = {o["spec"]["pool"]["name"]: o for o in slices(emu)}
    assert len(found) == len(slices(emu)) and set(found) == set(desired)
    for name, pool in desired.items():
        (content,) = pool.slices
        generation = found[name]["spec"]["pool"]["generation"]
        assert found[name]["spec"] == resource_slice_spec(DRIVER, pool, content, generation)


async def next_deleted(events: asyncio.Queue[InformerEvent], name: str) -> None:
    """Wait until the publisher's informer has handed the DELETED of ``name`` to the publisher
    (queues get an event after the handlers ran)."""

    async def wait() -> None:
        while True:
            event = await events.get()
            if event.type == "DELETED" and event.obj["metadata"]["name"] == name:
                return

    await asyncio.wait_for(wait(), WAIT_S)


# --------------------------------------------------------------------------- observed DELETED
async def test_a_slice_deleted_before_its_create_answer_is_handled_is_recreated(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    desired = pools(gpus(5))
    async with running(client) as publisher:
        (informer,) = publisher.informers()
        events = informer.subscribe()
        hold = emu.hold_response(method="POST", path_regex="/resourceslices$")
        publisher.set_desired(desired)
        await asyncio.wait_for(hold.reached.wait(), WAIT_S)
        # The create took effect (ADDED is out) but its answer is held: delete the slice and
        # let the watch deliver the DELETED before the publisher sees the answer.
        (created,) = slices(emu)
        name = created["metadata"]["name"]
        emu.delete(V1, "ResourceSlice", name)
        await next_deleted(events, name)
        hold.release()
        await publisher.wait_idle(WAIT_S)
        assert_matches(emu, desired)
        (recreated,) = slices(emu)
        assert recreated["metadata"]["name"] != name
        assert writes(emu) == {"POST": 2}
        assert publisher.status().pools[POOL].resource_slices == (recreated["metadata"]["name"],)
        assert await publisher.resync() == 0
        await publisher.wait_idle(WAIT_S)
        assert writes(emu) == {"POST": 2}


async def test_a_slice_deleted_before_its_update_answer_is_handled_is_recreated(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    async with running(client) as publisher:
        await publish(publisher, pools(gpus(5)))
        (original,) = slices(emu)
        name = original["metadata"]["name"]
        (informer,) = publisher.informers()
        events = informer.subscribe()
        hold = emu.hold_response(method="PUT", path_regex=f"/resourceslices/{name}$")
        changed = pools(gpus(5, warning=(2,)))
        publisher.set_desired(changed)
        await asyncio.wait_for(hold.reached.wait(), WAIT_S)
        emu.delete(V1, "ResourceSlice", name)
        await next_deleted(events, name)
        hold.release()
        await publisher.wait_idle(WAIT_S)
        assert_matches(emu, changed)
        (recreated,) = slices(emu)
        assert recreated["metadata"]["name"] != name
        assert writes(emu) == {"POST": 2, "PUT": 1}
        assert publisher.status().pools[POOL].resource_slices == (recreated["metadata"]["name"],)


# --------------------------------------------------------------------------- full resync
async def test_a_resync_with_no_change_lists_the_slices_and_writes_nothing(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    registry = CollectorRegistry()
    desired = pools(*(gpus(4, rack=f"rack-{k}") for k in range(3)))
    async with running(client, metrics=PublisherMetrics.create(registry)) as publisher:
        await publish(publisher, desired)
        before, lists = writes(emu), slice_lists(emu)
        syncs = (
            registry.get_sample_value("fabric_dra_publisher_pool_syncs_total", {"result": "ok"})
            or 0
        )
        assert await publisher.resync() == 0
        await publisher.wait_idle(WAIT_S)
        assert writes(emu) == before
        assert slice_lists(emu) == lists + 1  # a real LIST, not the cache
        # Every pool was synced again (and planned no write).
        assert (
            registry.get_sample_value("fabric_dra_publisher_pool_syncs_total", {"result": "ok"})
            == syncs + 3
        )
        assert (
            registry.get_sample_value(
                "fabric_dra_publisher_api_writes_total", {"verb": "create", "result": "ok"}
            )
            == 3
        )
        assert (
            registry.get_sample_value("fabric_dra_publisher_resyncs_total", {"result": "ok"}) == 1
        )
        assert registry.get_sample_value("fabric_dra_publisher_resync_corrections_total") == 0
        status = publisher.status()
        assert (status.resyncs, status.resync_corrections) == (1, 0)
        assert status.to_json()["resyncs"] == 1


async def test_a_slice_deleted_with_its_event_lost_is_recreated_by_the_resync(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    registry = CollectorRegistry()
    desired = pools(gpus(5), gpus(3, rack="rack-2"))
    async with running(client, metrics=PublisherMetrics.create(registry)) as publisher:
        await publish(publisher, desired)
        (lost,) = [o for o in slices(emu) if o["spec"]["pool"]["name"] == POOL]
        name = lost["metadata"]["name"]
        emu.drop_events("resourceslices", "DELETED", name=name)
        emu.delete(V1, "ResourceSlice", name)
        assert publisher.status().pools[POOL].resource_slices == (name,)
        assert await publisher.resync() == 1
        await publisher.wait_idle(WAIT_S)
        assert_matches(emu, desired)
        assert writes(emu) == {"POST": 3}  # two first creates, one re-create
        assert registry.get_sample_value("fabric_dra_publisher_resync_corrections_total") == 1
        assert publisher.status().resync_corrections == 1


async def test_the_periodic_resync_repairs_a_lost_deletion(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    desired = pools(gpus(5))
    async with running(client, resync_period_s=0.05) as publisher:
        await publish(publisher, desired)
        (lost,) = slices(emu)
        emu.drop_events("resourceslices", "DELETED", name=lost["metadata"]["name"])
        emu.delete(V1, "ResourceSlice", lost["metadata"]["name"])
        await eventually(
            lambda: publisher.status().resync_corrections >= 1,
            WAIT_S,
            "a resync finding the lost deletion",
        )
        await eventually(lambda: len(slices(emu)) == 1, WAIT_S, "the slice recreated")
        await publisher.wait_idle(WAIT_S)
        assert_matches(emu, desired)
        # Later periodic resyncs find nothing wrong and write nothing.
        status, before = publisher.status(), writes(emu)
        await eventually(
            lambda: publisher.status().resyncs >= status.resyncs + 3, WAIT_S, "three more resyncs"
        )
        await publisher.wait_idle(WAIT_S)
        assert writes(emu) == before
        assert publisher.status().resync_corrections == status.resync_corrections


def test_the_resync_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="resync_period_s"):
        PublisherSettings(resync_period_s=0)
    assert PublisherSettings().resync_period_s == 600.0
