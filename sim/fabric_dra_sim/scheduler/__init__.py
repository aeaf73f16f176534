"""Scheduler and claim-controller stand-ins for tests and the demo, and
``fabric-dra sim scheduler`` / ``fabric-dra sim claim-controller``.

No kube-scheduler or kube-controller-manager can run here; these do their DRA parts against
any API server, the emulator included:

* :mod:`fabric_dra_sim.scheduler.structured`: structured parameters (resource.k8s.io v1, v1beta2,
  v1beta1): allocation with :mod:`app.allocator`, binding conditions, bind.
* :mod:`fabric_dra_sim.scheduler.classic`: the 1.31 scheduler's side of PodSchedulingContexts.
* :mod:`fabric_dra_sim.scheduler.claim_controller`: kube-controller-manager's resourceclaim
  controller (template claims, releasing consumers, deallocation, deleting unused claims);
  each scheduler stand-in runs one unless told not to.
* :mod:`fabric_dra_sim.scheduler.common`: pod and claim helpers all of them use.

The controller never imports this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any, Protocol

import click

from app import aio
from app.commands.params import MAX_SECONDS, FiniteFloatRange
from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from app.kube.errors import KubeError
from app.logs import setup_logging


class StandIn(Protocol):
    """What the command runs: started once, stopped on Ctrl-C."""

    async def start(self) -> None:
        """Start watching and scheduling; return once running."""

    async def stop(self) -> None:
        """Stop everything started."""


async def _structured(
    client: KubeClient,
    poll_interval_s: float,
    binding_timeout_s: float,
    namespace: str | None,
    claim_controller: bool,
) -> StandIn:
    # Imported here: the allocator (CEL) loads only for the command that needs it.
    from app.kube.versions import discover_version
    from fabric_dra_sim.scheduler.structured import StructuredScheduler, StructuredSettings

    settings = StructuredSettings(
        namespace=namespace,
        poll_interval_s=poll_interval_s,
        binding_timeout_s=binding_timeout_s,
        retry_interval_s=poll_interval_s,
        claim_controller=claim_controller,
    )
    version = await discover_version(client.api)
    click.echo(
        f"scheduler stand-in (structured parameters, resource.k8s.io/{version.value}) "
        f"on {client.host}"
    )
    return StructuredScheduler(client, version, settings)


def _classic(
    client: KubeClient, poll_interval_s: float, namespace: str | None, claim_controller: bool
) -> StandIn:
    from fabric_dra_sim.scheduler.classic import ClassicScheduler, ClassicSchedulerSettings

    click.echo(f"scheduler stand-in (classic DRA, resource.k8s.io/v1alpha3) on {client.host}")
    return ClassicScheduler(
        client,
        ClassicSchedulerSettings(
            namespace=namespace,
            poll_interval_s=min(poll_interval_s, 1.0),
            claim_controller=claim_controller,
        ),
    )


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


async def _stand_in(
    client: KubeClient,
    mode: str,
    poll_interval_s: float,
    binding_timeout_s: float,
    namespace: str | None,
    claim_controller: bool = True,
) -> StandIn:
    from app.modes import discover_modes

    if mode == "auto":
        modes = await discover_modes(client.api, "auto")
        wanted = (["structured"] if modes.structured else []) + (
            ["classic"] if modes.control_plane else []
        )
    else:
        if mode == "classic":
            # Refused up front like structured on 1.31: without v1alpha3 and its
            # podschedulingcontexts the classic stand-in would only log 404s.
            await discover_modes(client.api, "control-plane")
        wanted = [mode]
    parts: list[StandIn] = []
    for part in wanted:
        # One claim controller per API server: with the first stand-in only.
        with_controller = claim_controller and not parts
        if part == "structured":
            parts.append(
                await _structured(
                    client, poll_interval_s, binding_timeout_s, namespace, with_controller
                )
            )
        else:
            parts.append(_classic(client, poll_interval_s, namespace, with_controller))
    return parts[0] if len(parts) == 1 else _Both(parts)


async def _serve(
    client_settings: KubeClientSettings,
    mode: str,
    poll_interval_s: float,
    binding_timeout_s: float,
    namespace: str | None,
    claim_controller: bool = True,
) -> None:
    from app.modes import ModeError

    async with await connect(client_settings) as client:
        try:
            stand_in = await _stand_in(
                client, mode, poll_interval_s, binding_timeout_s, namespace, claim_controller
            )
        except ModeError as err:
            # app.modes words it for the controller's setting; here it is this flag.
            setting = "control-plane" if mode == "classic" else mode
            text = str(err).replace(f"controller.mode {setting}:", f"--mode {mode}:", 1)
            raise click.ClickException(text) from None
        await _run_until_signal(stand_in)


def kube_url_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Check ``--kube-url`` before anything connects: an http(s) origin with a valid port.

    Raises:
        click.BadParameter: what is wrong (:func:`app.config.http_origin_problem`).
    """
    from app.config import http_origin_problem, redact_url

    problem = http_origin_problem(value)
    if problem is not None:
        raise click.BadParameter(
            f"{redact_url(value)!r} {problem} (the API server's origin, e.g. "
            f"https://10.0.0.1:6443)",
            ctx=ctx,
            param=param,
        )
    return value.rstrip("/")


