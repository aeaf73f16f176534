"""What the node plugin knows about one allocated device, and where it found it on the host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    """One allocated device of a claim, as the node plugin learns it.

    It comes from our driver's ``status.devices[]`` entry of the claim (``data``: ``uuid``,
    ``serialNumber``, ``deviceType``, ``pciVendorId``, ``pciDeviceId``, ``slot``) or from the
    controller's admin API when the claim has no ``status.devices`` (Kubernetes 1.31).

    Attributes:
        pool: the ResourceSlice pool name.
        device: the device name in the pool (a DNS label), e.g. ``gpu-3f2a``.
        device_type: ``gpu``, ``fpga``, ``nvme``, ``cxl-memory``, ``drive``, ``memory``,
            ``nic`` or ``accelerator``.
        requests: the claim's request names this device serves.
        uuid: the device's UUID as the fabric manager reports it.
        serial: the fabric manager's ``SerialNumber`` (PCIe Device Serial Number, NVMe serial,
            CXL serial, ...).
        pci_vendor_id, pci_device_id: lower-case hex with ``0x``, 4 digits (``0x10de``).
        slot: the fabric's slot or port id (``Location.slot``).
    """

    pool: str
    device: str
    device_type: str
    requests: tuple[str, ...] = ()
    uuid: str | None = None
    serial: str | None = None
    pci_vendor_id: str | None = None
    pci_device_id: str | None = None
    slot: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """One ``/dev`` entry to give the container (the same path on the host and inside).

    Attributes:
        path: e.g. ``/dev/nvme0``.
        type: ``c`` (character) or ``b`` (block).
        major, minor: the device numbers.
    """

    path: str
    type: Literal["c", "b"]
    major: int
    minor: int


@dataclass(frozen=True, slots=True)
class HostDevice:
    """An allocated device found on this host.

    Attributes:
        identity: what was looked for.
        matched_by: the matcher that found it: ``nvme-serial``, ``pci-dsn``, ``uuid``,
            ``cxl-serial`` or ``pci-id-slot``.
        sysfs_path: its sysfs directory as a host path (without the host-root prefix), e.g.
            ``/sys/bus/pci/devices/0000:3b:00.0``.
        pci_address: ``0000:3b:00.0``, when it is a PCI function.
        device_nodes: what to put in the container (may be empty).
    """

    identity: DeviceIdentity
    matched_by: str
    sysfs_path: str
    pci_address: str | None
    device_nodes: tuple[DeviceNode, ...]
