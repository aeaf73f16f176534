"""``fabric-dra inventory``: the stored inventory, grouped by region and rack."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from itertools import groupby

import click
from sqlalchemy.exc import OperationalError, ProgrammingError

from app.commands.common import Settings, run, settings_options
from app.config import redact_url
from app.db import migrate
from app.db.engine import Database
from app.fabric.factory import backend_from_settings
from app.inventory import InventorySync
from app.inventory.queries import DeviceView, StatusView, list_devices, list_status

Column = tuple[str, Callable[[DeviceView], str]]

_COLUMNS: tuple[Column, ...] = (
    ("NAME", lambda d: d.name),
    ("TYPE", lambda d: d.device_type),
    ("MODEL", lambda d: " ".join(filter(None, (d.vendor, d.model))) or "-"),
    ("MEMORY", lambda d: f"{d.memory_mib // 1024} GiB" if d.memory_mib else "-"),
    ("HEALTH", lambda d: d.health),
    ("HOST", lambda d: d.host_id or "-"),
    ("SLOT", lambda d: d.slot or "-"),
    ("REMOVED", lambda d: d.removed_at.strftime("%Y-%m-%d %H:%M") if d.removed_at else ""),
)


def render_table(devices: Sequence[DeviceView], status: Sequence[StatusView]) -> str:
    """The inventory as text: one block per region and rack, then the sync status."""
    lines: list[str] = []
    racks = {(d.region, d.rack) for d in devices}
    lines.append(f"{len(devices)} devices in {len(racks)} racks")
    columns = _COLUMNS if any(d.removed_at for d in devices) else _COLUMNS[:-1]
    widths = [
        max([len(title)] + [len(str(get(d))) for d in devices]) for title, get in columns
    ]
    for (region, rack), group in groupby(devices, key=lambda d: (d.region, d.rack)):
        members = list(group)
        lines.append("")
        lines.append(
            f"{region or '(no region)'} / {rack or '(no rack)'}: {len(members)} devices"
        )
        pairs = list(zip(columns, widths, strict=True))
        lines.append("  " + "  ".join(title.ljust(w) for (title, _), w in pairs))
        for device in members:
            cells = [str(get(device)).ljust(w) for (_, get), w in pairs]
            lines.append("  " + "  ".join(cells).rstrip())
    for item in status:
        when = item.last_success_at.strftime("%Y-%m-%d %H:%M:%S UTC") if item.last_success_at \
            else "never"
        state = "STALE" if item.stale else ("failing" if item.consecutive_failures else "ok")
        lines.append("")
        lines.append(
            f"backend {item.backend}: {state}, last complete sync {when}, "
            f"{item.rejected_count} rejected"
            + (f", last error: {item.last_error}" if item.last_error else "")
        )
    return "\n".join(lines)


async def _inventory(settings: Settings, sync: bool, include_removed: bool) -> tuple[
    list[DeviceView], list[StatusView]
]:
    database = Database.connect(settings.database.url)
    try:
        if sync:
            if settings.database.migrate_on_start:
                await migrate.upgrade(database.engine)
            backend = backend_from_settings(settings.fabric)
            try:
                result = await InventorySync(
                    backend, database,
                    stale_after_failures=settings.inventory.stale_after_failures,
                ).sync_once()
            finally:
                await backend.close()
            if not result.ok:
                click.echo(f"sync failed: {result.error}", err=True)
        if await migrate.current(database.engine) is None:
            raise click.ClickException(
                f"database {redact_url(settings.database.url)} has no schema yet: run "
                "`fabric-dra db upgrade` or `fabric-dra inventory --sync`"
            )
        return (
            await list_devices(database, include_removed=include_removed),
            await list_status(database),
        )
    except (OperationalError, ProgrammingError, OSError) as err:
        raise click.ClickException(
            f"database {redact_url(settings.database.url)}: {type(err).__name__}: "
            f"{str(err).splitlines()[0]}"
        ) from None
    finally:
        await database.dispose()


@click.command()
@click.option("--sync", is_flag=True, help="Sync from the fabric manager first.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--all", "include_removed", is_flag=True, help="Include removed devices.")
@settings_options
def inventory(sync: bool, as_json: bool, include_removed: bool, settings: Settings) -> None:
    """Print the device inventory from the database, grouped by region and rack."""
    devices, status = run(_inventory(settings, sync, include_removed))
    if as_json:
        click.echo(json.dumps({
            "devices": [d.to_json() for d in devices],
            "backends": [s.to_json() for s in status],
        }, indent=2, ensure_ascii=False))
    else:
        click.echo(render_table(devices, status))
