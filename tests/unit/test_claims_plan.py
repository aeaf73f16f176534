"""Claim planning and the claim model: pure functions."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.claims.model import (
    DeviceReport,
    InvalidClaimConfig,
    WantedDevice,
    consumer_pods,
    device_status_entries,
    effective_config,
    node_from_allocation,
    same_device_status,
    wanted_devices,
)
from app.claims.plan import ClaimWants, plan_claim, wait_for_holder
from app.reservations import (
    ATTACHED,
    ATTACHING,
    DETACH_FAILED,
    DETACHING,
    FAILED,
    PENDING,
    STATES,
    ClaimRef,
    ReservationView,
)

DRIVER = "fabric.example.com"
NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def reservation(
    i: int, state: str, device: str, *, request: str = "gpu", host: str = "h1", pool: str = "p"
) -> ReservationView:
    return ReservationView(
        id=i,
        claim=ClaimRef("u", "ns", "c"),
        request=request,
        mode="structured",
        device_id=i,
        device_name=device,
        pool=pool,
        exclusive=True,
        node="n1",
        host_id=host,
        state=state,
        attempts=0,
        last_error=None,
        operation_id=None,
        created_at=NOW,
        updated_at=NOW,
        attached_at=None,
        released_at=None,
    )


def want(
    *devices: str, node: str | None = "n1", host: str | None = "h1", error: str | None = None
) -> ClaimWants:
    return ClaimWants(tuple(WantedDevice("gpu", "p", d) for d in devices), node, host, error)


def test_new_allocation_reserves_every_device() -> None:
    plan = plan_claim(want("a", "b"), [])
    assert [w.device for w in plan.reserve] == ["a", "b"] and not plan.requeue


def test_pending_and_attaching_reservations_are_attached() -> None:
    rows = [reservation(1, PENDING, "a"), reservation(2, ATTACHING, "b")]
    plan = plan_claim(want("a", "b"), rows)
    assert [r.id for r in plan.attach] == [1, 2] and not plan.reserve


def test_attached_is_reported_ready_and_nothing_else_happens() -> None:
    plan = plan_claim(want("a"), [reservation(1, ATTACHED, "a")])
    assert [r.id for r in plan.ready] == [1] and plan.idle


def test_deallocated_claim_releases_everything() -> None:
    rows = [
        reservation(1, ATTACHED, "a"),
        reservation(2, FAILED, "b"),
        reservation(3, PENDING, "c"),
    ]
    plan = plan_claim(ClaimWants(), rows)
    assert [r.id for r in plan.release] == [1, 2, 3] and not plan.reserve


def test_device_leaving_the_results_is_released() -> None:
    plan = plan_claim(want("a"), [reservation(1, ATTACHED, "a"), reservation(2, ATTACHED, "b")])
    assert [r.id for r in plan.release] == [2] and [r.id for r in plan.ready] == [1]


def test_allocation_to_another_host_moves_the_device() -> None:
    plan = plan_claim(want("a", host="h2"), [reservation(1, ATTACHED, "a", host="h1")])
    assert [r.id for r in plan.release] == [1]
    assert plan.reserve == () and plan.requeue  # reserve again after the release


def test_detaching_reservation_still_wanted_finishes_first() -> None:
    plan = plan_claim(want("a"), [reservation(1, DETACHING, "a")])
    assert [r.id for r in plan.release] == [1] and plan.requeue and not plan.reserve


def test_unknown_node_or_host_waits() -> None:
    assert plan_claim(want("a", node=None, host=None), []).waiting[0][1].startswith("waiting")
    plan = plan_claim(want("a", host=None), [])
    assert "maps to no fabric host" in plan.waiting[0][1] and plan.requeue


def test_bad_config_refuses_without_reserving() -> None:
    plan = plan_claim(want("a", error="config[0]: bad"), [])
    assert plan.refuse == ((WantedDevice("gpu", "p", "a"), "config[0]: bad"),)
    assert plan.idle


def test_failed_reservation_is_reported_until_reallocation() -> None:
    plan = plan_claim(want("a"), [reservation(1, FAILED, "a")])
    assert [r.id for r in plan.failed] == [1] and plan.idle


def _failed_repair(error: str = "attach a: not effective", *, attached: bool = True) -> Any:
    return dataclasses.replace(
        reservation(1, FAILED, "a"),
        attached_at=NOW - dt.timedelta(hours=1) if attached else None,
        last_error=error,
    )


@given(
    waited=st.integers(min_value=0, max_value=10_000_000),  # milliseconds
    after=st.integers(min_value=1_000, max_value=3_600_000),
)
def test_a_failed_repair_is_tried_again_once_its_time_has_come(waited: int, after: int) -> None:
    # A lost attachment that could not be attached again: its pod runs on the node, so it is
    # looked at again (requeue) and tried again once `after` seconds have passed.
    plan = plan_claim(
        want("a"),
        [_failed_repair()],
        NOW + dt.timedelta(milliseconds=waited),
        repair_after_s=after / 1000,
    )
    assert plan.requeue
    if waited >= after:
        assert [r.id for r in plan.retry] == [1] and not plan.failed and not plan.idle
    else:
        assert [r.id for r in plan.failed] == [1] and not plan.retry and plan.idle


@pytest.mark.parametrize(
    ("row", "wants", "now"),
    [
        # A first attach that failed: the scheduler places the pod elsewhere.
        (_failed_repair(attached=False), want("a"), NOW + dt.timedelta(days=1)),
        # Found on another host: not ours to take back.
        (
            _failed_repair("device a lost ... but the fabric now shows it on host h9"),
            want("a"),
            NOW + dt.timedelta(days=1),
        ),
        # The node maps to no host now: nothing to attach to.
        (_failed_repair(), want("a", host=None), NOW + dt.timedelta(days=1)),
        # No time given: never.
        (_failed_repair(), want("a"), None),
    ],
)
def test_other_failed_reservations_are_never_tried_again(
    row: ReservationView, wants: ClaimWants, now: dt.datetime | None
) -> None:
    plan = plan_claim(wants, [row], now)
    assert not plan.retry and [r.id for r in plan.failed] == [1] and plan.idle


def test_a_detach_failed_reservation_is_neither_released_nor_retried() -> None:
    plan = plan_claim(ClaimWants(), [reservation(1, DETACH_FAILED, "a")])
    assert [r.id for r in plan.stuck] == [1]
    assert plan.idle and not plan.release and not plan.requeue


def test_a_wanted_device_held_by_a_detach_failed_reservation_is_reported_failed() -> None:
    plan = plan_claim(want("a"), [reservation(1, DETACH_FAILED, "a")])
    assert [r.id for r in plan.failed] == [1] and not plan.reserve and plan.idle


def test_a_lost_device_reports_not_ready_without_the_failure_condition() -> None:
    claim = claim_with([result("gpu-a")])
    key = WantedDevice("gpu", "us-east/rack-01", "gpu-a")
    lost = DeviceReport(key, False, "DeviceLost", "lost its attachment", failed=False)
    [entry] = device_status_entries(
        claim, DRIVER, [lost], ["FabricDeviceReady"], ["FabricDeviceFailed"], NOW
    )
    assert {c["type"]: c["status"] for c in entry["conditions"]} == {
        "FabricDeviceReady": "False",
        "FabricDeviceFailed": "False",
    }
    assert {c["reason"] for c in entry["conditions"]} == {"DeviceLost"}


def test_duplicate_reservation_for_one_result_is_released() -> None:
    plan = plan_claim(want("a"), [reservation(1, ATTACHED, "a"), reservation(2, PENDING, "a")])
    assert [r.id for r in plan.ready] == [1] and [r.id for r in plan.release] == [2]


@settings(max_examples=300)
@given(
    wanted=st.sets(st.sampled_from("abcdef"), max_size=6),
    held=st.dictionaries(
        st.sampled_from("abcdefgh"),
        st.tuples(
            st.sampled_from([s for s in STATES if s != "released"]), st.sampled_from(["h1", "h2"])
        ),
        max_size=8,
    ),
    host=st.sampled_from(["h1", "h2", None]),
)
def test_every_result_and_reservation_gets_exactly_one_fate(
    wanted: set[str], held: dict[str, tuple[str, str]], host: str | None
) -> None:
    rows = [
        reservation(i, state, device, host=h)
        for i, (device, (state, h)) in enumerate(sorted(held.items()), start=1)
    ]
    plan = plan_claim(want(*sorted(wanted), host=host), rows)
    kept = [*plan.attach, *plan.ready, *plan.failed]
    waiting = {w.device for w, _ in plan.waiting}
    parked = [r for r in rows if r.device_name in waiting and r not in plan.release]
    stuck_only = [r for r in plan.stuck if r not in plan.failed]
    # Reservations: each is kept, parked (waiting for its host), released or stuck
    # (detach-failed, reported failed when still wanted), once.
    assert sorted(r.id for r in [*kept, *parked, *plan.release, *stuck_only]) == [
        r.id for r in rows
    ]
    assert all(r.state == DETACH_FAILED for r in plan.stuck)
    assert not any(r.state == DETACH_FAILED for r in [*plan.release, *plan.attach])
    # Results: each is in one bucket, or waits for its release (requeue).
    buckets = [
        *[r.device_name for r in kept],
        *[w.device for w in plan.reserve],
        *[w.device for w, _ in plan.refuse],
        *[w.device for w, _ in plan.waiting],
    ]
    assert len(buckets) == len(set(buckets))
    released = {r.device_name for r in plan.release}
    for device in wanted:
        assert device in buckets or (device in released and plan.requeue)
    # Nothing is attached to a host other than the claim's.
    assert all(r.host_id == host for r in plan.attach)
    assert all(r.device_name in wanted for r in kept)


def claim_with(
    results: list[dict[str, Any]],
    *,
    selector: dict | None = None,
    config: list | None = None,
    devices: list | None = None,
) -> dict[str, Any]:
    allocation: dict[str, Any] = {"devices": {"results": results, "config": config or []}}
    if selector is not None:
        allocation["nodeSelector"] = selector
    status: dict[str, Any] = {"allocation": allocation}
    if devices is not None:
        status["devices"] = devices
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "u"}, "status": status}


def result(device: str, *, driver: str = DRIVER, request: str = "gpu") -> dict[str, str]:
    return {"request": request, "driver": driver, "pool": "us-east/rack-01", "device": device}


def test_wanted_devices_are_ours_only() -> None:
    claim = claim_with([result("b"), result("x", driver="other.example.com"), result("a")])
    assert [w.device for w in wanted_devices(claim, DRIVER)] == ["a", "b"]
    assert wanted_devices({"status": {}}, DRIVER) == []


@pytest.mark.parametrize(
    ("selector", "node"),
    [
        (
            {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["worker-1"]}
                        ]
                    }
                ]
            },
            "worker-1",
        ),
        (
            {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": ["worker-2"],
                            }
                        ]
                    }
                ]
            },
            "worker-2",
        ),
        (
            {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/region",
                                "operator": "In",
                                "values": ["us"],
                            }
                        ]
                    }
                ]
            },
            None,
        ),
        (
            {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["a", "b"]}
                        ]
                    }
                ]
            },
            None,
        ),
        ({"nodeSelectorTerms": [{}, {}]}, None),
        (None, None),
    ],
)
def test_node_from_allocation(selector: dict | None, node: str | None) -> None:
    assert node_from_allocation(claim_with([result("a")], selector=selector)) == node


def test_consumer_pods() -> None:
    claim = {
        "status": {
            "reservedFor": [
                {"resource": "pods", "name": "p1", "uid": "1"},
                {"resource": "jobs", "name": "j", "uid": "2"},
            ]
        }
    }
    assert consumer_pods(claim) == ["p1"]


def opaque(
    params: Any,
    *,
    requests: list[str] | None = None,
    source: str = "FromClaim",
    driver: str = DRIVER,
) -> dict[str, Any]:
    return {
        "source": source,
        "requests": requests or [],
        "opaque": {"driver": driver, "parameters": params},
    }


GOOD = {"apiVersion": "fabric-dra.io/v1alpha1", "kind": "FabricDeviceConfig"}


def test_config_class_first_then_claim_scoped_by_request() -> None:
    claim = claim_with(
        [result("a"), result("b", request="nic")],
        config=[
            opaque(
                {**GOOD, "maxAttachAttempts": 2, "attachTimeoutSeconds": 30}, source="FromClass"
            ),
            opaque({**GOOD, "maxAttachAttempts": 9}, requests=["gpu"]),
            opaque({"anything": 1}, driver="other.example.com"),
        ],
    )
    config = effective_config(claim, DRIVER, ["gpu", "nic"])
    assert (config["gpu"].max_attach_attempts, config["gpu"].attach_timeout_s) == (9, 30)
    assert (config["nic"].max_attach_attempts, config["nic"].attach_timeout_s) == (2, 30)
    assert effective_config(claim_with([]), DRIVER, ["gpu"])["gpu"].max_attach_attempts == 5


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({**GOOD, "maxAttachAttempts": 99}, "maxAttachAttempts: Input should be less than"),
        ({**GOOD, "colour": "blue"}, "colour: Extra inputs are not permitted"),
        ({"kind": "FabricDeviceConfig"}, "apiVersion: Field required"),
        ({**GOOD, "apiVersion": "v2"}, "apiVersion: Input should be"),
        ("not an object", "parameters: Input should be a valid dictionary"),
        (None, "Input should be a valid dictionary"),
        ({**GOOD, "attachTimeoutSeconds": "soon"}, "attachTimeoutSeconds"),
    ],
)
def test_bad_config_names_the_entry(params: Any, message: str) -> None:
    claim = claim_with([result("a")], config=[opaque(params, requests=["gpu"])])
    with pytest.raises(InvalidClaimConfig) as err:
        effective_config(claim, DRIVER, ["gpu"])
    assert "config[0] (FromClaim) for requests ['gpu']" in str(err.value)
    assert message in str(err.value)


def test_device_status_entries_keep_other_drivers_and_transition_times() -> None:
    other = {"driver": "other.example.com", "pool": "x", "device": "y", "conditions": []}
    claim = claim_with([result("a"), result("b")], devices=[other])
    wanted_a = WantedDevice("gpu", "us-east/rack-01", "a")
    wanted_b = WantedDevice("gpu", "us-east/rack-01", "b")
    reports = [
        DeviceReport(
            wanted_a, True, "Attached", "attached to host h1", {"uuid": "U-1", "host": "h1"}
        ),
        DeviceReport(wanted_b, None, "", ""),
    ]
    entries = device_status_entries(claim, DRIVER, reports, ["Ready"], ["Failed"], NOW)
    assert entries[0] == other
    assert len(entries) == 2
    ours = entries[1]
    assert ours["data"] == {"uuid": "U-1", "host": "h1"}
    assert [(c["type"], c["status"], c["reason"]) for c in ours["conditions"]] == [
        ("Ready", "True", "Attached"),
        ("Failed", "False", "Attached"),
    ]
    assert ours["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    later = NOW + dt.timedelta(hours=1)
    claim["status"]["devices"] = entries
    again = device_status_entries(claim, DRIVER, reports, ["Ready"], ["Failed"], later)
    assert same_device_status(again, entries)  # same status: same transition time, no write
    failed = device_status_entries(
        claim,
        DRIVER,
        [DeviceReport(wanted_a, False, "AttachFailed", "409")],
        ["Ready"],
        ["Failed"],
        later,
    )
    assert failed[1]["conditions"][1] == {
        "type": "Failed",
        "status": "True",
        "reason": "AttachFailed",
        "message": "409",
        "lastTransitionTime": "2026-01-02T04:04:05Z",
    }


def test_a_device_held_by_a_release_in_progress_is_waited_for() -> None:
    detaching = reservation(7, DETACHING, "d1")
    verdict = wait_for_holder("d1", detaching, holder_keeps=False, mode="structured")
    assert verdict.wait and not verdict.live
    assert verdict.message.startswith("waiting for device d1: claim ns/c holds it")
    assert "reservation 7, state detaching, host h1" in verdict.message
    # The holder's claim let go of it, but its release has not run yet.
    for state in (PENDING, ATTACHING, ATTACHED, FAILED):
        verdict = wait_for_holder(
            "d1", reservation(7, state, "d1"), holder_keeps=False, mode="structured"
        )
        assert verdict.wait and not verdict.live, state
        assert f"state {state}" in verdict.message and "no longer has it" in verdict.message
    # Released since the reserve was refused: try again.
    assert wait_for_holder("d1", None, holder_keeps=False, mode="structured").wait


def test_a_device_a_live_claim_keeps_is_waited_for_and_called_a_double_allocation() -> None:
    verdict = wait_for_holder(
        "d1", reservation(7, ATTACHED, "d1"), holder_keeps=True, mode="structured"
    )
    assert verdict.wait and verdict.live
    assert "allocated twice" in verdict.message and "binding timeout" in verdict.message
    # A detach in progress is a release, whatever the claim cache says.
    assert not wait_for_holder(
        "d1", reservation(7, DETACHING, "d1"), holder_keeps=True, mode="structured"
    ).live


def test_a_device_whose_holder_failed_to_detach_is_not_waited_for() -> None:
    verdict = wait_for_holder(
        "d1", reservation(7, DETACH_FAILED, "d1"), holder_keeps=False, mode="structured"
    )
    assert not verdict.wait
    assert "cannot be reserved" in verdict.message and "forget" in verdict.message


def test_a_holder_of_the_other_mode_is_named_with_its_mode() -> None:
    from dataclasses import replace

    classic = replace(reservation(7, DETACHING, "d1"), mode="control-plane")
    verdict = wait_for_holder("d1", classic, holder_keeps=False, mode="structured")
    assert verdict.wait and "claim ns/c (control-plane mode) holds it" in verdict.message


def test_a_waiting_device_is_not_ready_and_not_failed() -> None:
    claim = claim_with([result("a")])
    wanted_a = WantedDevice("gpu", "us-east/rack-01", "a")
    waiting = DeviceReport(
        wanted_a, False, "WaitingForDetach", "waiting for device a", failed=False
    )
    (entry,) = device_status_entries(claim, DRIVER, [waiting], ["Ready"], ["Failed"], NOW)
    assert [(c["type"], c["status"], c["reason"]) for c in entry["conditions"]] == [
        ("Ready", "False", "WaitingForDetach"),
        ("Failed", "False", "WaitingForDetach"),
    ]
