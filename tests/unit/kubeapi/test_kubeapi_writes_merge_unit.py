"""Strategic merge list strategies, server-side apply list types and conflicts with Update
managers, field selectors per kind and the kinds that keep metadata.generation.
"""

from __future__ import annotations

from typing import Any

import pytest

from fabric_dra_sim.kubeapi import objects
from fabric_dra_sim.kubeapi.apply import (
    managed_fields_json,
    path_string,
    record_update,
    server_side_apply,
)
from fabric_dra_sim.kubeapi.errors import StatusError
from fabric_dra_sim.kubeapi.objects import uses_generation
from fabric_dra_sim.kubeapi.patch import list_strategy, list_type, strategic_merge
from fabric_dra_sim.kubeapi.resources import served_types
from fabric_dra_sim.kubeapi.selectors import fields_match, parse_field_selector_for

DEVICE = {"driver": "d", "pool": "p", "device": "x"}


def test_a_claims_status_devices_are_replaced_by_a_strategic_merge_patch() -> None:
    original = {"status": {"devices": [{**DEVICE, "data": {"k": 1}}, {**DEVICE, "device": "y"}]}}
    patched = strategic_merge(
        original,
        {"status": {"devices": [{**DEVICE, "conditions": [{"type": "Ready", "status": "True"}]}]}},
    )
    assert patched["status"]["devices"] == [
        {**DEVICE, "conditions": [{"type": "Ready", "status": "True"}]}
    ]


def test_reserved_for_merges_by_uid_and_finalizers_as_a_set() -> None:
    original = {
        "metadata": {"finalizers": ["a"]},
        "status": {"reservedFor": [{"uid": "1", "name": "p1"}]},
    }
    patched = strategic_merge(
        original,
        {
            "metadata": {"finalizers": ["b", "a"]},
            "status": {"reservedFor": [{"uid": "2", "name": "p2"}, {"uid": "1", "name": "p1b"}]},
        },
    )
    assert patched["metadata"]["finalizers"] == ["a", "b"]
    assert patched["status"]["reservedFor"] == [
        {"uid": "1", "name": "p1b"},
        {"uid": "2", "name": "p2"},
    ]


