"""ComputerSystems: the hosts devices are attached to, and their composition actions.

Attach and detach use the ``ComputerSystem.AddResourceBlock`` / ``RemoveResourceBlock``
actions when a System advertises them (ComputerSystem v1_16+), else ``Links.ResourceBlocks``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
from app.fabric.types import FabricHost, Health, Location

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
