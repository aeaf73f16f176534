"""The inventory listings: every host, and every composable device, read from one service.

Devices: ``/redfish/v1/`` -> ``CompositionService.ResourceBlocks`` -> each block, walked to its
devices by :class:`~app.fabric.redfish.walk.DeviceWalk`; with ``$expand`` a page brings its
blocks (and their devices) at once. A device linked from two blocks under one URI is rejected
(``duplicate``, every copy). With ``device_identity`` ``serial`` or ``uuid`` one physical
device reached under two URIs is listed once, the first in collection order; the others are
rejected as ``duplicate``. Server-owned blocks yield no device and are reported in
``Listing.local_units``. Hosts: every ``Systems`` member, located by its first
``Links.Chassis``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from app.fabric.errors import FabricNotFound
from app.fabric.redfish.parse.chassis import location_from_chain
from app.fabric.redfish.parse.common import BadItem
from app.fabric.redfish.parse.identity import IdentityMode, device_identity
from app.fabric.redfish.parse.systems import SystemInfo, host_from_system, parse_system
from app.fabric.redfish.reader import ResourceReader, bad_members, expanded_member
from app.fabric.redfish.server_owned import ServerOwnedBlocks
from app.fabric.redfish.transport import gather
from app.fabric.redfish.walk import BlockResult, ChassisCache, DeviceWalk, ServerOwnedBlock
from app.fabric.types import FabricDevice, FabricHost, Listing, Rejected, UnitRead

logger = logging.getLogger(__name__)


class RedfishInventory:
    """The listings of one service.

    Args:
        reader: reads the service's resources.
        server_owned: what is known about server-owned blocks (the walk adds to it).
        identity: ``uri``, ``serial`` or ``uuid``: what makes two listed devices one.
    """

    def __init__(
        self, reader: ResourceReader, server_owned: ServerOwnedBlocks, identity: IdentityMode
    ) -> None:
        self._reader = reader
        self._server_owned = server_owned
        self._identity: IdentityMode = identity

    async def systems(self, *, strict: bool = False) -> tuple[list[SystemInfo], list[Rejected]]:
        """Every System, and the Systems that could not be read or parsed. With ``strict``
        (the device listing, which needs every System to know who holds a block) an HTTP 500
        on a System fails the call instead."""
        systems_uri = await self._reader.root_link("Systems")
        # The System bodies are all the listing needs: not their processors, memory, storage.
        expand = await self._reader.expand_query(most=1)
        if expand is None:
            uris, rejected = await self._reader.collection(systems_uri)
            members: list[tuple[str, Any]] = [(uri, None) for uri in uris]
        else:
            members, rejected = await self._reader.expanded_collection(systems_uri, expand)

        async def read(member: tuple[str, Any]) -> SystemInfo | Rejected:
            uri, body = member
            try:
                payload = await self._reader.read_item(uri, strict=strict) if body is None else body
                return parse_system(payload, uri)
            except BadItem as err:
                return Rejected(uri, f"system: {err.reason}", err.kind)

        systems: list[SystemInfo] = []
        ids: set[str] = set()
        for result in await gather(read, members):
            if isinstance(result, Rejected):
                rejected.append(result)
            elif result.host_id in ids:
                rejected.append(
                    Rejected(result.uri, f"system Id {result.host_id!r} repeats", "duplicate")
                )
            else:
                ids.add(result.host_id)
                systems.append(result)
        return systems, rejected

    async def list_hosts(self) -> Listing[FabricHost]:
        """Every ComputerSystem as a :class:`FabricHost`, located by its first
        ``Links.Chassis``; as :meth:`app.fabric.redfish.backend.RedfishBackend.list_hosts`."""
        systems, rejected = await self.systems()
        walk = ChassisCache(self._reader)

        async def host(system: SystemInfo) -> FabricHost | Rejected:
            try:
                chain = await walk.chain(system.chassis[0]) if system.chassis else []
            except BadItem as err:
                return Rejected(system.uri, f"system location: {err.reason}", err.kind)
            return host_from_system(system, location_from_chain(chain, chassis_slot=True))

        hosts: list[FabricHost] = []
        for result in await gather(host, systems):
            if isinstance(result, Rejected):
                rejected.append(result)
            else:
                hosts.append(result)
        return Listing(tuple(hosts), tuple(rejected))

    async def list_devices(self) -> Listing[FabricDevice]:
        """Every composable device, with location, health, holder and shareability; as
        :meth:`app.fabric.redfish.backend.RedfishBackend.list_devices`."""
        blocks_uri = await self._reader.root_link("CompositionService", "ResourceBlocks")
        expand = await self._reader.expand_query()
        if expand is not None:
            return await self._list_devices_expanded(blocks_uri, expand)
        block_uris, rejected = await self._reader.collection(blocks_uri)
        walk = await self._walk()
        collector = _Collector(self._identity, rejected)
        for results in await gather(walk.block, block_uris):
            collector.add(results)
        return self._finish(collector)

    async def read_unit(self, uri: str) -> UnitRead | None:
        """One ResourceBlock and its devices, read on their own (after an event about it);
        as :meth:`app.fabric.redfish.backend.RedfishBackend.read_unit`."""
        try:
            body = (await self._reader.transport.get(uri)).body
        except FabricNotFound:
            return UnitRead(uri, Listing(()), gone=True)
        if not isinstance(body, Mapping) or not _is_block(body):
            return None
        links = body.get("Links")
        if not isinstance(links, Mapping) or not isinstance(links.get("ComputerSystems"), list):
            # Who holds it would then be known only from every System: a full listing.
            return None
        walk = DeviceWalk(self._reader, self._server_owned, blocks_by_system={}, system_ids={})
        collector = _Collector(self._identity, [])
        collector.add(await walk.block(uri, body))
        return UnitRead(uri, collector.listing())

    async def read_host_units(self, uri: str) -> tuple[str, tuple[str, ...]] | None:
        """A ComputerSystem's ``Id`` and the blocks it holds, read on its own; None when
        ``uri`` is not a System; as :meth:`RedfishBackend.read_host_units
        <app.fabric.redfish.backend.RedfishBackend.read_host_units>`."""
        body = (await self._reader.transport.get(uri)).body
        if not isinstance(body, Mapping):
            return None
        kind = body.get("@odata.type")
        if not (isinstance(kind, str) and ".ComputerSystem" in kind):
            return None
        try:
            system = parse_system(body, uri)
        except BadItem:
            return None
        return system.host_id, tuple(system.resource_blocks)

    async def _walk(self) -> DeviceWalk:
        systems, _ = await self.systems(strict=True)
        return DeviceWalk(
            self._reader,
            self._server_owned,
            blocks_by_system={s.uri: s.resource_blocks for s in systems},
            system_ids={s.uri: s.host_id for s in systems},
        )

    def _finish(self, collector: _Collector) -> Listing[FabricDevice]:
        listing = collector.listing()
        if listing.local_units:
            logger.debug(
                "redfish %s: %d server-owned blocks are not devices",
                self._reader.transport.origin,
                len(listing.local_units),
            )
        return listing

    async def _list_devices_expanded(self, blocks_uri: str, expand: str) -> Listing[FabricDevice]:
        """:meth:`list_devices` reading the blocks collection with ``$expand``: each page
        brings its blocks (and, with levels, their devices), so the listing needs a request
        per page instead of one per block and per device. Pages are walked as they arrive,
        so only one page of raw JSON is held at a time. A member or device the service left
        as a link is read on its own, as without ``$expand``.
        """
        walk = await self._walk()
        rejected: list[Rejected] = []
        collector = _Collector(self._identity, rejected)
        done: set[str] = set()
        async for page, raw in self._reader.pages(blocks_uri, expand):
            rejected.extend(bad_members(blocks_uri, page))
            bodies = dict(filter(None, map(expanded_member, raw)))
            todo = [uri for uri in dict.fromkeys(page.members) if uri not in done]
            done.update(todo)

            async def block(uri: str, bodies: dict[str, Any] = bodies) -> list[BlockResult]:
                return await walk.block(uri, bodies.get(uri))

            for results in await gather(block, todo):
                collector.add(results)
        return self._finish(collector)


class _Collector:
    """One listing's devices, gathered block by block in collection order.

    * A device that two ResourceBlocks link under one URI is rejected (kind ``duplicate``),
      every copy: a device is composed through one block, and there is no telling which
      block the service really attaches it with (Redfish ResourceBlock
      ``Processors``/``Memory``/``Drives`` link the block's own devices).
    * With identity ``serial`` / ``uuid``
      (:func:`app.fabric.redfish.parse.identity.device_identity`), a device whose identity
      an earlier device already has is the same physical device under another URI: the
      first in collection order is kept, the others are rejected as ``duplicate`` naming
      both URIs.
    """

    def __init__(self, identity: IdentityMode, rejected: list[Rejected]) -> None:
        self._identity: IdentityMode = identity
        self._devices: dict[str, FabricDevice] = {}
        self._rejected = rejected
        self._duplicates: set[str] = set()
        self._by_identity: dict[str, str] = {}
        self._local: dict[str, None] = {}

    def add(self, results: Iterable[BlockResult]) -> None:
        for result in results:
            if isinstance(result, Rejected):
                self._rejected.append(result)
            elif isinstance(result, ServerOwnedBlock):
                self._local.setdefault(result.uri, None)
            else:
                self._add_device(result)

    def _add_device(self, device: FabricDevice) -> None:
        vendor_id = device.vendor_id
        if vendor_id in self._duplicates:
            return
        first = self._devices.get(vendor_id)
        if first is not None:
            if first.attach_unit != device.attach_unit:
                del self._devices[vendor_id]
                self._duplicates.add(vendor_id)
                self._rejected.append(
                    Rejected(
                        vendor_id,
                        f"device is linked from two blocks ({first.attach_unit} and "
                        f"{device.attach_unit}): duplicate, left out",
                        "duplicate",
                    )
                )
            return
        key = device_identity(device, self._identity)
        if key is not None:
            kept = self._by_identity.get(key)
            if kept is not None and kept in self._devices:
                self._rejected.append(
                    Rejected(
                        vendor_id,
                        f"device {vendor_id} has the {self._identity} of {kept} "
                        f"(one physical device reached through two blocks): duplicate, listed "
                        f"once as {kept}",
                        "duplicate",
                    )
                )
                return
            self._by_identity[key] = vendor_id
        self._devices[vendor_id] = device

    def listing(self) -> Listing[FabricDevice]:
        return Listing(tuple(self._devices.values()), tuple(self._rejected), tuple(self._local))


def _is_block(body: Mapping[str, Any]) -> bool:
    """True when ``body`` is a ResourceBlock (its ``@odata.type``)."""
    kind = body.get("@odata.type")
    return isinstance(kind, str) and ".ResourceBlock" in kind
