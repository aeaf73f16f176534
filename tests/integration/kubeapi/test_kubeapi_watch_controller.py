"""The controller's informer and publisher against the emulator's watch faults: ERROR 410 inside
a live watch, a watch a whole window behind, old events replayed, write answers that arrive
after their own watch events."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from builders import eventually, publisher_caught_up
from kubernetes_asyncio.client import ResourceV1Api

from app.fabric.types import Location
from app.kube.client import KubeClient
from app.kube.informer import EventType, Informer, InformerSettings
from app.kube.versions import ResourceApiVersion
from app.pools import DesiredPool, PoolConfig, PoolDevice, desired_pools
from app.publisher.plan import slice_index
from app.publisher.publisher import Publisher
from app.publisher.settings import PublisherSettings
from fabric_dra_sim.kubeapi import KubeEmulator

DRIVER = "fabric.example.com"
V1 = "resource.k8s.io/v1"
# Without the alpha binding conditions and taints (off in Kubernetes 1.34), so the server keeps
# every field the publisher writes.
CONFIG = PoolConfig(driver_name=DRIVER, binds_to_node=False, taints_supported=False)


def resource_slice(name: str, label: str = "0") -> dict[str, Any]:
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"round": label}},
        "spec": {
            "driver": DRIVER,
            "allNodes": True,
            "pool": {"name": f"pool-{name}", "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}],
        },
    }


def other_driver_slice(name: str) -> dict[str, Any]:
    """A slice of another driver (outside the publisher's field selector)."""
    obj = resource_slice(name)
    obj["spec"]["driver"] = "other.example.com"
    return obj


def relabel(emu: KubeEmulator, name: str, label: str) -> dict[str, Any]:
    current = emu.get(V1, "ResourceSlice", name)
    assert current is not None
    current["metadata"]["labels"] = {"round": label}
    return emu.update(current)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[EventType, str, str]] = []

    async def __call__(
        self, event_type: EventType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        del old
        self.events.append(
            (event_type, obj["metadata"]["name"], obj["metadata"]["resourceVersion"])
        )


# ``emu`` (Kubernetes 1.34, every DRA gate on) and ``client`` are in
# tests/integration/conftest.py.


def informer_settings() -> InformerSettings:
    return InformerSettings(
        name="resourceslices",
        page_size=2,
        watch_timeout_s=5.0,
        watch_timeout_jitter=0.2,
        client_timeout_margin_s=2.0,
        list_timeout_s=5.0,
        backoff_initial_s=0.02,
        backoff_max_s=0.1,
    )


@contextlib.asynccontextmanager
async def informing(
    client: KubeClient, emu: KubeEmulator, recorder: Recorder
) -> AsyncIterator[Informer]:
    informer = Informer(
        ResourceV1Api(client.api).list_resource_slice, informer_settings(), rng=random.Random(3)
    )
    informer.add_handler(recorder)
    informer.start()
    try:
        await informer.wait_synced(10)
        await eventually(lambda: emu.open_watches >= 1, what="the informer's watch")
        yield informer
    finally:
        await informer.stop()


def cache_versions(informer: Informer) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in informer.objects()}


def store_versions(emu: KubeEmulator) -> dict[str, str]:
    return {
        o["metadata"]["name"]: o["metadata"]["resourceVersion"]
        for o in emu.list(V1, "ResourceSlice")
    }