def test_pod_containers_merge_by_name_and_their_env_by_name() -> None:
    original = {
        "spec": {
            "containers": [
                {"name": "a", "image": "i1", "env": [{"name": "X", "value": "1"}]},
                {"name": "b", "image": "i2"},
            ]
        }
    }
    patched = strategic_merge(
        original, {"spec": {"containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}]}]}}
    )
    first, second = patched["spec"]["containers"]
    assert first["image"] == "i1"
    assert first["env"] == [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]
    assert second == {"name": "b", "image": "i2"}


def test_pod_tolerations_and_slice_devices_are_replaced() -> None:
    original = {"spec": {"tolerations": [{"key": "a"}], "devices": [{"name": "g0"}]}}
    patched = strategic_merge(
        original, {"spec": {"tolerations": [{"key": "b"}], "devices": [{"name": "g1"}]}}
    )
    assert patched["spec"] == {"tolerations": [{"key": "b"}], "devices": [{"name": "g1"}]}


@pytest.mark.parametrize(
    ("path", "smp", "ssa"),
    [
        (("status", "devices"), "replace", ("driver", "device", "pool", "shareID")),
        (("status", "devices", "conditions"), "replace", ("type",)),
        (("status", "reservedFor"), ("uid",), ("uid",)),
        (("metadata", "finalizers"), "set", "set"),
        (("spec", "containers"), ("name",), ("name",)),
        (("spec", "containers", "ports"), ("containerPort",), ("containerPort", "protocol")),
        (("spec", "devices", "requests"), "replace", "atomic"),
        (("spec", "finalizers"), "replace", "atomic"),
    ],
)
def test_list_strategies_follow_patch_tags_and_list_types(
    path: tuple[str, ...],
    smp: Any,
    ssa: Any,
) -> None:
    assert list_strategy(path) == smp
    assert list_type(path) == ssa


def _with_managers(
    obj: dict[str, Any], managers: list[Any], api_version: str = "resource.k8s.io/v1"
) -> dict[str, Any]:
    obj.setdefault("metadata", {})["managedFields"] = managed_fields_json(
        managers, api_version, "2026-01-01T00:00:00Z"
    )
    return obj


def test_apply_conflicts_with_a_field_an_update_manager_set() -> None:
    created = {"spec": {"a": 1, "b": 1}}
    live = _with_managers(created, record_update(None, created, "kubectl"))
    with pytest.raises(StatusError) as caught:
        server_side_apply(live, {"spec": {"a": 2}}, "publisher", force=False)
    assert caught.value.code == 409
    assert caught.value.message == (
        'Apply failed with 1 conflict: conflict with "kubectl" using resource.k8s.io/v1: .spec.a'
    )
    assert caught.value.details == {
        "causes": [
            {
                "reason": "FieldManagerConflict",
                "message": 'conflict with "kubectl" using resource.k8s.io/v1',
                "field": ".spec.a",
            }
        ]
    }


def test_applying_the_value_an_update_manager_set_is_no_conflict() -> None:
    created = {"spec": {"a": 1}}
    live = _with_managers(created, record_update(None, created, "kubectl"))
    merged, managers = server_side_apply(live, {"spec": {"a": 1}}, "publisher", force=False)
    assert merged == live | {"spec": {"a": 1}}
    owners = {(m.manager, m.operation) for m in managers if ("f:spec", "f:a") in m.fields}
    assert owners == {("kubectl", "Update"), ("publisher", "Apply")}


def test_force_takes_the_conflicting_fields_from_the_update_manager() -> None:
    created = {"spec": {"a": 1, "b": 1}}
    live = _with_managers(created, record_update(None, created, "kubectl"))
    merged, managers = server_side_apply(live, {"spec": {"a": 2}}, "publisher", force=True)
    assert merged["spec"] == {"a": 2, "b": 1}
    by_name = {m.manager: m for m in managers}
    assert by_name["kubectl"].fields == {("f:spec", "f:b")}
    assert by_name["kubectl"].api_version == "resource.k8s.io/v1"
    assert by_name["publisher"].fields == {("f:spec", "f:a")}


def test_the_appliers_own_update_entry_conflicts_too() -> None:
    created = {"spec": {"a": 1}}
    live = _with_managers(created, record_update(None, created, "publisher"))
    with pytest.raises(StatusError) as caught:
        server_side_apply(live, {"spec": {"a": 2}}, "publisher", force=False)
    assert 'conflict with "publisher" using resource.k8s.io/v1' in caught.value.message


def test_several_conflicts_are_listed_per_manager() -> None:
    first = {"spec": {"a": 1}, "status": {}}
    live = _with_managers(first, record_update(None, first, "kubectl"), "v1")
    second = {**live, "spec": {"a": 1, "b": 1}}
    live = _with_managers(second, record_update(live, second, "editor"), "v1")
    applied, managers = server_side_apply(live, {"spec": {"c": 1}}, "other", force=False)
    live = _with_managers(applied, managers, "v1")
    with pytest.raises(StatusError) as caught:
        server_side_apply(live, {"spec": {"a": 2, "b": 2, "c": 2}}, "publisher", force=False)
    assert caught.value.message == (
        'Apply failed with 3 conflicts: conflicts with "editor" using v1:\n- .spec.b\n'
        'conflicts with "kubectl" using v1:\n- .spec.a\nconflicts with "other":\n- .spec.c'
    )


def test_field_paths_print_like_structured_merge_diff() -> None:
    assert path_string(("f:spec", "f:x")) == ".spec.x"
    assert (
        path_string(("f:status", "f:conditions", 'k:{"type":"Ready"}', "f:status"))
        == '.status.conditions[type="Ready"].status'
    )
    assert path_string(("f:metadata", "f:finalizers", 'v:"a"')) == '.metadata.finalizers[="a"]'


def _kind(group: str, kind: str, version: str = "v1") -> tuple[str, str, str]:
    return group, version, kind


@pytest.mark.parametrize(
    ("kind", "selector", "message"),
    [
        (
            _kind("resource.k8s.io", "ResourceSlice"),
            "spec.pool.name=x",
            "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: spec.pool.name",
        ),
        (
            _kind("resource.k8s.io", "ResourceSlice", "v1beta1"),
            "metadata.namespace=x",
            "field label not supported for resource.k8s.io/v1beta1, Kind=ResourceSlice: "
            "metadata.namespace",
        ),
        (
            _kind("resource.k8s.io", "ResourceClaim"),
            "spec.devices=x",
            '"spec.devices" is not a known field selector: only "metadata.name", '
            '"metadata.namespace"',
        ),
        (
            _kind("", "Node"),
            "metadata.namespace=x",
            "field label not supported: metadata.namespace",
        ),
        (_kind("", "Pod"), "spec.foo=1", "field label not supported: spec.foo"),
        (
            _kind("coordination.k8s.io", "Lease"),
            "spec.holderIdentity=a",
            '"spec.holderIdentity" is not a known field selector: only "metadata.name", '
            '"metadata.namespace"',
        ),
    ],
)
def test_unsupported_field_labels_are_400_with_the_conversion_message(
    kind: tuple[str, str, str],
    selector: str,
    message: str,
) -> None:
    with pytest.raises(StatusError) as caught:
        parse_field_selector_for(selector, *kind)
    assert caught.value.code == 400
    assert caught.value.message == message


def test_supported_field_labels_parse_and_pod_spec_host_is_spec_node_name() -> None:
    (req,) = parse_field_selector_for("spec.host=n1", "", "v1", "Pod")
    assert (req.path, req.op, req.value) == ("spec.nodeName", "=", "n1")
    reqs = parse_field_selector_for(
        "spec.driver=d,spec.nodeName!=n", "resource.k8s.io", "v1", "ResourceSlice"
    )
    assert [r.path for r in reqs] == ["spec.driver", "spec.nodeName"]
    assert (
        parse_field_selector_for(
            "metadata.namespace=default", "resource.k8s.io", "v1", "ResourceClaim"
        )[0].value
        == "default"
    )


def test_an_event_source_selector_reads_the_component_else_the_reporting_controller() -> None:
    # pkg/registry/core/event/strategy.go ToSelectableFields
    (req,) = parse_field_selector_for("source=kubelet", "", "v1", "Event")
    assert fields_match([req], {"source": {"component": "kubelet", "host": "n1"}})
    assert fields_match([req], {"source": {}, "reportingController": "kubelet"})
    assert not fields_match(
        [req], {"source": {"component": "other"}, "reportingController": "kubelet"}
    )
    assert not fields_match([req], {})


def test_only_slices_classes_and_pods_keep_a_generation() -> None:
    keeping = {rt.plural for rt in served_types(("v1",)) if uses_generation(rt)}
    assert keeping == {"resourceslices", "deviceclasses", "pods"}


def test_now_is_the_current_second_in_rfc3339(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_796_512_345.9]
    monkeypatch.setattr(objects.time, "time", lambda: clock[0])
    assert objects.now_rfc3339() == "2026-12-05T23:12:25Z"
    clock[0] += 0.05  # the same second: the same text
    assert objects.now_rfc3339() == "2026-12-05T23:12:25Z"
    clock[0] += 0.05  # the next second
    assert objects.now_rfc3339() == "2026-12-05T23:12:26Z"
    clock[0] += 86_400
    assert objects.now_rfc3339() == "2026-12-06T23:12:26Z"
