"""The kubelet's DRA gRPC client: NodePrepareResources / NodeUnprepareResources (v1 or v1beta1,
whichever service the registration chose) and the NodeWatchResources health stream.

Answers are checked as the kubelet checks them (pkg/kubelet/cm/dra/manager.go
``prepareResources`` / ``unprepareResources``): an entry for a claim that was not asked for is an
error, and so is a claim left out of the answer. Every call has a deadline, 45 s by default
(pkg/kubelet/cm/dra/plugin/dra_plugin.go ``defaultClientCallTimeout``).

The health stream is tried as ``v1``, then ``v1beta1``, then ``v1alpha1``
(``DRAResourceHealth.NodeWatchResources``; pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go
opens it after registration and a plugin without it answers UNIMPLEMENTED, which means "no
health information", not an error).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

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
)

DEFAULT_TIMEOUT_S = 45.0
_DRA_MODULES: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
    # Kubernetes 1.31 (dra/v1alpha4, package v1alpha3)
    "v1alpha3.Node": (dra_v1alpha4_pb2, dra_v1alpha4_pb2_grpc),
}
_HEALTH_MODULES: tuple[tuple[str, ModuleType, ModuleType], ...] = (
    ("v1", drahealth_v1_pb2, drahealth_v1_pb2_grpc),
    ("v1beta1", drahealth_v1beta1_pb2, drahealth_v1beta1_pb2_grpc),
    ("v1alpha1", drahealth_v1alpha1_pb2, drahealth_v1alpha1_pb2_grpc),
)
_HEALTH_NAMES = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}


class DraError(Exception):
    """A DRA call failed or its answer is wrong; one line naming the driver, endpoint and call.

    Attributes:
        code: the gRPC status code name (``"DEADLINE_EXCEEDED"``) when the call itself failed,
            else None (a bad answer).
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the DRA API names it: namespace, uid, name."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a NodePrepareResources answer.

    Attributes:
        request_names: the claim's requests it serves (``req`` or ``req/subrequest``).
        pool_name, device_name: the device in its ResourceSlice pool.
        cdi_device_ids: fully qualified CDI ids (``vendor/class=name``).
    """

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """The answer for one claim: its devices, or the plugin's error text ('' when none)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One ``DeviceHealth`` entry of a health stream message.

    Attributes:
        pool_name, device_name: the device.
        health: ``"Healthy"``, ``"Unhealthy"`` or ``"Unknown"``.
        last_updated_time: Unix seconds.
        health_check_timeout_seconds: 0 when the plugin sent none.
        message: free text ('' in versions without it).
    """

    pool_name: str
    device_name: str
    health: str
    last_updated_time: int
    health_check_timeout_seconds: int
    message: str


@dataclass(frozen=True, slots=True)
class HealthUpdate:
    """One NodeWatchResources message: the API version it came on and its devices."""

    version: str
    devices: tuple[DeviceHealth, ...]


def _check_uids(
    asked: Sequence[ClaimRef], answered: Mapping[str, Any], where: str
) -> dict[str, ClaimRef]:
    by_uid = {c.uid: c for c in asked}
    unknown = sorted(set(answered) - set(by_uid))
    if unknown:
        raise DraError(f"{where}: answer has a result for unknown claim UID {unknown[0]}")
    missing = [c for c in asked if c.uid not in answered]
    if missing:
        names = ", ".join(f"{c.namespace}/{c.name} ({c.uid})" for c in missing)
        raise DraError(f"{where}: answer skipped {len(missing)} ResourceClaims: {names}")
    return by_uid


def _health_entry(entry: Any) -> DeviceHealth:
    return DeviceHealth(
        pool_name=str(entry.device.pool_name),
        device_name=str(entry.device.device_name),
        health=_HEALTH_NAMES.get(int(entry.health), f"Unknown({int(entry.health)})"),
        last_updated_time=int(entry.last_updated_time),
        health_check_timeout_seconds=int(getattr(entry, "health_check_timeout_seconds", 0)),
        message=str(getattr(entry, "message", "")),
    )


class DraClient:
    """A connection to one DRA plugin endpoint speaking ``service``.

    Args:
        endpoint: absolute unix socket path.
        service: ``"v1.DRAPlugin"`` or ``"v1beta1.DRAPlugin"``.
        driver: the driver name, for messages.

    Raises:
        ValueError: an unknown service or a relative endpoint.
    """

    def __init__(self, endpoint: str, service: str, driver: str = "") -> None:
        if service not in _DRA_MODULES:
            raise ValueError(f"DRA client: unsupported service {service!r}, want one of "
                             f"{sorted(_DRA_MODULES)}")  # fmt: skip
        if not endpoint.startswith("/"):
            raise ValueError(f"DRA client: endpoint must be an absolute path, got {endpoint!r}")
        self.endpoint = endpoint
        self.service = service
        self.driver = driver
        self._pb2, grpc_module = _DRA_MODULES[service]
        self._channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        stub = getattr(grpc_module, "DRAPluginStub", None) or grpc_module.NodeStub
        self._stub = stub(self._channel)

    def _where(self, call: str) -> str:
        return f"DRA driver {self.driver or '?'} at {self.endpoint}: {call} ({self.service})"

    def _rpc_error(self, call: str, err: grpc.aio.AioRpcError, timeout_s: float) -> DraError:
        code = err.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            text = f"no answer within {timeout_s:g}s (DEADLINE_EXCEEDED)"
        elif code == grpc.StatusCode.UNAVAILABLE:
            text = f"plugin not reachable (UNAVAILABLE): {err.details()}"
        else:
            text = f"{code.name}: {err.details()}"
        return DraError(f"{self._where(call)}: {text}", code.name)

    def _claims(self, claims: Sequence[ClaimRef]) -> list[Any]:
        return [self._pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]

    async def prepare(
        self, claims: Sequence[ClaimRef], timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> dict[str, PrepareResult]:
        """NodePrepareResources for ``claims``; claim uid -> its result (a per-claim error is
        in :attr:`PrepareResult.error`, not raised).

        Raises:
            DraError: the call failed (deadline, unreachable, any gRPC error) or the answer
                names an unknown claim uid or skips a claim.
        """
        request = self._pb2.NodePrepareResourcesRequest(claims=self._claims(claims))
        try:
            answer = await self._stub.NodePrepareResources(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._rpc_error("NodePrepareResources", err, timeout_s) from err
        _check_uids(claims, answer.claims, self._where("NodePrepareResources"))
        out: dict[str, PrepareResult] = {}
        for uid, result in answer.claims.items():
            devices = tuple(
                PreparedDevice(
                    tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids)
                )
                for d in result.devices
            )
            out[str(uid)] = PrepareResult(devices, str(result.error))
        return out

    async def unprepare(
        self, claims: Sequence[ClaimRef], timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> dict[str, str]:
        """NodeUnprepareResources for ``claims``; claim uid -> the plugin's error ('' = done).

        Raises:
            DraError: as :meth:`prepare`.
        """
        request = self._pb2.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        try:
            answer = await self._stub.NodeUnprepareResources(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._rpc_error("NodeUnprepareResources", err, timeout_s) from err
        _check_uids(claims, answer.claims, self._where("NodeUnprepareResources"))
        return {str(uid): str(result.error) for uid, result in answer.claims.items()}

    async def watch_health(
        self, first_timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> AsyncIterator[HealthUpdate] | None:
        """Open NodeWatchResources (v1, then v1beta1, then v1alpha1) and wait for its first
        message. Returns an async iterator of :class:`HealthUpdate` (the first message
        included; it ends when the plugin ends the stream), or None when every version answers
        UNIMPLEMENTED (the plugin offers no health).

        Raises:
            DraError: another gRPC error, or no first message within ``first_timeout_s``.
        """
        for version, pb2, grpc_module in _HEALTH_MODULES:
            stub = grpc_module.DRAResourceHealthStub(self._channel)
            call = stub.NodeWatchResources(pb2.NodeWatchResourcesRequest())
            try:
                first = await asyncio.wait_for(call.read(), first_timeout_s)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    continue
                raise self._rpc_error(
                    f"NodeWatchResources {version}", err, first_timeout_s
                ) from err
            except TimeoutError as err:
                call.cancel()
                raise DraError(
                    f"{self._where(f'NodeWatchResources {version}')}: no first message within "
                    f"{first_timeout_s:g}s",
                    "DEADLINE_EXCEEDED",
                ) from err
            if first is grpc.aio.EOF:
                return _no_updates()
            return self._updates(version, call, first)
        return None

    async def _updates(self, version: str, call: Any, first: Any) -> AsyncIterator[HealthUpdate]:
        message = first
        try:
            while message is not grpc.aio.EOF:
                yield HealthUpdate(version, tuple(_health_entry(d) for d in message.devices))
                try:
                    message = await call.read()
                except grpc.aio.AioRpcError as err:
                    if err.code() == grpc.StatusCode.CANCELLED:
                        return
                    raise self._rpc_error(f"NodeWatchResources {version}", err, 0) from err
        finally:
            call.cancel()

    async def close(self) -> None:
        """Close the channel. Idempotent."""
        await self._channel.close()

    async def __aenter__(self) -> DraClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _no_updates() -> AsyncIterator[HealthUpdate]:
    return
    yield  # pragma: no cover - makes this an async generator


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ClaimRef",
    "DeviceHealth",
    "DraClient",
    "DraError",
    "HealthUpdate",
    "PrepareResult",
    "PreparedDevice",
]
