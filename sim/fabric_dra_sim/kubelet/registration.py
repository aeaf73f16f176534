"""The kubelet's plugin watcher and registration handshake, for DRA plugins only.

:class:`PluginWatcher` polls a plugin registry directory (the kubelet uses inotify; polling sees
the same creates and removes, later) and, for each registration socket, runs the handshake the
kubelet's plugin manager runs:

1. dial the socket (10 s), ``GetInfo`` (1 s);
2. a handler for ``PluginInfo.type``: only ``DRAPlugin`` here; otherwise
   ``NotifyRegistrationStatus(false, "no handler registered for plugin type ...")``;
3. an empty endpoint means the registration socket itself; validate: the name (the DRA driver
   name) is a DNS subdomain, the endpoint is an existing socket, and one of the plugin's
   supported gRPC services is one the kubelet speaks;
4. register (an endpoint may not be registered twice for a driver), then
   ``NotifyRegistrationStatus(true)``; a failure sends ``(false, error)`` instead.

A socket that goes away deregisters its plugin; a socket re-created in place (new inode or
modification time) is deregistered and handshaken again. A failed handshake is retried with
exponential backoff (0.5 s doubling to 2 min) while the socket stays.

Sources (kubernetes/kubernetes):

* pkg/kubelet/pluginmanager/pluginwatcher/plugin_watcher.go: which files count (names starting
  with '.' are ignored, only unix sockets, sub-directories are walked).
* pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go: the handshake, its
  timeouts and error texts.
* pkg/kubelet/pluginmanager/reconciler/reconciler.go: re-registration when a socket's
  timestamp changes, deregistration when it goes.
* pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go: ``validateSupportedServices`` (the first of
  the plugin's services that the kubelet supports; error when the list is empty or none
  matches), one endpoint per driver instance, the most recent instance preferred.
* pkg/util/goroutinemap/exponentialbackoff: the retry backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc

from app.node.grpcapi import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc

log = logging.getLogger(__name__)
# The generated gRPC module has no annotations.
_registration_grpc: Any = pluginregistration_v1_pb2_grpc

DRA_PLUGIN_TYPE = "DRAPlugin"
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
DIAL_TIMEOUT_S = 10.0  # operation_generator.go dialTimeoutDuration
GET_INFO_TIMEOUT_S = 1.0  # operation_generator.go: GetInfo's context
NOTIFY_TIMEOUT_S = 5.0  # operation_generator.go notifyTimeoutDuration
RETRY_INITIAL_S = 0.5  # goroutinemap exponentialbackoff initialDurationBeforeRetry
RETRY_MAX_S = 122.0  # goroutinemap exponentialbackoff maxDurationBeforeRetry (2 min 2 s)

# k8s.io/apimachinery IsDNS1123Subdomain: what a DRA driver name must be.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

EventKind = Literal["registered", "refused", "failed", "deregistered"]


@dataclass(frozen=True, slots=True)
class RegisteredPlugin:
    """One registered plugin instance of a DRA driver.

    Attributes:
        name: the DRA driver name (``PluginInfo.name``).
        endpoint: the absolute socket path of its DRA gRPC services.
        service: the chosen DRA service, ``"v1.DRAPlugin"`` or ``"v1beta1.DRAPlugin"``.
        socket_path: the registration socket it was found by.
        supported_services: ``PluginInfo.supported_versions`` as sent.
    """

    name: str
    endpoint: str
    service: str
    socket_path: str
    supported_services: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class HandshakeEvent:
    """One handshake outcome or deregistration, for tests and logs.

    Attributes:
        kind: ``registered`` (notified true), ``refused`` (notified false with ``error``),
            ``failed`` (no notification could be sent: dial, GetInfo or Notify failed) or
            ``deregistered`` (the socket went, or a restart forgot it).
        socket_path: the registration socket.
        name, plugin_type, endpoint, services: what GetInfo answered ('' / () when it did not).
        error: the error text (sent to the plugin for ``refused``).
        at: ``time.monotonic()`` when it happened.
    """

    kind: EventKind
    socket_path: str
    name: str = ""
    plugin_type: str = ""
    endpoint: str = ""
    services: tuple[str, ...] = ()
    error: str = ""
    at: float = 0.0


class _Refused(Exception):
    """The plugin was told it is not registered; str() is what it was told."""


@dataclass(slots=True)
class _SocketState:
    stamp: tuple[int, int]
    registered: RegisteredPlugin | None = None
    next_try: float = 0.0
    backoff_s: float = 0.0


def is_socket(path: Path) -> bool:
    """``path`` is a unix domain socket (not following a dangling link is fine: False)."""
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def _walk_sockets(root: Path) -> Iterator[tuple[str, tuple[int, int]]]:
    """(path, (inode, mtime ns)) of every socket under ``root``, skipping names that start
    with '.' (plugin_watcher.go handleCreateEvent) at any depth."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):  # a link to a socket counts (os.Stat follows)
                info = entry.stat(follow_symlinks=True)
                if stat.S_ISDIR(info.st_mode):
                    continue  # links to directories are not walked: no loops
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode):
            yield from _walk_sockets(Path(entry.path))
        elif stat.S_ISSOCK(info.st_mode):
            yield entry.path, (info.st_ino, info.st_mtime_ns)


