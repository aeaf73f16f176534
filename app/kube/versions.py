"""resource.k8s.io version choice and shape conversion at the API edge.

The rest of the controller sees ONE shape: the resource.k8s.io/v1 JSON dict. This module picks
the version the API server should be spoken to in (from discovery) and converts objects between
that version's wire shape and the v1 shape, as pure functions on JSON dicts (use
``ApiClient.sanitize_for_serialization`` first when holding a model object).

Shape differences (Kubernetes ``staging/src/k8s.io/api/resource/<version>/types.go``):

* v1beta2 and v1 have identical JSON; only ``apiVersion`` differs.
* v1beta1 (1.32) and v1alpha3 (1.31): each ResourceSlice device keeps ``name`` at the top and
  every other field under ``basic``; a ResourceClaim request carries the exact-request fields
  (``deviceClassName``, ``selectors``, ``allocationMode``, ``count``, ``adminAccess``,
  ``tolerations``) directly instead of under ``exactly``.
* v1alpha3 (1.31) capacity values are plain quantities (``"16Gi"``), not ``{"value": "16Gi"}``.
* DeviceClass JSON is the same in every version.

Fields one version lacks are passed through untouched; the API server decides about them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from kubernetes_asyncio.client import ApiClient, ResourceApi

from app.jsontypes import JsonDict, json_copy
from app.kube.errors import KubeError, KubeNotFound, KubeVersionError, translate_error

GROUP = "resource.k8s.io"


class ResourceApiVersion(StrEnum):
    """A version of the resource.k8s.io API group."""

    V1 = "v1"
    V1BETA2 = "v1beta2"
    V1BETA1 = "v1beta1"
    V1ALPHA3 = "v1alpha3"

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` string of objects in this version, e.g. ``resource.k8s.io/v1``."""
        return f"{GROUP}/{self.value}"


# Structured-parameters mode, most preferred first (DRA-REFERENCE.md, "Versions").
STRUCTURED_PREFERENCE: tuple[ResourceApiVersion, ...] = (
    ResourceApiVersion.V1,
    ResourceApiVersion.V1BETA2,
    ResourceApiVersion.V1BETA1,
)
# Classic DRA (spec.controller, PodSchedulingContext) exists only in v1alpha3 (Kubernetes 1.31).
CONTROL_PLANE_PREFERENCE: tuple[ResourceApiVersion, ...] = (ResourceApiVersion.V1ALPHA3,)

# Versions whose devices sit under "basic" and whose requests are flat.
_WRAPPED_DEVICE_VERSIONS = frozenset({ResourceApiVersion.V1BETA1, ResourceApiVersion.V1ALPHA3})


def choose_version(served: Iterable[str], *, control_plane: bool = False) -> ResourceApiVersion:
    """Pick the resource.k8s.io version to use from the versions a server serves.

    Args:
        served: version names from discovery (``["v1", "v1beta1"]``); unknown names are ignored.
        control_plane: True for the classic-DRA control-plane mode, which needs v1alpha3;
            otherwise v1 is preferred, then v1beta2, then v1beta1, and v1alpha3 is never chosen.

    Raises:
        KubeVersionError: none of the served versions fits the mode; the message names them.
    """
    served_list = list(served)
    preference = CONTROL_PLANE_PREFERENCE if control_plane else STRUCTURED_PREFERENCE
    for candidate in preference:
        if candidate.value in served_list:
            return candidate
    mode = "the control-plane (classic DRA) mode" if control_plane else "structured parameters"
    shown = ", ".join(served_list) if served_list else "no version"
    wanted = " or ".join(v.value for v in preference)
    raise KubeVersionError(f"{GROUP}: the API server serves {shown}; {mode} needs {wanted}")


