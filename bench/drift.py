"""Benchmark: how fast the controller notices a device that lost its attachment behind its back.

The Kubernetes API emulator and the Redfish simulator run in their own processes. The
benchmark attaches ``--samples`` claims (one device each) through the structured-mode
reconciler, then runs the inventory loop as the service does (a full sync, then the drift
check, every ``--poll-interval`` seconds; 0 runs them back to back). One at a time, another
Redfish client (someone at the fabric manager's console) detaches a claim's device, at a random
moment within the sync cycle, and the benchmark measures:

* lost: from the detach to the claim's ``FabricDeviceReady`` condition turning False;
* back: from the detach to the condition True again (the controller attached it again).

With polling, lost is bounded by the poll interval plus one full listing of the fabric; the
listing time is reported beside it.

    python -m bench.drift [--devices 10000] [--samples 10] [--poll-interval 0] [--json out.json]
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api
from sqlalchemy import select

from app.claims.drift import DriftWatch
from app.claims.reconciler import ClaimReconciler, ClaimSettings
from app.clock import utcnow
from app.db.engine import Database
from app.db.migrate import upgrade
from app.db.models import Device
from app.fabric.redfish.backend import RedfishBackend
from app.fabric.types import DeviceType, FabricDevice
from app.heap import settle_heap
from app.inventory import InventorySync
from app.journal import Journal
from app.kube.client import KubeAuthMode, KubeClientSettings, call_json, connect
from app.kube.informer import Informer, InformerSettings
from app.kube.versions import ResourceApiVersion
from bench.claims import percentile
from bench.common import (
    at_least,
    command_line,
    cpu_seconds,
    kube_emulator_process,
    peak_rss_mib,
    redfish_simulator_process,
    run_benchmark,
    write_figures,
)

DRIVER = "fabric.example.com"
PER_RACK = 64


async def measure(
    devices: int, samples: int, poll_interval_s: float, seed: int = 1
) -> dict[str, Any]:
    """Run the benchmark; return the figures (times in seconds)."""
    racks = max(1, -(-devices // PER_RACK))
    sim_args = [
        "--regions",
        "1",
        "--racks-per-region",
        str(racks),
        "--devices-per-rack",
        str(PER_RACK),
        "--hosts-per-rack",
        "4",
        "--auth",
        "none",
        "--expand",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        database = Database.connect(f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}")
        await upgrade(database.engine)
        async with (
            redfish_simulator_process(sim_args) as fabric_url,
            kube_emulator_process() as kube_url,
        ):
            backend = RedfishBackend(fabric_url, auth="none", timeout_s=120)
            # Someone else at the fabric manager: a client of its own.
            other = RedfishBackend(fabric_url, auth="none", timeout_s=120)
            client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=kube_url))
            try:
                return await _run(
                    database, backend, other, client, samples, poll_interval_s, random.Random(seed)
                )
            finally:
                await client.close()
                await other.close()
                await backend.close()
                await database.dispose()


async def _run(
    database: Database,
    backend: RedfishBackend,
    other: RedfishBackend,
    client: Any,
    samples: int,
    poll_interval_s: float,
    rng: random.Random,
) -> dict[str, Any]:
    inventory = InventorySync(backend, database)
    first = await inventory.sync_once()
    assert first.ok, first.error
    async with database.read() as session:
        rows = (await session.scalars(select(Device).order_by(Device.name))).all()
    core, resources = CoreV1Api(client.api), ResourceV1Api(client.api)
    # One claim per rack, so that the claims spread over the fabric.
    by_rack: dict[str, Device] = {}
    for row in rows:
        by_rack.setdefault(str(row.rack), row)
    chosen = list(by_rack.values())[:samples]
    for device in chosen:
        await call_json(
            core.create_node(
                {
                    "metadata": {
                        "name": _node(device),
                        "labels": {"kubernetes.io/hostname": _node(device)},
                    }
                },
                _preload_content=False,
            ),
            "create Node",
        )
    reconciler = ClaimReconciler(
        client,
        ResourceApiVersion.V1,
        database,
        backend,
        ClaimSettings(driver_name=DRIVER, workers=4, sweep_interval_s=3600),
    )
    await reconciler.start()
    settle_heap()  # as the service does once it leads
    loop_task: asyncio.Task[None] | None = None
    watch_claims: Informer | None = None
    sync_seconds: list[float] = []
    try:
        names = []
        for index, device in enumerate(chosen):
            name = f"drift-{index:03d}"
            names.append(name)
            claim = await call_json(
                resources.create_namespaced_resource_claim(
                    "default",
                    {
                        "metadata": {"name": name},
                        "spec": {
                            "devices": {
                                "requests": [
                                    {"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}
                                ]
                            }
                        },
                    },
                    _preload_content=False,
                ),
                "create claim",
            )
            claim["status"] = {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": DRIVER,
                                "pool": f"{device.region}/{device.rack}",
                                "device": device.name,
                            }
                        ]
                    },
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {
                                        "key": "metadata.name",
                                        "operator": "In",
                                        "values": [_node(device)],
                                    }
                                ]
                            }
                        ]
                    },
                },
                "reservedFor": [
                    {"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}
                ],
            }
            await call_json(
                resources.replace_namespaced_resource_claim_status(
                    name, "default", claim, _preload_content=False
                ),
                "allocate",
            )
        for name in names:
            await _until(lambda n=name: _ready(resources, n, "True"))
        watch = DriftWatch(Journal(database), database, {"structured": reconciler.drift_target()})

        async def inventory_loop() -> None:
            while True:
                started, listed_from = time.monotonic(), utcnow()
                result = await inventory.sync_once()
                if result.ok:
                    await watch.check(listed_from)
                sync_seconds.append(time.monotonic() - started)
                await asyncio.sleep(poll_interval_s)

        # Each claim's FabricDeviceReady changes, from a watch: polling the claim can miss the
        # False between the controller's two status writes (not ready, then ready again once
        # the device is attached again), which a fast re-attach makes a few milliseconds.
        readiness: dict[str, list[tuple[float, str]]] = {name: [] for name in names}

        async def on_claim(_event: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
            name = str((obj.get("metadata") or {}).get("name"))
            status = _ready_status(obj)
            seen = readiness.get(name)
            if seen is not None and status is not None and (not seen or seen[-1][1] != status):
                seen.append((time.monotonic(), status))

        watch_claims = Informer(
            resources.list_namespaced_resource_claim,
            InformerSettings(name="resourceclaims", namespace="default"),
        )
        watch_claims.add_handler(on_claim)
        watch_claims.start()
        loop_task = asyncio.create_task(inventory_loop(), name="bench-inventory")
        await _until(lambda: _true(len(sync_seconds) >= 1))
        cpu0 = cpu_seconds()
        lost: list[float] = []
        back: list[float] = []
        for name, device in zip(names, chosen, strict=True):
            # A random moment within the sync cycle, so that samples do not lock to its phase.
            await asyncio.sleep(rng.uniform(0, max(sync_seconds) + poll_interval_s))
            started = time.monotonic()
            await other.detach(
                FabricDevice(
                    vendor_id=device.vendor_id,
                    attach_unit=device.attach_unit,
                    device_type=DeviceType(device.device_type),
                ),
                _node(device),
            )
            not_ready = await _first(readiness[name], "False", after=started)
            lost.append(not_ready - started)
            back.append(await _first(readiness[name], "True", after=not_ready) - started)
        cpu = cpu_seconds() - cpu0
    finally:
        if loop_task is not None:
            loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop_task
        if watch_claims is not None:
            await watch_claims.stop()
        await reconciler.stop()
    return {
        "benchmark": "drift",
        "devices": len(rows),
        "samples": len(lost),
        "poll_interval_seconds": poll_interval_s,
        "full_sync_seconds_mean": round(sum(sync_seconds) / len(sync_seconds), 3),
        "lost_to_not_ready_p50_s": round(percentile(lost, 0.5) / 1000, 3),
        "lost_to_not_ready_p99_s": round(percentile(lost, 0.99) / 1000, 3),
        "lost_to_ready_again_p50_s": round(percentile(back, 0.5) / 1000, 3),
        "lost_to_ready_again_p99_s": round(percentile(back, 0.99) / 1000, 3),
        "cpu_seconds_while_measuring": round(cpu, 2),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }


def _node(device: Device) -> str:
    return f"node-us-east-{device.rack}-1"


async def _true(value: bool) -> bool:
    return value


async def _ready(resources: ResourceV1Api, name: str, status: str) -> bool:
    claim = await call_json(
        resources.read_namespaced_resource_claim(name, "default", _preload_content=False),
        "read claim",
    )
    return _ready_status(claim) == status


def _ready_status(claim: dict[str, Any]) -> str | None:
    """The status of the claim's first FabricDeviceReady condition, or None."""
    for entry in (claim.get("status") or {}).get("devices") or []:
        for condition in entry.get("conditions") or []:
            if condition.get("type") == "FabricDeviceReady":
                return str(condition.get("status"))
    return None


