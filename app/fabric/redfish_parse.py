"""Pure parsing of Redfish payloads (JSON dicts) into the fabric value types.

No I/O here: :mod:`app.fabric.redfish` fetches the resources and hands the decoded JSON to
these functions. Every function either returns a value or raises :class:`BadItem` (one item
is wrong, the caller turns it into a :class:`~app.fabric.types.Rejected`) or
:class:`~app.fabric.errors.FabricError` (the answer as a whole is unusable).

Rules taken from Redfish (DSP0266 and the DSP8010 schemas, 2025.x):

* Property types follow the schemas: identity and location properties are strings,
  ``CapacityBytes`` / ``CapacityMiB`` / ``LocationOrdinalValue`` are Int64, links are
  ``{"@odata.id": uri}`` objects. JSON ``null`` means "not reported" and is the same as
  absent. Any other type, a string longer than :data:`MAX_STRING_BYTES` (UTF-8), or a negative
  capacity rejects the item that carries it.
* Resource URIs end in the resource's ``Id`` (DSP0266 "Resource URI patterns"), so a link is
  turned into an id by its last path segment where the target is not read.

Location mapping (a device's location is read from the Chassis that its ResourceBlock's
``Links.Chassis[0]`` names, else the device's own ``Links.Chassis``; then the chain of
``Links.ContainedBy`` parents, nearest first, at most :data:`MAX_CHASSIS_DEPTH` deep). Each
part comes from the nearest chassis in the chain that reports it:

* region <- ``Location.PostalAddress.Territory`` or ``Location.PhysicalAddress.StateOrProvince``,
  else the ``Country`` of either address;
* site <- ``PostalAddress.Building``, else ``Placement.FacilityName`` (Resource v1_23), else the
  ``City`` of either address;
* zone <- ``PostalAddress.Room``, else ``Placement.Room`` (Resource v1_23);
* row <- ``Placement.Row``, else the ``Id`` of the nearest ``ChassisType: RackGroup`` chassis;
* rack <- ``Placement.Rack``, else the ``Id`` of the nearest ``ChassisType: Rack`` chassis;
* chassis <- the ``Id`` of the first chassis in the chain (the block's enclosure);
* slot <- the device's own part location only (``PhysicalLocation.PartLocation`` of a
  Drive, else ``Location.PartLocation``): ``ServiceLabel``, else ``LocationOrdinalValue``.
  A device without one has no slot: the enclosure's ``PartLocation`` says where the
  enclosure sits (Resource.v1 ``PartLocation`` describes the resource that carries it), not
  where the device sits inside it. A host's slot is its own chassis' ``PartLocation`` (that
  chassis is the host itself);
* fabric <- the ``Id`` of the block's first ResourceZone (``Links.Zones[0]``).

A device with no chassis at all keeps only ``fabric``; the pool layer decides where such a
device goes.

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

Health: ``Status.Health`` (Resource.v1 ``Health``: OK, Warning, Critical) that is missing,
null, blank, not a string or another value is UNKNOWN. A device's health combines its own and
its block's (:func:`worst_health`): a device whose own health is UNKNOWN is UNKNOWN unless its
block reports Warning or Critical (then the block's); a device with known health takes the
worse of its own and its block's known health (a block with unknown health does not degrade
it). ``Status.State`` that is missing, null or blank is None (the block's, if it has one).

Device identity (:func:`device_identity`): the listing keys devices by URI, or, when
configured, by ``SerialNumber`` or ``UUID`` (compared without case), so that one physical
device reachable through two blocks under two URIs is listed once. Placeholder values
(blank, all zeros, ``N/A``, ``Not Specified``, ...) are no identity.

Current host: the hosts of a block are the Systems in the block's ``Links.ComputerSystems``,
followed by every System whose ``Links.ResourceBlocks`` names the block. A top-level
``ComputerSystems`` array on the block (found in DMTF mockups, where it names the block's own
embedded system) is no holder: it makes the block server-owned (below). ``CompositionState``
is never used, as services leave it stale.
"""

from __future__ import annotations

import dataclasses
import email.utils
import fnmatch
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from app.fabric.errors import (
    FabricAuthError,
    FabricConflict,
    FabricError,
    FabricInvalidData,
    FabricNotFound,
    FabricPreconditionFailed,
    FabricTimeout,
    FabricUnavailable,
)
from app.fabric.types import (
    AttributeValue,
    DeviceType,
    FabricDevice,
    FabricHost,
    Health,
    Location,
    Operation,
    OperationState,
)

