"""Server-side apply ownership as pure functions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric_dra_sim.kubeapi.apply import (
    field_set,
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
