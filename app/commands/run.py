"""``fabric-dra run``: the controller service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

import click

from app import aio
from app.commands.common import Settings, settings_options_with
from app.commands.params import FiniteFloatRange, WholeNumberRange
from app.config import ConfigError
from app.db.engine import DatabaseUnavailable, run_to_end
from app.fabric.factory import fleet_from_settings
from app.kube.errors import KubeError

log = logging.getLogger(__name__)


def _flags(
    admin_port: int | None,
    mode: str | None,
    migrate: bool | None,
    leader_election: bool | None,
    **_: Any,
) -> dict[str, Any]:
    return {
        "admin": {"port": admin_port},
        "controller": {"mode": mode},
        "database": {"migrate_on_start": migrate},
        "leader": {"enabled": leader_election},
    }


async def serve(
    settings: Settings, stop: asyncio.Event | None = None, shutdown_deadline_s: float = 20.0
) -> None:
    """Run the service until SIGTERM/SIGINT (or ``stop`` is set), then shut down cleanly.

    Raises:
        click.UsageError: the fabric managers' settings cannot be used (no ``fabric.url``, a
            credential file missing): found before anything starts or the database is
            touched, in one line (exit 2), as other settings errors.
        click.ClickException: the service could not start (the reason in one line).
    """
    from app.service import Service

    try:
        backend = fleet_from_settings(settings)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    service = Service(settings, backend=backend, freeze_heap=True)
    try:
        try:
            started = await aio.unless_stopped(service.start(), stop)
        except (ConfigError, DatabaseUnavailable, KubeError, OSError) as err:
            await service.stop(deadline_s=5)
            raise click.ClickException(f"cannot start: {err}") from None
        except BaseException:
            await service.stop(deadline_s=5)
            raise
        try:
            if started:
                await stop.wait()
                log.info("stopping: finishing work in flight (at most %.0fs)", shutdown_deadline_s)
            else:
                log.info("stopping before start-up finished")
        finally:
            await service.stop(deadline_s=shutdown_deadline_s)
    finally:
        await backend.close()  # given to the service, which does not close what it was given


@click.command()
@click.option(
    "--admin-port",
    type=WholeNumberRange(0, 65535),
    default=None,
    help="Admin HTTP port (admin.port) [8080].",
)
@click.option(
    "--mode",
    type=click.Choice(["structured", "control-plane", "auto"]),
    default=None,
    help="Claim handling mode (controller.mode) [structured]; auto: the one the API server serves.",
)
@click.option(
    "--migrate/--no-migrate",
    default=None,
    help="Upgrade the database schema on start (database.migrate_on_start) [on].",
)
@click.option(
    "--leader-election/--no-leader-election",
    default=None,
    help="Campaign for the Lease; off means this replica always leads [on].",
)
@click.option(
    "--shutdown-deadline",
    type=FiniteFloatRange(0, 600),
    default=20.0,
    show_default=True,
    help="Seconds in-flight work may take after SIGTERM.",
)
@settings_options_with(_flags)
def run(
    admin_port: int | None,
    mode: str | None,
    migrate: bool | None,
    leader_election: bool | None,
    shutdown_deadline: float,
    settings: Settings,
) -> None:
    """Run the controller: inventory, publishing, claims, admin endpoint, leader election."""
    run_to_end(serve(settings, shutdown_deadline_s=shutdown_deadline), settings.event_loop)
