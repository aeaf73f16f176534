"""Soak: claim cycles in a row through the structured-mode reconciler, watching resident memory.

One cycle: create a ResourceClaim, write its allocation (as kube-scheduler would), wait until
the reconciler has attached the device and reported it ready, deallocate, wait until the device
is detached and the reservation released, delete the claim. ``--lanes`` cycles run side by side
(each lane uses its own device). The Kubernetes API emulator and the Redfish simulator run in
their own processes, so only the reconciler (and this small driver) live in the measured
process.

Resident memory (``VmRSS`` of /proc/self/status, after a garbage collection) is read after the
warm-up cycles and at the end; the figures are printed as JSON. The soak passes when RSS grew by
at most ``--max-growth`` (default 10%) after the warm-up.

    python -m bench.soak [--cycles 2000] [--warmup 200] [--lanes 4] [--json out.json]
"""

from __future__ import annotations

import asyncio
import gc
import sys
import tempfile
import time
import tracemalloc
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api
from sqlalchemy import select

from app.claims.reconciler import ClaimReconciler, ClaimSettings
from app.db.engine import Database
from app.db.migrate import upgrade
from app.db.models import Device
from app.fabric.redfish.backend import RedfishBackend
from app.inventory import InventorySync
from app.journal import Journal
from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, call_json, connect
from app.kube.versions import ResourceApiVersion
from bench.common import (
    at_least,
    command_line,
    kube_emulator_process,
    redfish_simulator_process,
    run_benchmark,
    write_figures,
)

DRIVER = "fabric.example.com"
CYCLE_TIMEOUT_S = 60.0


