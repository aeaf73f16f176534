"""Small builders for tests: fabric value types, an in-memory fabric backend, and
:func:`eventually` for waiting on asynchronous outcomes."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from app.fabric.errors import FabricConflict, FabricError, FabricNotFound
from app.fabric.types import (
    DeviceType,
    FabricDevice,
    FabricHost,
    Health,
    Listing,
    Location,
    Operation,
    OperationState,
    Rejected,
)
from fabric_dra_sim.redfish import InventorySpec

if TYPE_CHECKING:
    from app.publisher.publisher import Publisher
    from fabric_dra_sim.kubeapi import KubeEmulator

SHARED_DATA = Path(
    os.environ.get(
        "FABRIC_DRA_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"
    )
)
"""The shared test data: ``../shared/data`` beside the checkout, or ``FABRIC_DRA_SHARED_DATA``.
Every test and benchmark finds its data through this (never by an absolute machine path)."""

REDFISH_DATA = Path(os.environ.get("REDFISH_DATA_DIR", SHARED_DATA / "redfish"))
"""The shared Redfish data (DMTF mockups, CSDL): ``redfish`` in :data:`SHARED_DATA`, or
``REDFISH_DATA_DIR``."""

REDFISH_BASIC_AUTH = aiohttp.encode_basic_auth("admin", "password")
"""The ``Authorization`` header value of the Redfish simulator's default account."""

SMALL_REDFISH = InventorySpec(
    regions=1, racks_per_region=2, devices_per_rack=3, hosts_per_rack=2, device_mix="mixed", seed=7
)
"""A small simulated Redfish inventory: 2 racks of 3 mixed devices and 2 hosts each."""


def gpu(
    index: int, *, region: str = "us-east", rack: str = "rack-01", **changes: Any
) -> FabricDevice:
    """A healthy GPU with a Redfish-like vendor id."""
    block = f"/redfish/v1/CompositionService/ResourceBlocks/{region}-{rack}-gpu-{index:03d}"
    device = FabricDevice(
        vendor_id=f"{block}/Processors/GPU0",
        attach_unit=block,
        device_type=DeviceType.GPU,
        vendor="Example",
        model="X100",
        serial=f"SN-{region}-{rack}-{index:04d}",
        uuid=f"00000000-0000-4000-8000-{index:012d}",
        firmware_version="1.2.3",
        memory_mib=81920,
        location=Location(region=region, rack=rack, row="row-1", chassis=f"{rack}-encl"),
        health=Health.OK,
        state="Enabled",
    )
    return replace(device, **changes)


def host(
    index: int, *, region: str = "us-east", rack: str = "rack-01", **changes: Any
) -> FabricHost:
    """A healthy host named like the simulator's."""
    value = FabricHost(
        host_id=f"{region}-{rack}-{index}",
        name=f"server {index}",
        hostname=f"node-{region}-{rack}-{index}",
        location=Location(region=region, rack=rack),
        health=Health.OK,
    )
    return replace(value, **changes)


class MemoryBackend:
    """A FabricBackend kept in memory, for tests of code above the backend.

    Set ``fail_with`` to make listings raise; ``device_rejects`` are reported as the
    backend's own rejections.
    """

    kind = "memory"

    def __init__(
        self,
        devices: list[FabricDevice] | None = None,
        hosts: list[FabricHost] | None = None,
        *,
        name: str = "memory",
    ) -> None:
        self.name = name
        self.devices = list(devices or [])
        self.hosts = list(hosts or [])
        self.device_rejects: list[Rejected] = []
        self.fail_with: FabricError | None = None
        self.list_calls = 0
        self.closed = False

    async def list_hosts(self) -> Listing[FabricHost]:
        self.list_calls += 1
        if self.fail_with:
            raise self.fail_with
        return Listing(tuple(self.hosts))

    async def list_devices(self) -> Listing[FabricDevice]:
        if self.fail_with:
            raise self.fail_with
        return Listing(tuple(self.devices), tuple(self.device_rejects))

    def _find(self, device: FabricDevice) -> int:
        for i, d in enumerate(self.devices):
            if d.vendor_id == device.vendor_id:
                return i
        raise FabricNotFound(f"device {device.vendor_id} not found")

    async def attach(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        on_operation: Callable[[str], Awaitable[None]] | None = None,
    ) -> Operation:
        i = self._find(device)
        holder = self.devices[i].host_id
        if holder not in (None, host_id):
            raise FabricConflict(f"device {device.vendor_id} is attached to {holder}")
        self.devices[i] = replace(self.devices[i], host_id=host_id)
        return Operation(None, OperationState.COMPLETED)

    async def detach(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        on_operation: Callable[[str], Awaitable[None]] | None = None,
    ) -> Operation:
        i = self._find(device)
        if self.devices[i].host_id == host_id:
            self.devices[i] = replace(self.devices[i], host_id=None)
        return Operation(None, OperationState.COMPLETED)

    async def resume(
        self, op_id: str, device: FabricDevice, host_id: str, *, attach: bool
    ) -> Operation:
        # Operations here are synchronous: there is never a task to follow, so the state
        # decides, as the contract says for an operation that is gone.
        if attach:
            return await self.attach(device, host_id)
        return await self.detach(device, host_id)

    async def operation_status(self, op_id: str) -> Operation:
        raise FabricNotFound(f"operation {op_id} not found")

    async def close(self) -> None:
        self.closed = True


async def eventually(
    check: Callable[[], Awaitable[bool] | bool],
    timeout_s: float = 15,
    what: str = "condition",
    interval_s: float = 0.05,
) -> float:
    """Wait until ``check()`` (a plain or an awaitable result) is true, looking every
    ``interval_s`` seconds; returns the seconds waited. Raises AssertionError naming ``what``
    after ``timeout_s``. The one way every test waits for an asynchronous outcome."""
    start = asyncio.get_running_loop().time()
    deadline = start + timeout_s
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return asyncio.get_running_loop().time() - start
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


async def publisher_caught_up(
    emu: KubeEmulator, publisher: Publisher, timeout_s: float = 15
) -> None:
    """Wait until ``publisher``'s watch has delivered everything up to ``emu``'s current
    resourceVersion (an event or a bookmark at or past it: every event before it was handled),
    then until the publisher is idle. Raises AssertionError after ``timeout_s``."""
    target = emu.resource_version
    (informer,) = publisher.informers()
    await eventually(
        lambda: int(informer.resource_version or 0) >= target,
        timeout_s,
        f"the publisher's watch at resourceVersion {target}",
    )
    await publisher.wait_idle(timeout_s)


async def redfish_call(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    auth: str | None = REDFISH_BASIC_AUTH,
    headers: dict[str, str] | None = None,
    **kwargs: Any,
) -> tuple[int, Any, Any]:
    """Send one request with an ``Authorization`` header value ``auth`` (None: none).

    Returns (status, parsed JSON body or raw text or None, headers).
    """
    headers = dict(headers or {})
    if auth is not None:
        headers.setdefault("Authorization", auth)
    async with http.request(method, url, headers=headers, **kwargs) as resp:
        text = await resp.text()
        try:
            body: Any = json.loads(text) if text else None
        except ValueError:
            body = text
        return resp.status, body, resp.headers
