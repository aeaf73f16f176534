"""The walk from one ResourceBlock to its devices, with their location and holder.

A block's ``Processors``, ``Drives``, ``Storage/*/Drives``, ``SimpleStorage`` devices,
``Memory``, ``NetworkInterfaces`` and ``EthernetInterfaces`` are its devices. ``vendor_id`` is
the URI a device was reached at from its block and ``attach_unit`` is the block's URI.
Server-owned blocks (a server's own CPUs, DRAM and NICs; rules in
:mod:`app.fabric.redfish.parse.blocks`) yield no device; a block's processors are read first,
so a server's block costs no reads of its memory or NICs. The location comes from the block's
chassis chain (rules in :mod:`app.fabric.redfish.parse.chassis`), each chassis read once per
listing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.fabric.redfish.parse.blocks import (
    BlockInfo,
    DeviceSource,
    block_hosts,
    parse_block,
    systems_by_block,
)
from app.fabric.redfish.parse.chassis import (
    MAX_CHASSIS_DEPTH,
    ChassisPlace,
    location_from_chain,
    parse_chassis,
)
from app.fabric.redfish.parse.collection import inline_resources
from app.fabric.redfish.parse.common import BadItem, link, norm_uri, obj
from app.fabric.redfish.parse.devices import (
    DeviceContext,
    parse_device,
    parse_simple_storage,
    storage_drive_links,
)
from app.fabric.redfish.reader import ResourceReader
from app.fabric.redfish.server_owned import ServerOwnedBlocks, cpu_reason
from app.fabric.redfish.transport import gather
from app.fabric.types import FabricDevice, Location, Rejected


@dataclass(frozen=True, slots=True)
class ServerOwnedBlock:
    """A block the walk found to be a server's: no devices, reported in ``local_units``."""

    uri: str
    reason: str


BlockResult = FabricDevice | Rejected | ServerOwnedBlock
"""What the walk yields for one block: devices, rejections, or the block being a server's."""


class ChassisCache:
    """Chassis reads for one listing: each chassis is read once, however many ask for it."""

    def __init__(self, reader: ResourceReader) -> None:
        self._reader = reader
        self._places: dict[str, ChassisPlace | BadItem] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def place(self, uri: str) -> ChassisPlace:
        """What chassis ``uri`` reports about where it is, read once per listing.

        Raises:
            BadItem: the chassis could not be read or parsed (every caller gets it).
        """
        key = norm_uri(uri)
        if key not in self._places:
            async with self._locks.setdefault(key, asyncio.Lock()):
                if key not in self._places:
                    try:
                        self._places[key] = parse_chassis(await self._reader.read_item(key), key)
                    except BadItem as err:
                        self._places[key] = BadItem(f"chassis {key}: {err.reason}", err.kind)
        value = self._places[key]
        if isinstance(value, BadItem):
            raise BadItem(value.reason, value.kind)
        return value

    async def chain(self, uri: str) -> list[ChassisPlace]:
        """The chassis at ``uri`` and its ``ContainedBy`` parents, nearest first."""
        chain: list[ChassisPlace] = []
        seen: set[str] = set()
        current: str | None = norm_uri(uri)
        while current is not None and current not in seen and len(chain) < MAX_CHASSIS_DEPTH:
            seen.add(current)
            place = await self.place(current)
            chain.append(place)
            current = None if place.contained_by is None else norm_uri(place.contained_by)
        return chain


DeviceLink = tuple[DeviceSource, str]
"""A device of a block: where it was listed and the URI it is reached at."""

Fetched = tuple[DeviceSource, str, Any]
"""A device read for a block: its source, its URI, and its payload or the :class:`BadItem`."""


class _BlockReads:
    """The reads for one block: resources expanded inside its body are used, not read again."""

    def __init__(self, reader: ResourceReader, body: Any) -> None:
        self._reader = reader
        self._inline = inline_resources(body)

    async def read(self, item_uri: str) -> Any:
        """The resource at ``item_uri``, from the block's body if it came expanded there.

        Raises:
            BadItem: the resource could not be read.
        """
        found = self._inline.get(norm_uri(item_uri))
        return await self._reader.read_item(item_uri) if found is None else found

    async def fetch(self, item: DeviceLink) -> Fetched:
        """The device ``item`` with its payload, or with the :class:`BadItem` reading it."""
        source, device_uri = item
        try:
            return source, device_uri, await self.read(device_uri)
        except BadItem as err:
            return source, device_uri, err

    async def fetch_simple(self, storage_uri: str) -> tuple[str, Any]:
        """A SimpleStorage resource with its payload, or with the :class:`BadItem` reading it."""
        try:
            return storage_uri, await self.read(storage_uri)
        except BadItem as err:
            return storage_uri, err


def _device_results(fetched: Sequence[Fetched], context: DeviceContext) -> list[BlockResult]:
    """The devices parsed from ``fetched``, a Rejected entry for each unreadable or bad one."""
    results: list[BlockResult] = []
    for source, device_uri, payload in fetched:
        if isinstance(payload, BadItem):
            results.append(Rejected(device_uri, f"device: {payload.reason}", payload.kind))
            continue
        try:
            device = parse_device(payload, device_uri, source, context)
        except BadItem as err:
            results.append(Rejected(device_uri, f"device: {err.reason}", err.kind))
            continue
        if device is not None:
            results.append(device)
    return results