def rss_mib() -> float:
    """This process's resident memory now (VmRSS), in MiB."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measured_rss_mib() -> float:
    """RSS after a full garbage collection (what stays, not what waits to be collected)."""
    gc.collect()
    return rss_mib()


@dataclass
class Lane:
    """One device and node that a sequence of cycles uses."""

    device: Device
    node: str


class Soak:
    """Runs claim cycles against a reconciler."""

    def __init__(self, client: KubeClient, journal: Journal) -> None:
        self.resources = ResourceV1Api(client.api)
        self.journal = journal
        self.seq = 0

    async def cycle(self, lane: Lane) -> None:
        """One full claim cycle on ``lane``.

        Raises:
            TimeoutError: a step did not finish within ``CYCLE_TIMEOUT_S``.
        """
        self.seq += 1
        name = f"soak-{self.seq:06d}"
        body = cast(
            Any,
            {
                "metadata": {"name": name},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]
                    }
                },
            },
        )
        created = await call_json(
            self.resources.create_namespaced_resource_claim(
                "default", body, _preload_content=False
            ),
            "create claim",
        )
        uid = created["metadata"]["uid"]
        device = lane.device
        created["status"] = {
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
                                {"key": "metadata.name", "operator": "In", "values": [lane.node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}],
        }
        async with asyncio.timeout(CYCLE_TIMEOUT_S):
            current = await self._write_status(name, created)
            while not _ready(current):
                await asyncio.sleep(0.01)
                current = await self._read(name)
            current["status"] = {}
            await self._write_status(name, current)
            # The journal has no change notification: poll it, as a person would.
            while await self.journal.for_claim(uid):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            await call_json(
                self.resources.delete_namespaced_resource_claim(
                    name, "default", _preload_content=False
                ),
                "delete claim",
            )

    async def _read(self, name: str) -> dict[str, Any]:
        return dict(
            await call_json(
                self.resources.read_namespaced_resource_claim(
                    name, "default", _preload_content=False
                ),
                "read claim",
            )
        )

    async def _write_status(self, name: str, claim: dict[str, Any]) -> dict[str, Any]:
        # The reconciler writes the same status concurrently: re-read on conflict.
        from app.kube.errors import KubeConflict

        status = claim["status"]
        for _ in range(50):
            try:
                written = await call_json(
                    self.resources.replace_namespaced_resource_claim_status(
                        name, "default", cast(Any, claim), _preload_content=False
                    ),
                    "write claim status",
                )
                return dict(written)
            except KubeConflict:
                claim = await self._read(name)
                claim["status"] = {
                    **status,
                    **(
                        {"devices": claim.get("status", {}).get("devices")}
                        if status and claim.get("status", {}).get("devices")
                        else {}
                    ),
                }
        raise RuntimeError(f"claim {name}: status write kept conflicting")


def _ready(claim: dict[str, Any]) -> bool:
    for entry in (claim.get("status") or {}).get("devices") or []:
        for condition in entry.get("conditions") or []:
            if condition.get("type") == "FabricDeviceReady" and condition.get("status") == "True":
                return True
    return False


async def soak(
    cycles: int, warmup: int, lanes: int, database_url: str | None = None, trace: bool = False
) -> dict[str, Any]:
    """Run ``cycles`` claim cycles (``warmup`` of them first, unmeasured); return figures.
    With ``trace``, tracemalloc runs and the figures name the 10 biggest growth sites."""
    if not 0 < warmup < cycles:
        raise ValueError("need 0 < warmup < cycles")
    sim_args = [
        "--regions",
        "1",
        "--racks-per-region",
        "1",
        "--devices-per-rack",
        str(max(lanes, 1)),
        "--hosts-per-rack",
        "2",
        "--auth",
        "none",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        url = database_url or f"sqlite+aiosqlite:///{Path(tmp) / 'soak.db'}"
        database = Database.connect(url)
        await upgrade(database.engine)
        async with (
            redfish_simulator_process(sim_args) as fabric_url,
            kube_emulator_process() as kube_url,
        ):
            backend = RedfishBackend(fabric_url, auth="none", timeout_s=30)
            client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=kube_url))
            try:
                return await _run(cycles, warmup, lanes, database, backend, client, trace)
            finally:
                await client.close()
                await backend.close()
                await database.dispose()


async def _run(
    cycles: int,
    warmup: int,
    lanes: int,
    database: Database,
    backend: RedfishBackend,
    client: KubeClient,
    trace: bool,
) -> dict[str, Any]:
    await InventorySync(backend, database).sync_once()
    async with database.read() as session:
        devices = list((await session.scalars(select(Device).order_by(Device.name))).all())
    core = CoreV1Api(client.api)
    nodes = [f"node-us-east-{devices[0].rack}-{i}" for i in (1, 2)]
    for node in nodes:
        await call_json(
            core.create_node(
                cast(Any, {"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}),
                _preload_content=False,
            ),
            "create Node",
        )
    reconciler = ClaimReconciler(
        client,
        ResourceApiVersion.V1,
        database,
        backend,
        ClaimSettings(driver_name=DRIVER, workers=4, sweep_interval_s=5.0),
    )
    await reconciler.start()
    runner = Soak(client, Journal(database))
    lane_list = [Lane(devices[i % len(devices)], nodes[i % 2]) for i in range(lanes)]
    done = 0

    async def run_lane(lane: Lane, count: int) -> None:
        nonlocal done
        for _ in range(count):
            await runner.cycle(lane)
            done += 1

    async def batch(count: int) -> float:
        started = time.monotonic()
        shares = [count // lanes + (1 if i < count % lanes else 0) for i in range(lanes)]
        await asyncio.gather(
            *(run_lane(lane, share) for lane, share in zip(lane_list, shares, strict=True))
        )
        return time.monotonic() - started

    try:
        rss_start = rss_mib()
        warm_seconds = await batch(warmup)
        rss_warm = measured_rss_mib()
        if trace:
            tracemalloc.start(10)
            before = tracemalloc.take_snapshot()
        seconds = await batch(cycles - warmup)
        rss_end = measured_rss_mib()
        growth_sites: list[str] = []
        if trace:
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
            growth_sites = [str(stat) for stat in after.compare_to(before, "traceback")[:10]]
    finally:
        await reconciler.stop()
    growth = (rss_end - rss_warm) / rss_warm
    return {
        "benchmark": "soak",
        "cycles": done,
        "warmup_cycles": warmup,
        "lanes": lanes,
        "rss_start_mib": round(rss_start, 1),
        "rss_after_warmup_mib": round(rss_warm, 1),
        "rss_end_mib": round(rss_end, 1),
        "rss_growth_after_warmup": round(growth, 4),
        "cycles_per_second": round((cycles - warmup) / seconds, 1),
        "warmup_seconds": round(warm_seconds, 1),
        "seconds": round(seconds, 1),
        **({"growth_sites": growth_sites} if trace else {}),
    }


def main() -> None:
    """Command-line entry: run the soak, print the figures, exit 1 when RSS grew too much."""
    parser = command_line(__doc__, "bench.soak")
    parser.add_argument("--cycles", type=at_least(1), default=2000)
    parser.add_argument("--warmup", type=at_least(0), default=200)
    parser.add_argument("--lanes", type=at_least(1), default=4)
    parser.add_argument("--max-growth", type=float, default=0.10)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="name the biggest Python allocation growth sites (slower)",
    )
    args = parser.parse_args()
    figures = run_benchmark(
        soak(args.cycles, args.warmup, args.lanes, args.database_url, args.tracemalloc)
    )
    figures["max_growth"] = args.max_growth
    figures["ok"] = figures["rss_growth_after_warmup"] <= args.max_growth
    write_figures(args.json, [figures])
    sys.exit(0 if figures["ok"] else 1)


if __name__ == "__main__":
    main()
