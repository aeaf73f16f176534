"""Benchmark: first publish of N devices as ResourceSlices to the Kubernetes API emulator (its
own process), then a resync with no change, then a new publisher adopting what is there.

Measures, per size: time and API writes of the first publish against the minimum possible (one
create per slice), the no-change resync (writes: the target is 0; time; CPU), a single device
changed among them (writes: the target is exactly 1), the adoption by a restarted publisher
(writes: the target is 0; time), this process's peak resident memory, and the CPU per published
device in reference units (see ``bench.common.reference_cpu_seconds``). Run one size per
process for a true peak memory figure (the peak only ever grows).

    python -m bench.publish [--devices 1000 10000] [--large] [--devices-per-rack 256]
        [--json out.json]
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from app.fabric.types import Location
from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from app.kube.informer import InformerSettings
from app.kube.versions import ResourceApiVersion
from app.pools import DesiredPool, PoolConfig, PoolDevice, desired_pools, pool_name
from app.publisher.publisher import Publisher
from app.publisher.settings import PublisherSettings
from bench.common import (
    at_least,
    command_line,
    cpu_seconds,
    kube_emulator_process,
    peak_rss_mib,
    reference_cpu_seconds,
    reference_units,
    run_benchmark,
    write_figures,
)

DRIVER = "fabric.example.com"
TIMEOUT_S = 3600.0


def make_devices(devices: int, per_rack: int) -> list[PoolDevice]:
    """``devices`` GPUs in racks of ``per_rack``, over two regions; 1 in 50 unhealthy."""
    return [
        PoolDevice(
            name=f"gpu-{i:06d}",
            device_type="gpu",
            location=Location(
                region=f"region-{(i // per_rack) % 2}", rack=f"rack-{i // per_rack:04d}"
            ),
            vendor="Example",
            model="X100",
            serial=f"SN{i:08d}",
            uuid=f"00000000-0000-4000-8000-{i:012d}",
            firmware_version="1.2.3",
            memory_mib=81920,
            health="Critical" if i % 50 == 7 else "OK",
        )
        for i in range(devices)
    ]


def make_pools(items: list[PoolDevice]) -> dict[str, DesiredPool]:
    """The desired pools of ``items``, as the service computes them."""
    return desired_pools(items, PoolConfig(driver_name=DRIVER))


def settings(workers: int) -> PublisherSettings:
    return PublisherSettings(
        debounce_s=0.05,
        workers=workers,
        write_concurrency=8,
        request_timeout_s=120.0,
        informer=InformerSettings(name="resourceslices", page_size=50, list_timeout_s=600.0),
    )


async def timed_sync(publisher: Publisher, action: Any) -> tuple[float, float, int]:
    """Run ``action``, wait until idle; return (seconds, CPU seconds, writes made)."""
    before = sum(publisher.status().writes.values())
    cpu0, started = cpu_seconds(), time.perf_counter()
    action()
    await publisher.wait_idle(TIMEOUT_S)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu0
    return seconds, cpu, sum(publisher.status().writes.values()) - before


async def measure(devices: int, per_rack: int, workers: int) -> dict[str, Any]:
    """Run the benchmark for ``devices`` devices; return its figures."""
    reference = reference_cpu_seconds()
    items = make_devices(devices, per_rack)
    pools = make_pools(items)
    # One device among them turns unhealthy: its slice alone must be rewritten. Its pool is
    # laid out again; the other pools stay the same objects, as nothing about them changed.
    before = items[len(items) // 2]
    after = replace(before, health="Warning")
    keys = PoolConfig(driver_name=DRIVER).grouping_keys
    home = pool_name(before.location, keys)
    changed_pools = {
        **pools,
        **make_pools(
            [after if d is before else d for d in items if pool_name(d.location, keys) == home]
        ),
    }
    del items
    slice_count = sum(len(p.slices) for p in pools.values())
    async with kube_emulator_process(["--history-size", "200000"]) as url:
        client: KubeClient = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=url))
        try:
            publisher = Publisher(client, ResourceApiVersion.V1, DRIVER, settings(workers))
            await publisher.start()
            try:
                first = await timed_sync(publisher, partial(publisher.set_desired, pools))
                resync = await timed_sync(publisher, publisher.resync_all)
                change = await timed_sync(publisher, partial(publisher.set_desired, changed_pools))
                await timed_sync(publisher, partial(publisher.set_desired, pools))
            finally:
                await publisher.stop()
            del publisher  # the restarted publisher starts from nothing, as after a restart
            adopter = Publisher(client, ResourceApiVersion.V1, DRIVER, settings(workers))
            cpu0, started = cpu_seconds(), time.perf_counter()
            await adopter.start()
            try:
                adopt = await timed_sync(adopter, partial(adopter.set_desired, pools))
                adopt_seconds = time.perf_counter() - started
                adopt_cpu = cpu_seconds() - cpu0
            finally:
                await adopter.stop()
        finally:
            await client.close()
    return {
        "benchmark": "publish",
        "devices": devices,
        "pools": len(pools),
        "slices": slice_count,
        "first_publish_seconds": round(first[0], 3),
        "first_publish_cpu_seconds": round(first[1], 3),
        "first_publish_writes": first[2],
        "minimum_writes": slice_count,
        "nochange_resync_seconds": round(resync[0], 3),
        "nochange_resync_cpu_seconds": round(resync[1], 3),
        "nochange_resync_writes": resync[2],
        "one_change_seconds": round(change[0], 3),
        "one_change_cpu_seconds": round(change[1], 3),
        "one_change_writes": change[2],
        "restart_adopt_seconds": round(adopt_seconds, 3),
        "restart_adopt_cpu_seconds": round(adopt_cpu, 3),
        "restart_adopt_writes": adopt[2],
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "reference_cpu_seconds": round(reference, 4),
        "first_publish_ref_units_per_1000_devices": round(
            reference_units(first[1], reference) / devices * 1000, 3
        ),
        "nochange_resync_ref_units": round(reference_units(resync[1], reference), 3),
    }


def main() -> None:
    parser = command_line(__doc__, "bench.publish")
    parser.add_argument(
        "--devices",
        type=at_least(2),
        nargs="+",
        default=[1000, 10000],
        help="sizes to publish, each in turn (at least 2 devices)",
    )
    parser.add_argument("--large", action="store_true", help="also run 100,000 devices")
    parser.add_argument(
        "--devices-per-rack",
        type=at_least(1),
        default=256,
        help="devices per pool (default 256: two slices a pool)",
    )
    parser.add_argument("--workers", type=at_least(1), default=16, help="pools synced at once")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    options = parser.parse_args()
    sizes = [*options.devices, *([100_000] if options.large else [])]
    results = [
        run_benchmark(measure(size, options.devices_per_rack, options.workers)) for size in sizes
    ]
    write_figures(options.json, results)


if __name__ == "__main__":
    main()