async def _run_until_signal(stand_in: StandIn) -> None:
    """Start ``stand_in``, run it until SIGINT or SIGTERM, stop it."""
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
@click.option(
    "--kube-url",
    required=True,
    callback=kube_url_option,
    help="API server origin (http:// or https://, host, optional port; no path).",
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Bearer token file.",
)
@click.option(
    "--poll-interval",
    default=5.0,
    show_default=True,
    type=FiniteFloatRange(0.01, MAX_SECONDS),
    help="Seconds between binding-condition polls (also the retry interval of pods "
    "that fit nowhere).",
)
@click.option(
    "--binding-timeout",
    default=600.0,
    show_default=True,
    type=FiniteFloatRange(0.01, MAX_SECONDS),
    help="Seconds after allocation before a bind whose conditions are not met fails.",
)
@click.option("--namespace", default=None, help="Only pods and claims of this namespace.")
@click.option(
    "--mode",
    type=click.Choice(["auto", "structured", "classic"]),
    default="auto",
    show_default=True,
    help="structured (kube-scheduler with structured parameters), classic (the 1.31 "
    "scheduler's side of PodSchedulingContexts), or auto: every one the API "
    "server serves.",
)
@click.option(
    "--claim-controller/--no-claim-controller",
    default=True,
    show_default=True,
    help="Also run the claim controller stand-in (`fabric-dra sim claim-controller`); "
    "turn it off when one runs already.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log each decision.")
def cli(
    kube_url: str,
    token_file: Path | None,
    poll_interval: float,
    binding_timeout: float,
    namespace: str | None,
    mode: str,
    claim_controller: bool,
    verbose: bool,
) -> None:
    """Schedule pods that use ResourceClaims, as kube-scheduler's DRA plugin does (and, unless
    --no-claim-controller, kube-controller-manager's claim controller), until Ctrl-C."""
    setup_logging("INFO" if verbose else "WARNING")
    try:
        client_settings = KubeClientSettings(
            mode=KubeAuthMode.URL, url=kube_url, token_file=token_file
        )
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--kube-url") from err
    try:
        aio.run(
            _serve(
                client_settings, mode, poll_interval, binding_timeout, namespace, claim_controller
            )
        )
    except KubeError as err:
        raise click.ClickException(str(err)) from err


async def claim_controller_version(api_client: Any, wanted: str) -> Any:
    """The resource.k8s.io version the claim controller speaks: ``wanted`` when the server
    serves it, or for ``auto`` the preferred structured version served (v1, v1beta2,
    v1beta1), else v1alpha3 (Kubernetes 1.31).

    Raises:
        KubeVersionError: the version is not served (the message names what is).
        KubeError: discovery failed.
    """
    from app.kube.errors import KubeVersionError
    from app.kube.versions import (
        STRUCTURED_PREFERENCE,
        ResourceApiVersion,
        discover_served_versions,
    )

    served = await discover_served_versions(api_client)
    shown = ", ".join(served) or "no version"
    if wanted != "auto":
        if wanted not in served:
            raise KubeVersionError(
                f"resource.k8s.io/{wanted} is not served (the API server serves {shown})"
            )
        return ResourceApiVersion(wanted)
    for version in (*STRUCTURED_PREFERENCE, ResourceApiVersion.V1ALPHA3):
        if version.value in served:
            return version
    raise KubeVersionError(
        f"the API server serves resource.k8s.io {shown}; the claim "
        f"controller needs v1, v1beta2, v1beta1 or v1alpha3"
    )


async def _serve_claim_controller(
    client_settings: KubeClientSettings, wanted: str, namespace: str | None
) -> None:
    from fabric_dra_sim.scheduler.claim_controller import ClaimController, ClaimControllerSettings

    async with await connect(client_settings) as client:
        version = await claim_controller_version(client.api, wanted)
        click.echo(f"claim controller stand-in (resource.k8s.io/{version.value}) on {client.host}")
        await _run_until_signal(
            ClaimController(client, version, ClaimControllerSettings(namespace=namespace))
        )


@click.command("claim-controller")
@click.option(
    "--kube-url",
    required=True,
    callback=kube_url_option,
    help="API server origin (http:// or https://, host, optional port; no path).",
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Bearer token file.",
)
@click.option("--namespace", default=None, help="Only pods and claims of this namespace.")
@click.option(
    "--resource-api-version",
    type=click.Choice(["auto", "v1", "v1beta2", "v1beta1", "v1alpha3"]),
    default="auto",
    show_default=True,
    help="resource.k8s.io version to speak; auto: the newest served (v1alpha3 on Kubernetes 1.31).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log each write.")
def claim_controller_cli(
    kube_url: str,
    token_file: Path | None,
    namespace: str | None,
    resource_api_version: str,
    verbose: bool,
) -> None:
    """Create claims from ResourceClaimTemplates, release and deallocate claims of pods that are
    gone, and delete unused template claims, as kube-controller-manager's resourceclaim
    controller does, until Ctrl-C."""
    setup_logging("INFO" if verbose else "WARNING")
    try:
        client_settings = KubeClientSettings(
            mode=KubeAuthMode.URL, url=kube_url, token_file=token_file
        )
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--kube-url") from err
    try:
        aio.run(_serve_claim_controller(client_settings, resource_api_version, namespace))
    except KubeError as err:
        raise click.ClickException(str(err)) from err


__all__ = ["StandIn", "claim_controller_cli", "claim_controller_version", "cli"]
