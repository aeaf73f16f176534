"""DELETE planning (deletion.py) and request options (options.py) as pure functions."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from fabric_dra_sim.kubeapi.deletion import (
    check_preconditions,
    plan_delete,
    pod_grace_period,
    should_delete_during_update,
)
from fabric_dra_sim.kubeapi.errors import StatusError
from fabric_dra_sim.kubeapi.options import (
    accepted_status,
    check_write_options,
    delete_options,
    dry_run_causes,
)

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def _obj(**meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "x", "uid": "u1", "resourceVersion": "5", **meta}}


def _pod(node: str = "n1", phase: str = "Running", **spec: Any) -> dict[str, Any]:
    pod = _obj(generation=1)
    pod["spec"] = {"nodeName": node, **spec} if node else dict(spec)
    pod["status"] = {"phase": phase}
    return pod


def test_an_object_without_finalizers_is_removed_at_once() -> None:
    plan = plan_delete(_obj(), {}, graceful=False, now=NOW)
    assert (plan.write, plan.remove) == (False, True)


def test_finalizers_keep_the_object_marked_now_with_a_zero_grace_period() -> None:
    plan = plan_delete(_obj(finalizers=["f"], generation=3), {}, graceful=False, now=NOW)
    assert (plan.write, plan.remove, plan.kubelet) == (True, False, False)
    assert plan.obj["metadata"]["deletionTimestamp"] == "2026-01-01T12:00:00Z"
    assert plan.obj["metadata"]["deletionGracePeriodSeconds"] == 0
    # markAsDeleting bumps a set generation once.
    assert plan.obj["metadata"]["generation"] == 4


def test_deleting_again_while_finalizers_remain_changes_nothing() -> None:
    marked = _obj(
        finalizers=["f"],
        deletionTimestamp="2026-01-01T11:00:00Z",
        deletionGracePeriodSeconds=0,
        generation=2,
    )
    plan = plan_delete(marked, {}, graceful=False, now=NOW)
    assert (plan.write, plan.remove) == (False, False)
    assert plan.obj == marked


def test_a_scheduled_pod_is_marked_for_its_grace_period_and_left_to_the_kubelet() -> None:
    plan = plan_delete(_pod(terminationGracePeriodSeconds=10), {}, graceful=True, now=NOW)
    assert (plan.write, plan.remove, plan.kubelet) == (True, False, True)
    assert plan.obj["metadata"]["deletionTimestamp"] == "2026-01-01T12:00:10Z"
    assert plan.obj["metadata"]["deletionGracePeriodSeconds"] == 10
    assert plan.obj["metadata"]["generation"] == 2


@pytest.mark.parametrize(
    ("pod", "requested", "period"),
    [
        (_pod(), None, 30),
        (_pod(terminationGracePeriodSeconds=5), None, 5),
        (_pod(terminationGracePeriodSeconds=5), 2, 2),
        (_pod(node=""), 20, 0),
        (_pod(phase="Succeeded"), None, 0),
        (_pod(phase="Failed"), 9, 0),
    ],
)
def test_pod_grace_period(pod: dict[str, Any], requested: int | None, period: int) -> None:
    assert pod_grace_period(pod, requested) == period


def test_an_unscheduled_pod_is_stored_marked_then_removed() -> None:
    plan = plan_delete(_pod(node=""), {}, graceful=True, now=NOW)
    assert (plan.write, plan.remove) == (True, True)
    assert plan.obj["metadata"]["deletionGracePeriodSeconds"] == 0


def test_a_terminating_pod_is_pending_unless_the_grace_period_shortens() -> None:
    terminating = _pod()
    terminating["metadata"].update(
        deletionTimestamp="2026-01-01T12:00:30Z", deletionGracePeriodSeconds=30
    )
    pending = plan_delete(terminating, {}, graceful=True, now=NOW)
    assert (pending.write, pending.remove) == (False, False)
    assert (
        plan_delete(terminating, {"gracePeriodSeconds": 30}, graceful=True, now=NOW).write is False
    )
    shortened = plan_delete(terminating, {"gracePeriodSeconds": 0}, graceful=True, now=NOW)
    assert (shortened.write, shortened.remove) == (True, True)
    assert shortened.obj["metadata"]["deletionTimestamp"] == "2026-01-01T12:00:00Z"


def test_preconditions_name_the_kind_like_before_delete() -> None:
    with pytest.raises(StatusError) as caught:
        check_preconditions(
            "resource.k8s.io", "ResourceClaim", _obj(), {"preconditions": {"uid": "other"}}
        )
    assert caught.value.code == 409
    assert caught.value.message == (
        'Operation cannot be fulfilled on ResourceClaim.resource.k8s.io "x": the UID in the '
        "precondition (other) does not match the UID in record (u1). The object might have "
        "been deleted and then recreated"
    )
    with pytest.raises(StatusError) as caught:
        check_preconditions("", "Pod", _obj(), {"preconditions": {"resourceVersion": "4"}})
    assert caught.value.message.endswith(
        "the ResourceVersion in the precondition (4) does not match the ResourceVersion in "
        "record (5). The object might have been modified"
    )
    check_preconditions("", "Pod", _obj(), {"preconditions": {"uid": "u1", "resourceVersion": "5"}})


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ({"deletionTimestamp": "t", "deletionGracePeriodSeconds": 0}, {}, True),
        ({"deletionTimestamp": "t"}, {}, True),
        ({"deletionTimestamp": "t", "deletionGracePeriodSeconds": 30}, {}, False),
        ({"deletionTimestamp": "t"}, {"finalizers": ["f"]}, False),
        ({}, {}, False),
    ],
)
def test_should_delete_during_update(
    old: dict[str, Any], new: dict[str, Any], expected: bool
) -> None:
    assert should_delete_during_update(old, new) is expected


def test_dry_run_accepts_only_all() -> None:
    assert dry_run_causes(["All"]) == []
    assert dry_run_causes([]) == []
    (cause,) = dry_run_causes(["Yes"])
    assert cause.message == 'Unsupported value: []string{"Yes"}: supported values: "All"'
    assert cause.field == "dryRun"


@pytest.mark.parametrize("verb", ["Create", "Update", "Patch"])
def test_an_unknown_dry_run_value_is_422_on_the_verbs_options(verb: str) -> None:
    with pytest.raises(StatusError) as caught:
        check_write_options(verb, dry_run=["true"])
    assert caught.value.code == 422
    assert caught.value.message.startswith(f'{verb}Options.meta.k8s.io "" is invalid: dryRun:')


def test_force_is_forbidden_on_a_non_apply_patch_and_field_managers_are_checked() -> None:
    with pytest.raises(StatusError) as caught:
        check_write_options("Patch", dry_run=[], force_given=True)
    assert "force: Forbidden: may not be specified for non-apply patch" in caught.value.message
    check_write_options("Patch", dry_run=[], force_given=True, apply=True)
    with pytest.raises(StatusError) as caught:
        check_write_options("Create", dry_run=[], field_manager="m" * 129)
    assert "fieldManager: Too long" in caught.value.message
    with pytest.raises(StatusError):
        check_write_options("Update", dry_run=[], field_manager="bad\x07")


def test_delete_options_come_from_the_body_or_else_the_query() -> None:
    options, dry_run = delete_options(None, {"gracePeriodSeconds": ["0"], "dryRun": ["All"]})
    assert options == {"gracePeriodSeconds": 0} and dry_run
    options, dry_run = delete_options({"dryRun": ["All"]}, {})
    assert dry_run
    options, dry_run = delete_options({"propagationPolicy": "Background"}, {"dryRun": ["All"]})
    assert not dry_run
    with pytest.raises(StatusError) as caught:
        delete_options({"propagationPolicy": "Sideways"}, {})
    assert caught.value.code == 422
    assert caught.value.message.startswith('DeleteOptions.meta.k8s.io "" is invalid')
    with pytest.raises(StatusError):
        delete_options({"orphanDependents": True, "propagationPolicy": "Orphan"}, {})
    with pytest.raises(StatusError) as caught:
        delete_options([1], {})
    assert caught.value.code == 400


def test_delete_answers_200_unless_kept_with_orphan_dependents_false() -> None:
    assert accepted_status(True, {}) == 200
    assert accepted_status(False, {}) == 200
    assert accepted_status(True, {"orphanDependents": False}) == 200
    assert accepted_status(False, {"orphanDependents": False}) == 202
