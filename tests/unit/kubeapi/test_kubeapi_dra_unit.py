"""The Go-side resource.k8s.io rules as pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from fabric_dra_sim.kubeapi import dra, dra_claims
from fabric_dra_sim.kubeapi.context import Cluster, RuleContext
from fabric_dra_sim.kubeapi.names import SEMVER_RE


def ctx(
    version: str = "v1", old: dict[str, Any] | None = None, status_write: bool = False
) -> RuleContext:
    return RuleContext(Cluster(34, frozenset()), version, old, status_write)


def valid_slice(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "driver": "fabric.example.com",
        "pool": {"name": "a/b", "generation": 0, "resourceSliceCount": 1},
        "devices": [{"name": "d0"}],
    }
    base.update(spec)
    return {"spec": base}


def fields(causes: list[Any]) -> list[str]:
    return [c.field for c in causes]


@pytest.mark.parametrize(
    "selection",
    [
        {"allNodes": True},
        {"nodeName": "n1"},
        {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": []}]}},
        {"perDeviceNodeSelection": True, "devices": [{"name": "d0", "nodeName": "n1"}]},
    ],
)
def test_each_node_selection_alone_is_valid(selection: dict[str, Any]) -> None:
    assert dra.resource_slice_causes(valid_slice(**selection), ctx("v1")) == []


def test_v1alpha3_treats_empty_node_name_and_false_all_nodes_as_unset() -> None:
    obj = {
        "spec": {
            "driver": "fabric.example.com",
            "nodeName": "",
            "allNodes": True,
            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": "d0", "basic": {}}],
        }
    }
    assert dra.resource_slice_causes(obj, ctx("v1alpha3")) == []
    assert "spec.nodeName" in fields(dra.resource_slice_causes(obj, ctx("v1beta1")))


def test_per_device_selection_requires_one_choice_per_device() -> None:
    obj = valid_slice(perDeviceNodeSelection=True)
    assert fields(dra.resource_slice_causes(obj, ctx("v1"))) == ["spec.devices[0]"]


def test_list_typed_attributes_lower_the_device_limit_to_64() -> None:
    devices: list[dict[str, Any]] = [{"name": f"d{i}"} for i in range(65)]
    devices[3]["attributes"] = {"ids": {"ints": [1, 2]}}
    obj = valid_slice(allNodes=True, devices=devices)
    assert fields(dra.resource_slice_causes(obj, ctx("v1"))) == ["spec.devices"]
    assert dra.resource_slice_causes(valid_slice(allNodes=True, devices=devices[:64]), ctx()) == []


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("model", True),
        ("_x9", True),
        ("example.com/model", True),
        ("a" * 32, True),
        ("a" * 33, False),
        ("9lives", False),
        ("bad-id", False),
        ("/x", False),
        ("Example.com/x", True),
        ("exa_mple.com/x", False),
        ("a" * 64 + "/x", False),
        ("example.com/", False),
    ],
)
def test_qualified_attribute_names(name: str, ok: bool) -> None:
    assert (dra.qualified_name_causes(name, "f") == []) is ok


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("1.0.0", True),
        ("1.2.3-rc.1+build.7", True),
        ("0.0.1-alpha", True),
        ("1.2", False),
        ("01.2.3", False),
        ("1.2.3-", False),
        ("v1.2.3", False),
    ],
)
def test_semver(version: str, ok: bool) -> None:
    assert bool(SEMVER_RE.match(version)) is ok


@pytest.mark.parametrize(
    ("pool", "ok"),
    [
        ("a", True),
        ("us-east/rack-1", True),
        ("a.b/c.d/e", True),
        ("a" * 253, True),
        ("", False),
        ("a//b", False),
        ("/a", False),
        ("A/b", False),
        ("a" * 254, False),
    ],
)
def test_pool_names(pool: str, ok: bool) -> None:
    assert (dra.pool_name_causes(pool, "f") == []) is ok


def test_update_rules_report_each_immutable_field() -> None:
    old = valid_slice(nodeName="n1")
    new = valid_slice(
        nodeName="n2",
        driver="other.example.com",
        pool={"name": "x", "generation": 1, "resourceSliceCount": 1},
    )
    assert {"spec.driver", "spec.pool.name", "spec.nodeName"} <= set(
        fields(dra.resource_slice_causes(new, ctx(old=old)))
    )


def test_claim_status_rules() -> None:
    allocation = {
        "devices": {
            "results": [
                {"request": "r", "driver": "fabric.example.com", "pool": "p", "device": "d0"}
            ]
        }
    }
    good: dict[str, Any] = {
        "allocation": allocation,
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
        "devices": [
            {
                "driver": "fabric.example.com",
                "pool": "p",
                "device": "d0",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Ok",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
                "data": {"a": 1},
            }
        ],
    }
    spec = {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "c"}}]}}

    def status_causes(status: dict[str, Any], old: dict[str, Any] | None) -> list[Any]:
        return dra_claims.resource_claim_status_causes(
            {"spec": spec, "status": status},
            ctx(old={"spec": spec, "status": old or {}}, status_write=True),
        )

    assert status_causes(good, None) == []
    assert status_causes({}, good) == []
    bad_data = {**good, "devices": [{**good["devices"][0], "data": [1]}]}
    assert fields(status_causes(bad_data, None)) == ["status.devices[0].data"]
    changed: dict[str, Any] = {"allocation": {"devices": {"results": []}}}
    assert fields(status_causes(changed, good)) == ["status.allocation"]


def test_device_class_opaque_parameters_must_be_an_object() -> None:
    obj = {"spec": {"config": [{"opaque": {"driver": "fabric.example.com", "parameters": "text"}}]}}
    assert fields(dra_claims.device_class_causes(obj, ctx())) == [
        "spec.config[0].opaque.parameters"
    ]


def test_pod_scheduling_context_node_lists() -> None:
    ok = {
        "spec": {"selectedNode": "n1", "potentialNodes": ["n1", "n2"]},
        "status": {"resourceClaims": [{"name": "gpu", "unsuitableNodes": ["n2"]}]},
    }
    for status_write in (False, True):
        assert (
            dra_claims.pod_scheduling_context_causes(ok, ctx("v1alpha3", status_write=status_write))
            == []
        )
    bad = {
        "spec": {"potentialNodes": [f"n{i}" for i in range(129)]},
        "status": {
            "resourceClaims": [{"name": "gpu", "unsuitableNodes": ["a", "a"]}, {"name": "gpu"}]
        },
    }
    # 1.31 reports the status entries under status.claims.
    assert fields(dra_claims.pod_scheduling_context_causes(bad, ctx("v1alpha3"))) == [
        "spec.potentialNodes"
    ]
    assert fields(
        dra_claims.pod_scheduling_context_causes(bad, ctx("v1alpha3", status_write=True))
    ) == ["status.claims[0].unsuitableNodes[1]", "status.claims[1]"]
