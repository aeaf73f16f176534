"""Devices: the Processors, Drives, Memory and network interfaces a ResourceBlock links, and
the Drives of its Storage and SimpleStorage, as :class:`~app.fabric.types.FabricDevice` values.

What each resource kind contributes (type, memory, capacities, attributes) is read by the
parser that :data:`KIND_PARSERS` names for the block property that linked it; what every
device shares (identity, firmware, slot, health, holder) is read by :func:`parse_device`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.fabric.redfish.parse.blocks import BlockInfo, DeviceSource
from app.fabric.redfish.parse.chassis import part_location_slot
from app.fabric.redfish.parse.common import (
    MAX_INT64,
    BadItem,
    integer,
    links,
    norm_uri,
    obj,
    odata_id,
    parse_health,
    text,
    worst_health,
)
from app.fabric.types import AttributeValue, DeviceType, FabricDevice, Location

PROCESSOR_TYPES: Mapping[str, DeviceType] = {
    "GPU": DeviceType.GPU,
    "FPGA": DeviceType.FPGA,
    "Accelerator": DeviceType.ACCELERATOR,
    "DSP": DeviceType.ACCELERATOR,
    "OEM": DeviceType.OTHER,
}
"""Processor.ProcessorType values that make a composable device; CPUs, cores, threads and
partitions are parts of a computer, not devices to attach."""


def _processor_memory_mib(payload: Mapping[str, Any]) -> int | None:
    memories = payload.get("ProcessorMemory")
    if memories is not None:
        if not isinstance(memories, list):
            raise BadItem("ProcessorMemory is not an array", "bad-type")
        total: int | None = None
        for index, memory in enumerate(memories):
            if not isinstance(memory, Mapping):
                raise BadItem(f"ProcessorMemory[{index}] is not an object", "bad-type")
            size = integer(memory, "CapacityMiB", f"ProcessorMemory[{index}].")
            if size is not None:
                total = (total or 0) + size
        if total is not None:
            if total > MAX_INT64:
                raise BadItem("ProcessorMemory CapacityMiB sum exceeds int64", "bad-value")
            return total
    summary = obj(payload, "MemorySummary")
    return integer(summary, "TotalMemorySizeMiB", "MemorySummary.")


@dataclass(frozen=True, slots=True)
class DeviceKind:
    """What a device's own resource kind says about it.

    Attributes:
        device_type: the device type.
        memory_mib: device memory in MiB (accelerator memory, memory capacity), if reported.
        capacity: extra capacities by name (``capacity_bytes``).
        attributes: kind-specific attributes (``processor_type``, ``protocol``,
            ``media_type``, ``memory_type``, ``speed_mbps``).
    """

    device_type: DeviceType
    memory_mib: int | None = None
    capacity: dict[str, int] = field(default_factory=dict)
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


KindParser = Callable[[Mapping[str, Any]], DeviceKind | None]
"""Reads the kind-specific part of a device resource; None when it is no composable device.
Raises BadItem for wrong types."""


def processor_kind(payload: Mapping[str, Any]) -> DeviceKind | None:
    """A Processor (Processor.v1): an accelerator by ``ProcessorType``
    (:data:`PROCESSOR_TYPES`), its memory from ``ProcessorMemory[].CapacityMiB`` (summed),
    else ``MemorySummary.TotalMemorySizeMiB``.

    Returns:
        The kind, or None for a CPU, core, thread or partition (not a device).

    Raises:
        BadItem: ``ProcessorType`` missing (``missing-field``), wrong types, a memory sum over
            int64.
    """
    processor_type = text(payload, "ProcessorType")
    if processor_type is None:
        raise BadItem("ProcessorType is missing", "missing-field")
    device_type = PROCESSOR_TYPES.get(processor_type)
    if device_type is None:
        return None
    return DeviceKind(
        device_type,
        memory_mib=_processor_memory_mib(payload),
        attributes={"processor_type": processor_type},
    )


def drive_kind(payload: Mapping[str, Any]) -> DeviceKind:
    """A Drive (Drive.v1): NVMe when ``Protocol`` is NVMe, else a drive; ``CapacityBytes``,
    ``Protocol`` and ``MediaType`` when reported.

    Raises:
        BadItem: wrong types or a negative capacity.
    """
    protocol = text(payload, "Protocol")
    device_type = DeviceType.NVME if protocol == "NVMe" else DeviceType.DRIVE
    capacity: dict[str, int] = {}
    size = integer(payload, "CapacityBytes")
    if size is not None:
        capacity["capacity_bytes"] = size
    attributes: dict[str, AttributeValue] = {}
    for key, name in (("Protocol", "protocol"), ("MediaType", "media_type")):
        value = text(payload, key)
        if value is not None:
            attributes[name] = value
    return DeviceKind(device_type, capacity=capacity, attributes=attributes)


def memory_kind(payload: Mapping[str, Any]) -> DeviceKind:
    """A Memory (Memory.v1): CXL memory when it carries a ``CXL`` object, else memory;
    ``CapacityMiB`` and ``MemoryDeviceType`` (else ``MemoryType``) when reported.

    Raises:
        BadItem: ``CXL`` not an object, wrong types or a negative capacity.
    """
    cxl = payload.get("CXL")
    if cxl is not None and not isinstance(cxl, Mapping):
        raise BadItem("CXL is not an object", "bad-type")
    device_type = DeviceType.CXL_MEMORY if cxl is not None else DeviceType.MEMORY
    memory_mib = integer(payload, "CapacityMiB")
    memory_type = text(payload, "MemoryDeviceType") or text(payload, "MemoryType")
    attributes: dict[str, AttributeValue] = {}
    if memory_type is not None:
        attributes["memory_type"] = memory_type
    return DeviceKind(device_type, memory_mib=memory_mib, attributes=attributes)


def network_interface_kind(payload: Mapping[str, Any]) -> DeviceKind:
    """A NetworkInterface or EthernetInterface: a NIC, with ``SpeedMbps`` when reported.

    Raises:
        BadItem: ``SpeedMbps`` is not a non-negative integer.
    """
    attributes: dict[str, AttributeValue] = {}
    speed = integer(payload, "SpeedMbps")
    if speed is not None:
        attributes["speed_mbps"] = speed
    return DeviceKind(DeviceType.NIC, attributes=attributes)


KIND_PARSERS: Mapping[DeviceSource, KindParser] = {
    DeviceSource.PROCESSOR: processor_kind,
    DeviceSource.DRIVE: drive_kind,
    DeviceSource.MEMORY: memory_kind,
    DeviceSource.NETWORK_INTERFACE: network_interface_kind,
    DeviceSource.ETHERNET_INTERFACE: network_interface_kind,
}
"""The parser of each block property's devices (one for every :class:`DeviceSource`)."""


