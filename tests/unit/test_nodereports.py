"""The node plugin's reports: which watch events count, and the rate limit of the syncs."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.claims.nodereports import (
    DEVICE_NOT_PRESENT,
    NODE_COMPONENT,
    NodeReport,
    NodeReportSettings,
    Skip,
    TriggerGate,
    event_time,
    judge,
    parse_time,
)

STARTED = dt.datetime(2026, 3, 4, 5, 6, 7, 800_000, tzinfo=dt.UTC)


def node_event(**changes: Any) -> dict[str, Any]:
    """A core/v1 Event as app/node/agent.py writes it, ``changes`` merged over the top level."""
    event: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": "c1.abcde",
            "namespace": "apps",
            "creationTimestamp": "2026-03-04T05:06:08Z",
        },
        "involvedObject": {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "namespace": "apps",
            "name": "c1",
            "uid": "u-1",
        },
        "type": "Warning",
        "reason": DEVICE_NOT_PRESENT,
        "message": "device us-east/rack-01/gpu-0 vanished from node n1: not in sysfs",
        "source": {"component": NODE_COMPONENT, "host": "n1"},
        "reportingComponent": NODE_COMPONENT,
        "reportingInstance": f"{NODE_COMPONENT}-n1",
        "firstTimestamp": "2026-03-04T05:06:08Z",
        "lastTimestamp": "2026-03-04T05:06:08Z",
        "count": 1,
    }
    event.update(changes)
    return event


def decide(event_type: str = "ADDED", old: dict[str, Any] | None = None, **changes: Any) -> Any:
    return judge(event_type, node_event(**changes), old, since=STARTED, initial=False)


def test_a_new_node_event_is_a_report_naming_the_claim_and_the_node() -> None:
    verdict = decide()
    assert verdict == NodeReport(
        event="apps/c1.abcde",
        reason=DEVICE_NOT_PRESENT,
        namespace="apps",
        claim="c1",
        claim_uid="u-1",
        node="n1",
        message="device us-east/rack-01/gpu-0 vanished from node n1: not in sysfs",
        at=dt.datetime(2026, 3, 4, 5, 6, 8, tzinfo=dt.UTC),
    )


@pytest.mark.parametrize(
    ("event_type", "changes", "initial", "why"),
    [
        pytest.param("ADDED", {}, True, "listed at start", id="the initial list is history"),
        pytest.param("DELETED", {}, False, "deleted", id="a deletion is no report"),
        pytest.param(
            "ADDED", {"reason": "DevicePresentOnNode"}, False, "is not", id="another reason"
        ),
        pytest.param(
            "ADDED",
            {"reportingComponent": "kubelet"},
            False,
            "reported by 'kubelet'",
            id="another reporter",
        ),
        pytest.param(
            "ADDED",
            {"reportingComponent": ""},
            False,
            "reported by 'nobody'",
            id="no reporter, even with our source component",
        ),
        pytest.param(
            "ADDED",
            {"involvedObject": {"kind": "Pod", "name": "p", "namespace": "apps"}},
            False,
            "about a Pod",
            id="about a pod",
        ),
        pytest.param(
            "ADDED",
            {
                "lastTimestamp": "2026-03-04T04:00:00Z",
                "firstTimestamp": "2026-03-04T04:00:00Z",
                "metadata": {"name": "old", "namespace": "apps"},
            },
            False,
            "before the watch started",
            id="older than the watch",
        ),
    ],
)
def test_events_that_are_not_new_node_reports_are_skipped(
    event_type: str, changes: dict[str, Any], initial: bool, why: str
) -> None:
    verdict = judge(event_type, node_event(**changes), None, since=STARTED, initial=initial)
    assert isinstance(verdict, Skip)
    assert why in verdict.why
    assert not verdict.malformed


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        pytest.param(
            {"involvedObject": "c1"}, "involvedObject is not an object", id="not an object"
        ),
        pytest.param(
            {"involvedObject": {"kind": "ResourceClaim", "namespace": "apps"}},
            "involvedObject has no name",
            id="no claim name",
        ),
        pytest.param(
            {"lastTimestamp": "yesterday"},
            "lastTimestamp 'yesterday' is not an RFC 3339 time",
            id="unparsable time",
        ),
        pytest.param(
            {"lastTimestamp": "2026-03-04T05:06:08"},
            "lastTimestamp '2026-03-04T05:06:08' has no time zone",
            id="time without a zone",
        ),
        pytest.param(
            {"eventTime": 1700000000}, "eventTime 1700000000 is not a string", id="time a number"
        ),
        pytest.param(
            {"series": {"lastObservedTime": "x"}},
            "series.lastObservedTime 'x' is not an RFC 3339 time",
            id="bad series time",
        ),
    ],
)
def test_malformed_node_events_are_skipped_with_the_field_named(
    changes: dict[str, Any], why: str
) -> None:
    verdict = decide(**changes)
    assert isinstance(verdict, Skip)
    assert verdict.malformed
    assert verdict.why == f"event apps/c1.abcde: {why}"


def test_an_event_without_metadata_is_named_by_question_marks() -> None:
    verdict = judge("ADDED", {"reason": "Other"}, None, since=STARTED, initial=False)
    assert isinstance(verdict, Skip)
    assert verdict.why.startswith("event ?/?:")


def test_a_report_in_the_second_the_watch_started_counts_despite_second_precision() -> None:
    # STARTED is 05:06:07.8; the node's timestamp is truncated to 05:06:07.
    assert isinstance(decide(lastTimestamp="2026-03-04T05:06:07Z"), NodeReport)


def test_a_node_clock_behind_by_less_than_the_allowed_skew_still_counts() -> None:
    event = node_event(
        lastTimestamp="2026-03-04T05:05:50Z",
        firstTimestamp="2026-03-04T05:05:50Z",
        metadata={"name": "e", "namespace": "apps"},
    )
    assert isinstance(judge("ADDED", event, None, since=STARTED, initial=False), NodeReport)
    strict = judge("ADDED", event, None, since=STARTED, initial=False, clock_skew_s=0)
    assert isinstance(strict, Skip)


def test_an_update_counts_only_when_it_records_a_new_occurrence() -> None:
    old = node_event()
    relabelled = node_event(metadata={**old["metadata"], "labels": {"a": "b"}})
    assert isinstance(judge("MODIFIED", relabelled, old, since=STARTED, initial=False), Skip)
    again = node_event(count=2, lastTimestamp="2026-03-04T05:07:00Z")
    verdict = judge("MODIFIED", again, old, since=STARTED, initial=False)
    assert isinstance(verdict, NodeReport)
    assert verdict.at == dt.datetime(2026, 3, 4, 5, 7, tzinfo=dt.UTC)


def test_the_node_falls_back_to_the_reporting_instance() -> None:
    verdict = decide(source={"component": NODE_COMPONENT})
    assert isinstance(verdict, NodeReport)
    assert verdict.node == f"{NODE_COMPONENT}-n1"


def test_event_time_is_the_newest_timestamp_present() -> None:
    event = node_event(
        lastTimestamp=None,
        firstTimestamp=None,
        eventTime="2026-03-04T05:06:09.250000Z",
        series={"count": 3, "lastObservedTime": "2026-03-04T05:06:30.000000Z"},
    )
    assert event_time(event) == dt.datetime(2026, 3, 4, 5, 6, 30, tzinfo=dt.UTC)
    assert event_time({}) is None
    assert parse_time("2026-03-04T07:06:08+02:00", "t") == dt.datetime(
        2026, 3, 4, 5, 6, 8, tzinfo=dt.UTC
    )
    assert parse_time("", "t") is None


# -- the rate limit ---------------------------------------------------------------------------


def test_a_burst_of_reports_costs_one_sync() -> None:
    gate = TriggerGate(min_interval_s=5, gather_s=0.5)
    assert gate.offer(100.0) == 100.5
    assert [gate.offer(100.0 + i / 10) for i in range(1, 20)] == [None] * 19
    gate.fire(100.5)
    assert gate.pending_at is None


def test_a_report_soon_after_a_sync_waits_for_the_interval_then_fires_once() -> None:
    gate = TriggerGate(min_interval_s=5, gather_s=0.5)
    gate.offer(0.0)
    gate.fire(0.5)
    assert gate.offer(1.0) == 5.5
    assert gate.offer(2.0) is None
    gate.fire(5.5)
    assert gate.offer(20.0) == 20.5  # long after: only the gather delay


@pytest.mark.parametrize(
    ("min_interval_s", "gather_s", "message"),
    [
        (0, 0.5, "min_interval_s must be > 0, not 0"),
        (-1, 0.5, "min_interval_s must be > 0, not -1"),
        (5, -0.1, "gather_s must be >= 0, not -0.1"),
        (float("nan"), 0.5, "min_interval_s must be > 0, not nan"),
    ],
)
def test_bad_gate_settings_are_refused_with_the_setting_named(
    min_interval_s: float, gather_s: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TriggerGate(min_interval_s, gather_s)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"min_interval_s": 0}, "node reports: min_interval_s must be > 0, not 0"),
        ({"gather_s": -1}, "node reports: gather_s must be >= 0, not -1"),
        ({"clock_skew_s": -1}, "node reports: clock_skew_s must be >= 0, not -1"),
    ],
)
def test_bad_watch_settings_are_refused_with_the_setting_named(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        NodeReportSettings(**changes)


def _simulate(gate: TriggerGate, offsets: list[float]) -> tuple[list[float], list[float]]:
    """Feed reports at the given times; fire each pending trigger at its time. Returns
    (report times, fire times)."""
    reports: list[float] = []
    fires: list[float] = []
    now = 0.0
    for step in offsets:
        now += step
        if gate.pending_at is not None and gate.pending_at <= now:
            fires.append(gate.pending_at)
            gate.fire(gate.pending_at)
        reports.append(now)
        gate.offer(now)
    if gate.pending_at is not None:
        fires.append(gate.pending_at)
        gate.fire(gate.pending_at)
    return reports, fires


@given(
    offsets=st.lists(st.floats(min_value=0, max_value=20, allow_nan=False), max_size=60),
    min_interval_s=st.floats(min_value=0.1, max_value=10),
    gather_s=st.floats(min_value=0, max_value=3),
)
def test_syncs_are_spaced_and_every_report_is_followed_by_one(
    offsets: list[float], min_interval_s: float, gather_s: float
) -> None:
    gate = TriggerGate(min_interval_s, gather_s)
    reports, fires = _simulate(gate, offsets)
    # Never two syncs closer than the interval.
    assert all(b - a >= min_interval_s - 1e-9 for a, b in itertools.pairwise(fires))
    # Every report has a sync at or after it, within the interval plus the gather delay.
    for at in reports:
        assert any(at <= f <= at + min_interval_s + gather_s + 1e-9 for f in fires)
    # No more syncs than reports.
    assert len(fires) <= len(reports)
