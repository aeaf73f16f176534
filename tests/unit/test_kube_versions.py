"""resource.k8s.io version choice and the shape conversions at the API edge."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.kube.errors import KubeVersionError
from app.kube.versions import (
    ResourceApiVersion,
    choose_version,
    claim_from_wire,
    claim_template_from_wire,
    claim_template_to_wire,
    claim_to_wire,
    device_class_from_wire,
    device_class_to_wire,
    from_wire,
    slice_from_wire,
    slice_to_wire,
    to_wire,
)

V1 = ResourceApiVersion.V1
V1BETA2 = ResourceApiVersion.V1BETA2
V1BETA1 = ResourceApiVersion.V1BETA1
V1ALPHA3 = ResourceApiVersion.V1ALPHA3


# ----------------------------------------------------------------------------- choice
@pytest.mark.parametrize(
    ("served", "expected"),
    [
        (["v1", "v1beta2", "v1beta1"], V1),
        (["v1beta1", "v1beta2"], V1BETA2),
        (["v1beta1"], V1BETA1),
        (["v1alpha3", "v1beta1"], V1BETA1),
        (["v2", "v1"], V1),
    ],
)
def test_structured_mode_prefers_v1_then_v1beta2_then_v1beta1(
    served: list[str], expected: ResourceApiVersion
) -> None:
    assert choose_version(served) is expected


def test_structured_mode_never_chooses_v1alpha3() -> None:
    with pytest.raises(KubeVersionError, match=r"serves v1alpha3; structured parameters needs"):
        choose_version(["v1alpha3"])


def test_control_plane_mode_chooses_v1alpha3_only() -> None:
    assert choose_version(["v1", "v1alpha3"], control_plane=True) is V1ALPHA3
    with pytest.raises(KubeVersionError, match=r"serves v1, v1beta1; the control-plane"):
        choose_version(["v1", "v1beta1"], control_plane=True)


def test_nothing_served_is_named_in_the_error() -> None:
    with pytest.raises(KubeVersionError, match="serves no version"):
        choose_version([])


def test_api_version_string() -> None:
    assert V1BETA2.api_version == "resource.k8s.io/v1beta2"


# ----------------------------------------------------------------------------- builders
def v1_slice() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s-1", "resourceVersion": "7"},
        "spec": {
            "driver": "fabric.example.com",
            "pool": {"name": "r1/rack-2", "generation": 1, "resourceSliceCount": 1},
            "allNodes": True,
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {"model": {"string": "A100"}},
                    "capacity": {"memory": {"value": "80Gi"}},
                    "bindsToNode": True,
                    "bindingConditions": ["Attached"],
                    "bindingFailureConditions": ["AttachFailed"],
                },
                {"name": "gpu-1"},
            ],
        },
    }


def v1_claim() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "fabric-gpu",
                            "allocationMode": "ExactCount",
                            "count": 2,
                            "selectors": [{"cel": {"expression": "true"}}],
                        },
                    },
                    {
                        "name": "any",
                        "firstAvailable": [{"name": "big", "deviceClassName": "fabric-gpu"}],
                    },
                ],
                "constraints": [{"requests": ["gpu"], "matchAttribute": "fabric.example.com/rack"}],
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": "d", "pool": "p", "device": "gpu-0"}]
                }
            }
        },
    }


# ----------------------------------------------------------------------------- slices
@pytest.mark.parametrize("version", [V1, V1BETA2])
def test_v1_and_v1beta2_slices_differ_only_in_api_version(version: ResourceApiVersion) -> None:
    wire = slice_to_wire(v1_slice(), version)
    expected = v1_slice()
    expected["apiVersion"] = version.api_version
    assert wire == expected


def test_v1beta1_slice_devices_sit_under_basic() -> None:
    wire = slice_to_wire(v1_slice(), V1BETA1)
    assert wire["apiVersion"] == "resource.k8s.io/v1beta1"
    assert wire["spec"]["devices"][0] == {
        "name": "gpu-0",
        "basic": {
            "attributes": {"model": {"string": "A100"}},
            "capacity": {"memory": {"value": "80Gi"}},
            "bindsToNode": True,
            "bindingConditions": ["Attached"],
            "bindingFailureConditions": ["AttachFailed"],
        },
    }
    assert wire["spec"]["devices"][1] == {"name": "gpu-1", "basic": {}}
    assert wire["spec"]["pool"] == v1_slice()["spec"]["pool"]


def test_v1alpha3_slice_capacity_is_a_plain_quantity() -> None:
    wire = slice_to_wire(v1_slice(), V1ALPHA3)
    assert wire["spec"]["devices"][0]["basic"]["capacity"] == {"memory": "80Gi"}
    assert slice_from_wire(wire, V1ALPHA3) == v1_slice()


def test_conversion_does_not_touch_its_input() -> None:
    original = v1_slice()
    snapshot = copy.deepcopy(original)
    wire = slice_to_wire(original, V1BETA1)
    wire["spec"]["devices"][0]["basic"]["attributes"]["model"]["string"] = "changed"
    assert original == snapshot


def test_a_v1beta1_slice_read_from_the_server_becomes_v1() -> None:
    wire = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceSlice",
        "metadata": {"name": "x"},
        "spec": {
            "driver": "d",
            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
            "nodeName": "n1",
            "devices": [{"name": "a", "basic": {"attributes": {"x": {"int": 1}}}}],
        },
    }
    assert slice_from_wire(wire, V1BETA1)["spec"]["devices"] == [
        {"name": "a", "attributes": {"x": {"int": 1}}}
    ]
    assert slice_from_wire(wire, V1BETA1)["apiVersion"] == "resource.k8s.io/v1"


def test_a_slice_without_devices_converts() -> None:
    obj = {"metadata": {"name": "x"}, "spec": {"driver": "d", "sharedCounters": []}}
    assert slice_to_wire(obj, V1BETA1) == obj
    assert slice_from_wire(obj, V1BETA1) == obj


# ----------------------------------------------------------------------------- claims
@pytest.mark.parametrize("version", [V1BETA1, V1ALPHA3])
def test_old_versions_carry_exact_request_fields_on_the_request(
    version: ResourceApiVersion,
) -> None:
    wire = claim_to_wire(v1_claim(), version)
    requests = wire["spec"]["devices"]["requests"]
    assert requests[0] == {
        "name": "gpu",
        "deviceClassName": "fabric-gpu",
        "allocationMode": "ExactCount",
        "count": 2,
        "selectors": [{"cel": {"expression": "true"}}],
    }
    # firstAvailable has the same shape in every version.
    assert requests[1] == v1_claim()["spec"]["devices"]["requests"][1]
    assert wire["status"] == v1_claim()["status"]
    assert claim_from_wire(wire, version) == v1_claim()


@pytest.mark.parametrize("version", [V1, V1BETA2])
def test_v1_and_v1beta2_claims_keep_exactly(version: ResourceApiVersion) -> None:
    wire = claim_to_wire(v1_claim(), version)
    assert wire["spec"] == v1_claim()["spec"]
    assert claim_from_wire(wire, version) == v1_claim()


def test_v1alpha3_controller_field_passes_through() -> None:
    wire = claim_to_wire(v1_claim(), V1ALPHA3)
    wire["spec"]["controller"] = "fabric.example.com"
    back = claim_from_wire(wire, V1ALPHA3)
    assert back["spec"]["controller"] == "fabric.example.com"


def test_claim_templates_convert_their_inner_claim_spec() -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"spec": v1_claim()["spec"]},
    }
    wire = claim_template_to_wire(template, V1BETA1)
    assert wire["spec"]["spec"]["devices"]["requests"][0]["deviceClassName"] == "fabric-gpu"
    assert claim_template_from_wire(wire, V1BETA1) == template


def test_device_classes_change_only_api_version() -> None:
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "fabric-gpu"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'x'"}}]},
    }
    wire = device_class_to_wire(device_class, V1BETA1)
    assert wire["apiVersion"] == "resource.k8s.io/v1beta1"
    assert wire["spec"] == device_class["spec"]
    assert device_class_from_wire(wire, V1BETA1) == device_class


def test_generic_dispatch_by_kind() -> None:
    assert to_wire("ResourceSlice", v1_slice(), V1BETA1) == slice_to_wire(v1_slice(), V1BETA1)
    psc = {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "PodSchedulingContext"}
    assert from_wire("PodSchedulingContext", psc, V1ALPHA3) == psc
    assert to_wire("PodSchedulingContext", psc, V1ALPHA3) == psc


# ----------------------------------------------------------------------------- properties
json_leaf = st.one_of(st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=8))
json_value = st.recursive(
    json_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(min_size=1, max_size=6), children, max_size=3),
    ),
    max_leaves=8,
)
field_name = st.sampled_from(
    [
        "attributes",
        "taints",
        "bindsToNode",
        "bindingConditions",
        "consumesCounters",
        "allowMultipleAllocations",
    ]
)
quantity = st.from_regex(r"[1-9][0-9]{0,3}(Mi|Gi|k)?", fullmatch=True)
device = st.builds(
    lambda name, fields, capacity: {
        "name": name,
        **fields,
        **({"capacity": capacity} if capacity is not None else {}),
    },
    st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
    st.dictionaries(field_name, json_value, max_size=3),
    st.none()
    | st.dictionaries(st.sampled_from(["memory", "cores"]), quantity.map(lambda q: {"value": q})),
)
resource_slice = st.builds(
    lambda devices, name: {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": "d", "pool": {"name": "p"}, "devices": devices},
    },
    st.lists(device, max_size=4),
    st.text(min_size=1, max_size=5),
)
exact_fields = st.fixed_dictionaries(
    {"deviceClassName": st.text(min_size=1, max_size=5)},
    optional={
        "allocationMode": st.sampled_from(["ExactCount", "All"]),
        "count": st.integers(1, 10),
        "adminAccess": st.booleans(),
        "selectors": st.lists(st.builds(lambda e: {"cel": {"expression": e}}, st.text(max_size=5))),
        "tolerations": st.lists(st.fixed_dictionaries({"key": st.text(max_size=4)}), max_size=2),
    },
)
request = st.one_of(
    st.builds(
        lambda n, e: {"name": n, "exactly": e}, st.text(min_size=1, max_size=5), exact_fields
    ),
    st.builds(
        lambda n, subs: {"name": n, "firstAvailable": subs},
        st.text(min_size=1, max_size=5),
        st.lists(exact_fields, min_size=1, max_size=2),
    ),
)
resource_claim = st.builds(
    lambda requests, status: {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "n"},
        "spec": {"devices": {"requests": requests}},
        "status": status,
    },
    st.lists(request, max_size=4),
    st.dictionaries(st.sampled_from(["allocation", "devices", "reservedFor"]), json_value),
)
any_version = st.sampled_from(list(ResourceApiVersion))


@settings(max_examples=200, deadline=None)
@given(resource_slice, any_version)
def test_slices_survive_a_round_trip_through_every_version(
    obj: dict[str, Any], version: ResourceApiVersion
) -> None:
    snapshot = copy.deepcopy(obj)
    wire = slice_to_wire(obj, version)
    assert wire["apiVersion"] == version.api_version
    assert slice_from_wire(wire, version) == obj
    assert obj == snapshot


@settings(max_examples=200, deadline=None)
@given(resource_claim, any_version)
def test_claims_survive_a_round_trip_through_every_version(
    obj: dict[str, Any], version: ResourceApiVersion
) -> None:
    wire = claim_to_wire(obj, version)
    assert claim_from_wire(wire, version) == obj
    # And back again: the wire shape is stable too.
    assert claim_to_wire(claim_from_wire(wire, version), version) == wire


@settings(max_examples=100, deadline=None)
@given(resource_slice)
def test_v1beta1_wire_slices_survive_a_round_trip_from_the_wire_side(obj: dict[str, Any]) -> None:
    wire = slice_to_wire(obj, V1BETA1)
    assert slice_to_wire(slice_from_wire(wire, V1BETA1), V1BETA1) == wire
    assert all(set(d) <= {"name", "basic"} for d in wire["spec"]["devices"])
