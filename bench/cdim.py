"""Benchmark: attaches per second against the NEC CDIM simulator, and claims per second end to
end on it.

The simulator (``fabric-dra sim cdim``) runs in its own process with a real installation's
apply time (``--apply-seconds``, 1 s by default: layout-apply starts a process per apply) and
lets one apply run at a time in the whole installation. Measured:

* attaches per second with one attach at a time, and with ``--in-flight`` attaches waiting
  at once, with batching on (they share applies) and off (one apply each);
* claims per second end to end: ``--in-flight`` claims allocated at once, the claim
  controller (SQLite journal, the Kubernetes API emulator in its own process) connecting each
  device through layout-apply and reporting it ready.

    python -m bench.cdim                      # 8 sequential, 32 in flight
    python -m bench.cdim --in-flight 64 --json out.json
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

from app.claims.reconciler import ClaimSettings
from app.db.engine import Database
from app.db.migrate import upgrade
from app.fabric.cdim import CdimBackend
from app.fabric.types import DeviceType, FabricDevice
from app.inventory import InventorySync
from app.journal import Journal
from app.kube.client import KubeAuthMode, KubeClientSettings, call_json, connect
from app.kube.versions import ResourceApiVersion
from bench.claims import (
    TimedReconciler,
    _all_ready,
    _none_active,
    _settle,
    _until,
    _write_statuses,
)
from bench.common import (
    at_least,
    command_line,
    cpu_seconds,
    kube_emulator_process,
    positive_float,
    run_benchmark,
    server_process,
    stop_on_sigterm,
    write_figures,
)

DRIVER = "fabric.example.com"
BASE = "/cdim/api/v1"


@contextlib.asynccontextmanager
async def cdim_simulator(cpus: int, gpus: int, apply_s: float) -> AsyncIterator[str]:
    """``fabric-dra sim cdim`` in its own process; yields its origin."""
    command = [
        "sim",
        "cdim",
        "--cpus",
        str(cpus),
        "--gpus",
        str(gpus),
        "--apply-seconds",
        str(apply_s),
        "--step-seconds",
        "0.01",
    ]
    async with server_process("CDIM simulator", command) as server:
        yield server.url


async def _inventory(url: str) -> tuple[list[str], list[str]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(url + BASE + "/resources", params={"detail": "true"}) as response,
    ):
        body = await response.json()
    cpus = [r["device"]["deviceID"] for r in body["resources"] if r["device"]["type"] == "CPU"]
    gpus = [r["device"]["deviceID"] for r in body["resources"] if r["device"]["type"] == "GPU"]
    return cpus, gpus


def _device(device_id: str) -> FabricDevice:
    return FabricDevice(vendor_id=device_id, attach_unit=device_id, device_type=DeviceType.GPU)


async def attaches(url: str, in_flight: int, sequential: int) -> dict[str, Any]:
    """Attaches per second: one at a time, then ``in_flight`` at once with batching on and
    off; every device is detached again between runs (not timed)."""
    cpus, gpus = await _inventory(url)
    figures: dict[str, Any] = {}

    async def run(window_s: float, count: int, together: bool) -> tuple[float, int]:
        backend = CdimBackend(url, poll_s=0.05, batch_window_s=window_s, busy_timeout_s=600)
        chosen = gpus[:count]
        try:
            started = time.monotonic()
            if together:
                await asyncio.gather(
                    *(backend.attach(_device(g), cpus[i % len(cpus)]) for i, g in enumerate(chosen))
                )
            else:
                for i, g in enumerate(chosen):
                    await backend.attach(_device(g), cpus[i % len(cpus)])
            seconds = time.monotonic() - started
            applies = backend.applies
            await asyncio.gather(
                *(backend.detach(_device(g), cpus[i % len(cpus)]) for i, g in enumerate(chosen))
            )
        finally:
            await backend.close()
        return count / seconds, applies

    rate, applies = await run(0.05, sequential, together=False)
    figures["sequential_attaches_per_second"] = round(rate, 2)
    figures["sequential_applies"] = applies
    rate, applies = await run(0.05, in_flight, together=True)
    figures["batched_attaches_per_second"] = round(rate, 2)
    figures["batched_applies"] = applies
    rate, applies = await run(0.0, in_flight, together=True)
    figures["unbatched_attaches_per_second"] = round(rate, 2)
    figures["unbatched_applies"] = applies
    return figures


async def claims(url: str, kube_url: str, count: int, folder: Path) -> dict[str, Any]:
    """Claims per second end to end: ``count`` claims allocated at once, each to its own GPU,
    until every one is ready; then released until every device is detached."""
    database = Database.connect(f"sqlite+aiosqlite:///{folder}/cdim.db")
    await upgrade(database.engine)
    backend = CdimBackend(url, poll_s=0.05, busy_timeout_s=600)
    client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=kube_url))
    try:
        await InventorySync(backend, database).sync_once()
        cpus, gpus = await _inventory(url)
        from sqlalchemy import select

        from app.db.models import Device

        async with database.read() as session:
            rows = (await session.scalars(select(Device).order_by(Device.name))).all()
        names_of = {r.vendor_id: r.name for r in rows}
        core, resources = CoreV1Api(client.api), ResourceV1Api(client.api)
        for index, cpu in enumerate(cpus):
            labels = {"kubernetes.io/hostname": f"node-{index}", "fabric-dra.io/host-id": cpu}
            await call_json(
                core.create_node(
                    {"metadata": {"name": f"node-{index}", "labels": labels}},
                    _preload_content=False,
                ),
                "create Node",
            )
        reconciler = TimedReconciler(
            client,
            ResourceApiVersion.V1,
            database,
            backend,
            ClaimSettings(
                driver_name=DRIVER,
                workers=count,
                sweep_interval_s=3600,
                host_match="label",
                host_key="fabric-dra.io/host-id",
            ),
        )
        reconciler.durations = []
        await reconciler.start()
        try:
            names = [f"cdim-{i:04d}" for i in range(count)]
            request = {"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}
            for name in names:
                await call_json(
                    resources.create_namespaced_resource_claim(
                        "default",
                        {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}},
                        _preload_content=False,
                    ),
                    "create claim",
                )
            await _settle(reconciler)
            reconciler.durations.clear()
            allocations = []
            for index, name in enumerate(names):
                node = f"node-{index % len(cpus)}"
                term = {"key": "metadata.name", "operator": "In", "values": [node]}
                result = {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": "unknown/unknown",
                    "device": names_of[gpus[index]],
                }
                allocations.append(
                    {
                        "name": name,
                        "status": {
                            "allocation": {
                                "devices": {"results": [result]},
                                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [term]}]},
                            },
                            "reservedFor": [
                                {"resource": "pods", "name": f"{name}-p", "uid": str(uuid.uuid4())}
                            ],
                        },
                    }
                )
            cpu0 = cpu_seconds()
            writer = await _write_statuses(client.host, allocations)
            await _until(lambda: _all_ready(reconciler, resources, names))
            attach_s = time.monotonic() - (await writer)["started"]
            applies = backend.applies
            reconciler.durations.clear()
            writer = await _write_statuses(client.host, [{"name": n, "status": {}} for n in names])
            await _until(lambda: _none_active(reconciler, Journal(database), count))
            release_s = time.monotonic() - (await writer)["started"]
            cpu = cpu_seconds() - cpu0
        finally:
            await reconciler.stop()
    finally:
        await client.close()
        await backend.close()
        await database.dispose()
    return {
        "claims": count,
        "claims_per_second": round(count / attach_s, 2),
        "claim_applies": applies,
        "releases_per_second": round(count / release_s, 2),
        "cpu_ms_per_claim_cycle": round(cpu / count * 1000, 2),
    }


async def measure(in_flight: int, sequential: int, apply_s: float) -> dict[str, Any]:
    """Every figure of this benchmark (see the module docstring)."""
    cpus = 4
    async with cdim_simulator(cpus, max(in_flight, sequential) * 2, apply_s) as url:
        figures: dict[str, Any] = {
            "benchmark": "cdim",
            "apply_seconds": apply_s,
            "in_flight": in_flight,
            "sequential": sequential,
        }
        figures.update(await attaches(url, in_flight, sequential))
        with tempfile.TemporaryDirectory() as tmp:
            async with kube_emulator_process() as kube_url:
                figures.update(await claims(url, kube_url, in_flight, Path(tmp)))
    return figures


def main() -> None:
    """Command line entry (``python -m bench.cdim``)."""
    parser = command_line(__doc__, "bench.cdim")
    parser.add_argument("--in-flight", type=at_least(1), default=32, help="attaches at once")
    parser.add_argument("--sequential", type=at_least(1), default=8, help="attaches one at a time")
    parser.add_argument(
        "--apply-seconds", type=positive_float, default=1.0, help="the simulator's apply time"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    stop_on_sigterm()
    figures = run_benchmark(measure(args.in_flight, args.sequential, args.apply_seconds))
    write_figures(args.json, [figures])


if __name__ == "__main__":
    main()
