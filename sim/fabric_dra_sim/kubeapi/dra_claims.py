"""Go-side rules for ResourceClaims, their templates, DeviceClasses and v1alpha3
PodSchedulingContexts.

Ports of k8s.io/kubernetes pkg/apis/resource/validation/validation.go (1.34+):
validateDeviceClaim, validateDeviceRequest, validateExactDeviceRequest,
validateDeviceSubRequest, validateDeviceAllocationMode, validateSelector,
validateDeviceConstraint, validateDeviceClaimConfiguration, validateRequestNameRef,
validateOpaqueConfiguration, validateRawExtension, validateDeviceToleration,
validateResourceClaimStatusUpdate, validateAllocationResult,
validateDeviceRequestAllocationResult, validateDeviceAllocationConfiguration,
validateAllocationConfigSource, validateDeviceStatus, validateNetworkDeviceData,
validateDeviceClassSpec, validateResourceClaimTemplateSpec; the namespace check for admin
access is pkg/registry/resource/utils.go AuthorizedForAdmin / AuthorizedForAdminStatus.

Objects written in v1alpha3 follow the release-1.31 file instead (classic DRA: a claim's
``controller``, ``deallocationRequested``, PodSchedulingContexts), which checks less and
reports list limits as FieldValueTooLong.

Each function takes plain JSON and the write's :class:`RuleContext` and returns causes.
"""

from __future__ import annotations

import ipaddress
import json
import uuid
from typing import Any

from . import names
from .cel_check import cel_expression_causes
from .context import DRA_ADMIN_ACCESS, DRA_CONSUMABLE_CAPACITY, RuleContext
from .dra import (
    MAX_CONDITIONS_PER_DEVICE,
    MAX_PARAMETERS_SIZE,
    MAX_POTENTIAL_NODES,
    MAX_RESERVED_FOR,
    MAX_RESULTS,
    TAINT_EFFECTS,
    binding_causes,
    cause_duplicate,
    cause_forbidden,
    cause_invalid,
    cause_required,
    cause_too_long,
    cause_too_long_items,
    cause_too_many,
    driver_name_causes,
    pool_name_causes,
    qualified_name_causes,
)
from .errors import Cause
from .nodeselector import node_selector_causes

MAX_REQUESTS = 32  # DeviceRequestsMaxSize
MAX_SELECTORS = 32  # DeviceSelectorsMaxSize
MAX_CONSTRAINTS = 32  # DeviceConstraintsMaxSize
MAX_CONFIG = 32  # DeviceConfigMaxSize
MAX_SUBREQUESTS = 8  # FirstAvailableDeviceRequestMaxSize
MAX_INTERFACE_NAME = 256  # NetworkDeviceDataInterfaceNameMaxLength
MAX_HARDWARE_ADDRESS = 128  # NetworkDeviceDataHardwareAddressMaxLength
MAX_IPS = 16  # NetworkDeviceDataMaxIPs
# DRAAdminNamespaceLabelKey (k8s.io/kubernetes pkg/apis/resource/types.go).
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
ALLOCATION_MODES = ("All", "ExactCount")
CONFIG_SOURCES = ("FromClaim", "FromClass")
TOLERATION_OPERATORS = ("Equal", "Exists")
_TEMPLATE_META_FIELDS = ("labels", "annotations")

RequestNames = dict[str, set[str] | None]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _not_supported(field: str, value: Any, allowed: tuple[str, ...]) -> Cause:
    return Cause(
        "FieldValueNotSupported",
        f"Unsupported value: {json.dumps(value)}: supported "
        "values: " + ", ".join(f'"{v}"' for v in allowed),
        field,
    )


def _over_limit(items: list[Any], limit: int, field: str, classic: bool) -> list[Cause]:
    """The size check of validateSlice/validateSet. Since 1.32 it short-circuits (the items
    are not looked at); in 1.31 it came after the items, as TooLong.
    """
    if len(items) <= limit:
        return []
    return [cause_too_long_items(field, limit) if classic else cause_too_many(field, limit)]


def _duplicates(keys: list[Any], field: str, suffix: str = "") -> list[Cause]:
    out: list[Cause] = []
    seen: set[str] = set()
    for i, key in enumerate(keys):
        # Compared as JSON so that a malformed (unhashable) entry is a cause, not a crash.
        text = json.dumps(key, sort_keys=True, default=str)
        if text in seen:
            out.append(cause_duplicate(f"{field}[{i}]{suffix}", key))
        seen.add(text)
    return out


def _classic(ctx: RuleContext) -> bool:
    return ctx.version == "v1alpha3"


