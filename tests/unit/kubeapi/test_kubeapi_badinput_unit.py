"""Bad input decoded as kube-apiserver decodes it: DeleteOptions bodies, nulls and JSON types
of written objects, body parsing, query integers and booleans, label selector operators and
the v1beta1 request rule that follows conversion.
"""

from __future__ import annotations

from typing import Any

import pytest

from fabric_dra_sim.kubeapi.bodies import JSON, YAML, decode_object
from fabric_dra_sim.kubeapi.cluster import all_gates_on, build_cluster
from fabric_dra_sim.kubeapi.context import RuleContext
from fabric_dra_sim.kubeapi.dra_claims import device_claim_causes
from fabric_dra_sim.kubeapi.errors import StatusError
from fabric_dra_sim.kubeapi.listing import query_bool, query_int
from fabric_dra_sim.kubeapi.options import delete_options
from fabric_dra_sim.kubeapi.resources import RESOURCE_GROUP, served_types
from fabric_dra_sim.kubeapi.selectors import labels_match, parse_label_selector
from fabric_dra_sim.kubeapi.validation import SchemaValidator


def _rt(plural: str, version: str = "v1", group: str = RESOURCE_GROUP) -> Any:
    types = served_types(["v1", "v1beta1"])
    return next(
        t for t in types if t.plural == plural and t.version == version and t.group == group
    )


# -- DeleteOptions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "Pod"},
        {"apiVersion": "v1", "kind": "Pod"},
        {"orphanDependents": "yes"},
        {"dryRun": "All"},
        {"dryRun": [1]},
        {"preconditions": "x"},
        {"preconditions": {"resourceVersion": 3}},
        {"propagationPolicy": 1},
        {"gracePeriodSeconds": "1"},
        {"kind": 5},
        [1],
        "x",
    ],
)
def test_delete_bodies_that_do_not_decode_are_400(body: Any) -> None:
    with pytest.raises(StatusError) as caught:
        delete_options(body, {})
    assert caught.value.code == 400


def test_delete_body_nulls_are_absent_fields_and_any_api_version_is_accepted() -> None:
    options, dry_run = delete_options(
        {
            "apiVersion": "bogus/v9",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": None,
            "dryRun": None,
            "preconditions": {"uid": None, "resourceVersion": "4"},
            "unknownField": 1,
        },
        {},
    )
    assert options == {
        "apiVersion": "bogus/v9",
        "kind": "DeleteOptions",
        "preconditions": {"resourceVersion": "4"},
    }
    assert dry_run is False


def test_delete_dry_run_list_is_still_validated() -> None:
    with pytest.raises(StatusError) as caught:
        delete_options({"dryRun": ["Some"]}, {})
    assert caught.value.code == 422
    assert delete_options({"dryRun": ["All"]}, {})[1] is True


# -- written objects: nulls and types -----------------------------------------------------------


def test_nulls_become_go_zero_values_in_written_objects() -> None:
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "c",
            "labels": {"a": None},
            "annotations": {"b": None},
            "finalizers": [None],
            "ownerReferences": [None],
            "generateName": None,
        },
        "spec": None,
    }
    errors = SchemaValidator("1.34").drop_unknown(_rt("resourceclaims"), claim)
    assert errors == []
    assert claim["metadata"] == {
        "name": "c",
        "labels": {"a": ""},
        "annotations": {"b": ""},
        "finalizers": [""],
        "ownerReferences": [{}],
    }
    assert "spec" not in claim


def test_a_null_struct_map_value_becomes_the_zero_struct() -> None:
    resource_slice: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "devices": [
                {
                    "name": "d",
                    "capacity": {"memory": None},
                    "attributes": {"a": None},
                    "bindingConditions": [None],
                }
            ]
        },
    }
    SchemaValidator("1.34").drop_unknown(_rt("resourceslices"), resource_slice)
    device = resource_slice["spec"]["devices"][0]
    assert device == {
        "name": "d",
        "capacity": {"memory": {}},
        "attributes": {"a": {}},
        "bindingConditions": [""],
    }