MAX_STRING_BYTES = 1024
"""Longest vendor string accepted, in UTF-8 bytes; longer ones reject their item."""

MAX_INT64 = 2**63 - 1
"""Largest capacity accepted (DRA quantities and attributes are int64)."""

MAX_CHASSIS_DEPTH = 8
"""How many ``ContainedBy`` steps are followed from a device's chassis."""

ODATA_ID = "@odata.id"


class BadItem(Exception):
    """One vendor item is malformed; the caller rejects that item and keeps the rest.

    Attributes:
        reason: one line naming the property and the problem.
        kind: the :class:`~app.fabric.types.Rejected` kind (``missing-field``, ``bad-type``,
            ``bad-value``, ``fetch-failed``, ``duplicate``).
    """

    def __init__(self, reason: str, kind: str = "bad-value") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


# --- primitive readers --------------------------------------------------------------------


def _show(value: Any) -> str:
    """A short one-line rendering of a vendor value for a reason string."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def text(payload: Mapping[str, Any], key: str, where: str = "") -> str | None:
    """``payload[key]`` as a string, None when absent, null or blank.

    Raises:
        BadItem: not a string (``bad-type``) or longer than :data:`MAX_STRING_BYTES`
            (``bad-value``).
    """
    value = payload.get(key)
    if value is None:
        return None
    name = f"{where}{key}"
    if not isinstance(value, str):
        raise BadItem(f"{name} is {type(value).__name__}, expected string", "bad-type")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
        raise BadItem(f"{name} is longer than {MAX_STRING_BYTES} bytes", "bad-value")
    stripped = value.strip()
    return stripped or None


def integer(
    payload: Mapping[str, Any], key: str, where: str = "", *, minimum: int = 0
) -> int | None:
    """``payload[key]`` as an Int64 no smaller than ``minimum``; None when absent or null.

    Raises:
        BadItem: not an integer (booleans and floats included, ``bad-type``) or out of range
            (``bad-value``).
    """
    value = payload.get(key)
    if value is None:
        return None
    name = f"{where}{key}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadItem(f"{name} is {type(value).__name__}, expected integer", "bad-type")
    if value < minimum or value > MAX_INT64:
        raise BadItem(f"{name} is {value}, outside {minimum}..2^63-1", "bad-value")
    return value


def obj(payload: Mapping[str, Any], key: str, where: str = "") -> Mapping[str, Any]:
    """``payload[key]`` as an object; an empty mapping when absent or null.

    Raises:
        BadItem: present but not an object (``bad-type``).
    """
    value = payload.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadItem(f"{where}{key} is {type(value).__name__}, expected object", "bad-type")
    return value


def norm_uri(uri: str) -> str:
    """A URI without its trailing slash (``/redfish/v1/`` stays as it is), for comparisons."""
    if len(uri) > 1 and uri.endswith("/") and uri != "/redfish/v1/":
        return uri.rstrip("/")
    return uri


def last_segment(uri: str) -> str:
    """The last path segment of a resource URI: its ``Id`` by the Redfish URI rules."""
    return norm_uri(uri).rstrip("/").rsplit("/", 1)[-1]


def odata_id(payload: Mapping[str, Any], where: str = "") -> str:
    """The resource's own ``@odata.id``.

    Raises:
        BadItem: missing (``missing-field``), not a string or not a path (``bad-type``).
    """
    value = text(payload, ODATA_ID, where)
    if value is None:
        raise BadItem(f"{where}{ODATA_ID} is missing", "missing-field")
    if not value.startswith("/"):
        raise BadItem(f"{where}{ODATA_ID} {_show(value)} is not an absolute path", "bad-type")
    return norm_uri(value)


def link(value: Any, where: str) -> str:
    """The URI of one link object ``{"@odata.id": uri}``.

    Raises:
        BadItem: not an object, or no usable ``@odata.id``.
    """
    if not isinstance(value, Mapping):
        raise BadItem(f"{where} is {type(value).__name__}, expected a link object", "bad-type")
    return odata_id(value, f"{where}.")


def links(payload: Mapping[str, Any], key: str, where: str = "") -> tuple[str, ...]:
    """The URIs of a link array ``payload[key]``, in order, duplicates dropped.

    Raises:
        BadItem: not an array, or an element is not a link.
    """
    value = payload.get(key)
    if value is None:
        return ()
    name = f"{where}{key}"
    if not isinstance(value, list):
        # A single link where an array belongs (seen for Links.Chassis on devices).
        if isinstance(value, Mapping):
            return (link(value, name),)
        raise BadItem(f"{name} is {type(value).__name__}, expected array", "bad-type")
    seen: dict[str, None] = {}
    for index, element in enumerate(value):
        seen.setdefault(link(element, f"{name}[{index}]"), None)
    return tuple(seen)


_SEVERITY = {Health.OK: 1, Health.WARNING: 2, Health.CRITICAL: 3, Health.UNKNOWN: 0}


def worst_health(device: Health, block: Health) -> Health:
    """A device's health given its own and its ResourceBlock's (Resource.v1 ``Health``).

    * device UNKNOWN: the block's health if that is WARNING or CRITICAL (a block in trouble,
      its fabric port or slot say, makes the device in it as unhealthy), else UNKNOWN: a
      healthy block says nothing about a device that reports nothing;
    * device known: the worse of the device's and the block's known health; a block whose
      health is UNKNOWN does not degrade it.

    Both arguments and the result are :class:`Health` values; never raises.
    """
    if device is Health.UNKNOWN:
        return block if block in (Health.WARNING, Health.CRITICAL) else Health.UNKNOWN
    return max(device, block, key=lambda h: _SEVERITY[h])


def parse_health(status: Mapping[str, Any], where: str = "Status.") -> Health:
    """``Status.Health`` (Resource.v1 ``Health``: OK, Warning, Critical, compared without
    case) as :class:`Health`.

    A missing, null, blank or unrecognised value gives UNKNOWN, and so does a value that is
    not a string: health is advisory, and a service that garbles it must not make its device
    disappear. Never raises.
    """
    raw = status.get("Health")
    if not isinstance(raw, str):
        return Health.UNKNOWN
    value = raw.strip()
    if not value:
        return Health.UNKNOWN
    for health in (Health.OK, Health.WARNING, Health.CRITICAL):
        if value.lower() == health.value.lower():
            return health
    return Health.UNKNOWN


# --- collections --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CollectionPage:
    """One page of a Redfish collection.

    Attributes:
        members: member URIs in order (``Members@odata.count`` is ignored: services get it
            wrong).
        next_link: ``Members@odata.nextLink``, or None on the last page.
        bad_members: ``(index, reason)`` for member entries with no usable ``@odata.id``.
    """

    members: tuple[str, ...]
    next_link: str | None
    bad_members: tuple[tuple[int, str], ...] = ()


def parse_collection_page(payload: Any, uri: str) -> CollectionPage:
    """Parse one collection page.

    Raises:
        FabricInvalidData: the page is not an object, has no ``Members`` array, or a
            non-string ``Members@odata.nextLink``: the listing cannot be trusted.
    """
    if not isinstance(payload, Mapping):
        raise FabricInvalidData(f"collection {uri}: body is not a JSON object")
    members = payload.get("Members")
    if not isinstance(members, list):
        raise FabricInvalidData(f"collection {uri}: Members is missing or not an array")
    next_link = payload.get("Members@odata.nextLink")
    if next_link is not None and not isinstance(next_link, str):
        raise FabricInvalidData(f"collection {uri}: Members@odata.nextLink is not a string")
    found: list[str] = []
    bad: list[tuple[int, str]] = []
    for index, member in enumerate(members):
        try:
            found.append(link(member, f"Members[{index}]"))
        except BadItem as err:
            bad.append((index, err.reason))
    return CollectionPage(tuple(found), next_link or None, tuple(bad))


MAX_EXPAND_LEVELS = 3
"""The deepest ``$expand`` the listing asks for: collection -> block -> device -> drive."""


def expand_levels(root: Any) -> int:
    """How many levels of ``$expand=.`` the service offers, from its ServiceRoot's
    ``ProtocolFeaturesSupported.ExpandQuery`` (DSP0266 "Query parameters"): 0 when it offers
    none, 1 when it expands without ``$levels``, else its ``MaxLevels`` (at most
    :data:`MAX_EXPAND_LEVELS`). Anything malformed counts as no support: the listing then
    reads each resource on its own, which every service answers.
    """
    if not isinstance(root, Mapping):
        return 0
    features = root.get("ProtocolFeaturesSupported")
    expand = features.get("ExpandQuery") if isinstance(features, Mapping) else None
    if not isinstance(expand, Mapping) or expand.get("NoLinks") is not True:
        return 0
    if expand.get("Levels") is not True:
        return 1
    most = expand.get("MaxLevels")
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        return 1
    return min(most, MAX_EXPAND_LEVELS)


def inline_resources(payload: Any) -> dict[str, Mapping[str, Any]]:
    """Every expanded resource inside ``payload``, by URI (without a trailing slash).

    An expanded reference is an object with ``@odata.id`` and properties of its own; a plain
    link ``{"@odata.id": ...}`` (annotations aside) is not. ``Links`` sections are not
    searched: ``$expand=.`` leaves them as links, and a resource found there could be a
    partial view. The payload itself is not included.
    """
    found: dict[str, Mapping[str, Any]] = {}

    def visit(value: Any) -> None:
        if isinstance(value, list):
            for element in value:
                visit(element)
        elif isinstance(value, Mapping):
            uri = value.get("@odata.id")
            if isinstance(uri, str) and any(not key.startswith("@") for key in value):
                found.setdefault(norm_uri(uri), value)
            for key, inner in value.items():
                if key != "Links" and isinstance(inner, list | Mapping):
                    visit(inner)

    if isinstance(payload, Mapping):
        for key, inner in payload.items():
            if key != "Links" and isinstance(inner, list | Mapping):
                visit(inner)
    return found


# --- location -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChassisPlace:
    """What one Chassis says about where it is (see the module docstring for the rules).

    Attributes:
        chassis_id: the chassis ``Id`` (else the last segment of its URI).
        chassis_type: ``ChassisType`` (``Rack``, ``RackGroup``, ``Enclosure``, ...).
        region, site, zone, row, rack, slot: the parts this chassis reports itself.
        contained_by: URI of ``Links.ContainedBy``, if any.
    """

    chassis_id: str
    chassis_type: str | None = None
    region: str | None = None
    site: str | None = None
    zone: str | None = None
    row: str | None = None
    rack: str | None = None
    slot: str | None = None
    contained_by: str | None = None


def part_location_slot(location: Mapping[str, Any], where: str = "Location.") -> str | None:
    """The slot from ``Location.PartLocation``: ``ServiceLabel``, else ``LocationOrdinalValue``.

    Raises:
        BadItem: wrong types or a negative ordinal.
    """
    part = obj(location, "PartLocation", where)
    label = text(part, "ServiceLabel", f"{where}PartLocation.")
    if label is not None:
        return label
    ordinal = integer(part, "LocationOrdinalValue", f"{where}PartLocation.")
    return None if ordinal is None else str(ordinal)


def parse_chassis(payload: Any, uri: str) -> ChassisPlace:
    """Read the location parts a Chassis reports about itself.

    Args:
        payload: the Chassis resource.
        uri: the URI it was read from (its ``@odata.id`` may be wrong in vendor data, so the
            URI read is what identifies it).

    Raises:
        BadItem: a location property has the wrong type or is too long.
    """
    where = f"chassis {uri} "
    if not isinstance(payload, Mapping):
        raise BadItem(f"{where}body is not a JSON object", "bad-type")
    chassis_id = text(payload, "Id", where) or last_segment(uri)
    location = obj(payload, "Location", where)
    postal = obj(location, "PostalAddress", f"{where}Location.")
    physical = obj(location, "PhysicalAddress", f"{where}Location.")
    placement = obj(location, "Placement", f"{where}Location.")
    pw, hw, lw = f"{where}PostalAddress.", f"{where}PhysicalAddress.", f"{where}Placement."
    region = (
        text(postal, "Territory", pw)
        or text(physical, "StateOrProvince", hw)
        or text(postal, "Country", pw)
        or text(physical, "Country", hw)
    )
    site = (
        text(postal, "Building", pw)
        or text(placement, "FacilityName", lw)
        or text(postal, "City", pw)
        or text(physical, "City", hw)
    )
    zone = text(postal, "Room", pw) or text(placement, "Room", lw)
    container = obj(payload, "Links", where).get("ContainedBy")
    return ChassisPlace(
        chassis_id=chassis_id,
        chassis_type=text(payload, "ChassisType", where),
        region=region,
        site=site,
        zone=zone,
        row=text(placement, "Row", lw),
        rack=text(placement, "Rack", lw),
        slot=part_location_slot(location, f"{where}Location."),
        contained_by=None if container is None else link(container, f"{where}Links.ContainedBy"),
    )


def location_from_chain(
    chain: Sequence[ChassisPlace],
    *,
    fabric: str | None = None,
    device_slot: str | None = None,
    chassis_slot: bool = False,
) -> Location:
    """Build a :class:`Location` from a chassis chain, nearest (the enclosure) first.

    Each part is taken from the nearest chassis reporting it; ``rack`` and ``row`` fall back to
    the ``Id`` of the nearest Rack / RackGroup chassis (rules in the module docstring).

    Args:
        chain: the chassis, nearest first (may be empty).
        fabric: the fabric id to carry (the block's first ResourceZone).
        device_slot: the slot the device reports itself; the only slot a device gets.
        chassis_slot: use the first chassis' own ``PartLocation`` as the slot when
            ``device_slot`` is None. True for hosts (their chassis is the host itself); never
            for devices, which do not sit at their enclosure's slot.
    """

    def first(values: Iterable[str | None]) -> str | None:
        return next((value for value in values if value), None)

    rack = first(place.rack for place in chain) or first(
        place.chassis_id for place in chain if place.chassis_type == "Rack"
    )
    row = first(place.row for place in chain) or first(
        place.chassis_id for place in chain if place.chassis_type == "RackGroup"
    )
    return Location(
        region=first(place.region for place in chain),
        zone=first(place.zone for place in chain),
        site=first(place.site for place in chain),
        row=row,
        rack=rack,
        chassis=chain[0].chassis_id if chain else None,
        slot=device_slot or (chain[0].slot if chassis_slot and chain else None),
        fabric=fabric,
    )


# --- resource blocks ----------------------------------------------------------------------


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


def storage_drive_links(payload: Any, uri: str) -> tuple[str, ...]:
    """The ``Drives`` links of a Storage resource.

    Raises:
        BadItem: not an object, or ``Drives`` is malformed.
    """
    if not isinstance(payload, Mapping):
        raise BadItem(f"storage {uri}: body is not a JSON object", "bad-type")
    return links(payload, "Drives", f"storage {uri} ")


# --- devices ------------------------------------------------------------------------------

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
        source: which block property linked it.
        context: block, location and host it inherits.

    Returns:
        The device, or None when the resource is not a composable device: a CPU (or another
        ProcessorType that is not an accelerator), or anything in a Compute / ComputerSystem
        block (server-owned, rules in the module docstring).

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
    memory_mib: int | None = None
    capacity: dict[str, int] = {}
    attributes: dict[str, AttributeValue] = {}
    if source is DeviceSource.PROCESSOR:
        processor_type = text(payload, "ProcessorType")
        if processor_type is None:
            raise BadItem("ProcessorType is missing", "missing-field")
        device_type = PROCESSOR_TYPES.get(processor_type)
        if device_type is None:
            return None
        attributes["processor_type"] = processor_type
        memory_mib = _processor_memory_mib(payload)
    elif source is DeviceSource.DRIVE:
        protocol = text(payload, "Protocol")
        device_type = DeviceType.NVME if protocol == "NVMe" else DeviceType.DRIVE
        size = integer(payload, "CapacityBytes")
        if size is not None:
            capacity["capacity_bytes"] = size
        for key, name in (("Protocol", "protocol"), ("MediaType", "media_type")):
            value = text(payload, key)
            if value is not None:
                attributes[name] = value
    elif source is DeviceSource.MEMORY:
        cxl = payload.get("CXL")
        if cxl is not None and not isinstance(cxl, Mapping):
            raise BadItem("CXL is not an object", "bad-type")
        device_type = DeviceType.CXL_MEMORY if cxl is not None else DeviceType.MEMORY
        memory_mib = integer(payload, "CapacityMiB")
        memory_type = text(payload, "MemoryDeviceType") or text(payload, "MemoryType")
        if memory_type is not None:
            attributes["memory_type"] = memory_type
    else:
        device_type = DeviceType.NIC
        speed = integer(payload, "SpeedMbps")
        if speed is not None:
            attributes["speed_mbps"] = speed
    health = parse_health(status)
    return FabricDevice(
        vendor_id=norm_uri(uri),
        attach_unit=block.uri,
        device_type=device_type,
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
        memory_mib=memory_mib,
        capacity=capacity,
        attributes=attributes,
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


IdentityMode = Literal["uri", "serial", "uuid"]
"""How the listing keys devices: ``uri``, ``serial`` or ``uuid`` (setting
``fabric.device_identity``)."""

IDENTITY_MODES: tuple[IdentityMode, ...] = ("uri", "serial", "uuid")

_PLACEHOLDERS = frozenset({
    "n/a", "na", "none", "null", "unknown", "not specified", "not available", "not applicable",
    "to be filled by o.e.m.", "default string", "system serial number", "123456789",
})


def device_identity(device: FabricDevice, mode: IdentityMode) -> str | None:
    """The key that says two listed devices are one physical device, or None (use the URI).

    Args:
        device: a parsed device.
        mode: ``uri`` (always None), ``serial`` (Redfish ``SerialNumber``) or ``uuid``
            (``UUID``, compared without case).

    Returns:
        ``"serial:<value>"`` / ``"uuid:<value>"``, or None when the value is missing or a
        placeholder (blank, all zeros, ``N/A``, ``Not Specified``, ...): services fill those
        in for every device alike, and they must not merge distinct devices.

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in IDENTITY_MODES:
        raise ValueError(f"device identity {mode!r} is not one of {', '.join(IDENTITY_MODES)}")
    if mode == "uri":
        return None
    value = device.serial if mode == "serial" else device.uuid
    if value is None:
        return None
    folded = value.strip().lower()
    if not folded or folded in _PLACEHOLDERS or not folded.strip("0-: "):
        return None
    return f"{mode}:{folded if mode == 'uuid' else value.strip()}"


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


# --- systems ------------------------------------------------------------------------------

ADD_ACTION = "#ComputerSystem.AddResourceBlock"
REMOVE_ACTION = "#ComputerSystem.RemoveResourceBlock"


@dataclass(frozen=True, slots=True)
class SystemInfo:
    """A ComputerSystem, reduced to what hosts and attach/detach need.

    Attributes:
        uri: the URI it was read from.
        host_id: its ``Id`` (else the URI's last segment).
        resource_blocks: ``Links.ResourceBlocks`` URIs, in order.
        chassis: ``Links.Chassis`` URIs.
        add_target, remove_target: the ``AddResourceBlock`` / ``RemoveResourceBlock`` action
            targets when advertised (ComputerSystem v1_16+), else None.
        etag: ``@odata.etag`` from the body, if any (the ``ETag`` header is preferred by the
            caller).
    """

    uri: str
    host_id: str
    name: str | None = None
    hostname: str | None = None
    uuid: str | None = None
    serial: str | None = None
    health: Health = Health.UNKNOWN
    resource_blocks: tuple[str, ...] = ()
    chassis: tuple[str, ...] = ()
    add_target: str | None = None
    remove_target: str | None = None
    etag: str | None = None


def _action_target(actions: Mapping[str, Any], name: str) -> str | None:
    action = obj(actions, name, "Actions.")
    return text(action, "target", f"Actions.{name}.")


def parse_system(payload: Any, uri: str) -> SystemInfo:
    """Parse a ComputerSystem.

    Raises:
        BadItem: not an object, no ``@odata.id``, or a property of the wrong type.
    """
    if not isinstance(payload, Mapping):
        raise BadItem("body is not a JSON object", "bad-type")
    odata_id(payload)
    system_links = obj(payload, "Links")
    actions = obj(payload, "Actions")
    return SystemInfo(
        uri=norm_uri(uri),
        host_id=text(payload, "Id") or last_segment(uri),
        name=text(payload, "Name"),
        hostname=text(payload, "HostName"),
        uuid=text(payload, "UUID"),
        serial=text(payload, "SerialNumber"),
        health=parse_health(obj(payload, "Status")),
        resource_blocks=tuple(norm_uri(u) for u in links(system_links, "ResourceBlocks", "Links.")),
        chassis=links(system_links, "Chassis", "Links."),
        add_target=_action_target(actions, ADD_ACTION),
        remove_target=_action_target(actions, REMOVE_ACTION),
        etag=text(payload, "@odata.etag"),
    )


def host_from_system(system: SystemInfo, location: Location) -> FabricHost:
    """The :class:`FabricHost` for a parsed System at ``location``."""
    return FabricHost(
        host_id=system.host_id,
        name=system.name,
        hostname=system.hostname,
        uuid=system.uuid,
        serial=system.serial,
        location=location,
        health=system.health,
        attached_units=system.resource_blocks,
    )


# --- errors, Retry-After, tasks -----------------------------------------------------------


def message_ids(body: Any) -> list[str]:
    """MessageIds of a Redfish error body (``error.@Message.ExtendedInfo[]``) or of a Task's
    ``Messages[]``, in order; ``error.code`` last. Malformed parts are skipped."""
    found: list[str] = []
    if not isinstance(body, Mapping):
        return found
    error = body.get("error")
    containers: list[Any] = []
    if isinstance(error, Mapping):
        containers.append(error.get("@Message.ExtendedInfo"))
    containers.append(body.get("@Message.ExtendedInfo"))
    containers.append(body.get("Messages"))
    for container in containers:
        if isinstance(container, list):
            for info in container:
                if isinstance(info, Mapping) and isinstance(info.get("MessageId"), str):
                    found.append(info["MessageId"])
    if isinstance(error, Mapping) and isinstance(error.get("code"), str):
        found.append(error["code"])
    return found


MAX_MESSAGE_CHARS = 300
"""Longest vendor message carried into an error, after folding it onto one line."""

_TAG = re.compile(r"<[^>]*>")


def _one_line(value: str) -> str | None:
    joined = " ".join(value.split())
    if not joined:
        return None
    return joined if len(joined) <= MAX_MESSAGE_CHARS else joined[: MAX_MESSAGE_CHARS - 3] + "..."


def _message_text(body: Any) -> str | None:
    """The human text of an error or Task body, on one line, at most
    :data:`MAX_MESSAGE_CHARS`: the Redfish error's ``@Message.ExtendedInfo[].Message`` (else
    ``error.message``) and a Task's ``Messages[].Message``; else, for services without a
    Redfish error object, a top-level ``message`` / ``Message`` / ``detail`` string or an
    ``error`` string; else a plain-text (non-JSON) body itself, HTML tags dropped."""
    if isinstance(body, str):
        return _one_line(_TAG.sub(" ", body) if body.lstrip().startswith("<") else body)
    if not isinstance(body, Mapping):
        return None
    error = body.get("error")
    parts: list[str] = []
    if isinstance(error, str):
        parts.append(error)
    if isinstance(error, Mapping):
        infos = error.get("@Message.ExtendedInfo")
        if isinstance(infos, list):
            parts.extend(
                info["Message"]
                for info in infos
                if isinstance(info, Mapping) and isinstance(info.get("Message"), str)
            )
        if not parts and isinstance(error.get("message"), str):
            parts.append(error["message"])
    messages = body.get("Messages")
    if isinstance(messages, list):
        parts.extend(
            info["Message"]
            for info in messages
            if isinstance(info, Mapping) and isinstance(info.get("Message"), str)
        )
    if not parts:
        for key in ("message", "Message", "detail"):
            if isinstance(body.get(key), str):
                parts.append(body[key])
                break
    if not parts:
        return None
    return _one_line(" ".join(parts))


_MESSAGE_CLASSES: tuple[tuple[str, type[FabricError]], ...] = (
    ("ResourceInUse", FabricConflict),
    ("ResourceAlreadyExists", FabricConflict),
    ("PreconditionFailed", FabricPreconditionFailed),
    ("PreconditionRequired", FabricPreconditionFailed),
    ("ResourceNotFound", FabricNotFound),
    ("ResourceMissingAtURI", FabricNotFound),
    ("ServiceTemporarilyUnavailable", FabricUnavailable),
    ("ServiceShuttingDown", FabricUnavailable),
)
"""Base registry MessageIds (``Base.<version>.<Name>``) that decide the error class of a 4xx
answer, whatever its status (services answer ResourceInUse with 400 or 409)."""


def classify_message_ids(ids: Sequence[str]) -> tuple[type[FabricError], str] | None:
    """The error class named by the first recognised MessageId, and that id."""
    for message_id in ids:
        name = message_id.rsplit(".", 1)[-1]
        for known, error_class in _MESSAGE_CLASSES:
            if name == known:
                return error_class, message_id
    return None


PERMANENT_STATUSES = frozenset({400, 403, 405, 406, 501})
"""Statuses that repeating the same request cannot change (RFC 9110 section 15: bad request,
forbidden, method not allowed, not acceptable, not implemented): never retryable, whatever
MessageId the body carries."""


def _class_for_status(status: int) -> type[FabricError]:
    if status in (401, 403):
        return FabricAuthError
    if status in (404, 410):
        return FabricNotFound
    if status == 409:
        return FabricConflict
    if status in (412, 428):
        return FabricPreconditionFailed
    if status == 408 or status == 504:
        return FabricTimeout
    if status in PERMANENT_STATUSES:
        return FabricError
    if status == 429 or status >= 500:
        return FabricUnavailable
    return FabricError


def error_from_response(status: int, body: Any, *, context: str) -> FabricError:
    """Map an HTTP error answer to a typed error.

    Args:
        status: the HTTP status (>= 400).
        body: the decoded JSON body; or the body's text when it was not JSON (plain text or
            HTML from a service or a proxy); or None when there was none.
        context: what was being done, e.g. ``"GET /redfish/v1/Systems/1"``; starts the message.

    Returns:
        401/403 -> FabricAuthError; 404/410 -> FabricNotFound; 409 -> FabricConflict;
        412/428 -> FabricPreconditionFailed; 408/504 -> FabricTimeout; 400/405/406/501 and
        other 4xx -> FabricError (permanent); 429 and other 5xx -> FabricUnavailable. A
        recognised Base MessageId (ResourceInUse, PreconditionFailed, ResourceNotFound, ...)
        decides the class of a 4xx other than 401/403, except that it never makes one of
        :data:`PERMANENT_STATUSES` retryable. ``vendor_code`` is the deciding MessageId, else
        the first one, else ``error.code``. The message is ``<context>: HTTP <status>
        [<vendor_code>][: <vendor text>]``, the text on one line and capped (see
        ``_message_text``).
    """
    error_class = _class_for_status(status)
    ids = message_ids(body)
    vendor_code = ids[0] if ids else None
    if 400 <= status < 500 and status not in (401, 403):
        known = classify_message_ids(ids)
        if known is not None and not (status in PERMANENT_STATUSES and known[0].retryable):
            error_class, vendor_code = known
    detail = _message_text(body)
    message = f"{context}: HTTP {status}"
    if vendor_code:
        message += f" {vendor_code}"
    if detail:
        message += f": {detail}"
    return error_class(message, status=status, vendor_code=vendor_code)


def normalise_etag(value: str | None) -> str | None:
    """An entity tag spelt as RFC 9110 section 8.8.3 says (``"opaque"`` or ``W/"opaque"``),
    or None for a missing or blank one.

    Services get the quoting wrong: ``""abc""`` (quoted twice), ``abc`` (not quoted). Extra
    quotes are stripped and one pair is put back. A weak prefix ``W/`` is kept and the tag is
    sent back as the service gave it: RFC 9110 section 13.1.1 compares ``If-Match`` strongly,
    but Redfish services hand out weak tags in ``@odata.etag`` and expect them back in
    ``If-Match`` (DSP0266 "ETags": the client sends the ETag it read), and turning a weak tag
    into a strong one would send a tag the service never issued. Never raises.
    """
    if value is None:
        return None
    tag = value.strip()
    weak = tag[:2] in ("W/", "w/")
    if weak:
        tag = tag[2:].strip()
    opaque = tag.strip('"').strip()
    if not opaque:
        return None
    return f'{"W/" if weak else ""}"{opaque}"'


def preferred_etag(header: str | None, body_etag: str | None) -> str | None:
    """The ETag to send in ``If-Match``: the body's ``@odata.etag`` when present (DSP0266:
    it is the resource's own version, and services whose header is quoted differently or
    stale still compare against it), else the ``ETag`` header; both normalised by
    :func:`normalise_etag`."""
    return normalise_etag(body_etag) or normalise_etag(header)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date, RFC 9110).

    Returns None for a missing or unparsable value; never negative.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value))
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