# -- request names -------------------------------------------------------------------------
def request_names(spec: dict[str, Any]) -> RequestNames:
    """Request name -> subrequest names (None without firstAvailable) (gatherRequestNames)."""
    out: RequestNames = {}
    for request in _list(_dict(spec.get("devices")).get("requests")):
        request = _dict(request)
        subs = _list(request.get("firstAvailable"))
        out[str(request.get("name") or "")] = (
            {str(_dict(s).get("name") or "") for s in subs} if subs else None
        )
    return out


def _has_request(known: RequestNames, name: str) -> bool:
    segments = name.split("/")
    if len(segments) > 2 or segments[0] not in known:
        return False
    if len(segments) == 1:
        return True
    return segments[1] in (known[segments[0]] or set())


_REF_MESSAGE = (
    "must be the name of a request in the claim or the name of a request and a "
    "subrequest separated by '/'"
)


def _request_ref_causes(name: Any, field: str, known: RequestNames, classic: bool) -> list[Cause]:
    name = str(name)
    if classic:
        out = [cause_invalid(field, name, e) for e in names.dns_label(name)]
        if name not in known:
            out.append(cause_invalid(field, name, "must be the name of a request in the claim"))
        return out
    segments = name.split("/")
    if len(segments) > 2:
        return [cause_invalid(field, name, _REF_MESSAGE)]
    out = [
        cause_invalid(field, segment, e) for segment in segments for e in names.dns_label(segment)
    ]
    if not _has_request(known, name):
        out.append(cause_invalid(field, name, _REF_MESSAGE))
    return out


def _request_refs_causes(refs: Any, field: str, known: RequestNames, classic: bool) -> list[Cause]:
    refs = _list(refs)
    over = _over_limit(refs, MAX_REQUESTS, field, classic)
    if over and not classic:
        return over
    out: list[Cause] = []
    for i, ref in enumerate(refs):
        out.extend(_request_ref_causes(ref, f"{field}[{i}]", known, classic))
    return out + over + _duplicates(refs, field)


# -- shared pieces --------------------------------------------------------------------------
def raw_extension_causes(
    value: Any,
    field: str,
    *,
    classic: bool,
    stored: bool = False,
    max_size: int = MAX_PARAMETERS_SIZE,
) -> list[Cause]:
    """An opaque JSON value that must be an object (validateRawExtension); over 10 KiB is
    refused unless already stored (1.32+; 1.31 had no limit).
    """
    if value is None:
        return [cause_required(field)]
    if not classic and not stored and len(json.dumps(value, separators=(",", ":"))) > max_size:
        return [cause_too_long(field, max_size)]
    if not isinstance(value, dict):
        return [
            cause_invalid(
                field,
                "<value omitted>",
                "parameters must be a valid JSON object"
                if classic
                else "must be a valid JSON object",
            )
        ]
    return []


def _device_config_causes(
    config: Any, field: str, classic: bool, stored: bool = False
) -> list[Cause]:
    """validateDeviceConfiguration: ``opaque`` required, its driver and parameters valid."""
    opaque = _dict(config).get("opaque")
    if not isinstance(opaque, dict):
        return [cause_required(f"{field}.opaque")]
    out = driver_name_causes(opaque.get("driver"), f"{field}.opaque.driver")
    out.extend(
        raw_extension_causes(
            opaque.get("parameters"), f"{field}.opaque.parameters", classic=classic, stored=stored
        )
    )
    return out


def toleration_causes(toleration: Any, field: str) -> list[Cause]:
    """validateDeviceToleration: key a label key when set; Exists takes no value, Equal a
    label value; effect, when set, one of the taint effects.
    """
    toleration = _dict(toleration)
    out: list[Cause] = []
    key = toleration.get("key") or ""
    if key:
        out.extend(cause_invalid(f"{field}.key", key, e) for e in names.qualified_name(str(key)))
    operator = toleration.get("operator") or ""
    value = toleration.get("value") or ""
    if operator == "Exists":
        if value:
            out.append(
                cause_invalid(f"{field}.value", value, "must be empty for operator `Exists`")
            )
    elif operator == "Equal":
        out.extend(cause_invalid(f"{field}.value", value, e) for e in names.label_value(str(value)))
    elif not operator:
        out.append(cause_required(f"{field}.operator"))
    else:
        out.append(_not_supported(f"{field}.operator", operator, TOLERATION_OPERATORS))
    effect = toleration.get("effect") or ""
    if effect and effect not in TAINT_EFFECTS:
        out.append(_not_supported(f"{field}.effect", effect, tuple(sorted(TAINT_EFFECTS))))
    return out


def _selectors_causes(selectors: Any, field: str, classic: bool, stored: bool) -> list[Cause]:
    selectors = _list(selectors)
    over = _over_limit(selectors, MAX_SELECTORS, field, classic)
    if over and not classic:
        return over
    out: list[Cause] = []
    for s, selector in enumerate(selectors):
        cel = _dict(selector).get("cel")
        if not isinstance(cel, dict):
            out.append(cause_required(f"{field}[{s}].cel"))
        elif not stored:
            out.extend(
                cel_expression_causes(
                    cel.get("expression"), f"{field}[{s}].cel.expression", length_limit=not classic
                )
            )
    return out + over


