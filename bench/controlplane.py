"""Benchmark: allocations per second of the control-plane (classic DRA) mode, end to end.

The Kubernetes API emulator runs in its own process serving only resource.k8s.io/v1alpha3, the
classic scheduler stand-in in another (``bench.classic_scheduler``); this process runs the
control-plane controller and a fabric backend that answers at once (in memory). 10,000 devices
(GPUs and FPGAs, several models and firmware versions) in 80 racks of 125 devices over 4
regions are inventoried into a SQLite database and published as one v1alpha3 ResourceSlice per
rack (the slice selects the rack's nodes); each rack has one server (one node). Each pod has
one claim (``spec.controller`` set) for a GPU of class ``gpu`` (CEL: driver, type and a memory
threshold) with a request selector on the model and a firmware version comparison. Pods are
created ``--in-flight`` at a time until ``--pods`` are bound, after ``--warmup`` pods that are
not measured (the first contexts build the pools from the slices and fill the CEL selector
cache: a one-time cost, reported apart); allocated devices stay in use.

One allocation is the whole protocol: scheduling context created, every claim answered for
every potential node (the allocator runs once per node), node selected, finalizer, journal
reservation, allocation written, attach through the backend, pod bound, context deleted.

Prints JSON lines: setup figures, then allocations/s, p50/p99 time from pod creation to bind,
API requests per allocation, this process's CPU per allocation (also in reference units, see
``bench.common.reference_cpu_seconds``), and the allocator cache figures.

    python -m bench.controlplane [--devices 10000] [--pods 300] [--in-flight 16]
        [--json out.json]
"""

from __future__ import annotations

import asyncio
import collections
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

from app import aio
from app.controlplane import ControlPlaneController, ControlPlaneSettings
from app.db.engine import Database
from app.db.migrate import upgrade
from app.fabric.errors import FabricConflict, FabricNotFound
from app.fabric.types import (
    DeviceType,
    FabricDevice,
    FabricHost,
    Health,
    Listing,
    Location,
    Operation,
    OperationState,
)
from app.heap import HeapSettler, settle_heap
from app.inventory import InventorySync
from app.inventory.queries import pool_devices
from app.kube.client import KubeAuthMode, KubeClientSettings, call_json, connect
from app.kube.informer import InformerSettings
from app.kube.versions import ResourceApiVersion, slice_to_wire
from app.kube.workqueue import WorkQueueSettings
from app.pools import PoolConfig, desired_pools, resource_slice_spec
from bench.common import (
    ServerProcess,
    WindowProfile,
    add_database_option,
    add_event_loop_option,
    at_least,
    bench_database,
    command_line,
    cpu_bound_rate,
    cpu_seconds,
    database_server_cpu_seconds,
    kube_emulator_server,
    peak_rss_mib,
    process_cpu_seconds,
    reference_cpu_seconds,
    reference_units,
    run_benchmark,
    write_figures,
)

DRIVER = "fabric.example.com"
GROUP, VERSION = "resource.k8s.io", "v1alpha3"
REGIONS = ("us-east", "us-west", "eu-central", "ap-south")
REGION_LABEL = "topology.kubernetes.io/region"
RACK_LABEL = "fabric-dra.io/rack"
MODELS = ("H100", "A100", "L40S")


# A pod's time from creation to binding, in the stand-in's steps (ClassicScheduler.timeline):
# (name, from step, to step). "answers" and "allocation" are the driver's turns (the
# controller with the API server and the watch between them); the others are the stand-in's.
PHASES = (
    ("to_context", "created", "context"),
    ("driver_answers", "context", "answers"),
    ("node_selection", "answers", "selected"),
    ("driver_allocation", "selected", "allocated"),
    ("to_bind", "allocated", "bound"),
)


class CountingController(ControlPlaneController):
    """Counts its passes: scheduling contexts answered and claims looked at."""

    passes: collections.Counter[str]

    async def reconcile(self, key: Any) -> bool:
        self.passes[key[0]] += 1
        return await super().reconcile(key)


