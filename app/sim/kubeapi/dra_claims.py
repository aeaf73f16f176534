"""Go-side rules for ResourceClaims, their templates, DeviceClasses and v1alpha3
PodSchedulingContexts.

Ports of k8s.io/kubernetes pkg/apis/resource/validation (validation.go):
validateResourceClaimSpec, validateResourceClaimStatusUpdate, validateAllocatedDeviceStatus,
validateDeviceClassSpec, validateOpaqueConfiguration; the PodSchedulingContext rules are those
of Kubernetes 1.31. Each function takes plain JSON and returns causes.
"""

from __future__ import annotations

import json
from typing import Any

from . import names
from .dra import (
    MAX_CEL_LENGTH,
    MAX_CONDITIONS_PER_DEVICE,
    MAX_PARAMETERS_SIZE,
    MAX_POTENTIAL_NODES,
    MAX_RESERVED_FOR,
    MAX_RESULTS,
    cause_duplicate,
    cause_forbidden,
    cause_invalid,
    cause_required,
    cause_too_long,
    cause_too_many,
    driver_name_causes,
    pool_name_causes,
)
from .errors import Cause


def opaque_config_causes(config: list[Any], field: str) -> list[Cause]:
    """``config[].opaque``: driver a DNS subdomain <= 63, parameters a JSON object <= 10 KiB
    (validateOpaqueConfiguration, validateRawExtension).
    """
    out: list[Cause] = []
    for i, entry in enumerate(config or []):
        opaque = (entry or {}).get("opaque")
        if opaque is None:
            continue
        path = f"{field}[{i}].opaque"
        out.extend(driver_name_causes(opaque.get("driver"), f"{path}.driver"))
        params = opaque.get("parameters")
        if params is None:
            out.append(cause_required(f"{path}.parameters"))
        elif not isinstance(params, dict):
            out.append(cause_invalid(f"{path}.parameters", "<value omitted>",
                                "parameters must be a valid JSON object"))
        elif len(json.dumps(params, separators=(",", ":"))) > MAX_PARAMETERS_SIZE:
            out.append(cause_too_long(f"{path}.parameters", MAX_PARAMETERS_SIZE))
    return out


def device_class_causes(obj: dict[str, Any]) -> list[Cause]:
    """DeviceClass spec: CEL expressions <= 10 KiB, opaque config (validateDeviceClassSpec)."""
    spec = obj.get("spec") or {}
    out: list[Cause] = []
    for i, selector in enumerate(spec.get("selectors") or []):
        expression = ((selector or {}).get("cel") or {}).get("expression")
        path = f"spec.selectors[{i}].cel.expression"
        if (selector or {}).get("cel") is not None and not expression:
            out.append(cause_required(path))
        elif expression and len(expression) > MAX_CEL_LENGTH:
            out.append(cause_too_long(path, MAX_CEL_LENGTH))
    out.extend(opaque_config_causes(spec.get("config") or [], "spec.config"))
    return out


def _request_causes(spec: dict[str, Any], wrapped: bool) -> list[Cause]:
    out: list[Cause] = []
    devices = spec.get("devices") or {}
    seen: set[str] = set()
    for i, request in enumerate(devices.get("requests") or []):
        field = f"spec.devices.requests[{i}]"
        name = request.get("name") or ""
        if not name:
            out.append(cause_required(f"{field}.name"))
        else:
            out.extend(cause_invalid(f"{field}.name", name, e) for e in names.dns_label(name))
            if name in seen:
                out.append(cause_duplicate(f"{field}.name", name))
            seen.add(name)
        exact = request if wrapped else request.get("exactly")
        if exact is None:
            if not request.get("firstAvailable"):
                out.append(cause_required(f"{field}", "exactly one of `exactly` or "
                                                 "`firstAvailable` is required"))
            continue
        sub = "" if wrapped else ".exactly"
        if not exact.get("deviceClassName") and not request.get("firstAvailable"):
            out.append(cause_required(f"{field}{sub}.deviceClassName"))
        mode = exact.get("allocationMode") or "ExactCount"
        if mode == "ExactCount" and exact.get("count") is not None and exact["count"] < 1:
            out.append(cause_invalid(f"{field}{sub}.count", exact["count"],
                                     "must be greater than 0"))
        for s, selector in enumerate(exact.get("selectors") or []):
            expression = ((selector or {}).get("cel") or {}).get("expression") or ""
            if len(expression) > MAX_CEL_LENGTH:
                out.append(cause_too_long(f"{field}{sub}.selectors[{s}].cel.expression",
                                     MAX_CEL_LENGTH))
    for c, constraint in enumerate(devices.get("constraints") or []):
        for r, name in enumerate((constraint or {}).get("requests") or []):
            if name.split("/")[0] not in seen:
                out.append(cause_invalid(f"spec.devices.constraints[{c}].requests[{r}]", name,
                                    "must be the name of a request in the claim"))
    out.extend(opaque_config_causes(devices.get("config") or [], "spec.devices.config"))
    return out


