"""The leader acts on the node plugin's reports: Events on claims whose prepared device vanished
from the host make it sync the inventory (and so check drift) at once, rate-limited. Real HTTP
against the Kubernetes API emulator; the last test runs the whole service against the Redfish
simulator with a poll interval of an hour, so only the report can make it notice the drift."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from builders import eventually
from prometheus_client import CollectorRegistry
from test_service import (  # noqa: F401 (cluster is a fixture)
    CLAIMS,
    NODES,
    allocate,
    cluster,
    ready_on,
    settings_for,
    slices,
)

from app.claims.nodereports import (
    DEVICE_NOT_PRESENT,
    FIELD_SELECTOR,
    NODE_COMPONENT,
    NodeReportSettings,
    NodeReportWatch,
)
from app.kube.client import KubeClient
from app.kube.informer import InformerSettings
from app.metrics import ClaimMetrics
from app.service import Service
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.redfish import RedfishSimulator

_names = itertools.count(1)


def node_event(
    claim: str = "c1",
    *,
    namespace: str = "default",
    reason: str = DEVICE_NOT_PRESENT,
    component: str = NODE_COMPONENT,
    kind: str = "ResourceClaim",
    uid: str = "u-1",
) -> dict[str, Any]:
    """An Event as app/node/agent.py ``_post_event`` writes it (with a fixed name)."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{claim}.{next(_names)}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": CLAIMS,
            "kind": kind,
            "namespace": namespace,
            "name": claim,
            "uid": uid,
        },
        "type": "Warning" if reason == DEVICE_NOT_PRESENT else "Normal",
        "reason": reason,
        "message": f"device us-east/rack-01/gpu-0 vanished from node {NODES[0]}: not in sysfs",
        "source": {"component": component, "host": NODES[0]},
        "reportingComponent": component,
        "reportingInstance": f"{component}-{NODES[0]}",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class Triggers:
    """A fake ``InventorySync.trigger`` counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def watch_on(
    client: KubeClient, triggers: Triggers, **changes: float
) -> tuple[NodeReportWatch, ClaimMetrics]:
    metrics = ClaimMetrics.create(CollectorRegistry())
    settings = NodeReportSettings(
        informer=InformerSettings(
            name="x", watch_timeout_s=30, backoff_initial_s=0.05, backoff_max_s=0.2
        ),
        **changes,
    )
    return NodeReportWatch(client, triggers, settings, metrics=metrics), metrics


@pytest.fixture
def triggers() -> Triggers:
    return Triggers()


@pytest.fixture
async def started(
    client: KubeClient, emu: KubeEmulator, triggers: Triggers
) -> AsyncIterator[tuple[NodeReportWatch, ClaimMetrics]]:
    """A watch (gather 0.1 s, one sync a minute at most) started after one old report."""
    emu.create(node_event("old"))
    watch, metrics = watch_on(client, triggers, gather_s=0.1, min_interval_s=60)
    await watch.start()
    try:
        await watch.events.wait_synced(10)
        yield watch, metrics
    finally:
        await watch.stop()


async def test_a_new_report_triggers_one_sync_and_the_old_ones_none(
    started: tuple[NodeReportWatch, ClaimMetrics], emu: KubeEmulator, triggers: Triggers
) -> None:
    watch, metrics = started
    assert len(watch.events.keys()) == 1
    assert watch.reports == 0  # the report listed at start is history

    emu.create(node_event("c1"))
    await eventually(lambda: triggers.calls == 1, what="a triggered sync")
    assert watch.reports == 1
    assert watch.last_report is not None
    assert (watch.last_report.namespace, watch.last_report.claim) == ("default", "c1")
    assert watch.last_report.node == NODES[0]
    assert metrics.node_reports.labels(DEVICE_NOT_PRESENT)._value.get() == 1
    # The selector went to the server, on the list and on the watch.
    queries = [r.query for r in emu.requests if r.path == "/api/v1/events"]
    assert queries and all("fieldSelector=reason%3DDeviceNotPresentOnNode" in q for q in queries)
    assert FIELD_SELECTOR == "reason=DeviceNotPresentOnNode"


async def test_reports_of_others_and_of_other_objects_are_ignored(
    started: tuple[NodeReportWatch, ClaimMetrics], emu: KubeEmulator, triggers: Triggers
) -> None:
    watch, _ = started
    back = emu.create(node_event("c2", reason="DevicePresentOnNode"))
    kubelet = emu.create(node_event("c3", component="kubelet"))
    pod = emu.create(node_event("p1", kind="Pod"))
    emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}})
    emu.create(node_event("c4", namespace="apps"))
    # Events arrive in order: once the last is counted, the others were judged.
    await eventually(lambda: watch.reports == 1, what="the one report that counts")
    assert watch.last_report is not None and watch.last_report.claim == "c4"
    await eventually(lambda: triggers.calls == 1, what="one triggered sync")
    # The server filtered the other reason out; the rest reached the watch and were skipped.
    assert watch.events.get(back["metadata"]["name"], "default") is None
    assert watch.events.get(kubelet["metadata"]["name"], "default") is not None
    assert watch.events.get(pod["metadata"]["name"], "default") is not None


async def test_a_burst_of_reports_costs_one_sync(
    started: tuple[NodeReportWatch, ClaimMetrics], emu: KubeEmulator, triggers: Triggers
) -> None:
    watch, metrics = started
    for i in range(10):
        emu.create(node_event(f"burst-{i}"))
    await eventually(lambda: watch.reports == 10, what="ten reports")
    await eventually(lambda: triggers.calls == 1, what="the burst's sync")
    assert metrics.node_reports.labels(DEVICE_NOT_PRESENT)._value.get() == 10
    # A report within the interval waits for it (a minute here): no second sync yet, and
    # stopping the watch drops the pending one (the fixture's stop; no task is left behind).
    emu.create(node_event("late"))
    await eventually(lambda: watch.reports == 11, what="the late report")
    assert watch.gate.pending_at is not None
    assert triggers.calls == 1


async def test_an_update_recording_a_new_occurrence_is_a_new_report(
    started: tuple[NodeReportWatch, ClaimMetrics], emu: KubeEmulator, triggers: Triggers
) -> None:
    watch, _ = started
    created = emu.create(node_event("c1"))
    await eventually(lambda: watch.reports == 1, what="the first report")
    relabelled = {**created, "metadata": {**created["metadata"], "labels": {"seen": "yes"}}}
    relabelled = emu.update(relabelled)
    name, version = relabelled["metadata"]["name"], relabelled["metadata"]["resourceVersion"]
    await eventually(
        lambda: (
            (watch.events.get(name, "default") or {}).get("metadata", {}).get("resourceVersion")
            == version
        ),
        what="the relabelled Event",
    )
    assert watch.reports == 1  # no new occurrence
    emu.update({**relabelled, "count": 2})
    await eventually(lambda: watch.reports == 2, what="the repeated report")


async def test_a_re_list_after_expired_watches_replays_no_report(
    started: tuple[NodeReportWatch, ClaimMetrics], emu: KubeEmulator, triggers: Triggers
) -> None:
    watch, _ = started
    emu.create(node_event("c1"))
    await eventually(lambda: watch.reports == 1, what="the first report")
    lists = watch.events.list_count
    emu.compact()
    emu.expire_watches("events")
    await eventually(lambda: watch.events.list_count > lists, what="a re-list")
    emu.create(node_event("c2"))
    await eventually(lambda: watch.reports == 2, what="the report after the re-list")
    assert watch.last_report is not None and watch.last_report.claim == "c2"


async def test_reports_after_the_interval_trigger_again(
    client: KubeClient, emu: KubeEmulator, triggers: Triggers
) -> None:
    watch, _ = watch_on(client, triggers, gather_s=0, min_interval_s=0.2)
    await watch.start()
    try:
        await watch.events.wait_synced(10)
        emu.create(node_event("c1"))
        await eventually(lambda: triggers.calls == 1, what="the first sync")
        emu.create(node_event("c2"))
        await eventually(lambda: triggers.calls == 2, what="the second sync")
        assert watch.reports == 2
    finally:
        await watch.stop()


# -- through the whole service to drift ---------------------------------------------------------


async def test_a_node_report_makes_the_service_find_a_lost_device_long_before_the_next_poll(
    tmp_path: Path,
    cluster: tuple[KubeEmulator, RedfishSimulator],  # noqa: F811
) -> None:
    emu, sim = cluster
    settings = settings_for(
        tmp_path,
        emu,
        sim,
        f"sqlite+aiosqlite:///{tmp_path}/nr.db",
        FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS="3600",
    )
    service = Service(settings)
    await service.start()
    try:
        await eventually(lambda: len(slices(emu)) == 1, what="the pool's slice", timeout_s=20)
        device = slices(emu)[0]["spec"]["devices"][0]["name"]
        allocate(emu, "default", "c1", device, NODES[0])
        await eventually(lambda: ready_on(emu, "default", "c1"), what="ready", timeout_s=20)
        # Reports written before the watch's first list are history: wait for it.
        await eventually(
            lambda: (
                service.leading is not None
                and service.leading.node_reports is not None
                and service.leading.node_reports.events.has_synced.is_set()
            ),
            what="the node-report watch synced",
        )
        [block] = [b for b, h in sim.attachments().items() if h == NODES[0]]
        claim = emu.get(CLAIMS, "ResourceClaim", "c1", "default")
        assert claim is not None
        sim.detach_out_of_band(block)  # the fabric manager lost it; the next poll is an hour away
        emu.create(node_event("c1", uid=claim["metadata"]["uid"]))
        await eventually(
            lambda: any(
                e.get("reason") == "DeviceLost" for e in emu.list("v1", "Event", "default")
            ),
            what="a DeviceLost Event after the node's report",
            timeout_s=20,
        )
        await eventually(lambda: sim.attachments()[block] == NODES[0], what="attached again")
        await eventually(lambda: ready_on(emu, "default", "c1"), what="ready again")
        counted = service.metrics.claims.node_reports.labels(DEVICE_NOT_PRESENT)._value.get()
        assert counted == 1
        assert service.metrics.claims.drift.labels("lost")._value.get() == 1
    finally:
        await service.stop(deadline_s=10)