@dataclass(frozen=True, slots=True)
class DeviceContext:
    """What a device inherits from its block.

    Attributes:
        block: the parsed block (attach unit, shareability, fallback health and state).
        location: the location computed for the block.
        host_id: the current holder, or None.
    """

    block: BlockInfo
    location: Location = field(default_factory=Location)
    host_id: str | None = None


def parse_device(
    payload: Any, uri: str, source: DeviceSource, context: DeviceContext
) -> FabricDevice | None:
    """Parse a Processor, Drive, Memory, NetworkInterface or EthernetInterface into a device.

    Args:
        payload: the decoded resource.
        uri: the URI the device was reached at from the block; this is ``vendor_id`` even if
            the payload's own ``@odata.id`` differs (a copy-paste error in vendor data).
        source: which block property linked it; :data:`KIND_PARSERS` reads its kind.
        context: block, location and host it inherits.

    Returns:
        The device, or None when the resource is not a composable device: a CPU (or another
        ProcessorType that is not an accelerator), or anything in a Compute / ComputerSystem
        block (server-owned, rules in :mod:`app.fabric.redfish.parse.blocks`).

    Raises:
        BadItem: missing ``@odata.id``, wrong types, strings over 1 KiB, negative capacity.
    """
    if not isinstance(payload, Mapping):
        raise BadItem("body is not a JSON object", "bad-type")
    odata_id(payload)
    block = context.block
    if block.is_compute:
        return None
    status = obj(payload, "Status")
    kind = KIND_PARSERS[source](payload)
    if kind is None:
        return None
    health = parse_health(status)
    return FabricDevice(
        vendor_id=norm_uri(uri),
        attach_unit=block.uri,
        device_type=kind.device_type,
        vendor=text(payload, "Manufacturer"),
        model=text(payload, "Model"),
        serial=text(payload, "SerialNumber"),
        uuid=text(payload, "UUID"),
        part_number=text(payload, "PartNumber"),
        firmware_version=(
            text(payload, "FirmwareVersion")
            or text(payload, "FirmwareRevision")
            or text(payload, "Revision")
        ),
        memory_mib=kind.memory_mib,
        capacity=kind.capacity,
        attributes=kind.attributes,
        location=dataclasses.replace(context.location, slot=device_slot(payload)),
        health=worst_health(health, block.health),
        state=text(status, "State", "Status.") or block.state,
        host_id=context.host_id,
        shareable=block.shareable,
        name=text(payload, "Name"),
    )


