"""Benchmark: how soon a device that turns Critical on the fabric is tainted in its published
ResourceSlice, with the fabric manager's events and with polling only.

The Redfish simulator (with its benchmark control, ``--control``) and the Kubernetes API
emulator run in their own processes; the whole service runs in this one. Once the inventory
is published, the benchmark turns ``--samples`` devices Critical one at a time, each through
the simulator's control (which emits the Redfish event a real service would), and watches the
ResourceSlices for the device's taint. It measures, per device:

* the time from the change to the taint in the slice (p50, p99, max);
* this process's CPU per change, and the database rows and ResourceSlice writes per change
  (the targets: a change writes one device row and one slice).

``--mode events`` follows the stream (full polls an hour apart); ``--mode polling`` turns
events off and polls back to back (``inventory.poll_interval_seconds`` 0.01): the best
polling can do, one full listing per change at least.

    python -m bench.events [--devices 10000] [--samples 20] [--mode events|polling]
        [--json out.json]
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import select

from app.configload import load_settings
from app.db.models import Device
from app.service import Service
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
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
#: --profile: cProfile the measured window into this file.
PROFILE: Path | None = None


async def measure(devices: int, samples: int, mode: str, seed: int = 1) -> dict[str, Any]:
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
        "--control",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            redfish_simulator_process(sim_args) as fabric_url,
            kube_emulator_process() as kube_url,
        ):
            events = mode == "events"
            settings = load_settings(
                environ={
                    "FABRIC_DRA_DATABASE__URL": f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}",
                    "FABRIC_DRA_FABRIC__URL": fabric_url,
                    "FABRIC_DRA_FABRIC__AUTH": "none",
                    "FABRIC_DRA_FABRIC__TIMEOUT_SECONDS": "300",
                    "FABRIC_DRA_KUBE__MODE": "url",
                    "FABRIC_DRA_KUBE__URL": kube_url,
                    "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
                    "FABRIC_DRA_ADMIN__PORT": "0",
                    "FABRIC_DRA_LEADER__ENABLED": "false",
                    "FABRIC_DRA_INVENTORY__EVENTS": "true" if events else "false",
                    "FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS": "3600" if events else "0.01",
                    "FABRIC_DRA_INVENTORY__EVENTS_POLL_INTERVAL_SECONDS": "3600",
                    "FABRIC_DRA_LOG__LEVEL": "warning",
                }
            )
            service = Service(settings)
            started = time.monotonic()
            await service.start()
            try:
                return await _run(
                    service, fabric_url, kube_url, samples, events, started, random.Random(seed)
                )
            finally:
                await service.stop(deadline_s=10)


async def _run(
    service: Service,
    fabric_url: str,
    kube_url: str,
    samples: int,
    events: bool,
    started: float,
    rng: random.Random,
) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
        first_taint: dict[str, float] = {}
        seen = asyncio.Event()
        version = await _published(http, kube_url, service, events)
        ready_s = time.monotonic() - started
        watch = asyncio.create_task(_watch(http, kube_url, version, first_taint, seen))
        try:
            # Two columns, not whole rows: 100,000 ORM objects would weigh in the peak memory.
            async with service.db.read() as session:
                rows = (
                    await session.execute(
                        select(Device.name, Device.attach_unit).order_by(Device.name)
                    )
                ).all()
            chosen = rng.sample(list(rows), min(samples, len(rows)))
            leading = service.leading
            assert leading is not None
            publisher = next(iter(leading.publishers.values()))
            writes_before = sum(publisher.status().writes.values())
            (manager,) = leading.managers.values()
            rows_before = manager.applier.row_writes if manager.applier else 0
            cpu_before = cpu_seconds()
            profiler = cProfile.Profile() if PROFILE is not None else None
            if profiler is not None:
                profiler.enable()
            latencies: list[float] = []
            for device in chosen:
                changed_at = time.monotonic()
                async with http.post(
                    f"{fabric_url}/_sim/health",
                    json={"uri": device.attach_unit, "health": "Critical"},
                ) as response:
                    assert response.status == 204, await response.text()
                while device.name not in first_taint:
                    await seen.wait()
                    seen.clear()
                latencies.append(first_taint[device.name] - changed_at)
                # Let the publisher settle before the next change, so that each is alone.
                await asyncio.sleep(0.05)
            cpu = cpu_seconds() - cpu_before
            if profiler is not None and PROFILE is not None:
                profiler.disable()
                profiler.dump_stats(PROFILE)
            slice_writes = sum(publisher.status().writes.values()) - writes_before
            row_writes = (manager.applier.row_writes if manager.applier else 0) - rows_before
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
    status = await service.status()
    events_status = status.get("inventory_events") or {}
    return {
        "samples": len(latencies),
        "ready_s": round(ready_s, 2),
        "latency_p50_s": percentile(latencies, 0.5) / 1000,
        "latency_p99_s": percentile(latencies, 0.99) / 1000,
        "latency_max_s": round(max(latencies), 3),
        "cpu_ms_per_change": round(cpu / len(latencies) * 1000, 1),
        "slice_writes_per_change": round(slice_writes / len(latencies), 2),
        "device_rows_per_change": round(row_writes / len(latencies), 2) if events else None,
        "full_syncs_asked": events_status.get("full_syncs_asked"),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }


async def _published(
    http: aiohttp.ClientSession, kube_url: str, service: Service, events: bool
) -> str:
    """Wait until the inventory is published (and the stream open, with events); return the
    ResourceSlice list's resourceVersion to watch from."""
    while True:
        leading = service.leading
        publishers = list(leading.publishers.values()) if leading is not None else []
        ready = (
            leading is not None
            and leading.inventory_synced
            and publishers
            and all(p.status().synced and not p.status().queue_depth for p in publishers)
            and (
                not events
                or all(m.events is not None and m.events.healthy for m in leading.managers.values())
            )
        )
        if ready:
            async with http.get(f"{kube_url}{SLICES}", params={"limit": "1"}) as response:
                body = await response.json()
            if body.get("items"):
                return str(body["metadata"]["resourceVersion"])
        await asyncio.sleep(0.2)


async def _watch(
    http: aiohttp.ClientSession,
    kube_url: str,
    version: str,
    first_taint: dict[str, float],
    seen: asyncio.Event,
) -> None:
    """Record when each device is first seen tainted in a ResourceSlice; set ``seen``."""
    params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "false"}
    async with http.get(f"{kube_url}{SLICES}", params=params) as response:
        async for line in response.content:
            at = time.monotonic()
            event = json.loads(line)
            for device in (event.get("object") or {}).get("spec", {}).get("devices") or []:
                if device.get("taints") and device["name"] not in first_taint:
                    first_taint[device["name"]] = at
                    seen.set()


def main() -> None:
    """Command line: see the module docstring."""
    parser = command_line(__doc__, "bench.events")
    parser.add_argument("--devices", type=at_least(64), default=10_000)
    parser.add_argument("--samples", type=at_least(1), default=20)
    parser.add_argument("--mode", choices=("events", "polling"), default="events")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", type=Path, default=None, help="cProfile output file")
    args = parser.parse_args()
    global PROFILE
    PROFILE = args.profile
    figures = run_benchmark(measure(args.devices, args.samples, args.mode))
    line = {
        "benchmark": "events",
        "devices": args.devices,
        "mode": args.mode,
        **figures,
    }
    write_figures(args.json, [line])


if __name__ == "__main__":
    main()
