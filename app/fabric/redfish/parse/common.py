"""Property readers every Redfish resource kind shares, and :class:`BadItem`.

Rules taken from Redfish (DSP0266 and the DSP8010 schemas, 2025.x):

* Property types follow the schemas: identity and location properties are strings,
  ``CapacityBytes`` / ``CapacityMiB`` / ``LocationOrdinalValue`` are Int64, links are
  ``{"@odata.id": uri}`` objects. JSON ``null`` means "not reported" and is the same as
  absent. Any other type, a string longer than :data:`MAX_STRING_BYTES` (UTF-8), or a negative
  capacity rejects the item that carries it.
* Resource URIs end in the resource's ``Id`` (DSP0266 "Resource URI patterns"), so a link is
  turned into an id by its last path segment where the target is not read.

Health: ``Status.Health`` (Resource.v1 ``Health``: OK, Warning, Critical) that is missing,
null, blank, not a string or another value is UNKNOWN. A device's health combines its own and
its block's (:func:`worst_health`): a device whose own health is UNKNOWN is UNKNOWN unless its
block reports Warning or Critical (then the block's); a device with known health takes the
worse of its own and its block's known health (a block with unknown health does not degrade
it). ``Status.State`` that is missing, null or blank is None (the block's, if it has one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.fabric.types import Health

MAX_STRING_BYTES = 1024
"""Longest vendor string accepted, in UTF-8 bytes; longer ones reject their item."""

MAX_INT64 = 2**63 - 1
"""Largest capacity accepted (DRA quantities and attributes are int64)."""

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


def show(value: Any) -> str:
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
        raise BadItem(f"{where}{ODATA_ID} {show(value)} is not an absolute path", "bad-type")
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
