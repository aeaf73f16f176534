"""What the server does to a written object before validating it: decode its typed values into
canonical form (:mod:`.values`) and apply the version's defaulting functions.

Field tables name every quantity, integer and time field per kind and version, as the Go types
declare them (k8s.io/api resource/<version>/types.go, core/v1, coordination/v1, events/v1).
Defaulting ports k8s.io/kubernetes pkg/apis/resource/<version>/defaults.go with the generated
zz_generated.defaults.go (tolerations' ``operator`` from the ``+default="Equal"`` markers):

* v1 / v1beta2: ``exactly`` requests and ``firstAvailable`` subrequests get
  ``allocationMode: ExactCount`` and, for ExactCount, ``count: 1`` (SetDefaults_ExactDeviceRequest,
  SetDefaults_DeviceSubRequest); device taints get ``timeAdded`` (SetDefaults_DeviceTaint: now,
  whole seconds); node-allocatable mappings get ``allocationMultiplier: "1"`` (SetDefaults_Device);
* v1beta1: the same, on requests with a ``deviceClassName`` (SetDefaults_DeviceRequest) and taints
  under ``basic``;
* v1alpha3 (the Kubernetes 1.31 shape): requests get ExactCount and count 1
  (release-1.31 SetDefaults_DeviceRequest).

Defaulting runs in the decoder, with no view of the stored object: a taint written without
``timeAdded`` gets the current time on every create and update, so a writer keeps its taints'
age by sending back the ``timeAdded`` it read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .errors import StatusError, bad_request
from .objects import now_rfc3339
from .resources import ResourceType
from .values import (
    ValueDecodeError,
    check_int,
    micro_time_from_json,
    quantity_from_json,
    time_from_json,
)

# A field: (path, type, Go struct holding the leaf, for integer messages). Paths are dotted
# JSON keys; ``[]`` walks a list's elements and ``{}`` a map's values.
Field = tuple[str, str, str]

_META: list[Field] = [
    ("metadata.creationTimestamp", "time", ""),
    ("metadata.deletionTimestamp", "time", ""),
    ("metadata.generation", "int64", "ObjectMeta"),
    ("metadata.deletionGracePeriodSeconds", "int64", "ObjectMeta"),
    ("metadata.managedFields[].time", "time", ""),
]


def _capacity(prefix: str) -> list[Field]:
    # resource/v1 DeviceCapacity (value, requestPolicy) under ``<prefix>capacity``.
    return [
        (f"{prefix}capacity{{}}.value", "quantity", ""),
        (f"{prefix}capacity{{}}.requestPolicy.default", "quantity", ""),
        (f"{prefix}capacity{{}}.requestPolicy.validValues[]", "quantity", ""),
        (f"{prefix}capacity{{}}.requestPolicy.validRange.min", "quantity", ""),
        (f"{prefix}capacity{{}}.requestPolicy.validRange.max", "quantity", ""),
        (f"{prefix}capacity{{}}.requestPolicy.validRange.step", "quantity", ""),
    ]


def _slice_fields(device: str) -> list[Field]:
    return [
        ("spec.pool.generation", "int64", "ResourcePool"),
        ("spec.pool.resourceSliceCount", "int64", "ResourcePool"),
        ("spec.sharedCounters[].counters{}.value", "quantity", ""),
        (f"{device}attributes{{}}.int", "int64", "DeviceAttribute"),
        *_capacity(device),
        (f"{device}consumesCounters[].counters{{}}.value", "quantity", ""),
        (f"{device}taints[].timeAdded", "time", ""),
        ("spec.devices[].nodeAllocatableResourceMappings{}.allocationMultiplier", "quantity", ""),
    ]


def _request_fields(spec: str, exact: str, exact_struct: str) -> list[Field]:
    requests = f"{spec}.devices.requests[]"
    out: list[Field] = []
    for where, struct in (
        (f"{requests}{exact}", exact_struct),
        (f"{requests}.firstAvailable[]", "DeviceSubRequest"),
    ):
        out += [
            (f"{where}.count", "int64", struct),
            (f"{where}.capacity.requests{{}}", "quantity", ""),
            (f"{where}.tolerations[].tolerationSeconds", "int64", "DeviceToleration"),
        ]
    return out


_CLAIM_STATUS: list[Field] = [
    ("status.allocation.allocationTimestamp", "time", ""),
    ("status.allocation.devices.results[].consumedCapacity{}", "quantity", ""),
    (
        "status.allocation.devices.results[].tolerations[].tolerationSeconds",
        "int64",
        "DeviceToleration",
    ),
    ("status.devices[].conditions[].lastTransitionTime", "time", ""),
    ("status.devices[].conditions[].observedGeneration", "int64", "Condition"),
]

_CONTAINERS = ("spec.containers[]", "spec.initContainers[]")

_FIELDS: dict[tuple[str, str, str], list[Field]] = {
    ("resource.k8s.io", "v1", "resourceslices"): _slice_fields("spec.devices[]."),
    ("resource.k8s.io", "v1beta2", "resourceslices"): _slice_fields("spec.devices[]."),
    ("resource.k8s.io", "v1beta1", "resourceslices"): _slice_fields("spec.devices[].basic."),
    ("resource.k8s.io", "v1alpha3", "resourceslices"): [
        ("spec.pool.generation", "int64", "ResourcePool"),
        ("spec.pool.resourceSliceCount", "int64", "ResourcePool"),
        ("spec.devices[].basic.attributes{}.int", "int64", "DeviceAttribute"),
        ("spec.devices[].basic.capacity{}", "quantity", ""),
    ],
    ("resource.k8s.io", "v1", "resourceclaims"): _request_fields(
        "spec", ".exactly", "ExactDeviceRequest"
    )
    + _CLAIM_STATUS,
    ("resource.k8s.io", "v1beta2", "resourceclaims"): _request_fields(
        "spec", ".exactly", "ExactDeviceRequest"
    )
    + _CLAIM_STATUS,
    ("resource.k8s.io", "v1beta1", "resourceclaims"): _request_fields("spec", "", "DeviceRequest")
    + _CLAIM_STATUS,
    ("resource.k8s.io", "v1alpha3", "resourceclaims"): [
        ("spec.devices.requests[].count", "int64", "DeviceRequest")
    ],
    ("resource.k8s.io", "v1", "resourceclaimtemplates"): _request_fields(
        "spec.spec", ".exactly", "ExactDeviceRequest"
    ),
    ("resource.k8s.io", "v1beta2", "resourceclaimtemplates"): _request_fields(
        "spec.spec", ".exactly", "ExactDeviceRequest"
    ),
    ("resource.k8s.io", "v1beta1", "resourceclaimtemplates"): _request_fields(
        "spec.spec", "", "DeviceRequest"
    ),
    ("resource.k8s.io", "v1alpha3", "resourceclaimtemplates"): [
        ("spec.spec.devices.requests[].count", "int64", "DeviceRequest")
    ],
    ("coordination.k8s.io", "v1", "leases"): [
        ("spec.leaseDurationSeconds", "int32", "LeaseSpec"),
        ("spec.leaseTransitions", "int32", "LeaseSpec"),
        ("spec.acquireTime", "micro", ""),
        ("spec.renewTime", "micro", ""),
    ],
    ("", "v1", "events"): [
        ("count", "int32", "Event"),
        ("firstTimestamp", "time", ""),
        ("lastTimestamp", "time", ""),
        ("eventTime", "micro", ""),
        ("series.count", "int32", "EventSeries"),
        ("series.lastObservedTime", "micro", ""),
    ],
    ("events.k8s.io", "v1", "events"): [
        ("eventTime", "micro", ""),
        ("deprecatedCount", "int32", "Event"),
        ("deprecatedFirstTimestamp", "time", ""),
        ("deprecatedLastTimestamp", "time", ""),
        ("series.count", "int32", "EventSeries"),
        ("series.lastObservedTime", "micro", ""),
    ],
    ("", "v1", "nodes"): [
        ("spec.taints[].timeAdded", "time", ""),
        ("status.capacity{}", "quantity", ""),
        ("status.allocatable{}", "quantity", ""),
        ("status.conditions[].lastHeartbeatTime", "time", ""),
        ("status.conditions[].lastTransitionTime", "time", ""),
    ],
    ("", "v1", "pods"): [
        *(
            (f"{c}.resources.{k}{{}}", "quantity", "")
            for c in _CONTAINERS
            for k in ("requests", "limits")
        ),
        ("spec.overhead{}", "quantity", ""),
        ("spec.terminationGracePeriodSeconds", "int64", "PodSpec"),
        ("spec.activeDeadlineSeconds", "int64", "PodSpec"),
        ("spec.priority", "int32", "PodSpec"),
        ("status.startTime", "time", ""),
        ("status.conditions[].lastProbeTime", "time", ""),
        ("status.conditions[].lastTransitionTime", "time", ""),
    ],
    ("", "v1", "namespaces"): [("status.conditions[].lastTransitionTime", "time", "")],
}


@functools.cache
def _segments(path: str) -> tuple[tuple[str, str], ...]:
    """``a.b[].c{}`` -> (("a", ""), ("b", "[]"), ("c", "{}"))."""
    out = []
    for part in path.split("."):
        if part.endswith(("[]", "{}")):
            out.append((part[:-2], part[-2:]))
        else:
            out.append((part, ""))
    return tuple(out)


def _json_path(path: str) -> str:
    # encoding/json names a field by its JSON keys, without list indexes or map keys.
    return path.replace("[]", "").replace("{}", "")


def _walk(node: Any, segments: tuple[tuple[str, str], ...], fn: Callable[[Any], Any]) -> None:
    key, mode = segments[0]
    if type(node) is not dict or key not in node:
        return
    last = len(segments) == 1
    value = node[key]
    if mode == "":
        if last:
            node[key] = fn(value)
        else:
            _walk(value, segments[1:], fn)
        return
    if mode == "[]" and type(value) is list:
        for i, item in enumerate(value):
            if last:
                value[i] = fn(item)
            else:
                _walk(item, segments[1:], fn)
    elif mode == "{}" and type(value) is dict:
        for name, item in value.items():
            if last:
                value[name] = fn(item)
            else:
                _walk(item, segments[1:], fn)


def _quantity(value: Any) -> Any:
    return None if value is None else quantity_from_json(value)


@functools.cache
def _converter(kind: str, struct: str, path: str) -> Callable[[Any], Any]:
    if kind == "quantity":
        return _quantity
    if kind == "time":
        return time_from_json
    if kind == "micro":
        return micro_time_from_json
    bits = 32 if kind == "int32" else 64
    json_path = _json_path(path)

    def check(value: Any) -> Any:
        check_int(value, bits, struct, json_path)
        return value

    return check


def decode_error(rt: ResourceType, message: str) -> StatusError:
    """400 for a body the Go decoder refuses (k8s.io/apiserver pkg/endpoints/handlers
    rest.go: ``<Kind> in version "<v>" cannot be handled as a <Kind>: <error>``)."""
    return bad_request(
        f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {message}'
    )


def normalise(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Decode ``obj``'s typed values in place into what the server would store and answer:
    canonical quantities, range-checked integers, UTC times (:mod:`.values`).

    Raises:
        StatusError: 400 with the decoder's message for the first value it refuses.
    """
    fields = _FIELDS.get((rt.group, rt.version, rt.plural), [])
    try:
        for path, kind, struct in (*_META, *fields):
            _walk(obj, _segments(path), _converter(kind, struct, path))
    except ValueDecodeError as err:
        raise decode_error(rt, str(err)) from err


