"""The publisher against an API emulator that answers canonical values and stamps taints'
``timeAdded`` as kube-apiserver does: no rewrite on resync or restart, and an unchanged taint
keeps the time the server gave it when its slice is updated for another reason."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from app.fabric.types import Location
from app.kube.client import KubeClient
from app.kube.informer import InformerSettings
from app.kube.versions import ResourceApiVersion
from app.pools import DesiredPool, PoolConfig, PoolDevice, desired_pools
from app.publisher.publisher import Publisher
from app.publisher.settings import PublisherSettings
from fabric_dra_sim.kubeapi import KubeEmulator

DRIVER = "fabric.example.com"
V1 = "resource.k8s.io/v1"
OLD = "2020-01-01T00:00:00Z"
CONFIG = PoolConfig(driver_name=DRIVER)


def settings() -> PublisherSettings:
    return PublisherSettings(
        debounce_s=0.01,
        workers=2,
        retry_base_s=0.02,
        retry_max_s=0.2,
        request_timeout_s=5.0,
        informer=InformerSettings(
            name="resourceslices",
            watch_timeout_s=5.0,
            watch_timeout_jitter=0.2,
            client_timeout_margin_s=2.0,
            list_timeout_s=5.0,
            backoff_initial_s=0.02,
            backoff_max_s=0.1,
        ),
    )


def desired(
    *, unhealthy: tuple[int, ...] = (0,), memory_mib: int = 81920
) -> dict[str, DesiredPool]:
    return desired_pools(
        [
            PoolDevice(
                name=f"gpu-{i:04d}",
                device_type="gpu",
                location=Location(region="us-east", rack="rack-1"),
                vendor="Example",
                model="X100",
                memory_mib=memory_mib if i == 2 else 81920,
                health="Critical" if i in unhealthy else "OK",
            )
            for i in range(3)
        ],
        CONFIG,
    )


# ``emu`` (Kubernetes 1.34, every DRA gate on) and ``client`` are in
# tests/integration/conftest.py.


@contextlib.asynccontextmanager
async def running(kube: KubeClient) -> AsyncIterator[Publisher]:
    publisher = Publisher(kube, ResourceApiVersion.V1, DRIVER, settings(), None)
    await publisher.start()
    try:
        yield publisher
    finally:
        await publisher.stop()


def the_slice(emu: KubeEmulator) -> dict[str, Any]:
    (obj,) = [o for o in emu.list(V1, "ResourceSlice") if o["spec"]["driver"] == DRIVER]
    return obj


def taint_time(obj: dict[str, Any], device: int) -> str | None:
    taints = obj["spec"]["devices"][device].get("taints") or [{}]
    value = taints[0].get("timeAdded")
    return value if isinstance(value, str) else None


async def publish(publisher: Publisher, pools: dict[str, DesiredPool]) -> None:
    publisher.set_desired(pools)
    await publisher.wait_idle(20)


async def resync_writes_nothing(emu: KubeEmulator, publisher: Publisher) -> None:
    before = len(emu.writes("resourceslices"))
    publisher.resync_all()
    await publisher.wait_idle(20)
    assert len(emu.writes("resourceslices")) == before


async def age_the_taint(emu: KubeEmulator) -> None:
    """Set the stored taint's time to OLD, as if the taint had been there for years."""
    obj = the_slice(emu)
    obj["spec"]["devices"][0]["taints"][0]["timeAdded"] = OLD
    emu.update(obj)


async def test_a_stamped_taint_and_canonical_values_cause_no_rewrite(
    emu: KubeEmulator, client: KubeClient
) -> None:
    async with running(client) as publisher:
        await publish(publisher, desired())
        assert taint_time(the_slice(emu), 0) is not None
        await resync_writes_nothing(emu, publisher)
    # A new publisher knows nothing of earlier writes: it compares with what the server holds.
    async with running(client) as publisher:
        await publish(publisher, desired())
        await resync_writes_nothing(emu, publisher)


async def test_an_unchanged_taint_keeps_its_time_when_its_slice_is_updated(
    emu: KubeEmulator, client: KubeClient
) -> None:
    async with running(client) as publisher:
        await publish(publisher, desired())
        await age_the_taint(emu)
        await publisher.wait_idle(20)
        await resync_writes_nothing(emu, publisher)
        await publish(publisher, desired(memory_mib=40960))  # another device changes
        updated = the_slice(emu)
        assert updated["spec"]["devices"][2]["capacity"]["memory"]["value"] == "40Gi"
        assert taint_time(updated, 0) == OLD
        await resync_writes_nothing(emu, publisher)


async def test_a_new_taint_gets_the_servers_current_time(
    emu: KubeEmulator, client: KubeClient
) -> None:
    async with running(client) as publisher:
        await publish(publisher, desired())
        await age_the_taint(emu)
        await publisher.wait_idle(20)
        await publish(publisher, desired(unhealthy=(0, 1)))
        updated = the_slice(emu)
        assert taint_time(updated, 0) == OLD
        stamped = taint_time(updated, 1)
        assert stamped is not None and stamped > OLD
        await resync_writes_nothing(emu, publisher)