class InstantBackend:
    """A fabric backend in memory that answers at once (zero fabric latency)."""

    kind = "memory"
    name = "memory"

    def __init__(self, devices: list[FabricDevice], hosts: list[FabricHost]) -> None:
        self.devices = {d.vendor_id: d for d in devices}
        self.hosts = hosts
        self.attaches = 0

    async def list_hosts(self) -> Listing[FabricHost]:
        return Listing(tuple(self.hosts))

    async def list_devices(self) -> Listing[FabricDevice]:
        return Listing(tuple(self.devices.values()))

    async def attach(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        on_operation: Callable[[str], Awaitable[None]] | None = None,
    ) -> Operation:
        current = self.devices.get(device.vendor_id)
        if current is None:
            raise FabricNotFound(f"device {device.vendor_id} not found")
        if current.host_id not in (None, host_id):
            raise FabricConflict(f"device {device.vendor_id} is attached to {current.host_id}")
        self.devices[device.vendor_id] = replace(current, host_id=host_id)
        self.attaches += 1
        return Operation(None, OperationState.COMPLETED)

    async def detach(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        on_operation: Callable[[str], Awaitable[None]] | None = None,
    ) -> Operation:
        current = self.devices.get(device.vendor_id)
        if current is not None and current.host_id == host_id:
            self.devices[device.vendor_id] = replace(current, host_id=None)
        return Operation(None, OperationState.COMPLETED)

    async def resume(
        self, op_id: str, device: FabricDevice, host_id: str, *, attach: bool
    ) -> Operation:
        # Synchronous: there is never a task to follow.
        return await (self.attach(device, host_id) if attach else self.detach(device, host_id))

    async def operation_status(self, op_id: str) -> Operation:
        raise FabricNotFound(f"operation {op_id} not found")

    async def close(self) -> None:
        return None


def inventory(devices: int, racks: int) -> tuple[list[FabricDevice], list[FabricHost]]:
    """``devices`` devices over ``racks`` racks (4 regions), one server per rack."""
    per_rack = devices // racks
    out: list[FabricDevice] = []
    hosts: list[FabricHost] = []
    for r in range(racks):
        region, rack = REGIONS[r % len(REGIONS)], f"rack-{r:03d}"
        location = Location(region=region, rack=rack, row="row-1", chassis=f"{rack}-encl")
        hosts.append(
            FabricHost(
                host_id=f"host-{r:03d}",
                hostname=f"node-{r:03d}",
                location=location,
                health=Health.OK,
            )
        )
        for i in range(per_rack):
            gpu = i % 5 != 4
            block = f"/fabric/{region}/{rack}/block-{i:03d}"
            out.append(
                FabricDevice(
                    vendor_id=f"{block}/dev0",
                    attach_unit=block,
                    device_type=DeviceType.GPU if gpu else DeviceType.FPGA,
                    vendor="Example",
                    model=MODELS[i % 3] if gpu else "U55C",
                    serial=f"SN-{r:03d}-{i:04d}",
                    uuid=f"00000000-0000-4000-8000-{r:04d}{i:08d}",
                    firmware_version=f"1.{i % 4}.{i % 7}",
                    memory_mib=(81920, 40960, 49152)[i % 3] if gpu else 16384,
                    location=location,
                    health=Health.OK,
                    state="Enabled",
                )
            )
    return out, hosts


GPU_CLASS = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": f'device.driver == "{DRIVER}" && '
                    f'device.attributes["{DRIVER}"].deviceType == "gpu" && '
                    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
                }
            }
        ]
    },
}
GPU_REQUEST = {
    "name": "gpu",
    "deviceClassName": "gpu",
    "selectors": [
        {
            "cel": {
                "expression": f'device.attributes["{DRIVER}"].model in ["H100", "A100"] && '
                f'device.attributes["{DRIVER}"].firmwareVersion.isGreaterThan(semver("1.0.0"))'
            }
        }
    ],
}


