"""The publisher against the Kubernetes API emulator over real HTTP.

Generation convention checked here: a new pool is published at generation 1 (the highest
existing generation, 0 when there is none, plus one). Every test ends with a full resync that
must write nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
from builders import publisher_caught_up
from prometheus_client import CollectorRegistry

from app.fabric.types import Location
from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from app.kube.informer import InformerSettings
from app.kube.versions import ResourceApiVersion
from app.pools import DesiredPool, PoolConfig, PoolDevice, desired_pools, resource_slice_spec
from app.publisher.metrics import PublisherMetrics
from app.publisher.plan import slice_index
from app.publisher.publisher import Publisher
from app.publisher.settings import PublisherSettings
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on

DRIVER = "fabric.example.com"
OTHER = "other.example.com"
CONFIG = PoolConfig(driver_name=DRIVER)
V1 = "resource.k8s.io/v1"


def fast_settings(**changes: Any) -> PublisherSettings:
    values: dict[str, Any] = {
        "debounce_s": 0.01,
        "workers": 4,
        "retry_base_s": 0.02,
        "retry_max_s": 0.2,
        "request_timeout_s": 5.0,
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


def gpus(
    count: int,
    *,
    rack: str = "rack-1",
    region: str = "us-east",
    unhealthy: Sequence[int] = (),
    warning: Sequence[int] = (),
) -> list[PoolDevice]:
    return [
        PoolDevice(
            name=f"gpu-{region}-{rack}-{i:04d}",
            device_type="gpu",
            location=Location(region=region, rack=rack),
            vendor="Example",
            model="X100",
            memory_mib=81920,
            health="Critical" if i in unhealthy else "Warning" if i in warning else "OK",
        )
        for i in range(count)
    ]


def pools(*groups: list[PoolDevice], config: PoolConfig = CONFIG) -> dict[str, DesiredPool]:
    return desired_pools([d for group in groups for d in group], config)


# The publisher writes taints and binding conditions, which Kubernetes 1.34 keeps behind
# alpha gates that are off by default: these emulators turn every DRA gate on, as the shared
# ``emu`` (with ``client`` on it) of tests/integration/conftest.py does.
GATES = all_gates_on("1.34")


@contextlib.asynccontextmanager
async def running(
    client: KubeClient,
    *,
    version: ResourceApiVersion = ResourceApiVersion.V1,
    metrics: PublisherMetrics | None = None,
    **changes: Any,
) -> AsyncIterator[Publisher]:
    publisher = Publisher(client, version, DRIVER, fast_settings(**changes), metrics)
    await publisher.start()
    try:
        yield publisher
    finally:
        await publisher.stop()


def slices(emu: KubeEmulator, driver: str = DRIVER, api_version: str = V1) -> list[dict[str, Any]]:
    return [o for o in emu.list(api_version, "ResourceSlice") if o["spec"]["driver"] == driver]


def writes(emu: KubeEmulator) -> Counter[str]:
    return Counter(r.method for r in emu.writes("resourceslices"))


async def publish(publisher: Publisher, desired: dict[str, DesiredPool]) -> None:
    publisher.set_desired(desired)
    await publisher.wait_idle(20)


async def assert_second_sync_writes_nothing(emu: KubeEmulator, publisher: Publisher) -> None:
    before = len(emu.writes("resourceslices"))
    publisher.resync_all()
    await publisher.wait_idle(20)
    assert len(emu.writes("resourceslices")) == before


def assert_matches(
    emu: KubeEmulator, desired: dict[str, DesiredPool], api_version: str = V1
) -> dict[str, int]:
    """The emulator holds exactly the desired slices of our driver; returns pool generations."""
    by_pool: dict[str, dict[int, dict[str, Any]]] = {}
    for obj in slices(emu, api_version=api_version):
        index = slice_index(obj["metadata"]["name"], DRIVER)
        assert index is not None, obj["metadata"]["name"]
        found = by_pool.setdefault(obj["spec"]["pool"]["name"], {})
        assert index not in found
        found[index] = obj
    assert set(by_pool) == set(desired)
    generations = {}
    for name, pool in desired.items():
        found = by_pool[name]
        assert sorted(found) == list(range(len(pool.slices)))
        (generation,) = {o["spec"]["pool"]["generation"] for o in found.values()}
        if api_version == V1:
            for content in pool.slices:
                assert found[content.index]["spec"] == resource_slice_spec(
                    DRIVER, pool, content, generation
                )
        generations[name] = generation
    return generations


# --------------------------------------------------------------------------- publishing
async def test_first_publish_creates_one_slice_per_128_devices_at_generation_1(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    withhold = replace(CONFIG, unhealthy="withhold")
    desired = pools(
        gpus(10, rack="rack-1"),
        gpus(200, rack="rack-2"),
        gpus(2, rack="rack-3", unhealthy=[0, 1]),
        config=withhold,
    )
    assert [len(p.slices) for p in desired.values()] == [1, 2, 1]
    registry = CollectorRegistry()
    async with running(client, metrics=PublisherMetrics.create(registry)) as publisher:
        await publish(publisher, desired)
        assert assert_matches(emu, desired) == dict.fromkeys(desired, 1)
        assert writes(emu) == {"POST": 4}
        rack2 = [o for o in slices(emu) if o["spec"]["pool"]["name"] == "us-east/rack-2"]
        assert sorted(o["metadata"]["name"][: len(DRIVER) + 3] for o in rack2) == [
            f"0-{DRIVER}-",
            f"1-{DRIVER}-",
        ]
        assert {o["spec"]["pool"]["resourceSliceCount"] for o in rack2} == {2}
        assert rack2[0]["spec"]["nodeSelector"] == {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "fabric-dra.io/region", "operator": "In", "values": ["us-east"]},
                        {"key": "fabric-dra.io/rack", "operator": "In", "values": ["rack-2"]},
                    ]
                }
            ]
        }
        empty = [o for o in slices(emu) if o["spec"]["pool"]["name"] == "us-east/rack-3"]
        assert len(empty) == 1 and not empty[0]["spec"].get("devices")
        status = publisher.status()
        assert status.synced and status.writes == {"create": 4}
        assert status.pools["us-east/rack-2"].generation == 1
        assert status.pools["us-east/rack-2"].devices == 200
        assert len(status.pools["us-east/rack-2"].resource_slices) == 2
        assert (
            registry.get_sample_value(
                "fabric_dra_publisher_api_writes_total", {"verb": "create", "result": "ok"}
            )
            == 4
        )
        assert registry.get_sample_value("fabric_dra_publisher_pool_sync_seconds_count") == 3
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_one_attribute_change_is_one_update_without_a_generation_bump(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    async with running(client) as publisher:
        await publish(publisher, pools(gpus(200)))
        before = writes(emu)
        changed = pools(gpus(200, warning=[150]))
        await publish(publisher, changed)
        assert writes(emu) - before == {"PUT": 1}
        assert assert_matches(emu, changed) == {"us-east/rack-1": 1}
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_growth_past_128_devices_adds_a_slice_and_rewrites_the_pool(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    async with running(client) as publisher:
        await publish(publisher, pools(gpus(100)))
        before = writes(emu)
        grown = pools(gpus(130))
        await publish(publisher, grown)
        assert writes(emu) - before == {"PUT": 1, "POST": 1}
        assert assert_matches(emu, grown) == {"us-east/rack-1": 2}
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_a_removed_pool_loses_its_slices_and_others_are_untouched(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    async with running(client) as publisher:
        await publish(publisher, pools(gpus(200, rack="rack-1"), gpus(5, rack="rack-2")))
        before = writes(emu)
        remaining = pools(gpus(5, rack="rack-2"))
        await publish(publisher, remaining)
        assert writes(emu) - before == {"DELETE": 2}
        assert assert_matches(emu, remaining) == {"us-east/rack-2": 1}
        assert "us-east/rack-1" not in publisher.status().pools
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_slices_of_another_driver_are_never_touched(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    foreign = emu.create(
        {
            "apiVersion": V1,
            "kind": "ResourceSlice",
            "metadata": {"name": f"0-{DRIVER}-other"},
            "spec": {
                "driver": OTHER,
                "allNodes": True,
                "pool": {"name": "us-east/rack-1", "generation": 7, "resourceSliceCount": 3},
            },
        }
    )
    async with running(client) as publisher:
        await publish(publisher, pools(gpus(10)))
        await publish(publisher, {})
        assert slices(emu) == []
        assert writes(emu) == {"POST": 1, "DELETE": 1}
        assert slices(emu, OTHER) == [foreign]
        await assert_second_sync_writes_nothing(emu, publisher)


# --------------------------------------------------------------------------- adoption
async def test_a_new_publisher_adopts_matching_slices_without_writing(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    desired = pools(gpus(300, rack="rack-1"), gpus(3, rack="rack-2", unhealthy=[1]))
    async with running(client) as first:
        await publish(first, desired)
    before = writes(emu)
    async with running(client) as second:
        await publish(second, desired)
        assert writes(emu) == before
        assert second.status().pools["us-east/rack-1"].generation == 1
        await assert_second_sync_writes_nothing(emu, second)


async def test_leftovers_of_an_earlier_layout_are_adopted_or_deleted(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    desired = pools(gpus(200))
    pool = desired["us-east/rack-1"]

    def leftover(
        name: str, index: int, generation: int, count: int, pool_name: str = pool.name
    ) -> None:
        spec = resource_slice_spec(DRIVER, pool, pool.slices[index], generation)
        spec["pool"] = {"name": pool_name, "generation": generation, "resourceSliceCount": count}
        emu.create(
            {"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}
        )

    leftover(f"0-{DRIVER}-keep0", 0, 5, 2)  # in sync: adopted as is
    leftover(f"0-{DRIVER}-dupe0", 0, 4, 2)  # duplicate index 0: deleted
    leftover(f"1-{DRIVER}-count", 1, 5, 3)  # wrong count: rewritten
    leftover("old-style-name", 1, 5, 2)  # no index: deleted
    leftover(f"4-{DRIVER}-extra", 1, 5, 5)  # index beyond the pool: deleted
    leftover(f"0-{DRIVER}-gone0", 0, 1, 1, pool_name="us-west/rack-9")  # pool gone: deleted
    async with running(client) as publisher:
        await publish(publisher, desired)
        assert writes(emu) == {"DELETE": 4, "PUT": 1}
        assert assert_matches(emu, desired) == {"us-east/rack-1": 5}
        assert {o["metadata"]["name"] for o in slices(emu)} == {
            f"0-{DRIVER}-keep0",
            f"1-{DRIVER}-count",
        }
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_nothing_is_deleted_before_the_desired_state_is_known(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    spec = resource_slice_spec(
        DRIVER, pools(gpus(1))["us-east/rack-1"], pools(gpus(1))["us-east/rack-1"].slices[0], 1
    )
    emu.create(
        {
            "apiVersion": V1,
            "kind": "ResourceSlice",
            "metadata": {"name": f"0-{DRIVER}-stale"},
            "spec": spec,
        }
    )
    async with running(client) as publisher:
        await asyncio.sleep(0.3)
        assert writes(emu) == {} and not publisher.idle()
        await publish(publisher, {})
        assert writes(emu) == {"DELETE": 1} and slices(emu) == []
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_a_slice_changed_by_someone_else_is_written_back(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    desired = pools(gpus(20))
    async with running(client) as publisher:
        await publish(publisher, desired)
        (obj,) = slices(emu)
        obj["spec"]["devices"] = obj["spec"]["devices"][:5]
        emu.update(obj)
        await publisher_caught_up(emu, publisher)
        assert assert_matches(emu, desired) == {"us-east/rack-1": 1}
        (other,) = slices(emu)
        emu.delete(V1, "ResourceSlice", other["metadata"]["name"])
        await publisher_caught_up(emu, publisher)
        assert assert_matches(emu, desired) == {"us-east/rack-1": 2}
        await assert_second_sync_writes_nothing(emu, publisher)


# --------------------------------------------------------------------------- faults
async def test_conflicts_on_update_are_re_read_and_converge(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    async with running(client) as publisher:
        await publish(publisher, pools(gpus(300)))
        emu.fail_next(2, method="PUT", path_regex="resourceslices", status=409)
        changed = pools(gpus(300, warning=[1]))
        await publish(publisher, changed)
        assert writes(emu)["PUT"] == 3  # two refused, one accepted
        assert assert_matches(emu, changed) == {"us-east/rack-1": 1}
        assert publisher.status().pools["us-east/rack-1"].last_error is None
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_a_real_conflict_from_a_concurrent_writer_converges(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    async with running(client, debounce_s=0.3) as publisher:
        await publish(publisher, pools(gpus(10)))
        (obj,) = slices(emu)
        changed = pools(gpus(10, warning=[3]))
        publisher.set_desired(changed)
        # Someone else writes the slice while our update waits for its debounce: our PUT
        # carries a stale resourceVersion, gets 409, and is planned again from a fresh read.
        obj["metadata"]["labels"] = {"touched": "yes"}
        emu.update(obj)
        await publisher.wait_idle(20)
        assert assert_matches(emu, changed) == {"us-east/rack-1": 1}
        (final,) = slices(emu)
        assert final["metadata"]["labels"] == {"touched": "yes"}
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_throttling_honours_retry_after(emu: KubeEmulator, client: KubeClient) -> None:
    async with running(client) as publisher:
        emu.fail_next(1, method="POST", path_regex="resourceslices", status=429, retry_after=1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        desired = pools(gpus(5))
        await publish(publisher, desired)
        assert loop.time() - started >= 1.0
        assert assert_matches(emu, desired) == {"us-east/rack-1": 1}
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_server_errors_are_retried_with_backoff(
    emu: KubeEmulator, client: KubeClient
) -> None:
    async with running(client) as publisher:
        emu.fail_next(3, method="POST", path_regex="resourceslices", status=500)
        desired = pools(gpus(5))
        await publish(publisher, desired)
        assert assert_matches(emu, desired) == {"us-east/rack-1": 1}
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_a_permanent_error_is_reported_and_not_retried(
    emu: KubeEmulator, client: KubeClient
) -> None:
    async with running(client) as publisher:
        emu.fail_next(1, method="POST", path_regex="resourceslices", status=403)
        await publish(publisher, pools(gpus(5)))
        assert writes(emu) == {"POST": 1} and slices(emu) == []
        error = publisher.status().pools["us-east/rack-1"].last_error
        assert (
            error is not None
            and "pool 'us-east/rack-1' slice 0: create ResourceSlice" in error
            and "403" in error
        )
        publisher.resync_all()
        await publisher.wait_idle(20)
        assert assert_matches(emu, pools(gpus(5))) == {"us-east/rack-1": 1}
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_watch_expiry_and_cut_watches_during_publishing_converge(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    async with running(client) as publisher:
        await publish(publisher, pools(*(gpus(130, rack=f"rack-{k}") for k in range(6))))
        bigger = pools(*(gpus(260, rack=f"rack-{k}") for k in range(6)))
        publisher.set_desired(bigger)
        for _ in range(5):
            emu.compact()
            await emu.close_watches()
            await asyncio.sleep(0.02)
        await publisher.wait_idle(20)
        await publisher_caught_up(emu, publisher)  # the informer has re-listed
        assert set(assert_matches(emu, bigger).values()) == {2}
        await assert_second_sync_writes_nothing(emu, publisher)


# --------------------------------------------------------------------------- dropped fields
async def test_dropped_taints_are_reported_once_and_not_rewritten(
    emu: KubeEmulator,
    client: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    emu.drop_fields("resourceslices", ["spec.devices[].taints"])
    registry = CollectorRegistry()
    caplog.set_level(logging.WARNING, logger="app.publisher.publisher")
    async with running(client, metrics=PublisherMetrics.create(registry)) as publisher:
        await publish(
            publisher, pools(gpus(10, unhealthy=[2]), gpus(3, rack="rack-2", unhealthy=[0]))
        )
        assert writes(emu) == {"POST": 2}
        status = publisher.status()
        assert status.dropped_paths == ("spec.devices[].taints",)
        assert status.taints_dropped and not status.binding_conditions_dropped
        assert status.pools["us-east/rack-1"].dropped_paths == ("spec.devices[].taints",)
        assert (
            registry.get_sample_value(
                "fabric_dra_publisher_dropped_fields", {"path": "spec.devices[].taints"}
            )
            == 1
        )
        warnings = [r for r in caplog.records if "dropped" in r.getMessage()]
        assert len(warnings) == 1
        await assert_second_sync_writes_nothing(emu, publisher)
        # The service then withholds unhealthy devices instead of tainting them.
        withheld = pools(
            gpus(10, unhealthy=[2]),
            gpus(3, rack="rack-2", unhealthy=[0]),
            config=replace(CONFIG, taints_supported=False),
        )
        await publish(publisher, withheld)
        assert assert_matches(emu, withheld) == {"us-east/rack-1": 1, "us-east/rack-2": 1}
        await assert_second_sync_writes_nothing(emu, publisher)


async def test_a_1_34_cluster_with_its_default_gates_drops_taints_and_binding_fields() -> None:
    # DRADeviceTaints and DRADeviceBindingConditions are alpha, off by default, in 1.34: the
    # server drops those fields silently and the publisher must notice without looping.
    emulator = KubeEmulator(kubernetes_version="1.34", bookmark_interval_s=0.2)
    await emulator.start()
    kube = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emulator.url))
    try:
        async with running(kube) as publisher:
            await publish(publisher, pools(gpus(10, unhealthy=[2])))
            assert writes(emulator) == {"POST": 1}
            assert publisher.taints_dropped and publisher.binding_conditions_dropped
            assert {
                "spec.devices[].taints",
                "spec.devices[].bindsToNode",
                "spec.devices[].bindingConditions",
            } <= publisher.dropped_paths
            stored = slices(emulator)[0]["spec"]["devices"]
            assert not any({"taints", "bindsToNode", "bindingConditions"} & set(d) for d in stored)
            await assert_second_sync_writes_nothing(emulator, publisher)
    finally:
        await kube.close()
        await emulator.stop()


async def test_dropped_binding_conditions_are_detected_without_a_write_loop(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    emu.drop_fields(
        "resourceslices",
        ["spec.devices[].bindingConditions", "spec.devices[].bindingFailureConditions"],
    )
    async with running(client) as publisher:
        await publish(publisher, pools(gpus(200)))
        assert writes(emu) == {"POST": 2}
        assert publisher.binding_conditions_dropped and not publisher.taints_dropped
        assert publisher.dropped_paths == {
            "spec.devices[].bindingConditions",
            "spec.devices[].bindingFailureConditions",
        }
        stored = slices(emu)[0]["spec"]["devices"][0]
        assert "bindingConditions" not in stored and stored["bindsToNode"] is True
        await assert_second_sync_writes_nothing(emu, publisher)


# --------------------------------------------------------------------------- versions
async def test_a_v1beta2_server_gets_the_v1_json() -> None:
    emulator = KubeEmulator(
        served_resource_versions=("v1beta2",), feature_gates=GATES, bookmark_interval_s=0.2
    )
    await emulator.start()
    kube = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emulator.url))
    try:
        desired = pools(gpus(130, unhealthy=[4]))
        async with running(kube, version=ResourceApiVersion.V1BETA2) as publisher:
            await publish(publisher, desired)
            stored = emulator.list("resource.k8s.io/v1beta2", "ResourceSlice")
            assert len(stored) == 2 and "attributes" in stored[0]["spec"]["devices"][0]
            assert not publisher.dropped_paths
            await assert_second_sync_writes_nothing(emulator, publisher)
    finally:
        await kube.close()
        await emulator.stop()


async def test_a_v1beta1_server_gets_the_basic_shape() -> None:
    emulator = KubeEmulator(
        served_resource_versions=("v1beta1",), feature_gates=GATES, bookmark_interval_s=0.2
    )
    await emulator.start()
    kube = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emulator.url))
    try:
        desired = pools(gpus(130, unhealthy=[4]))
        async with running(kube, version=ResourceApiVersion.V1BETA1) as publisher:
            await publish(publisher, desired)
            stored = emulator.list("resource.k8s.io/v1beta1", "ResourceSlice")
            assert len(stored) == 2
            first = stored[0]["spec"]["devices"][0]
            assert set(first) == {"name", "basic"} and "attributes" in first["basic"]
            assert assert_matches(emulator, desired, "resource.k8s.io/v1beta1") == {
                "us-east/rack-1": 1
            }
            assert not publisher.dropped_paths
            await assert_second_sync_writes_nothing(emulator, publisher)
    finally:
        await kube.close()
        await emulator.stop()


async def test_a_restart_on_a_server_that_drops_taints_rewrites_each_tainted_slice_once(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    emu.drop_fields("resourceslices", ["spec.devices[].taints"])
    desired = pools(gpus(10, unhealthy=[2]), gpus(5, rack="rack-2"))
    async with running(client) as first:
        await publish(first, desired)
    before = writes(emu)
    async with running(client) as second:
        # The new publisher has not yet seen the server drop anything: the one slice whose
        # desired form has taints is written once, the drop is learnt, and nothing more.
        await publish(second, desired)
        assert writes(emu) - before == {"PUT": 1}
        assert second.taints_dropped
        await assert_second_sync_writes_nothing(emu, second)
