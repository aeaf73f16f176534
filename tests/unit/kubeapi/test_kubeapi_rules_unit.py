"""The resource.k8s.io and coordination.k8s.io write rules as pure functions: node selectors,
claim, class and template specs with CEL, claim status, the classic v1alpha3 rules of 1.31,
Leases, and the places where the emulator must be no stricter than the real server.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fabric_dra_sim.kubeapi import cel_check, dra, dra_claims, leases, nodeselector
from fabric_dra_sim.kubeapi.context import DRA_ADMIN_ACCESS, Cluster, RuleContext

DRIVER = "fabric.example.com"


def ctx(
    version: str = "v1",
    old: dict[str, Any] | None = None,
    *,
    status_write: bool = False,
    gates: frozenset[str] = frozenset(),
    labels: dict[str, str] | None = None,
    minor: int = 34,
) -> RuleContext:
    return RuleContext(Cluster(minor, gates), version, old, status_write, labels or {})


def fields(causes: list[Any]) -> list[str]:
    return [c.field for c in causes]


def requirement(
    key: str = "fabric-dra.io/rack", operator: str = "In", values: list[str] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values is not None:
        out["values"] = values
    return out


def selector(*expressions: dict[str, Any], match_fields: list[Any] | None = None) -> dict[str, Any]:
    term: dict[str, Any] = {"matchExpressions": list(expressions)}
    if match_fields is not None:
        term["matchFields"] = match_fields
    return {"nodeSelectorTerms": [term]}


# -- node selectors ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("req", "bad_field"),
    [
        (requirement(values=["r1"]), None),
        (requirement(operator="NotIn", values=["r1", "r2"]), None),
        (requirement(operator="Exists"), None),
        (requirement(operator="DoesNotExist"), None),
        (requirement(operator="Gt", values=["3"]), None),
        (requirement(operator="In", values=[]), "values"),
        (requirement(operator="Exists", values=["x"]), "values"),
        (requirement(operator="Lt", values=["1", "2"]), "values"),
        (requirement(operator="Near", values=["x"]), "operator"),
        (requirement(key="bad key!", values=["x"]), "key"),
        (requirement(key="Bad_Prefix/rack", values=["x"]), "key"),
        (requirement(values=["not a label value"]), "values[0]"),
    ],
)
def test_node_selector_requirements(req: dict[str, Any], bad_field: str | None) -> None:
    causes = nodeselector.node_selector_causes(selector(req), "f")
    expected = (
        [] if bad_field is None else [f"f.nodeSelectorTerms[0].matchExpressions[0].{bad_field}"]
    )
    assert fields(causes) == expected


def test_values_are_checked_as_label_values_only_in_the_newer_rules() -> None:
    sel = selector(requirement(values=["not a label value"]))
    assert nodeselector.node_selector_causes(sel, "f", label_values=False) == []


@pytest.mark.parametrize(
    ("req", "bad_fields"),
    [
        ({"key": "metadata.name", "operator": "In", "values": ["node-1"]}, []),
        ({"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}, []),
        ({"key": "metadata.name", "operator": "In", "values": ["a", "b"]}, ["values"]),
        ({"key": "metadata.name", "operator": "Exists"}, ["operator"]),
        ({"key": "spec.unschedulable", "operator": "In", "values": ["x"]}, ["key"]),
        ({"key": "metadata.name", "operator": "In", "values": ["Node_1"]}, ["values[0]"]),
    ],
)
def test_match_fields_only_on_metadata_name_with_one_value(
    req: dict[str, Any], bad_fields: list[str]
) -> None:
    causes = nodeselector.node_selector_causes(selector(match_fields=[req]), "f")
    assert fields(causes) == [f"f.nodeSelectorTerms[0].matchFields[0].{b}" for b in bad_fields]


def test_a_selector_needs_a_term() -> None:
    assert fields(nodeselector.node_selector_causes({"nodeSelectorTerms": []}, "f")) == [
        "f.nodeSelectorTerms"
    ]


# -- ResourceSlices -----------------------------------------------------------------------------
def slice_obj(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "driver": DRIVER,
        "devices": [{"name": "d0"}],
        "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
    }
    base.update(spec)
    return {"spec": base}


def test_slice_node_selector_is_validated_as_a_core_node_selector() -> None:
    obj = slice_obj(nodeSelector=selector(requirement(key="bad key", values=["r1"])))
    assert fields(dra.resource_slice_causes(obj, ctx())) == [
        "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].key"
    ]


def test_per_device_node_selector_is_validated() -> None:
    obj = slice_obj(
        perDeviceNodeSelection=True,
        devices=[{"name": "d0", "nodeSelector": selector(requirement(operator="In", values=[]))}],
    )
    assert fields(dra.resource_slice_causes(obj, ctx())) == [
        "spec.devices[0].nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values"
    ]


def test_uppercase_driver_names_are_accepted_with_the_real_servers_warning() -> None:
    rule_ctx = ctx()
    assert (
        dra.resource_slice_causes(slice_obj(driver="Fabric.Example.com", allNodes=True), rule_ctx)
        == []
    )
    assert rule_ctx.warnings == [
        "spec.driver: driver names should be lowercase; "
        '"Fabric.Example.com" contains uppercase characters'
    ]
    assert fields(
        dra.resource_slice_causes(slice_obj(driver="fabric_example", allNodes=True), ctx())
    ) == ["spec.driver"]


def test_binding_conditions_do_not_require_binds_to_node() -> None:
    obj = slice_obj(
        allNodes=True,
        devices=[
            {
                "name": "d0",
                "bindingConditions": ["example.com/attached"],
                "bindingFailureConditions": ["example.com/failed"],
            }
        ],
    )
    assert dra.resource_slice_causes(obj, ctx()) == []


def test_a_v1alpha3_device_without_basic_is_refused() -> None:
    obj = {
        "spec": {
            "driver": DRIVER,
            "nodeName": "n1",
            "devices": [{"name": "d0"}],
            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
        }
    }
    assert fields(dra.resource_slice_causes(obj, ctx("v1alpha3"))) == ["spec.devices[0].basic"]


def test_v1alpha3_slices_get_the_131_rules_and_no_warning() -> None:
    rule_ctx = ctx("v1alpha3")
    obj = {
        "spec": {
            "driver": "Fabric.example.com",
            "devices": [{"name": "d0", "basic": {}}],
            "nodeSelector": selector(requirement(values=["not a label value"])),
            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
        }
    }
    assert dra.resource_slice_causes(obj, rule_ctx) == []
    assert rule_ctx.warnings == []


# -- claim, class and template specs --------------------------------------------------------------
def claim(*requests: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": list(requests), **devices}},
    }


def exact(name: str = "gpu", **fields_: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gpu", **fields_}}


def cel(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


def test_a_valid_claim_has_no_causes() -> None:
    obj = claim(
        exact(
            selectors=[cel(f'device.driver == "{DRIVER}"')],
            tolerations=[
                {"key": "example.com/broken", "operator": "Exists", "effect": "NoSchedule"}
            ],
        ),
        {
            "name": "any",
            "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu"},
                {"name": "small", "deviceClassName": "gpu", "count": 2},
            ],
        },
        constraints=[{"requests": ["gpu", "any/big"], "matchAttribute": "example.com/rack"}],
        config=[{"requests": ["any"], "opaque": {"driver": DRIVER, "parameters": {"a": 1}}}],
    )
    assert dra_claims.resource_claim_causes(obj, ctx()) == []


def test_cel_syntax_and_type_errors_carry_the_compilers_message() -> None:
    causes = dra_claims.resource_claim_causes(
        claim(exact(selectors=[cel("device.driver =="), cel("1 + 2")])), ctx()
    )
    assert fields(causes) == [
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
        "spec.devices.requests[0].exactly.selectors[1].cel.expression",
    ]
    assert causes[0].reason == "FieldValueInvalid"
    assert "Syntax error" in causes[0].message
    assert "must evaluate to bool" in causes[1].message


def test_compiled_expressions_are_cached_by_text() -> None:
    checker = cel_check.CelChecker()
    assert checker.error("device.driver == 'a'") == ""
    assert checker.error("device.driver ==") != ""
    environment = checker._env
    assert checker.error("device.driver == 'a'") == ""
    assert checker._env is environment
    assert set(checker.results) == {"device.driver == 'a'", "device.driver =="}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (claim(*[exact(f"r{i}") for i in range(33)]), ["spec.devices.requests"]),
        (
            claim(exact(selectors=[cel("true")] * 33)),
            ["spec.devices.requests[0].exactly.selectors"],
        ),
        (claim(exact(allocationMode="All", count=2)), ["spec.devices.requests[0].exactly.count"]),
        (claim(exact(allocationMode="Some")), ["spec.devices.requests[0].exactly.allocationMode"]),
        (claim(exact(count=-1)), ["spec.devices.requests[0].exactly.count"]),
        (
            claim({"name": "gpu", "exactly": {"deviceClassName": "Not_A_Class"}}),
            ["spec.devices.requests[0].exactly.deviceClassName"],
        ),
        (
            claim({"name": "gpu", "exactly": {}}),
            ["spec.devices.requests[0].exactly.deviceClassName"],
        ),
        (claim({"name": "gpu"}), ["spec.devices.requests[0]"]),
        (claim(exact(), exact()), ["spec.devices.requests[1]"]),
        (
            claim(exact(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}])),
            ["spec.devices.requests[0].exactly.tolerations[0].value"],
        ),
        (
            claim(exact(tolerations=[{"key": "k", "operator": "Near"}])),
            ["spec.devices.requests[0].exactly.tolerations[0].operator"],
        ),
        (
            claim(exact(tolerations=[{"key": "k", "operator": "Exists", "effect": "Later"}])),
            ["spec.devices.requests[0].exactly.tolerations[0].effect"],
        ),
        (
            claim(exact(tolerations=[{"key": "bad key", "operator": "Exists"}])),
            ["spec.devices.requests[0].exactly.tolerations[0].key"],
        ),
        (
            claim(exact(tolerations=[{"key": "k", "operator": "Equal", "value": "not valid"}])),
            ["spec.devices.requests[0].exactly.tolerations[0].value"],
        ),
        (
            claim(exact(), constraints=[{"matchAttribute": "rack"}]),
            ["spec.devices.constraints[0].matchAttribute"],
        ),
        (
            claim(
                exact(), constraints=[{"requests": ["nope"], "matchAttribute": "example.com/rack"}]
            ),
            ["spec.devices.constraints[0].requests[0]"],
        ),
        (claim(exact(), constraints=[{}]), ["spec.devices.constraints[0].matchAttribute"]),
        (
            claim(
                exact(),
                config=[{"requests": ["gpu/sub"], "opaque": {"driver": DRIVER, "parameters": {}}}],
            ),
            ["spec.devices.config[0].requests[0]"],
        ),
        (claim(exact(), config=[{}]), ["spec.devices.config[0].opaque"]),
        (
            claim({"name": "any", "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}] * 2}),
            ["spec.devices.requests[0].firstAvailable[1]"],
        ),
    ],
)
def test_claim_spec_rules(obj: dict[str, Any], expected: list[str]) -> None:
    assert fields(dra_claims.resource_claim_causes(obj, ctx())) == expected


def test_v1beta1_requests_are_flat() -> None:
    obj = claim({"name": "gpu", "deviceClassName": "gpu", "selectors": [cel("oops(")]})
    assert fields(dra_claims.resource_claim_causes(obj, ctx("v1beta1"))) == [
        "spec.devices.requests[0].selectors[0].cel.expression"
    ]


def test_admin_access_needs_the_namespace_label_and_the_gate() -> None:
    obj = claim(exact(adminAccess=True))
    on = frozenset({DRA_ADMIN_ACCESS})
    causes = dra_claims.resource_claim_causes(obj, ctx(gates=on))
    assert fields(causes) == ["spec.devices.requests[0].exactly.adminAccess"]
    assert "resource.kubernetes.io/admin-access: true" in causes[0].message
    labelled = {"resource.kubernetes.io/admin-access": "true"}
    assert dra_claims.resource_claim_causes(obj, ctx(gates=on, labels=labelled)) == []
    assert dra_claims.resource_claim_causes(obj, ctx()) == []


def test_claim_spec_is_immutable() -> None:
    old = claim(exact())
    new = claim(exact(count=2))
    assert fields(dra_claims.resource_claim_causes(new, ctx(old=old))) == ["spec"]
    assert dra_claims.resource_claim_causes(copy.deepcopy(old), ctx(old=old)) == []


def test_template_metadata_and_embedded_spec() -> None:
    obj = {
        "spec": {
            "metadata": {"labels": {"bad key": "v", "ok": "not valid!"}, "name": "x"},
            "spec": {
                "devices": {
                    "requests": [exact(count=0, allocationMode="All", selectors=[cel("x ==")])]
                }
            },
        }
    }
    assert fields(dra_claims.resource_claim_template_causes(obj, ctx())) == [
        "spec.metadata.labels",
        "spec.metadata.labels",
        "spec.metadata.name",
        "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression",
    ]


def test_device_class_selectors_compile_unless_unchanged() -> None:
    obj = {"spec": {"selectors": [cel("device.driver ==")]}}
    assert fields(dra_claims.device_class_causes(obj, ctx())) == [
        "spec.selectors[0].cel.expression"
    ]
    assert dra_claims.device_class_causes(obj, ctx(old=copy.deepcopy(obj))) == []
    many = {"spec": {"selectors": [cel("true")] * 33}}
    assert fields(dra_claims.device_class_causes(many, ctx())) == ["spec.selectors"]


# -- claim status ------------------------------------------------------------------------------
def result(request: str = "gpu", device: str = "d0", **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": "p", "device": device, **extra}


def allocated(*results: dict[str, Any], **allocation: Any) -> dict[str, Any]:
    return {"devices": {"results": list(results or [result()])}, **allocation}


def status_causes(
    status: dict[str, Any],
    old_status: dict[str, Any] | None = None,
    obj: dict[str, Any] | None = None,
    version: str = "v1",
) -> list[Any]:
    base = obj or claim(
        exact(), {"name": "any", "firstAvailable": [{"name": "big", "deviceClassName": "gpu"}]}
    )
    new = {**copy.deepcopy(base), "status": status}
    old = {**copy.deepcopy(base), "status": old_status or {}}
    return dra_claims.resource_claim_status_causes(new, ctx(version, old, status_write=True))


@pytest.mark.parametrize(
    ("allocation", "expected"),
    [
        (allocated(result(), result("any/big", "d1")), []),
        (allocated(result("nope")), ["status.allocation.devices.results[0].request"]),
        (allocated(result("any/small")), ["status.allocation.devices.results[0].request"]),
        (allocated(result("gpu/x")), ["status.allocation.devices.results[0].request"]),
        (allocated(result(device="GPU_0")), ["status.allocation.devices.results[0].device"]),
        (
            allocated({**result(), "driver": "bad_driver"}),
            ["status.allocation.devices.results[0].driver"],
        ),
        (allocated({**result(), "pool": "a//b"}), ["status.allocation.devices.results[0].pool"]),
        (
            allocated(nodeSelector=selector(requirement(key="bad key", values=["x"]))),
            ["status.allocation.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].key"],
        ),
        (allocated(), []),
        (
            {
                "devices": {
                    "results": [result()],
                    "config": [
                        {"source": "FromSomewhere", "opaque": {"driver": DRIVER, "parameters": {}}}
                    ],
                }
            },
            ["status.allocation.devices.config[0].source"],
        ),
        (
            {
                "devices": {
                    "results": [result()],
                    "config": [
                        {
                            "source": "FromClaim",
                            "requests": ["nope"],
                            "opaque": {"driver": DRIVER, "parameters": {}},
                        }
                    ],
                }
            },
            ["status.allocation.devices.config[0].requests[0]"],
        ),
        ({"devices": {"results": [result()] * 33}}, ["status.allocation.devices.results"]),
    ],
)
def test_new_allocation_rules(allocation: dict[str, Any], expected: list[str]) -> None:
    assert fields(status_causes({"allocation": allocation})) == expected


def test_status_devices_must_be_allocated() -> None:
    entry = {"driver": DRIVER, "pool": "p", "device": "d9"}
    assert fields(status_causes({"allocation": allocated(), "devices": [entry]})) == [
        "status.devices[0]"
    ]


def test_reserved_for_limit_and_no_new_entries_once_deleted() -> None:
    many = [{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(257)]
    assert fields(status_causes({"allocation": allocated(), "reservedFor": many})) == [
        "status.reservedFor"
    ]
    deleted = claim(exact())
    deleted["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    old = {"allocation": allocated(), "reservedFor": many[:2]}
    grown = {"allocation": allocated(), "reservedFor": many[:3]}
    assert fields(status_causes(grown, old, deleted)) == ["status.reservedFor"]
    shrunk = {"allocation": allocated(), "reservedFor": many[:1]}
    assert status_causes(shrunk, old, deleted) == []
    assert status_causes(grown, old) == []


def test_allocation_is_immutable_and_cleared_as_a_whole() -> None:
    old = {"allocation": allocated()}
    assert fields(status_causes({"allocation": allocated(result(device="d1"))}, old)) == [
        "status.allocation"
    ]
    assert status_causes({}, old) == []
    assert status_causes(copy.deepcopy(old), old) == []


def test_admin_access_in_a_new_allocation_needs_the_label() -> None:
    obj = claim(exact())
    new = {**obj, "status": {"allocation": allocated(result(adminAccess=True))}}
    causes = dra_claims.resource_claim_status_causes(
        new, ctx(old=obj, status_write=True, gates=frozenset({DRA_ADMIN_ACCESS}))
    )
    assert fields(causes) == ["status.allocation.devices.results[0].adminAccess"]


def test_deallocated_device_status_is_dropped_before_validation() -> None:
    entry = {"driver": DRIVER, "pool": "p", "device": "d0"}
    old = {"status": {"allocation": allocated(), "devices": [entry]}}
    new = {"status": {"allocation": allocated(result(device="d1")), "devices": [entry]}}
    dra_claims.drop_deallocated_status_devices(new, old)
    assert "devices" not in new["status"]


# -- classic v1alpha3 (1.31) -----------------------------------------------------------------------
def classic_claim(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "c"},
        "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu"}]}, **spec},
    }


def classic_allocation(**extra: Any) -> dict[str, Any]:
    return {"devices": {"results": [result()]}, "controller": DRIVER, **extra}


CONSUMER = {"resource": "pods", "name": "p", "uid": "u1"}


@pytest.mark.parametrize(
    ("status", "old_status", "expected"),
    [
        ({"allocation": classic_allocation(), "deallocationRequested": True}, None, []),
        ({"deallocationRequested": True}, None, ["status"]),
        (
            {
                "allocation": classic_allocation(),
                "reservedFor": [CONSUMER],
                "deallocationRequested": True,
            },
            None,
            ["status.reservedFor", "status.deallocationRequested"],
        ),
        (
            {"allocation": classic_allocation()},
            {"allocation": classic_allocation(), "deallocationRequested": True},
            ["status.deallocationRequested"],
        ),
        ({}, {"allocation": classic_allocation(), "deallocationRequested": True}, []),
        (
            {
                "allocation": classic_allocation(),
                "deallocationRequested": True,
                "reservedFor": [CONSUMER, {**CONSUMER, "uid": "u2"}],
            },
            {
                "allocation": classic_allocation(),
                "deallocationRequested": True,
                "reservedFor": [CONSUMER],
            },
            ["status.reservedFor"],
        ),
        (
            {"allocation": classic_allocation(controller="Bad_Controller")},
            None,
            ["status.allocation.controller"],
        ),
        (
            {"allocation": classic_allocation(), "reservedFor": [CONSUMER, CONSUMER]},
            None,
            ["status.reservedFor[1].uid"],
        ),
    ],
)
def test_classic_status_rules(
    status: dict[str, Any], old_status: dict[str, Any] | None, expected: list[str]
) -> None:
    assert fields(status_causes(status, old_status, classic_claim(), "v1alpha3")) == expected


def test_classic_selectors_have_no_length_limit() -> None:
    long_expression = "true || " * 1400 + "true"
    obj = classic_claim()
    obj["spec"]["devices"]["requests"][0]["selectors"] = [cel(long_expression)]
    assert dra_claims.resource_claim_causes(obj, ctx("v1alpha3")) == []
    modern = claim(exact(selectors=[cel(long_expression)]))
    assert [c.reason for c in dra_claims.resource_claim_causes(modern, ctx())] == [
        "FieldValueTooLong"
    ]


def test_classic_spec_controller_and_request_rules() -> None:
    assert fields(
        dra_claims.resource_claim_causes(
            classic_claim(controller="Bad_Controller"), ctx("v1alpha3")
        )
    ) == ["spec.controller"]
    obj = classic_claim()
    obj["spec"]["devices"]["requests"].append({"name": "gpu", "deviceClassName": "gpu"})
    assert fields(dra_claims.resource_claim_causes(obj, ctx("v1alpha3"))) == [
        "spec.devices.requests[1].name"
    ]


def test_classic_scheduling_context_checks_only_what_131_checks() -> None:
    spec_ctx = ctx("v1alpha3")
    assert (
        dra_claims.pod_scheduling_context_causes(
            {"spec": {"selectedNode": "Not_A_Node", "potentialNodes": ["n1"]}}, spec_ctx
        )
        == []
    )
    too_many = dra_claims.pod_scheduling_context_causes(
        {"spec": {"potentialNodes": [f"n{i}" for i in range(129)]}}, spec_ctx
    )
    assert [(c.field, c.reason) for c in too_many] == [("spec.potentialNodes", "FieldValueTooLong")]
    status = {
        "status": {
            "resourceClaims": [
                {"name": "gpu", "unsuitableNodes": [f"n{i}" for i in range(129)]},
                {},
            ]
        }
    }
    assert fields(
        dra_claims.pod_scheduling_context_causes(status, ctx("v1alpha3", status_write=True))
    ) == ["status.claims[0].unsuitableNodes"]


# -- Leases -------------------------------------------------------------------------------------
COORDINATED = frozenset({leases.COORDINATED_LEADER_ELECTION})


@pytest.mark.parametrize(
    ("spec", "gates", "expected"),
    [
        (
            {
                "holderIdentity": "anything at all",
                "leaseDurationSeconds": 15,
                "leaseTransitions": 0,
            },
            frozenset(),
            [],
        ),
        ({"leaseDurationSeconds": 0}, frozenset(), ["spec.leaseDurationSeconds"]),
        ({"leaseTransitions": -1}, frozenset(), ["spec.leaseTransitions"]),
        ({"strategy": "Newest"}, COORDINATED, ["spec.strategy.strategy"]),
        ({"strategy": "OldestEmulationVersion"}, COORDINATED, []),
        ({"strategy": "example.com/mine"}, COORDINATED, []),
        ({"preferredHolder": "me"}, COORDINATED, ["spec.preferredHolder"]),
        ({"strategy": "Newest", "preferredHolder": "me"}, frozenset(), []),
    ],
)
def test_lease_rules(spec: dict[str, Any], gates: frozenset[str], expected: list[str]) -> None:
    assert fields(leases.lease_causes({"spec": spec}, ctx("", gates=gates))) == expected
