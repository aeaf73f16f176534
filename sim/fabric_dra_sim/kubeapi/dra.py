"""Go-side ResourceSlice rules of resource.k8s.io that the JSON schema cannot express, and
the name and cause helpers the other resource.k8s.io rules share (:mod:`.dra_claims`).

Ports of k8s.io/kubernetes pkg/apis/resource/validation (validation.go):
validateResourceSliceSpec, validateDevice, validatePoolName, validateQualifiedName,
validateDeviceAttribute, validateDeviceTaint, validateDriverName.
Each function takes plain JSON and returns causes; field paths are those the Go code reports.
v1beta1 and v1alpha3 devices keep their fields under ``basic``.
"""

from __future__ import annotations

import json
from typing import Any

from . import names, nodeselector
from .context import RuleContext
from .errors import Cause

MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_ATTRIBUTES_AND_CAPACITY = 32
MAX_TAINTS = 16
MAX_BINDING_CONDITIONS = 4
MAX_ID_LENGTH = 32
MAX_DOMAIN_LENGTH = 63
MAX_DRIVER_LENGTH = 63
MAX_POOL_NAME_LENGTH = 253
MAX_STRING_LENGTH = 64
MAX_RESERVED_FOR = 256
MAX_CONDITIONS_PER_DEVICE = 8
MAX_RESULTS = 32
MAX_CEL_LENGTH = 10 * 1024
MAX_PARAMETERS_SIZE = 10 * 1024
MAX_POTENTIAL_NODES = 128
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
_ATTRIBUTE_TYPES = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
_LIST_TYPES = ("ints", "bools", "strings", "versions")


def cause_invalid(field: str, value: Any, message: str) -> Cause:
    """A FieldValueInvalid cause (field.Invalid)."""
    return Cause("FieldValueInvalid", f"Invalid value: {json.dumps(value)}: {message}", field)


def cause_required(field: str, message: str = "") -> Cause:
    """A FieldValueRequired cause (field.Required)."""
    return Cause(
        "FieldValueRequired", "Required value" + (f": {message}" if message else ""), field
    )


def cause_too_many(field: str, limit: int) -> Cause:
    """A FieldValueTooMany cause (field.TooMany)."""
    return Cause("FieldValueTooMany", f"Too many: must have at most {limit} items", field)


def cause_too_long(field: str, limit: int) -> Cause:
    """A FieldValueTooLong cause (field.TooLong)."""
    return Cause("FieldValueTooLong", f"Too long: may not be more than {limit} bytes", field)


def cause_too_long_items(field: str, limit: int) -> Cause:
    """The 1.31 form of a list over its limit (field.TooLongMaxLength on a list)."""
    return Cause("FieldValueTooLong", f"Too long: may not be longer than {limit}", field)


def cause_forbidden(field: str, message: str) -> Cause:
    """A FieldValueForbidden cause (field.Forbidden)."""
    return Cause("FieldValueForbidden", f"Forbidden: {message}", field)


def cause_duplicate(field: str, value: Any) -> Cause:
    """A FieldValueDuplicate cause (field.Duplicate)."""
    return Cause("FieldValueDuplicate", f"Duplicate value: {json.dumps(value)}", field)


def driver_name_causes(value: Any, field: str) -> list[Cause]:
    """A driver name: required, at most 63 characters, a DNS subdomain once lowercased, so
    uppercase letters pass (k8s.io/kubernetes pkg/apis/core/validation ValidateCSIDriverName,
    which validateDriverName reuses). Like the Go code, an empty name is both required and
    invalid.
    """
    if not isinstance(value, str):
        value = "" if value is None else str(value)
    out: list[Cause] = []
    if not value:
        out.append(cause_required(field))
    if len(value) > MAX_DRIVER_LENGTH:
        out.append(cause_too_long(field, MAX_DRIVER_LENGTH))
    out.extend(cause_invalid(field, value, e) for e in names.dns_subdomain(value.lower()))
    return out


def driver_name_warnings(value: Any, field: str) -> list[str]:
    """The Warning a real server sends for a driver name with uppercase letters
    (k8s.io/kubernetes pkg/registry/resource/resourceslice/strategy.go WarningsOnCreate,
    WarningsOnUpdate).
    """
    if isinstance(value, str) and value != value.lower():
        return [
            f"{field}: driver names should be lowercase; {json.dumps(value)} contains "
            "uppercase characters"
        ]
    return []


