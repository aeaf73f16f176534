"""ResourceBlocks: what a block links, whether it is a server's, and who holds it.

Server-owned blocks (never devices): a ResourceBlock is part of a server, not a composable
device, when

* its ``ResourceBlockType`` (ResourceBlock.v1) contains ``Compute`` or ``ComputerSystem``, or
* it has a top-level ``ComputerSystems`` array naming a System (the System *is* the block:
  DMTF's composability mockups, DSP2050), or
* its ``Id`` or URI matches one of the configured ``fabric.server_owned_blocks`` fnmatch
  patterns, or
* one of its ``Processors`` is a ``ProcessorType: CPU`` (Processor.v1). Real services report
  ``ResourceBlockType: []`` on every block and start every System holding its own block of
  CPUs, DRAM and NICs; this rule is what finds those.

Such a block yields no device at all (not even an accelerator in it) and is reported in
:attr:`~app.fabric.types.Listing.local_units`; attach and detach refuse it.

Current host: the hosts of a block are the Systems in the block's ``Links.ComputerSystems``,
followed by every System whose ``Links.ResourceBlocks`` names the block. A top-level
``ComputerSystems`` array on the block (found in DMTF mockups, where it names the block's own
embedded system) is no holder: it makes the block server-owned (above). ``CompositionState``
is never used, as services leave it stale.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from app.fabric.redfish.parse.common import (
    BadItem,
    last_segment,
    links,
    norm_uri,
    obj,
    odata_id,
    parse_health,
    text,
)
from app.fabric.types import Health


class DeviceSource(StrEnum):
    """Which block property a device link came from; decides how the device is parsed."""

    PROCESSOR = "Processors"
    DRIVE = "Drives"
    MEMORY = "Memory"
    NETWORK_INTERFACE = "NetworkInterfaces"
    ETHERNET_INTERFACE = "EthernetInterfaces"


COMPUTE_BLOCK_TYPES = frozenset({"Compute", "ComputerSystem"})
"""ResourceBlockType values (ResourceBlock.v1) that make a block server-owned."""


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """A ResourceBlock, reduced to what the listing needs.

    Attributes:
        uri: the block's URI as listed (the attach unit).
        block_id: the block's ``Id``, else the URI's last segment.
        block_types: ``ResourceBlockType`` values.
        device_links: ``(source, uri)`` of the directly linked devices, in order, no repeats.
        storage: URIs of linked ``Storage`` resources (their ``Drives`` are devices).
        simple_storage: URIs of linked ``SimpleStorage`` resources (inline ``Devices``).
        chassis: ``Links.Chassis`` URIs.
        zones: ``Links.Zones`` URIs.
        linked_systems: ``Links.ComputerSystems`` URIs (who holds the block).
        embedded_systems: the top-level ``ComputerSystems`` URIs (the Systems the block *is*;
            such a block is server-owned).
        shareable: ``CompositionStatus.SharingCapable`` and ``SharingEnabled`` both true.
        health, state: the block's ``Status``.
    """

    uri: str
    name: str | None = None
    block_id: str = ""
    block_types: tuple[str, ...] = ()
    device_links: tuple[tuple[DeviceSource, str], ...] = ()
    storage: tuple[str, ...] = ()
    simple_storage: tuple[str, ...] = ()
    chassis: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    linked_systems: tuple[str, ...] = ()
    embedded_systems: tuple[str, ...] = ()
    shareable: bool = False
    health: Health = Health.UNKNOWN
    state: str | None = None

    @property
    def is_compute(self) -> bool:
        """True for Compute / ComputerSystem blocks: server-owned, none of their parts (not
        even an accelerator) is a device."""
        return bool(COMPUTE_BLOCK_TYPES.intersection(self.block_types))

    @property
    def fabric(self) -> str | None:
        """The first ResourceZone's Id, used as the device's fabric."""
        return last_segment(self.zones[0]) if self.zones else None


def _flag(payload: Mapping[str, Any], key: str, where: str) -> bool:
    value = payload.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadItem(f"{where}{key} is {type(value).__name__}, expected boolean", "bad-type")
    return value


def parse_block(payload: Any, uri: str) -> BlockInfo:
    """Parse a ResourceBlock.

    Args:
        payload: the decoded JSON of the block.
        uri: the URI the block was listed under (used as its identity).

    Raises:
        BadItem: not an object, no ``@odata.id``, or a property of the wrong type.
    """
    if not isinstance(payload, Mapping):
        raise BadItem("body is not a JSON object", "bad-type")
    odata_id(payload)
    types_value = payload.get("ResourceBlockType") or []
    if not isinstance(types_value, list) or not all(isinstance(t, str) for t in types_value):
        raise BadItem("ResourceBlockType is not an array of strings", "bad-type")
    device_links: dict[str, DeviceSource] = {}
    for source in DeviceSource:
        for device_uri in links(payload, source.value):
            device_links.setdefault(device_uri, source)
    block_links = obj(payload, "Links")
    composition = obj(payload, "CompositionStatus")
    status = obj(payload, "Status")
    return BlockInfo(
        uri=norm_uri(uri),
        name=text(payload, "Name"),
        block_id=text(payload, "Id") or last_segment(uri),
        block_types=tuple(types_value),
        device_links=tuple((source, device) for device, source in device_links.items()),
        storage=links(payload, "Storage"),
        simple_storage=links(payload, "SimpleStorage"),
        chassis=links(block_links, "Chassis", "Links."),
        zones=links(block_links, "Zones", "Links."),
        linked_systems=links(block_links, "ComputerSystems", "Links."),
        embedded_systems=links(payload, "ComputerSystems"),
        shareable=_flag(composition, "SharingCapable", "CompositionStatus.")
        and _flag(composition, "SharingEnabled", "CompositionStatus."),
        health=parse_health(status),
        state=text(status, "State", "Status."),
    )


def server_owned_reason(block: BlockInfo, patterns: Iterable[str] = ()) -> str | None:
    """Why ``block`` belongs to a server, judged from the block alone, or None.

    Rules (module docstring): ``ResourceBlockType`` contains Compute or ComputerSystem; a
    top-level ``ComputerSystems`` array names a System; the block's ``Id`` or URI matches one
    of ``patterns`` (:func:`fnmatch.fnmatchcase`, e.g. ``"*-compute"`` or
    ``"/redfish/v1/CompositionService/ResourceBlocks/local-*"``). The CPU rule needs the
    block's processors: see :func:`is_cpu`.

    Returns:
        A short reason for logs and error messages, or None.
    """
    types = sorted(COMPUTE_BLOCK_TYPES.intersection(block.block_types))
    if types:
        return f"ResourceBlockType {', '.join(types)}"
    if block.embedded_systems:
        return f"it is System {block.embedded_systems[0]}"
    for pattern in patterns:
        if fnmatch.fnmatchcase(block.block_id, pattern) or fnmatch.fnmatchcase(block.uri, pattern):
            return f"matches fabric.server_owned_blocks pattern {pattern!r}"
    return None


def is_cpu(payload: Any) -> bool:
    """True when ``payload`` is a Processor with ``ProcessorType: CPU`` (Processor.v1,
    compared without case): the block holding it is a server's. Never raises."""
    if not isinstance(payload, Mapping):
        return False
    value = payload.get("ProcessorType")
    return isinstance(value, str) and value.strip().upper() == "CPU"