# A Kubernetes 1.31 kubelet speaks only dra/v1alpha4, whose gRPC service is v1alpha3.Node, and
# finds it by a version number in the plugin's supported versions.
KUBELET_131_SERVICES = ("v1alpha3.Node",)


def _highest_1x(versions: Sequence[str]) -> str:
    """The 1.31 kubelet's rule (pkg/kubelet/cm/dra/plugin/registration.go highestSupportedVersion,
    k8s.io/apimachinery pkg/util/version ParseGeneric): entries that are not versions are skipped,
    majors above 1 are skipped, the highest left must be 1.x; the service is then v1alpha3.Node.

    Raises:
        ValueError: no 1.x version in ``versions``.
    """
    best: tuple[int, ...] | None = None
    for text in versions:
        parsed = _generic_version(text)
        if parsed is None or parsed[0] > 1:
            continue
        if best is None or parsed > best:
            best = parsed
    if best is None:
        raise ValueError(
            f"could not find a highest supported version from versions ({list(versions)}) "
            "reported by this plugin"
        )
    if best[0] != 1:
        raise ValueError(f"highest supported version reported by plugin is {best}, must be v1.x")
    return KUBELET_131_SERVICES[0]


def _generic_version(text: str) -> tuple[int, ...] | None:
    """ParseGeneric: an optional leading v, then 2 or 3 dot-separated numbers without leading
    zeros (anything after a - or + is ignored); None when it does not parse."""
    core = text.removeprefix("v").split("-", 1)[0].split("+", 1)[0]
    parts = core.split(".")
    if not 2 <= len(parts) <= 3:
        return None
    numbers = []
    for part in parts:
        if not part.isdigit() or (len(part) > 1 and part.startswith("0")):
            return None
        numbers.append(int(part))
    return tuple(numbers)


def choose_service(
    supported: Sequence[str], kubelet_services: Sequence[str] = KUBELET_SERVICES
) -> str:
    """The DRA gRPC service to use: the first of the plugin's ``supported`` that the kubelet
    also speaks (dra_plugin_manager.go ``validateSupportedServices``).

    Raises:
        ValueError: ``supported`` is empty, or none of it is in ``kubelet_services``.
    """
    if not supported:
        raise ValueError("empty list of supported gRPC services (aka supported versions)")
    if tuple(kubelet_services) == KUBELET_131_SERVICES:
        return _highest_1x(supported)
    for service in supported:
        if service in kubelet_services:
            return service
    raise ValueError(
        f"none of services supported by the plugin ({list(supported)}) "
        f"are supported by the kubelet ({list(kubelet_services)})"
    )