def _allocation_mode_causes(exact: dict[str, Any], field: str) -> list[Cause]:
    # Defaulting runs first (SetDefaults_ExactDeviceRequest): no mode is ExactCount, and
    # ExactCount without a count asks for one device.
    mode = exact.get("allocationMode") or "ExactCount"
    count = exact.get("count")
    if mode == "All":
        if count not in (None, 0):
            return [
                cause_invalid(
                    f"{field}.count", count, "must not be specified when allocationMode is 'All'"
                )
            ]
    elif mode == "ExactCount":
        if isinstance(count, int) and count < 0:
            return [cause_invalid(f"{field}.count", count, "must be greater than zero")]
    else:
        return [_not_supported(f"{field}.allocationMode", mode, ALLOCATION_MODES)]
    return []


def _class_name_causes(name: Any, field: str) -> list[Cause]:
    if not name:
        return [cause_required(field)]
    return [cause_invalid(field, name, e) for e in names.dns_subdomain(str(name))]


def _exact_causes(exact: dict[str, Any], field: str, classic: bool, stored: bool) -> list[Cause]:
    """validateExactDeviceRequest / validateDeviceSubRequest (without the name)."""
    out = _class_name_causes(exact.get("deviceClassName"), f"{field}.deviceClassName")
    out.extend(_selectors_causes(exact.get("selectors"), f"{field}.selectors", classic, stored))
    out.extend(_allocation_mode_causes(exact, field))
    if not classic:
        for t, toleration in enumerate(_list(exact.get("tolerations"))):
            out.extend(toleration_causes(toleration, f"{field}.tolerations[{t}]"))
    return out


def _has_main_request_fields(request: dict[str, Any]) -> bool:
    # k8s.io/kubernetes pkg/apis/resource/v1beta1/conversion.go hasAnyMainRequestFieldsSet
    # (the same in v1alpha3): a set class name, allocation mode or count, or present
    # selectors, adminAccess, tolerations or capacity.
    return bool(
        request.get("deviceClassName") or request.get("allocationMode") or request.get("count")
    ) or any(
        request.get(key) is not None
        for key in ("selectors", "adminAccess", "tolerations", "capacity")
    )


def _request_causes(
    request: Any, field: str, wrapped: bool, classic: bool, stored: bool
) -> list[Cause]:
    request = _dict(request)
    name = str(request.get("name") or "")
    out = [cause_invalid(f"{field}.name", name, e) for e in names.dns_label(name)]
    if classic:
        return out + _exact_causes(request, field, classic, stored)
    subs = _list(request.get("firstAvailable"))
    if wrapped:
        # The real server validates the internal form: conversion makes an `exactly` of the
        # top-level fields whenever any of them is set, next to firstAvailable.
        exact = request if not subs or _has_main_request_fields(request) else None
    else:
        exact = request.get("exactly")
    if exact is not None and subs:
        return [
            *out,
            cause_invalid(
                field,
                None,
                "exactly one of `exactly` or `firstAvailable` "
                "is required, but multiple fields are set",
            ),
        ]
    if exact is None and not subs:
        return [
            *out,
            cause_required(field, "exactly one of `exactly` or `firstAvailable` is required"),
        ]
    if exact is not None:
        return out + _exact_causes(
            _dict(exact), field if wrapped else f"{field}.exactly", classic, stored
        )
    path = f"{field}.firstAvailable"
    over = _over_limit(subs, MAX_SUBREQUESTS, path, classic)
    if over:
        return out + over
    for j, sub in enumerate(subs):
        sub = _dict(sub)
        sub_name = str(sub.get("name") or "")
        out.extend(
            cause_invalid(f"{path}[{j}].name", sub_name, e) for e in names.dns_label(sub_name)
        )
        out.extend(_exact_causes(sub, f"{path}[{j}]", classic, stored))
    return out + _duplicates([_dict(s).get("name") for s in subs], path)


def _fully_qualified_causes(name: Any, field: str, classic: bool) -> list[Cause]:
    name = str(name)
    out = qualified_name_causes(name, field)
    if "/" not in name:
        out.append(
            cause_required(f"{field}.domain", "must include a prefix")
            if classic
            else cause_invalid(
                field,
                name,
                "a fully qualified name must be a domain and a name separated by a slash",
            )
        )
    return out


