"""The scheduler stand-in's pure decisions: pod claims, template claims, nodes, binding
verdicts, status changes, devices in use, the assume-cache rule and the failed-device
memory."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from fabric_dra_sim.scheduler.claim_controller import (
    owned_claim,
    template_claim,
    template_claim_prefix,
)
from fabric_dra_sim.scheduler.common import (
    POD_CLAIM_NAME_ANNOTATION,
    PodClaim,
    candidate_nodes,
    is_pending,
    owner_pod_uid,
    pod_claims,
    reserved_for_pod,
)
from fabric_dra_sim.scheduler.structured import (
    FailedDevices,
    StructuredSettings,
    allocated_status,
    binding_verdict,
    devices_in_use,
    for_release,
    newer,
    node_fits,
    parse_time,
    rfc3339,
    server_minor,
    without_consumers,
)

DRIVER = "fabric.example.com"
POOL = "us-east/rack-01"
NOW = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


def pod(
    name: str = "p1",
    *,
    uid: str = "uid-p1",
    claims: list[dict[str, Any]] | None = None,
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "containers": [{"name": "c"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}]
            if claims is None
            else claims,
            **spec,
        },
        "status": status or {"phase": "Pending"},
    }


def result(device: str, *, conditions: bool = True, admin: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": POOL, "device": device}
    if conditions:
        entry["bindingConditions"] = ["FabricDeviceReady"]
        entry["bindingFailureConditions"] = ["FabricDeviceFailed"]
    if admin:
        entry["adminAccess"] = True
    return entry


def device_status(device: str, ready: str, failed: str) -> dict[str, Any]:
    return {
        "driver": DRIVER,
        "pool": POOL,
        "device": device,
        "conditions": [
            {"type": "FabricDeviceReady", "status": ready},
            {"type": "FabricDeviceFailed", "status": failed},
        ],
    }


def claim(
    *results: dict[str, Any],
    devices: list[dict[str, Any]] | None = None,
    allocated_at: dt.datetime = NOW,
    uid: str = "uid-c1",
    reserved: list[dict[str, Any]] | None = None,
    node_selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if results:
        status["allocation"] = {
            "devices": {"results": list(results), "config": []},
            "allocationTimestamp": rfc3339(allocated_at),
        }
        if node_selector:
            status["allocation"]["nodeSelector"] = node_selector
    if devices:
        status["devices"] = devices
    if reserved:
        status["reservedFor"] = reserved
    return {
        "metadata": {"name": "c1", "namespace": "default", "uid": uid, "resourceVersion": "7"},
        "status": status,
    }


# ----------------------------------------------------------------------------- pods
def test_pod_claims_resolve_names_and_recorded_template_claims() -> None:
    the_pod = pod(
        claims=[
            {"name": "a", "resourceClaimName": "shared"},
            {"name": "b", "resourceClaimTemplateName": "tmpl"},
            {"name": "c", "resourceClaimTemplateName": "tmpl"},
            {"resourceClaimName": "nameless"},
            {"name": "no-source"},
        ],
        status={
            "phase": "Pending",
            "resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p1-b-x7k2q"}],
        },
    )
    assert pod_claims(the_pod) == [
        PodClaim("a", "shared"),
        PodClaim("b", "p1-b-x7k2q", "tmpl"),
        PodClaim("c", None, "tmpl"),
    ]


@pytest.mark.parametrize(
    ("changes", "pending"),
    [
        ({}, True),
        ({"spec": {"nodeName": "n1"}}, False),
        ({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}, False),
        ({"status": {"phase": "Succeeded"}}, False),
        ({"status": {"phase": "Failed"}}, False),
        ({"spec": {"schedulerName": "other"}}, False),
        ({"spec": {"schedulerName": "default-scheduler"}}, True),
        ({"spec": {"resourceClaims": []}}, False),
    ],
)
def test_which_pods_are_pending(changes: dict[str, Any], pending: bool) -> None:
    the_pod = pod()
    for part, values in changes.items():
        the_pod[part].update(values)
    assert is_pending(the_pod) is pending


def test_candidate_nodes_skip_unschedulable_and_deleting_nodes_and_sort_by_name() -> None:
    nodes: list[dict[str, Any]] = [
        {"metadata": {"name": "n3"}},
        {"metadata": {"name": "n1"}},
        {"metadata": {"name": "n2"}, "spec": {"unschedulable": True}},
        {"metadata": {"name": "n0", "deletionTimestamp": "2026-01-01T00:00:00Z"}},
        {"metadata": {}},
    ]
    assert [n["metadata"]["name"] for n in candidate_nodes(nodes)] == ["n1", "n3"]


def test_reserved_for_pod_matches_pods_by_uid_only() -> None:
    the_claim = claim(
        result("d0"),
        reserved=[
            {"resource": "pods", "name": "p1", "uid": "u1"},
            {"resource": "things", "name": "x", "uid": "u2"},
        ],
    )
    assert reserved_for_pod(the_claim, "u1")
    assert not reserved_for_pod(the_claim, "u2")
    assert not reserved_for_pod(the_claim, "other")


# ----------------------------------------------------------------------------- templates
@pytest.mark.parametrize(
    ("pod_name", "claim_name", "expected"),
    [
        ("p1", "gpu", "p1-gpu-"),
        ("a" * 60, "b" * 20, "a" * 41 + "-" + "b" * 13),
        ("a" * 10, "b" * 60, "a" * 7 + "-" + "b" * 47),
    ],
)
def test_template_claim_names_fit_63_characters_with_the_random_suffix(
    pod_name: str, claim_name: str, expected: str
) -> None:
    prefix = template_claim_prefix(pod_name, claim_name)
    assert prefix == expected
    assert len(prefix) <= 57


def test_a_template_claim_copies_the_template_and_is_owned_by_the_pod() -> None:
    template: dict[str, Any] = {
        "metadata": {"name": "tmpl"},
        "spec": {
            "metadata": {"labels": {"app": "x"}, "annotations": {"note": "y"}},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]
                }
            },
        },
    }
    made = template_claim(template, pod(), PodClaim("gpu", None, "tmpl"))
    assert made == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": "p1-gpu-",
            "namespace": "default",
            "labels": {"app": "x"},
            "annotations": {"note": "y", POD_CLAIM_NAME_ANNOTATION: "gpu"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": "p1",
                    "uid": "uid-p1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": template["spec"]["spec"],
    }
    assert owner_pod_uid(made) == "uid-p1"
    assert owned_claim([made], pod(), "gpu") is made
    assert owned_claim([made], pod(), "other") is None
    assert owned_claim([made], pod(uid="someone-else"), "gpu") is None


# ----------------------------------------------------------------------------- binding
@pytest.mark.parametrize(
    ("the_claim", "now", "state", "failed"),
    [
        (claim(result("d0", conditions=False)), NOW, "ready", ()),
        (claim(result("d0")), NOW, "waiting", ()),
        (claim(result("d0"), devices=[device_status("d0", "False", "False")]), NOW, "waiting", ()),
        (claim(result("d0"), devices=[device_status("d0", "True", "False")]), NOW, "ready", ()),
        (
            claim(result("d0"), result("d1"), devices=[device_status("d0", "True", "False")]),
            NOW,
            "waiting",
            (),
        ),
        (
            claim(
                result("d0"),
                result("d1"),
                devices=[
                    device_status("d0", "True", "False"),
                    device_status("d1", "False", "True"),
                ],
            ),
            NOW,
            "failed",
            ((DRIVER, POOL, "d1"),),
        ),
        # Another driver's entry for the same device name does not count.
        (
            claim(
                result("d0"), devices=[{**device_status("d0", "True", "False"), "driver": "x.io"}]
            ),
            NOW,
            "waiting",
            (),
        ),
        (claim(result("d0")), NOW + dt.timedelta(seconds=599), "waiting", ()),
        (claim(result("d0")), NOW + dt.timedelta(seconds=600), "failed", ((DRIVER, POOL, "d0"),)),
        # Conditions met in time stay met after the timeout.
        (
            claim(result("d0"), devices=[device_status("d0", "True", "False")]),
            NOW + dt.timedelta(hours=1),
            "ready",
            (),
        ),
    ],
)
def test_binding_verdicts(
    the_claim: dict[str, Any],
    now: dt.datetime,
    state: str,
    failed: tuple[tuple[str, str, str], ...],
) -> None:
    verdict = binding_verdict(the_claim, now, 600)
    assert verdict.state == state
    if state == "failed":
        assert verdict.devices == failed


def test_a_failure_verdict_names_the_condition_and_the_device() -> None:
    verdict = binding_verdict(
        claim(result("d1"), devices=[device_status("d1", "False", "True")]), NOW, 600
    )
    assert verdict.reason == (
        "binding failure condition FabricDeviceFailed is True for device us-east/rack-01/d1"
    )


def test_without_a_timestamp_there_is_no_timeout() -> None:
    the_claim = claim(result("d0"))
    del the_claim["status"]["allocation"]["allocationTimestamp"]
    assert binding_verdict(the_claim, NOW + dt.timedelta(days=9), 600).state == "waiting"


# ----------------------------------------------------------------------------- status writes
def test_allocating_writes_allocation_timestamp_and_the_consumer_once() -> None:
    allocation = {"devices": {"results": [result("d0")], "config": []}}
    status = allocated_status({}, allocation, pod(), NOW)
    assert status == {
        "allocation": {**allocation, "allocationTimestamp": "2026-11-30T12:00:00Z"},
        "reservedFor": [{"resource": "pods", "name": "p1", "uid": "uid-p1"}],
    }
    # A second consumer of an allocated claim: only reservedFor grows, and only once.
    shared = allocated_status(status, None, pod("p2", uid="uid-p2"), NOW)
    assert shared["allocation"] == status["allocation"]
    assert [r["uid"] for r in shared["reservedFor"]] == ["uid-p1", "uid-p2"]
    assert allocated_status(shared, None, pod("p2", uid="uid-p2"), NOW) == shared


def test_giving_back_removes_the_consumer_and_the_allocation_with_the_last_one() -> None:
    two = claim(
        result("d0"),
        devices=[device_status("d0", "True", "False")],
        reserved=[
            {"resource": "pods", "name": "p1", "uid": "u1"},
            {"resource": "pods", "name": "p2", "uid": "u2"},
        ],
    )["status"]
    one = without_consumers(two, ["u1"])
    assert one is not None
    assert one["reservedFor"] == [{"resource": "pods", "name": "p2", "uid": "u2"}]
    assert one["allocation"] == two["allocation"] and one["devices"] == two["devices"]
    assert without_consumers(one, ["u2"]) == {}
    assert without_consumers(one, ["not-a-consumer"]) is None
    # Allocated with no consumer at all: cleared (nothing holds it).
    assert without_consumers(claim(result("d0"))["status"], []) == {}
    assert without_consumers({}, ["u1"]) is None


def test_devices_in_use_leave_out_excluded_claims_and_admin_access() -> None:
    claims = [
        claim(result("d0"), uid="a"),
        claim(result("d1"), uid="b"),
        claim(result("d2", admin=True), uid="c"),
        claim(uid="d"),
    ]
    assert devices_in_use(claims) == {(DRIVER, POOL, "d0"), (DRIVER, POOL, "d1")}
    assert devices_in_use(claims, exclude={"a"}) == {(DRIVER, POOL, "d1")}


def test_a_node_must_fit_every_allocated_claim() -> None:
    one_node = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]
    }
    by_rack = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}
        ]
    }
    n1 = {"metadata": {"name": "n1", "labels": {"rack": "r1"}}}
    n2 = {"metadata": {"name": "n2", "labels": {"rack": "r1"}}}
    claims = [claim(result("d0"), node_selector=by_rack), claim(result("d1"))]
    assert node_fits(n1, claims) and node_fits(n2, claims)
    claims.append(claim(result("d2"), node_selector=one_node))
    assert node_fits(n1, claims) and not node_fits(n2, claims)


# ----------------------------------------------------------------------------- caches
@pytest.mark.parametrize(
    ("cached_rv", "written_rv", "winner"),
    [
        ("5", "7", "written"),
        ("7", "7", "cached"),
        ("9", "7", "cached"),
        ("x", "7", "cached"),
        (None, "7", "written"),
    ],
)
def test_the_newer_object_wins_by_integer_resource_version(
    cached_rv: str | None, written_rv: str, winner: str
) -> None:
    written = {"metadata": {"resourceVersion": written_rv}, "which": "written"}
    cached = (
        None
        if cached_rv is None
        else {"metadata": {"resourceVersion": cached_rv}, "which": "cached"}
    )
    found = newer(cached, written)
    assert found is not None and found["which"] == winner
    assert newer(cached, None) is cached


def test_failed_devices_are_remembered_for_a_while() -> None:
    clock = [100.0]
    memory = FailedDevices(30.0, lambda: clock[0])
    memory.remember([(DRIVER, POOL, "d0")])
    clock[0] = 129.9
    assert memory.active() == {(DRIVER, POOL, "d0")}
    clock[0] = 130.0
    assert memory.active() == set()


def test_times_are_whole_seconds_in_utc_and_read_back() -> None:
    moment = dt.datetime(2026, 11, 30, 13, 0, 5, 999, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert rfc3339(moment) == "2026-11-30T12:00:05Z"
    assert parse_time("2026-11-30T12:00:05Z") == dt.datetime(2026, 11, 30, 12, 0, 5, tzinfo=dt.UTC)
    assert parse_time("yesterday") is None and parse_time(None) is None


@pytest.mark.parametrize(
    "changes",
    [
        {"poll_interval_s": 0},
        {"binding_timeout_s": -1},
        {"retry_interval_s": 0},
        {"failed_device_memory_s": -1},
    ],
)
def test_settings_refuse_impossible_times(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="scheduler: "):
        StructuredSettings(**changes)


@pytest.mark.parametrize(
    ("git_version", "minor"),
    [
        ("v1.34.2", 34),
        ("v1.35.0-alpha.1+abc", 35),
        ("1.31", 31),
        (" v1.36.0 ", 36),
        ("", None),
        ("v2.0.0", None),
        ("unknown", None),
    ],
)
def test_server_minor_reads_the_git_version(git_version: str, minor: int | None) -> None:
    assert server_minor(git_version) == minor


@pytest.mark.parametrize(
    ("minor", "kept"), [(33, False), (34, False), (35, True), (36, True), (None, True)]
)
def test_result_tolerations_are_written_from_1_35_on(minor: int | None, kept: bool) -> None:
    toleration = {"key": "k", "operator": "Exists", "effect": "NoExecute"}
    allocation = {
        "devices": {
            "results": [
                {
                    "request": "r",
                    "driver": "d",
                    "pool": "p",
                    "device": "x",
                    "tolerations": [toleration],
                },
                {"request": "s", "driver": "d", "pool": "p", "device": "y"},
            ]
        }
    }
    written = for_release(allocation, minor)
    first, second = written["devices"]["results"]
    assert ("tolerations" in first) is kept
    assert "tolerations" not in second
    assert allocation["devices"]["results"][0]["tolerations"] == [toleration]  # not changed
