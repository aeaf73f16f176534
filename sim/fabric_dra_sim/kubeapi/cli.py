"""``fabric-dra sim kube``: run the Kubernetes API emulator until interrupted."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from pathlib import Path

import click
import yaml

from app import aio

from ..listen import listen
from .cluster import (
    DEFAULT_KUBERNETES_VERSION,
    PROFILES,
    parse_feature_gates,
    parse_version,
    profile,
    resolve_gates,
    resolve_served,
)
from .emulator import KubeEmulator
from .errors import StatusError
from .rbac import RbacPolicy

DEFAULT_RBAC_USER = "system:serviceaccount:fabric-dra:fabric-dra"


def _url(host: str, port: int) -> str:
    """``http://host:port``, an IPv6 address in brackets (RFC 3986 section 3.2.2)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _create_nodes(emulator: KubeEmulator, nodes: list[dict[str, object]]) -> None:
    """Create ``nodes``; an invalid one is a ``--nodes-file`` error naming it.

    Raises:
        click.BadParameter: the emulator refused a Node (its Status message).
    """
    for index, node in enumerate(nodes):
        try:
            emulator.create(dict(node))
        except StatusError as err:
            raise click.BadParameter(
                f"Node {index + 1}: {err.message}", param_hint="--nodes-file"
            ) from None


async def _start(emulator: KubeEmulator, host: str, port: int) -> str:
    """Start serving; a port or address that cannot be bound is a one-line flag error.

    Raises:
        click.BadParameter: the port is taken or not allowed (``--port``), or the address is
            unknown or not this machine's (``--host``).
    """
    await listen(emulator.start(host, port), host, port)
    return _url(host, int(emulator.url.rsplit(":", 1)[1]))


async def _serve(
    emulator: KubeEmulator, host: str, port: int, nodes: list[dict[str, object]]
) -> None:
    # The signal handlers come first: the "serving" line tells a supervisor it may stop us
    # from then on, and a SIGINT before them would abort instead of stopping cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    _create_nodes(emulator, nodes)
    url = await _start(emulator, host, port)
    versions = ",".join(emulator.served_resource_versions)
    click.echo(
        f"Kubernetes API emulator (Kubernetes {emulator.cluster.version}) serving "
        f"resource.k8s.io {versions} at {url}"
    )
    freezer = asyncio.create_task(_freeze_stored_objects(emulator), name="heap-freezer")
    try:
        await stop.wait()
    finally:
        freezer.cancel()
        await emulator.stop()


# How often stored objects are moved out of the garbage collector's view, seconds.
FREEZE_EVERY_S = 1.0


async def _freeze_stored_objects(emulator: KubeEmulator, every_s: float = FREEZE_EVERY_S) -> None:
    """Every ``every_s`` seconds in which something was written, move every object alive
    out of the garbage collector's view (``gc.freeze``, no collection: it costs nothing).

    The store keeps every object and its watch history (200,000 events in the benchmarks).
    Left in view, each full collection walked all of it again, longer as the store grew:
    8% of the emulator's CPU over 3,000 pods of bench.controlplane (1.3 s of 15 s; 0.1 s
    after). A frozen object is still freed by reference counting once the store drops it;
    stored objects and events hold no reference cycles. What a freeze keeps for good is
    cyclic garbage not yet collected at that moment (collections of the young generation
    run every 700 allocations); the emulator's peak memory over those 3,000 pods was the
    same, 389 MB, with and without.
    """
    frozen_at = emulator.resource_version
    while True:
        await asyncio.sleep(every_s)
        if emulator.resource_version != frozen_at:
            gc.freeze()
            frozen_at = emulator.resource_version