def _constraint_causes(
    constraint: Any, field: str, known: RequestNames, classic: bool, ctx: RuleContext
) -> list[Cause]:
    constraint = _dict(constraint)
    out = _request_refs_causes(constraint.get("requests"), f"{field}.requests", known, classic)
    if constraint.get("matchAttribute") is not None:
        out.extend(
            _fully_qualified_causes(
                constraint["matchAttribute"], f"{field}.matchAttribute", classic
            )
        )
    elif not classic and constraint.get("distinctAttribute") is not None:
        out.extend(
            _fully_qualified_causes(
                constraint["distinctAttribute"], f"{field}.distinctAttribute", classic
            )
        )
    elif not classic and ctx.cluster.enabled(DRA_CONSUMABLE_CAPACITY):
        out.append(
            cause_required(
                field,
                'exactly one of "matchAttribute" or '
                '"distinctAttribute" is required, but multiple fields are set',
            )
        )
    else:
        out.append(cause_required(f"{field}.matchAttribute"))
    return out


def device_claim_causes(
    spec: dict[str, Any], field: str, ctx: RuleContext, *, stored: bool = False
) -> list[Cause]:
    """A claim spec's ``devices`` (validateDeviceClaim): at most 32 requests with unique DNS
    label names, each ``exactly`` or ``firstAvailable`` (at most 8 subrequests); class names,
    at most 32 CEL selectors that compile, allocation mode and count, tolerations; at most 32
    constraints naming real requests with a fully qualified ``matchAttribute``; at most 32
    config entries naming real requests with valid opaque config. ``stored``: the CEL
    expressions were accepted before and are not compiled again. ``field``: the path of the
    claim spec ("spec" or, in a template, "spec.spec").
    """
    classic = _classic(ctx)
    wrapped = ctx.version in ("v1beta1", "v1alpha3")
    devices = _dict(spec.get("devices"))
    path = f"{field}.devices"
    known = request_names(spec)
    out: list[Cause] = []
    requests = _list(devices.get("requests"))
    over = _over_limit(requests, MAX_REQUESTS, f"{path}.requests", classic)
    if not over or classic:
        for i, request in enumerate(requests):
            out.extend(_request_causes(request, f"{path}.requests[{i}]", wrapped, classic, stored))
        out.extend(
            _duplicates(
                [_dict(r).get("name") for r in requests],
                f"{path}.requests",
                ".name" if classic else "",
            )
        )
    out.extend(over)
    for name, limit in (("constraints", MAX_CONSTRAINTS), ("config", MAX_CONFIG)):
        entries = _list(devices.get(name))
        over = _over_limit(entries, limit, f"{path}.{name}", classic)
        if over and not classic:
            out.extend(over)
            continue
        for i, entry in enumerate(entries):
            entry_path = f"{path}.{name}[{i}]"
            if name == "constraints":
                out.extend(_constraint_causes(entry, entry_path, known, classic, ctx))
            else:
                out.extend(
                    _request_refs_causes(
                        _dict(entry).get("requests"), f"{entry_path}.requests", known, classic
                    )
                )
                out.extend(_device_config_causes(entry, entry_path, classic, stored))
        out.extend(over)
    if classic and spec.get("controller"):
        out.extend(driver_name_causes(spec["controller"], f"{field}.controller"))
    return out


def _admin_access_causes(spec: dict[str, Any], ctx: RuleContext) -> list[Cause]:
    """AuthorizedForAdmin: a request with ``adminAccess: true`` needs the namespace label
    ``resource.kubernetes.io/admin-access: "true"``. The field only exists with the
    DRAAdminAccess gate (it is dropped otherwise) and not in v1alpha3.
    """
    if _classic(ctx) or not ctx.cluster.enabled(DRA_ADMIN_ACCESS):
        return []
    wrapped = ctx.version == "v1beta1"
    for i, request in enumerate(_list(_dict(spec.get("devices")).get("requests"))):
        exact = _dict(request) if wrapped else _dict(_dict(request).get("exactly"))
        if exact.get("adminAccess") is True:
            if ctx.namespace_labels.get(ADMIN_ACCESS_LABEL) == "true":
                return []
            path = f"spec.devices.requests[{i}]{'' if wrapped else '.exactly'}.adminAccess"
            return [_admin_forbidden(path)]
    return []


def _admin_forbidden(path: str) -> Cause:
    return cause_forbidden(
        path,
        f"admin access to devices requires the `{ADMIN_ACCESS_LABEL}: "
        "true` label on the containing namespace",
    )


# -- claim status ---------------------------------------------------------------------------
def _uid_causes(value: Any, field: str) -> list[Cause]:
    text = str(value)
    try:
        uuid.UUID(text)
    except ValueError as err:
        return [cause_invalid(field, text, f"error validating uid: {err}")]
    if len(text) != 36 or text != text.lower():
        return [
            cause_invalid(
                field,
                text,
                "uid must be in RFC 4122 normalized form, "
                "`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal "
                "characters",
            )
        ]
    return []


