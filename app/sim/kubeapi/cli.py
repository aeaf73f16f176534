"""``fabric-dra sim kube``: run the Kubernetes API emulator until interrupted."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import click
import yaml

from .emulator import KubeEmulator


async def _serve(host: str, port: int, versions: list[str], history_size: int,
                 token: str | None, nodes: list[dict[str, object]]) -> None:
    emulator = KubeEmulator(served_resource_versions=versions, history_size=history_size,
                            token=token)
    for node in nodes:
        emulator.create(dict(node))
    url = await emulator.start(host, port)
    click.echo(f"Kubernetes API emulator serving resource.k8s.io {','.join(versions)} at {url}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await emulator.stop()


@click.command("kube")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=6443, show_default=True, type=int, help="Port (plain HTTP).")
@click.option("--resource-versions", default="v1", show_default=True,
              help="Comma list of resource.k8s.io versions: v1, v1beta2, v1beta1, v1alpha3.")
@click.option("--history-size", default=1000, show_default=True, type=int,
              help="Watch events retained before 410 Expired.")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Require this bearer token.")
@click.option("--nodes-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML list of Node objects to create at start.")
def cli(host: str, port: int, resource_versions: str, history_size: int,
        token_file: Path | None, nodes_file: Path | None) -> None:
    """Serve an emulated Kubernetes API (resource.k8s.io, core, coordination) until Ctrl-C."""
    versions = [v.strip() for v in resource_versions.split(",") if v.strip()]
    token = token_file.read_text().strip() if token_file else None
    nodes: list[dict[str, object]] = []
    if nodes_file:
        loaded = yaml.safe_load(nodes_file.read_text()) or []
        if not isinstance(loaded, list) or not all(isinstance(n, dict) for n in loaded):
            raise click.BadParameter("must be a YAML list of Node objects",
                                     param_hint="--nodes-file")
        nodes = [{"apiVersion": "v1", "kind": "Node", **n} for n in loaded]
    try:
        asyncio.run(_serve(host, port, versions, history_size, token, nodes))
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--resource-versions") from err