# -- informer -----------------------------------------------------------------------------
async def test_the_informer_relists_on_error_410_inside_a_live_watch(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    emu.create(resource_slice("a"))
    recorder = Recorder()
    async with informing(client, emu, recorder) as informer:
        lists = informer.list_count
        emu.set_history_size("resourceslices", 1)
        assert emu.expire_watches("resourceslices") == 1
        # Written while the informer is between the ERROR and its relist.
        emu.create(resource_slice("b"))
        relabel(emu, "a", "1")
        await eventually(
            lambda: cache_versions(informer) == store_versions(emu), what="the cache to catch up"
        )
        assert informer.gone_count >= 1 and informer.list_count > lists
        assert informer.is_healthy()


async def test_the_informer_recovers_from_falling_a_window_behind(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    recorder = Recorder()
    async with informing(client, emu, recorder) as informer:
        emu.set_history_size("resourceslices", 3)
        for i in range(8):  # in one go: the watch cannot drain in between
            emu.create(resource_slice(f"s{i}"))
        await eventually(
            lambda: cache_versions(informer) == store_versions(emu), what="the cache to catch up"
        )
        assert informer.gone_count >= 1
        added = Counter(name for kind, name, _ in recorder.events if kind == "ADDED")
        assert all(count == 1 for count in added.values()), added


async def test_a_replayed_old_event_does_not_take_the_informer_back(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    emu.create(resource_slice("a"))
    recorder = Recorder()
    async with informing(client, emu, recorder) as informer:
        newest = relabel(emu, "a", "1")["metadata"]["resourceVersion"]
        await eventually(lambda: cache_versions(informer) == {"a": newest}, what="MODIFIED a")
        delivered = len(recorder.events)
        replayed = emu.replay_event("resourceslices", "a")
        assert int(replayed) < int(newest)
        # A later event proves the replay was read before it.
        emu.create(resource_slice("z"))
        await eventually(lambda: "z" in cache_versions(informer), what="ADDED z")
        assert cache_versions(informer)["a"] == newest
        assert [e[1] for e in recorder.events[delivered:]] == ["z"]
        assert informer.resource_version is not None
        assert int(informer.resource_version) >= int(newest)


async def test_a_replayed_deletion_of_an_earlier_incarnation_keeps_the_object(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    emu.create(resource_slice("a"))
    emu.delete(V1, "ResourceSlice", "a")
    deleted_at = str(emu.resource_version)
    recorder = Recorder()
    async with informing(client, emu, recorder) as informer:
        again = emu.create(resource_slice("a", "2"))
        await eventually(lambda: "a" in cache_versions(informer), what="ADDED a")
        emu.replay_event("resourceslices", "a", resource_version=deleted_at)
        emu.create(resource_slice("z"))
        await eventually(lambda: "z" in cache_versions(informer), what="ADDED z")
        assert informer.get("a") is not None
        assert cache_versions(informer)["a"] == again["metadata"]["resourceVersion"]
        assert ("DELETED", "a") not in [(kind, name) for kind, name, _ in recorder.events]


# -- publisher ----------------------------------------------------------------------------
def gpus(count: int, rack: str) -> list[PoolDevice]:
    return [
        PoolDevice(
            name=f"gpu-{rack}-{i:04d}",
            device_type="gpu",
            location=Location(region="us-east", rack=rack),
            vendor="Example",
            model="X100",
            memory_mib=81920,
            health="OK",
        )
        for i in range(count)
    ]


def publisher_settings() -> PublisherSettings:
    return PublisherSettings(
        debounce_s=0.01,
        workers=4,
        retry_base_s=0.02,
        retry_max_s=0.2,
        request_timeout_s=5.0,
        informer=informer_settings(),
    )


@contextlib.asynccontextmanager
async def publishing(client: KubeClient) -> AsyncIterator[Publisher]:
    publisher = Publisher(client, ResourceApiVersion.V1, DRIVER, publisher_settings())
    await publisher.start()
    try:
        yield publisher
    finally:
        await publisher.stop()


def pool_layout(emu: KubeEmulator) -> dict[str, list[int]]:
    """Pool -> sorted slice indexes of our driver's slices (duplicates show twice)."""
    layout: dict[str, list[int]] = {}
    for obj in emu.list(V1, "ResourceSlice"):
        index = slice_index(obj["metadata"]["name"], DRIVER)
        assert index is not None
        layout.setdefault(obj["spec"]["pool"]["name"], []).append(index)
    return {name: sorted(indexes) for name, indexes in layout.items()}


def slice_writes(emu: KubeEmulator) -> Counter[str]:
    return Counter(r.method for r in emu.writes("resourceslices"))


async def publish(publisher: Publisher, desired: dict[str, DesiredPool]) -> None:
    publisher.set_desired(desired)
    await publisher.wait_idle(20)


async def assert_second_sync_writes_nothing(emu: KubeEmulator, publisher: Publisher) -> None:
    before = slice_writes(emu)
    publisher.resync_all()
    await publisher.wait_idle(20)
    # Late watch events (of the writes before the resync) must not start writes either.
    await publisher_caught_up(emu, publisher)
    assert slice_writes(emu) == before


@pytest.mark.parametrize("delayed", ["POST", "PUT", "DELETE"])
async def test_write_answers_after_their_watch_events_change_nothing(
    emu: KubeEmulator,
    client: KubeClient,
    delayed: str,
) -> None:
    first = desired_pools(gpus(130, "rack-1") + gpus(3, "rack-2"), CONFIG)
    emu.delay_responses(0.3, method=delayed, path_regex="resourceslices")
    async with publishing(client) as publisher:
        await publish(publisher, first)
        # Grow (POST), change (PUT) and shrink (DELETE) one pool each.
        changed = desired_pools(gpus(3, "rack-1") + gpus(200, "rack-2"), CONFIG)
        await publish(publisher, changed)
        assert pool_layout(emu) == {"us-east/rack-1": [0], "us-east/rack-2": [0, 1]}
        await assert_second_sync_writes_nothing(emu, publisher)
    assert not publisher.status().pools["us-east/rack-1"].last_error


async def test_a_replayed_old_slice_event_starts_no_write(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    desired = desired_pools(gpus(3, "rack-1"), CONFIG)
    async with publishing(client) as publisher:
        await publish(publisher, desired)
        (name,) = [o["metadata"]["name"] for o in emu.list(V1, "ResourceSlice")]
        current = emu.get(V1, "ResourceSlice", name)
        assert current is not None
        current["metadata"]["labels"] = {"touched": "yes"}
        emu.update(current)  # someone else's harmless change: a newer version
        await publisher_caught_up(emu, publisher)
        before = slice_writes(emu)
        emu.replay_event("resourceslices", name)
        # A write the publisher does not watch moves the store past the replayed event: once
        # the watch is past it too, the replayed event has been handled.
        emu.create(other_driver_slice("unrelated"))
        await publisher_caught_up(emu, publisher)
        assert slice_writes(emu) == before
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_publishing_through_expired_watches_converges(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    async with publishing(client) as publisher:
        await eventually(lambda: emu.open_watches >= 1, what="the publisher's watch")

        async def expire_repeatedly() -> None:
            for _ in range(5):
                emu.expire_watches()
                await asyncio.sleep(0.05)

        expiring = asyncio.create_task(expire_repeatedly())
        await publish(publisher, desired_pools(gpus(300, "rack-1") + gpus(5, "rack-2"), CONFIG))
        await expiring
        await publisher.wait_idle(20)
        assert pool_layout(emu) == {"us-east/rack-1": [0, 1, 2], "us-east/rack-2": [0]}
        await assert_second_sync_writes_nothing(emu, publisher)
