"""Chassis: where a device or host is, read from its chain of Chassis.

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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.fabric.redfish.parse.common import BadItem, integer, last_segment, link, obj, text
from app.fabric.types import Location

MAX_CHASSIS_DEPTH = 8
"""How many ``ContainedBy`` steps are followed from a device's chassis."""


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
