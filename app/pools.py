"""Devices -> pools -> ResourceSlice contents. Pure functions, no I/O.

Rules (DRA-REFERENCE.md; k8s.io/kubernetes pkg/apis/resource/validation):

* A pool groups the devices that share the configured location keys (default region, then
  rack). Its name is one DNS label per key joined by ``/`` (``us-east/rack-12``), at most 253
  characters. A location value that is not already a lowercase DNS label is sanitised and gets 8
  hex digits of its SHA-256, so two values never share a pool by accident; a missing value is
  ``unknown``.
* A pool's node selector has exactly one term: one ``In`` expression per grouping key, on the
  node label configured for that key, with the location value as a label value (sanitised the
  same way when it is not a valid label value). Exactly the nodes labelled with the pool's
  location reach it.
* Each device becomes a slice device (v1 shape): typed attributes, capacity, ``bindsToNode``
  with binding conditions (KEP-5007) when configured, and a ``NoSchedule`` taint when it is
  out of service: unhealthy (Redfish health Critical: ``<driver>/unhealthy``), cordoned
  (``<driver>/cordoned``), failed an attach (``<driver>/attach-failed``), failed a detach
  (``<driver>/detach-failed``), or held by a server with no reservation of ours
  (``<driver>/held-by-other-host``, the holder as value). With ``unhealthy=withhold`` such
  devices are left out instead. A device whose health is unknown (missing, null, empty or
  unrecognised Redfish ``Status.Health``) is not offered as healthy either: it gets its own
  ``<driver>/health-unknown`` taint, or is withheld or offered as ``unknown_health`` says.
  At most 32 attributes and capacities; a string attribute longer than 64 characters or an
  invalid version is dropped and reported.
* Slices hold at most 128 devices, 64 when any device in the slice has taints. Tainted devices
  are packed first, then the others, each run in name order, which gives the minimum number of
  slices: ceil(t/64) + ceil(max(0, u - spare)/128) for t tainted and u other devices, where
  spare is the room left in the last tainted slice. A pool with no publishable device still has
  one empty slice: an empty pool is not the same as no pool.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from app.fabric.types import AttributeValue, Location

if TYPE_CHECKING:
    from app.config import Settings

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_POOL_NAME = 253
MAX_STRING_ATTRIBUTE = 64
UNKNOWN = "unknown"
UNHEALTHY = frozenset({"Critical"})
HEALTH_UNKNOWN = "Unknown"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
# Semantic Versioning 2.0.0, the form DRA version attributes must take.
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")


@dataclass(frozen=True, slots=True)
class PoolDevice:
    """A device as the pool functions need it (converted from the database at its edge).

    Attributes:
        name: the Kubernetes device name (a DNS label, unique across the inventory).
        device_type: ``gpu``, ``fpga``, ``nvme``, ...
        location: where it is.
        health: ``OK``, ``Warning``, ``Critical`` or ``Unknown``.
        memory_mib: device memory in MiB, if any.
        capacity: extra capacities, name -> integer amount.
        attributes: extra typed attributes.
        cordoned: an operator took it out of service.
        attach_failed: its last attach failed; it is not offered until it is healthy again.
        detach_failed: a detach of it failed for good; not offered until an operator
            forgets the reservation.
        held_by: the host the fabric shows it attached to while no reservation of ours
            holds it (someone else's server), else None.
    """

    name: str
    device_type: str
    location: Location = field(default_factory=Location)
    health: str = "OK"
    vendor: str | None = None
    model: str | None = None
    uuid: str | None = None
    serial: str | None = None
    part_number: str | None = None
    firmware_version: str | None = None
    memory_mib: int | None = None
    capacity: Mapping[str, int] = field(default_factory=dict)
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    cordoned: bool = False
    attach_failed: bool = False
    detach_failed: bool = False
    held_by: str | None = None


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """Everything the pool functions depend on besides the devices.

    Attributes:
        driver_name: the DRA driver (a DNS subdomain); also the domain of taint keys.
        grouping_keys: location keys that make a pool, e.g. ``("region", "rack")``.
        node_labels: location key -> node label key.
        binds_to_node: put ``bindsToNode`` and the binding conditions on every device.
        binding_conditions, binding_failure_conditions: condition types (1 to 4 each).
        unhealthy: ``taint`` or ``withhold``.
        unknown_health: ``taint``, ``withhold`` or ``offer`` (as healthy) a device whose
            health is unknown.
        taints_supported: False when the API server drops taints (the DRADeviceTaints gate is
            off); unhealthy devices are then withheld whatever ``unhealthy`` says.
    """

    driver_name: str
    grouping_keys: tuple[str, ...] = ("region", "rack")
    node_labels: Mapping[str, str] = field(default_factory=dict)
    binds_to_node: bool = True
    binding_conditions: tuple[str, ...] = ("FabricDeviceReady",)
    binding_failure_conditions: tuple[str, ...] = ("FabricDeviceFailed",)
    unhealthy: str = "taint"
    unknown_health: str = "taint"
    taints_supported: bool = True

    @classmethod
    def from_settings(cls, settings: Settings, *, taints_supported: bool = True) -> PoolConfig:
        """The pool configuration that ``settings`` describe."""
        keys = settings.grouping_keys()
        return cls(
            driver_name=settings.driver_name,
            grouping_keys=keys,
            node_labels={key: settings.node_labels.for_key(key) for key in keys},
            binds_to_node=settings.pools.binds_to_node,
            binding_conditions=tuple(settings.pools.binding_conditions),
            binding_failure_conditions=tuple(settings.pools.binding_failure_conditions),
            unhealthy=settings.pools.unhealthy,
            unknown_health=settings.pools.unknown_health,
            taints_supported=taints_supported,
        )


@dataclass(frozen=True, slots=True)
class DroppedAttribute:
    """An attribute that could not be published, and why."""

    device: str
    attribute: str
    reason: str


@dataclass(frozen=True, slots=True)
class SliceContent:
    """What one ResourceSlice of a pool holds (its spec, apart from the pool's generation and
    resourceSliceCount, which the publisher sets).

    Attributes:
        index: position of the slice in its pool, from 0.
        devices: slice devices in the v1 JSON shape.
        content_hash: SHA-256 (hex) of the node selector and devices.
    """

    index: int
    devices: tuple[dict[str, Any], ...]
    content_hash: str


@dataclass(frozen=True, slots=True)
class DesiredPool:
    """One pool as it should be published.

    Attributes:
        name: the pool name (``us-east/rack-12``).
        location: grouping key -> raw location value (None when unknown).
        node_selector: a core NodeSelector with exactly one term (JSON shape).
        slices: at least one.
        withheld: names of devices left out (unhealthy, cordoned or failed, when withholding).
        dropped: attributes that could not be published.
    """

    name: str
    location: tuple[tuple[str, str | None], ...]
    node_selector: dict[str, Any]
    slices: tuple[SliceContent, ...]
    withheld: tuple[str, ...] = ()
    dropped: tuple[DroppedAttribute, ...] = ()

    @property
    def device_count(self) -> int:
        """Devices published in the pool."""
        return sum(len(s.devices) for s in self.slices)


def _digest(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def pool_segment(value: str | None, max_length: int = 63) -> str:
    """The pool-name segment for one location value: a lowercase DNS label.

    A value that already is one (and fits) is kept; otherwise it is sanitised and gets 8 hex
    digits of its SHA-256. None gives ``unknown``.
    """
    if value is None:
        return UNKNOWN
    if len(value) <= max_length and _DNS_LABEL.match(value):
        return value
    stem = re.sub(r"[^a-z0-9]+", "-", value.lower()).strip("-")
    stem = stem[: max_length - 9].rstrip("-") or "x"
    return f"{stem}-{_digest(value)}"


def label_value(value: str | None) -> str:
    """The node label value for one location value (Kubernetes IsValidLabelValue).

    A valid label value is kept; otherwise it is sanitised and gets 8 hex digits of its
    SHA-256. None gives ``unknown``.
    """
    if value is None:
        return UNKNOWN
    if len(value) <= 63 and _LABEL_VALUE.match(value) and value:
        return value
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-_.")
    stem = stem[:54].rstrip("-_.") or "x"
    return f"{stem}-{_digest(value)}"


def pool_name(location: Location, grouping_keys: Sequence[str]) -> str:
    """The pool name for ``location``: one :func:`pool_segment` per key, joined by ``/``.

    Each segment is capped so that the name stays within 253 characters (Kubernetes
    validatePoolName).
    """
    cap = min(63, (MAX_POOL_NAME - (len(grouping_keys) - 1)) // max(1, len(grouping_keys)))
    return "/".join(pool_segment(getattr(location, key), cap) for key in grouping_keys)


def node_selector(location: Location, config: PoolConfig) -> dict[str, Any]:
    """The pool's NodeSelector: one term with an ``In`` expression per grouping key."""
    expressions = [
        {
            "key": config.node_labels.get(key, f"fabric-dra.io/{key.replace('_', '-')}"),
            "operator": "In",
            "values": [label_value(getattr(location, key))],
        }
        for key in config.grouping_keys
    ]
    return {"nodeSelectorTerms": [{"matchExpressions": expressions}]}


def quantity(amount: int, *, binary: bool) -> str:
    """A Kubernetes quantity string for a non-negative integer, in canonical form.

    ``binary`` picks the largest of Ki, Mi, Gi, ... that divides ``amount`` exactly (for
    bytes); otherwise the largest of k, M, G, ... (for counts). Canonical forms keep what we
    write equal to what the API server gives back.
    """
    if amount < 0:
        raise ValueError(f"negative quantity {amount}")
    base, suffixes = (1024, _BINARY_SUFFIXES) if binary else (1000, _DECIMAL_SUFFIXES)
    exponent = 0
    while amount and amount % base == 0 and exponent < len(suffixes) - 1:
        amount //= base
        exponent += 1
    return f"{amount}{suffixes[exponent]}"


def _typed(value: AttributeValue) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


class SharedValues:
    """Equal JSON values shared between the devices of one :func:`desired_pools` call.

    Most of a slice device's attribute values repeat across devices (type, vendor, model,
    firmware, location, health, capacity, binding conditions); each distinct one is built once
    and the same object is put into every device that has it. At 100,000 devices that halves
    the memory of the desired pools. The shared objects are read-only like the rest of the
    desired pools (see :func:`resource_slice_spec`); their JSON is unchanged.
    """

    def __init__(self) -> None:
        self._values: dict[tuple[Any, ...], Any] = {}

    def typed(self, kind: str, value: AttributeValue) -> dict[str, Any]:
        """``{kind: value}``, one object per distinct pair."""
        key = (kind, type(value), value)
        found = self._values.get(key)
        if found is None:
            found = self._values[key] = {kind: value}
        return cast("dict[str, Any]", found)

    def get(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """The value for ``key``, made by ``make`` the first time."""
        found = self._values.get(key)
        if found is None:
            found = self._values[key] = make()
        return found


# Attribute names of the built-in attributes (all C identifiers), and which of them are the
# same for many devices (their typed values are shared; the others are per device).
_LOCATION_KEYS = ("region", "zone", "site", "row", "rack", "chassis", "slot", "fabric")
_PER_DEVICE = frozenset({"uuid", "serialNumber"})


def slice_device(
    device: PoolDevice, config: PoolConfig, tainted: bool, shared: SharedValues | None = None
) -> tuple[dict[str, Any], list[DroppedAttribute]]:
    """The v1 ResourceSlice device for ``device``, and the attributes that had to be dropped.

    ``shared`` (one per :func:`desired_pools` call) lets devices share equal values.
    """
    values = shared if shared is not None else SharedValues()
    dropped: list[DroppedAttribute] = []
    entries: list[tuple[str, dict[str, Any]]] = [
        ("deviceType", values.typed("string", device.device_type))
    ]
    for key, value in (
        ("vendor", device.vendor),
        ("model", device.model),
        ("uuid", device.uuid),
        ("serialNumber", device.serial),
        ("partNumber", device.part_number),
    ):
        if value is not None:
            entries.append(
                (key, {"string": value} if key in _PER_DEVICE else values.typed("string", value))
            )
    if device.firmware_version is not None:
        entries.append(
            (
                "firmwareVersion",
                values.get(
                    ("firmware", device.firmware_version),
                    lambda: _firmware(cast(str, device.firmware_version)),
                ),
            )
        )
    for key in _LOCATION_KEYS:
        value = getattr(device.location, key)
        if value is not None:
            entries.append((key, values.typed("string", value)))
    entries.append(("health", values.typed("string", device.health)))
    taken = {key for key, _ in entries}
    for key in sorted(device.attributes):
        if key in taken:
            dropped.append(DroppedAttribute(device.name, key, "name used by a built-in attribute"))
            continue
        entries.append((key, _typed(device.attributes[key])))

    attributes: dict[str, dict[str, Any]] = {}
    for key, typed in entries:
        text = typed.get("string", typed.get("version"))
        if isinstance(text, str) and len(text) > MAX_STRING_ATTRIBUTE:
            dropped.append(DroppedAttribute(device.name, key, "longer than 64 characters"))
        elif not _C_IDENTIFIER.match(key):
            dropped.append(DroppedAttribute(device.name, key, "not a C identifier"))
        else:
            attributes[key] = typed

    capacity: dict[str, dict[str, str]] = {}
    if device.memory_mib is not None:
        memory_mib = device.memory_mib
        capacity["memory"] = values.get(
            ("memory", memory_mib),
            lambda: {"value": quantity(memory_mib * 1024 * 1024, binary=True)},
        )
    for key in sorted(device.capacity):
        amount = device.capacity[key]
        if key in capacity or not _C_IDENTIFIER.match(key):
            dropped.append(DroppedAttribute(device.name, key, "capacity name unusable"))
            continue
        capacity[key] = {"value": quantity(amount, binary=amount % 1024 == 0 and amount > 0)}

    # Attributes and capacities together are limited to 32 per device; capacities and the
    # first attributes (identity and location) win.
    room = MAX_ATTRIBUTES_AND_CAPACITIES - len(capacity)
    for key in list(attributes)[room:]:
        dropped.append(DroppedAttribute(device.name, key, "more than 32 attributes"))
        del attributes[key]

    result: dict[str, Any] = {"name": device.name, "attributes": attributes}
    if capacity:
        result["capacity"] = capacity
    if config.binds_to_node:
        result["bindsToNode"] = True
        result["bindingConditions"] = values.get(
            ("bindingConditions",), lambda: list(config.binding_conditions)
        )
        result["bindingFailureConditions"] = values.get(
            ("bindingFailureConditions",), lambda: list(config.binding_failure_conditions)
        )
    if tainted:
        result["taints"] = _taints(device, config)
    return result, dropped


def _firmware(version: str) -> dict[str, Any]:
    # A semantic version is published as a version attribute, anything else as a string.
    if len(version) <= 64 and _SEMVER.match(version):
        return {"version": version}
    return {"string": version}


def _taints(device: PoolDevice, config: PoolConfig) -> list[dict[str, str]]:
    return [taint for taint, _ in _problems(device, config)]


def _problems(device: PoolDevice, config: PoolConfig) -> list[tuple[dict[str, str], bool]]:
    """Why ``device`` must not be allocated now: (its NoSchedule taint, withhold it instead)."""
    withhold = config.unhealthy == "withhold" or not config.taints_supported
    driver = config.driver_name
    found: list[tuple[dict[str, str], bool]] = []
    if device.health in UNHEALTHY:
        found.append(
            (
                {"key": f"{driver}/unhealthy", "value": device.health, "effect": "NoSchedule"},
                withhold,
            )
        )
    elif device.health == HEALTH_UNKNOWN and config.unknown_health != "offer":
        found.append(
            (
                {"key": f"{driver}/health-unknown", "effect": "NoSchedule"},
                config.unknown_health == "withhold" or not config.taints_supported,
            )
        )
    if device.cordoned:
        found.append(({"key": f"{driver}/cordoned", "effect": "NoSchedule"}, withhold))
    if device.attach_failed:
        found.append(({"key": f"{driver}/attach-failed", "effect": "NoSchedule"}, withhold))
    if device.detach_failed:
        found.append(({"key": f"{driver}/detach-failed", "effect": "NoSchedule"}, withhold))
    if device.held_by is not None:
        found.append(
            (
                {
                    "key": f"{driver}/held-by-other-host",
                    "value": label_value(device.held_by),
                    "effect": "NoSchedule",
                },
                withhold,
            )
        )
    return found


def content_hash(node_selector_: Mapping[str, Any], devices: Sequence[Mapping[str, Any]]) -> str:
    """SHA-256 (hex) of a canonical JSON form of a slice's node selector and devices."""
    payload = json.dumps([node_selector_, list(devices)], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def chunk(
    tainted: Sequence[dict[str, Any]], others: Sequence[dict[str, Any]]
) -> list[list[dict[str, Any]]]:
    """Split devices into the fewest slices: tainted first, 64 a slice while a slice holds a
    tainted device, 128 otherwise. Always at least one (possibly empty) slice."""
    slices: list[list[dict[str, Any]]] = []
    queue = [*tainted, *others]
    position = 0
    while position < len(queue):
        limit = (
            MAX_DEVICES_PER_SLICE_WITH_TAINTS
            if position < len(tainted)
            else (MAX_DEVICES_PER_SLICE)
        )
        slices.append(queue[position : position + limit])
        position += limit
    return slices or [[]]


def minimum_slices(tainted: int, others: int) -> int:
    """The fewest slices that can hold ``tainted`` tainted and ``others`` other devices."""
    with_taints = math.ceil(tainted / MAX_DEVICES_PER_SLICE_WITH_TAINTS)
    spare = with_taints * MAX_DEVICES_PER_SLICE_WITH_TAINTS - tainted
    rest = max(0, others - spare)
    return max(1, with_taints + math.ceil(rest / MAX_DEVICES_PER_SLICE))


class PoolCache:
    """The pools :func:`desired_pools` laid out last time, by name, with the devices and
    configuration they were made from: a pool whose devices and configuration are equal is
    reused instead of laid out again (its slices' content and hashes are the costly part,
    and after one change only one pool differs). Holds one entry per pool; entries of pools
    that are gone are dropped on each call."""

    __slots__ = ("_entries", "_names")

    def __init__(self) -> None:
        self._entries: dict[str, tuple[PoolConfig, list[PoolDevice], DesiredPool]] = {}
        self._names: dict[tuple[Location, tuple[str, ...]], str] = {}

    def pool_name(self, location: Location, grouping_keys: Sequence[str]) -> str:
        """:func:`pool_name`, remembered per location (there are few distinct ones)."""
        key = (location, tuple(grouping_keys))
        name = self._names.get(key)
        if name is None:
            if len(self._names) > 100_000:
                self._names.clear()
            name = self._names[key] = pool_name(location, grouping_keys)
        return name

    def get(self, name: str, config: PoolConfig, members: list[PoolDevice]) -> DesiredPool | None:
        """The pool laid out from exactly ``members`` and ``config`` before, else None."""
        entry = self._entries.get(name)
        if entry is not None and entry[0] == config and entry[1] == members:
            return entry[2]
        return None

    def keep(self, pools: Mapping[str, tuple[PoolConfig, list[PoolDevice], DesiredPool]]) -> None:
        """Remember exactly ``pools`` (name -> (config, members, pool))."""
        self._entries = dict(pools)


def desired_pools(
    devices: Iterable[PoolDevice], config: PoolConfig, cache: PoolCache | None = None
) -> dict[str, DesiredPool]:
    """Group ``devices`` into pools and lay each pool out as slices.

    Args:
        devices: every present device (removed ones excluded); names unique.
        config: see :class:`PoolConfig`.
        cache: pools laid out by an earlier call; a pool whose devices and configuration
            are equal is taken from it (the result is the same as without it).

    Returns:
        Pool name -> :class:`DesiredPool`, for every pool that has at least one device
        (published or withheld).

    Raises:
        ValueError: two devices share a name (names must be unique in a pool).
    """
    groups: dict[str, list[PoolDevice]] = {}
    locations: dict[str, Location] = {}
    name_of = cache.pool_name if cache is not None else pool_name
    for device in devices:
        name = name_of(device.location, config.grouping_keys)
        groups.setdefault(name, []).append(device)
        locations.setdefault(name, device.location)

    shared = SharedValues()
    pools: dict[str, DesiredPool] = {}
    kept: dict[str, tuple[PoolConfig, list[PoolDevice], DesiredPool]] = {}
    for name, members in sorted(groups.items()):
        members.sort(key=lambda d: d.name)
        for first, second in itertools.pairwise(members):
            if first.name == second.name:
                raise ValueError(f"pool {name!r}: device name {first.name!r} is used twice")
        cached = cache.get(name, config, members) if cache is not None else None
        if cached is not None:
            pools[name] = cached
            kept[name] = (config, members, cached)
            continue
        tainted: list[dict[str, Any]] = []
        others: list[dict[str, Any]] = []
        withheld: list[str] = []
        dropped: list[DroppedAttribute] = []
        for device in members:
            problems = _problems(device, config)
            bad = bool(problems)
            if any(withhold for _, withhold in problems):
                withheld.append(device.name)
                continue
            entry, lost = slice_device(device, config, tainted=bad, shared=shared)
            dropped.extend(lost)
            (tainted if bad else others).append(entry)
        location = locations[name]
        selector = node_selector(location, config)
        slices = tuple(
            SliceContent(index, tuple(content), content_hash(selector, content))
            for index, content in enumerate(chunk(tainted, others))
        )
        pools[name] = DesiredPool(
            name=name,
            location=tuple((key, getattr(location, key)) for key in config.grouping_keys),
            node_selector=selector,
            slices=slices,
            withheld=tuple(withheld),
            dropped=tuple(dropped),
        )
        kept[name] = (config, members, pools[name])
    if cache is not None:
        cache.keep(kept)
    return pools


def resource_slice_spec(
    driver_name: str, pool: DesiredPool, content: SliceContent, generation: int
) -> dict[str, Any]:
    """The v1 ResourceSlice ``spec`` for one slice of ``pool`` at ``generation``.

    Exactly one node-selection field is set (``nodeSelector``); the others are left out, as
    the API server refuses them empty (validateResourceSliceSpec). The device dicts are the
    desired pool's own (not copies): callers must not modify the result.
    """
    return {
        "driver": driver_name,
        "pool": {
            "name": pool.name,
            "generation": generation,
            "resourceSliceCount": len(pool.slices),
        },
        "nodeSelector": pool.node_selector,
        "devices": list(content.devices),
    }
