"""``fabric-dra inventory``: the stored inventory, grouped by region and rack.

With ``--sync`` it lists the fabric manager first; when that fails the command still prints the
last known inventory, warns on stderr in one line naming the error, and exits with status 1 so
scripts notice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from itertools import groupby

import click
from sqlalchemy.exc import SQLAlchemyError

from app.commands.common import Settings, no_schema, run, settings_options
from app.commands.output import Format, output_option, structured
from app.db import migrate
from app.db.engine import Database, check_usable, missing_sqlite_file, unusable
from app.fabric.factory import backend_from_settings
from app.inventory import InventorySync
from app.inventory.queries import DeviceView, StatusView, list_devices, list_status
from app.units import format_mib

Column = tuple[str, Callable[[DeviceView], str]]

_COLUMNS: tuple[Column, ...] = (
    ("NAME", lambda d: d.name),
    ("TYPE", lambda d: d.device_type),
    ("MODEL", lambda d: " ".join(filter(None, (d.vendor, d.model))) or "-"),
    ("MEMORY", lambda d: format_mib(d.memory_mib) if d.memory_mib is not None else "-"),
    ("HEALTH", lambda d: d.health),
    ("HOST", lambda d: d.host_id or "-"),
    ("SLOT", lambda d: d.slot or "-"),
    ("REMOVED", lambda d: d.removed_at.strftime("%Y-%m-%d %H:%M") if d.removed_at else ""),
)


_WIDE: tuple[Column, ...] = (
    ("STATE", lambda d: d.state or "-"),
    ("SERIAL", lambda d: d.serial or "-"),
    ("FIRMWARE", lambda d: d.firmware_version or "-"),
    ("VENDOR ID", lambda d: d.vendor_id),
)


def unconfigured(devices: Sequence[DeviceView], configured: Collection[str]) -> dict[str, int]:
    """Fabric managers not in ``configured`` that have present devices in ``devices`` -> how
    many: the controller does not publish those devices (a manager renamed or removed from
    the settings)."""
    counts = Counter(d.backend for d in devices if d.removed_at is None and d.backend)
    return {name: n for name, n in sorted(counts.items()) if name not in configured}


def render_table(
    devices: Sequence[DeviceView],
    status: Sequence[StatusView],
    wide: bool = False,
    configured: Collection[str] | None = None,
) -> str:
    """The inventory as text: one block per region and rack (per fabric manager, region and
    rack when there are several), then each fabric manager's sync status; ``wide`` adds each
    device's state, serial number, firmware version and vendor id. With ``configured`` (the
    fabric managers of the settings), the devices of any other manager are marked as not
    published, and a line says so for each such manager."""
    lines: list[str] = []
    left_over = unconfigured(devices, configured) if configured is not None else {}
    several = len({d.backend for d in devices} | {s.backend for s in status}) > 1 or bool(left_over)
    racks = {(d.backend if several else None, d.region, d.rack) for d in devices}
    count = len({s.backend for s in status})
    managers = f" from {count} fabric manager{'' if count == 1 else 's'}" if several else ""
    lines.append(
        f"{len(devices)} device{'' if len(devices) == 1 else 's'} in {len(racks)} "
        f"rack{'' if len(racks) == 1 else 's'}{managers}"
    )
    columns = _COLUMNS if any(d.removed_at for d in devices) else _COLUMNS[:-1]
    if wide:
        columns = columns + _WIDE
    widths = [max([len(title)] + [len(str(get(d))) for d in devices]) for title, get in columns]
    for (manager, region, rack), group in groupby(
        devices, key=lambda d: (d.backend if several else None, d.region, d.rack)
    ):
        members = list(group)
        lines.append("")
        where = f"{region or '(no region)'} / {rack or '(no rack)'}"
        if manager is not None:
            where = f"{manager}: {where}"
        mark = " (fabric manager not configured: not published)" if manager in left_over else ""
        lines.append(f"{where}: {len(members)} devices{mark}")
        pairs = list(zip(columns, widths, strict=True))
        lines.append("  " + "  ".join(title.ljust(w) for (title, _), w in pairs))
        for device in members:
            cells = [str(get(device)).ljust(w) for (_, get), w in pairs]
            lines.append("  " + "  ".join(cells).rstrip())
    for item in status:
        when = (
            item.last_success_at.strftime("%Y-%m-%d %H:%M:%S UTC")
            if item.last_success_at
            else "never"
        )
        state = "STALE" if item.stale else ("failing" if item.consecutive_failures else "ok")
        lines.append("")
        lines.append(
            f"fabric manager {item.backend}"
            f"{' (not configured)' if item.backend in left_over else ''}: {state}, "
            f"last complete sync {when}, "
            f"{item.rejected_count} rejected"
            + (f", last error: {item.last_error}" if item.last_error else "")
        )
    for name, count in left_over.items():
        lines.append("")
        lines.append(
            f"fabric manager {name} is not configured: its {count} "
            f"device{'' if count == 1 else 's'} are not published (was it renamed?)"
        )
    for name in never_synced(devices, status, configured or ()):
        lines.append("")
        lines.append(
            f"fabric manager {name}: never synced into this database (start the controller "
            "on it, or run fabric-dra inventory --sync)"
        )
    return "\n".join(lines)


def never_synced(
    devices: Sequence[DeviceView], status: Sequence[StatusView], configured: Collection[str]
) -> list[str]:
    """The configured fabric managers that neither a sync status nor a device of the
    database names (no sync has been tried against this database), in configuration
    order."""
    known = {s.backend for s in status} | {d.backend for d in devices}
    return [name for name in configured if name not in known]


@dataclass(frozen=True)
class InventoryRead:
    """What the command prints: the stored inventory, and why the sync failed if it did."""

    devices: list[DeviceView]
    status: list[StatusView]
    sync_error: str | None = None


async def _inventory(settings: Settings, sync: bool, include_removed: bool) -> InventoryRead:
    sync_error: str | None = None
    database = Database.connect(settings.database.url)
    try:
        missing = missing_sqlite_file(database.engine)
        if missing is not None and not sync:
            raise no_schema(settings, missing)
        await check_usable(database.engine)
        if sync:
            if settings.database.migrate_on_start:
                await migrate.upgrade(database.engine)
            errors = []
            # Every manager's settings are checked (credential files read) before any sync.
            backends = [
                (manager, backend_from_settings(manager, settings.setting_of(manager)))
                for manager in settings.managers
            ]
            # Every fabric manager in turn; one failing leaves the others' inventory synced.
            for manager, backend in backends:
                try:
                    result = await InventorySync(
                        backend,
                        database,
                        stale_after_failures=settings.inventory.stale_after_failures,
                        name_scope=manager.manager if len(settings.managers) > 1 else None,
                        log_failures=False,  # the command's own warning says it
                        marks_stale=False,  # the controller's judgement, not a one-off's
                    ).sync_once()
                finally:
                    await backend.close()
                if not result.ok:
                    error = (result.error or "unknown error").splitlines()[0]
                    errors.append(
                        f"{manager.manager}: {error}" if len(settings.managers) > 1 else error
                    )
            sync_error = "; ".join(errors) or None
        if await migrate.current(database.engine) is None:
            raise no_schema(settings)
        return InventoryRead(
            await list_devices(database, include_removed=include_removed),
            await list_status(database),
            sync_error,
        )
    except (SQLAlchemyError, OSError) as err:
        raise unusable(database.engine, err) from None
    finally:
        await database.dispose()


@click.command()
@click.option("--sync", is_flag=True, help="Sync from the fabric manager first.")
@output_option
@click.option("--json", "as_json", is_flag=True, help="The same as -o json.")
@click.option("--all", "include_removed", is_flag=True, help="Include removed devices.")
@settings_options
def inventory(
    sync: bool, output: Format, as_json: bool, include_removed: bool, settings: Settings
) -> None:
    """Print the device inventory from the database, grouped by region and rack.

    With --sync, a failed sync still prints the last known inventory and exits with status 1.
    """
    read = run(_inventory(settings, sync, include_removed), settings.event_loop)
    if read.sync_error is not None:
        click.echo(
            f"Warning: sync failed, showing the last known inventory (may be stale): "
            f"{read.sync_error}",
            err=True,
        )
    if as_json:
        output = "json"
    configured = [m.manager for m in settings.managers]
    if output in ("json", "yaml"):
        document = {
            "devices": [d.to_json() for d in read.devices],
            "backends": [s.to_json() for s in read.status],
            "unconfigured_managers": unconfigured(read.devices, configured),
            "never_synced_managers": never_synced(read.devices, read.status, configured),
        }
        click.echo(structured(document, output))
    else:
        click.echo(
            render_table(read.devices, read.status, wide=output == "wide", configured=configured)
        )
    if read.sync_error is not None:
        raise SystemExit(1)