async def measure(
    devices: int,
    racks: int,
    pods: int,
    in_flight: int,
    workers: int,
    warmup: int = 20,
    database_kind: str = "sqlite",
    profile_path: Path | None = None,
    node_updates: float = 0.0,
) -> list[dict[str, Any]]:
    """Run the benchmark; return its figure lines. ``node_updates``: Node status writes per
    second made meanwhile (kubelets' reports, each node in turn)."""
    reference = reference_cpu_seconds()
    lines: list[dict[str, Any]] = [
        {"step": "reference", "reference_cpu_seconds": round(reference, 4)}
    ]
    fabric_devices, hosts = inventory(devices, racks)
    backend = InstantBackend(fabric_devices, hosts)
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_database(database_kind, Path(tmp)) as url:
            database = Database.connect(url)
            try:
                await upgrade(database.engine)
                lines.extend(
                    await _with_database(
                        database,
                        backend,
                        hosts,
                        pods,
                        in_flight,
                        workers,
                        warmup,
                        racks,
                        WindowProfile(profile_path),
                        node_updates,
                    )
                )
            finally:
                await database.dispose()
    for line in lines:
        if line["step"] == "allocations":
            line["database"] = database_kind
            line["event_loop"] = aio.running_loop_name()
            line["devices"] = devices
            line["in_flight"] = in_flight
            line["ref_units_per_allocation"] = round(
                reference_units(line["cpu_seconds_per_allocation"], reference), 4
            )
    return lines


async def _with_database(
    database: Database,
    backend: InstantBackend,
    hosts: list[FabricHost],
    pods: int,
    in_flight: int,
    workers: int,
    warmup: int,
    racks: int,
    profile: WindowProfile,
    node_updates: float,
) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    started = time.perf_counter()
    await InventorySync(backend, database).sync_once()
    lines.append(
        {
            "step": "inventory",
            "devices": len(backend.devices),
            "racks": racks,
            "seconds": round(time.perf_counter() - started, 2),
        }
    )
    # Classic DRA (v1alpha3 with PodSchedulingContexts) is Kubernetes 1.31's.
    args = [
        "--kubernetes-version",
        "1.31",
        "--resource-versions",
        VERSION,
        "--history-size",
        "200000",
    ]
    async with kube_emulator_server(args) as emulator:
        client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emulator.url))
        try:
            lines.extend(
                await _run(
                    client,
                    database,
                    backend,
                    hosts,
                    pods,
                    in_flight,
                    workers,
                    warmup,
                    emulator,
                    profile,
                    node_updates,
                )
            )
        finally:
            await client.close()
    return lines


