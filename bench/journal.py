"""Benchmark: one reserve in the journal, as the journal fills with active reservations.

A reserve first checks that nothing holds the device: an active (not ``released``)
reservation of it. The journal holds ``--active`` reservations in ``attached`` (one per
device) and ``--released`` released ones spread over every device, as a driver's journal does
after weeks of claims. Then ``--reserves`` devices that nothing holds are reserved one after
the other (``Journal.reserve``, as the control plane's scheduling pass does): the benchmark's
CPU per reserve (the controller's side: SQLAlchemy and the driver, on SQLite the database
itself), the PostgreSQL server's CPU per reserve, and the latency of one reserve (p50, p99).
Those figures should not grow with the active reservations.

    python -m bench.journal [--devices 20000] [--active 10000] [--released 50000]
        [--reserves 1000] [--database sqlite|postgresql] [--json FILE]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select

from app.clock import utcnow
from app.db.engine import Database
from app.db.migrate import upgrade
from app.db.models import Device, Reservation
from app.inventory.sync import InventorySync
from app.journal import ATTACHED, RELEASED, Journal
from app.reservations import ClaimRef
from bench.common import (
    add_database_option,
    at_least,
    bench_database,
    command_line,
    cpu_seconds,
    database_server_cpu_seconds,
    reference_cpu_seconds,
    reference_units,
    run_benchmark,
    write_figures,
)
from bench.controlplane import InstantBackend, inventory

RACKS = 80
CHUNK = 5_000  # rows per INSERT while the journal is filled


async def measure(
    devices: int, active: int, released: int, reserves: int, database_kind: str
) -> list[dict[str, Any]]:
    """Run the benchmark; return its figure lines.

    Raises:
        ValueError: fewer devices than ``active + reserves`` (each needs one of its own).
    """
    if devices < active + reserves:
        raise ValueError(
            f"{devices} devices cannot hold {active} active reservations and {reserves} more"
        )
    reference = reference_cpu_seconds()
    fabric_devices, hosts = inventory(devices, RACKS)
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_database(database_kind, Path(tmp)) as url:
            database = Database.connect(url)
            try:
                await upgrade(database.engine)
                started = time.perf_counter()
                await InventorySync(InstantBackend(fabric_devices, hosts), database).sync_once()
                rows = await _device_rows(database)
                await _fill(database, rows, active, released)
                await database.analyze("reservations")
                setup_s = time.perf_counter() - started
                line = await _reserves(database, url, rows[active : active + reserves])
            finally:
                await database.dispose()
    line.update(
        {
            "step": "reserves",
            "database": database_kind,
            "devices": devices,
            "active": active,
            "released": released,
            "setup_seconds": round(setup_s, 2),
            "ref_units_per_reserve": round(
                reference_units(line["cpu_ms_per_reserve"] / 1000, reference), 5
            ),
        }
    )
    return [{"step": "reference", "reference_cpu_seconds": round(reference, 4)}, line]


async def _device_rows(database: Database) -> list[tuple[int, str]]:
    async with database.read() as session:
        result = await session.execute(select(Device.id, Device.name).order_by(Device.id))
        return [(int(row[0]), str(row[1])) for row in result]


async def _fill(
    database: Database, rows: list[tuple[int, str]], active: int, released: int
) -> None:
    """``active`` attached reservations on the first devices, one each, and ``released``
    released ones over every device in turn."""
    now = utcnow()

    def row(i: int, state: str, device: tuple[int, str]) -> dict[str, Any]:
        return {
            "claim_uid": f"filled-{i}",
            "claim_namespace": "bench",
            "claim_name": f"claim-{i}",
            "request": "gpu",
            "mode": "controlplane",
            "device_id": device[0],
            "device_name": device[1],
            "pool": "pool",
            "exclusive": True,
            "node": "node-000",
            "host_id": "host-000",
            "state": state,
            "attempts": 1,
            "created_at": now,
            "updated_at": now,
        }

    wanted = [row(i, ATTACHED, rows[i]) for i in range(active)]
    wanted += [row(active + i, RELEASED, rows[i % len(rows)]) for i in range(released)]
    for first in range(0, len(wanted), CHUNK):
        async with database.write() as session:
            await session.execute(insert(Reservation), wanted[first : first + CHUNK])


async def _reserves(database: Database, url: str, free: list[tuple[int, str]]) -> dict[str, Any]:
    journal = Journal(database)
    latencies: list[float] = []
    server0 = await database_server_cpu_seconds(url)
    cpu0 = cpu_seconds()
    for i, (_, name) in enumerate(free):
        started = time.perf_counter()
        await journal.reserve(
            ClaimRef(f"bench-{i}", "bench", f"claim-{i}"),
            "gpu",
            name,
            "pool",
            "controlplane",
            "node-000",
            "host-000",
        )
        latencies.append(time.perf_counter() - started)
    cpu = cpu_seconds() - cpu0
    server = await database_server_cpu_seconds(url) - server0
    ordered = sorted(latencies)
    count = len(free)
    return {
        "reserves": count,
        "cpu_ms_per_reserve": round(cpu / count * 1e3, 3),
        "database_server_cpu_ms_per_reserve": round(server / count * 1e3, 3),
        "p50_ms": round(statistics.median(ordered) * 1e3, 3),
        "p99_ms": round(ordered[max(0, int(count * 0.99) - 1)] * 1e3, 3),
    }


def main() -> None:
    """Run the benchmark and print JSON lines."""
    parser = command_line(__doc__, "bench.journal")
    parser.add_argument("--devices", type=at_least(2), default=20_000, help="devices")
    parser.add_argument(
        "--active", type=at_least(0), default=10_000, help="active reservations before"
    )
    parser.add_argument(
        "--released", type=at_least(0), default=50_000, help="released reservations before"
    )
    parser.add_argument("--reserves", type=at_least(1), default=1_000, help="reserves measured")
    add_database_option(parser)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if args.devices < args.active + args.reserves:
        parser.error(
            f"{args.devices} devices cannot hold {args.active} active reservations and "
            f"{args.reserves} more"
        )
    figures = run_benchmark(
        measure(args.devices, args.active, args.released, args.reserves, args.database)
    )
    write_figures(args.json, figures)


if __name__ == "__main__":
    main()
