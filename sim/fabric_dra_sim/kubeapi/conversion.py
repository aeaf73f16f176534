"""Conversion of resource.k8s.io objects between the versions one storage serves.

kube-apiserver stores each object once, in the storage version, and converts it on every
read, list, watch event and write (k8s.io/apiserver pkg/endpoints/handlers, the codec of
the storage factory). The rules are those of k8s.io/kubernetes
pkg/apis/resource/v1beta1/conversion.go:

* v1beta2 and v1 have the same JSON: only ``apiVersion`` changes
  (pkg/apis/resource/v1beta2 is generated without custom conversions);
* v1beta1 wraps a device's fields in ``basic`` (``Convert_v1beta1_Device_To_resource_Device``
  and back), and its DeviceRequest is flat where v1 nests a single-device request under
  ``exactly`` (``Convert_v1beta1_DeviceRequest_To_resource_DeviceRequest``: ``exactly`` is
  set when any of the main-request fields is set, ``hasAnyMainRequestFieldsSet``).

Conversion never changes its input: it copies the dicts on the path it rewrites and shares
every other subtree with the source. That is safe because stored objects are never changed
in place (see :mod:`.store`); callers that hand an object out to be changed copy it first.
"""

from __future__ import annotations

from typing import Any

from .resources import RESOURCE_GROUP

# The fields of a v1beta1 DeviceRequest that v1 moves under ``exactly``
# (ExactDeviceRequest / v1beta1 DeviceRequest, k8s.io/api resource/v1 and v1beta1 types.go).
EXACT_REQUEST_FIELDS = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)
_SAME_SHAPE = frozenset({"v1", "v1beta2"})
_KINDS_WITH_REQUESTS = {"ResourceClaim": ("spec",), "ResourceClaimTemplate": ("spec", "spec")}


def version_of(obj: dict[str, Any]) -> str:
    """The version part of ``obj``'s apiVersion ("v1" for "resource.k8s.io/v1")."""
    return str(obj.get("apiVersion", "")).rpartition("/")[2]


def convert(obj: dict[str, Any], to_version: str) -> dict[str, Any]:
    """``obj`` (a resource.k8s.io object) shown in ``to_version``.

    Returns ``obj`` itself when it already is in that version, otherwise a new top-level
    dict sharing unchanged subtrees with ``obj``. Conversion between v1alpha3 and the other
    versions is not supported (no release stores both): ValueError.
    """
    from_version = version_of(obj)
    if from_version == to_version:
        return obj
    if not ({from_version, to_version} <= {"v1", "v1beta2", "v1beta1"}):
        raise ValueError(f"no conversion between resource.k8s.io {from_version} and {to_version}")
    out = dict(obj)
    out["apiVersion"] = f"{RESOURCE_GROUP}/{to_version}"
    if from_version in _SAME_SHAPE and to_version in _SAME_SHAPE:
        return out
    kind = obj.get("kind", "")
    to_beta1 = to_version == "v1beta1"
    if kind == "ResourceSlice":
        spec = obj.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("devices"), list):
            convert_device = _device_to_v1beta1 if to_beta1 else _device_from_v1beta1
            out["spec"] = {**spec, "devices": [convert_device(d) for d in spec["devices"]]}
    elif kind in _KINDS_WITH_REQUESTS:
        convert_request = _request_to_v1beta1 if to_beta1 else _request_from_v1beta1
        out_spec = _rewrite(obj, _KINDS_WITH_REQUESTS[kind], convert_request)
        if out_spec is not None:
            out[_KINDS_WITH_REQUESTS[kind][0]] = out_spec
    return out


def _rewrite(obj: dict[str, Any], path: tuple[str, ...], convert_request: Any) -> Any:
    # Rebuild obj[path...]["devices"]["requests"] with converted requests; None when absent.
    node: Any = obj
    chain: list[dict[str, Any]] = []
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return None
        chain.append(node)
    devices = node.get("devices")
    if not isinstance(devices, dict) or not isinstance(devices.get("requests"), list):
        return None
    rebuilt: Any = {
        **node,
        "devices": {**devices, "requests": [convert_request(r) for r in devices["requests"]]},
    }
    for parent, key in zip(reversed(chain[:-1]), reversed(path[1:]), strict=True):
        rebuilt = {**parent, key: rebuilt}
    return rebuilt


def _device_from_v1beta1(device: Any) -> Any:
    # Convert_v1beta1_Device_To_resource_Device: the BasicDevice fields move up.
    if not isinstance(device, dict) or "basic" not in device:
        return device
    out = {k: v for k, v in device.items() if k != "basic"}
    basic = device["basic"]
    if isinstance(basic, dict):
        out.update(basic)
    return out


def _device_to_v1beta1(device: Any) -> Any:
    # Convert_resource_Device_To_v1beta1_Device: everything but the name goes under basic.
    if not isinstance(device, dict):
        return device
    out: dict[str, Any] = {}
    if "name" in device:
        out["name"] = device["name"]
    out["basic"] = {k: v for k, v in device.items() if k != "name"}
    return out


def _request_from_v1beta1(request: Any) -> Any:
    # Convert_v1beta1_DeviceRequest_To_resource_DeviceRequest with hasAnyMainRequestFieldsSet.
    if not isinstance(request, dict):
        return request
    out = {k: v for k, v in request.items() if k not in EXACT_REQUEST_FIELDS}
    exactly = {k: request[k] for k in EXACT_REQUEST_FIELDS if k in request}
    if exactly:
        out["exactly"] = exactly
    return out


def _request_to_v1beta1(request: Any) -> Any:
    # Convert_resource_DeviceRequest_To_v1beta1_DeviceRequest: exactly's fields become flat.
    if not isinstance(request, dict) or "exactly" not in request:
        return request
    out = {k: v for k, v in request.items() if k != "exactly"}
    exactly = request["exactly"]
    if isinstance(exactly, dict):
        out.update(exactly)
    return out