def systems_by_block(blocks_by_system: Mapping[str, Iterable[str]]) -> dict[str, tuple[str, ...]]:
    """Block URI -> the System URIs whose ``Links.ResourceBlocks`` name it, in URI order (all
    without trailing slashes): ``blocks_by_system`` turned around, once per listing, so that
    finding a block's holders does not scan every System for every block."""
    index: dict[str, dict[str, None]] = {}
    for system_uri in sorted(blocks_by_system):
        system = norm_uri(system_uri)
        for uri in blocks_by_system[system_uri]:
            index.setdefault(norm_uri(uri), {}).setdefault(system, None)
    return {uri: tuple(systems) for uri, systems in index.items()}


def block_hosts(
    block: BlockInfo,
    blocks_by_system: Mapping[str, Iterable[str]],
    system_ids: Mapping[str, str],
    *,
    index: Mapping[str, Sequence[str]] | None = None,
) -> tuple[str, ...]:
    """The host ids holding a block, block's own links first (rule in the module docstring).

    Args:
        block: the parsed block.
        blocks_by_system: System URI -> the block URIs in its ``Links.ResourceBlocks``.
        system_ids: System URI -> its ``Id``; a System missing here is named by its URI's
            last segment (a block held by an unlisted System is still not free).
        index: :func:`systems_by_block` of ``blocks_by_system``, when the caller looks up
            many blocks (else it is built here).
    """
    by_block = systems_by_block(blocks_by_system) if index is None else index
    holders: dict[str, None] = dict.fromkeys(block.linked_systems)
    for system_uri in by_block.get(block.uri, ()):
        holders.setdefault(system_uri, None)
    return tuple(dict.fromkeys(system_ids.get(uri) or last_segment(uri) for uri in holders))
