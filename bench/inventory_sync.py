"""Benchmark: inventory sync of N devices from the Redfish simulator (its own process).

Measures, per size: the first sync (time, rows written, device listing time), a sync with no
change (time, rows written: the target is 0), this process's peak resident memory and CPU, and
the CPU per device in reference units (see ``bench.common.reference_cpu_seconds``). Run one
size per process for a true peak memory figure (the peak only ever grows).

The simulator pages collections (256 members a page) and offers ``$expand`` (``--expand``, the
default), so the listing reads the ResourceBlocks collection with its members and their devices
a page per request;
``--no-expand`` measures the listing of one GET per ResourceBlock and per device.

    python -m bench.inventory_sync --devices 10000 [--no-expand] [--database-url URL]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from app.db.engine import Database
from app.db.migrate import upgrade
from app.fabric.redfish.backend import RedfishBackend
from app.inventory import InventorySync
from bench.common import (
    at_least,
    command_line,
    cpu_seconds,
    peak_rss_mib,
    redfish_simulator_process,
    reference_cpu_seconds,
    reference_units,
    run_benchmark,
    write_figures,
)

PAGE_SIZE = 256
"""Collection page size of the simulator: fabric managers page large collections, and with
``$expand`` a page (not the whole collection) is what the listing holds at a time."""


async def measure(devices: int, database_url: str | None, expand: bool = True) -> dict[str, Any]:
    """Run the benchmark for about ``devices`` devices; return its figures."""
    reference = reference_cpu_seconds()
    racks = max(1, math.ceil(devices / 64))
    per_rack = math.ceil(devices / racks)
    regions = 2 if racks >= 2 else 1
    racks_per_region = math.ceil(racks / regions)
    args = [
        "--regions",
        str(regions),
        "--racks-per-region",
        str(racks_per_region),
        "--devices-per-rack",
        str(per_rack),
        "--hosts-per-rack",
        "4",
        "--auth",
        "none",
        "--page-size",
        str(PAGE_SIZE),
        "--expand" if expand else "--no-expand",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        url = database_url or f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
        database = Database.connect(url)
        await upgrade(database.engine)
        async with redfish_simulator_process(args) as fabric_url:
            backend = RedfishBackend(fabric_url, auth="none", max_concurrency=16, timeout_s=60)
            try:
                started = time.perf_counter()
                listing = await backend.list_devices()
                list_seconds = time.perf_counter() - started
                count = len(listing.items)
                del listing  # the sync lists again; do not count this copy in its memory

                sync = InventorySync(backend, database)
                cpu0 = cpu_seconds()
                first = await sync.sync_once()
                first_cpu = cpu_seconds() - cpu0
                cpu0 = cpu_seconds()
                second = await sync.sync_once()
                second_cpu = cpu_seconds() - cpu0
            finally:
                await backend.close()
                await database.dispose()
    return {
        "benchmark": "inventory_sync",
        "database": url.split(":", 1)[0],
        "expand": expand,
        "devices": count,
        "list_devices_seconds": round(list_seconds, 3),
        "first_sync_seconds": round(first.seconds, 3),
        "first_sync_rows_written": first.row_writes,
        "first_sync_cpu_seconds": round(first_cpu, 3),
        "nochange_sync_seconds": round(second.seconds, 3),
        "nochange_sync_rows_written": second.row_writes,
        "nochange_sync_cpu_seconds": round(second_cpu, 3),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "reference_cpu_seconds": round(reference, 4),
        "first_sync_ref_units_per_1000_devices": round(
            reference_units(first_cpu, reference) / count * 1000, 3
        ),
        "nochange_sync_ref_units_per_1000_devices": round(
            reference_units(second_cpu, reference) / count * 1000, 3
        ),
        "ok": first.ok and second.ok,
    }


def main() -> None:
    parser = command_line(__doc__, "bench.inventory_sync")
    parser.add_argument(
        "--devices",
        type=at_least(1),
        nargs="+",
        default=[1000, 10000],
        help="inventory sizes to measure, each in turn",
    )
    parser.add_argument(
        "--expand",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let the simulator offer $expand (default: yes)",
    )
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    options = parser.parse_args()
    results = [
        run_benchmark(measure(size, options.database_url, options.expand))
        for size in options.devices
    ]
    write_figures(options.json, results)


if __name__ == "__main__":
    main()
