"""Fields a disabled feature gate drops on write, and the keep-if-already-in-use rule
(pkg/registry/resource/*/strategy.go dropDisabledFields)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fabric_dra_sim.kubeapi.cluster import DRA_EXTENDED_RESOURCE, build_cluster
from fabric_dra_sim.kubeapi.context import (
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
from fabric_dra_sim.kubeapi.field_gates import drop_disabled_fields

BINDING = {
    "bindsToNode": True,
    "bindingConditions": ["example.com/ready"],
    "bindingFailureConditions": ["example.com/failed"],
}
TAINTS = {"taints": [{"key": "k", "effect": "NoSchedule"}]}
PARTITIONABLE_DEVICE = {"consumesCounters": [{"counterSet": "c", "counters": {}}], "nodeName": "n1"}
CONSUMABLE = {
    "allowMultipleAllocations": True,
    "capacity": {"memory": {"value": "8Gi", "requestPolicy": {"default": "1Gi"}}},
}


def on(*gates: str) -> Cluster:
    """Kubernetes 1.34 with exactly ``gates`` on among the DRA gates."""
    return Cluster(34, frozenset(gates))


ALL = on(
    DRA_ADMIN_ACCESS,
    DRA_CONSUMABLE_CAPACITY,
    DRA_DEVICE_BINDING_CONDITIONS,
    DRA_DEVICE_TAINTS,
    DRA_PARTITIONABLE_DEVICES,
    DRA_PRIORITIZED_LIST,
    DRA_RESOURCE_CLAIM_DEVICE_STATUS,
    DRA_EXTENDED_RESOURCE,
)


def resource_slice(version: str = "v1", **device: Any) -> dict[str, Any]:
    body = {"name": "d0", "attributes": {"m": {"string": "x"}}, **device}
    if version == "v1beta1":
        body = {"name": "d0", "basic": {k: v for k, v in body.items() if k != "name"}}
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "spec": {"driver": "d.example.com", "devices": [body]},
    }


def device_of(obj: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    device: dict[str, Any] = obj["spec"]["devices"][0]
    return device["basic"] if version == "v1beta1" else device


def without(cluster: Cluster, *gates: str) -> Cluster:
    return Cluster(cluster.minor, cluster.gates - set(gates))


@pytest.mark.parametrize(
    ("gates", "fields", "dropped"),
    [
        ((DRA_DEVICE_TAINTS,), TAINTS, {"taints"}),
        ((DRA_DEVICE_BINDING_CONDITIONS,), BINDING, set(BINDING)),
        # Binding conditions need DRAResourceClaimDeviceStatus too.
        ((DRA_RESOURCE_CLAIM_DEVICE_STATUS,), BINDING, set(BINDING)),
        ((DRA_PARTITIONABLE_DEVICES,), PARTITIONABLE_DEVICE, set(PARTITIONABLE_DEVICE)),
        ((DRA_CONSUMABLE_CAPACITY,), CONSUMABLE, {"allowMultipleAllocations"}),
    ],
)
@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_a_disabled_gate_drops_its_slice_fields_on_create(
    gates: tuple[str, ...],
    fields: dict[str, Any],
    dropped: set[str],
    version: str,
) -> None:
    new = resource_slice(version, **copy.deepcopy(fields))
    drop_disabled_fields(without(ALL, *gates), "resourceslices", version, new, None)
    device = device_of(new, version)
    assert not dropped & set(device)
    assert device["attributes"] == {"m": {"string": "x"}}
    kept = resource_slice(version, **copy.deepcopy(fields))
    drop_disabled_fields(ALL, "resourceslices", version, kept, None)
    assert set(fields) <= set(device_of(kept, version))


def test_consumable_capacity_drops_request_policy_but_keeps_the_value() -> None:
    new = resource_slice(**copy.deepcopy(CONSUMABLE))
    drop_disabled_fields(without(ALL, DRA_CONSUMABLE_CAPACITY), "resourceslices", "v1", new, None)
    assert device_of(new)["capacity"] == {"memory": {"value": "8Gi"}}


def test_partitionable_devices_drop_shared_counters_and_per_device_node_selection() -> None:
    new = resource_slice()
    new["spec"].update({"sharedCounters": [{"name": "c"}], "perDeviceNodeSelection": True})
    drop_disabled_fields(without(ALL, DRA_PARTITIONABLE_DEVICES), "resourceslices", "v1", new, None)
    assert "sharedCounters" not in new["spec"]
    assert "perDeviceNodeSelection" not in new["spec"]


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_a_slice_field_already_in_use_is_kept_on_update_with_the_gate_off(version: str) -> None:
    old = resource_slice(version, **TAINTS, **BINDING)
    new = resource_slice(version, **TAINTS, **BINDING)
    device_of(new, version)["attributes"] = {"m": {"string": "changed"}}
    drop_disabled_fields(on(), "resourceslices", version, new, old)
    assert {"taints", *BINDING} <= set(device_of(new, version))
    # Without the field in the stored object, the same update loses it.
    fresh = resource_slice(version, **TAINTS)
    drop_disabled_fields(on(), "resourceslices", version, fresh, resource_slice(version))
    assert "taints" not in device_of(fresh, version)


def claim(version: str = "v1", **exact: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "r"}
    body = {"deviceClassName": "gpu", **exact}
    if version == "v1beta1":
        request.update(body)
    else:
        request["exactly"] = body
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "spec": {"devices": {"requests": [request]}},
    }


def exact_of(obj: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    request: dict[str, Any] = obj["spec"]["devices"]["requests"][0]
    return request if version == "v1beta1" else request["exactly"]


RESULT = {"request": "r", "driver": "d", "pool": "p", "device": "x"}


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_claim_spec_fields_go_with_their_gates(version: str) -> None:
    new = claim(
        version,
        adminAccess=True,
        tolerations=[{"operator": "Exists"}],
        capacity={"requests": {"m": "1Gi"}},
    )
    new["spec"]["devices"]["requests"].append(
        {
            "name": "p",
            "firstAvailable": [
                {"name": "a", "deviceClassName": "gpu", "tolerations": [{"operator": "Exists"}]}
            ],
        }
    )
    new["spec"]["devices"]["constraints"] = [{"distinctAttribute": "d.example.com/x"}]
    drop_disabled_fields(on(), "resourceclaims", version, new, None)
    assert set(exact_of(new, version)) - {"name"} == {"deviceClassName"}
    assert new["spec"]["devices"]["requests"][1] == {"name": "p"}
    assert new["spec"]["devices"]["constraints"] == [{}]


def test_claim_status_fields_go_with_their_gates_unless_in_use() -> None:
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        **RESULT,
                        "adminAccess": True,
                        "tolerations": [{"operator": "Exists"}],
                        "bindingConditions": ["c"],
                        "bindingFailureConditions": ["f"],
                        "shareID": "s",
                        "consumedCapacity": {"m": "1"},
                    }
                ]
            }
        },
        "devices": [{"driver": "d", "pool": "p", "device": "x", "shareID": "s"}],
    }
    new = {**claim(), "status": copy.deepcopy(status)}
    drop_disabled_fields(on(), "resourceclaims", "v1", new, claim())
    assert new["status"] == {"allocation": {"devices": {"results": [RESULT]}}}
    in_use = {**claim(), "status": copy.deepcopy(status)}
    drop_disabled_fields(
        on(), "resourceclaims", "v1", in_use, {**claim(), "status": copy.deepcopy(status)}
    )
    assert in_use["status"] == status


def test_binding_conditions_of_results_need_device_status_too() -> None:
    results = [{**RESULT, "bindingConditions": ["c"], "bindingFailureConditions": ["f"]}]
    new = {**claim(), "status": {"allocation": {"devices": {"results": results}}}}
    drop_disabled_fields(
        without(ALL, DRA_RESOURCE_CLAIM_DEVICE_STATUS), "resourceclaims", "v1", new, claim()
    )
    assert new["status"]["allocation"]["devices"]["results"] == [RESULT]


def test_admin_access_in_use_keeps_later_admin_access_results() -> None:
    # "adding a status with AdminAccess=true is allowed" once the spec used it.
    old = claim(adminAccess=True)
    new = {
        **claim(adminAccess=True),
        "status": {"allocation": {"devices": {"results": [{**RESULT, "adminAccess": True}]}}},
    }
    drop_disabled_fields(on(), "resourceclaims", "v1", new, old)
    assert new["status"]["allocation"]["devices"]["results"][0]["adminAccess"] is True
    assert exact_of(new)["adminAccess"] is True


def test_templates_drop_the_claim_spec_fields_of_spec_spec() -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "spec": {"spec": claim(adminAccess=True, tolerations=[])["spec"]},
    }
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"operator": "Exists"}
    ]
    drop_disabled_fields(on(DRA_ADMIN_ACCESS), "resourceclaimtemplates", "v1", template, None)
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu",
        "adminAccess": True,
    }


def test_device_class_extended_resource_name_goes_with_its_gate() -> None:
    new = {"spec": {"selectors": [], "extendedResourceName": "example.com/gpu"}}
    drop_disabled_fields(on(), "deviceclasses", "v1", new, None)
    assert new == {"spec": {"selectors": []}}
    kept = {"spec": {"extendedResourceName": "example.com/gpu"}}
    drop_disabled_fields(on(), "deviceclasses", "v1", kept, copy.deepcopy(kept))
    assert kept["spec"]["extendedResourceName"] == "example.com/gpu"


def test_classic_fields_follow_the_control_plane_controller_gate_on_1_31() -> None:
    classic_on = build_cluster("1.31")
    classic_off = build_cluster("1.31", {DRA_CONTROL_PLANE_CONTROLLER: False})
    body = {
        "spec": {
            "controller": "d.example.com",
            "devices": {"requests": [{"name": "r", "deviceClassName": "gpu", "adminAccess": True}]},
        },
        "status": {"deallocationRequested": True, "allocation": {"controller": "d"}},
    }
    kept = copy.deepcopy(body)
    drop_disabled_fields(classic_on, "resourceclaims", "v1alpha3", kept, None)
    assert kept == body
    dropped = copy.deepcopy(body)
    drop_disabled_fields(classic_off, "resourceclaims", "v1alpha3", dropped, None)
    # 1.31 has no DRAAdminAccess gate: adminAccess is ungated there and stays.
    assert dropped == {"spec": {"devices": body["spec"]["devices"]}, "status": {"allocation": {}}}
    device_class = {"spec": {"suitableNodes": {"nodeSelectorTerms": []}}}
    drop_disabled_fields(classic_off, "deviceclasses", "v1alpha3", device_class, None)
    assert device_class == {"spec": {}}


def test_other_resources_are_left_alone() -> None:
    pod = {"spec": {"taints": [1]}}
    drop_disabled_fields(on(), "pods", "v1", pod, None)
    assert pod == {"spec": {"taints": [1]}}
