"""Conversion between resource.k8s.io v1, v1beta2 and v1beta1 (pkg/apis/resource/v1beta1
conversion.go rules)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric_dra_sim.kubeapi.conversion import EXACT_REQUEST_FIELDS, convert

G = "resource.k8s.io"
NAMES = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)
SCALARS = st.one_of(st.booleans(), st.integers(-5, 5), NAMES)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=2), st.dictionaries(NAMES, inner, max_size=2)),
    max_leaves=4,
)
DEVICE_FIELDS = (
    "attributes",
    "capacity",
    "consumesCounters",
    "nodeName",
    "nodeSelector",
    "allNodes",
    "taints",
    "bindsToNode",
    "bindingConditions",
    "bindingFailureConditions",
    "allowMultipleAllocations",
)


@st.composite
def v1_device(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(st.lists(st.sampled_from(DEVICE_FIELDS), unique=True, max_size=4))
    return {"name": draw(NAMES), **{f: draw(VALUES) for f in fields}}


@st.composite
def v1_request(draw: st.DrawFn) -> dict[str, Any]:
    request: dict[str, Any] = {"name": draw(NAMES)}
    if draw(st.booleans()):
        extra = draw(st.lists(st.sampled_from(EXACT_REQUEST_FIELDS[1:]), unique=True, max_size=3))
        # A valid exactly always names its device class.
        request["exactly"] = {"deviceClassName": draw(NAMES), **{f: draw(VALUES) for f in extra}}
    else:
        request["firstAvailable"] = draw(
            st.lists(
                st.fixed_dictionaries({"name": NAMES, "deviceClassName": NAMES}),
                min_size=1,
                max_size=2,
            )
        )
    return request


def slice_of(devices: list[dict[str, Any]], version: str = "v1") -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": "s", "labels": {"a": "b"}},
        "spec": {
            "driver": "d.example.com",
            "nodeName": "n1",
            "devices": devices,
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
        },
    }


def claim_spec(requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {"devices": {"requests": requests, "constraints": [{"requests": ["x"]}]}}


def claim_of(requests: list[dict[str, Any]], version: str = "v1") -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": claim_spec(requests),
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "r", "driver": "d", "pool": "p", "device": "x"}]
                }
            }
        },
    }


def template_of(requests: list[dict[str, Any]], version: str = "v1") -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{version}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"metadata": {"labels": {"x": "y"}}, "spec": claim_spec(requests)},
    }


OBJECTS = st.one_of(
    st.lists(v1_device(), max_size=3).map(slice_of),
    st.lists(v1_request(), max_size=3).map(claim_of),
    st.lists(v1_request(), max_size=3).map(template_of),
)


@given(OBJECTS)
def test_v1_to_v1beta1_and_back_is_the_identity(obj: dict[str, Any]) -> None:
    before = copy.deepcopy(obj)
    beta1 = convert(obj, "v1beta1")
    assert beta1["apiVersion"] == f"{G}/v1beta1"
    assert convert(beta1, "v1") == obj
    assert obj == before  # the source is never changed


@given(OBJECTS)
def test_v1beta2_is_v1_with_another_api_version(obj: dict[str, Any]) -> None:
    beta2 = convert(obj, "v1beta2")
    assert {**beta2, "apiVersion": obj["apiVersion"]} == obj
    assert convert(convert(obj, "v1beta1"), "v1beta2") == beta2


@given(OBJECTS)
def test_every_path_between_the_three_versions_agrees(obj: dict[str, Any]) -> None:
    for via in ("v1beta2", "v1beta1"):
        for to in ("v1", "v1beta2", "v1beta1"):
            assert convert(convert(obj, via), to) == convert(obj, to)
    assert json.loads(json.dumps(convert(obj, "v1beta1"))) == convert(obj, "v1beta1")


def test_v1beta1_devices_carry_their_fields_under_basic() -> None:
    device = {
        "name": "gpu-0",
        "attributes": {"model": {"string": "a100"}},
        "taints": [{"key": "k", "effect": "NoSchedule"}],
        "bindsToNode": True,
    }
    shown = convert(slice_of([device]), "v1beta1")
    assert shown["spec"]["devices"] == [
        {
            "name": "gpu-0",
            "basic": {
                "attributes": {"model": {"string": "a100"}},
                "taints": [{"key": "k", "effect": "NoSchedule"}],
                "bindsToNode": True,
            },
        }
    ]
    assert shown["spec"]["nodeName"] == "n1"
    assert convert(slice_of([{"name": "bare"}]), "v1beta1")["spec"]["devices"] == [
        {"name": "bare", "basic": {}}
    ]


def test_v1beta1_requests_are_flat_and_exactly_only_when_a_main_field_is_set() -> None:
    flat = {
        "name": "gpu",
        "deviceClassName": "gpu",
        "count": 2,
        "allocationMode": "ExactCount",
        "tolerations": [{"operator": "Exists"}],
        "capacity": {"requests": {"m": "1Gi"}},
    }
    nested = convert(claim_of([flat], "v1beta1"), "v1")["spec"]["devices"]["requests"]
    assert nested == [
        {
            "name": "gpu",
            "exactly": {
                "deviceClassName": "gpu",
                "count": 2,
                "allocationMode": "ExactCount",
                "tolerations": [{"operator": "Exists"}],
                "capacity": {"requests": {"m": "1Gi"}},
            },
        }
    ]
    prioritized = {"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]}
    assert convert(claim_of([prioritized], "v1beta1"), "v1")["spec"]["devices"]["requests"] == [
        prioritized
    ]


def test_status_and_metadata_are_shared_not_copied() -> None:
    claim = claim_of([{"name": "r", "exactly": {"deviceClassName": "gpu"}}])
    shown = convert(claim, "v1beta1")
    assert shown["status"] is claim["status"]
    assert shown["metadata"] is claim["metadata"]
    assert convert(claim, "v1") is claim


def test_device_classes_change_only_their_api_version() -> None:
    device_class = {
        "apiVersion": f"{G}/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": "true"}}]},
    }
    assert convert(device_class, "v1beta1") == {**device_class, "apiVersion": f"{G}/v1beta1"}


def test_v1alpha3_has_no_conversion() -> None:
    with pytest.raises(ValueError, match=r"no conversion between resource\.k8s\.io v1alpha3"):
        convert({"apiVersion": f"{G}/v1alpha3", "kind": "ResourceSlice"}, "v1")