def _simple_storage_results(
    fetched: Sequence[tuple[str, Any]], context: DeviceContext
) -> list[BlockResult]:
    """The devices of the SimpleStorage resources in ``fetched``: a Rejected entry for a
    resource that could not be read or parsed, and for each of its bad devices."""
    results: list[BlockResult] = []
    for storage_uri, payload in fetched:
        if isinstance(payload, BadItem):
            results.append(Rejected(storage_uri, f"storage: {payload.reason}", payload.kind))
            continue
        try:
            entries = parse_simple_storage(payload, storage_uri, context)
        except BadItem as err:
            results.append(Rejected(storage_uri, f"storage: {err.reason}", err.kind))
            continue
        for entry in entries:
            if isinstance(entry, FabricDevice):
                results.append(entry)
            else:
                vendor_id, problem = entry
                results.append(Rejected(vendor_id, f"device: {problem.reason}", problem.kind))
    return results


class DeviceWalk:
    """The per-listing walk from one ResourceBlock to its devices."""

    def __init__(
        self,
        reader: ResourceReader,
        server_owned: ServerOwnedBlocks,
        *,
        blocks_by_system: Mapping[str, Sequence[str]],
        system_ids: Mapping[str, str],
    ) -> None:
        self._reader = reader
        self._server_owned = server_owned
        self._chassis = ChassisCache(reader)
        self._blocks_by_system = blocks_by_system
        self._systems_by_block = systems_by_block(blocks_by_system)
        self._system_ids = system_ids

    async def block(self, uri: str, body: Any = None) -> list[BlockResult]:
        """The devices of one block, or Rejected entries for its bad parts, or one
        :class:`ServerOwnedBlock` when the block is a server's (then nothing else).

        ``body`` is the block as an expanded collection member, if the service sent it so;
        resources expanded inside it are used instead of being read again. Processors are
        read first: a CPU among them makes the block server-owned, and its memory, NICs and
        storage are then not read at all.
        """
        reads = _BlockReads(self._reader, body)
        try:
            block = parse_block(await reads.read(uri) if body is None else body, uri)
        except BadItem as err:
            return [Rejected(uri, f"resource block: {err.reason}", err.kind)]
        reason = self._server_owned.by_block(block)
        if reason is not None:
            self._server_owned.learn(block.uri, reason)
            return [ServerOwnedBlock(block.uri, reason)]
        processors = [d for d in block.device_links if d[0] is DeviceSource.PROCESSOR]
        fetched = await gather(reads.fetch, processors)
        reason = cpu_reason([(device_uri, payload) for _, device_uri, payload in fetched])
        if reason is not None:
            self._server_owned.learn(block.uri, reason)
            return [ServerOwnedBlock(block.uri, reason)]
        if all(not isinstance(payload, BadItem) for _, _, payload in fetched):
            self._server_owned.learn(block.uri, None)
        device_links, results = await self._other_device_links(block, reads)
        simple_storage = block.simple_storage
        if not fetched and not device_links and not simple_storage:
            return results
        fetched += await gather(reads.fetch, device_links)
        fetched_simple = await gather(reads.fetch_simple, simple_storage)
        try:
            location = await self._location(block, fetched)
        except BadItem as err:
            bad = [device_uri for _, device_uri, _ in fetched] + list(simple_storage)
            return results + [Rejected(u, f"location: {err.reason}", err.kind) for u in bad]
        holders = block_hosts(
            block, self._blocks_by_system, self._system_ids, index=self._systems_by_block
        )
        context = DeviceContext(block, location, holders[0] if holders else None)
        results += _device_results(fetched, context)
        results += _simple_storage_results(fetched_simple, context)
        return results

    async def _other_device_links(
        self, block: BlockInfo, reads: _BlockReads
    ) -> tuple[list[DeviceLink], list[BlockResult]]:
        """The block's devices other than its processors: its own links, then the drives of
        its ``Storage`` resources not already linked; and a Rejected entry for each
        ``Storage`` resource that could not be read or parsed.
        """
        rejected: list[BlockResult] = []
        device_links = [d for d in block.device_links if d[0] is not DeviceSource.PROCESSOR]
        known = {device_uri for _, device_uri in block.device_links}
        for storage_uri in block.storage:
            try:
                drives = storage_drive_links(await reads.read(storage_uri), storage_uri)
            except BadItem as err:
                rejected.append(Rejected(storage_uri, f"storage: {err.reason}", err.kind))
                continue
            for drive in drives:
                if drive not in known:
                    known.add(drive)
                    device_links.append((DeviceSource.DRIVE, drive))
        return device_links, rejected

    async def _location(self, block: BlockInfo, fetched: Sequence[Fetched]) -> Location:
        chassis_uri = block.chassis[0] if block.chassis else None
        if chassis_uri is None:
            # No chassis on the block: use the first device's own Links.Chassis.
            for _, _, payload in fetched:
                if isinstance(payload, Mapping):
                    try:
                        device_chassis = obj(payload, "Links").get("Chassis")
                        if isinstance(device_chassis, list):
                            device_chassis = device_chassis[0] if device_chassis else None
                        if device_chassis is not None:
                            chassis_uri = link(device_chassis, "Links.Chassis")
                            break
                    except BadItem:
                        continue
        chain = await self._chassis.chain(chassis_uri) if chassis_uri else []
        return location_from_chain(chain, fabric=block.fabric)