@pytest.mark.parametrize(
    ("meta", "field"),
    [
        ({"managedFields": "x"}, "ResourceClaim.metadata.managedFields"),
        ({"labels": {"a": 1}}, "ResourceClaim.metadata.labels.a"),
        ({"finalizers": [True]}, "ResourceClaim.metadata.finalizers"),
    ],
)
def test_wrong_json_types_are_400_before_anything_is_dropped(
    meta: dict[str, Any], field: str
) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", **meta},
    }
    with pytest.raises(StatusError) as caught:
        SchemaValidator("1.34").drop_unknown(_rt("resourceclaims"), claim)
    assert caught.value.code == 400
    assert f"into Go struct field {field} of type" in caught.value.message


# -- body parsing -------------------------------------------------------------------------------


def test_deep_nesting_is_400_exceeded_max_depth() -> None:
    with pytest.raises(StatusError) as caught:
        decode_object(b"[" * 100_000, JSON)
    assert (caught.value.code, caught.value.message) == (
        400,
        "couldn't get version/kind; json parse error: exceeded max depth",
    )


def test_yaml_bodies_decode_as_json_would() -> None:
    value, duplicates = decode_object(b"kind: Pod\nmetadata:\n  name: p\n  ts: 2026-01-01\n", YAML)
    assert value == {"kind": "Pod", "metadata": {"name": "p", "ts": "2026-01-01"}}
    assert duplicates == []
    with pytest.raises(StatusError):
        decode_object(b"a: [", YAML)


# -- query parameters ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["99999999999999999999", "5_0", " 5", "abc", "1.0", "٣"])
def test_query_integers_follow_parse_int(value: str) -> None:
    with pytest.raises(StatusError) as caught:
        query_int("limit", value)
    assert caught.value.code == 400


def test_query_integers_accept_signs_and_empty() -> None:
    assert (query_int("limit", "+5"), query_int("limit", "-5"), query_int("limit", "")) == (
        5,
        -5,
        0,
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        ("0", False),
        ("FALSE", False),
        ("false", False),
        ("", True),
        ("x", True),
        ("True", True),
        ("1", True),
    ],
)
def test_query_booleans_follow_the_parameter_codec(value: str | None, expected: bool) -> None:
    assert query_bool(value) is expected


# -- label selectors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "a>x",
            "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' "
            "operators, the value must be an integer",
        ),
        (
            "\ufffd",
            'unable to parse requirement: key: Invalid value: "\\ufffd": name part must '
            "consist of alphanumeric characters",
        ),
        ("a=-b", 'unable to parse requirement: values[0][a]: Invalid value: "-b"'),
    ],
)
def test_label_selectors_are_validated_as_labels_parse_does(text: str, message: str) -> None:
    with pytest.raises(StatusError) as caught:
        parse_label_selector(text)
    assert caught.value.code == 400
    assert caught.value.message.startswith(message)


def test_greater_and_less_than_compare_integer_labels() -> None:
    greater = parse_label_selector("tier>2")
    less = parse_label_selector("tier<2")
    assert labels_match(greater, {"tier": "5"})
    assert not labels_match(greater, {"tier": "1"})
    assert not labels_match(greater, {"tier": "x"})
    assert not labels_match(greater, {})
    assert labels_match(less, {"tier": "1"})


# -- v1beta1 requests ---------------------------------------------------------------------------


def _ctx(version: str) -> RuleContext:
    return RuleContext(build_cluster("1.34", all_gates_on("1.34")), version, None, False, {}, [])


@pytest.mark.parametrize(
    "extra",
    [
        {"deviceClassName": "gpu"},
        {"count": 1},
        {"selectors": []},
        {"adminAccess": False},
        {"tolerations": []},
        {"allocationMode": "ExactCount"},
    ],
)
def test_v1beta1_request_with_first_available_and_exact_fields_is_refused(
    extra: dict[str, Any],
) -> None:
    spec = {
        "devices": {
            "requests": [
                {"name": "r", **extra, "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]}
            ]
        }
    }
    causes = device_claim_causes(spec, "spec", _ctx("v1beta1"))
    assert [c.field for c in causes] == ["spec.devices.requests[0]"]
    assert "multiple fields are set" in causes[0].message


def test_v1beta1_request_with_only_first_available_or_only_exact_fields_is_accepted() -> None:
    only_subs = {
        "devices": {
            "requests": [
                {
                    "name": "r",
                    "count": 0,
                    "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}],
                }
            ]
        }
    }
    only_exact = {"devices": {"requests": [{"name": "r", "deviceClassName": "gpu"}]}}
    assert device_claim_causes(only_subs, "spec", _ctx("v1beta1")) == []
    assert device_claim_causes(only_exact, "spec", _ctx("v1beta1")) == []
