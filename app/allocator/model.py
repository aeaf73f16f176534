"""Value types the allocator works on, and their construction from API JSON.

Devices, pools, device classes, claims and nodes arrive as resource.k8s.io v1 JSON (ResourceSlice,
DeviceClass, ResourceClaim spec) and core/v1 Node data; the functions here turn them into frozen
values once, so that repeated allocations over the same snapshot do no parsing. Pool gathering
(newest generation, completeness, validity) lives in :mod:`app.allocator.pools`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.allocator import values

ALLOCATION_MODE_EXACT_COUNT = "ExactCount"
ALLOCATION_MODE_ALL = "All"

# A typed attribute value: ("int"|"bool"|"string"|"version"|list kinds, value).
TypedValue = tuple[str, Any]
DeviceId = tuple[str, str, str]


class SpecError(ValueError):
    """A claim, class or slice that cannot be used as given (the message names the object)."""


@dataclass(frozen=True, slots=True)
class Reach:
    """Which nodes can use a device: exactly one of the three is set (ResourceSlice
    ``nodeName`` / ``nodeSelector`` / ``allNodes``, or the device's own with
    ``perDeviceNodeSelection``).

    Attributes:
        node_name: the single node.
        node_selector: a core NodeSelector (JSON), for the v1 API exactly one term.
        all_nodes: every node.
    """

    node_name: str | None = None
    node_selector: Mapping[str, Any] | None = None
    all_nodes: bool = False


@dataclass(frozen=True, slots=True)
class Taint:
    """A device taint (KEP-5055): ``effect`` is ``None``, ``NoSchedule`` or ``NoExecute``."""

    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    """A request's toleration of device taints (core Toleration semantics: ``Exists`` with an
    empty key tolerates everything; an empty effect matches every effect).
    ``toleration_seconds`` only matters to eviction (``NoExecute``), not to allocation."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None

    def tolerates(self, taint: Taint) -> bool:
        """True when this toleration covers ``taint`` (k8s.io/api core/v1 ToleratesTaint)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value

    def to_json(self) -> dict[str, Any]:
        """The v1 DeviceToleration JSON, as the API server stores it (empty fields left out,
        ``operator`` always given)."""
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


@dataclass(frozen=True, slots=True, eq=False)
class Device:
    """One published device, ready for selection.

    Attributes:
        driver, pool, name: its identity (``device_id``).
        attributes: fully qualified name (``domain/id``; bare ids get the driver's domain) ->
            typed value, for matchAttribute constraints.
        cel_device: the ``device`` variable as CEL sees it: ``driver``,
            ``allowMultipleAllocations``, ``attributes[domain][id]`` and
            ``capacity[domain][id]`` (quantities, see :mod:`app.allocator.values`). Read only.
        fingerprint: SHA-256 of the device's JSON without its name: the same device published
            under another pool generation keeps it, a changed device does not.
        reach: the nodes that can use it.
        binds_to_node, binding_conditions, binding_failure_conditions: KEP-5007 fields.
        taints: its taints.
        device_id: (driver, pool, device), the identity results and the in-use set speak of.
    """

    driver: str
    pool: str
    name: str
    attributes: Mapping[str, TypedValue]
    cel_device: Mapping[str, Any]
    fingerprint: str
    reach: Reach
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    taints: tuple[Taint, ...] = ()
    device_id: DeviceId = field(init=False)

    def __post_init__(self) -> None:
        # Computed once: the search looks it up in sets for every candidate.
        object.__setattr__(self, "device_id", (self.driver, self.pool, self.name))


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """A DeviceClass: its CEL selectors (all must match) and opaque config entries (JSON
    ``{"opaque": {"driver", "parameters"}}``, copied into allocations as ``FromClass``)."""

    name: str
    selectors: tuple[str, ...] = ()
    config: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One way to satisfy a claim request: the request itself (``exactly``) or one of its
    ``firstAvailable`` subrequests.

    Attributes:
        name: the name results use: ``req`` or ``req/sub``.
        parent: the claim request's name.
        device_class_name, selectors, allocation_mode, count, admin_access, tolerations: as in
            the API; ``count`` is 1 unless given, and unused for ``All``.
    """

    name: str
    parent: str
    device_class_name: str
    selectors: tuple[str, ...] = ()
    allocation_mode: str = ALLOCATION_MODE_EXACT_COUNT
    count: int = 1
    admin_access: bool = False
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True, slots=True)
class Request:
    """A claim request and its alternatives, tried in order (one unless ``firstAvailable``)."""

    name: str
    alternatives: tuple[DeviceRequest, ...]


@dataclass(frozen=True, slots=True)
class Constraint:
    """``constraints[]``: ``requests`` empty means every request of the claim; exactly one of
    ``match_attribute`` / ``distinct_attribute`` (fully qualified attribute names)."""

    requests: tuple[str, ...] = ()
    match_attribute: str | None = None
    distinct_attribute: str | None = None

    def applies_to(self, request: DeviceRequest) -> bool:
        """True when devices for ``request`` fall under this constraint (a parent name covers
        its subrequests)."""
        return (
            not self.requests or request.name in self.requests or (request.parent in self.requests)
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """A ResourceClaim to allocate: identity and ``spec.devices``.

    Attributes:
        config: ``spec.devices.config[]`` entries as JSON (``{"requests", "opaque"}``).
    """

    uid: str
    namespace: str
    name: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...] = ()
    config: tuple[Mapping[str, Any], ...] = ()

    @property
    def ref(self) -> str:
        """``namespace/name``, for messages."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Node:
    """A node: its name and labels (selectors match ``metadata.name`` as a field)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


