"""The fabric manager is the truth: drift, terminal detach failures, devices held by other
servers and task monitors that outlive the controller. Real HTTP against the Redfish simulator
and the Kubernetes API emulator, real SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from builders import eventually
from test_claims import NODES, Harness, build_harness, running

from app.claims.drift import DriftWatch
from app.claims.reconciler import ClaimReconciler
from app.db.engine import Database
from app.inventory import InventorySync
from app.inventory.queries import pool_devices, unmanaged_attachments
from app.journal import ATTACHED, ATTACHING, DETACH_FAILED, FAILED, RELEASED, ClaimRef, Journal
from app.pools import PoolConfig, desired_pools

DRIVER = "fabric.example.com"


@pytest.fixture
async def harness(db: Database) -> Any:
    async with build_harness(db, devices=6) as built:
        yield built


async def _attached(
    harness: Harness, reconciler: ClaimReconciler, claim: str, device: str, node: str = NODES[0]
) -> str:
    harness.create_claim(claim)
    harness.allocate(claim, [("gpu", device)], node)
    await eventually(
        lambda: harness.condition(claim, device, "FabricDeviceReady") == "True",
        what=f"{claim} ready",
    )
    return str(harness.claim(claim)["metadata"]["uid"])  # type: ignore[index]


async def _sync_and_check(harness: Harness, reconciler: ClaimReconciler) -> list[Any]:
    listed_from = dt.datetime.now(dt.UTC)
    result = await InventorySync(harness.backend, harness.db).sync_once()
    assert result.ok, result.error
    watch = DriftWatch(Journal(harness.db), harness.db, {"structured": reconciler.drift_target()})
    return await watch.check(listed_from)


def _reason(harness: Harness, claim: str, device: str, type_: str) -> str | None:
    for entry in harness.our_status(claim):
        if entry["device"] == device:
            for condition in entry["conditions"]:
                if condition["type"] == type_:
                    return str(condition["reason"])
    return None


async def test_a_device_detached_behind_our_back_is_reported_lost_and_attached_again(
    harness: Harness,
) -> None:
    device = harness.device_names()[0]
    block = harness.block_of(device)
    reconciler = harness.reconciler()
    async with running(reconciler):
        uid = await _attached(harness, reconciler, "c1", device)
        assert await _sync_and_check(harness, reconciler) == []  # nothing drifted yet

        harness.sim.detach_out_of_band(block)  # someone detached it by hand
        harness.sim.faults.latency_s = 1.0  # the attach again takes a while: look meanwhile
        drifts = await _sync_and_check(harness, reconciler)
        assert [(d.kind, d.reservation.device_name) for d in drifts] == [("lost", device)]
        await eventually(
            lambda: _reason(harness, "c1", device, "FabricDeviceReady") == "DeviceLost",
            what="ready condition False with DeviceLost",
        )
        assert harness.condition("c1", device, "FabricDeviceReady") == "False"
        # Not given up: the failure condition stays False, the scheduler keeps the device.
        assert harness.condition("c1", device, "FabricDeviceFailed") == "False"
        harness.sim.faults.latency_s = 0.0
        await eventually(
            lambda: harness.condition("c1", device, "FabricDeviceReady") == "True",
            what="ready again",
        )
        assert harness.sim.attachments()[block] == NODES[0]
        assert [e["type"] for e in harness.events("DeviceLost")] == ["Warning"]
        assert reconciler.metrics is not None
        assert reconciler.metrics.drift.labels("lost")._value.get() == 1
        (held,) = await reconciler.journal.for_claim(uid)
        assert held.state == ATTACHED
        # The world matches the journal again: the next sync finds nothing.
        assert await _sync_and_check(harness, reconciler) == []


async def test_a_device_the_fabric_keeps_losing_is_given_up_after_its_attach_tries(
    harness: Harness,
) -> None:
    device = harness.device_names()[4]
    block = harness.block_of(device)
    reconciler = harness.reconciler()
    reconciler.ops.max_attach_tries_with_losses = 2
    async with running(reconciler):
        uid = await _attached(harness, reconciler, "c1", device)
        harness.sim.detach_out_of_band(block)
        assert [d.kind for d in await _sync_and_check(harness, reconciler)] == ["lost"]
        await eventually(lambda: _state_is(reconciler, uid, ATTACHED), what="attached again")
        assert harness.sim.holders(block) == [NODES[0]]
        harness.sim.detach_out_of_band(block)
        assert [d.kind for d in await _sync_and_check(harness, reconciler)] == ["lost"]
        await eventually(
            lambda: harness.condition("c1", device, "FabricDeviceFailed") == "True", what="given up"
        )
        assert _reason(harness, "c1", device, "FabricDeviceFailed") == "DeviceLost"
        (held,) = await reconciler.journal.for_claim(uid)
        assert held.state == FAILED and "given up" in (held.last_error or "")
        assert harness.sim.holders(block) == []
        # Events go out through the background recorder: wait for them, then count.
        await eventually(lambda: len(harness.events("DeviceLost")) >= 2, what="DeviceLost event")
        assert len(harness.events("DeviceLost")) == 2


async def test_a_fabric_manager_restart_that_forgets_attachments_is_noticed(
    harness: Harness,
) -> None:
    device = harness.device_names()[1]
    reconciler = harness.reconciler()
    async with running(reconciler):
        await _attached(harness, reconciler, "c1", device)
        # A restart without the volatile-state profile keeps attachments: no drift.
        harness.sim.restart()
        assert await _sync_and_check(harness, reconciler) == []
        harness.sim.detach_out_of_band(harness.block_of(device))
        assert [d.kind for d in await _sync_and_check(harness, reconciler)] == ["lost"]
        await eventually(
            lambda: harness.sim.attachments()[harness.block_of(device)] == NODES[0],
            what="attached again after the restart",
        )


async def test_a_device_found_on_another_host_fails_the_claim_and_is_not_taken_back(
    harness: Harness,
) -> None:
    device = harness.device_names()[2]
    block = harness.block_of(device)
    reconciler = harness.reconciler()
    async with running(reconciler):
        uid = await _attached(harness, reconciler, "c1", device)
        harness.sim.detach_out_of_band(block)
        harness.sim.attach_out_of_band(block, NODES[1])
        drifts = await _sync_and_check(harness, reconciler)
        assert [(d.kind, d.holder) for d in drifts] == [("moved", NODES[1])]
        await eventually(
            lambda: harness.condition("c1", device, "FabricDeviceFailed") == "True",
            what="failure condition",
        )
        assert _reason(harness, "c1", device, "FabricDeviceFailed") == "DeviceMoved"
        assert [e["type"] for e in harness.events("DeviceMoved")] == ["Warning"]
        (held,) = await reconciler.journal.for_claim(uid)
        assert held.state == FAILED and NODES[1] in (held.last_error or "")
        # The scheduler gives it back: the release does not take it from the other server.
        harness.deallocate("c1")
        await eventually(lambda: _no_active(reconciler, uid), what="released")
    assert harness.sim.attachments()[block] == NODES[1]


async def _no_active(reconciler: ClaimReconciler, uid: str) -> bool:
    return await reconciler.journal.for_claim(uid) == []


async def test_a_device_held_by_another_server_is_published_tainted_with_its_holder(
    harness: Harness,
) -> None:
    device = harness.device_names()[3]
    harness.sim.attach_out_of_band(harness.block_of(device), NODES[1])
    assert (await InventorySync(harness.backend, harness.db).sync_once()).ok
    [pool_device] = [d for d in await pool_devices(harness.db) if d.name == device]
    assert pool_device.held_by == NODES[1]
    pools = desired_pools(await pool_devices(harness.db), PoolConfig(driver_name=DRIVER))
    entries = [
        e for p in pools.values() for s in p.slices for e in s.devices if e["name"] == device
    ]
    assert entries[0]["taints"] == [
        {"key": f"{DRIVER}/held-by-other-host", "value": NODES[1], "effect": "NoSchedule"}
    ]
    # Our own attachments are not "elsewhere".
    other = harness.device_names()[4]
    reconciler = harness.reconciler()
    async with running(reconciler):
        await _attached(harness, reconciler, "c1", other)
    assert (await InventorySync(harness.backend, harness.db).sync_once()).ok
    [ours] = [d for d in await pool_devices(harness.db) if d.name == other]
    assert ours.held_by is None


async def test_our_verified_detach_frees_the_device_in_the_inventory_at_once(
    harness: Harness,
) -> None:
    device = harness.device_names()[0]
    reconciler = harness.reconciler()
    async with running(reconciler):
        uid = await _attached(harness, reconciler, "c1", device)
        # A sync while it is attached: the inventory shows it on our host, held by us.
        assert (await InventorySync(harness.backend, harness.db).sync_once()).ok
        [row] = [d for d in await pool_devices(harness.db) if d.name == device]
        assert row.held_by is None
        harness.deallocate("c1")
        await eventually(lambda: _no_active(reconciler, uid), what="released")
        assert harness.sim.attachments()[harness.block_of(device)] is None
        # No sync ran since: the journal's verified detach itself freed the inventory row.
        assert await _device_free(harness, device)


class _StaleListing:
    """A backend whose device listing was taken earlier (it answers that old listing)."""

    def __init__(self, backend: Any, listing: Any) -> None:
        self.backend, self.listing, self.kind = backend, listing, backend.kind
        self.name = backend.name

    async def list_hosts(self) -> Any:
        return await self.backend.list_hosts()

    async def list_devices(self) -> Any:
        return self.listing


async def test_a_listing_taken_before_our_detach_does_not_write_the_old_holder_back(
    harness: Harness,
) -> None:
    device = harness.device_names()[5]
    reconciler = harness.reconciler()
    async with running(reconciler):
        await _attached(harness, reconciler, "c1", device)
        listed_from = dt.datetime.now(dt.UTC)
        stale = await harness.backend.list_devices()  # still shows the device on NODES[0]
        uid = str(harness.claim("c1")["metadata"]["uid"])  # type: ignore[index]
        harness.deallocate("c1")
        await eventually(lambda: _no_active(reconciler, uid), what="released")
        assert await _device_free(harness, device)
        result = await InventorySync(
            _StaleListing(harness.backend, stale),  # type: ignore[arg-type]
            harness.db,
            clock=lambda: listed_from,
        ).sync_once()
        assert result.ok
        [row] = [d for d in await pool_devices(harness.db) if d.name == device]
        assert row.held_by is None, "the old listing wrote the old holder back"
        # The next real sync reads the fabric again and agrees.
        assert (await InventorySync(harness.backend, harness.db).sync_once()).ok
        assert await _device_free(harness, device)


async def _device_free(harness: Harness, device: str) -> bool:
    [row] = [d for d in await pool_devices(harness.db) if d.name == device]
    return row.held_by is None and not row.detach_failed


async def test_a_detach_refused_for_good_ends_detach_failed_once_then_an_operator_forgets_it(
    harness: Harness,
) -> None:
    device = harness.device_names()[1]
    reconciler = harness.reconciler()
    async with running(reconciler):
        uid = await _attached(harness, reconciler, "c1", device)
        # The fabric manager refuses every detach with 406, as a real one does for a block it
        # will not give up.
        harness.sim.fail_next(1000, method="POST", path_prefix="/redfish/v1/Systems/", status=406)
        before = len(harness.sim.history)
        harness.deallocate("c1")
        await eventually(lambda: _state_is(reconciler, uid, DETACH_FAILED), what="detach-failed")
        (held,) = await reconciler.journal.for_claim(uid)
        assert "406" in (held.last_error or "") and "forget" in (held.last_error or "")
        await eventually(lambda: len(harness.events("DetachFailed")) == 1, what="Event")
        # Nothing loops: no journal move after the terminal state, even when the claim is
        # looked at again.
        reconciler.queue.add(uid)
        await reconciler.reconcile(uid)
        (again,) = await reconciler.journal.for_claim(uid)
        assert again.updated_at == held.updated_at and again.attempts == held.attempts
        assert len(harness.sim.history) == before
        assert reconciler.metrics is not None
        assert reconciler.metrics.terminal.labels(DETACH_FAILED)._value.get() == 1
        # The device is not offered meanwhile.
        [row] = [d for d in await pool_devices(harness.db) if d.name == device]
        assert row.detach_failed
        # The operator fixes it by hand and forgets the reservation.
        forgotten = await reconciler.journal.forget(held.id, "detached by hand in the FM UI")
        assert forgotten is not None and forgotten.state == RELEASED
        assert "detached by hand" in (forgotten.last_error or "")


async def _state_is(reconciler: ClaimReconciler, uid: str, state: str) -> bool:
    rows = await reconciler.journal.for_claim(uid)
    return bool(rows) and rows[0].state == state


async def test_transient_detach_failures_end_detach_failed_after_the_limit(
    harness: Harness,
) -> None:
    device = harness.device_names()[2]
    reconciler = harness.reconciler(max_detach_attempts=3)
    async with running(reconciler):
        uid = await _attached(harness, reconciler, "c1", device)
        harness.sim.fail_next(1000, method="POST", path_prefix="/redfish/v1/Systems/", status=503)
        harness.deallocate("c1")
        await eventually(
            lambda: _state_is(reconciler, uid, DETACH_FAILED),
            what="detach-failed after 3 transient failures",
        )
        (held,) = await reconciler.journal.for_claim(uid)
        assert held.attempts == 3 and "3 times in a row" in (held.last_error or "")


async def test_an_attach_task_journals_its_monitor_before_polling_and_is_followed_after_a_restart(
    harness: Harness,
) -> None:
    device = harness.device_names()[3]
    harness.sim.task_mode = True
    harness.sim.task_polls = 1000  # the task does not finish while the first controller runs
    journal = Journal(harness.db)
    claim = harness.create_claim("c1")
    reconciler = harness.reconciler()
    async with running(reconciler):
        harness.allocate("c1", [("gpu", device)], NODES[0])
        uid = str(claim["metadata"]["uid"])
        await eventually(lambda: _has_operation(journal, uid), what="monitor journalled")
    (held,) = await journal.for_claim(uid)
    assert held.state == ATTACHING and held.operation_id
    assert harness.sim.tasks_created == 1 and harness.sim.history == []
    # A new controller follows the same monitor instead of sending a second attach.
    harness.sim.task_polls = 1
    async with running(harness.reconciler()):
        await eventually(
            lambda: harness.condition("c1", device, "FabricDeviceReady") == "True",
            what="ready after the restart",
        )
    (done,) = await journal.for_claim(uid)
    assert done.state == ATTACHED and done.operation_id is None
    assert harness.sim.tasks_created == 1
    assert harness.sim.history == [("attach", harness.block_of(device), NODES[0])]


async def _has_operation(journal: Journal, uid: str) -> bool:
    rows = await journal.for_claim(uid)
    return bool(rows) and bool(rows[0].operation_id)


async def test_an_unmanaged_device_reserved_since_the_sweep_listed_it_is_not_detached(
    harness: Harness,
) -> None:
    device = harness.device_names()[3]
    block = harness.block_of(device)
    harness.sim.attach_out_of_band(block, NODES[0])
    assert (await InventorySync(harness.backend, harness.db).sync_once()).ok
    reconciler = harness.reconciler(detach_unmanaged=True, orphan_grace_s=3600)
    [item] = await unmanaged_attachments(harness.db)
    # Meanwhile a claim takes it (the scheduler gave it to a pod on that node).
    await Journal(harness.db).reserve(
        ClaimRef("u1", "default", "c1"),
        "gpu",
        device,
        "us-east/rack-01",
        "structured",
        NODES[0],
        NODES[0],
    )
    await reconciler.sweeper.detach_unmanaged_device(item)
    assert harness.sim.holders(block) == [NODES[0]]
