"""Server-side apply ownership as pure functions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fabric_dra_sim.kubeapi.apply import (
    _get,
    field_set,
    fields_changed,
    from_fields_v1,
    managed_fields_json,
    record_update,
    server_side_apply,
    to_fields_v1,
)
from fabric_dra_sim.kubeapi.errors import StatusError

keys = st.text(alphabet="abc", min_size=1, max_size=2)
leaves = st.one_of(st.integers(), st.text(max_size=3))
trees = st.recursive(
    leaves, lambda inner: st.dictionaries(keys, inner, min_size=1, max_size=3), max_leaves=8
)


@given(st.dictionaries(keys, trees, max_size=3))
def test_fields_v1_round_trip(obj: dict[str, Any]) -> None:
    paths = field_set({"spec": obj}) if obj else set()
    assert from_fields_v1(to_fields_v1(paths)) == paths


def test_field_set_uses_keys_for_keyed_lists_and_values_for_finalizers() -> None:
    obj = {
        "metadata": {"name": "x", "finalizers": ["a/b"]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert field_set(obj) == {
        ("f:metadata", "f:finalizers", 'v:"a/b"'),
        ("f:status", "f:conditions", 'k:{"type":"Ready"}', "f:type"),
        ("f:status", "f:conditions", 'k:{"type":"Ready"}', "f:status"),
    }


@pytest.mark.parametrize("order", [(1, True, 1.0), (True, 1.0, 1), (1.0, 1, True)])
def test_equal_key_values_of_other_types_keep_their_own_json(order: tuple[Any, ...]) -> None:
    # 1, True and 1.0 are one key of a Python dict but three JSON texts; each write must
    # name its own, whichever was seen first.
    texts = [(int, "1"), (bool, "true"), (float, "1.0")]
    for value in order:
        obj = {
            "metadata": {"finalizers": [value]},
            "status": {"conditions": [{"type": value, "status": "x"}]},
        }
        text = next(t for kind, t in texts if type(value) is kind)
        assert field_set(obj) == {
            ("f:metadata", "f:finalizers", "v:" + text),
            ("f:status", "f:conditions", f'k:{{"type":{text}}}', "f:type"),
            ("f:status", "f:conditions", f'k:{{"type":{text}}}', "f:status"),
        }


def test_key_fields_holding_lists_or_objects_are_still_named() -> None:
    obj = {"status": {"conditions": [{"type": [1, {"b": 2, "a": 1}], "status": "x"}]}}
    assert ("f:status", "f:conditions", 'k:{"type":[1,{"a":1,"b":2}]}', "f:status") in field_set(
        obj
    )
    assert field_set({"metadata": {"finalizers": [{"a": [1]}]}}) == {
        ("f:metadata", "f:finalizers", 'v:{"a": [1]}')
    }


def _stamp(obj: dict[str, Any], managers: list[Any]) -> dict[str, Any]:
    obj.setdefault("metadata", {})["managedFields"] = managed_fields_json(
        managers, "v1", "2026-01-01T00:00:00Z"
    )
    return obj


def test_apply_removes_fields_the_manager_stopped_sending() -> None:
    live, managers = server_side_apply({}, {"spec": {"a": 1, "b": 2}}, "m", force=False)
    live = _stamp(live, managers)
    live, _ = server_side_apply(live, {"spec": {"a": 1}}, "m", force=False)
    assert live["spec"] == {"a": 1}


def test_apply_keeps_fields_owned_by_another_manager() -> None:
    live, managers = server_side_apply({}, {"spec": {"a": 1, "b": 2}}, "m1", force=False)
    live = _stamp(live, managers)
    live, managers = server_side_apply(live, {"spec": {"b": 2}}, "m2", force=False)
    live = _stamp(live, managers)
    live, _ = server_side_apply(live, {"spec": {"a": 1}}, "m1", force=False)
    assert live["spec"] == {"a": 1, "b": 2}


def test_apply_conflict_and_force() -> None:
    live, managers = server_side_apply({}, {"spec": {"a": 1}}, "m1", force=False)
    live = _stamp(live, managers)
    with pytest.raises(StatusError) as caught:
        server_side_apply(live, {"spec": {"a": 2}}, "m2", force=False)
    assert caught.value.code == 409
    assert caught.value.details is not None
    assert caught.value.details["causes"][0]["field"] == ".spec.a"
    forced, owners = server_side_apply(live, {"spec": {"a": 2}}, "m2", force=True)
    assert forced["spec"] == {"a": 2}
    assert [o.manager for o in owners] == ["m2"]


def test_update_takes_changed_fields_from_appliers() -> None:
    live, managers = server_side_apply({}, {"spec": {"a": 1, "b": 1}}, "m1", force=False)
    live = _stamp(live, managers)
    new = {**live, "spec": {"a": 5, "b": 1}}
    owners = {o.manager: o.fields for o in record_update(live, new, "editor")}
    assert owners["editor"] == {("f:spec", "f:a")}
    assert owners["m1"] == {("f:spec", "f:b")}


# Objects that exercise every list type of an update's field walk: a set (finalizers), keyed
# lists (conditions by type; devices by driver/device/pool and an optional shareID, with
# conditions of their own), atomic lists, empty dicts, nulls, and values that change type.
_small = st.one_of(st.none(), st.integers(0, 2), st.sampled_from(["a", "b"]), st.just({}))
_condition = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["Ready", "Gone"])}, optional={"status": _small}
    ),
    st.fixed_dictionaries({}, optional={"status": _small}),  # no key: the list is one leaf
    _small,
)
_device = st.fixed_dictionaries(
    {"driver": st.just("d"), "device": st.sampled_from(["g0", "g1"]), "pool": st.just("p")},
    optional={
        "shareID": st.sampled_from(["s0", "s1"]),
        "conditions": st.lists(_condition, max_size=3),
        "data": st.one_of(_small, st.dictionaries(keys, _small, max_size=2)),
    },
)
_objects = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {"name": st.just("x")},
            optional={
                "finalizers": st.lists(st.sampled_from(["a/b", "c/d", "e/f"]), max_size=3),
                "labels": st.one_of(_small, st.dictionaries(keys, _small, max_size=2)),
            },
        ),
        "spec": st.one_of(
            _small,
            st.dictionaries(keys, st.one_of(trees, st.lists(_small, max_size=2)), max_size=3),
        ),
        "status": st.one_of(
            _small,
            st.fixed_dictionaries(
                {},
                optional={
                    "conditions": st.one_of(_small, st.lists(_condition, max_size=3)),
                    "devices": st.lists(_device, max_size=3),
                },
            ),
        ),
    },
)


def _changed_by_definition(old: dict[str, Any], new: dict[str, Any]) -> set[tuple[str, ...]]:
    """The changed leaves as record_update defines them: a leaf of ``new`` that is not a leaf
    of ``old``, or whose value (looked up the way the field paths name it) differs."""
    old_fields = field_set(old)
    return {p for p in field_set(new) if p not in old_fields or _get(old, p) != _get(new, p)}


_G0 = {"driver": "d", "device": "g0", "pool": "p"}


@settings(max_examples=1000)
@given(_objects, _objects, st.integers(0, 2))
# A repeated key in the new list: its paths resolve to the first item with that key.
@example(
    {"status": {"devices": [{**_G0, "data": 1}]}},
    {"status": {"devices": [_G0, {**_G0, "data": 1}]}},
    0,
)
def test_the_one_walk_of_an_update_finds_what_the_definition_does(
    old: dict[str, Any], new: dict[str, Any], mix: int
) -> None:
    # Besides two unrelated objects, old ones that share much with the new one.
    for before in (old, [new, {**new, **old}, {**old, **new}][mix]):
        assert fields_changed(before, new) == (field_set(new), _changed_by_definition(before, new))