# --------------------------------------------------------------------------- defaulting
def _list(value: Any) -> list[Any]:
    # A malformed body may hold anything where a list belongs: schema validation reports it.
    return value if type(value) is list else []


def _exact_count(request: Any) -> None:
    # SetDefaults_ExactDeviceRequest / SetDefaults_DeviceSubRequest / SetDefaults_DeviceRequest.
    if type(request) is not dict:
        return
    if not request.get("allocationMode"):
        request["allocationMode"] = "ExactCount"
    if request["allocationMode"] == "ExactCount" and not request.get("count"):
        request["count"] = 1


def _tolerations(holder: Any) -> None:
    # +default="Equal" on DeviceToleration.Operator (zz_generated.defaults.go).
    if type(holder) is not dict:
        return
    for toleration in _list(holder.get("tolerations")):
        if type(toleration) is dict and not toleration.get("operator"):
            toleration["operator"] = "Equal"


def _claim_spec(spec: Any, version: str) -> None:
    devices = spec.get("devices") if type(spec) is dict else None
    requests = devices.get("requests") if type(devices) is dict else None
    if type(requests) is not list:
        return
    for request in requests:
        if type(request) is not dict:
            continue
        if version == "v1alpha3":
            _exact_count(request)
            continue
        if version in ("v1", "v1beta2"):
            exact = request.get("exactly")
            if type(exact) is dict:
                _exact_count(exact)
                _tolerations(exact)
        elif request.get("deviceClassName"):
            _exact_count(request)
        if version == "v1beta1":
            _tolerations(request)
        for sub in _list(request.get("firstAvailable")):
            _exact_count(sub)
            _tolerations(sub)


