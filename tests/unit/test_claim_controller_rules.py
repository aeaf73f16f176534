"""The claim controller stand-in's pure rules (k8s.io/kubernetes
pkg/controller/resourceclaim/controller.go) and the service's one-publisher rule."""

from __future__ import annotations

from typing import Any

import pytest

from app.kube.versions import ResourceApiVersion
from app.service import publisher_versions
from fabric_dra_sim.scheduler.claim_controller import (
    MAX_RESERVED_FOR,
    can_be_reserved,
    claim_names,
    is_pod_done,
    needs_claims,
    owned_claim,
    owning_pod,
    released_status,
    template_claim_prefix,
)
from fabric_dra_sim.scheduler.common import DELETE_PROTECTION, POD_CLAIM_NAME_ANNOTATION

V1, V1ALPHA3 = ResourceApiVersion.V1, ResourceApiVersion.V1ALPHA3
ALLOCATION = {
    "devices": {"results": [{"request": "gpu", "driver": "d", "pool": "p", "device": "x"}]}
}


def pod(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "p1", "namespace": "default", "uid": "u1"},
        "spec": {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "t"},
                {"name": "shared", "resourceClaimName": "c-shared"},
            ]
        },
        "status": {"phase": "Running"},
    }
    for path, value in changes.items():
        section, key = path.split("__")
        body[section][key] = value
    return body


def claim(
    *,
    finalizer: bool = True,
    reserved: int = 1,
    allocated: bool = True,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "c1",
        "namespace": "default",
        "uid": "cu1",
        "finalizers": [DELETE_PROTECTION] if finalizer else [],
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = ALLOCATION
    if reserved:
        status["reservedFor"] = [
            {"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(1, reserved + 1)
        ]
    return {"metadata": meta, "spec": {}, "status": status}


@pytest.mark.parametrize(
    ("changes", "done"),
    [
        ({}, False),
        ({"status__phase": "Succeeded"}, True),
        ({"status__phase": "Failed"}, True),
        ({"metadata__deletionTimestamp": "2026-01-01T00:00:00Z"}, True),
        ({"metadata__deletionTimestamp": "2026-01-01T00:00:00Z", "spec__nodeName": "n1"}, False),
    ],
)
def test_a_pod_is_done_when_terminal_or_deleted_before_scheduling(
    changes: dict[str, Any],
    done: bool,
) -> None:
    the_pod = pod()
    for path, value in changes.items():
        section, key = path.split("__")
        the_pod[section][key] = value
    assert is_pod_done(the_pod) is done
    assert needs_claims(the_pod, deleted=False) is (not done)
    assert needs_claims(the_pod, deleted=True) is False


def test_claim_names_are_the_named_claims_and_the_recorded_template_claims() -> None:
    assert claim_names(pod()) == ["c-shared"]
    recorded = pod(
        status__resourceClaimStatuses=[{"name": "gpu", "resourceClaimName": "p1-gpu-abcde"}]
    )
    assert claim_names(recorded) == ["p1-gpu-abcde", "c-shared"]


def test_the_owning_pod_is_the_controlling_v1_pod_owner_only() -> None:
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "p1", "uid": "u1", "controller": True}
    assert owning_pod(claim(owner=owner)) == ("p1", "u1")
    assert owning_pod(claim(owner={**owner, "controller": False})) is None
    assert owning_pod(claim(owner={**owner, "apiVersion": "apps/v1"})) is None
    assert owning_pod(claim()) is None


def test_an_orphan_claim_is_found_by_owner_uid_and_annotation() -> None:
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "p1", "uid": "u1", "controller": True}
    made = claim(owner=owner)
    made["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpu"}
    assert owned_claim([made], pod(), "gpu") is made
    assert owned_claim([made], pod(), "other") is None
    assert owned_claim([made], pod(metadata__uid="u2"), "gpu") is None


def test_releasing_some_consumers_keeps_the_allocation() -> None:
    status = released_status(
        claim(reserved=2), [{"resource": "pods", "name": "p2", "uid": "u2"}], V1
    )
    assert status == {
        "allocation": ALLOCATION,
        "reservedFor": [{"resource": "pods", "name": "p2", "uid": "u2"}],
    }


@pytest.mark.parametrize(
    ("version", "finalizer", "expected"),
    [
        # Allocated by the scheduler (structured): the allocation goes with the last consumer.
        (V1, True, {}),
        (V1ALPHA3, True, {}),
        # No delete-protection finalizer on 1.34+: left alone (no other allocator exists).
        (V1, False, {"allocation": ALLOCATION}),
        # 1.31, a control-plane driver's claim: its driver is asked to deallocate.
        (V1ALPHA3, False, {"allocation": ALLOCATION, "deallocationRequested": True}),
    ],
)
def test_the_last_consumer_leaving_deallocates_as_the_release_does(
    version: ResourceApiVersion,
    finalizer: bool,
    expected: dict[str, Any],
) -> None:
    assert released_status(claim(finalizer=finalizer), [], version) == expected


def test_an_unallocated_claim_gets_no_deallocation_request() -> None:
    assert released_status(claim(finalizer=False, allocated=False), [], V1ALPHA3) == {}


def test_a_claim_can_be_reserved_while_it_has_fewer_than_256_consumers() -> None:
    assert can_be_reserved(claim(reserved=MAX_RESERVED_FOR - 1))
    assert not can_be_reserved(claim(reserved=MAX_RESERVED_FOR))


@pytest.mark.parametrize(
    ("pod_name", "claim_name", "expected"),
    [
        ("p1", "gpu", "p1-gpu-"),
        ("p" * 60, "gpu", "p" * 52 + "-" + "gp"),  # 65 characters: 60*57//65, 3*57//65
        ("a" * 30, "b" * 30, "a" * 27 + "-" + "b" * 27),
    ],
)
def test_generated_names_cut_both_parts_in_proportion(
    pod_name: str, claim_name: str, expected: str
) -> None:
    prefix = template_claim_prefix(pod_name, claim_name)
    assert prefix == expected
    assert len(prefix) <= 57


@pytest.mark.parametrize(
    ("structured", "control_plane", "expected"),
    [
        (ResourceApiVersion.V1, False, [ResourceApiVersion.V1]),
        (ResourceApiVersion.V1BETA1, False, [ResourceApiVersion.V1BETA1]),
        (None, True, [ResourceApiVersion.V1ALPHA3]),
    ],
)
def test_the_service_publishes_in_the_one_version_of_its_mode(
    structured: ResourceApiVersion | None,
    control_plane: bool,
    expected: list[ResourceApiVersion],
) -> None:
    assert publisher_versions(structured, control_plane) == expected


def test_the_service_refuses_two_modes_or_none() -> None:
    with pytest.raises(ValueError, match="no Kubernetes release serves both"):
        publisher_versions(ResourceApiVersion.V1, True)
    with pytest.raises(ValueError, match="no mode"):
        publisher_versions(None, False)