def _condition_causes(condition: Any, field: str) -> list[Cause]:
    out: list[Cause] = []
    if not condition.get("type"):
        out.append(cause_required(f"{field}.type"))
    else:
        out.extend(cause_invalid(f"{field}.type", condition["type"], e)
                   for e in names.qualified_name(condition["type"]))
    if condition.get("status") not in ("True", "False", "Unknown"):
        out.append(Cause("FieldValueNotSupported", f"Unsupported value: "
                         f"{json.dumps(condition.get('status'))}: supported values: \"False\", "
                         "\"True\", \"Unknown\"", f"{field}.status"))
    reason = condition.get("reason") or ""
    if not reason:
        out.append(cause_required(f"{field}.reason"))
    elif len(reason) > 1024:
        out.append(cause_too_long(f"{field}.reason", 1024))
    elif not names.CAMEL_REASON_RE.match(reason):
        out.append(cause_invalid(f"{field}.reason", reason, "a condition reason must start with "
                            "alphabetic character, optionally followed by a string of "
                            "alphanumeric characters or '_,:', and must end with an alphanumeric "
                            "character or '_'"))
    if not condition.get("lastTransitionTime"):
        out.append(cause_required(f"{field}.lastTransitionTime", "must be set"))
    if len(condition.get("message") or "") > 32768:
        out.append(cause_too_long(f"{field}.message", 32768))
    if (condition.get("observedGeneration") or 0) < 0:
        out.append(cause_invalid(f"{field}.observedGeneration", condition["observedGeneration"],
                            "must be greater than or equal to zero"))
    return out


def resource_claim_status_causes(
    status: dict[str, Any], old_status: dict[str, Any] | None
) -> list[Cause]:
    """ResourceClaim status rules (validateResourceClaimStatusUpdate): allocation set once and
    only cleared; reservedFor only while allocated, <= 256, unique uids; results <= 32;
    ``status.devices`` entries name allocated devices, unique, with valid conditions (<= 8) and
    a JSON-object ``data``.
    """
    out: list[Cause] = []
    allocation = status.get("allocation")
    old_allocation = (old_status or {}).get("allocation")
    if old_allocation is not None and allocation is not None and allocation != old_allocation:
        out.append(cause_invalid("status.allocation", "<allocation>", "field is immutable"))
    reserved = status.get("reservedFor") or []
    if reserved and allocation is None:
        out.append(cause_forbidden("status.reservedFor",
                              "may not be specified when `allocated` is not set"))
    if len(reserved) > MAX_RESERVED_FOR:
        out.append(cause_too_many("status.reservedFor", MAX_RESERVED_FOR))
    uids: set[str] = set()
    for i, consumer in enumerate(reserved):
        for key in ("resource", "name", "uid"):
            if not consumer.get(key):
                out.append(cause_required(f"status.reservedFor[{i}].{key}"))
        if consumer.get("uid") in uids:
            out.append(cause_duplicate(f"status.reservedFor[{i}].uid", consumer.get("uid")))
        uids.add(consumer.get("uid"))
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    if len(results) > MAX_RESULTS:
        out.append(cause_too_many("status.allocation.devices.results", MAX_RESULTS))
    for i, result in enumerate(results):
        field = f"status.allocation.devices.results[{i}]"
        out.extend(driver_name_causes(result.get("driver"), f"{field}.driver"))
        out.extend(pool_name_causes(result.get("pool"), f"{field}.pool"))
        if not result.get("device"):
            out.append(cause_required(f"{field}.device"))
    allocated = {(r.get("driver"), r.get("pool"), r.get("device")) for r in results}
    seen: set[tuple[Any, Any, Any]] = set()
    for i, entry in enumerate(status.get("devices") or []):
        field = f"status.devices[{i}]"
        device_id = (entry.get("driver"), entry.get("pool"), entry.get("device"))
        shown = "/".join(str(part) for part in device_id)
        if device_id not in allocated:
            out.append(cause_invalid(field, shown, "must be an allocated device in the claim"))
        if device_id in seen:
            out.append(cause_duplicate(field, shown))
        seen.add(device_id)
        conditions = entry.get("conditions") or []
        if len(conditions) > MAX_CONDITIONS_PER_DEVICE:
            out.append(cause_too_many(f"{field}.conditions", MAX_CONDITIONS_PER_DEVICE))
        types: set[str] = set()
        for c, condition in enumerate(conditions):
            out.extend(_condition_causes(condition, f"{field}.conditions[{c}]"))
            if condition.get("type") in types:
                out.append(cause_duplicate(f"{field}.conditions[{c}].type", condition.get("type")))
            types.add(condition.get("type"))
        if "data" in entry and entry["data"] is not None:
            if not isinstance(entry["data"], dict):
                out.append(cause_invalid(f"{field}.data", "<value omitted>",
                                    "data must be a valid JSON object"))
            elif len(json.dumps(entry["data"], separators=(",", ":"))) > MAX_PARAMETERS_SIZE:
                out.append(cause_too_long(f"{field}.data", MAX_PARAMETERS_SIZE))
    return out