class PluginWatcher:
    """Finds DRA plugin registration sockets in ``registry_dir`` and handshakes with them.

    ``await start()`` scans once, then every ``poll_s`` seconds; ``await stop()``.
    :attr:`plugins` maps a driver name to its newest registered instance; :attr:`events` lists
    every handshake and deregistration in order. :meth:`restart` forgets every registration and
    handshakes again with every socket still there (what a kubelet restart does); the files are
    not touched. The ``*_timeout_s`` arguments default to the kubelet's; ``retry_initial_s`` is
    the first backoff after a failed handshake (it doubles up to about 2 min).

    Raises:
        ValueError: ``poll_s`` <= 0 or no ``kubelet_services``.
    """

    def __init__(
        self,
        registry_dir: Path,
        kubelet_services: Sequence[str] = KUBELET_SERVICES,
        poll_s: float = 0.1,
        *,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        get_info_timeout_s: float = GET_INFO_TIMEOUT_S,
        notify_timeout_s: float = NOTIFY_TIMEOUT_S,
        retry_initial_s: float = RETRY_INITIAL_S,
    ) -> None:
        if poll_s <= 0:
            raise ValueError(f"plugin watcher: poll_s must be > 0, got {poll_s}")
        if not kubelet_services:
            raise ValueError("plugin watcher: kubelet_services must not be empty")
        self.registry_dir = Path(registry_dir)
        self.kubelet_services = tuple(kubelet_services)
        self.poll_s = poll_s
        self.dial_timeout_s = dial_timeout_s
        self.get_info_timeout_s = get_info_timeout_s
        self.notify_timeout_s = notify_timeout_s
        self.retry_initial_s = retry_initial_s
        self.events: list[HandshakeEvent] = []
        self._sockets: dict[str, _SocketState] = {}
        # driver name -> its instances, oldest first (dra_plugin_manager.go store).
        self._instances: dict[str, list[RegisteredPlugin]] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    @property
    def plugins(self) -> dict[str, RegisteredPlugin]:
        """Driver name -> its most recently registered instance."""
        return {name: found[-1] for name, found in self._instances.items() if found}

    def events_for(self, socket_path: str | Path) -> list[HandshakeEvent]:
        """The events of one registration socket, in order."""
        return [e for e in self.events if e.socket_path == str(socket_path)]

    async def start(self) -> None:
        """Create the directory if needed (as the kubelet does), scan once, start polling."""
        if self._task is not None:
            return
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        await self.scan_once()
        self._task = asyncio.create_task(self._loop(), name="kubelet-plugin-watcher")

    async def stop(self) -> None:
        """Stop polling (registrations are kept). Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def restart(self) -> None:
        """Forget every registration and handshake again with the sockets present now."""
        async with self._lock:
            for path, state in list(self._sockets.items()):
                self._deregister(path, state)
            self._sockets.clear()
        await self.scan_once()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.scan_once()
            except Exception:  # a scan must never end the loop
                log.exception("plugin watcher: scan of %s failed", self.registry_dir)

    async def scan_once(self) -> None:
        """One pass: deregister gone or re-created sockets, handshake with new ones (and
        failed ones whose backoff is over)."""
        async with self._lock:
            present = dict(_walk_sockets(self.registry_dir))
            for path, state in list(self._sockets.items()):
                if present.get(path) != state.stamp:
                    self._deregister(path, state)
                    del self._sockets[path]
            now = time.monotonic()
            for path, stamp in sorted(present.items()):
                state = self._sockets.setdefault(path, _SocketState(stamp))
                if state.registered is None and now >= state.next_try:
                    ok = await self._handshake(path, state)
                    if not ok:
                        state.backoff_s = min(
                            RETRY_MAX_S,
                            state.backoff_s * 2 if state.backoff_s else self.retry_initial_s,
                        )
                        state.next_try = time.monotonic() + state.backoff_s

    def _record(self, kind: EventKind, socket_path: str, **fields: Any) -> HandshakeEvent:
        event = HandshakeEvent(kind, socket_path, at=time.monotonic(), **fields)
        self.events.append(event)
        level = logging.INFO if kind in ("registered", "deregistered") else logging.WARNING
        log.log(level, "plugin socket %s: %s %s", socket_path, kind, event.error or event.name)
        return event

    def _deregister(self, path: str, state: _SocketState) -> None:
        plugin = state.registered
        if plugin is None:
            return
        state.registered = None
        found = self._instances.get(plugin.name, [])
        if plugin in found:
            found.remove(plugin)
        if not found:
            self._instances.pop(plugin.name, None)
        self._record(
            "deregistered", path, name=plugin.name, plugin_type=DRA_PLUGIN_TYPE,
            endpoint=plugin.endpoint, services=plugin.supported_services,
        )  # fmt: skip

    def _validate(self, info: Any, endpoint: str) -> str:
        """The chosen service, or ValueError with the handler's message."""
        name = str(info.name)
        where = f"DRA driver plugin {name!r} at endpoint {endpoint}"
        if not name:
            raise ValueError(f"DRA driver plugin at endpoint {endpoint}: empty plugin name")
        if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
            raise ValueError(f"{where}: plugin name must be a DNS subdomain (the driver name)")
        if not os.path.isabs(endpoint) or not is_socket(Path(endpoint)):
            raise ValueError(f"{where}: endpoint is not an existing unix socket")
        try:
            return choose_service(list(info.supported_versions), self.kubelet_services)
        except ValueError as err:
            raise ValueError(f"invalid supported gRPC versions of {where}: {err}") from err

    def _register(self, info: Any, endpoint: str, service: str, path: str) -> RegisteredPlugin:
        name = str(info.name)
        found = self._instances.setdefault(name, [])
        if any(p.endpoint == endpoint for p in found):
            raise ValueError(f"endpoint {endpoint} already registered for DRA driver plugin {name}")
        plugin = RegisteredPlugin(name, endpoint, service, path, tuple(info.supported_versions))
        found.append(plugin)
        return plugin

    async def _notify(self, stub: Any, registered: bool, error: str) -> None:
        status = pluginregistration_v1_pb2.RegistrationStatus(
            plugin_registered=registered, error=error
        )
        await stub.NotifyRegistrationStatus(status, timeout=self.notify_timeout_s)

    async def _handshake(self, path: str, state: _SocketState) -> bool:
        """Run the handshake with one socket; True when it registered."""
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            stub = _registration_grpc.RegistrationStub(channel)
            try:
                await asyncio.wait_for(channel.channel_ready(), self.dial_timeout_s)
            except (TimeoutError, grpc.aio.AioRpcError) as err:
                self._record("failed", path, error=f"dial failed at socket {path}: {err!r}")
                return False
            try:
                info = await stub.GetInfo(
                    pluginregistration_v1_pb2.InfoRequest(), timeout=self.get_info_timeout_s
                )
            except grpc.aio.AioRpcError as err:
                self._record("failed", path, error=f"GetInfo at socket {path}: {_rpc_text(err)}")
                return False
            fields: dict[str, Any] = {
                "name": str(info.name),
                "plugin_type": str(info.type),
                "endpoint": str(info.endpoint or path),
                "services": tuple(info.supported_versions),
            }
            try:
                plugin = self._accept(info, path)
            except _Refused as refused:
                return await self._refuse(stub, path, str(refused), fields)
            try:
                await self._notify(stub, True, "")
            except grpc.aio.AioRpcError as err:
                # The kubelet keeps a plugin registered when only the notification failed.
                self._record("failed", path, error=f"notify at {path}: {_rpc_text(err)}", **fields)
            else:
                self._record("registered", path, **fields)
            state.registered = plugin
            state.backoff_s = 0.0
            return True

    def _accept(self, info: Any, path: str) -> RegisteredPlugin:
        """Validate and register, or raise _Refused with the text to send."""
        if info.type != DRA_PLUGIN_TYPE:
            raise _Refused(
                f"RegisterPlugin error -- no handler registered for plugin type: {info.type} "
                f"at socket {path}"
            )
        endpoint = str(info.endpoint or path)
        try:
            service = self._validate(info, endpoint)
        except ValueError as err:
            raise _Refused(
                f"RegisterPlugin error -- plugin validation failed with err: {err}"
            ) from err
        try:
            return self._register(info, endpoint, service, path)
        except ValueError as err:
            raise _Refused(
                f"RegisterPlugin error -- plugin registration failed with err: {err}"
            ) from err

    async def _refuse(self, stub: Any, path: str, error: str, fields: dict[str, Any]) -> bool:
        try:
            await self._notify(stub, False, error)
        except grpc.aio.AioRpcError as err:
            self._record(
                "failed", path, error=f"{error}; notify failed: {_rpc_text(err)}", **fields
            )
        else:
            self._record("refused", path, error=error, **fields)
        return False


def _rpc_text(err: grpc.aio.AioRpcError) -> str:
    return f"{err.code().name}: {err.details()}"


__all__ = [
    "DRA_PLUGIN_TYPE",
    "KUBELET_SERVICES",
    "HandshakeEvent",
    "PluginWatcher",
    "RegisteredPlugin",
    "choose_service",
    "is_socket",
]
