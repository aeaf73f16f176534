"""Plain value types that every fabric backend returns.

These are immutable and carry no I/O: the inventory sync diffs them against the database and
the pool functions turn them into ResourceSlice devices. Units are explicit in field names
(``_mib``, ``_bytes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, TypeVar

AttributeValue = int | bool | str
"""A typed device attribute value (DRA allows int64, bool, string and version)."""


class Health(StrEnum):
    """Device or host health, from Redfish ``Status.Health`` (OK, Warning, Critical).

    ``UNKNOWN`` stands for a missing or unrecognised value.
    """

    OK = "OK"
    WARNING = "Warning"
    CRITICAL = "Critical"
    UNKNOWN = "Unknown"


class DeviceType(StrEnum):
    """What kind of device this is.

    Redfish source: ``Processor.ProcessorType`` (GPU, FPGA, Accelerator, DSP), ``Drive``
    (NVMe and other drives), ``Memory`` (CXL and other fabric memory), network interfaces.
    """

    GPU = "gpu"
    FPGA = "fpga"
    ACCELERATOR = "accelerator"
    NVME = "nvme"
    DRIVE = "drive"
    MEMORY = "memory"
    CXL_MEMORY = "cxl-memory"
    NIC = "nic"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Location:
    """Where a device or host physically sits.

    Every part is optional: a fabric manager may report none of it. Mapping from Redfish
    (``Chassis.Location``) is documented in :mod:`app.fabric.redfish.parse.chassis`.

    Attributes:
        region: a geographic or administrative region (e.g. ``us-east``).
        zone: a zone inside the region (e.g. a room or availability zone).
        site: a site or building.
        row: a row of racks.
        rack: a rack name.
        chassis: the enclosure holding the device (vendor id).
        slot: a slot or bay inside the chassis.
        fabric: the fabric (reachability domain) id, e.g. a Redfish ResourceZone.
        fabric_zone: a finer zone inside the fabric.
        manager: the name of the fabric manager that reports it (set from the database, not
            by backends: ``devices.backend``); a grouping key when several managers are
            configured.
    """

    region: str | None = None
    zone: str | None = None
    site: str | None = None
    row: str | None = None
    rack: str | None = None
    chassis: str | None = None
    slot: str | None = None
    fabric: str | None = None
    fabric_zone: str | None = None
    manager: str | None = None


@dataclass(frozen=True, slots=True)
class FabricDevice:
    """One composable device as the fabric manager reports it.

    Attributes:
        vendor_id: the backend's stable id for the device (for Redfish, the device's
            ``@odata.id``). Unique within one backend; the database key with ``backend``.
        attach_unit: what the fabric attaches as a whole (Redfish: the ResourceBlock's
            ``@odata.id``). Several devices may share one unit.
        device_type: see :class:`DeviceType`.
        vendor, model, serial, uuid, part_number, firmware_version: identity strings.
        memory_mib: device memory in MiB (GPU memory, CXL capacity), if known.
        capacity: extra capacities, name -> integer amount in the unit its name says
            (e.g. ``{"capacity_bytes": 1_000_000}``).
        attributes: extra typed attributes, name -> int | bool | str.
        location: where it is.
        health: see :class:`Health`.
        state: the vendor's state string (Redfish ``Status.State``, e.g. ``Enabled``).
        host_id: the host it is attached to now, or None when free.
        shareable: True when the vendor allows several hosts at once.
        name: a human-readable name from the vendor, if any.
    """

    vendor_id: str
    attach_unit: str
    device_type: DeviceType
    vendor: str | None = None
    model: str | None = None
    serial: str | None = None
    uuid: str | None = None
    part_number: str | None = None
    firmware_version: str | None = None
    memory_mib: int | None = None
    capacity: Mapping[str, int] = field(default_factory=dict)
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    location: Location = field(default_factory=Location)
    health: Health = Health.UNKNOWN
    state: str | None = None
    host_id: str | None = None
    shareable: bool = False
    name: str | None = None


@dataclass(frozen=True, slots=True)
class FabricHost:
    """A server that devices can be attached to (Redfish: a ComputerSystem).

    Attributes:
        host_id: the backend's stable id (Redfish: the System's ``Id``).
        name: the vendor's display name.
        hostname: the host's network name (Redfish ``HostName``), used to match a node.
        uuid, serial: identity strings (Redfish ``UUID``, ``SerialNumber``).
        location: where it is.
        health: see :class:`Health`.
        attached_units: attach units (ResourceBlocks) attached to it now.
    """

    host_id: str
    name: str | None = None
    hostname: str | None = None
    uuid: str | None = None
    serial: str | None = None
    location: Location = field(default_factory=Location)
    health: Health = Health.UNKNOWN
    attached_units: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Rejected:
    """A vendor item that could not be turned into a value type.

    Attributes:
        vendor_id: the item's id (URI) or the best name available for it. A rejected attach
            unit (a Redfish ResourceBlock that could not be read) covers every device in it:
            the inventory keeps their last known state.
        reason: one line saying what is wrong, for logs and the admin status.
        kind: a short machine-readable class of problem (``missing-field``, ``bad-type``,
            ``duplicate``, ``bad-value``, ``fetch-failed``), used as a metric label.
    """

    vendor_id: str
    reason: str
    kind: str = "bad-value"


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Listing(Generic[T]):
    """A complete listing from a backend: the good items and the rejected ones.

    A backend returns a Listing only when it read the whole collection; a listing that
    failed part-way raises :class:`app.fabric.errors.FabricUnavailable` instead, so a
    partial view can never be mistaken for removals.

    Attributes:
        items: the good items, in the vendor's collection order.
        rejected: the items that could not be turned into value types.
        local_units: attach units the backend left out on purpose because they belong to a
            server (Redfish: ResourceBlocks holding the host's own CPUs, DRAM and NICs), in
            collection order. They are neither items nor rejections: they are never devices.
    """

    items: tuple[T, ...]
    rejected: tuple[Rejected, ...] = ()
    local_units: tuple[str, ...] = ()


class OperationState(StrEnum):
    """State of an attach or detach (Redfish TaskState, folded)."""

    COMPLETED = "completed"
    RUNNING = "running"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Operation:
    """The outcome of an attach or detach call.

    Attributes:
        op_id: an id to ask :meth:`FabricBackend.operation_status` about (Redfish: the
            task monitor URI), or None for a synchronous operation.
        state: see :class:`OperationState`.
        message: the vendor's message, if any.
    """

    op_id: str | None
    state: OperationState
    message: str | None = None


@dataclass(frozen=True, slots=True)
class UnitRead:
    """One attach unit (a Redfish ResourceBlock) read again on its own, after an event.

    Attributes:
        unit: the unit's id (URI).
        devices: its devices as a full listing would give them (holders from the unit's own
            links), or an empty listing when the unit is gone.
        gone: the fabric manager no longer has the unit (404): its devices are removed.
    """

    unit: str
    devices: Listing[FabricDevice]
    gone: bool = False