def _claim_status(status: Any) -> None:
    allocation = status.get("allocation") if type(status) is dict else None
    devices = allocation.get("devices") if type(allocation) is dict else None
    if type(devices) is dict:
        for result in _list(devices.get("results")):
            _tolerations(result)


def _slice(spec: Any, version: str, now: Callable[[], str]) -> None:
    if type(spec) is not dict or version == "v1alpha3":
        return
    for device in _list(spec.get("devices")):
        if type(device) is not dict:
            continue
        holder = device.get("basic") if version == "v1beta1" else device
        if type(holder) is dict:
            for taint in _list(holder.get("taints")):
                if type(taint) is dict and taint.get("timeAdded") is None:
                    taint["timeAdded"] = now()
        mappings = device.get("nodeAllocatableResourceMappings")
        if type(mappings) is dict:
            for mapping in mappings.values():
                if type(mapping) is dict and mapping.get("allocationMultiplier") is None:
                    mapping["allocationMultiplier"] = "1"


def apply_defaults(
    rt: ResourceType, obj: dict[str, Any], now: Callable[[], str] = now_rfc3339
) -> None:
    """Apply the defaulting functions of ``rt``'s version to ``obj`` in place (see the module
    docstring); ``now`` gives the ``metav1.Time`` string for a taint's ``timeAdded``.
    Malformed shapes are left alone for validation to report.
    """
    if rt.group != "resource.k8s.io":
        return
    spec = obj.get("spec")
    if rt.plural == "resourceslices":
        _slice(spec, rt.version, now)
    elif rt.plural == "resourceclaims":
        if type(spec) is dict:
            _claim_spec(spec, rt.version)
        _claim_status(obj.get("status"))
    elif rt.plural == "resourceclaimtemplates" and type(spec) is dict:
        _claim_spec(spec.get("spec"), rt.version)


def prepare(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Decode then default an incoming object in place, as the server does before its
    strategy and validation run. Raises StatusError 400 (see :func:`normalise`)."""
    normalise(rt, obj)
    apply_defaults(rt, obj)


__all__ = ["apply_defaults", "decode_error", "normalise", "prepare"]