async def discover_served_versions(api_client: ApiClient) -> list[str]:
    """Return the resource.k8s.io versions the server serves (``GET /apis/resource.k8s.io``).

    Raises:
        KubeVersionError: the server does not serve the resource.k8s.io group at all.
        KubeError: the discovery call failed (temporary ones are retryable).
    """
    what = f"discover {GROUP}"
    try:
        group = await ResourceApi(api_client).get_api_group()
    except Exception as err:
        translated = translate_error(err, what)
        if isinstance(translated, KubeNotFound):
            raise KubeVersionError(
                f"{GROUP}: the API server does not serve this group (DRA is off or too old)"
            ) from err
        raise translated from err
    versions = [v.version for v in (group.versions or []) if getattr(v, "version", None)]
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
        raise KubeError(f"{what}: unreadable discovery answer")
    return versions


async def discover_version(
    api_client: ApiClient, *, control_plane: bool = False
) -> ResourceApiVersion:
    """Discover the served resource.k8s.io versions and choose one (see :func:`choose_version`).

    Raises:
        KubeVersionError: nothing fits the mode, or the group is not served.
        KubeError: the discovery call failed.
    """
    return choose_version(await discover_served_versions(api_client), control_plane=control_plane)


# --------------------------------------------------------------------------- helpers
def _with_api_version(obj: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    result = json_copy(dict(obj))
    if "apiVersion" in result:
        result["apiVersion"] = version.api_version
    return result


def _v1_api_version(obj: JsonDict) -> None:
    if "apiVersion" in obj:
        obj["apiVersion"] = ResourceApiVersion.V1.api_version


def _device_to_wrapped(device: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    basic = {k: v for k, v in device.items() if k != "name"}
    if version is ResourceApiVersion.V1ALPHA3 and isinstance(basic.get("capacity"), Mapping):
        basic["capacity"] = {
            name: (entry["value"] if isinstance(entry, Mapping) and "value" in entry else entry)
            for name, entry in basic["capacity"].items()
        }
    wrapped: JsonDict = {}
    if "name" in device:
        wrapped["name"] = device["name"]
    wrapped["basic"] = basic
    return wrapped


def _device_from_wrapped(device: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    if "basic" not in device or not isinstance(device["basic"], Mapping):
        return dict(device)
    flat: JsonDict = {k: v for k, v in device.items() if k != "basic"}
    basic = dict(device["basic"])
    if version is ResourceApiVersion.V1ALPHA3 and isinstance(basic.get("capacity"), Mapping):
        basic["capacity"] = {
            name: (entry if isinstance(entry, Mapping) else {"value": entry})
            for name, entry in basic["capacity"].items()
        }
    flat.update(basic)
    return flat


def _map_devices(obj: JsonDict, convert: Any, version: ResourceApiVersion) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("devices"), list):
        spec["devices"] = [
            convert(d, version) if isinstance(d, Mapping) else d for d in spec["devices"]
        ]


def _request_to_flat(request: Mapping[str, Any]) -> JsonDict:
    if not isinstance(request.get("exactly"), Mapping):
        return dict(request)
    flat: JsonDict = {k: v for k, v in request.items() if k != "exactly"}
    flat.update(request["exactly"])
    return flat


def _request_from_flat(request: Mapping[str, Any]) -> JsonDict:
    # A request is either "firstAvailable" (same shape everywhere) or an exact request whose
    # fields were flattened into it.
    if "firstAvailable" in request or "exactly" in request:
        return dict(request)
    nested: JsonDict = {}
    if "name" in request:
        nested["name"] = request["name"]
    nested["exactly"] = {k: v for k, v in request.items() if k != "name"}
    return nested


def _map_requests(spec: Any, convert: Any) -> None:
    if not isinstance(spec, dict):
        return
    devices = spec.get("devices")
    if isinstance(devices, dict) and isinstance(devices.get("requests"), list):
        devices["requests"] = [
            convert(r) if isinstance(r, Mapping) else r for r in devices["requests"]
        ]


# --------------------------------------------------------------------------- ResourceSlice
def slice_to_wire(obj_v1: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    """Convert a ResourceSlice from the v1 dict shape to ``version``'s wire shape.

    Pure: returns a new dict; ``apiVersion`` is rewritten when present.
    """
    result = _with_api_version(obj_v1, version)
    if version in _WRAPPED_DEVICE_VERSIONS:
        _map_devices(result, _device_to_wrapped, version)
    return result


def slice_from_wire(obj: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    """Convert a ResourceSlice in ``version``'s wire shape to the v1 dict shape.

    Pure: returns a new dict; ``apiVersion`` becomes ``resource.k8s.io/v1`` when present.
    """
    result = json_copy(dict(obj))
    _v1_api_version(result)
    if version in _WRAPPED_DEVICE_VERSIONS:
        _map_devices(result, _device_from_wrapped, version)
    return result


# --------------------------------------------------------------------------- ResourceClaim
def claim_to_wire(obj_v1: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    """Convert a ResourceClaim from the v1 dict shape to ``version``'s wire shape.

    Only ``spec.devices.requests[]`` differ: v1beta1 and v1alpha3 carry the ``exactly`` fields
    directly on the request. Status (allocation results, devices) has the same JSON.

    Returns a new dict that shares every part but ``spec`` with ``obj_v1`` (it is meant to be
    sent, not changed): a claim is written on every attach and detach, and copying its status
    each time would cost more than the rest of the conversion.
    """
    result = dict(obj_v1)
    if "apiVersion" in result:
        result["apiVersion"] = version.api_version
    if version in _WRAPPED_DEVICE_VERSIONS:
        result["spec"] = json_copy(result.get("spec"))
        _map_requests(result.get("spec"), _request_to_flat)
    return result


def claim_from_wire(
    obj: Mapping[str, Any], version: ResourceApiVersion, *, owned: bool = False
) -> JsonDict:
    """Convert a ResourceClaim in ``version``'s wire shape to the v1 dict shape.

    Args:
        owned: ``obj`` is a dict nobody else holds (just decoded from an answer or a watch
            event): it is converted in place and returned, without a copy.
    """
    result = obj if owned and isinstance(obj, dict) else json_copy(dict(obj))
    _v1_api_version(result)
    if version in _WRAPPED_DEVICE_VERSIONS:
        _map_requests(result.get("spec"), _request_from_flat)
    return result


def claim_template_to_wire(obj_v1: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    """Convert a ResourceClaimTemplate (claim spec under ``spec.spec``) to the wire shape."""
    result = _with_api_version(obj_v1, version)
    if version in _WRAPPED_DEVICE_VERSIONS and isinstance(result.get("spec"), dict):
        _map_requests(result["spec"].get("spec"), _request_to_flat)
    return result


def claim_template_from_wire(obj: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    """Convert a ResourceClaimTemplate in ``version``'s wire shape to the v1 dict shape."""
    result = json_copy(dict(obj))
    _v1_api_version(result)
    if version in _WRAPPED_DEVICE_VERSIONS and isinstance(result.get("spec"), dict):
        _map_requests(result["spec"].get("spec"), _request_from_flat)
    return result


# --------------------------------------------------------------------------- DeviceClass
def device_class_to_wire(obj_v1: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    """Convert a DeviceClass from the v1 dict shape to ``version`` (only ``apiVersion``)."""
    return _with_api_version(obj_v1, version)


def device_class_from_wire(obj: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    """Convert a DeviceClass in ``version``'s wire shape to the v1 dict shape."""
    del version  # same JSON in every version
    result = json_copy(dict(obj))
    _v1_api_version(result)
    return result


_FROM_WIRE = {
    "ResourceSlice": slice_from_wire,
    "ResourceClaim": claim_from_wire,
    "ResourceClaimTemplate": claim_template_from_wire,
    "DeviceClass": device_class_from_wire,
}
_TO_WIRE = {
    "ResourceSlice": slice_to_wire,
    "ResourceClaim": claim_to_wire,
    "ResourceClaimTemplate": claim_template_to_wire,
    "DeviceClass": device_class_to_wire,
}


def from_wire(kind: str, obj: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    """Convert any supported resource.k8s.io object of ``kind`` to the v1 shape.

    Kinds without a shape difference (e.g. PodSchedulingContext) are deep-copied unchanged.
    """
    convert = _FROM_WIRE.get(kind)
    return convert(obj, version) if convert else json_copy(dict(obj))


def to_wire(kind: str, obj_v1: Mapping[str, Any], version: ResourceApiVersion) -> JsonDict:
    """Convert any supported resource.k8s.io object of ``kind`` from the v1 shape to ``version``.

    Kinds without a shape difference are deep-copied with ``apiVersion`` rewritten.
    """
    convert = _TO_WIRE.get(kind)
    return convert(obj_v1, version) if convert else _with_api_version(obj_v1, version)


def resource_api(api_client: ApiClient, version: ResourceApiVersion) -> Any:
    """The typed kubernetes-asyncio API object for ``version`` of resource.k8s.io.

    Returns an instance of ``ResourceV1Api``, ``ResourceV1beta2Api``, ``ResourceV1beta1Api`` or
    ``ResourceV1alpha3Api`` bound to ``api_client``. (The v1alpha3 class of kubernetes-asyncio
    36 lacks the classic-DRA claim calls; the control-plane mode calls those paths directly.)
    """
    from kubernetes_asyncio import client as k8s

    classes = {
        ResourceApiVersion.V1: k8s.ResourceV1Api,
        ResourceApiVersion.V1BETA2: k8s.ResourceV1beta2Api,
        ResourceApiVersion.V1BETA1: k8s.ResourceV1beta1Api,
        ResourceApiVersion.V1ALPHA3: k8s.ResourceV1alpha3Api,
    }
    return classes[version](api_client)


class ResourceSliceV1alpha3Api:
    """The ResourceSlice calls of resource.k8s.io/v1alpha3 (Kubernetes 1.31), with the names
    and arguments of the typed APIs (``list_resource_slice``, ``read_resource_slice``,
    ``create_resource_slice``, ``replace_resource_slice``, ``delete_resource_slice``).

    kubernetes-asyncio 36's ``ResourceV1alpha3Api`` has no ResourceSlice calls (it serves the
    newer v1alpha3 kinds only), so these go through the custom-objects API, which speaks the
    same REST paths.
    """

    PLURAL = "resourceslices"

    def __init__(self, api_client: ApiClient) -> None:
        from kubernetes_asyncio.client import CustomObjectsApi

        self._api = CustomObjectsApi(api_client)
        self._where = (GROUP, ResourceApiVersion.V1ALPHA3.value, self.PLURAL)

    def list_resource_slice(self, **kwargs: Any) -> Any:
        """List (or, with ``watch=True``, watch) ResourceSlices."""
        return self._api.list_cluster_custom_object(*self._where, **kwargs)

    def read_resource_slice(self, name: str, **kwargs: Any) -> Any:
        """Read one ResourceSlice."""
        return self._api.get_cluster_custom_object(*self._where, name, **kwargs)

    def create_resource_slice(self, body: Any, **kwargs: Any) -> Any:
        """Create a ResourceSlice."""
        return self._api.create_cluster_custom_object(*self._where, body, **kwargs)

    def replace_resource_slice(self, name: str, body: Any, **kwargs: Any) -> Any:
        """Replace (PUT) a ResourceSlice."""
        return self._api.replace_cluster_custom_object(*self._where, name, body, **kwargs)

    def delete_resource_slice(self, name: str, **kwargs: Any) -> Any:
        """Delete a ResourceSlice (``body`` may carry DeleteOptions with preconditions)."""
        return self._api.delete_cluster_custom_object(*self._where, name, **kwargs)


def read_claim_call(
    api_client: ApiClient, version: ResourceApiVersion, namespace: str, name: str
) -> Any:
    """The raw-response call that reads ResourceClaim ``namespace/name`` in ``version`` (pass it
    to :func:`app.kube.client.call_json`). v1alpha3 goes through the custom-objects API, as
    :class:`ResourceSliceV1alpha3Api` does: kubernetes-asyncio 36 has no typed call for it."""
    if version is ResourceApiVersion.V1ALPHA3:
        from kubernetes_asyncio.client import CustomObjectsApi

        return CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, version.value, namespace, "resourceclaims", name, _preload_content=False
        )
    return resource_api(api_client, version).read_namespaced_resource_claim(
        name, namespace, _preload_content=False
    )