async def _run(
    client: Any,
    database: Database,
    backend: InstantBackend,
    hosts: list[FabricHost],
    pods: int,
    in_flight: int,
    workers: int,
    warmup: int,
    emulator: ServerProcess,
    profile: WindowProfile,
    node_updates: float = 0.0,
) -> list[dict[str, Any]]:
    core = CoreV1Api(client.api)
    custom: Any = CustomObjectsApi(client.api)
    started = time.perf_counter()
    for host in hosts:
        node: Any = {
            "metadata": {
                "name": host.hostname,
                "labels": {
                    REGION_LABEL: host.location.region,
                    RACK_LABEL: host.location.rack,
                    "kubernetes.io/hostname": host.hostname,
                },
            }
        }
        await call_json(core.create_node(node, _preload_content=False), "create Node")
    config = PoolConfig(
        DRIVER, binds_to_node=False, node_labels={"region": REGION_LABEL, "rack": RACK_LABEL}
    )
    slice_count = 0
    for pool in desired_pools(await pool_devices(database), config).values():
        for content in pool.slices:
            body = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{pool.name.replace('/', '-')}-{content.index}"},
                "spec": resource_slice_spec(DRIVER, pool, content, 0),
            }
            await call_json(
                custom.create_cluster_custom_object(
                    GROUP,
                    VERSION,
                    "resourceslices",
                    slice_to_wire(body, ResourceApiVersion.V1ALPHA3),
                    _preload_content=False,
                ),
                "create ResourceSlice",
            )
            slice_count += 1
    await call_json(
        custom.create_cluster_custom_object(
            GROUP, VERSION, "deviceclasses", GPU_CLASS, _preload_content=False
        ),
        "create DeviceClass",
    )
    setup = {
        "step": "publish",
        "nodes": len(hosts),
        "slices": slice_count,
        "seconds": round(time.perf_counter() - started, 2),
    }

    informer = InformerSettings(name="bench", watch_timeout_s=300, page_size=500)
    controller = CountingController(
        client,
        database,
        backend,
        ControlPlaneSettings(
            driver_name=DRIVER,
            workers=workers,
            resync_interval_s=60,
            informer=informer,
            queue=WorkQueueSettings(base_delay_s=0.01, max_delay_s=0.5, qps=1000, burst=1000),
        ),
        heap=HeapSettler(),  # as the service does
    )
    controller.passes = collections.Counter()
    started = time.perf_counter()
    await controller.start()
    settle_heap()  # as the service does once it leads
    claim_spec = {"controller": DRIVER, "devices": {"requests": [GPU_REQUEST]}}
    scheduler = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.classic_scheduler",
        client.host,
        json.dumps(claim_spec),
        str(node_updates),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert scheduler.stdin is not None
    assert scheduler.stdout is not None
    if json.loads(await scheduler.stdout.readline()).get("ready") is not True:
        raise RuntimeError("bench.classic_scheduler did not start")
    start_seconds = time.perf_counter() - started
    abandoned = 0

    phases: dict[str, list[float]] = {name: [] for name, _, _ in PHASES}

    async def drive(first: int, count: int) -> list[float]:
        """Create pods ``first`` .. ``first + count - 1``, ``in_flight`` at a time; return
        their times from creation to binding (and add their steps to ``phases``)."""
        assert scheduler.stdin is not None
        assert scheduler.stdout is not None
        created, latencies = first, []
        while len(latencies) < count:
            while created < first + count and created - first - len(latencies) < in_flight:
                scheduler.stdin.write(json.dumps({"create": created}).encode() + b"\n")
                created += 1
            line = json.loads(await asyncio.wait_for(scheduler.stdout.readline(), 120))
            if "bound" in line:
                latencies.append(float(line["seconds"]))
                steps = {"created": 0.0, **line.get("steps", {})}
                for name, since, until in PHASES:
                    if since in steps and until in steps:
                        phases[name].append(steps[until] - steps[since])
        return latencies

    try:
        # Warm-up: the first contexts build the pools from the slices and fill the CEL
        # selector cache (a one-time cost, reported apart); the steady state is measured.
        started = time.perf_counter()
        warm = await drive(0, warmup) if warmup else [0.0]
        warmup_line = {
            "step": "warm-up",
            "pods": warmup,
            "seconds": round(time.perf_counter() - started, 2),
            "first_pod_ms": round(warm[0] * 1e3, 1),
        }
        requests_before = await _request_count(client.host)
        hits0, misses0 = controller.answers.hits, controller.answers.misses
        passes0 = collections.Counter(controller.passes)
        profile.start()
        cpu0 = cpu_seconds()
        emulator_cpu0 = emulator.cpu_seconds()
        standin_cpu0 = process_cpu_seconds(scheduler.pid)
        server_cpu0 = await database_server_cpu_seconds(str(database.engine.url))
        started = time.perf_counter()
        for values in phases.values():
            values.clear()
        latencies = await drive(warmup, pods)
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds() - cpu0
        profile.stop()
        passes = controller.passes - passes0
        emulator_cpu = emulator.cpu_seconds() - emulator_cpu0
        standin_cpu = process_cpu_seconds(scheduler.pid) - standin_cpu0
        server_cpu = await database_server_cpu_seconds(str(database.engine.url)) - server_cpu0
        hits, misses = controller.answers.hits - hits0, controller.answers.misses - misses0
        # Pods may be bound a moment before the attach is recorded: let it finish.
        for _ in range(3000):
            if backend.attaches >= warmup + pods:
                break
            await asyncio.sleep(0.01)
    finally:
        scheduler.stdin.close()
        out, _ = await scheduler.communicate()
        node_status_writes = 0
        for raw in out.splitlines():
            ended = json.loads(raw)
            abandoned = int(ended.get("abandoned", abandoned))
            node_status_writes = int(ended.get("node_status_writes", node_status_writes))
        await controller.stop()
    requests = await _request_count(client.host) - requests_before
    ordered = sorted(latencies)
    stats = controller.allocator.stats()
    lookups = stats["selector_hits"] + stats["selector_misses"]
    return [
        setup,
        {"step": "start", "seconds": round(start_seconds, 2)},
        warmup_line,
        {
            "step": "allocations",
            "pods": pods,
            "in_flight": in_flight,
            "workers": workers,
            "allocations": controller.allocations - warmup,
            "attaches": backend.attaches - warmup,
            "allocations_per_second": round(pods / elapsed, 1),
            "p50_ms": round(statistics.median(ordered) * 1e3, 1),
            "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1e3, 1),
            "api_requests_per_allocation": round(requests / pods, 1),
            "context_passes_per_allocation": round(passes["context"] / pods, 2),
            "claim_passes_per_allocation": round(passes["claim"] / pods, 2),
            "cpu_seconds_per_allocation": round(cpu / pods, 4),
            # The CPU of the emulator and of the stand-in (users and kube-scheduler) per pod:
            # they share the two cores with the controller.
            "emulator_cpu_ms_per_allocation": round(emulator_cpu / pods * 1e3, 2),
            "standin_cpu_ms_per_allocation": round(standin_cpu / pods * 1e3, 2),
            # PostgreSQL's server shares the cores too (SQLite runs inside the controller).
            "database_server_cpu_ms_per_allocation": round(server_cpu / pods * 1e3, 2),
            # All of them share the machine's cores: the allocations per second they allow.
            "all_processes_cpu_ms_per_allocation": round(
                (cpu + emulator_cpu + standin_cpu + server_cpu) / pods * 1e3, 2
            ),
            "cpu_bound_allocations_per_second": round(
                cpu_bound_rate((cpu + emulator_cpu + standin_cpu + server_cpu) / pods), 1
            ),
            **{
                f"{name}_p50_ms": round(statistics.median(values) * 1e3, 1)
                for name, values in phases.items()
                if values
            },
            "selector_cache_hit_rate": round(stats["selector_hits"] / max(1, lookups), 4),
            "node_answers_hit_rate": round(hits / max(1, hits + misses), 4),
            "node_answers_computed_per_allocation": round(misses / pods, 1),
            "abandoned_nodes": abandoned,
            "nodes": len(hosts),
            "node_updates_per_second": node_updates,
            # Over the whole run, warm-up included: the stand-in writes until it is told to end.
            "node_status_writes": node_status_writes,
            "peak_rss_mib": round(peak_rss_mib(), 1),
        },
    ]


