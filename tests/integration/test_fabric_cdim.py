"""NEC CDIM over real HTTP: the simulator's rules (ported from layout-apply and
configuration-manager) and the backend's answers to each hazard."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from builders import eventually

from app.fabric.cdim import CdimBackend
from app.fabric.errors import (
    FabricAuthError,
    FabricConflict,
    FabricInvalidData,
    FabricNotFound,
    FabricUnavailable,
)
from app.fabric.types import DeviceType, FabricDevice, OperationState
from fabric_dra_sim.cdim import BASE, CdimSimulator

FAST = {"apply_overhead_s": 0.05, "step_s": 0.01, "retry_interval_s": 0.01}


@pytest.fixture
async def cdim() -> AsyncIterator[tuple[CdimSimulator, str]]:
    sim = CdimSimulator(cpus=2, gpus=4, nvme=1, sync_interval_s=None, **FAST)
    url = await sim.start()
    yield sim, url
    await sim.stop()


def _backend(url: str, **extra: Any) -> CdimBackend:
    return CdimBackend(url, **{"poll_s": 0.02, "batch_window_s": 0.02, **extra})


def _device(device_id: str) -> FabricDevice:
    return FabricDevice(vendor_id=device_id, attach_unit=device_id, device_type=DeviceType.GPU)


async def _call(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url + BASE + path, json=body) as response,
    ):
        return response.status, await response.json(content_type=None)


def _connect(cpu: str, device: str, number: int = 1) -> dict[str, Any]:
    return {
        "operationID": number,
        "operation": "connect",
        "targetCPUID": cpu,
        "targetDeviceID": device,
        "dependencies": [],
    }


# -- the simulator -----------------------------------------------------------------------------


async def test_one_apply_at_a_time_and_a_suspended_one_blocks_everything(
    cdim: tuple[CdimSimulator, str],
) -> None:
    sim, url = cdim
    cpu_a, cpu_b = sim.cpu_ids()
    gpu = sim.composable_ids()[0]
    status, body = await _call(url, "POST", "/layout-apply", {"procedures": [_connect(cpu_a, gpu)]})
    assert status == 202 and len(body["applyID"]) == 10
    first = body["applyID"]
    status, busy = await _call(url, "POST", "/layout-apply", {"procedures": []})
    assert (status, busy["code"]) == (409, "E40010")
    await eventually(lambda: sim.applies[first].status == "COMPLETED", what="the first apply")
    assert sim.holder(gpu) == cpu_a

    # The same device for another CPU: the hardware refuses, retried, then SUSPENDED.
    status, body = await _call(url, "POST", "/layout-apply", {"procedures": [_connect(cpu_b, gpu)]})
    second = body["applyID"]
    await eventually(lambda: sim.applies[second].status == "SUSPENDED", what="suspended")
    status, blocked = await _call(url, "POST", "/layout-apply", {"procedures": []})
    assert (status, blocked["code"]) == (409, "E40027") and second in blocked["message"]
    status, found = await _call(url, "GET", f"/layout-apply/{second}")
    assert found["applyResult"][0]["statusCode"] == 409
    assert found["resumeProcedures"][0]["targetDeviceID"] == gpu
    status, deleted = await _call(url, "DELETE", f"/layout-apply/{second}")
    assert (status, deleted["code"]) == (409, "E40024")
    status, canceled = await _call(url, "PUT", f"/layout-apply/{second}?action=cancel")
    assert (status, canceled) == (202, {"status": "CANCELED"})
    status, again = await _call(url, "PUT", f"/layout-apply/{second}?action=cancel")
    assert (status, again) == (200, {"status": "CANCELED"})
    status, resumed = await _call(url, "PUT", f"/layout-apply/{first}?action=resume")
    assert (status, resumed) == (200, {"status": "COMPLETED"})
    status, _ = await _call(url, "POST", "/layout-apply", {"procedures": []})
    assert status == 202
    status, _ = await _call(url, "DELETE", f"/layout-apply/{second}")
    assert status == 204


async def test_bad_requests_get_the_services_codes(cdim: tuple[CdimSimulator, str]) -> None:
    sim, url = cdim
    cpu = sim.cpu_ids()[0]
    for body in (
        {},
        {"procedures": "x"},
        {"procedures": [{"operationID": "1", "operation": "connect", "dependencies": []}]},
        {"procedures": [{"operationID": 1, "operation": "attach", "dependencies": []}]},
        {"procedures": [{"operationID": 1, "operation": "connect", "dependencies": []}]},
        {"procedures": [{**_connect(cpu, "x"), "targetDeviceID": ""}]},
    ):
        status, answer = await _call(url, "POST", "/layout-apply", body)
        assert (status, answer["code"]) == (400, "E40001"), body
    assert (await _call(url, "GET", "/layout-apply/xyz"))[1]["code"] == "E40001"
    status, missing = await _call(url, "GET", "/layout-apply/0123456789")
    assert (status, missing["code"]) == (404, "E40020")
    status, bad = await _call(url, "GET", "/layout-apply?status=DONE")
    assert (status, bad["code"]) == (400, "E40001")
    status, bad = await _call(url, "GET", "/resources?detail=maybe")
    assert status == 400
    for query in ("?fields=zzz", "?fields=procedures&fields=procedures"):
        status, bad = await _call(url, "GET", "/layout-apply" + query)
        assert (status, bad["code"]) == (400, "E40001"), query
    assert sim.posts == 0
    # Other keys beside the procedures are ignored, as the service's pydantic model does.
    status, _ = await _call(url, "POST", "/layout-apply", {"procedures": [], "note": 1})
    assert status == 202
    # Bodies the JSON decoder itself refuses are 400 too, never 500.
    async with aiohttp.ClientSession() as http:
        for raw in ("[" * 100_000 + "]" * 100_000, '{"procedures": [{"operationID": ' + "9" * 5000):
            async with http.post(url + BASE + "/layout-apply", data=raw) as response:
                assert response.status == 400, raw[:20]
    with pytest.raises(ValueError, match="prefix"):
        CdimSimulator(prefix="/gw/?x")
    assert CdimSimulator(prefix="gw/").prefix == "/gw"


async def test_an_orphaned_apply_blocks_until_cancelled_and_ends_failed(
    cdim: tuple[CdimSimulator, str],
) -> None:
    sim, url = cdim
    cpu, gpu = sim.cpu_ids()[0], sim.composable_ids()[0]
    sim.faults.orphan_next = 1
    status, body = await _call(url, "POST", "/layout-apply", {"procedures": [_connect(cpu, gpu)]})
    orphan = body["applyID"]
    await asyncio.sleep(0.2)
    assert sim.applies[orphan].status == "IN_PROGRESS"
    assert (await _call(url, "POST", "/layout-apply", {"procedures": []}))[0] == 409
    listed = (await _call(url, "GET", "/layout-apply?status=IN_PROGRESS&fields=procedures"))[1]
    assert (
        listed["count"] == 1 and listed["applyResults"][0]["procedures"][0]["targetDeviceID"] == gpu
    )
    status, answer = await _call(url, "PUT", f"/layout-apply/{orphan}?action=cancel")
    assert (status, answer["code"], answer["status"]) == (409, "E40028", "FAILED")
    assert (await _call(url, "POST", "/layout-apply", {"procedures": []}))[0] == 202


async def test_the_inventory_is_a_cache_with_ghosts_and_built_in_parts(
    cdim: tuple[CdimSimulator, str],
) -> None:
    sim, url = cdim
    cpu, gpu = sim.cpu_ids()[0], sim.composable_ids()[0]
    sim.connect_out_of_band(gpu, cpu)
    sim.remove(sim.composable_ids()[1])
    _, body = await _call(url, "GET", "/resources?detail=true")
    by_id = {r["device"]["deviceID"]: r for r in body["resources"]}
    assert by_id[gpu]["device"]["links"] == []  # the cache has not synced yet
    sim.sync()
    _, body = await _call(url, "GET", "/resources?detail=true")
    by_id = {r["device"]["deviceID"]: r for r in body["resources"]}
    assert by_id[gpu]["device"]["links"] == [{"deviceID": cpu, "type": "CPU"}]
    assert by_id[sim.composable_ids()[1]]["detected"] is False
    cpu_entry = by_id[cpu]["device"]
    assert len(cpu_entry["constraints"]["nonRemovableDevices"]) == 2
    sim.faults.flap_health_rate = 1.0
    sim.sync()
    _, body = await _call(url, "GET", f"/resources/{gpu}")
    assert body["device"]["status"]["health"] == "Critical"
    assert (await _call(url, "GET", "/resources/nope"))[0] == 404
    sim.faults.api_error_rate, sim.faults.api_error_status = 1.0, 503
    status, failed = await _call(url, "GET", "/nodes")
    assert (status, failed["code"]) == (503, "E40019")
    sim.faults.api_error_rate = 0.0
    _status, nodes = await _call(url, "GET", "/nodes")
    assert {n["id"] for n in nodes["nodes"]} == set(sim.cpu_ids())


# -- the backend -------------------------------------------------------------------------------


async def test_the_backend_lists_what_may_be_attached(cdim: tuple[CdimSimulator, str]) -> None:
    sim, url = cdim
    cpu = sim.cpu_ids()[0]
    gpus = sim.composable_ids()
    sim.remove(gpus[1])
    sim.devices[gpus[2]].available = False
    sim.connect_out_of_band(gpus[0], cpu)
    sim.sync()
    backend = _backend(url)
    try:
        devices = {d.vendor_id: d for d in (await backend.list_devices()).items}
        listing = await backend.list_devices()
        hosts = (await backend.list_hosts()).items
    finally:
        await backend.close()
    assert set(devices) == {gpus[0], gpus[3], gpus[4]}
    assert devices[gpus[0]].host_id == cpu and devices[gpus[0]].device_type == DeviceType.GPU
    assert devices[gpus[4]].device_type == DeviceType.NVME
    assert len(listing.local_units) == 4  # each CPU's memory and NIC
    assert {h.host_id for h in hosts} == set(sim.cpu_ids())
    assert next(h for h in hosts if h.host_id == cpu).attached_units[-1] == gpus[0]


async def test_attach_journals_the_apply_then_waits_for_its_step(
    cdim: tuple[CdimSimulator, str],
) -> None:
    sim, url = cdim
    cpu, gpu = sim.cpu_ids()[0], sim.composable_ids()[0]
    backend = _backend(url)
    journal: list[tuple[str, str]] = []

    async def record(apply_id: str) -> None:
        journal.append((apply_id, sim.applies[apply_id].status))

    try:
        result = await backend.attach(_device(gpu), cpu, on_operation=record)
        assert result.state == OperationState.COMPLETED and result.op_id == journal[0][0]
        assert journal[0][1] == "IN_PROGRESS"  # journalled before it ended
        assert sim.holder(gpu) == cpu
        sim.sync()
        posts = sim.posts
        again = await backend.attach(_device(gpu), cpu)
        assert again.op_id is None and sim.posts == posts  # already there: no POST
        # Held by another CPU: a conflict, and nothing sent that could suspend CDIM.
        with pytest.raises(FabricConflict, match="not sent"):
            await backend.attach(_device(gpu), sim.cpu_ids()[1])
        assert sim.posts == posts
        await backend.detach(_device(gpu), cpu)
        assert sim.holder(gpu) is None
        with pytest.raises(FabricNotFound):
            await backend.attach(_device("no-such-device"), cpu)
    finally:
        await backend.close()


async def test_a_suspended_apply_of_ours_is_cancelled_and_reported(
    cdim: tuple[CdimSimulator, str],
) -> None:
    sim, url = cdim
    cpu_a, cpu_b = sim.cpu_ids()
    gpu = sim.composable_ids()[0]
    sim.connect_out_of_band(gpu, cpu_b)  # the cache does not know yet
    backend = _backend(url)
    try:
        with pytest.raises(FabricConflict, match="the hardware refused"):
            await backend.attach(_device(gpu), cpu_a)
        assert [a.status for a in sim.applies.values()] == ["CANCELED"]
        # The installation takes applies again.
        other = sim.composable_ids()[1]
        assert (await backend.attach(_device(other), cpu_a)).state == OperationState.COMPLETED
    finally:
        await backend.close()


async def test_busy_is_waited_out_and_someone_elses_suspension_is_named(
    cdim: tuple[CdimSimulator, str],
) -> None:
    sim, url = cdim
    cpu_a, cpu_b = sim.cpu_ids()
    gpus = sim.composable_ids()
    sim.apply_overhead_s = 0.4
    await _call(url, "POST", "/layout-apply", {"procedures": [_connect(cpu_b, gpus[1])]})
    backend = _backend(url)
    try:
        assert (await backend.attach(_device(gpus[0]), cpu_a)).state == OperationState.COMPLETED
        assert backend.busy_retries >= 1
        sim.apply_overhead_s = 0.01
        sim.connect_out_of_band(gpus[2], cpu_b)
        _status, body = await _call(
            url, "POST", "/layout-apply", {"procedures": [_connect(cpu_a, gpus[2])]}
        )
        await eventually(lambda: sim.applies[body["applyID"]].status == "SUSPENDED")
        with pytest.raises(FabricUnavailable, match=r"E40027|suspended") as caught:
            await backend.attach(_device(gpus[3]), cpu_a)
        assert caught.value.retryable and body["applyID"] in str(caught.value)
    finally:
        await backend.close()


async def test_a_dropped_hardware_connection_is_an_unknown_outcome(
    cdim: tuple[CdimSimulator, str],
) -> None:
    sim, url = cdim
    cpu, gpu = sim.cpu_ids()[0], sim.composable_ids()[0]
    sim.faults.hw_drop = 1
    backend = _backend(url)
    try:
        with pytest.raises(FabricUnavailable, match="outcome is unknown"):
            await backend.attach(_device(gpu), cpu)
        assert sim.holder(gpu) == cpu  # it happened after all
        # 503s from the hardware are retried inside the apply.
        sim.faults.hw_503 = 2
        other = sim.composable_ids()[1]
        assert (await backend.attach(_device(other), cpu)).state == OperationState.COMPLETED
    finally:
        await backend.close()


async def test_waiting_attaches_share_one_apply_and_get_their_own_results(
    cdim: tuple[CdimSimulator, str],
) -> None:
    sim, url = cdim
    cpu_a, cpu_b = sim.cpu_ids()
    gpus = sim.composable_ids()
    sim.connect_out_of_band(gpus[3], cpu_b)
    backend = _backend(url, batch_window_s=0.1)
    try:
        outcomes = await asyncio.gather(
            backend.attach(_device(gpus[0]), cpu_a),
            backend.attach(_device(gpus[1]), cpu_b),
            backend.attach(_device(gpus[2]), cpu_a),
            backend.attach(_device(gpus[3]), cpu_a),  # the hardware refuses this one
            return_exceptions=True,
        )
    finally:
        await backend.close()
    assert sim.posts == 1
    assert [getattr(o, "state", None) for o in outcomes[:3]] == [OperationState.COMPLETED] * 3
    assert isinstance(outcomes[3], FabricConflict)
    assert (sim.holder(gpus[0]), sim.holder(gpus[1]), sim.holder(gpus[2])) == (cpu_a, cpu_b, cpu_a)


async def test_after_a_crash_our_running_apply_is_found_and_followed(
    cdim: tuple[CdimSimulator, str],
) -> None:
    sim, url = cdim
    cpu, gpu = sim.cpu_ids()[0], sim.composable_ids()[0]
    sim.apply_overhead_s = 0.3
    status, body = await _call(url, "POST", "/layout-apply", {"procedures": [_connect(cpu, gpu)]})
    backend = _backend(url)
    seen: list[str] = []

    async def record(apply_id: str) -> None:
        seen.append(apply_id)

    try:
        result = await backend.attach(_device(gpu), cpu, on_operation=record)
        assert sim.posts == 1 and seen == [body["applyID"]] and result.op_id == body["applyID"]
        # resume() of a journalled apply: followed, nothing sent.
        resumed = await backend.resume(body["applyID"], _device(gpu), cpu, attach=True)
        assert resumed.state == OperationState.COMPLETED and sim.posts == 1
        # An apply gone from the service: the state decides (detach needed, so it is sent).
        assert (await backend.resume("0000000000", _device(gpu), cpu, attach=False)).state == (
            OperationState.COMPLETED
        )
        assert sim.holder(gpu) is None
        status = (await backend.operation_status(body["applyID"])).state
        assert status == OperationState.COMPLETED
    finally:
        await backend.close()


async def test_the_product_field_names_a_gateway_prefix_and_a_token() -> None:
    sim = CdimSimulator(
        cpus=1,
        gpus=1,
        token="t0ken",
        prefix="/gw",
        field_names="product",
        sync_interval_s=None,
        **FAST,
    )
    url = await sim.start()
    try:
        refused = _backend(url, prefix="/gw")
        with pytest.raises(FabricAuthError):
            await refused.list_devices()
        await refused.close()
        backend = _backend(url, prefix="gw", token="t0ken", procedure_fields="product")
        try:
            (gpu,) = sim.composable_ids()
            await backend.attach(_device(gpu), sim.cpu_ids()[0])
            procedure = next(iter(sim.applies.values())).procedures[0]
            assert procedure["sourceDeviceID"] == sim.cpu_ids()[0]
            assert procedure["destinationDeviceID"] == gpu
        finally:
            await backend.close()
    finally:
        await sim.stop()


@pytest.mark.parametrize("prefix", ["", "/wrong"])
async def test_a_wrong_gateway_prefix_is_named_with_the_url_it_reached(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    sim = CdimSimulator(cpus=1, gpus=1, prefix="/gw", sync_interval_s=None, **FAST)
    url = await sim.start()
    try:
        backend = _backend(url.replace("http://", "http://user:secret@"), prefix=prefix)
        try:
            for listing in (backend.list_devices, backend.list_hosts):
                with pytest.raises(FabricInvalidData) as caught:
                    await listing()
                message = str(caught.value)
                assert f"{prefix}{BASE}/" in message and "HTTP 404" in message
                assert "fabric.path_prefix" in message and "secret" not in message
            # The read of recent applies, first, says the same of layout-apply.
            assert f"{prefix}{BASE}/layout-apply: HTTP 404: no CDIM layout-apply" in caplog.text
            assert "secret" not in caplog.text
        finally:
            await backend.close()
    finally:
        await sim.stop()


async def test_the_apply_list_takes_layout_applys_options(
    cdim: tuple[CdimSimulator, str],
) -> None:
    sim, url = cdim
    cpu, gpus = sim.cpu_ids()[0], sim.composable_ids()
    ids = []
    for gpu in gpus[:3]:
        status, body = await _call(
            url, "POST", "/layout-apply", {"procedures": [_connect(cpu, gpu)]}
        )
        assert status == 202
        ids.append(body["applyID"])
        await eventually(lambda: sim.applies[ids[-1]].status == "COMPLETED", what="applied")
    # Three applies, in order; make their times distinct (the service's are to the second).
    for number, apply_id in enumerate(ids):
        sim.applies[apply_id].started_at = f"2030-01-01T00:00:0{number}Z"
        sim.applies[apply_id].ended_at = f"2030-01-01T00:01:0{number}Z"
    sim.applies[ids[2]].status, sim.applies[ids[2]].ended_at = "IN_PROGRESS", None

    async def listed(query: str) -> list[str]:
        status, body = await _call(url, "GET", f"/layout-apply?{query}")
        assert status == 200, body
        assert body["count"] == len(body["applyResults"])
        return [a["applyID"] for a in body["applyResults"]]

    assert await listed("") == [ids[2], ids[1], ids[0]]  # startedAt, newest first
    assert await listed("orderBy=asc&limit=2") == ids[:2]
    assert await listed("orderBy=asc&offset=2") == [ids[2]]
    # No end: first when descending, last when ascending (PostgreSQL's NULL order).
    assert await listed("sortBy=endedAt") == [ids[2], ids[1], ids[0]]
    assert await listed("sortBy=endedAt&orderBy=asc") == [ids[0], ids[1], ids[2]]
    # Bounds are inclusive, in UTC, and no end matches no endedAt bound.
    assert await listed("endedAtSince=2030-01-01T00:01:01Z") == [ids[1]]
    assert await listed("endedAtUntil=2030-01-01T09:01:00%2B09:00") == [ids[0]]
    assert await listed(
        "startedAtSince=2030-01-01T00:00:01Z&startedAtUntil=2030-01-01T00:00:01Z"
    ) == [ids[1]]
    assert await listed("status=COMPLETED&unknownOption=1") == [ids[1], ids[0]]
    _, body = await _call(url, "GET", "/layout-apply?fields=applyResult&limit=1")
    assert body["totalCount"] == 3 and set(body["applyResults"][0]) <= {
        "applyID",
        "status",
        "startedAt",
        "endedAt",
        "applyResult",
    }
    for bad in (
        "limit=0",
        "limit=abc",
        "offset=-1",
        "sortBy=applyID",
        "orderBy=up",
        "endedAtSince=2030-01-01",
        "endedAtSince=2030-02-30T00:00:00Z",
        "limit=" + "9" * 5000,
        "offset=%EF%BC%91",  # a full-width 1: pydantic takes ASCII digits only
        "limit=1&limit=abc",  # the last of a repeated option counts
        "status=COMPLETED&status=FOO",
    ):
        status, body = await _call(url, "GET", f"/layout-apply?{bad}")
        assert (status, body["code"]) == (400, "E40001"), bad
    assert await listed("status=FOO&status=COMPLETED") == [ids[1], ids[0]]
    # A bound that leaves years 1-9999 once in UTC: server.py's conversion raises outside its
    # try, and the service answers a plain 500.
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}{BASE}/layout-apply?startedAtUntil=9999-12-31T23:59:59-01:00") as r,
    ):
        assert (r.status, await r.text()) == (500, "Internal Server Error")


async def _before_restart(
    url: str, cpu: str, attach: list[str], detach: list[str] | None = None
) -> None:
    """A backend (the controller before its restart) that attaches, detaches, then ends."""
    first = _backend(url)
    try:
        for device in attach:
            await first.attach(_device(device), cpu)
        for device in detach or []:
            await first.detach(_device(device), cpu)
    finally:
        await first.close()


async def _listed_hosts(backend: CdimBackend) -> dict[str, str | None]:
    """Device id -> the host a device listing shows it on."""
    return {d.vendor_id: d.host_id for d in (await backend.list_devices()).items}


async def test_after_a_restart_recent_applies_are_shown_over_the_lagging_cache(
    cdim: tuple[CdimSimulator, str],
) -> None:
    # configuration-manager's cache has not synced since these applies; a new backend (the
    # controller restarted) must show where they left the devices, whoever posted them.
    sim, url = cdim
    cpu, gpus = sim.cpu_ids()[0], sim.composable_ids()
    await _before_restart(url, cpu, gpus[:2], detach=[gpus[1]])
    status, _ = await _call(url, "POST", "/layout-apply", {"procedures": [_connect(cpu, gpus[2])]})
    assert status == 202
    await eventually(lambda: sim.holder(gpus[2]) == cpu, what="someone else's apply")
    _, cached = await _call(url, "GET", f"/resources/{gpus[0]}")
    assert cached["device"]["links"] == []  # the cache has not synced since
    restarted = _backend(url)
    try:
        devices = await _listed_hosts(restarted)
        hosts = {h.host_id: h.attached_units for h in (await restarted.list_hosts()).items}
    finally:
        await restarted.close()
    assert devices[gpus[0]] == cpu and devices[gpus[2]] == cpu and devices[gpus[1]] is None
    assert set(hosts[cpu]) >= {gpus[0], gpus[2]} and gpus[1] not in hosts[cpu]
    # Outside the cache's lag, an apply says nothing: the cache is taken as it is.
    late = _backend(url, cache_lag_s=0.001)
    try:
        await asyncio.sleep(1.1)
        devices = await _listed_hosts(late)
    finally:
        await late.close()
    assert devices[gpus[0]] is None  # the cache's (stale) view


async def test_an_unreadable_apply_history_is_logged_and_the_cache_taken_as_it_is(
    cdim: tuple[CdimSimulator, str], caplog: pytest.LogCaptureFixture
) -> None:
    sim, url = cdim
    cpu, gpu = sim.cpu_ids()[0], sim.composable_ids()[0]
    await _before_restart(url, cpu, [gpu])
    sim.faults.api_error_rate, sim.faults.api_error_status = 1.0, 503
    restarted = _backend(url)
    try:
        with pytest.raises(FabricUnavailable):
            await restarted.list_devices()
        sim.faults.api_error_rate = 0.0
        devices = await _listed_hosts(restarted)
    finally:
        await restarted.close()
    assert "could not read layout-apply's recent applies" in caplog.text
    assert devices[gpu] is None  # the cache's view, not retried


async def test_malformed_entries_of_the_apply_history_are_passed_over(
    cdim: tuple[CdimSimulator, str],
) -> None:
    sim, url = cdim
    cpu, gpus = sim.cpu_ids()[0], sim.composable_ids()
    await _before_restart(url, cpu, gpus[:2])
    good, bad = list(sim.applies.values())
    # The second apply's steps are unusable: no procedure for the step, a time that is not
    # one, an entry that is not an object.
    bad.apply_result = [
        {"operationID": 99, "status": "COMPLETED", "endedAt": "soon"},
        "not an object",
        {"operationID": 1, "status": "COMPLETED", "endedAt": "soon"},
    ]
    bad.ended_at = good.ended_at
    bad.procedures = [{"operationID": 1, "operation": "connect"}]  # no CPU, no device
    restarted = _backend(url)
    try:
        devices = await _listed_hosts(restarted)
    finally:
        await restarted.close()
    assert devices[gpus[0]] == cpu  # the good apply still counts
    assert devices[gpus[1]] is None  # the cache's view