def _result_causes(result: Any, field: str, known: RequestNames, classic: bool) -> list[Cause]:
    """validateDeviceRequestAllocationResult."""
    result = _dict(result)
    out = _request_ref_causes(result.get("request") or "", f"{field}.request", known, classic)
    out.extend(driver_name_causes(result.get("driver"), f"{field}.driver"))
    out.extend(pool_name_causes(result.get("pool"), f"{field}.pool"))
    device = str(result.get("device") or "")
    out.extend(cause_invalid(f"{field}.device", device, e) for e in names.dns_label(device))
    if classic:
        return out
    out.extend(
        binding_causes(
            result.get("bindingConditions"), result.get("bindingFailureConditions"), field
        )
    )
    for t, toleration in enumerate(_list(result.get("tolerations"))):
        out.extend(toleration_causes(toleration, f"{field}.tolerations[{t}]"))
    if result.get("shareID") is not None:
        out.extend(_uid_causes(result["shareID"], f"{field}.shareID"))
    return out


def allocation_causes(
    allocation: dict[str, Any], field: str, known: RequestNames, classic: bool
) -> list[Cause]:
    """A new allocation (validateAllocationResult): at most 32 results, each naming a request
    of the claim (``request/subrequest`` for firstAvailable) with valid driver, pool and device
    names; at most 64 config entries with source FromClass or FromClaim, real requests and
    valid opaque config; a valid node selector; in v1alpha3 a valid ``controller``.
    """
    devices = _dict(allocation.get("devices"))
    path = f"{field}.devices"
    out: list[Cause] = []
    results = _list(devices.get("results"))
    over = _over_limit(results, MAX_RESULTS, f"{path}.results", classic)
    if not over or classic:
        for i, result in enumerate(results):
            out.extend(_result_causes(result, f"{path}.results[{i}]", known, classic))
    out.extend(over)
    configs = _list(devices.get("config"))
    over = _over_limit(configs, 2 * MAX_CONFIG, f"{path}.config", classic)
    if not over or classic:
        for i, config in enumerate(configs):
            config_path = f"{path}.config[{i}]"
            source = _dict(config).get("source") or ""
            if not source:
                out.append(cause_required(f"{config_path}.source"))
            elif source not in CONFIG_SOURCES:
                out.append(_not_supported(f"{config_path}.source", source, CONFIG_SOURCES))
            out.extend(
                _request_refs_causes(
                    _dict(config).get("requests"), f"{config_path}.requests", known, classic
                )
            )
            out.extend(_device_config_causes(config, config_path, classic))
    out.extend(over)
    if allocation.get("nodeSelector") is not None:
        out.extend(
            node_selector_causes(
                allocation["nodeSelector"], f"{field}.nodeSelector", label_values=not classic
            )
        )
    if classic and allocation.get("controller"):
        out.extend(driver_name_causes(allocation["controller"], f"{field}.controller"))
    return out


def _condition_causes(condition: Any, field: str) -> list[Cause]:
    """metav1validation.ValidateCondition."""
    condition = _dict(condition)
    out: list[Cause] = []
    if not condition.get("type"):
        out.append(cause_required(f"{field}.type"))
    else:
        out.extend(
            cause_invalid(f"{field}.type", condition["type"], e)
            for e in names.qualified_name(str(condition["type"]))
        )
    if condition.get("status") not in ("True", "False", "Unknown"):
        out.append(
            _not_supported(f"{field}.status", condition.get("status"), ("False", "True", "Unknown"))
        )
    reason = str(condition.get("reason") or "")
    if not reason:
        out.append(cause_required(f"{field}.reason"))
    elif len(reason) > 1024:
        out.append(cause_too_long(f"{field}.reason", 1024))
    elif not names.CAMEL_REASON_RE.match(reason):
        out.append(
            cause_invalid(
                f"{field}.reason",
                reason,
                "a condition reason must start with "
                "alphabetic character, optionally followed by a string of "
                "alphanumeric characters or '_,:', and must end with an "
                "alphanumeric character or '_'",
            )
        )
    if not condition.get("lastTransitionTime"):
        out.append(cause_required(f"{field}.lastTransitionTime", "must be set"))
    if len(str(condition.get("message") or "")) > 32768:
        out.append(cause_too_long(f"{field}.message", 32768))
    generation = condition.get("observedGeneration")
    if isinstance(generation, int) and generation < 0:
        out.append(
            cause_invalid(
                f"{field}.observedGeneration",
                condition["observedGeneration"],
                "must be greater than or equal to zero",
            )
        )
    return out


