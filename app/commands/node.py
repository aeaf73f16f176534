"""``fabric-dra node``: the node plugin, the kubelet's DRA plugin for our driver (a DaemonSet)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Any

import click

from app import aio
from app.commands.common import Settings, settings_options_with
from app.commands.params import WholeNumberRange
from app.config import ConfigError
from app.kube.errors import KubeError
from app.node.checkpoint import CheckpointError

log = logging.getLogger(__name__)


def _flags(
    node_name: str | None,
    cdi_dir: Path | None,
    plugins_dir: Path | None,
    plugin_registry_dir: Path | None,
    host_root: Path | None,
    health_port: int | None,
    **_: Any,
) -> dict[str, Any]:
    return {
        "node": {
            "node_name": node_name,
            "cdi_dir": cdi_dir,
            "plugins_dir": plugins_dir,
            "plugin_registry_dir": plugin_registry_dir,
            "host_root": host_root,
            "health_port": health_port,
        }
    }


async def serve_node(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run the node plugin until SIGTERM/SIGINT (or ``stop`` is set).

    Raises:
        click.ClickException: it could not start (the reason in one line).
    """
    from app.node.agent import NodeAgent, node_name

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        agent = NodeAgent(settings, node_name(settings))
    except ConfigError as err:
        raise click.ClickException(str(err)) from None
    try:
        started = await aio.unless_stopped(agent.start(), stop)
    except (ConfigError, KubeError, OSError, CheckpointError) as err:
        await agent.stop()
        raise click.ClickException(f"cannot start: {err}") from None
    except BaseException:
        await agent.stop()
        raise
    try:
        if started:
            await stop.wait()
            log.info("stopping the node plugin")
        else:
            log.info("stopping the node plugin before its start-up finished")
    finally:
        await agent.stop()


@click.command()
@click.option("--node-name", default=None, help="This node's name (node.node_name) [$NODE_NAME].")
@click.option(
    "--cdi-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where CDI specs are written (node.cdi_dir) [/var/run/cdi].",
)
@click.option(
    "--plugins-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The kubelet's plugins directory (node.plugins_dir) [/var/lib/kubelet/plugins].",
)
@click.option(
    "--plugin-registry-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The kubelet's plugin watcher directory (node.plugin_registry_dir) "
    "[/var/lib/kubelet/plugins_registry].",
)
@click.option(
    "--host-root",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the host's /sys, /proc and /dev are seen (node.host_root) [/].",
)
@click.option(
    "--health-port",
    type=WholeNumberRange(0, 65535),
    default=None,
    help="Port of /healthz, /readyz and /metrics (node.health_port) [8081].",
)
@settings_options_with(_flags, fabric_url=False, database_url=False)
def node(
    node_name: str | None,
    cdi_dir: Path | None,
    plugins_dir: Path | None,
    plugin_registry_dir: Path | None,
    host_root: Path | None,
    health_port: int | None,
    settings: Settings,
) -> None:
    """Run the node plugin: register with the kubelet, prepare claims (CDI specs), report
    the prepared devices' health."""
    aio.run(serve_node(settings), settings.event_loop)
