"""``fabric-dra demo``: fabric-dra on a simulated fabric, with no cluster and no hardware.

It starts the Redfish fabric simulator in-process, inventories it into a SQLite file through
the real Redfish backend over HTTP, and tells what happens as the fabric changes: a device
fails, one is pulled, one is added, one is attached to a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import click

from app.commands.common import Settings, run, settings_options
from app.db import migrate
from app.db.engine import Database
from app.fabric.redfish import RedfishBackend
from app.inventory import InventorySync, SyncResult
from app.inventory.queries import DeviceView, list_devices, list_status

DEMO_DATABASE = "sqlite+aiosqlite:///fabric-dra-demo.db"


def _say(text: str) -> None:
    click.echo(click.style("==> ", fg="cyan", bold=True) + text)


def rack_summary(devices: list[DeviceView]) -> str:
    """One line per region and rack: how many devices of each type."""
    racks: dict[tuple[str, str], Counter[str]] = {}
    for device in devices:
        key = (device.region or "(no region)", device.rack or "(no rack)")
        racks.setdefault(key, Counter())[device.device_type] += 1
    return "\n".join(
        f"    {region}/{rack}: {sum(types.values())} devices ("
        + ", ".join(f"{n} {kind}" for kind, n in sorted(types.items())) + ")"
        for (region, rack), types in sorted(racks.items())
    )


def _describe(result: SyncResult) -> str:
    if not result.ok:
        return f"sync failed: {result.error}"
    return (
        f"{result.devices} devices ({result.added} added, {result.changed} changed, "
        f"{result.removed} removed, {result.returned} back), {len(result.rejected)} rejected, "
        f"{result.row_writes} rows written in {result.seconds:.2f}s"
    )


async def _demo(
    settings: Settings, database_url: str, regions: int, racks: int, per_rack: int,
    once: bool, interval: float,
) -> None:
    from app.sim.redfish import Faults, InventorySpec, RedfishSimulator

    password = secrets.token_urlsafe(16)
    sim = RedfishSimulator(
        spec=InventorySpec(regions=regions, racks_per_region=racks, devices_per_rack=per_rack,
                           hosts_per_rack=2, device_mix="mixed", seed=1),
        username="demo", password=password, auth="session",
    )
    url = await sim.start()
    database = Database.connect(database_url)
    backend = RedfishBackend(url, username="demo", password=password, auth="session")
    try:
        _say(f"Redfish fabric simulator listening at {url} "
             f"({len(sim.block_uris())} resource blocks, {len(sim.system_ids())} servers)")
        await migrate.upgrade(database.engine)
        _say(f"database ready: {database_url.split('///')[-1]}")
        sync = InventorySync(backend, database,
                             stale_after_failures=settings.inventory.stale_after_failures)
        result = await sync.sync_once()
        _say(f"inventory synced: {_describe(result)}")
        click.echo(rack_summary(await list_devices(database)))
        click.echo(f"    (the whole table: fabric-dra inventory --database-url {database_url})")

        result = await sync.sync_once()
        _say(f"synced again with nothing changed: {result.row_writes} rows written")

        blocks = sim.block_uris()
        sick, pulled = blocks[0], blocks[1]
        sick_device = next(d for d in (await backend.list_devices()).items
                           if d.attach_unit == sick)
        sim.set_health(sick_device.vendor_id, "Critical")
        sim.remove_block(pulled)
        added = sim.add_block("us-east", "rack-01", "gpu")
        _say(f"fabric changes: {sick.rsplit('/', 1)[-1]} turns Critical, "
             f"{pulled.rsplit('/', 1)[-1]} is pulled, {added.rsplit('/', 1)[-1]} is added")
        result = await sync.sync_once()
        _say(f"inventory synced: {_describe(result)}; health changes: {result.health_changed}")

        free = next(d for d in await list_devices(database) if d.host_id is None)
        host = sim.system_ids()[0]
        listing = await backend.list_devices()
        device = next(d for d in listing.items if d.vendor_id == free.vendor_id)
        await backend.attach(device, host)
        result = await sync.sync_once()
        _say(f"attached {free.name} to server {host} through Redfish; inventory sees it: "
             f"{_describe(result)}")
        await backend.detach(device, host)
        result = await sync.sync_once()
        _say(f"detached it again: {_describe(result)}")

        status = await list_status(database)
        _say("backend status: " + "; ".join(
            f"{s.backend} {'stale' if s.stale else 'fresh'}, {s.device_count} devices"
            for s in status))
        if once:
            return
        sim.faults = Faults(flap_health_rate=0.02)
        _say(f"now syncing every {interval:g}s with flapping health on the simulator; "
             "Ctrl-C to stop")
        await _until_stopped(lambda: _loop(sync, interval))
    finally:
        await backend.close()
        await database.dispose()
        await sim.stop()


async def _loop(sync: InventorySync, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        result = await sync.sync_once()
        if result.row_writes or not result.ok:
            _say(_describe(result))


async def _until_stopped(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    task = asyncio.ensure_future(body())
    try:
        await stop.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        _say("stopped")


@click.command()
@click.option("--once", is_flag=True, help="Tell the story once and exit.")
@click.option("--regions", default=2, show_default=True, type=click.IntRange(1, 20))
@click.option("--racks-per-region", default=2, show_default=True, type=click.IntRange(1, 50))
@click.option("--devices-per-rack", default=8, show_default=True, type=click.IntRange(1, 512))
@click.option("--interval", default=5.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds between syncs after the story.")
@settings_options
def demo(once: bool, regions: int, racks_per_region: int, devices_per_rack: int,
         interval: float, settings: Settings) -> None:
    """Run fabric-dra against a simulated Redfish fabric (no cluster or hardware needed).

    The inventory goes to ./fabric-dra-demo.db unless --database-url is given.
    """
    if settings.log.level == "INFO":
        # The story is the demo's output; routine sync lines would drown it.
        logging.getLogger("app.inventory.sync").setLevel(logging.WARNING)
    url = DEMO_DATABASE if settings.database.url == "sqlite+aiosqlite:///fabric-dra.db" \
        else settings.database.url
    run(_demo(settings, url, regions, racks_per_region, devices_per_rack, once, interval))