def pool_name_causes(value: Any, field: str) -> list[Cause]:
    """A pool name: <= 253 characters, DNS subdomains joined by '/' (validatePoolName)."""
    if not value:
        return [cause_required(field)]
    if not isinstance(value, str):
        return [cause_invalid(field, value, "must be a string")]
    if len(value) > MAX_POOL_NAME_LENGTH:
        return [cause_too_long(field, MAX_POOL_NAME_LENGTH)]
    out: list[Cause] = []
    for part in value.split("/"):
        out.extend(cause_invalid(field, value, e) for e in names.dns_subdomain(part))
    return out


def qualified_name_causes(value: str, field: str) -> list[Cause]:
    """An attribute or capacity name ``[domain/]id``: id a C identifier <= 32, domain a
    driver name (<= 63, a DNS subdomain once lowercased) (validateQualifiedName,
    validateCIdentifier).
    """
    domain, slash, ident = value.rpartition("/")
    out: list[Cause] = []
    if slash:
        if not domain:
            out.append(cause_invalid(field, value, "the domain must not be empty"))
        elif len(domain) > MAX_DOMAIN_LENGTH:
            out.append(cause_too_long(field, MAX_DOMAIN_LENGTH))
        else:
            out.extend(cause_invalid(field, value, e) for e in names.dns_subdomain(domain.lower()))
    if not ident:
        out.append(cause_required(field, "the id must not be empty"))
    elif len(ident) > MAX_ID_LENGTH:
        out.append(cause_too_long(field, MAX_ID_LENGTH))
    elif not names.C_IDENTIFIER_RE.match(ident):
        out.append(
            cause_invalid(
                field,
                value,
                "a valid C identifier must start with alphabetic "
                "character or '_', followed by a string of alphanumeric characters "
                "or '_'",
            )
        )
    return out


def _attribute_causes(value: Any, field: str) -> list[Cause]:
    if not isinstance(value, dict):
        return [cause_invalid(field, value, "must be an object")]
    set_types = [t for t in _ATTRIBUTE_TYPES if value.get(t) is not None]
    if len(set_types) != 1:
        return [cause_invalid(field, value, "exactly one value must be specified")]
    kind = set_types[0]
    items = value[kind] if kind in _LIST_TYPES else [value[kind]]
    if kind in _LIST_TYPES and not items:
        return [cause_required(f"{field}.{kind}")]
    out: list[Cause] = []
    for item in items:
        if kind.startswith("string") and len(item) > MAX_STRING_LENGTH:
            out.append(cause_too_long(f"{field}.{kind}", MAX_STRING_LENGTH))
        if kind.startswith("version"):
            if len(item) > MAX_STRING_LENGTH:
                out.append(cause_too_long(f"{field}.{kind}", MAX_STRING_LENGTH))
            elif not names.SEMVER_RE.match(item):
                out.append(
                    cause_invalid(
                        f"{field}.{kind}",
                        item,
                        "must be a string compatible with semver.org spec 2.0.0",
                    )
                )
    return out


def _taint_causes(taint: Any, field: str) -> list[Cause]:
    out: list[Cause] = []
    key = taint.get("key") or ""
    if not key:
        out.append(cause_required(f"{field}.key"))
    else:
        out.extend(cause_invalid(f"{field}.key", key, e) for e in names.qualified_name(key))
    if taint.get("value"):
        out.extend(
            cause_invalid(f"{field}.value", taint["value"], e)
            for e in names.label_value(taint["value"])
        )
    effect = taint.get("effect")
    if not effect:
        out.append(cause_required(f"{field}.effect"))
    elif effect not in TAINT_EFFECTS:
        out.append(
            Cause(
                "FieldValueNotSupported",
                f"Unsupported value: {json.dumps(effect)}: supported values: "
                + ", ".join(f'"{e}"' for e in TAINT_EFFECTS),
                f"{field}.effect",
            )
        )
    return out


