"""Strict decoding (fieldValidation) and Warning headers, rule by rule, without HTTP."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.kube.client import WarningLog, parse_warning_header
from fabric_dra_sim.kubeapi.errors import StatusError
from fabric_dra_sim.kubeapi.fieldvalidation import (
    IGNORE,
    STRICT,
    WARN,
    directive,
    go_value,
    json_patch_errors,
    load_yaml,
    parse_json,
    settle,
    settle_apply,
    settle_patch,
    typed_patch_error,
)
from fabric_dra_sim.kubeapi.http import warning_headers
from fabric_dra_sim.kubeapi.resources import RESOURCE_GROUP, served_types
from fabric_dra_sim.kubeapi.validation import SchemaValidator


def _type(plural: str) -> Any:
    return next(
        t for t in served_types(("v1",)) if t.plural == plural and t.group == RESOURCE_GROUP
    )


def _slice(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s1", "labels": {"a": "b"}},
        "spec": {
            "driver": "fabric.example.com",
            "allNodes": True,
            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "a100"}}}],
        },
    }
    body["spec"].update(spec)
    return body


# -- the directive ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, WARN), ("", WARN), ("Warn", WARN), ("Strict", STRICT), ("Ignore", IGNORE)],
)
def test_an_absent_directive_is_warn_and_the_three_values_are_kept(
    value: str | None,
    expected: str,
) -> None:
    assert directive(value) == expected


@pytest.mark.parametrize("verb", ["Create", "Update", "Patch"])
def test_an_unknown_directive_is_422_on_the_verbs_options(verb: str) -> None:
    with pytest.raises(StatusError) as caught:
        directive("strict", verb)
    assert caught.value.code == 422
    assert caught.value.message == (
        f'{verb}Options.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: '
        '"strict": supported values: "", "Ignore", "Strict", "Warn"'
    )


# -- reading duplicate keys ------------------------------------------------------------------


def test_duplicate_json_keys_are_named_by_path_and_the_last_value_wins() -> None:
    value, duplicates = parse_json(
        b'{"spec": {"devices": [{"name": "a", "name": "b"}], "driver": "x"}, '
        b'"spec": {"devices": [{"name": "c", "name": "d", "name": "e"}]}}'
    )
    assert value == {"spec": {"devices": [{"name": "e"}]}}
    assert duplicates == ["spec", "spec.devices[0].name"]


def test_a_document_without_duplicates_reports_none() -> None:
    assert parse_json(b'[{"op": "add"}]') == ([{"op": "add"}], [])


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_the_literals_go_refuses_are_not_json(literal: str) -> None:
    with pytest.raises(ValueError, match="looking for beginning of value"):
        parse_json(f'{{"spec": {{"x": {literal}}}}}'.encode())


def test_duplicate_yaml_keys_are_reported_with_their_line_in_document_order() -> None:
    value, duplicates = load_yaml(b"a: 1\nspec:\n  x: 1\n  x: 2\na: 3\n")
    assert value == {"a": 3, "spec": {"x": 2}}
    assert duplicates == [
        'line 4: key "x" already set in map',
        'line 5: key "a" already set in map',
    ]


# -- unknown fields through the schema -------------------------------------------------------


def test_unknown_fields_are_dropped_exactly_and_reported_in_document_order() -> None:
    schemas = SchemaValidator()
    obj = _slice(colour="red")
    obj["metadata"]["shoeSize"] = 9
    obj["spec"]["pool"]["depth"] = 1
    obj["spec"]["devices"][0]["attributes"]["model"]["int"] = 1
    obj["spec"]["devices"][0]["attributes"]["model"]["float"] = 1.5
    errors = schemas.drop_unknown(_type("resourceslices"), obj, ["spec.driver"])
    assert errors == [
        'unknown field "metadata.shoeSize"',
        'duplicate field "spec.driver"',
        'unknown field "spec.pool.depth"',
        'unknown field "spec.devices[0].attributes.model.float"',
        'unknown field "spec.colour"',
    ]
    # "int" is a DeviceAttribute field; map keys (labels, attribute names) are never unknown.
    assert obj == {
        **_slice(),
        "spec": {
            **_slice()["spec"],
            "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "a100", "int": 1}}}],
        },
    }


def test_a_known_object_is_left_as_it_is() -> None:
    obj = _slice()
    assert SchemaValidator().drop_unknown(_type("resourceslices"), obj) == []
    assert obj == _slice()


def test_free_form_fields_keep_whatever_they_hold() -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}],
                "config": [{"opaque": {"driver": "d", "parameters": {"anything": {"goes": [1]}}}}],
            }
        },
    }
    before = copy.deepcopy(claim)
    assert (
        SchemaValidator().drop_unknown(
            _type("resourceclaims"), claim, ["spec.devices.config[0].opaque.parameters.anything"]
        )
        == []
    )
    assert claim == before


def test_at_most_one_hundred_strict_errors_are_reported_but_all_are_dropped() -> None:
    obj = _slice()
    obj["spec"].update({f"extra{i}": i for i in range(120)})
    errors = SchemaValidator().drop_unknown(_type("resourceslices"), obj)
    assert len(errors) == 100
    assert obj == _slice()


def test_a_wrong_json_type_is_a_400_decode_error() -> None:
    with pytest.raises(StatusError) as caught:
        SchemaValidator().check(_type("resourceslices"), _slice(allNodes="yes"))
    assert caught.value.code == 400
    assert caught.value.message == (
        'ResourceSlice in version "v1" cannot be handled as a ResourceSlice: json: cannot '
        "unmarshal string into Go struct field ResourceSlice.spec.allNodes of type bool"
    )


def test_apply_configurations_name_list_items_by_their_keys() -> None:
    config = {
        "status": {
            "devices": [{"driver": "d", "pool": "p", "device": "x", "colour": 1, "shade": 2}]
        },
        "spec": {"devices": {"requests": [{"name": "r", "size": 3}]}},
        "metadata": {"name": "c"},
    }
    errors = SchemaValidator().apply_unknown(_type("resourceclaims"), config)
    assert errors == [
        '.status.devices[device="x",driver="d",pool="p"].colour: field not declared in schema',
        ".spec.devices.requests[0].size: field not declared in schema",
    ]


def test_the_typed_patch_error_is_a_500_without_reason() -> None:
    err = typed_patch_error(
        "ResourceSlice",
        "resource.k8s.io/v1",
        {"metadata": {"name": "s"}},
        [".spec.a: field not declared in schema", ".metadata.b: field not declared in schema"],
    )
    assert (err.code, err.reason) == (500, "")
    assert err.message == (
        "failed to create typed patch object (/s; resource.k8s.io/v1, Kind=ResourceSlice): "
        "errors:\n  .spec.a: field not declared in schema\n"
        "  .metadata.b: field not declared in schema"
    )
    core = typed_patch_error(
        "Lease",
        "v1",
        {"metadata": {"name": "l", "namespace": "n"}},
        [".spec.x: field not declared in schema"],
    )
    assert core.message.startswith("failed to create typed patch object (n/l; /v1, Kind=Lease)")


# -- what each directive does ----------------------------------------------------------------


def test_strict_fails_warn_warns_and_ignore_passes_silently() -> None:
    errors = ['unknown field "spec.a"', 'duplicate field "spec.b"']
    with pytest.raises(StatusError) as caught:
        settle(errors, STRICT, [])
    assert (caught.value.code, caught.value.message) == (
        400,
        'strict decoding error: unknown field "spec.a", duplicate field "spec.b"',
    )
    warnings: list[str] = []
    settle(errors, WARN, warnings)
    assert warnings == errors
    settle(errors, IGNORE, warnings)
    assert warnings == errors


def test_a_strict_patch_is_422_on_field_patch_with_the_patched_value() -> None:
    with pytest.raises(StatusError) as caught:
        settle_patch(['unknown field "spec.a"'], STRICT, [], '{"spec":{"a":1}}')
    assert caught.value.code == 422
    assert caught.value.message == (
        ' "" is invalid: patch: Invalid value: "{\\"spec\\":{\\"a\\":1}}": strict decoding '
        'error: unknown field "spec.a"'
    )
    assert caught.value.details is not None
    assert caught.value.details["causes"][0]["field"] == "patch"


def test_apply_duplicates_under_strict_carry_the_yaml_message() -> None:
    with pytest.raises(StatusError) as caught:
        settle_apply(['line 3: key "a" already set in map'], STRICT, [])
    assert (caught.value.code, caught.value.message) == (
        400,
        "error strict decoding patch: error converting YAML to JSON: yaml: unmarshal "
        'errors:\n  line 3: key "a" already set in map',
    )
    warnings: list[str] = []
    settle_apply(['line 3: key "a" already set in map'], WARN, warnings)
    assert warnings == ['line 3: key "a" already set in map']


def test_json_patch_operations_have_four_fields() -> None:
    document = [{"op": "add", "path": "/a", "value": 1, "valeu": 2}, {"op": "remove"}]
    assert json_patch_errors(document, ["[1].op"]) == [
        'json patch duplicate field "[1].op"',
        'json patch unknown field "[0].valeu"',
    ]


def test_go_value_prints_maps_sorted_like_fmt() -> None:
    assert go_value({"spec": {"b": [1, "x", None], "a": True, "c": 2.0, "d": 1.5}}) == (
        "map[spec:map[a:true b:[1 x <nil>] c:2 d:1.5]]"
    )


# -- Warning headers -------------------------------------------------------------------------


def test_warning_headers_are_299_quoted_escaped_and_deduplicated() -> None:
    assert warning_headers(['unknown field "spec.a"', "", "a\\b", 'unknown field "spec.a"']) == [
        '299 - "unknown field \\"spec.a\\""',
        '299 - "a\\\\b"',
    ]


def test_warnings_with_control_characters_are_not_sent() -> None:
    assert warning_headers(["bad\nline", "tab\there", "fine ünïcode"]) == ['299 - "fine ünïcode"']


def test_past_4096_characters_every_warning_is_cut_to_256() -> None:
    long = ["x" * 1000 + str(i) for i in range(4)]
    assert [len(h) for h in warning_headers(long)] == [1001 + 8] * 4
    five = [*long, "y" * 1000]
    headers = warning_headers(five)
    assert headers == ['299 - "' + m[:256] + '"' for m in five]


def test_once_cut_warnings_fill_the_budget_later_ones_are_dropped() -> None:
    many = [f"{i:04d}" + "z" * 600 for i in range(30)]
    headers = warning_headers(many)
    # The seventh passes 4096 characters: all are cut to 256 from then on, and once 16 cut
    # warnings fill 4096 characters again the rest are dropped.
    assert len(headers) == 16
    assert all(len(h) == 256 + 8 for h in headers)


# -- the client side -------------------------------------------------------------------------


def test_client_parses_warning_headers_as_client_go_does() -> None:
    assert parse_warning_header('299 - "unknown field \\"spec.a\\""') == [
        (299, "-", 'unknown field "spec.a"')
    ]
    assert parse_warning_header('299 kube "one" "Sat, 01 Jan 2026 00:00:00 GMT", 199 - "two"') == [
        (299, "kube", "one"),
        (199, "-", "two"),
    ]
    assert parse_warning_header('299 - "unterminated') == []
    assert parse_warning_header("junk") == []


def test_client_logs_each_distinct_warning_once(caplog: pytest.LogCaptureFixture) -> None:
    log = WarningLog(remember=2)
    with caplog.at_level("WARNING", logger="app.kube.client"):
        assert log.handle(['299 - "a"', '299 - "a"', '199 - "not 299"'], "update X x") == ["a"]
        assert log.handle(['299 - "a"'], "update X y") == []
        assert log.handle(['299 - "b"', '299 - "c"'], "update X z") == ["b", "c"]
        # Only the last two messages are remembered: "a" is logged again.
        assert log.handle(['299 - "a"'], "update X x") == ["a"]
    assert [r.getMessage() for r in caplog.records] == [
        "update X x: the API server warned: a",
        "update X z: the API server warned: b",
        "update X z: the API server warned: c",
        "update X x: the API server warned: a",
    ]