async def _first(seen: list[tuple[float, str]], status: str, *, after: float) -> float:
    """When the watch first saw ``status`` at or after ``after`` (monotonic seconds)."""
    found: list[float] = []

    async def check() -> bool:
        found[:] = [t for t, s in seen if s == status and t >= after][:1]
        return bool(found)

    await _until(check)
    return found[0]


async def _until(check: Any, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark did not converge")
        await asyncio.sleep(0.02)


def main() -> None:
    parser = command_line(__doc__, "bench.drift")
    parser.add_argument(
        "--devices", type=at_least(64), default=10_000, help="devices on the simulated fabric"
    )
    parser.add_argument(
        "--samples",
        type=at_least(1),
        default=10,
        help="devices detached behind the controller's back, one at a time",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.0,
        help="seconds between inventory syncs (0: back to back)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    options = parser.parse_args()
    if options.poll_interval < 0:
        parser.error("--poll-interval must be >= 0")
    if options.samples > -(-options.devices // PER_RACK):
        parser.error(
            f"--samples must be at most the number of racks "
            f"({-(-options.devices // PER_RACK)} for {options.devices} devices)"
        )
    figures = run_benchmark(measure(options.devices, options.samples, options.poll_interval))
    write_figures(options.json, [figures])


if __name__ == "__main__":
    main()
