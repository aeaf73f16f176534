"""Backend-independent checks of vendor data, before anything reaches the database. Pure.

A backend already rejects what it cannot parse; these checks catch what parses but must not be
stored or published: ids that are empty or too long, text with NUL or control characters (which
PostgreSQL refuses), strings longer than the columns, negative or absurd sizes, attribute names
that can never become DRA attribute names, and duplicate ids within one listing.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

from app.db.models import TEXT_LENGTH, VENDOR_ID_LENGTH
from app.fabric.types import FabricDevice, FabricHost, Location, Rejected

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
# 1 PiB in MiB: far above any device's memory, far below an overflow.
MAX_MEMORY_MIB = 2**30
# DRA attribute ids are C identifiers of at most 32 characters
# (k8s.io/kubernetes pkg/apis/resource/validation, validateQualifiedName).
_ATTRIBUTE_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
# DRA string attribute values are at most 64 characters (ResourceSlice device attributes).
MAX_ATTRIBUTE_STRING = 64
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class InvalidItem(ValueError):
    """A vendor item that must not be stored. ``kind`` classifies it for metrics."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _check_text(name: str, value: str | None, limit: int = TEXT_LENGTH) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidItem(f"{name} is {type(value).__name__}, expected text", "bad-type")
    if len(value) > limit:
        raise InvalidItem(f"{name} is {len(value)} characters long, at most {limit}", "bad-value")
    if _CONTROL.search(value):
        raise InvalidItem(f"{name} contains control characters", "bad-value")


def _check_id(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidItem(f"{name} is missing or empty", "missing-field")
    _check_text(name, value, VENDOR_ID_LENGTH)


def _check_location(location: Location) -> None:
    if not isinstance(location, Location):
        raise InvalidItem("location is not a Location", "bad-type")
    for item in fields(location):
        _check_text(f"location.{item.name}", getattr(location, item.name))


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidItem(f"{name} is {type(value).__name__}, expected an integer", "bad-type")
    if not low <= value <= high:
        raise InvalidItem(f"{name} is {value}, expected {low} to {high}", "bad-value")


def _check_mapping(name: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidItem(f"{name} is {type(value).__name__}, expected a mapping", "bad-type")
    for key in value:
        if not isinstance(key, str) or not _ATTRIBUTE_ID.match(key):
            raise InvalidItem(
                f"{name} key {key!r} is not a C identifier of at most 32 characters", "bad-value"
            )
    return value


def check_device(device: FabricDevice) -> None:
    """Check one device for storage and publication.

    Raises:
        InvalidItem: with a one-line reason naming the field, and a ``kind``.
    """
    _check_id("vendor id", device.vendor_id)
    _check_id("attach unit", device.attach_unit)
    for name in ("vendor", "model", "serial", "part_number", "firmware_version", "name"):
        _check_text(name, getattr(device, name))
    _check_text("uuid", device.uuid, 64)
    _check_text("state", device.state, 64)
    if device.host_id is not None:
        _check_id("host id", device.host_id)
    if device.memory_mib is not None:
        _check_int("memory_mib", device.memory_mib, 0, MAX_MEMORY_MIB)
    for key, amount in _check_mapping("capacity", device.capacity).items():
        _check_int(f"capacity {key}", amount, 0, INT64_MAX)
    for key, value in _check_mapping("attributes", device.attributes).items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            _check_int(f"attribute {key}", value, INT64_MIN, INT64_MAX)
        elif isinstance(value, str):
            _check_text(f"attribute {key}", value, MAX_ATTRIBUTE_STRING)
        else:
            raise InvalidItem(
                f"attribute {key} is {type(value).__name__}, expected int, bool or text",
                "bad-type",
            )
    _check_location(device.location)


def check_host(host: FabricHost) -> None:
    """Check one host for storage.

    Raises:
        InvalidItem: with a one-line reason naming the field, and a ``kind``.
    """
    _check_id("host id", host.host_id)
    for name in ("name", "hostname", "serial"):
        _check_text(name, getattr(host, name))
    _check_text("uuid", host.uuid, 64)
    for unit in host.attached_units:
        _check_id("attached unit", unit)
    _check_location(host.location)


def split_valid_devices(
    devices: Iterable[FabricDevice],
) -> tuple[list[FabricDevice], list[Rejected]]:
    """Keep the devices that pass :func:`check_device` and whose vendor id is unique.

    Every copy of a duplicated vendor id is rejected: there is no telling which copy is true.

    Returns:
        (valid devices in input order, rejections).
    """
    items = list(devices)
    counts = Counter(d.vendor_id for d in items if isinstance(d.vendor_id, str))
    valid: list[FabricDevice] = []
    rejected: list[Rejected] = []
    for device in items:
        label = device.vendor_id if isinstance(device.vendor_id, str) else repr(device.vendor_id)
        try:
            check_device(device)
        except InvalidItem as err:
            rejected.append(Rejected(label[:VENDOR_ID_LENGTH], str(err), err.kind))
            continue
        if counts[device.vendor_id] > 1:
            rejected.append(
                Rejected(
                    device.vendor_id,
                    f"vendor id listed {counts[device.vendor_id]} times",
                    "duplicate",
                )
            )
            continue
        valid.append(device)
    return valid, rejected


def split_valid_hosts(hosts: Iterable[FabricHost]) -> tuple[list[FabricHost], list[Rejected]]:
    """Like :func:`split_valid_devices`, for hosts."""
    items = list(hosts)
    counts = Counter(h.host_id for h in items if isinstance(h.host_id, str))
    valid: list[FabricHost] = []
    rejected: list[Rejected] = []
    for host in items:
        label = host.host_id if isinstance(host.host_id, str) else repr(host.host_id)
        try:
            check_host(host)
        except InvalidItem as err:
            rejected.append(Rejected(label[:VENDOR_ID_LENGTH], str(err), err.kind))
            continue
        if counts[host.host_id] > 1:
            rejected.append(
                Rejected(host.host_id, f"host id listed {counts[host.host_id]} times", "duplicate")
            )
            continue
        valid.append(host)
    return valid, rejected