def _network_data_causes(data: Any, field: str) -> list[Cause]:
    """validateNetworkDeviceData."""
    if not isinstance(data, dict):
        return []
    out: list[Cause] = []
    if len(str(data.get("interfaceName") or "")) > MAX_INTERFACE_NAME:
        out.append(cause_too_long(f"{field}.interfaceName", MAX_INTERFACE_NAME))
    if len(str(data.get("hardwareAddress") or "")) > MAX_HARDWARE_ADDRESS:
        out.append(cause_too_long(f"{field}.hardwareAddress", MAX_HARDWARE_ADDRESS))
    ips = _list(data.get("ips"))
    if len(ips) > MAX_IPS:
        return [*out, cause_too_many(f"{field}.ips", MAX_IPS)]
    for i, address in enumerate(ips):
        try:
            if "/" not in str(address):
                raise ValueError(address)
            ipaddress.ip_interface(str(address))
        except ValueError:
            out.append(
                cause_invalid(
                    f"{field}.ips[{i}]",
                    address,
                    "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)",
                )
            )
    return out + _duplicates(ips, f"{field}.ips")


def _shared_id(entry: dict[str, Any]) -> str:
    parts = [str(entry.get(k) or "") for k in ("driver", "pool", "device")]
    if entry.get("shareID"):
        parts.append(str(entry["shareID"]))
    return "/".join(parts)


def _device_status_causes(entry: Any, field: str, allocated: set[str]) -> list[Cause]:
    """validateDeviceStatus."""
    entry = _dict(entry)
    out = driver_name_causes(entry.get("driver"), f"{field}.driver")
    out.extend(pool_name_causes(entry.get("pool"), f"{field}.pool"))
    device = str(entry.get("device") or "")
    out.extend(cause_invalid(f"{field}.device", device, e) for e in names.dns_label(device))
    if entry.get("shareID") is not None:
        out.extend(_uid_causes(entry["shareID"], f"{field}.shareID"))
    if _shared_id(entry) not in allocated:
        out.append(
            cause_invalid(field, _shared_id(entry), "must be an allocated device in the claim")
        )
    conditions = _list(entry.get("conditions"))
    if len(conditions) > MAX_CONDITIONS_PER_DEVICE:
        out.append(cause_too_many(f"{field}.conditions", MAX_CONDITIONS_PER_DEVICE))
    for c, condition in enumerate(conditions):
        out.extend(_condition_causes(condition, f"{field}.conditions[{c}]"))
    out.extend(
        _duplicates([_dict(c).get("type") for c in conditions], f"{field}.conditions", ".type")
    )
    if entry.get("data") is not None:
        out.extend(raw_extension_causes(entry["data"], f"{field}.data", classic=False))
    out.extend(_network_data_causes(entry.get("networkData"), f"{field}.networkData"))
    return out


def _reserved_for_causes(reserved: list[Any], classic: bool) -> list[Cause]:
    over = _over_limit(reserved, MAX_RESERVED_FOR, "status.reservedFor", classic)
    if over and not classic:
        return over
    out: list[Cause] = []
    for i, consumer in enumerate(reserved):
        for key in ("resource", "name", "uid"):
            if not _dict(consumer).get(key):
                out.append(cause_required(f"status.reservedFor[{i}].{key}"))
    return (
        out
        + over
        + _duplicates(
            [_dict(c).get("uid") for c in reserved], "status.reservedFor", ".uid" if classic else ""
        )
    )


def resource_claim_status_causes(obj: dict[str, Any], ctx: RuleContext) -> list[Cause]:
    """A status write of a claim (validateResourceClaimStatusUpdate): ``reservedFor`` at most
    256 unique consumers, only while allocated, and no new entry once ``deletionTimestamp``
    (or, in v1alpha3, ``deallocationRequested``) is set; an allocation is immutable once set
    and may only be cleared as a whole, and a new one must be valid (:func:`allocation_causes`);
    ``status.devices`` entries name allocated devices. In v1alpha3 ``deallocationRequested``
    needs an allocation and an empty ``reservedFor`` and is cleared with the allocation.
    """
    classic = _classic(ctx)
    status = _dict(obj.get("status"))
    old_status = _dict((ctx.old or {}).get("status"))
    known = request_names(_dict(obj.get("spec")))
    allocation = status.get("allocation")
    old_allocation = old_status.get("allocation")
    reserved = _list(status.get("reservedFor"))
    out: list[Cause] = []
    if classic and isinstance(allocation, dict):
        out.extend(allocation_causes(allocation, "status.allocation", known, classic))
    out.extend(_reserved_for_causes(reserved, classic))
    if not classic:
        allocated = {
            _shared_id(_dict(r))
            for r in _list(_dict(_dict(allocation).get("devices")).get("results"))
        }
        devices = _list(status.get("devices"))
        for i, entry in enumerate(devices):
            out.extend(_device_status_causes(entry, f"status.devices[{i}]", allocated))
        out.extend(_duplicates([_shared_id(_dict(d)) for d in devices], "status.devices"))
    deleted = bool(_dict(obj.get("metadata")).get("deletionTimestamp"))
    deallocating = classic and status.get("deallocationRequested") is True
    if reserved:
        if allocation is None:
            out.append(
                cause_forbidden(
                    "status.reservedFor", "may not be specified when `allocated` is not set"
                )
            )
        elif deleted or deallocating:
            old_reserved = _list(old_status.get("reservedFor"))
            if any(entry not in old_reserved for entry in reserved):
                out.append(
                    cause_forbidden(
                        "status.reservedFor",
                        "new entries may not be added "
                        "while `deallocationRequested` or `deletionTimestamp` "
                        "are set",
                    )
                )
    if old_allocation is not None and allocation is not None:
        if allocation != old_allocation:
            out.append(cause_invalid("status.allocation", "<allocation>", "field is immutable"))
    elif isinstance(allocation, dict) and not classic:
        out.extend(allocation_causes(allocation, "status.allocation", known, classic))
        out.extend(_admin_status_causes(allocation, old_allocation, ctx))
    if classic:
        out.extend(_deallocation_causes(status, old_status))
    return out


