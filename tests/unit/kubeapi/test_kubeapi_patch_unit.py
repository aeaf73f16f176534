"""Pure patch mechanics: JSON merge patch, JSON patch and strategic merge."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric_dra_sim.kubeapi.errors import StatusError
from fabric_dra_sim.kubeapi.patch import json_patch, list_strategy, merge_patch, strategic_merge

keys = st.text(alphabet="abcdef", min_size=1, max_size=3)
scalars = st.one_of(st.integers(), st.text(max_size=4), st.booleans())
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=10,
)
documents = st.dictionaries(keys, json_values, max_size=4)


@given(documents)
def test_an_empty_merge_patch_changes_nothing(doc: dict[str, Any]) -> None:
    assert merge_patch(doc, {}) == doc
    assert strategic_merge(doc, {}) == doc


@given(documents, documents)
def test_merge_patch_sets_every_patched_key(doc: dict[str, Any], patch: dict[str, Any]) -> None:
    result = merge_patch(doc, patch)
    for key, value in patch.items():
        if not isinstance(value, dict):
            assert result[key] == value
    for key in set(doc) - set(patch):
        assert result[key] == doc[key]


@given(documents, keys, json_values)
def test_json_patch_add_then_remove_is_identity(doc: dict[str, Any], key: str, value: Any) -> None:
    if key in doc:
        return
    added = json_patch(doc, [{"op": "add", "path": f"/{key}", "value": value}])
    assert added[key] == value
    assert json_patch(added, [{"op": "remove", "path": f"/{key}"}]) == doc


def test_merge_patch_null_removes_and_nested_merges() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": None}, "d": None}) == {
        "a": {"c": 2}
    }


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([{"op": "replace", "path": "/a/0", "value": 9}], {"a": [9, 2], "b": {"c": "x"}}),
        ([{"op": "add", "path": "/a/-", "value": 3}], {"a": [1, 2, 3], "b": {"c": "x"}}),
        ([{"op": "move", "from": "/b/c", "path": "/d"}], {"a": [1, 2], "b": {}, "d": "x"}),
        (
            [{"op": "copy", "from": "/b", "path": "/e"}],
            {"a": [1, 2], "b": {"c": "x"}, "e": {"c": "x"}},
        ),
        ([{"op": "test", "path": "/b/c", "value": "x"}], {"a": [1, 2], "b": {"c": "x"}}),
        ([{"op": "add", "path": "/b/c~1d", "value": 1}], {"a": [1, 2], "b": {"c": "x", "c/d": 1}}),
    ],
)
def test_json_patch_operations(ops: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    assert json_patch({"a": [1, 2], "b": {"c": "x"}}, ops) == expected


@pytest.mark.parametrize(
    ("ops", "code"),
    [
        ([{"op": "test", "path": "/b/c", "value": "y"}], 422),
        ([{"op": "remove", "path": "/nope"}], 422),
        ([{"op": "replace", "path": "/a/5", "value": 1}], 422),
        ([{"op": "frobnicate", "path": "/a"}], 400),
        ([{"op": "add"}], 400),
        ({"op": "add", "path": "/a"}, 400),
    ],
)
def test_json_patch_errors(ops: Any, code: int) -> None:
    with pytest.raises(StatusError) as caught:
        json_patch({"a": [1, 2], "b": {"c": "x"}}, ops)
    assert caught.value.code == code


def test_json_patch_leaves_the_input_untouched() -> None:
    doc = {"a": [1]}
    json_patch(doc, [{"op": "add", "path": "/a/-", "value": 2}])
    assert doc == {"a": [1]}


@given(
    st.lists(st.text(min_size=1, max_size=3), max_size=5),
    st.lists(st.text(min_size=1, max_size=3), max_size=5),
)
def test_strategic_merge_finalizers_are_a_union(old: list[str], new: list[str]) -> None:
    result = strategic_merge({"metadata": {"finalizers": old}}, {"metadata": {"finalizers": new}})[
        "metadata"
    ]["finalizers"]
    assert set(result) == set(old) | set(new)
    assert result[: len(old)] == old


def test_strategic_merge_keyed_lists_and_directives() -> None:
    original = {
        "status": {
            "conditions": [{"type": "A", "status": "False"}, {"type": "B", "status": "True"}],
            "devices": [{"driver": "d", "pool": "p", "device": "x", "data": {"k": 1}}],
            "reservedFor": [{"uid": "1", "name": "a"}, {"uid": "2", "name": "b"}],
        }
    }
    patch = {
        "status": {
            "conditions": [{"type": "A", "status": "True"}, {"type": "C", "status": "True"}],
            "devices": [{"driver": "d", "pool": "p", "device": "x", "conditions": []}],
            "reservedFor": [{"uid": "1", "$patch": "delete"}],
            "$setElementOrder/conditions": [{"type": "A"}],
        }
    }
    result = strategic_merge(original, patch)["status"]
    assert result["conditions"] == [
        {"type": "A", "status": "True"},
        {"type": "B", "status": "True"},
        {"type": "C", "status": "True"},
    ]
    # status.devices has no patchMergeKey tag: the patch's list replaces the stored one.
    assert result["devices"] == [{"driver": "d", "pool": "p", "device": "x", "conditions": []}]
    assert result["reservedFor"] == [{"uid": "2", "name": "b"}]


def test_strategic_merge_patch_replace_and_delete_on_maps() -> None:
    original = {"spec": {"a": 1, "b": 2}, "other": {"x": 1}}
    assert strategic_merge(original, {"spec": {"$patch": "replace", "c": 3}}) == {
        "spec": {"c": 3},
        "other": {"x": 1},
    }
    assert strategic_merge(original, {"other": {"$patch": "delete"}}) == {"spec": {"a": 1, "b": 2}}


def test_strategic_merge_refuses_keyed_items_without_the_key_and_unknown_directives() -> None:
    with pytest.raises(StatusError) as caught:
        strategic_merge({}, {"status": {"conditions": [{"status": "True"}]}})
    assert caught.value.code == 400
    with pytest.raises(StatusError):
        strategic_merge({}, {"$explode": 1})


@pytest.mark.parametrize(
    ("path", "strategy"),
    [
        (("metadata", "finalizers"), "set"),
        (("spec", "finalizers"), "replace"),
        (("status", "conditions"), ("type",)),
        (("status", "devices"), "replace"),
        (("spec", "devices"), "replace"),
        (("status", "reservedFor"), ("uid",)),
    ],
)
def test_list_strategies(path: tuple[str, ...], strategy: Any) -> None:
    assert list_strategy(path) == strategy
