"""Publishing to a Kubernetes 1.31 API server (resource.k8s.io/v1alpha3 only), as the
control-plane mode needs: the ``basic`` shape, plain capacities, no binding conditions or
taints (unhealthy devices are withheld)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from test_publisher import (
    DRIVER,
    assert_second_sync_writes_nothing,
    fast_settings,
    gpus,
    pools,
    publish,
)

from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from app.kube.versions import ResourceApiVersion
from app.pools import PoolConfig
from app.publisher import Publisher
from fabric_dra_sim.kubeapi import KubeEmulator

V1ALPHA3 = "resource.k8s.io/v1alpha3"
CONFIG = PoolConfig(driver_name=DRIVER, binds_to_node=False, taints_supported=False)


@pytest.fixture
async def cluster_131() -> AsyncIterator[tuple[KubeEmulator, KubeClient]]:
    emu = KubeEmulator(
        served_resource_versions=("v1alpha3",), git_version="v1.31.4", bookmark_interval_s=0.2
    )
    await emu.start()
    client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emu.url))
    yield emu, client
    await client.close()
    await emu.stop()


async def test_v1alpha3_slices_are_published_validated_and_kept_in_sync(
    cluster_131: tuple[KubeEmulator, KubeClient],
) -> None:
    emu, client = cluster_131
    publisher = Publisher(client, ResourceApiVersion.V1ALPHA3, DRIVER, fast_settings())
    await publisher.start()
    try:
        desired = pools(gpus(130, unhealthy=[3]), gpus(4, rack="rack-2"), config=CONFIG)
        await publish(publisher, desired)
        stored = [s for s in emu.list(V1ALPHA3, "ResourceSlice") if s["spec"]["driver"] == DRIVER]
        assert sorted((s["spec"]["pool"]["name"], len(s["spec"]["devices"])) for s in stored) == [
            ("us-east/rack-1", 1),
            ("us-east/rack-1", 128),
            ("us-east/rack-2", 4),
        ]
        device = stored[0]["spec"]["devices"][0]
        assert set(device) == {"name", "basic"}
        assert "bindsToNode" not in device["basic"] and "taints" not in device["basic"]
        assert device["basic"]["capacity"]["memory"] == "80Gi"
        names = {d["name"] for s in stored for d in s["spec"]["devices"]}
        assert "gpu-us-east-rack-1-0003" not in names  # withheld: Critical, no taints here
        await assert_second_sync_writes_nothing(emu, publisher)
    finally:
        await publisher.stop()