def _admin_status_causes(
    allocation: dict[str, Any], old_allocation: Any, ctx: RuleContext
) -> list[Cause]:
    """AuthorizedForAdminStatus: a new allocation granting admin access needs the namespace
    label (an allocation that already had it is immutable and not checked again).
    """
    if not ctx.cluster.enabled(DRA_ADMIN_ACCESS) or old_allocation is not None:
        return []
    results = _list(_dict(allocation.get("devices")).get("results"))
    for i, result in enumerate(results):
        if _dict(result).get("adminAccess") is True:
            if ctx.namespace_labels.get(ADMIN_ACCESS_LABEL) == "true":
                return []
            return [_admin_forbidden(f"status.allocation.devices.results[{i}].adminAccess")]
    return []


def _deallocation_causes(status: dict[str, Any], old_status: dict[str, Any]) -> list[Cause]:
    """The 1.31 ``deallocationRequested`` invariants."""
    out: list[Cause] = []
    requested = status.get("deallocationRequested") is True
    was_requested = old_status.get("deallocationRequested") is True
    if not was_requested and requested and _list(status.get("reservedFor")):
        out.append(
            cause_forbidden(
                "status.deallocationRequested",
                "deallocation cannot be requested while `reservedFor` is set",
            )
        )
    if status.get("allocation") is None and requested:
        out.append(
            cause_forbidden(
                "status", "`allocation` must be set when `deallocationRequested` is set"
            )
        )
    if was_requested and not requested and status.get("allocation") is not None:
        out.append(
            cause_forbidden(
                "status.deallocationRequested", "may not be cleared when `allocation` is set"
            )
        )
    return out


def drop_deallocated_status_devices(new: dict[str, Any], old: dict[str, Any]) -> None:
    """Remove from ``new["status"]["devices"]`` the entries of devices that ``old`` had
    allocated and ``new`` no longer has, before validation (the status strategy's
    PrepareForUpdate, pkg/registry/resource/resourceclaim/strategy.go
    dropDeallocatedStatusDevices). ``devices`` goes away when nothing is left.
    """
    status = new.get("status")
    if not isinstance(status, dict) or "devices" not in status:
        return

    def ids(claim: dict[str, Any]) -> set[tuple[str, str, str]]:
        results = _list(
            _dict(_dict(_dict(claim.get("status")).get("allocation")).get("devices")).get("results")
        )
        return {
            (str(_dict(r).get("driver")), str(_dict(r).get("pool")), str(_dict(r).get("device")))
            for r in results
        }

    gone = ids(old) - ids(new)
    kept = [
        d
        for d in _list(status.get("devices"))
        if (str(_dict(d).get("driver")), str(_dict(d).get("pool")), str(_dict(d).get("device")))
        not in gone
    ]
    if kept:
        status["devices"] = kept
    else:
        status.pop("devices", None)


# -- kinds ----------------------------------------------------------------------------------
def resource_claim_causes(obj: dict[str, Any], ctx: RuleContext) -> list[Cause]:
    """ResourceClaim: the spec rules and the admin-access check on create; on update the spec
    is immutable (and still valid); status writes get :func:`resource_claim_status_causes`.
    Source: ValidateResourceClaim, ValidateResourceClaimUpdate,
    ValidateResourceClaimStatusUpdate and pkg/registry/resource/resourceclaim/strategy.go.
    """
    if ctx.status_write:
        return resource_claim_status_causes(obj, ctx)
    spec = _dict(obj.get("spec"))
    if ctx.old is None:
        return _admin_access_causes(spec, ctx) + device_claim_causes(spec, "spec", ctx)
    out: list[Cause] = []
    if spec != _dict(ctx.old.get("spec")):
        out.append(cause_invalid("spec", "<spec>", "field is immutable"))
    # The spec is validated again on update; an unchanged one passed once, so its CEL
    # expressions count as stored.
    out.extend(device_claim_causes(spec, "spec", ctx, stored=not out))
    return out