def resource_claim_causes(
    obj: dict[str, Any], old: dict[str, Any] | None, version: str, status_write: bool
) -> list[Cause]:
    """ResourceClaim: spec rules on create, spec immutable on update, status rules on status
    writes (k8s.io/kubernetes pkg/apis/resource/validation ValidateResourceClaim,
    ValidateResourceClaimUpdate, ValidateResourceClaimStatusUpdate).
    """
    wrapped = version in ("v1beta1", "v1alpha3")
    out: list[Cause] = []
    if old is None:
        out.extend(_request_causes(obj.get("spec") or {}, wrapped))
    elif not status_write and obj.get("spec") != old.get("spec"):
        out.append(cause_invalid("spec", "<spec>", "field is immutable"))
    if status_write:
        out.extend(resource_claim_status_causes(obj.get("status") or {},
                                                (old or {}).get("status")))
    return out


def resource_claim_template_causes(obj: dict[str, Any], old: dict[str, Any] | None,
                                   version: str) -> list[Cause]:
    """ResourceClaimTemplate: the embedded claim spec follows the claim rules; the spec is
    immutable (ValidateResourceClaimTemplateUpdate).
    """
    if old is not None and obj.get("spec") != old.get("spec"):
        return [cause_invalid("spec", "<spec>", "field is immutable")]
    inner = (obj.get("spec") or {}).get("spec") or {}
    causes = _request_causes(inner, version in ("v1beta1", "v1alpha3"))
    return [Cause(c.reason, c.message, c.field.replace("spec.", "spec.spec.", 1))
            for c in causes]


def _node_list_causes(nodes: list[Any], field: str) -> list[Cause]:
    out: list[Cause] = []
    if len(nodes) > MAX_POTENTIAL_NODES:
        out.append(cause_too_many(field, MAX_POTENTIAL_NODES))
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        out.extend(cause_invalid(f"{field}[{i}]", node, e) for e in names.dns_subdomain(node))
        if node in seen:
            out.append(cause_duplicate(f"{field}[{i}]", node))
        seen.add(node)
    return out


def pod_scheduling_context_causes(obj: dict[str, Any]) -> list[Cause]:
    """v1alpha3 PodSchedulingContext: potentialNodes and each claim's unsuitableNodes hold at
    most 128 unique node names; claim entries are unique by name
    (k8s.io/kubernetes v1.31 pkg/apis/resource/validation ValidatePodSchedulingContexts).
    """
    spec = obj.get("spec") or {}
    out: list[Cause] = []
    if spec.get("selectedNode"):
        out.extend(cause_invalid("spec.selectedNode", spec["selectedNode"], e)
                   for e in names.dns_subdomain(spec["selectedNode"]))
    out.extend(_node_list_causes(spec.get("potentialNodes") or [], "spec.potentialNodes"))
    seen: set[str] = set()
    for i, entry in enumerate((obj.get("status") or {}).get("resourceClaims") or []):
        field = f"status.resourceClaims[{i}]"
        name = entry.get("name") or ""
        if not name:
            out.append(cause_required(f"{field}.name"))
        elif name in seen:
            out.append(cause_duplicate(f"{field}.name", name))
        seen.add(name)
        out.extend(_node_list_causes(entry.get("unsuitableNodes") or [],
                                     f"{field}.unsuitableNodes"))
    return out