def binding_causes(conditions: Any, failures: Any, field: str) -> list[Cause]:
    """``bindingConditions`` and ``bindingFailureConditions`` of a device or an allocation
    result: at most 4 each (that check short-circuits the list), qualified names, no
    duplicates, no overlap, each list requiring the other (validateDeviceBindingParameters).
    No rule ties them to ``bindsToNode``: neither 1.34 nor later has one.
    """
    conditions = conditions if isinstance(conditions, list) else []
    failures = failures if isinstance(failures, list) else []
    out: list[Cause] = []
    for name, values in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        if len(values) > MAX_BINDING_CONDITIONS:
            out.append(cause_too_many(f"{field}.{name}", MAX_BINDING_CONDITIONS))
            continue
        for i, value in enumerate(values):
            out.extend(
                cause_invalid(f"{field}.{name}[{i}]", value, e)
                for e in names.qualified_name(str(value))
            )
    seen: set[str] = set()
    for i, value in enumerate(conditions):
        if value in seen:
            out.append(cause_duplicate(f"{field}.bindingConditions[{i}]", value))
        seen.add(value)
    seen_failures: set[str] = set()
    for i, value in enumerate(failures):
        if value in seen_failures:
            out.append(cause_duplicate(f"{field}.bindingFailureConditions[{i}]", value))
        seen_failures.add(value)
        if value in conditions:
            out.append(
                cause_invalid(
                    f"{field}.bindingFailureConditions[{i}]",
                    value,
                    "bindingFailureConditions must not overlap with bindingConditions",
                )
            )
    if not conditions and failures:
        out.append(
            cause_invalid(
                f"{field}.bindingConditions",
                conditions,
                "bindingConditions are required to use bindingFailureConditions",
            )
        )
    if not failures and conditions:
        out.append(
            cause_invalid(
                f"{field}.bindingFailureConditions",
                failures,
                "bindingFailureConditions are required to use bindingConditions",
            )
        )
    return out


def _device_view(device: dict[str, Any], wrapped: bool) -> tuple[dict[str, Any], str]:
    if wrapped:
        return device.get("basic") or {}, ".basic"
    return device, ""


def _is_large_device(fields: dict[str, Any]) -> bool:
    attributes = fields.get("attributes") or {}
    return bool(
        fields.get("taints")
        or fields.get("consumesCounters")
        or any(
            isinstance(v, dict) and any(v.get(t) is not None for t in _LIST_TYPES)
            for v in attributes.values()
        )
    )


def _node_selection_causes(
    spec: dict[str, Any], field: str, classic: bool, per_device_allowed: bool
) -> tuple[list[Cause], int]:
    """Causes for the node selection fields of a slice or a device, and how many were set.

    ``classic``: the v1alpha3 rules of 1.31 (value-typed nodeName/allNodes where empty means
    unset, no perDeviceNodeSelection, node selector values not checked as label values).
    """
    out: list[Cause] = []
    chosen: list[str] = []
    node_name = spec.get("nodeName")
    if node_name is not None and (not classic or node_name != ""):
        if node_name == "":
            out.append(
                cause_invalid(
                    f"{field}nodeName",
                    "",
                    "must be either unset or set to a non-empty string"
                    if field == "spec."
                    else "must not be empty",
                )
            )
        else:
            chosen.append("`nodeName`")
            out.extend(
                cause_invalid(f"{field}nodeName", node_name, e)
                for e in names.dns_subdomain(str(node_name))
            )
    selector = spec.get("nodeSelector")
    if selector is not None:
        chosen.append("`nodeSelector`")
        # k8s.io/kubernetes pkg/apis/core/validation ValidateNodeSelector
        out.extend(
            nodeselector.node_selector_causes(
                selector, f"{field}nodeSelector", label_values=not classic
            )
        )
        terms = selector.get("nodeSelectorTerms") if isinstance(selector, dict) else None
        if field == "spec." and len(terms or []) != 1:
            # Only the slice-wide selector has this extra limit (it simplifies merging the
            # selectors of devices allocated from different slices).
            out.append(
                cause_invalid(
                    f"{field}nodeSelector.nodeSelectorTerms",
                    len(terms or []),
                    "must have exactly one selector term"
                    if classic
                    else "must have exactly one node selector term",
                )
            )
    all_nodes = spec.get("allNodes")
    if all_nodes is not None and (not classic or all_nodes is not False):
        if all_nodes is not True:
            out.append(
                cause_invalid(f"{field}allNodes", all_nodes, "must be either unset or set to true")
            )
        else:
            chosen.append("`allNodes`")
    if per_device_allowed:
        per_device = spec.get("perDeviceNodeSelection")
        if per_device is not None:
            if per_device is not True:
                out.append(
                    cause_invalid(
                        f"{field}perDeviceNodeSelection",
                        per_device,
                        "must be either unset or set to true",
                    )
                )
            else:
                chosen.append("`perDeviceNodeSelection`")
    return out, len(chosen)