def _template_meta_causes(meta: Any, field: str) -> list[Cause]:
    """corevalidation.ValidateTemplateObjectMeta: labels and annotations valid, nothing else
    set.
    """
    meta = _dict(meta)
    out: list[Cause] = []
    for key, value in _dict(meta.get("labels")).items():
        out.extend(cause_invalid(f"{field}.labels", key, e) for e in names.qualified_name(key))
        out.extend(
            cause_invalid(f"{field}.labels", value, e) for e in names.label_value(str(value))
        )
    for key in _dict(meta.get("annotations")):
        out.extend(
            cause_invalid(f"{field}.annotations", key, e) for e in names.qualified_name(key.lower())
        )
    for key, value in meta.items():
        if key not in _TEMPLATE_META_FIELDS and value not in (None, "", [], {}, 0):
            out.append(cause_forbidden(f"{field}.{key}", "cannot be set"))
    return out


def resource_claim_template_causes(obj: dict[str, Any], ctx: RuleContext) -> list[Cause]:
    """ResourceClaimTemplate: on create the template metadata and the embedded claim spec
    (claim rules at ``spec.spec``, admin access); the spec is immutable
    (ValidateResourceClaimTemplate, ValidateResourceClaimTemplateUpdate).
    """
    spec = _dict(obj.get("spec"))
    if ctx.old is not None:
        if spec != _dict(ctx.old.get("spec")):
            return [cause_invalid("spec", "<spec>", "field is immutable")]
        return []
    inner = _dict(spec.get("spec"))
    out = _template_meta_causes(spec.get("metadata"), "spec.metadata")
    out.extend(_admin_access_causes(inner, ctx))
    out.extend(device_claim_causes(inner, "spec.spec", ctx))
    return out


def device_class_causes(obj: dict[str, Any], ctx: RuleContext) -> list[Cause]:
    """DeviceClass spec (validateDeviceClassSpec): at most 32 selectors whose CEL compiles
    (not compiled again when the selectors are unchanged), at most 32 config entries with
    valid opaque config; in v1alpha3 a valid ``suitableNodes`` node selector (reported at
    ``suitableNodes``, as 1.31 did).
    """
    classic = _classic(ctx)
    spec = _dict(obj.get("spec"))
    old_spec = _dict((ctx.old or {}).get("spec")) if ctx.old is not None else None
    stored = old_spec is not None and spec.get("selectors") == old_spec.get("selectors")
    out = _selectors_causes(spec.get("selectors"), "spec.selectors", classic, stored)
    configs = _list(spec.get("config"))
    over = _over_limit(configs, MAX_CONFIG, "spec.config", classic)
    if not over or classic:
        config_stored = old_spec is not None and spec.get("config") == old_spec.get("config")
        for i, config in enumerate(configs):
            out.extend(_device_config_causes(config, f"spec.config[{i}]", classic, config_stored))
    out.extend(over)
    if classic and spec.get("suitableNodes") is not None:
        out.extend(node_selector_causes(spec["suitableNodes"], "suitableNodes", label_values=False))
    return out


def _node_list_causes(nodes: Any, field: str) -> list[Cause]:
    # 1.31 validateSet(..., PodSchedulingNodeListMaxSize, validateNodeName, stringKey, ...).
    nodes = _list(nodes)
    out: list[Cause] = []
    for i, node in enumerate(nodes):
        out.extend(cause_invalid(f"{field}[{i}]", node, e) for e in names.dns_subdomain(str(node)))
    out.extend(_over_limit(nodes, MAX_POTENTIAL_NODES, field, classic=True))
    return out + _duplicates(nodes, field)


def pod_scheduling_context_causes(obj: dict[str, Any], ctx: RuleContext) -> list[Cause]:
    """v1alpha3 PodSchedulingContext, exactly as 1.31 checks it: on spec writes
    ``potentialNodes`` holds at most 128 unique node names (``selectedNode`` is not checked);
    on status writes each claim entry's ``unsuitableNodes`` does too and entry names are
    unique, reported under ``status.claims`` (the path the 1.31 code uses).
    Source: k8s.io/kubernetes release-1.31 ValidatePodSchedulingContexts,
    ValidatePodSchedulingContextStatusUpdate.
    """
    if not ctx.status_write:
        return _node_list_causes(
            _dict(obj.get("spec")).get("potentialNodes"), "spec.potentialNodes"
        )
    out: list[Cause] = []
    entries = _list(_dict(obj.get("status")).get("resourceClaims"))
    for i, entry in enumerate(entries):
        out.extend(
            _node_list_causes(
                _dict(entry).get("unsuitableNodes"), f"status.claims[{i}].unsuitableNodes"
            )
        )
    out.extend(_duplicates([_dict(e).get("name") for e in entries], "status.claims"))
    return out
