"""Attached devices showing up on the nodes' fake hosts: the link between the Redfish simulator
and :class:`~fabric_dra_sim.fakehost.FakeHost`.

On a real server, a device the fabric manager attaches appears in sysfs (the PCIe switch
brings the link up, the kernel enumerates the function, the driver binds), and it disappears
when detached. :class:`HostSim` does that for the demo: it polls the simulator's state every
``poll_s`` seconds and, for each ResourceBlock a mapped server holds, writes the block's
device into that server's fake host the way the node plugin's finder
(:mod:`app.node.finder`) looks for it; a block no longer held is removed again.

What is written comes from the identity the controller publishes for the device (the same
Redfish properties its parser reads: the device type from the block property and resource,
``UUID`` and ``SerialNumber``):

* a GPU: an NVIDIA GPU (a PCI function and ``/proc/driver/nvidia/gpus/<address>/information``
  with the UUID);
* an NVMe drive: an NVMe controller with the serial;
* CXL memory: a CXL memory device with the serial, when the serial is a number;
* any other type: a PCI function whose Device Serial Number is the serial, when the serial is
  16 hex digits (or lspci's ``00-11-...`` form).

A device that cannot be written (no UUID, a serial the host could not show) is skipped; each
skip is logged once and kept in :attr:`HostSim.notes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app.fabric.redfish.parse.blocks import DeviceSource
from app.fabric.redfish.parse.common import BadItem
from app.fabric.redfish.parse.devices import KIND_PARSERS
from app.node.sysfs import parse_dsn_text, serial_candidates
from fabric_dra_sim.fakehost import FakeHost

log = logging.getLogger(__name__)

# The NVIDIA driver's character majors as /proc/devices lists them (nvidia-frontend is fixed at
# 195; nvidia-uvm is dynamic, 510 is a common value).
NVIDIA_PROC_DEVICES = ("195 nvidia-frontend", "510 nvidia-uvm")
# One PCI bus per attached device: 0000:40:00.0, 0000:41:00.0, ...
FIRST_BUS = 0x40
MAX_DEVICES_PER_HOST = 0xFF - FIRST_BUS
# The PCI ids written for a device found by its DSN (an FPGA: Xilinx's; others: a generic id).
PCI_IDS = {"fpga": ("0x10ee", "0x5000"), "other": ("0x1af4", "0x1041")}
# Block properties that link devices, in the order a block's first device is taken from.
_SOURCES = (DeviceSource.PROCESSOR, DeviceSource.DRIVE, DeviceSource.MEMORY)


class FabricView(Protocol):
    """What :class:`HostSim` reads of the Redfish simulator
    (:class:`fabric_dra_sim.redfish.RedfishSimulator`)."""

    tree: dict[str, Any]

    def block_uris(self) -> list[str]:
        """Every ResourceBlock URI."""
        ...

    def holders(self, block_uri: str) -> list[str]:
        """The ``Id`` of every System holding the block; KeyError when it is unknown."""
        ...


@dataclass(frozen=True, slots=True)
class BlockDevice:
    """The device of one ResourceBlock, as the controller publishes its identity.

    Attributes:
        block: the block's URI.
        device_type: ``gpu``, ``nvme``, ``cxl-memory`` ... (:class:`app.fabric.types.DeviceType`).
        uuid, serial: Redfish ``UUID`` and ``SerialNumber``, when reported.
    """

    block: str
    device_type: str
    uuid: str | None = None
    serial: str | None = None


@dataclass(slots=True)
class Shown:
    """A device written into a fake host.

    Attributes:
        device: the block's device.
        index: its slot on that host (PCI bus ``FIRST_BUS + index``, device minor ``index``).
        pci_address: the PCI function written (for a CXL memory device, its parent's).
        paths: what was created, relative to the host's root (removed on detach).
    """

    device: BlockDevice
    index: int
    pci_address: str
    paths: list[str] = field(default_factory=list)


def _text(payload: Mapping[str, Any], key: str) -> str | None:
    value = payload.get(key)
    return value.strip() if isinstance(value, str) and value.strip() else None


def block_device(tree: Mapping[str, Any], block_uri: str) -> BlockDevice | None:
    """The first device a block links (Processors, Drives, Memory), typed as the controller's
    Redfish parser types it (:data:`app.fabric.redfish.parse.devices.KIND_PARSERS`); None for a
    block without such a device (or one the parser refuses, or a CPU)."""
    block = tree.get(block_uri)
    if not isinstance(block, Mapping):
        return None
    for source in _SOURCES:
        for ref in block.get(source.value) or ():
            uri = ref.get("@odata.id") if isinstance(ref, Mapping) else None
            payload = tree.get(uri) if isinstance(uri, str) else None
            if not isinstance(payload, Mapping):
                continue
            try:
                kind = KIND_PARSERS[source](payload)
            except BadItem:
                continue
            if kind is None:
                continue
            return BlockDevice(
                block_uri,
                str(kind.device_type),
                uuid=_text(payload, "UUID"),
                serial=_text(payload, "SerialNumber"),
            )
    return None


def _entries(root: Path) -> set[str]:
    """Every file, directory and symlink under ``root``, relative (symlinks not followed)."""
    found: set[str] = set()
    for folder, dirs, files in os.walk(root):
        base = Path(folder).relative_to(root)
        found.update(str(base / name) for name in (*dirs, *files))
    return found


def _remove(root: Path, paths: list[str]) -> None:
    """Remove what :func:`_entries` found new, deepest first; a directory another device still
    uses (not empty) stays."""
    for relative in sorted(paths, key=lambda p: (p.count("/"), p), reverse=True):
        path = root / relative
        with contextlib.suppress(OSError):
            if path.is_symlink() or not path.is_dir():
                path.unlink()
            else:
                path.rmdir()


def why_not_shown(device: BlockDevice) -> str | None:
    """Why ``device`` cannot be written to a fake host so that the finder can match it, or
    None when it can."""
    kind = device.device_type
    if kind == "gpu":
        return None if device.uuid else "the GPU has no UUID"
    if kind == "nvme":
        return None if device.serial else "the NVMe drive has no SerialNumber"
    if kind == "cxl-memory":
        if device.serial and serial_candidates(device.serial):
            return None
        return f"CXL memory SerialNumber {device.serial!r} is not a number"
    if device.serial and parse_dsn_text(device.serial) is not None:
        return None
    return (
        f"{kind} SerialNumber {device.serial!r} is no PCIe Device Serial Number "
        "(16 hex digits), and the host shows no other identity for it"
    )


def _write(host: FakeHost, device: BlockDevice, index: int) -> str:
    """Write ``device`` at slot ``index``; returns its PCI address."""
    address = f"0000:{FIRST_BUS + index:02x}:00.0"
    kind = device.device_type
    if kind == "gpu":
        assert device.uuid is not None
        host.nvidia_gpu(address, uuid=device.uuid, minor=index)
    elif kind == "nvme":
        assert device.serial is not None
        host.nvme(index, serial=device.serial, address=address)
    elif kind == "cxl-memory":
        assert device.serial is not None
        host.cxl_mem(index, serial=min(serial_candidates(device.serial)), address=address)
    else:
        dsn = parse_dsn_text(device.serial or "")
        assert dsn is not None
        vendor, device_id = PCI_IDS.get(kind, PCI_IDS["other"])
        host.pci(address, vendor=vendor, device=device_id, dsn=dsn)
    return address


class HostSim:
    """Makes the devices the simulator attaches to a mapped server appear on its fake host.

    Args:
        fabric: the Redfish simulator (read only: :class:`FabricView`).
        hosts: node name -> (the fabric host id, i.e. the System ``Id``, that node's fake host).
        poll_s: seconds between looks at the simulator's state (> 0).

    ``await start()`` makes one pass and starts polling; ``await stop()`` stops (what was
    written stays). :attr:`shown` maps (node, block URI) to what is on that node's host now.

    Raises:
        ValueError: ``poll_s`` <= 0, or two nodes mapped to one fabric host.
    """

    def __init__(
        self,
        fabric: FabricView,
        hosts: Mapping[str, tuple[str, FakeHost]],
        poll_s: float = 0.1,
    ) -> None:
        if poll_s <= 0:
            raise ValueError(f"host simulator: poll_s must be > 0, got {poll_s}")
        by_host: dict[str, str] = {}
        for node, (host_id, _) in hosts.items():
            if host_id in by_host:
                raise ValueError(
                    f"host simulator: nodes {by_host[host_id]} and {node} both map to fabric "
                    f"host {host_id}"
                )
            by_host[host_id] = node
        self.fabric = fabric
        self.hosts = dict(hosts)
        self.poll_s = poll_s
        self.shown: dict[tuple[str, str], Shown] = {}
        self.notes: list[str] = []
        self._by_host = by_host
        self._noted: set[tuple[str, str]] = set()
        self._task: asyncio.Task[None] | None = None
        for _, fake in self.hosts.values():
            fake.proc_devices(*NVIDIA_PROC_DEVICES)

    def _held(self) -> set[tuple[str, str]]:
        """(node, block) for every block a mapped server holds now."""
        held: set[tuple[str, str]] = set()
        for block in self.fabric.block_uris():
            try:
                holders = self.fabric.holders(block)
            except KeyError:
                continue  # removed since the listing
            held.update((self._by_host[h], block) for h in holders if h in self._by_host)
        return held

    def _note(self, node: str, block: str, text: str) -> None:
        if (node, block) in self._noted:
            return
        self._noted.add((node, block))
        line = f"node {node}: device of {block} not shown on the host: {text}"
        self.notes.append(line)
        log.warning("%s", line)

    def _show(self, node: str, block: str) -> None:
        device = block_device(self.fabric.tree, block)
        if device is None:
            self._note(node, block, "the block links no device the controller publishes")
            return
        why = why_not_shown(device)
        if why is not None:
            self._note(node, block, why)
            return
        used = {s.index for (n, _), s in self.shown.items() if n == node}
        index = next((i for i in range(MAX_DEVICES_PER_HOST) if i not in used), None)
        if index is None:
            self._note(node, block, f"more than {MAX_DEVICES_PER_HOST} devices on one host")
            return
        fake = self.hosts[node][1]
        before = _entries(fake.root)
        address = _write(fake, device, index)
        paths = sorted(_entries(fake.root) - before)
        self.shown[(node, block)] = Shown(device, index, address, paths)
        log.info("node %s: %s %s appeared at %s", node, device.device_type, block, address)

    def _hide(self, key: tuple[str, str]) -> None:
        gone = self.shown.pop(key)
        _remove(self.hosts[key[0]][1].root, gone.paths)
        log.info("node %s: %s %s disappeared", key[0], gone.device.device_type, key[1])

    def sync_once(self) -> None:
        """Write what mapped servers hold now and is not shown yet; remove what is shown but
        no longer held. A block detached and attached again between two passes stays."""
        held = self._held()
        for key in [k for k in self.shown if k not in held]:
            self._hide(key)
        self._noted &= held
        for node, block in sorted(held - set(self.shown)):
            if (node, block) not in self._noted:
                self._show(node, block)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                self.sync_once()
            except OSError as err:
                log.warning("host simulator: %s", err)

    async def start(self) -> None:
        """One pass now, then one every ``poll_s`` seconds."""
        self.sync_once()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="host-sim")

    async def stop(self) -> None:
        """Stop polling."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