def qualify(name: str, driver: str) -> str:
    """``domain/id`` for an attribute or capacity name; a bare id is under the driver's domain
    (k8s.io/dynamic-resource-allocation cel.parseQualifiedName)."""
    return name if "/" in name else f"{driver}/{name}"


def _typed(value: Mapping[str, Any]) -> TypedValue:
    for kind in ("int", "bool", "string", "version", "ints", "bools", "strings", "versions"):
        if value.get(kind) is not None:
            return kind, value[kind]
    raise SpecError(f"attribute value {value!r} has no supported type")


def _cel_attribute(kind: str, value: Any) -> Any:
    if kind == "version":
        return values.semver_value(value)
    if kind == "versions":
        return [values.semver_value(v) for v in value]
    if kind in ("ints", "bools", "strings"):
        return list(value)
    return value


def device_from_json(driver: str, pool: str, device: Mapping[str, Any], reach: Reach) -> Device:
    """A :class:`Device` from a v1 ResourceSlice device.

    Raises:
        SpecError: an attribute without a value, a version that is not semver 2.0.0 or a
            capacity that is not a quantity (the API server refuses these; a pool holding one
            is treated as invalid).
    """
    name = str(device.get("name") or "")
    attributes: dict[str, TypedValue] = {}
    cel_attributes: dict[str, dict[str, Any]] = {driver: {}}
    cel_capacity: dict[str, dict[str, Any]] = {driver: {}}
    try:
        for key, raw in (device.get("attributes") or {}).items():
            kind, value = _typed(raw)
            qualified = qualify(key, driver)
            attributes[qualified] = (kind, value)
            domain, _, ident = qualified.rpartition("/")
            cel_attributes.setdefault(domain, {})[ident] = _cel_attribute(kind, value)
        for key, raw in (device.get("capacity") or {}).items():
            domain, _, ident = qualify(key, driver).rpartition("/")
            amount = values.parse_quantity(str((raw or {}).get("value", "")))
            cel_capacity.setdefault(domain, {})[ident] = values.quantity_value(amount)
    except values.CelValueError as err:
        raise SpecError(f"device {name!r}: {err}") from err
    body = {k: v for k, v in device.items() if k != "name"}
    fingerprint = hashlib.sha256(
        json.dumps([driver, body], sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()
    return Device(
        driver=driver,
        pool=pool,
        name=name,
        attributes=attributes,
        cel_device={
            "driver": driver,
            "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
            "attributes": cel_attributes,
            "capacity": cel_capacity,
        },
        fingerprint=fingerprint,
        reach=reach,
        binds_to_node=device.get("bindsToNode") is True,
        binding_conditions=tuple(device.get("bindingConditions") or ()),
        binding_failure_conditions=tuple(device.get("bindingFailureConditions") or ()),
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "")))
            for t in device.get("taints") or ()
        ),
    )


def device_class_from_json(obj: Mapping[str, Any]) -> DeviceClass:
    """A :class:`DeviceClass` from a DeviceClass object (``metadata.name``, ``spec``)."""
    spec = obj.get("spec") or {}
    return DeviceClass(
        name=str((obj.get("metadata") or {}).get("name") or obj.get("name") or ""),
        selectors=tuple(
            str(((s or {}).get("cel") or {}).get("expression") or "")
            for s in spec.get("selectors") or ()
        ),
        config=tuple(c for c in spec.get("config") or () if (c or {}).get("opaque")),
    )


def _toleration_seconds(request: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"request {request!r}: tolerationSeconds must be an integer, not {value!r}")
    return value


def _objects(value: Any, where: str) -> list[Mapping[str, Any]]:
    """``value`` as a list of JSON objects (absent or null: empty).

    Raises:
        SpecError: it is something else (the API server's schema refuses it; what-if bodies
            come from people)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise SpecError(f"{where} must be a list of objects")
    return value


def _list(value: Any, where: str) -> list[Any]:
    """``value`` as a JSON list (absent or null: empty); SpecError otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecError(f"{where} must be a list")
    return value


