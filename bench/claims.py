"""Benchmark: claim cycles through the structured-mode reconciler.

The Kubernetes API emulator and the Redfish simulator run in their own processes, so their
cost is not counted as ours; the fabric adds no latency of its own. The benchmark allocates N
claims (one device each, written as kube-scheduler would by ``bench.status_writer``, also in a
process of its own), waits until every claim reports its binding condition True, then
deallocates them all and waits until every device is detached: that burst gives the
throughput. Then it allocates and releases them again at a steady ``--rate`` below saturation:
that gives the latency of one claim that does not queue behind hundreds of others.

Figures: claims per second (burst: allocation written -> ready, for the whole batch), the
controller's own time per reconcile (p50, p99: from reading the claim to writing its status,
fabric and database calls included) at the steady rate and in the burst, release throughput,
this process's CPU per claim cycle in the burst (attach and release; also in reference units,
see ``bench.common.reference_cpu_seconds``) and peak memory.

    python -m bench.claims [--claims 200] [--devices N] [--workers 8] [--rate 50]
        [--database sqlite|postgresql] [--profile FILE] [--json out.json]

With ``--devices`` the fabric holds that many devices (at least one rack of 64 per 64 claims),
all inventoried before the claims start: the cost of a claim as the inventory grows.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, cast

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api
from sqlalchemy import select

from app import aio
from app.claims.reconciler import ClaimReconciler, ClaimSettings
from app.db.engine import Database
from app.db.migrate import upgrade
from app.db.models import Device
from app.fabric.redfish.backend import RedfishBackend
from app.heap import settle_heap
from app.inventory import InventorySync
from app.journal import Journal
from app.kube.client import KubeAuthMode, KubeClientSettings, call_json, connect
from app.kube.versions import ResourceApiVersion
from bench.common import (
    ServerProcess,
    StatementCount,
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
    positive_float,
    redfish_simulator_server,
    reference_cpu_seconds,
    reference_units,
    run_benchmark,
    write_figures,
)

DRIVER = "fabric.example.com"


class TimedReconciler(ClaimReconciler):
    """Records the wall time of every reconcile (the controller's own latency)."""

    durations: list[float]

    async def reconcile(self, uid: str) -> bool:
        started = time.perf_counter()
        try:
            return await super().reconcile(uid)
        finally:
            self.durations.append(time.perf_counter() - started)


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values`` (nearest rank), in milliseconds."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return round(ordered[index] * 1000, 2)


async def measure(
    claims: int,
    database_kind: str,
    workers: int,
    rate: float = 50.0,
    profile: Path | None = None,
    devices: int = 0,
) -> dict[str, Any]:
    """Run the benchmark for ``claims`` claims (``devices`` in the fabric, at least enough
    racks of 64 for the claims); return the figures."""
    reference = reference_cpu_seconds()
    racks = max(1, -(-claims // 64), -(-devices // 64))
    sim_args = [
        "--regions",
        "1",
        "--racks-per-region",
        str(racks),
        "--devices-per-rack",
        "64",
        "--hosts-per-rack",
        "4",
        "--auth",
        "none",
        "--expand",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            bench_database(database_kind, Path(tmp)) as url,
            redfish_simulator_server(sim_args) as fabric,
            kube_emulator_server() as emulator,
        ):
            database = Database.connect(url)
            await upgrade(database.engine)
            backend = RedfishBackend(fabric.url, auth="none", timeout_s=60)
            client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emulator.url))
            try:
                figures = await _cycle(
                    claims,
                    database,
                    backend,
                    client,
                    workers,
                    rate,
                    WindowProfile(profile),
                    (fabric, emulator),
                )
                figures["verify_reads_per_operation"] = round(
                    _verify_reads(backend) / (4 * claims), 3
                )
            finally:
                await client.close()
                await backend.close()
                await database.dispose()
    figures["database"] = database_kind
    figures["event_loop"] = aio.running_loop_name()
    figures["devices"] = racks * 64
    figures["reference_cpu_seconds"] = round(reference, 4)
    figures["ref_units_per_claim_cycle"] = round(
        reference_units(figures["cpu_ms_per_claim_cycle"] / 1000, reference), 4
    )
    return figures


async def _cycle(
    claims: int,
    database: Database,
    backend: RedfishBackend,
    client: Any,
    workers: int,
    rate: float,
    profile: WindowProfile,
    servers: tuple[ServerProcess, ServerProcess],
) -> dict[str, Any]:
    await InventorySync(backend, database).sync_once()
    async with database.read() as session:
        # The devices the claims get, not all of them: the benchmark's own copy of 100,000
        # rows would count as the controller's memory.
        devices = (await session.scalars(select(Device).order_by(Device.name).limit(claims))).all()
    hosts = sorted({d.rack for d in devices})
    core, resources = CoreV1Api(client.api), ResourceV1Api(client.api)
    nodes = [f"node-us-east-{rack}-{i}" for rack in hosts for i in range(1, 5)]
    for node in nodes:
        await call_json(
            core.create_node(
                {"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}},
                _preload_content=False,
            ),
            "create Node",
        )

    reconciler = TimedReconciler(
        client,
        ResourceApiVersion.V1,
        database,
        backend,
        ClaimSettings(driver_name=DRIVER, workers=workers, sweep_interval_s=3600),
    )
    reconciler.durations = []
    await reconciler.start()
    settle_heap()  # as the service does once it leads
    try:
        names = [f"bench-{i:05d}" for i in range(claims)]
        for name in names:
            await call_json(
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
        await _settle(reconciler)
        reconciler.durations.clear()
        allocations = []
        for index, name in enumerate(names):
            device = devices[index]
            node = f"node-us-east-{device.rack}-{index % 4 + 1}"
            allocations.append(
                {
                    "name": name,
                    "status": {
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
                                                "values": [node],
                                            }
                                        ]
                                    }
                                ]
                            },
                        },
                        "reservedFor": [
                            {"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}
                        ],
                    },
                }
            )
        journal = Journal(database)
        released = [{"name": n, "status": {}} for n in names]
        cpu0 = cpu_seconds()
        server_cpu0 = [server.cpu_seconds() for server in servers]
        database_cpu0 = await database_server_cpu_seconds(str(database.engine.url))
        statements = StatementCount()
        statements.start()
        profile.start()
        # Burst: every allocation written at once, as fast as the writer goes: throughput.
        writer = await _write_statuses(client.host, allocations)
        await _until(lambda: _all_ready(reconciler, resources, names))
        written = await writer
        attach_seconds = time.monotonic() - written["started"]
        writer_cpu = written["cpu_seconds"]
        burst_durations = list(reconciler.durations)

        reconciler.durations.clear()
        writer = await _write_statuses(client.host, released)
        await _until(lambda: _none_active(reconciler, journal, len(names)))
        written = await writer
        release_seconds = time.monotonic() - written["started"]
        writer_cpu += written["cpu_seconds"]
        release_durations = list(reconciler.durations)
        cpu = cpu_seconds() - cpu0
        fabric_cpu, emulator_cpu = (
            server.cpu_seconds() - before
            for server, before in zip(servers, server_cpu0, strict=True)
        )
        statements.stop()
        database_cpu = await database_server_cpu_seconds(str(database.engine.url)) - database_cpu0
        profile.stop()

        # Paced: the same allocations again at a steady rate below saturation: the latency
        # of one claim's reconcile when it does not queue behind a burst.
        reconciler.durations.clear()
        await (await _write_statuses(client.host, allocations, rate))
        await _until(lambda: _all_ready(reconciler, resources, names))
        paced_durations = list(reconciler.durations)
        reconciler.durations.clear()
        await (await _write_statuses(client.host, released))
        await _until(lambda: _none_active(reconciler, journal, len(names)))
    finally:
        await reconciler.stop()
    total_cpu = cpu + fabric_cpu + emulator_cpu + writer_cpu + database_cpu
    return {
        "benchmark": "claims",
        "claims": claims,
        "workers": workers,
        "claims_per_second": round(claims / attach_seconds, 1),
        "paced_rate_per_second": rate,
        "reconcile_p50_ms": percentile(paced_durations, 0.50),
        "reconcile_p99_ms": percentile(paced_durations, 0.99),
        "reconcile_mean_ms": round(statistics.mean(paced_durations) * 1000, 2),
        "burst_reconcile_p50_ms": percentile(burst_durations, 0.50),
        "burst_reconcile_p99_ms": percentile(burst_durations, 0.99),
        "reconciles": len(burst_durations),
        "paced_reconciles": len(paced_durations),
        "releases_per_second": round(claims / release_seconds, 1),
        "release_reconcile_p99_ms": percentile(release_durations or [0.0], 0.99),
        "cpu_ms_per_claim_cycle": round(cpu / claims * 1000, 2),
        # The processes standing in for the fabric manager, kube-apiserver and kube-scheduler
        # share the machine's cores with the controller: their CPU per claim cycle, and the
        # claim cycles (attach and release) per second the cores allow all of them together,
        # beside the cycles per second measured (the burst of attaches, then of releases).
        "fabric_simulator_cpu_ms_per_claim_cycle": round(fabric_cpu / claims * 1000, 2),
        "emulator_cpu_ms_per_claim_cycle": round(emulator_cpu / claims * 1000, 2),
        "status_writer_cpu_ms_per_claim_cycle": round(writer_cpu / claims * 1000, 2),
        # PostgreSQL's server shares the cores too (SQLite runs inside the controller).
        "database_server_cpu_ms_per_claim_cycle": round(database_cpu / claims * 1000, 2),
        # What the controller asked of its database per claim cycle (attach and release).
        "database_statements_per_claim_cycle": round(statements.statements / claims, 1),
        "database_transactions_per_claim_cycle": round(statements.transactions / claims, 1),
        "all_processes_cpu_ms_per_claim_cycle": round(total_cpu / claims * 1000, 2),
        "claim_cycles_per_second": round(claims / (attach_seconds + release_seconds), 1),
        "cpu_bound_claim_cycles_per_second": round(cpu_bound_rate(total_cpu / claims), 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }


def _verify_reads(backend: RedfishBackend) -> int:
    """Reads the backend made to check that the fabric shows each attach and detach (both
    phases attach and release every claim once: 4 operations per claim)."""
    return int(getattr(backend, "verifications", {}).get("read", 0))


async def _settle(reconciler: ClaimReconciler) -> None:
    await asyncio.sleep(0.5)
    await _until(lambda: _queue_empty(reconciler))


async def _queue_empty(reconciler: ClaimReconciler) -> bool:
    return len(reconciler.queue) == 0


async def _write_statuses(
    kube_url: str, entries: list[dict[str, Any]], rate: float | None = None
) -> asyncio.Future[dict[str, Any]]:
    """Start ``bench.status_writer`` on ``entries`` in its own process (at most ``rate``
    writes per second when given); return a future of its timing line (see that module)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.status_writer",
        kube_url,
        *([str(rate)] if rate else []),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )

    async def finish() -> dict[str, Any]:
        out, _ = await process.communicate(json.dumps(entries).encode())
        if process.returncode != 0:
            raise RuntimeError(f"bench.status_writer failed (exit status {process.returncode})")
        return cast("dict[str, Any]", json.loads(out))

    return asyncio.ensure_future(finish())


async def _all_ready(
    reconciler: TimedReconciler, resources: ResourceV1Api, names: list[str]
) -> bool:
    # Each claim takes at least one reconcile to become ready: until there were that many
    # and the queue is empty, the claims need not be listed (listing them all is costly, and
    # it would be counted as the controller's CPU).
    if len(reconciler.durations) < len(names) or len(reconciler.queue) > 0:
        return False
    body = await call_json(
        resources.list_namespaced_resource_claim("default", _preload_content=False), "list claims"
    )
    ready = 0
    for claim in body.get("items") or []:
        for entry in (claim.get("status") or {}).get("devices") or []:
            if any(
                c.get("type") == "FabricDeviceReady" and c.get("status") == "True"
                for c in entry.get("conditions") or []
            ):
                ready += 1
    return ready >= len(names)


async def _none_active(reconciler: TimedReconciler, journal: Journal, claims: int) -> bool:
    # As in _all_ready: the journal is only read once every claim had a reconcile and the
    # queue is empty, so that the benchmark's own checks cost the controller nothing.
    if len(reconciler.durations) < claims or len(reconciler.queue) > 0:
        return False
    return await journal.count_active() == 0


async def _until(check: Any, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark did not converge")
        await asyncio.sleep(0.01)


def main() -> None:
    parser = command_line(__doc__, "bench.claims")
    parser.add_argument(
        "--claims", type=at_least(1), default=200, help="claims allocated, made ready and released"
    )
    parser.add_argument("--workers", type=at_least(1), default=8, help="claims reconciled at once")
    parser.add_argument(
        "--rate",
        type=positive_float,
        default=50.0,
        help="claims per second of the paced (latency) phase",
    )
    parser.add_argument(
        "--devices",
        type=at_least(0),
        default=0,
        help="devices in the fabric (default: one rack of 64 per 64 claims)",
    )
    add_database_option(parser)
    add_event_loop_option(parser)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="write a cProfile of the burst (attach and release) to this file",
    )
    options = parser.parse_args()
    figures = run_benchmark(
        measure(
            options.claims,
            options.database,
            options.workers,
            options.rate,
            options.profile,
            options.devices,
        ),
        options.event_loop,
    )
    write_figures(options.json, [figures])


if __name__ == "__main__":
    main()
