"""Scheduler stand-ins for tests and the demo, and ``fabric-dra sim scheduler``.

No kube-scheduler can run here; these do its DRA part (and the claim controller's) against
any API server, the emulator included:

* :mod:`app.sim.scheduler.structured`: structured parameters (resource.k8s.io v1, v1beta2,
  v1beta1): allocation with :mod:`app.allocator`, binding conditions, bind, deallocation.
* :mod:`app.sim.scheduler.common`: pod and claim helpers both stand-ins use.

The controller never imports this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Protocol

import click

from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from app.kube.errors import KubeError
from app.logs import setup_logging


class StandIn(Protocol):
    """What the command runs: started once, stopped on Ctrl-C."""

    async def start(self) -> None:
        """Start watching and scheduling; return once running."""

    async def stop(self) -> None:
        """Stop everything started."""


async def _structured(client: KubeClient, poll_interval_s: float, binding_timeout_s: float,
                      namespace: str | None) -> StandIn:
    # Imported here: the allocator (CEL) loads only for the command that needs it.
    from app.kube.versions import discover_version
    from app.sim.scheduler.structured import StructuredScheduler, StructuredSettings

    settings = StructuredSettings(namespace=namespace, poll_interval_s=poll_interval_s,
                                  binding_timeout_s=binding_timeout_s,
                                  retry_interval_s=poll_interval_s)
    version = await discover_version(client.api)
    click.echo(f"scheduler stand-in (structured parameters, resource.k8s.io/{version.value}) "
               f"on {client.host}")
    return StructuredScheduler(client, version, settings)


def _classic(client: KubeClient, poll_interval_s: float, namespace: str | None) -> StandIn:
    from app.sim.scheduler.classic import ClassicScheduler, ClassicSchedulerSettings

    click.echo(f"scheduler stand-in (classic DRA, resource.k8s.io/v1alpha3) on {client.host}")
    return ClassicScheduler(client, ClassicSchedulerSettings(
        namespace=namespace, poll_interval_s=min(poll_interval_s, 1.0)))


class _Both:
    """Runs several stand-ins as one."""

    def __init__(self, parts: list[StandIn]) -> None:
        self.parts = parts

    async def start(self) -> None:
        for part in self.parts:
            await part.start()

    async def stop(self) -> None:
        for part in reversed(self.parts):
            await part.stop()


async def _stand_in(client: KubeClient, mode: str, poll_interval_s: float,
                    binding_timeout_s: float, namespace: str | None) -> StandIn:
    from app.modes import discover_modes

    if mode == "auto":
        modes = await discover_modes(client.api, "auto")
        wanted = (["structured"] if modes.structured else []) + (
            ["classic"] if modes.control_plane else [])
    else:
        wanted = [mode]
    parts: list[StandIn] = []
    for part in wanted:
        if part == "structured":
            parts.append(await _structured(client, poll_interval_s, binding_timeout_s,
                                           namespace))
        else:
            parts.append(_classic(client, poll_interval_s, namespace))
    return parts[0] if len(parts) == 1 else _Both(parts)


async def _serve(client_settings: KubeClientSettings, mode: str, poll_interval_s: float,
                 binding_timeout_s: float, namespace: str | None) -> None:
    async with await connect(client_settings) as client:
        stand_in = await _stand_in(client, mode, poll_interval_s, binding_timeout_s, namespace)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        # Ctrl-C must also work while the informers are still waiting for the server.
        starting = asyncio.create_task(stand_in.start())
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                starting.result()
                await stopping
        finally:
            for task in (starting, stopping):
                task.cancel()
                # A start that failed has raised above already.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await stand_in.stop()


@click.command("scheduler")
@click.option("--kube-url", required=True, help="API server URL (http:// or https://).")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Bearer token file.")
@click.option("--poll-interval", default=5.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds between binding-condition polls (also the retry interval of pods "
                   "that fit nowhere).")
@click.option("--binding-timeout", default=600.0, show_default=True,
              type=click.FloatRange(min=0.01),
              help="Seconds after allocation before a bind whose conditions are not met fails.")
@click.option("--namespace", default=None, help="Only pods and claims of this namespace.")
@click.option("--mode", type=click.Choice(["auto", "structured", "classic"]), default="auto",
              show_default=True,
              help="structured (kube-scheduler with structured parameters), classic (the 1.31 "
                   "scheduler's side of PodSchedulingContexts), or auto: every one the API "
                   "server serves.")
@click.option("-v", "--verbose", is_flag=True, help="Log each decision.")
def cli(kube_url: str, token_file: Path | None, poll_interval: float, binding_timeout: float,
        namespace: str | None, mode: str, verbose: bool) -> None:
    """Schedule pods that use ResourceClaims, as kube-scheduler's DRA plugin and the claim
    controller do, until Ctrl-C."""
    setup_logging("INFO" if verbose else "WARNING")
    try:
        client_settings = KubeClientSettings(mode=KubeAuthMode.URL, url=kube_url,
                                             token_file=token_file)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--kube-url") from err
    try:
        asyncio.run(_serve(client_settings, mode, poll_interval, binding_timeout, namespace))
    except KubeError as err:
        raise click.ClickException(str(err)) from err


__all__ = ["StandIn", "cli"]