_RUNNING_TASK_STATES = frozenset(
    {"New", "Starting", "Running", "Suspended", "Interrupted", "Pending", "Stopping", "Service"}
)
_FAILED_TASK_STATES = frozenset({"Exception", "Killed", "Cancelled"})


def is_task(body: Any) -> bool:
    """True when ``body`` is a Redfish Task (it carries ``TaskState``)."""
    return isinstance(body, Mapping) and "TaskState" in body


def parse_task(body: Any, op_id: str) -> Operation:
    """Fold a Task resource into an :class:`Operation`.

    Redfish Task.v1: TaskState New/Starting/Running/Suspended/Interrupted/Pending/Stopping/
    Service -> RUNNING; Exception/Killed/Cancelled -> FAILED; Completed -> COMPLETED unless
    ``TaskStatus`` is Critical (then FAILED). This holds whatever the HTTP status that carried
    the Task (services answer a running task's monitor with 200 and the Task as well as with
    202). A FAILED operation's message starts with the TaskState (``TaskState Killed: ...``),
    then the Task's messages.

    Raises:
        FabricInvalidData: not an object, or ``TaskState`` missing or unknown.
    """
    if not isinstance(body, Mapping):
        raise FabricInvalidData(f"task {op_id}: body is not a JSON object")
    task_state = body.get("TaskState")
    message = _message_text(body)
    if task_state in _RUNNING_TASK_STATES:
        return Operation(op_id, OperationState.RUNNING, message)
    if task_state in _FAILED_TASK_STATES:
        said = f"TaskState {task_state}"
        return Operation(op_id, OperationState.FAILED, f"{said}: {message}" if message else said)
    if task_state == "Completed":
        if body.get("TaskStatus") == "Critical":
            said = "TaskState Completed with TaskStatus Critical"
            return Operation(
                op_id, OperationState.FAILED, f"{said}: {message}" if message else said
            )
        return Operation(op_id, OperationState.COMPLETED, message)
    raise FabricInvalidData(f"task {op_id}: TaskState {_show(task_state)} is not a task state")
