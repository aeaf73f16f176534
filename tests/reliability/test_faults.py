"""The fault matrix: each fault is injected into a running service (in process, SQLite unless
said otherwise), the trouble must show in readiness or metrics while it lasts, and once the
fault is gone the service must converge: the claim's device attached once and reported ready,
or, after the claim is gone, nothing attached and nothing held.

PostgreSQL: the machine's server is shared with other tests, so it is never stopped; the
service talks to it through a small TCP proxy of this module (asyncio, 127.0.0.1) that is cut
(every connection closed, new ones refused) and restored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from reliability_driver import NODES, Cluster, eventually
from reliability_service import Running, start_service

from app.journal import Journal

pytestmark = pytest.mark.slow

ACTIONS = "/redfish/v1/Systems"
BLOCKS = "/redfish/v1/CompositionService/ResourceBlocks"


async def attached_and_ready(running: Running, claim: str, device: str) -> None:
    """Wait until ``device`` is attached to NODES[0] once and Ready is True on ``claim``."""
    block = (await Journal(running.service.db).fabric_device_by_name(device)).attach_unit
    await eventually(
        lambda: running.condition(claim, "FabricDeviceReady") == "True",
        timeout_s=30,
        what=f"{claim} ready",
    )
    assert running.cluster.sim.holders(block) == [NODES[0]]


async def freed(running: Running, claim: str) -> None:
    """Delete ``claim``; wait until nothing is attached and nothing is held."""
    running.free(claim)
    journal = Journal(running.service.db)

    async def empty() -> bool:
        return not await journal.active() and not any(running.cluster.sim.attachments().values())

    await eventually(empty, timeout_s=30, what="everything released and detached")


async def converges(running: Running, name: str = "after") -> None:
    """A new claim is attached and reported ready, then freed cleanly."""
    device = running.published_devices()[-1]
    running.allocate(name, device)
    await attached_and_ready(running, name, device)
    await freed(running, name)


# ------------------------------------------------------------------------ fabric manager
async def test_a_fabric_manager_that_is_down_marks_the_inventory_stale_until_it_returns(
    running: Running,
) -> None:
    sim = running.cluster.sim
    port = int(running.cluster.sim_url.rsplit(":", 1)[1])
    devices = running.published_devices()
    await sim.stop()
    await eventually(lambda: _stale(running, 1.0), what="stale metric while down")
    failed = await running.metric("fabric_dra_inventory_syncs_total", result="failed")
    assert failed >= 1
    assert running.published_devices() == devices  # a failed listing removes nothing
    await sim.start(port=port)
    await eventually(lambda: _stale(running, 0.0), what="stale cleared when back")
    await converges(running)


async def _stale(running: Running, value: float) -> bool:
    return await running.metric("fabric_dra_inventory_stale", backend="redfish") == value


async def test_a_slow_fabric_manager_times_out_shows_stale_and_recovers(
    cluster: Cluster,
    tmp_path: Path,
) -> None:
    running = await start_service(
        cluster,
        f"sqlite+aiosqlite:///{tmp_path}/slow.db",
        FABRIC_DRA_LEADER__ENABLED="false",
        FABRIC_DRA_FABRIC__TIMEOUT_SECONDS="1",
        FABRIC_DRA_FABRIC__RETRY_ATTEMPTS="1",
    )
    try:
        cluster.sim.faults.latency_s = 2.0
        await eventually(lambda: _stale(running, 1.0), timeout_s=30, what="stale while slow")
        cluster.sim.faults.latency_s = 0.0
        await eventually(lambda: _stale(running, 0.0), timeout_s=30, what="fresh again")
        await converges(running)
    finally:
        await running.service.stop(deadline_s=5)


async def test_5xx_answers_fail_the_sync_and_are_counted_then_it_recovers(
    running: Running,
) -> None:
    faults = running.cluster.sim.faults
    before = await running.metric("fabric_dra_inventory_syncs_total", result="failed")
    faults.error_status, faults.error_rate = 503, 1.0
    await eventually(lambda: _stale(running, 1.0), what="stale under 503s")
    assert await running.metric("fabric_dra_inventory_syncs_total", result="failed") > before
    faults.error_rate = 0.0
    await eventually(lambda: _stale(running, 0.0), what="fresh again")
    await converges(running)


async def test_a_409_on_attach_reports_the_device_failed_on_the_claim_and_counts_it(
    running: Running,
) -> None:
    # 409 (in use elsewhere) is not retried: the device is reported failed, so that the
    # scheduler gives the claim back and picks another device.
    device = running.published_devices()[0]
    running.cluster.sim.fail_next(1, method="POST", path_prefix=ACTIONS, status=409)
    running.allocate("c1", device)
    await eventually(
        lambda: running.condition("c1", "FabricDeviceFailed") == "True",
        timeout_s=30,
        what="the device reported failed",
    )
    assert (
        await running.metric(
            "fabric_dra_fabric_operations_total", operation="attach", result="failed"
        )
        == 1
    )
    (event,) = running.cluster.events("AttachFailed")
    assert "HTTP 409" in event["message"], event
    assert not any(running.cluster.sim.attachments().values())
    await freed(running, "c1")
    await converges(running)


async def test_a_412_on_attach_is_retried_counted_and_the_device_becomes_ready(
    running: Running,
) -> None:
    device = running.published_devices()[0]
    running.cluster.sim.fail_next(1, method="POST", path_prefix=ACTIONS, status=412)
    running.allocate("c1", device)
    await attached_and_ready(running, "c1", device)
    # The backend re-reads the ETag and retries within the same call: the claim never sees
    # it, but the metrics do.
    assert (
        await running.metric("fabric_dra_fabric_operations_total", operation="attach", result="ok")
        == 1
    )
    assert (
        await running.metric(
            "fabric_dra_fabric_retries_total", backend="redfish", reason="precondition"
        )
        == 1
    )
    assert running.cluster.events("AttachFailed") == []
    await freed(running, "c1")


async def test_malformed_json_from_the_fabric_manager_fails_one_sync_and_loses_nothing(
    running: Running,
) -> None:
    devices = running.published_devices()
    before = await running.metric("fabric_dra_inventory_syncs_total", result="failed")
    running.cluster.sim.fail_next(
        3, method="GET", path_prefix=BLOCKS, status=200, body='{"Members": [{"@odata.id": '
    )
    await eventually(lambda: _failed_more(running, before), what="a failed sync counted")
    assert running.published_devices() == devices
    await eventually(lambda: _stale(running, 0.0), what="fresh again")
    await converges(running)


async def _failed_more(running: Running, before: float) -> bool:
    return await running.metric("fabric_dra_inventory_syncs_total", result="failed") > before


@pytest.mark.parametrize("cluster", [{"page_size": 2, "devices": 6}], indirect=True)
async def test_a_truncated_page_fails_the_listing_and_removes_no_device(
    running: Running,
) -> None:
    devices = running.published_devices()
    assert len(devices) == 6
    before = await running.metric("fabric_dra_inventory_syncs_total", result="failed")
    # The second page of the blocks collection is cut short.
    page = json.dumps(
        {
            "Members": [{"@odata.id": BLOCKS + "/x"}],
            "Members@odata.nextLink": BLOCKS + "?$skip=4&$top=2",
        }
    )
    running.cluster.sim.fail_next(
        2, method="GET", path_prefix=BLOCKS + "?", status=200, body=page[: len(page) // 2]
    )
    running.cluster.sim.fail_next(
        2, method="GET", path_prefix=BLOCKS, status=200, body=page[: len(page) // 2]
    )
    await eventually(lambda: _failed_more(running, before), what="a failed sync counted")
    await asyncio.sleep(1.2)
    assert running.published_devices() == devices
    await converges(running)


@pytest.mark.parametrize("cluster", [{"task_mode": True, "task_polls": 10**9}], indirect=True)
async def test_a_task_that_never_finishes_times_out_and_the_device_is_reported_failed(
    cluster: Cluster,
    tmp_path: Path,
) -> None:
    running = await start_service(
        cluster,
        f"sqlite+aiosqlite:///{tmp_path}/task.db",
        FABRIC_DRA_LEADER__ENABLED="false",
        FABRIC_DRA_FABRIC__TASK_TIMEOUT_SECONDS="1",
    )
    try:
        device = running.published_devices()[0]
        running.allocate(
            "c1",
            device,
            config=[
                {
                    "source": "FromClaim",
                    "opaque": {
                        "driver": "fabric.example.com",
                        "parameters": {
                            "apiVersion": "fabric-dra.io/v1alpha1",
                            "kind": "FabricDeviceConfig",
                            "maxAttachAttempts": 1,
                            "attachTimeoutSeconds": 1,
                        },
                    },
                }
            ],
        )
        await eventually(
            lambda: running.condition("c1", "FabricDeviceFailed") == "True",
            timeout_s=30,
            what="the device reported failed",
        )
        assert running.condition("c1", "FabricDeviceReady") != "True"
        assert (
            await running.metric(
                "fabric_dra_fabric_operations_total", operation="attach", result="ok"
            )
            == 0
        )
        # The last attempt allowed timed out: counted as failed, not as one more retry.
        assert (
            await running.metric(
                "fabric_dra_fabric_operations_total", operation="attach", result="failed"
            )
            == 1
        )
        (event,) = cluster.events("AttachFailed")
        assert "no answer within 1" in event["message"], event
        assert not any(cluster.sim.attachments().values())
        await freed(running, "c1")
        assert not any(cluster.sim.attachments().values())
    finally:
        await running.service.stop(deadline_s=5)


# ------------------------------------------------------------------------ API server
async def test_410_storms_are_survived_by_relisting(running: Running) -> None:
    expired = await running.metric("fabric_dra_informer_expired_total", informer="resourceclaims")
    device = running.published_devices()[0]
    for _ in range(10):
        running.cluster.emu.compact()
        await running.cluster.emu.close_watches()
        await asyncio.sleep(0.1)
    running.allocate("c1", device)
    for _ in range(5):
        running.cluster.emu.compact()
        await running.cluster.emu.close_watches()
        await asyncio.sleep(0.1)
    await attached_and_ready(running, "c1", device)
    # The storm shows in the metrics: watches answered 410 and re-lists.
    assert (
        await running.metric("fabric_dra_informer_expired_total", informer="resourceclaims")
        > expired
    )
    await freed(running, "c1")
    await converges(running)


async def test_a_conflict_on_every_first_claim_status_write_is_retried(
    running: Running,
) -> None:
    devices = running.published_devices()[:2]
    for index, device in enumerate(devices):
        running.cluster.emu.fail_next(
            1, method="PUT", path_regex=rf"/resourceclaims/c{index}/status$", status=409
        )
        running.allocate(f"c{index}", device)
    for index, device in enumerate(devices):
        await attached_and_ready(running, f"c{index}", device)
    refused = [w for w in running.cluster.emu.writes("/status") if w.status == 409]
    assert len(refused) == 2
    assert await running.metric("fabric_dra_claim_status_conflicts_total") == 2
    running.free("c0")
    await freed(running, "c1")


async def test_dropped_watches_are_resumed_and_claims_still_flow(running: Running) -> None:
    watches = await running.metric("fabric_dra_informer_watches_total", informer="resourceclaims")
    for _ in range(5):
        await running.cluster.emu.close_watches()
        await asyncio.sleep(0.2)
    await converges(running)
    # The dropped watches were opened again (after backoff, so some closes found none
    # open), and the metrics show it.
    assert (
        await running.metric("fabric_dra_informer_watches_total", informer="resourceclaims")
        > watches
    )


async def test_429_with_retry_after_is_honoured_and_shown_as_errors(running: Running) -> None:
    before = await running.metric("fabric_dra_claim_reconciles_total", result="error")
    device = running.published_devices()[0]
    running.cluster.emu.fail_next(
        2, method="PUT", path_regex=r"/resourceclaims/c1/status$", status=429, retry_after=1
    )
    running.allocate("c1", device)
    await attached_and_ready(running, "c1", device)
    throttled = [w for w in running.cluster.emu.writes("/status") if w.status == 429]
    assert len(throttled) == 2
    assert await running.metric("fabric_dra_claim_reconciles_total", result="error") > before
    await freed(running, "c1")


async def test_a_restart_of_the_api_server_turns_readiness_off_then_on(
    running: Running,
) -> None:
    emu = running.cluster.emu
    await emu.stop()
    await eventually(lambda: _not_ready(running), timeout_s=40, what="not ready while down")
    await emu.start(port=int(emu.url.rsplit(":", 1)[1]))
    await eventually(running.ready, timeout_s=40, what="ready again")
    await converges(running)


async def _not_ready(running: Running) -> bool:
    return not await running.ready()


# ------------------------------------------------------------------------ PostgreSQL
class CutProxy:
    """A TCP proxy on 127.0.0.1 that can be cut (connections closed, new ones refused)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.cut = False
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen on a free port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        sink.close()
        self._writers.discard(sink)

    def set_cut(self, cut: bool) -> None:
        """Cut (close everything, refuse new connections) or restore."""
        self.cut = cut
        if cut:
            for writer in list(self._writers):
                writer.close()
            self._writers.clear()

    async def stop(self) -> None:
        """Close the listener and every connection."""
        self.set_cut(True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.fixture
async def pg_proxy() -> AsyncIterator[CutProxy]:
    """A cuttable proxy in front of the test PostgreSQL."""
    admin_url = os.environ.get(
        "FABRIC_DRA_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    host_port = admin_url.split("@", 1)[1].split("/", 1)[0]
    host, _, port = host_port.partition(":")
    proxy = CutProxy(host, int(port or 5432))
    await proxy.start()
    yield proxy
    await proxy.stop()


@pytest.mark.skipif(
    "postgresql" not in os.environ.get("FABRIC_DRA_TEST_DATABASES", "postgresql"),
    reason="FABRIC_DRA_TEST_DATABASES leaves PostgreSQL out",
)
@pytest.mark.parametrize("database_kind", ["postgresql"])
async def test_postgresql_going_away_turns_readiness_off_and_claims_resume_after(
    cluster: Cluster,
    database_url: str,
    pg_proxy: CutProxy,
) -> None:
    proxied = database_url.replace(
        database_url.split("@", 1)[1].split("/", 1)[0], f"127.0.0.1:{pg_proxy.port}"
    )
    running = await start_service(
        cluster,
        proxied,
        FABRIC_DRA_LEADER__ENABLED="false",
        FABRIC_DRA_DATABASE__MIGRATE_ON_START="false",
    )
    try:
        device = running.published_devices()[0]
        pg_proxy.set_cut(True)
        await eventually(
            lambda: _not_ready(running), timeout_s=30, what="not ready without the database"
        )
        _, body = await running.readyz()
        assert "database" in body
        running.allocate("c1", device)  # arrives while the database is gone
        await asyncio.sleep(1.0)
        pg_proxy.set_cut(False)
        await eventually(running.ready, timeout_s=30, what="ready again")
        await attached_and_ready(running, "c1", device)
        await freed(running, "c1")
    finally:
        pg_proxy.set_cut(False)
        await running.service.stop(deadline_s=5)