def _selection_summary(spec: dict[str, Any], classic: bool) -> list[Cause]:
    """The slice-wide "exactly one node selection" rule (validateResourceSliceSpec)."""
    chosen = [
        f"`{name}`"
        for name in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
        if (
            spec.get(name) not in (None, "", False)
            if classic
            else spec.get(name) is not None and spec.get(name) not in ("", False)
        )
    ]
    if classic:
        message = "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required"
        if not chosen:
            return [cause_required("spec", message)]
        if len(chosen) > 1:
            return [cause_invalid("spec", "<spec>", message)]
        return []
    message = (
        "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` "
        "is required"
    )
    if not chosen:
        return [cause_required("spec", message)]
    if len(chosen) > 1:
        return [
            cause_invalid(
                "spec", "{" + ", ".join(chosen) + "}", message + ", but multiple fields are set"
            )
        ]
    return []


def _device_selection_causes(
    fields: dict[str, Any], prefix: str, per_device: bool, classic: bool
) -> list[Cause]:
    if classic:
        return []
    causes, count = _node_selection_causes(
        fields, f"{prefix}.", classic=False, per_device_allowed=False
    )
    rule = (
        "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
        "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
    )
    if per_device:
        if count == 0:
            causes.append(cause_required(prefix, rule))
        elif count > 1:
            chosen = [
                f"`{n}`"
                for n in ("nodeName", "nodeSelector", "allNodes")
                if fields.get(n) not in (None, "", False)
            ]
            causes.append(cause_invalid(prefix, "{" + ", ".join(chosen) + "}", rule))
        return causes
    if any(fields.get(n) is not None for n in ("nodeName", "nodeSelector", "allNodes")):
        return [
            cause_invalid(
                prefix,
                None,
                "`nodeName`, `nodeSelector` and `allNodes` can only "
                "be set if `perDeviceNodeSelection` is set to true in the "
                "ResourceSlice spec",
            )
        ]
    return []


def _pool_causes(pool: dict[str, Any]) -> list[Cause]:
    """The pool's rules: a valid name, a slice count above zero, a generation not negative."""
    out = pool_name_causes(pool.get("name"), "spec.pool.name")
    if (pool.get("resourceSliceCount") or 0) < 1:
        out.append(
            cause_invalid(
                "spec.pool.resourceSliceCount",
                pool.get("resourceSliceCount"),
                "must be greater than zero",
            )
        )
    if (pool.get("generation") or 0) < 0:
        out.append(
            cause_invalid(
                "spec.pool.generation",
                pool.get("generation"),
                "must be greater than or equal to zero",
            )
        )
    return out


def _device_list_causes(
    spec: dict[str, Any], devices: list[dict[str, Any]], classic: bool, wrapped: bool
) -> list[Cause]:
    """The rules on the device list as a whole: not beside sharedCounters, and its length."""
    out: list[Cause] = []
    if devices and spec.get("sharedCounters"):
        out.append(
            cause_invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed")
        )
    large = any(_is_large_device(_device_view(d, wrapped)[0]) for d in devices)
    limit = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if large else MAX_DEVICES
    if len(devices) > limit:
        out.append(
            cause_too_long_items("spec.devices", limit)
            if classic
            else cause_too_many("spec.devices", limit)
        )
    return out


def _device_name_causes(name: str, field: str, seen: set[str]) -> list[Cause]:
    """A device's name: required, a DNS label, unique in the slice (``seen`` gets it)."""
    if not name:
        return [cause_required(f"{field}.name")]
    out = [cause_invalid(f"{field}.name", name, e) for e in names.dns_label(name)]
    if name in seen:
        out.append(cause_duplicate(f"{field}.name", name))
    seen.add(name)
    return out


def _attributes_and_capacity_causes(fields: dict[str, Any], prefix: str) -> list[Cause]:
    """A device's attributes and capacity: qualified names, valid values, and how many."""
    out: list[Cause] = []
    attributes = fields.get("attributes") or {}
    capacity = fields.get("capacity") or {}
    for key, value in attributes.items():
        out.extend(qualified_name_causes(key, f"{prefix}.attributes[{key}]"))
        out.extend(_attribute_causes(value, f"{prefix}.attributes[{key}]"))
    for key in capacity:
        out.extend(qualified_name_causes(key, f"{prefix}.capacity[{key}]"))
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITY:
        out.append(
            Cause(
                "FieldValueTooMany",
                "Too many: the total number of attributes "
                f"and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITY}",
                prefix,
            )
        )
    return out