async def _request_count(url: str) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/_emulator/requests") as response,
    ):
        return len(await response.json())


def main() -> None:
    """Run the benchmark and print JSON lines."""
    parser = command_line(__doc__, "bench.controlplane")
    parser.add_argument(
        "--devices", type=at_least(1), default=10_000, help="devices in the inventory"
    )
    parser.add_argument("--racks", type=at_least(1), default=80, help="racks (one node each)")
    parser.add_argument("--pods", type=at_least(1), default=300, help="pods measured")
    parser.add_argument(
        "--in-flight", type=at_least(1), default=16, help="pods waiting to be scheduled at any time"
    )
    parser.add_argument(
        "--workers", type=at_least(1), default=8, help="contexts and claims worked on at once"
    )
    parser.add_argument(
        "--warmup", type=at_least(0), default=20, help="pods allocated before the measured ones"
    )
    parser.add_argument(
        "--node-updates",
        type=float,
        default=0.0,
        help="Node status writes per second while pods are scheduled (kubelets' reports, "
        "each node in turn)",
    )
    add_database_option(parser)
    add_event_loop_option(parser)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="write a cProfile of the measured pods (warm-up left out) to this file",
    )
    options = parser.parse_args()
    if not 0 <= options.node_updates <= 10_000:
        parser.error(f"--node-updates {options.node_updates}: expected 0 to 10000 per second")
    if options.devices < options.racks * 5:
        parser.error(
            f"--devices {options.devices} leaves fewer than 5 devices per rack "
            f"({options.racks} racks): no pod could be placed"
        )
    write_figures(
        options.json,
        run_benchmark(
            measure(
                options.devices,
                options.racks,
                options.pods,
                options.in_flight,
                options.workers,
                options.warmup,
                options.database,
                options.profile,
                options.node_updates,
            ),
            options.event_loop,
        ),
    )


if __name__ == "__main__":
    main()
