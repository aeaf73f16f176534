"""The node plugin's gRPC servers: the kubelet's plugin registration and DRA services.

Two unix sockets, as upstream's kubeletplugin helper lays them out
(k8s.io/dynamic-resource-allocation/kubeletplugin/draplugin.go, ``PluginDataDirectoryPath``
and ``RegistrarDirectoryPath``):

* ``<plugin_registry_dir>/<driver>-reg.sock``: the pluginregistration ``Registration`` service
  (GetInfo, NotifyRegistrationStatus). The kubelet's plugin watcher finds it and asks for our
  name, type ``DRAPlugin``, our DRA endpoint and the DRA services we serve, and then says
  whether it registered us (pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go).
* ``<plugins_dir>/<driver>/dra.sock``: ``DRAPlugin`` v1 (Kubernetes 1.34 and later) and v1beta1
  (1.32, 1.33), advertised as ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin``
  (staging/src/k8s.io/kubelet/pkg/apis/dra/v1/types.go ``DRAPluginService``), ``v1alpha3.Node``
  (dra/v1alpha4, Kubernetes 1.31, advertised as version ``1.0.0``), and the
  ``DRAResourceHealth`` stream (dra-health v1, v1beta1, v1alpha1).

A stale socket file is removed before listening (the plugin watcher README: "Each time a plugin
starts, it has to delete old sockets"); sockets are mode 0600 (only the kubelet, root, calls).
A kubelet that restarts scans its registry directory again and re-registers us; a registration
socket removed behind our back (a cleaned registry directory) is noticed and made again, so the
next scan finds it.

Bad requests: a claim without UID in a call is refused with INVALID_ARGUMENT (the answer is keyed
by UID); a claim without namespace or name gets a per-claim error; repeated UIDs are prepared
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from app.aio import cancel_and_wait
from app.node.grpcapi import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1alpha4_pb2,
    dra_v1alpha4_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    drahealth_v1_pb2,
    drahealth_v1_pb2_grpc,
    drahealth_v1alpha1_pb2,
    drahealth_v1alpha1_pb2_grpc,
    drahealth_v1beta1_pb2,
    drahealth_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from app.node.metrics import NodeMetrics
from app.node.plan import ClaimRef
from app.node.plugin import NodePlugin, PrepareResult

log = logging.getLogger(__name__)

# The generated service modules carry no types.
_dra_v1_grpc: Any = dra_v1_pb2_grpc
_dra_v1beta1_grpc: Any = dra_v1beta1_pb2_grpc
_dra_v1alpha4_grpc: Any = dra_v1alpha4_pb2_grpc
_health_v1_grpc: Any = drahealth_v1_pb2_grpc
_health_v1beta1_grpc: Any = drahealth_v1beta1_pb2_grpc
_health_v1alpha1_grpc: Any = drahealth_v1alpha1_pb2_grpc
_registration_grpc: Any = pluginregistration_v1_pb2_grpc

PLUGIN_TYPE = "DRAPlugin"  # pluginregistration/v1 constants.go DRAPlugin
# Kubernetes 1.32 and later pick the first service name of this list they speak
# (pkg/kubelet/cm/dra/plugin/registration.go); a 1.31 kubelet reads it as versions, skips what
# does not parse, wants a highest 1.x (pkg/util/version HighestSupportedVersion) and then calls
# v1alpha3.Node (dra/v1alpha4). Names first: a newer kubelet never sees "1.0.0" as its choice.
SUPPORTED_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "1.0.0")
SOCKET_MODE = 0o600
HEALTH_MESSAGE_LIMIT = 1024


def registration_socket(registry_dir: Path, driver: str) -> Path:
    """``<registry_dir>/<driver>-reg.sock``."""
    return registry_dir / f"{driver}-reg.sock"


def dra_socket(plugins_dir: Path, driver: str) -> Path:
    """``<plugins_dir>/<driver>/dra.sock``."""
    return plugins_dir / driver / "dra.sock"


def _claim_refs(claims: Sequence[Any]) -> tuple[list[ClaimRef], dict[str, str]]:
    """The kubelet's claims, without repeats; per-claim errors for incomplete ones.

    Raises:
        ValueError: a claim without UID.
    """
    refs: list[ClaimRef] = []
    errors: dict[str, str] = {}
    seen = set()
    for claim in claims:
        if not claim.uid:
            raise ValueError(f"claim {claim.namespace}/{claim.name} has no uid")
        if claim.uid in seen:
            continue
        seen.add(claim.uid)
        if not claim.namespace or not claim.name:
            errors[claim.uid] = f"claim {claim.uid}: namespace and name are required"
            continue
        refs.append(ClaimRef(claim.namespace, claim.name, claim.uid))
    return refs, errors


class _DraService:
    """DRAPlugin for one API version (``pb`` is its message module)."""

    def __init__(self, plugin: NodePlugin, pb: Any) -> None:
        self.plugin = plugin
        self.pb = pb

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        try:
            refs, errors = _claim_refs(request.claims)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        results: dict[str, PrepareResult] = {
            uid: PrepareResult(error=message) for uid, message in errors.items()
        }
        results.update(await self.plugin.prepare(refs, context.time_remaining()))
        response = self.pb.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error
                continue
            for device in result.devices:
                entry.devices.add(
                    request_names=list(device.requests),
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=list(device.cdi_device_ids),
                )
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        try:
            refs, errors = _claim_refs(request.claims)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        # A claim without namespace or name can still be unprepared by its UID.
        for uid in errors:
            refs.append(ClaimRef("", "", uid))
        results = await self.plugin.unprepare(refs)
        response = self.pb.NodeUnprepareResourcesResponse()
        for uid, error in results.items():
            response.claims[uid].error = error
        return response


class _HealthService:
    """DRAResourceHealth for one version: the whole list at once, then after every change."""

    def __init__(self, plugin: NodePlugin, pb: Any) -> None:
        self.plugin = plugin
        self.pb = pb

    def _snapshot(self) -> Any:
        response = self.pb.NodeWatchResourcesResponse()
        for health in sorted(self.plugin.health.values(), key=lambda h: (h.pool, h.device)):
            entry = response.devices.add()
            entry.device.pool_name = health.pool
            entry.device.device_name = health.device
            entry.health = self.pb.HEALTHY if health.present else self.pb.UNHEALTHY
            entry.last_updated_time = int(health.checked_at)
            message = health.message
            if len(message) > HEALTH_MESSAGE_LIMIT:
                message = message[: HEALTH_MESSAGE_LIMIT - 3] + "..."
            entry.message = message
        return response

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        while True:
            self.plugin.health_changed.clear()
            yield self._snapshot()
            await self.plugin.health_changed.wait()


class _RegistrationService:
    def __init__(self, driver: str, endpoint: Path, metrics: NodeMetrics | None) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.metrics = metrics
        self.registered = asyncio.Event()
        self.last_error = ""

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_SERVICES),
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            log.info("the kubelet registered DRA driver %s", self.driver)
            self.last_error = ""
            self.registered.set()
        else:
            self.last_error = request.error or "no reason given"
            log.error("the kubelet refused DRA driver %s: %s", self.driver, self.last_error)
            self.registered.clear()
        if self.metrics is not None:
            self.metrics.registered.set(1 if request.plugin_registered else 0)
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


def _prepare_socket(path: Path) -> None:
    """Make the socket's directory and remove a stale socket there.

    Raises:
        OSError: the directory cannot be made, or the path holds something that is not a
            socket (it is never removed).
    """
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"{path} exists and is not a socket; not removing it")
    path.unlink()


def _socket_identity(path: Path) -> tuple[int, int] | None:
    try:
        info = path.lstat()
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISSOCK(info.st_mode) else None


class PluginServers:
    """Both gRPC servers of the node plugin.

    Args:
        plugin: does the work.
        driver: our driver name.
        registry_dir, plugins_dir: the kubelet's directories.
        metrics: optional.
        watch_interval_s: how often the registration socket is checked.
    """

    def __init__(
        self,
        plugin: NodePlugin,
        driver: str,
        registry_dir: Path,
        plugins_dir: Path,
        metrics: NodeMetrics | None = None,
        watch_interval_s: float = 2.0,
    ) -> None:
        self.plugin = plugin
        self.driver = driver
        self.registration_path = registration_socket(registry_dir, driver)
        self.dra_path = dra_socket(plugins_dir, driver)
        self.metrics = metrics
        self.watch_interval_s = watch_interval_s
        self.registration = _RegistrationService(driver, self.dra_path, metrics)
        self._dra_server: grpc.aio.Server | None = None
        self._reg_server: grpc.aio.Server | None = None
        self._reg_identity: tuple[int, int] | None = None
        self._watch: asyncio.Task[None] | None = None
        self.recreated = 0

    async def start(self) -> None:
        """Listen on both sockets (DRA first: the kubelet calls it as soon as it registers us).

        Raises:
            OSError: a socket could not be made (the message names it).
        """
        _prepare_socket(self.dra_path)
        server = grpc.aio.server()
        plugin = self.plugin
        _dra_v1_grpc.add_DRAPluginServicer_to_server(_DraService(plugin, dra_v1_pb2), server)
        _dra_v1beta1_grpc.add_DRAPluginServicer_to_server(
            _DraService(plugin, dra_v1beta1_pb2), server
        )
        _dra_v1alpha4_grpc.add_NodeServicer_to_server(_DraService(plugin, dra_v1alpha4_pb2), server)
        for module, pb in (
            (_health_v1_grpc, drahealth_v1_pb2),
            (_health_v1beta1_grpc, drahealth_v1beta1_pb2),
            (_health_v1alpha1_grpc, drahealth_v1alpha1_pb2),
        ):
            module.add_DRAResourceHealthServicer_to_server(_HealthService(plugin, pb), server)
        await self._listen(server, self.dra_path)
        self._dra_server = server
        await self._start_registration()
        self._watch = asyncio.create_task(self._watch_registration(), name="registration-watch")

    async def _listen(self, server: grpc.aio.Server, path: Path) -> None:
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise OSError(f"cannot listen on {path}")
        await server.start()
        os.chmod(path, SOCKET_MODE)

    async def _start_registration(self) -> None:
        _prepare_socket(self.registration_path)
        server = grpc.aio.server()
        _registration_grpc.add_RegistrationServicer_to_server(self.registration, server)
        await self._listen(server, self.registration_path)
        self._reg_server = server
        self._reg_identity = _socket_identity(self.registration_path)
        log.info(
            "DRA driver %s: registration socket %s, DRA socket %s",
            self.driver,
            self.registration_path,
            self.dra_path,
        )

    async def _watch_registration(self) -> None:
        while True:
            await asyncio.sleep(self.watch_interval_s)
            if _socket_identity(self.registration_path) == self._reg_identity:
                continue
            log.warning(
                "registration socket %s was removed or replaced; listening on it again",
                self.registration_path,
            )
            try:
                if self._reg_server is not None:
                    await self._reg_server.stop(0)
                self.registration.registered.clear()
                if self.metrics is not None:
                    self.metrics.registered.set(0)
                await self._start_registration()
                self.recreated += 1
            except OSError as err:
                log.error("cannot listen on %s again: %s", self.registration_path, err)

    @property
    def serving(self) -> bool:
        """True while both servers run and the registration socket is ours (the kubelet can
        find us)."""
        return (
            self._dra_server is not None
            and self._reg_server is not None
            and _socket_identity(self.registration_path) == self._reg_identity
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop listening and remove both sockets (registration first, so the kubelet stops
        using us before the DRA socket goes)."""
        await cancel_and_wait(self._watch)
        for server, path in (
            (self._reg_server, self.registration_path),
            (self._dra_server, self.dra_path),
        ):
            if server is not None:
                await server.stop(grace_s)
            if _socket_identity(path) is not None:
                with contextlib.suppress(OSError):
                    path.unlink()
        self._reg_server = self._dra_server = None


async def health_loop(plugin: NodePlugin, interval_s: float) -> None:
    """Check the prepared devices' presence every ``interval_s`` seconds, for ever."""
    while True:
        started = time.monotonic()
        try:
            await plugin.check_health()
        except Exception:  # a failed check must not end the loop
            log.exception("health check failed")
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