def _device_causes(
    device: dict[str, Any],
    field: str,
    seen: set[str],
    *,
    classic: bool,
    wrapped: bool,
    per_device: bool,
) -> list[Cause]:
    """The rules for one device at ``field`` (``spec.devices[i]``); ``seen``: the names so
    far. v1alpha3 (``classic``) checks only the name, ``basic`` and attributes/capacity."""
    out = _device_name_causes(device.get("name") or "", field, seen)
    if classic and not isinstance(device.get("basic"), dict):
        # 1.31 validateDevice: a v1alpha3 device without `basic` has nothing to allocate.
        out.append(cause_required(f"{field}.basic"))
        return out
    fields, sub = _device_view(device, wrapped)
    prefix = f"{field}{sub}"
    out.extend(_attributes_and_capacity_causes(fields, prefix))
    if classic:
        return out
    taints = [t if isinstance(t, dict) else {} for t in fields.get("taints") or []]
    if len(taints) > MAX_TAINTS:
        out.append(cause_too_many(f"{prefix}.taints", MAX_TAINTS))
    for t, taint in enumerate(taints):
        out.extend(_taint_causes(taint, f"{prefix}.taints[{t}]"))
    out.extend(
        binding_causes(
            fields.get("bindingConditions"), fields.get("bindingFailureConditions"), prefix
        )
    )
    out.extend(_device_selection_causes(fields, prefix, per_device, classic))
    return out


def _immutable_causes(spec: dict[str, Any], old_spec: dict[str, Any]) -> list[Cause]:
    """An update's changes to the fields that cannot change: pool name, driver, node name."""
    pool = spec.get("pool") or {}
    return [
        cause_invalid(name, new_value, "field is immutable")
        for name, new_value, old_value in (
            ("spec.pool.name", pool.get("name"), (old_spec.get("pool") or {}).get("name")),
            ("spec.driver", spec.get("driver"), old_spec.get("driver")),
            ("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName")),
        )
        if new_value != old_value
    ]


def resource_slice_causes(obj: dict[str, Any], ctx: RuleContext) -> list[Cause]:
    """All Go-side ResourceSlice rules for a create (``ctx.old`` None) or update.

    ``ctx.version`` is the resource.k8s.io version the object was written in: v1beta1 and
    v1alpha3 wrap device fields in ``basic``; v1alpha3 follows the 1.31 rules (value-typed
    nodeName/allNodes where empty means unset, no perDeviceNodeSelection, ``basic``
    required). A driver name with uppercase letters is accepted with a warning (appended to
    ``ctx.warnings``), as the real server does.
    Source: k8s.io/kubernetes pkg/apis/resource/validation ValidateResourceSlice,
    ValidateResourceSliceUpdate; pkg/registry/resource/resourceslice/strategy.go warnings.
    """
    spec = obj.get("spec") or {}
    version = ctx.version
    classic = version == "v1alpha3"
    wrapped = version in ("v1beta1", "v1alpha3")
    out: list[Cause] = []
    out.extend(driver_name_causes(spec.get("driver"), "spec.driver"))
    if not classic:
        ctx.warnings.extend(driver_name_warnings(spec.get("driver"), "spec.driver"))
    out.extend(_pool_causes(spec.get("pool") or {}))
    selection, _ = _node_selection_causes(spec, "spec.", classic, per_device_allowed=not classic)
    out.extend(selection)
    out.extend(_selection_summary(spec, classic))
    per_device = spec.get("perDeviceNodeSelection") is True
    # A JSON null item decodes as Go's zero struct (the schema lets nulls through).
    devices = [d if isinstance(d, dict) else {} for d in spec.get("devices") or []]
    out.extend(_device_list_causes(spec, devices, classic, wrapped))
    seen: set[str] = set()
    for i, device in enumerate(devices):
        out.extend(
            _device_causes(
                device,
                f"spec.devices[{i}]",
                seen,
                classic=classic,
                wrapped=wrapped,
                per_device=per_device,
            )
        )
    if ctx.old is not None:
        out.extend(_immutable_causes(spec, ctx.old.get("spec") or {}))
    return out