def device_slot(payload: Mapping[str, Any]) -> str | None:
    """The slot a device reports itself: ``PhysicalLocation.PartLocation`` (Drive v1_4+), else
    ``Location.PartLocation`` (Processor, Memory, newer Drive). An array ``Location`` is the
    deprecated Drive v1_0 form and carries no slot.

    Raises:
        BadItem: wrong types in the part location.
    """
    physical = obj(payload, "PhysicalLocation")
    slot = part_location_slot(physical, "PhysicalLocation.")
    if slot is not None:
        return slot
    location = payload.get("Location")
    if isinstance(location, list):
        return None
    return part_location_slot(obj(payload, "Location"))


def storage_drive_links(payload: Any, uri: str) -> tuple[str, ...]:
    """The ``Drives`` links of a Storage resource.

    Raises:
        BadItem: not an object, or ``Drives`` is malformed.
    """
    if not isinstance(payload, Mapping):
        raise BadItem(f"storage {uri}: body is not a JSON object", "bad-type")
    return links(payload, "Drives", f"storage {uri} ")


def parse_simple_storage(
    payload: Any, uri: str, context: DeviceContext
) -> list[FabricDevice | tuple[str, BadItem]]:
    """The inline ``Devices`` of a SimpleStorage resource, one device each.

    SimpleStorage devices have no URI of their own; each is identified by a JSON pointer,
    ``<uri>#/Devices/<index>``.

    Returns:
        Devices, or ``(vendor_id, problem)`` for each malformed entry.

    Raises:
        BadItem: the resource itself is malformed (every device in it is rejected).
    """
    if not isinstance(payload, Mapping):
        raise BadItem("body is not a JSON object", "bad-type")
    odata_id(payload)
    entries = payload.get("Devices") or []
    if not isinstance(entries, list):
        raise BadItem("Devices is not an array", "bad-type")
    result: list[FabricDevice | tuple[str, BadItem]] = []
    for index, entry in enumerate(entries):
        vendor_id = f"{norm_uri(uri)}#/Devices/{index}"
        try:
            if not isinstance(entry, Mapping):
                raise BadItem("entry is not an object", "bad-type")
            size = integer(entry, "CapacityBytes")
            status = obj(entry, "Status")
            health = parse_health(status)
            result.append(
                FabricDevice(
                    vendor_id=vendor_id,
                    attach_unit=context.block.uri,
                    device_type=DeviceType.DRIVE,
                    vendor=text(entry, "Manufacturer"),
                    model=text(entry, "Model"),
                    capacity={} if size is None else {"capacity_bytes": size},
                    location=context.location,
                    health=worst_health(health, context.block.health),
                    state=text(status, "State", "Status.") or context.block.state,
                    host_id=context.host_id,
                    shareable=context.block.shareable,
                    name=text(entry, "Name"),
                )
            )
        except BadItem as err:
            result.append((vendor_id, err))
    return result