def _object(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` as a JSON object (absent or null: empty); SpecError otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{where} must be an object")
    return value


def _text(value: Any, where: str) -> str:
    """``value`` as a string (absent or null: empty); SpecError otherwise."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SpecError(f"{where} must be a string, not {value!r}")
    return value


def _selectors(value: Any, where: str) -> tuple[str, ...]:
    """The CEL expressions of a ``selectors`` list (``[{"cel": {"expression": ...}}]``)."""
    return tuple(
        _text(_object(s.get("cel"), f"{where}[{i}].cel").get("expression"), f"{where}[{i}]")
        for i, s in enumerate(_objects(value, where))
    )


def _device_request(name: str, parent: str, body: Mapping[str, Any]) -> DeviceRequest:
    mode = _text(body.get("allocationMode"), f"request {name!r}: allocationMode")
    mode = mode or ALLOCATION_MODE_EXACT_COUNT
    if mode not in (ALLOCATION_MODE_EXACT_COUNT, ALLOCATION_MODE_ALL):
        raise SpecError(f"request {name!r}: unknown allocationMode {mode!r}")
    count = body.get("count")
    if count is None:
        count = 1
    elif isinstance(count, bool) or not isinstance(count, int):
        # An int64 in the API (k8s.io/api/resource/v1 types.go, DeviceRequest.Count).
        raise SpecError(f"request {name!r}: count must be an integer, not {count!r}")
    if mode == ALLOCATION_MODE_EXACT_COUNT and count < 1:
        raise SpecError(f"request {name!r}: count must be greater than 0, not {count}")
    class_name = _text(body.get("deviceClassName"), f"request {name!r}: deviceClassName")
    if not class_name:
        raise SpecError(f"request {name!r}: deviceClassName is required")
    return DeviceRequest(
        name=name,
        parent=parent,
        device_class_name=class_name,
        selectors=_selectors(body.get("selectors"), f"request {name!r}: selectors"),
        allocation_mode=mode,
        count=count,
        admin_access=body.get("adminAccess") is True,
        tolerations=tuple(
            Toleration(
                str(t.get("key") or ""),
                str(t.get("operator") or "Equal"),
                str(t.get("value") or ""),
                str(t.get("effect") or ""),
                _toleration_seconds(name, t.get("tolerationSeconds")),
            )
            for t in _objects(body.get("tolerations"), f"request {name!r}: tolerations")
        ),
    )


def claim_from_json(
    spec: Mapping[str, Any], *, uid: str = "", namespace: str = "", name: str = ""
) -> Claim:
    """A :class:`Claim` from a v1 ResourceClaim ``spec`` (``{"devices": {...}}``).

    Requests take ``exactly`` or ``firstAvailable`` (subrequests named ``req/sub`` in
    results).

    Raises:
        SpecError: a request with neither or both forms, no class, a bad count, mode or
            ``tolerationSeconds``, a constraint with neither or both attributes, or naming an
            unknown request; a field of the wrong JSON type (a list, object or string where
            the v1 schema has another), named by its place.
    """
    devices = _object(spec.get("devices"), "devices")
    requests: list[Request] = []
    for index, raw in enumerate(_objects(devices.get("requests"), "devices.requests")):
        request_name = _text(raw.get("name"), f"devices.requests[{index}].name")
        exactly, first = raw.get("exactly"), raw.get("firstAvailable")
        if (exactly is None) == (not first):
            raise SpecError(
                f"request {request_name!r}: exactly one of `exactly` or "
                "`firstAvailable` is required"
            )
        alternatives: tuple[DeviceRequest, ...]
        if exactly is not None:
            body = _object(exactly, f"request {request_name!r}: exactly")
            alternatives = (_device_request(request_name, request_name, body),)
        else:
            subs = _objects(first, f"request {request_name!r}: firstAvailable")
            alternatives = tuple(
                _device_request(
                    f"{request_name}/{_text(sub.get('name'), f'request {request_name!r}: name')}",
                    request_name,
                    sub,
                )
                for sub in subs
            )
        requests.append(Request(request_name, alternatives))
    names = {r.name for r in requests} | {a.name for r in requests for a in r.alternatives}
    constraints: list[Constraint] = []
    for index, raw in enumerate(_objects(devices.get("constraints"), "devices.constraints")):
        where = f"devices.constraints[{index}]"
        match = _text(raw.get("matchAttribute"), f"{where}.matchAttribute")
        distinct = _text(raw.get("distinctAttribute"), f"{where}.distinctAttribute")
        if bool(match) == bool(distinct):
            raise SpecError(
                "constraint: exactly one of matchAttribute or distinctAttribute is required"
            )
        listed = tuple(
            _text(r, f"{where}.requests") for r in _list(raw.get("requests"), f"{where}.requests")
        )
        unknown = [r for r in listed if r not in names]
        if unknown:
            raise SpecError(f"constraint on {match or distinct}: unknown requests {unknown}")
        constraints.append(Constraint(listed, match or None, distinct or None))
    config = tuple(c for c in _objects(devices.get("config"), "devices.config") if c.get("opaque"))
    return Claim(
        uid=uid,
        namespace=namespace,
        name=name,
        requests=tuple(requests),
        constraints=tuple(constraints),
        config=config,
    )


def claim_from_object(obj: Mapping[str, Any]) -> Claim:
    """A :class:`Claim` from a whole ResourceClaim object (metadata and spec)."""
    meta = obj.get("metadata") or {}
    return claim_from_json(
        obj.get("spec") or {},
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
    )


def node_from_json(obj: Mapping[str, Any]) -> Node:
    """A :class:`Node` from a core/v1 Node object."""
    meta = obj.get("metadata") or {}
    return Node(str(meta.get("name") or ""), dict(meta.get("labels") or {}))
