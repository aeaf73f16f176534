"""Fields a disabled feature gate drops on write, with the keep-if-already-in-use rule.

Ports ``dropDisabledFields`` of the resource.k8s.io strategies in k8s.io/kubernetes
pkg/registry/resource: resourceslice/strategy.go, resourceclaim/strategy.go,
resourceclaimtemplate/strategy.go and deviceclass/strategy.go (and, for 1.31's v1alpha3,
the DRAControlPlaneController fields of the release-1.31 strategies). The strategies run in
PrepareForCreate / PrepareForUpdate, before validation, so a dropped field is silently gone:
no error, no warning. A gated field already set in the stored object is kept on update (the
``...FeatureInUse(old)`` checks), so turning a gate off never breaks unrelated updates.

The functions take the object in the version it was written in (``version``) and change it
in place; ``old`` is the stored object shown in the same version (None on create).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .cluster import DRA_EXTENDED_RESOURCE, known_gates
from .context import (
    DRA_ADMIN_ACCESS,
    DRA_CONSUMABLE_CAPACITY,
    DRA_CONTROL_PLANE_CONTROLLER,
    DRA_DEVICE_BINDING_CONDITIONS,
    DRA_DEVICE_TAINTS,
    DRA_PARTITIONABLE_DEVICES,
    DRA_PRIORITIZED_LIST,
    DRA_RESOURCE_CLAIM_DEVICE_STATUS,
    Cluster,
)

Obj = dict[str, Any]
_WRAPPED = ("v1beta1", "v1alpha3")


def _dict(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _devices(obj: Obj | None, version: str) -> Iterator[Obj]:
    # The field holders of every device: v1beta1 (and v1alpha3) keep them under ``basic``.
    for device in _list(_dict(_dict(obj).get("spec")).get("devices")):
        body = _dict(device).get("basic") if version in _WRAPPED else device
        if isinstance(body, dict):
            yield body


def _claim_spec(obj: Obj | None, kind: str) -> Obj:
    spec = _dict(_dict(obj).get("spec"))
    return _dict(spec.get("spec")) if kind == "ResourceClaimTemplate" else spec


def _requests(spec: Obj) -> list[Obj]:
    return [r for r in _list(_dict(spec.get("devices")).get("requests")) if isinstance(r, dict)]


def _exact(spec: Obj, version: str) -> Iterator[Obj]:
    # The single-device request bodies: flat in v1beta1, under ``exactly`` in v1/v1beta2.
    for request in _requests(spec):
        body = request if version in _WRAPPED else request.get("exactly")
        if isinstance(body, dict):
            yield body


def _subrequests(spec: Obj) -> Iterator[Obj]:
    for request in _requests(spec):
        yield from (s for s in _list(request.get("firstAvailable")) if isinstance(s, dict))


def _results(obj: Obj | None) -> list[Obj]:
    allocation = _dict(_dict(_dict(obj).get("status")).get("allocation"))
    return [
        r for r in _list(_dict(allocation.get("devices")).get("results")) if isinstance(r, dict)
    ]


def _has(holders: Any, *fields: str) -> bool:
    # Go's "!= nil" / "len(...) > 0" on the listed fields of any holder.
    return any(h.get(f) not in (None, [], {}) for h in holders for f in fields)


def _pop(holders: Any, *fields: str) -> None:
    for holder in holders:
        for field_name in fields:
            holder.pop(field_name, None)


def _off(cluster: Cluster, *gates: str) -> bool:
    # A gate the release does not know guards nothing there (the field is either ungated,
    # like v1alpha3's adminAccess in 1.31, or absent from that release's schema).
    known = known_gates(cluster.minor)
    return any(g in known and not cluster.enabled(g) for g in gates)


# -- ResourceSlice (resourceslice/strategy.go) ---------------------------------------------
_SLICE_PARTITIONABLE_DEVICE = ("consumesCounters", "nodeName", "nodeSelector", "allNodes")
_BINDING_FIELDS = ("bindingConditions", "bindingFailureConditions", "bindsToNode")


def drop_slice_fields(cluster: Cluster, version: str, new: Obj, old: Obj | None) -> None:
    """ResourceSlice dropDisabledFields: taints (DRADeviceTaints); sharedCounters,
    perDeviceNodeSelection and per-device consumesCounters/nodeName/nodeSelector/allNodes
    (DRAPartitionableDevices); bindsToNode/bindingConditions/bindingFailureConditions
    (DRADeviceBindingConditions and DRAResourceClaimDeviceStatus); allowMultipleAllocations
    and capacity requestPolicy (DRAConsumableCapacity).
    """
    spec = _dict(new.get("spec"))
    if _off(cluster, DRA_DEVICE_TAINTS) and not _has(_devices(old, version), "taints"):
        _pop(_devices(new, version), "taints")
    old_spec = _dict(_dict(old).get("spec"))
    if _off(cluster, DRA_PARTITIONABLE_DEVICES) and not (
        _has([old_spec], "sharedCounters")
        or old_spec.get("perDeviceNodeSelection") is not None
        or any(
            d.get(f) is not None
            for d in _devices(old, version)
            for f in _SLICE_PARTITIONABLE_DEVICE[1:]
        )
        or _has(_devices(old, version), "consumesCounters")
    ):
        _pop([spec], "sharedCounters", "perDeviceNodeSelection")
        _pop(_devices(new, version), *_SLICE_PARTITIONABLE_DEVICE)
    if _off(cluster, DRA_DEVICE_BINDING_CONDITIONS, DRA_RESOURCE_CLAIM_DEVICE_STATUS) and not _has(
        _devices(old, version), *_BINDING_FIELDS
    ):
        _pop(_devices(new, version), *_BINDING_FIELDS)
    if _off(cluster, DRA_CONSUMABLE_CAPACITY) and not _slice_consumable_in_use(old, version):
        for device in _devices(new, version):
            device.pop("allowMultipleAllocations", None)
            _pop(
                (c for c in _dict(device.get("capacity")).values() if isinstance(c, dict)),
                "requestPolicy",
            )


def _slice_consumable_in_use(old: Obj | None, version: str) -> bool:
    for device in _devices(old, version):
        if device.get("allowMultipleAllocations") is not None:
            return True
        if any(
            _dict(c).get("requestPolicy") is not None
            for c in _dict(device.get("capacity")).values()
        ):
            return True
    return False


# -- ResourceClaim and ResourceClaimTemplate specs -----------------------------------------
def _drop_claim_spec(
    cluster: Cluster,
    version: str,
    kind: str,
    new: Obj,
    old: Obj | None,
    old_results: list[Obj],
    new_results: list[Obj],
) -> None:
    spec, old_spec = _claim_spec(new, kind), _claim_spec(old, kind)
    if _off(cluster, DRA_PRIORITIZED_LIST) and not _has(_requests(old_spec), "firstAvailable"):
        _pop(_requests(spec), "firstAvailable")
    if _off(cluster, DRA_ADMIN_ACCESS) and not (
        any(r.get("adminAccess") is not None for r in _exact(old_spec, version))
        or any(r.get("adminAccess") is not None for r in old_results)
    ):
        _pop(_exact(spec, version), "adminAccess")
        _pop(new_results, "adminAccess")
    if _off(cluster, DRA_DEVICE_TAINTS) and not (
        _has(_exact(old_spec, version), "tolerations")
        or _has(_subrequests(old_spec), "tolerations")
        or _has(old_results, "tolerations")
    ):
        _pop(_exact(spec, version), "tolerations")
        _pop(_subrequests(spec), "tolerations")
        _pop(new_results, "tolerations")
    constraints = [
        c for c in _list(_dict(spec.get("devices")).get("constraints")) if isinstance(c, dict)
    ]
    old_constraints = [
        c for c in _list(_dict(old_spec.get("devices")).get("constraints")) if isinstance(c, dict)
    ]
    if _off(cluster, DRA_CONSUMABLE_CAPACITY) and not (
        any(r.get("capacity") is not None for r in _exact(old_spec, version))
        or any(s.get("capacity") is not None for s in _subrequests(old_spec))
        or any(c.get("distinctAttribute") is not None for c in old_constraints)
        or any(
            r.get("shareID") is not None or r.get("consumedCapacity") is not None
            for r in old_results
        )
        or any(
            _dict(d).get("shareID") is not None
            for d in _list(_dict(_dict(old).get("status")).get("devices"))
        )
    ):
        _pop(_exact(spec, version), "capacity")
        _pop(_subrequests(spec), "capacity")
        _pop(constraints, "distinctAttribute")
        _pop(new_results, "shareID", "consumedCapacity")
        _pop(
            (d for d in _list(_dict(new.get("status")).get("devices")) if isinstance(d, dict)),
            "shareID",
        )
    if _off(cluster, DRA_CONTROL_PLANE_CONTROLLER) and not old_spec.get("controller"):
        # release-1.31 resourceclaim(template)/strategy.go dropDisabledDRAControlPlaneController
        spec.pop("controller", None)


def drop_claim_fields(cluster: Cluster, version: str, new: Obj, old: Obj | None) -> None:
    """ResourceClaim dropDisabledFields: firstAvailable (DRAPrioritizedList); adminAccess of
    requests and results (DRAAdminAccess); tolerations of requests, subrequests and results
    (DRADeviceTaints); status.devices (DRAResourceClaimDeviceStatus); bindingConditions and
    bindingFailureConditions of results (DRADeviceBindingConditions and
    DRAResourceClaimDeviceStatus); capacity, distinctAttribute, shareID and consumedCapacity
    (DRAConsumableCapacity); on v1alpha3 spec.controller, status.allocation.controller and
    status.deallocationRequested (DRAControlPlaneController).
    """
    new_results, old_results = _results(new), _results(old)
    _drop_claim_spec(cluster, version, "ResourceClaim", new, old, old_results, new_results)
    status = _dict(new.get("status"))
    old_status = _dict(_dict(old).get("status"))
    if _off(cluster, DRA_RESOURCE_CLAIM_DEVICE_STATUS) and not _has([old_status], "devices"):
        status.pop("devices", None)
    if _off(cluster, DRA_DEVICE_BINDING_CONDITIONS, DRA_RESOURCE_CLAIM_DEVICE_STATUS) and not _has(
        old_results, "bindingConditions", "bindingFailureConditions"
    ):
        _pop(new_results, "bindingConditions", "bindingFailureConditions")
    if _off(cluster, DRA_CONTROL_PLANE_CONTROLLER):
        if not _dict(old_status.get("allocation")).get("controller"):
            _dict(status.get("allocation")).pop("controller", None)
        if not old_status.get("deallocationRequested"):
            status.pop("deallocationRequested", None)


def drop_template_fields(cluster: Cluster, version: str, new: Obj, old: Obj | None) -> None:
    """ResourceClaimTemplate dropDisabledFields: the claim spec rules of
    :func:`drop_claim_fields` applied to spec.spec (templates have no status).
    """
    _drop_claim_spec(cluster, version, "ResourceClaimTemplate", new, old, [], [])


def drop_class_fields(cluster: Cluster, version: str, new: Obj, old: Obj | None) -> None:
    """DeviceClass dropDisabledFields: spec.extendedResourceName (DRAExtendedResource); on
    v1alpha3 spec.suitableNodes (DRAControlPlaneController, release-1.31).
    """
    spec, old_spec = _dict(new.get("spec")), _dict(_dict(old).get("spec"))
    if _off(cluster, DRA_EXTENDED_RESOURCE) and old_spec.get("extendedResourceName") is None:
        spec.pop("extendedResourceName", None)
    if _off(cluster, DRA_CONTROL_PLANE_CONTROLLER) and old_spec.get("suitableNodes") is None:
        spec.pop("suitableNodes", None)


DROPPERS: dict[str, Callable[[Cluster, str, Obj, Obj | None], None]] = {
    "resourceslices": drop_slice_fields,
    "resourceclaims": drop_claim_fields,
    "resourceclaimtemplates": drop_template_fields,
    "deviceclasses": drop_class_fields,
}


def drop_disabled_fields(
    cluster: Cluster, plural: str, version: str, new: Obj, old: Obj | None
) -> None:
    """Apply the resource.k8s.io strategy of ``plural`` (no-op for other resources)."""
    dropper = DROPPERS.get(plural)
    if dropper is not None:
        dropper(cluster, version, new, old)