def _load_nodes(path: Path) -> object:
    """The YAML document of ``--nodes-file`` (None for an empty file).

    Raises:
        click.BadParameter: the file is unreadable, not UTF-8, not valid YAML or nested too
            deeply for the YAML reader.
    """
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise click.BadParameter(
            f"cannot read it: {err.strerror}", param_hint="--nodes-file"
        ) from None
    except UnicodeDecodeError:
        raise click.BadParameter("is not UTF-8 text", param_hint="--nodes-file") from None
    except RecursionError:
        raise click.BadParameter(
            "is nested too deeply to read", param_hint="--nodes-file"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise click.BadParameter(f"is not valid YAML{where}", param_hint="--nodes-file") from None


def _read_token(path: Path, flag: str) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise click.BadParameter("is not UTF-8 text", param_hint=flag) from None
    if not token:
        raise click.BadParameter("the file is empty", param_hint=flag)
    return token


@click.command("kube")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    default=6443,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port (plain HTTP; 0: any free port).",
)
@click.option(
    "--kubernetes-version",
    default=DEFAULT_KUBERNETES_VERSION,
    show_default=True,
    help=f"Emulated Kubernetes release ({', '.join(PROFILES)}; also v1.34 or "
    "v1.34.2): its served versions, feature-gate defaults and schemas.",
)
@click.option(
    "--feature-gates",
    default="",
    help="Gate overrides as kube-apiserver takes them, e.g. "
    "DRADeviceTaints=true,DRAAdminAccess=false.",
)
@click.option(
    "--resource-versions",
    default=None,
    help="Comma list of resource.k8s.io versions to serve (first = preferred); "
    "default: the release's (v1 for 1.34+, v1alpha3 for 1.31).",
)
@click.option(
    "--history-size",
    default=1000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Watch events retained before 410 Expired.",
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Require this bearer token (an unrestricted admin).",
)
@click.option(
    "--nodes-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML list of Node objects to create at start.",
)
@click.option(
    "--rbac-manifests",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="RBAC YAML file or folder (repeatable): Roles, ClusterRoles and bindings "
    "that restrict --rbac-user; other kinds are ignored.",
)
@click.option(
    "--rbac-user",
    default=DEFAULT_RBAC_USER,
    show_default=True,
    help="The user whose requests RBAC checks.",
)
@click.option(
    "--rbac-token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File holding the bearer token that authenticates as --rbac-user "
    "(required with --rbac-manifests).",
)
@click.option(
    "--no-validation",
    is_flag=True,
    help="Store writes without the schema and field-rule checks (benchmarks: the "
    "checks cost this Python emulator more than serving the request).",
)
def cli(
    host: str,
    port: int,
    kubernetes_version: str,
    feature_gates: str,
    resource_versions: str | None,
    history_size: int,
    token_file: Path | None,
    nodes_file: Path | None,
    rbac_manifests: tuple[Path, ...],
    rbac_user: str,
    rbac_token_file: Path | None,
    no_validation: bool,
) -> None:
    """Serve an emulated Kubernetes API (resource.k8s.io, core, coordination) until Ctrl-C.

    With --rbac-manifests, requests bearing the --rbac-token-file token act as --rbac-user
    and get 403 Forbidden unless the manifests' roles allow them; other requests are
    unrestricted (or need --token-file's token when given).
    """
    try:
        release = profile(parse_version(kubernetes_version))
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--kubernetes-version") from err
    try:
        gates = parse_feature_gates(feature_gates)
        resolve_gates(release, gates)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--feature-gates") from err
    versions = (
        None
        if resource_versions is None
        else [v.strip() for v in resource_versions.split(",") if v.strip()]
    )
    try:
        resolve_served(release, versions)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--resource-versions") from err
    token = _read_token(token_file, "--token-file") if token_file else None
    nodes: list[dict[str, object]] = []
    if nodes_file:
        loaded = _load_nodes(nodes_file) or []
        if not isinstance(loaded, list) or not all(isinstance(n, dict) for n in loaded):
            raise click.BadParameter(
                "must be a YAML list of Node objects", param_hint="--nodes-file"
            )
        nodes = [{"apiVersion": "v1", "kind": "Node", **n} for n in loaded]
    rbac: RbacPolicy | None = None
    tokens: dict[str, str] = {}
    if rbac_manifests:
        if rbac_token_file is None:
            raise click.BadParameter(
                "is required with --rbac-manifests", param_hint="--rbac-token-file"
            )
        try:
            rbac = RbacPolicy.from_manifests(rbac_manifests)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--rbac-manifests") from err
        tokens[_read_token(rbac_token_file, "--rbac-token-file")] = rbac_user
    elif rbac_token_file is not None:
        raise click.BadParameter("needs --rbac-manifests", param_hint="--rbac-token-file")
    emulator = KubeEmulator(
        kubernetes_version=kubernetes_version,
        feature_gates=gates,
        served_resource_versions=versions,
        history_size=history_size,
        validate=not no_validation,
        token=token,
        tokens=tokens,
        rbac=rbac,
    )
    aio.run(_serve(emulator, host, port, nodes))
