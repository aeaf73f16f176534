"""The Redfish backend against what real composability services do (REDFISH-REFERENCE.md, "What a
real composability service did"), over real HTTP: the Redfish simulator, a DMTF mockup rewritten
the way a real service reports it, and a middleware in front that answers or rewrites chosen
requests for shapes the simulator does not produce.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from builders import REDFISH_DATA

from app.fabric.errors import (
    FabricError,
    FabricNotEffective,
    FabricServerOwned,
    FabricUnavailable,
)
from app.fabric.redfish.backend import RedfishBackend
from app.fabric.redfish.transport import RetrySettings
from app.fabric.types import DeviceType, FabricDevice, OperationState
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

DATA = REDFISH_DATA
COMPOSABILITY = DATA / "dmtf-public-composability"
BLOCKS = "/redfish/v1/CompositionService/ResourceBlocks"
SYSTEMS = "/redfish/v1/Systems"
SESSIONS = "/redfish/v1/SessionService/Sessions"
MONITORS = "/redfish/v1/TaskService/TaskMonitors"
PASSWORD = "s3cret-Passw0rd"
FAST = RetrySettings(attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05, max_retry_after_s=0.1)
SMALL = InventorySpec(regions=1, racks_per_region=2, devices_per_rack=4, hosts_per_rack=2)
HOST = "node-us-east-rack-01-1"
ADD = f"POST {SYSTEMS}/{HOST}/Actions/ComputerSystem.AddResourceBlock"
REMOVE = f"POST {SYSTEMS}/{HOST}/Actions/ComputerSystem.RemoveResourceBlock"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Override = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


@dataclass
class Wire:
    """Middleware in front of a simulator: counts requests, keeps write bodies and headers,
    answers queued ``"METHOD /path?query"`` overrides once each, and applies ``rewrites``
    (by path, to every answer of that path)."""

    overrides: dict[str, list[Override]] = field(default_factory=dict)
    rewrites: dict[str, Callable[[web.Response], None]] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    writes: list[tuple[str, dict[str, str], Any]] = field(default_factory=list)

    def add(self, key: str, *handlers: Override) -> None:
        self.overrides.setdefault(key, []).extend(handlers)

    def writes_to(self, key: str) -> list[tuple[str, dict[str, str], Any]]:
        return [w for w in self.writes if w[0] == key]

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = f"{request.method} {request.path_qs}"
        self.calls[key] += 1
        if request.method != "GET" and not request.path.startswith(SESSIONS):
            raw = await request.read()
            self.writes.append((key, dict(request.headers), json.loads(raw) if raw else None))
        queued = self.overrides.get(key)
        response = await (queued.pop(0)(request, handler) if queued else handler(request))
        rewrite = self.rewrites.get(request.path)
        if rewrite is not None and isinstance(response, web.Response):
            rewrite(response)
        return response


def answer(
    status: int, body: Any = None, *, text: str | None = None, headers: dict[str, str] | None = None
) -> Override:
    async def respond(request: web.Request, handler: Handler) -> web.StreamResponse:
        if text is not None:
            return web.Response(status=status, text=text, headers=headers)
        if body is None:
            return web.Response(status=status, headers=headers)
        return web.json_response(body, status=status, headers=headers)

    return respond


def body_of(response: web.StreamResponse) -> Any:
    assert isinstance(response, web.Response) and isinstance(response.body, bytes)
    return json.loads(response.body)


Serve = Callable[..., Awaitable[str]]
Make = Callable[..., RedfishBackend]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    runners: list[web.AppRunner] = []

    async def _serve(sim: RedfishSimulator, wire: Wire | None = None) -> str:
        app = sim.make_app()
        if wire is not None:
            app.middlewares.append(wire.middleware)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield _serve
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def make_backend() -> AsyncIterator[Make]:
    made: list[RedfishBackend] = []

    def _make(url: str, **kwargs: Any) -> RedfishBackend:
        kwargs.setdefault("username", "admin")
        kwargs.setdefault("password", PASSWORD)
        kwargs.setdefault("retry", FAST)
        kwargs.setdefault("timeout_s", 5.0)
        kwargs.setdefault("task_poll_interval_s", 0.01)
        kwargs.setdefault("verify_poll_s", 0.02)
        kwargs.setdefault("verify_timeout_s", 0.3)
        backend = RedfishBackend(url, **kwargs)
        made.append(backend)
        return backend

    yield _make
    for backend in made:
        await backend.close()


def simulator(**kwargs: Any) -> RedfishSimulator:
    kwargs.setdefault("password", PASSWORD)
    if "mockup_dir" not in kwargs:
        kwargs.setdefault("spec", SMALL)
    return RedfishSimulator(**kwargs)


def real_like_mockup(tmp_path: Path, *, patch_only: tuple[str, ...] = ()) -> Path:
    """The DMTF composability mockup as a real service reports it: ``ResourceBlockType: []``
    on every block; the Systems in ``patch_only`` lose their Add/RemoveResourceBlock actions."""
    folder = tmp_path / "mockup"
    shutil.copytree(COMPOSABILITY, folder)
    for path in (folder / BLOCKS.strip("/")).glob("*/index.json"):
        resource = json.loads(path.read_text())
        if "ResourceBlockType" in resource:
            resource["ResourceBlockType"] = []
            path.write_text(json.dumps(resource))
    for system in patch_only:
        path = folder / SYSTEMS.strip("/") / system / "index.json"
        resource = json.loads(path.read_text())
        for name in ("#ComputerSystem.AddResourceBlock", "#ComputerSystem.RemoveResourceBlock"):
            resource["Actions"].pop(name)
        path.write_text(json.dumps(resource))
    return folder


def unit(block: str) -> FabricDevice:
    """A hand-made device for block ``block`` (as a caller that did not list could pass)."""
    return FabricDevice(
        vendor_id=f"{BLOCKS}/{block}/Processors/P0",
        attach_unit=f"{BLOCKS}/{block}",
        device_type=DeviceType.GPU,
    )


async def first_free(backend: RedfishBackend) -> FabricDevice:
    return next(d for d in (await backend.list_devices()).items if d.host_id is None)


# --- server-owned blocks ------------------------------------------------------------------


async def test_blocks_holding_cpus_are_server_owned_and_give_no_devices_though_types_are_empty(
    serve: Serve, make_backend: Make, tmp_path: Path
) -> None:
    wire = Wire()
    sim = simulator(mockup_dir=real_like_mockup(tmp_path))
    backend = make_backend(await serve(sim, wire))

    listing = await backend.list_devices()

    servers = {
        f"{BLOCKS}/{b}"
        for b in ("ComputeBlock1", "ComputeBlock2", "SystemBlock11", "SystemBlock12")
    }
    assert set(listing.local_units) == servers
    assert len(listing.local_units) == 4
    assert not servers & {d.attach_unit for d in listing.items}
    # Their DRAM and onboard NICs do not leak out as devices; the network block's NIC does.
    assert {d.attach_unit for d in listing.items if d.device_type is DeviceType.NIC} == {
        f"{BLOCKS}/NetworkBlock8"
    }
    assert not any(d.device_type is DeviceType.MEMORY for d in listing.items)
    assert listing.rejected == ()
    # The CPUs were enough: a server's memory and NICs are not even read.
    assert not [k for k in wire.calls if k.startswith(f"GET {BLOCKS}/ComputeBlock1/Memory")]


async def test_attach_or_detach_of_a_server_owned_block_is_refused_without_a_write(
    serve: Serve, make_backend: Make, tmp_path: Path
) -> None:
    wire = Wire()
    sim = simulator(mockup_dir=real_like_mockup(tmp_path))
    backend = make_backend(await serve(sim, wire))  # no listing first: the CPUs are read

    with pytest.raises(FabricServerOwned, match="CPU") as caught:
        await backend.attach(unit("ComputeBlock2"), "SystemPreResourceBlock")
    assert not caught.value.retryable
    with pytest.raises(FabricServerOwned):
        await backend.detach(unit("ComputeBlock2"), "ComposedSystem2")
    with pytest.raises(FabricServerOwned, match="SystemAfterAddResourceAction"):
        await backend.detach(unit("SystemBlock12"), "SystemAfterAddResourceAction")
    assert wire.writes == []
    assert sim.holders(f"{BLOCKS}/ComputeBlock2") == ["ComposedSystem2"]


async def test_blocks_matching_a_server_owned_pattern_are_left_out_and_refused(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator()
    first, second = sim.block_uris()[:2]
    patterns = (first.rsplit("/", 1)[-1], f"{second[:-1]}[{second[-1]}]")
    backend = make_backend(await serve(sim), server_owned_blocks=patterns)
    listing = await backend.list_devices()
    assert listing.local_units == (first, second)
    assert len(listing.items) == 6
    with pytest.raises(FabricServerOwned, match="pattern"):
        await backend.attach(
            FabricDevice(vendor_id=f"{first}/x", attach_unit=first, device_type=DeviceType.GPU),
            HOST,
        )
    assert sim.history == []


async def test_a_detach_by_patch_keeps_every_other_block_and_the_systems_own(
    serve: Serve, make_backend: Make, tmp_path: Path
) -> None:
    sim = simulator(mockup_dir=real_like_mockup(tmp_path, patch_only=("ComposedSystem",)))
    wire = Wire()
    patch = f"PATCH {SYSTEMS}/ComposedSystem"

    async def refuse_losing_the_compute_block(
        request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        # The real service: a PATCH that leaves out the System's own block is refused.
        wanted = [r["@odata.id"] for r in (await request.json())["Links"]["ResourceBlocks"]]
        if f"{BLOCKS}/ComputeBlock1" not in wanted:
            return web.json_response({"message": "compute block may not be removed"}, status=406)
        return await handler(request)

    wire.add(patch, refuse_losing_the_compute_block)
    backend = make_backend(await serve(sim, wire))
    drive = next(
        d for d in (await backend.list_devices()).items if d.attach_unit == f"{BLOCKS}/DriveBlock4"
    )

    await backend.detach(drive, "ComposedSystem")

    [(_, _, body)] = wire.writes_to(patch)
    assert body == {
        "Links": {
            "ResourceBlocks": [
                {"@odata.id": f"{BLOCKS}/ComputeBlock1"},
                {"@odata.id": f"{BLOCKS}/DriveBlock3"},
            ]
        }
    }
    assert sim.holders(f"{BLOCKS}/ComputeBlock1") == ["ComposedSystem"]
    assert sim.holders(f"{BLOCKS}/DriveBlock4") == []


# --- verification -------------------------------------------------------------------------


async def test_attach_and_detach_each_cost_one_verification_read(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator()
    backend = make_backend(await serve(sim, wire))
    device = await first_free(backend)
    wire.calls.clear()

    await backend.attach(device, HOST)
    assert wire.calls[f"GET {SYSTEMS}/{HOST}"] == 2  # the read before, the check after
    assert wire.calls[f"GET {device.attach_unit}"] == 1
    await backend.detach(device, HOST)
    assert wire.calls[f"GET {SYSTEMS}/{HOST}"] == 4
    assert wire.calls[f"GET {device.attach_unit}"] == 2
    assert backend.verifications == {"read": 2}
    # The no-write paths are not verified.
    await backend.detach(device, HOST)
    assert backend.verifications == {"read": 2}


async def test_an_attach_answered_with_success_that_changed_nothing_is_not_effective(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator()
    backend = make_backend(await serve(sim, wire))
    device = await first_free(backend)
    wire.add(ADD, answer(204))

    with pytest.raises(FabricNotEffective) as caught:
        await backend.attach(device, HOST)

    assert caught.value.retryable
    message = str(caught.value)
    assert "reported success" in message and "does not hold the block" in message
    assert "0.3 s" in message and device.attach_unit in message
    assert sim.history == []
    assert backend.verifications["not-effective"] == 1
    # Idempotent: the next call reads the state and sends again.
    await backend.attach(device, HOST)
    assert sim.history == [("attach", device.attach_unit, HOST)]


async def test_a_detach_answered_with_success_that_changed_nothing_is_not_effective(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator()
    backend = make_backend(await serve(sim, wire))
    device = await first_free(backend)
    await backend.attach(device, HOST)
    wire.add(REMOVE, answer(200, {}))
    with pytest.raises(FabricNotEffective, match="still holds the block"):
        await backend.detach(device, HOST)
    assert sim.holders(device.attach_unit) == [HOST]


async def test_a_change_that_shows_late_is_polled_until_it_is_visible(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator()
    backend = make_backend(await serve(sim, wire), verify_timeout_s=5.0)
    device = await first_free(backend)
    system_uri = f"{SYSTEMS}/{HOST}"

    async def acts_but_reads_lag(request: web.Request, handler: Handler) -> web.StreamResponse:
        stale_system = copy.deepcopy(sim.tree[system_uri])
        stale_block = copy.deepcopy(sim.tree[device.attach_unit])
        response = await handler(request)
        wire.add(f"GET {system_uri}", *[answer(200, stale_system)] * 3)
        wire.add(f"GET {device.attach_unit}", *[answer(200, stale_block)] * 2)
        return response

    wire.add(ADD, acts_but_reads_lag)
    operation = await backend.attach(device, HOST)
    assert operation.state is OperationState.COMPLETED
    # Three stale Systems and two stale blocks: the third round finds it on the block.
    assert backend.verifications["poll"] == 2
    assert sim.history == [("attach", device.attach_unit, HOST)]


# --- task monitors ------------------------------------------------------------------------


async def test_the_task_monitor_reaches_on_operation_before_the_first_poll(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator(task_mode=True, task_polls=2)
    backend = make_backend(await serve(sim, wire))
    device = await first_free(backend)
    seen: list[tuple[str, int]] = []

    async def journal(monitor: str) -> None:
        seen.append((monitor, wire.calls[f"GET {monitor}"]))

    operation = await backend.attach(device, HOST, on_operation=journal)
    assert seen == [(operation.op_id, 0)]
    await backend.detach(device, HOST, on_operation=journal)
    assert len(seen) == 2 and seen[1][1] == 0
    assert sim.history == [
        ("attach", device.attach_unit, HOST),
        ("detach", device.attach_unit, HOST),
    ]


class Crash(Exception):
    """The process stops right after journalling the monitor."""


async def crash(monitor: str) -> None:
    raise Crash(monitor)


@pytest.mark.parametrize("attach", [True, False], ids=["attach", "detach"])
async def test_resume_follows_a_running_task_to_the_end_without_sending_again(
    serve: Serve, make_backend: Make, attach: bool
) -> None:
    wire = Wire()
    sim = simulator(task_mode=True, task_polls=3)
    url = await serve(sim, wire)
    before = make_backend(url)
    device = await first_free(before)
    if not attach:
        await before.attach(device, HOST)
    change = before.attach if attach else before.detach
    with pytest.raises(Crash) as crashed:
        await change(device, HOST, on_operation=crash)
    monitor = str(crashed.value)
    writes = len(wire.writes)

    after = make_backend(url)  # a new process
    operation = await after.resume(monitor, device, HOST, attach=attach)

    assert (operation.state, operation.op_id) == (OperationState.COMPLETED, monitor)
    assert len(wire.writes) == writes
    assert sim.holders(device.attach_unit) == ([HOST] if attach else [])
    assert after.verifications["read"] >= 1


async def test_resume_of_a_gone_monitor_reads_the_state_and_sends_only_if_needed(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator()
    backend = make_backend(await serve(sim, wire))
    device = await first_free(backend)
    gone = f"{MONITORS}/999"

    first = await backend.resume(gone, device, HOST, attach=True)  # never took effect
    assert first.state is OperationState.COMPLETED
    assert sim.history == [("attach", device.attach_unit, HOST)]
    assert len(wire.writes_to(ADD)) == 1

    again = await backend.resume(gone, device, HOST, attach=True)  # the state holds
    assert again.state is OperationState.COMPLETED and "holds" in (again.message or "")
    assert len(wire.writes_to(ADD)) == 1


def as_200(body_change: dict[str, Any] | None = None) -> Override:
    """Answer what the simulator answers, but a 202 becomes a 200 (with ``body_change``)."""

    async def respond(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if response.status != 202:
            return response
        headers = {k: v for k, v in response.headers.items() if k in ("Location", "Retry-After")}
        return web.json_response(
            {**body_of(response), **(body_change or {})}, status=200, headers=headers
        )

    return respond


async def test_a_monitor_answering_200_with_a_running_task_is_still_running(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator(task_mode=True, task_polls=2)
    backend = make_backend(await serve(sim, wire))
    device = await first_free(backend)
    wire.add(f"GET {MONITORS}/1", as_200(), as_200())
    operation = await backend.attach(device, HOST)
    assert operation.op_id == f"{MONITORS}/1"
    assert wire.calls[f"GET {MONITORS}/1"] == 3
    assert sim.history == [("attach", device.attach_unit, HOST)]


async def test_a_write_answered_200_with_a_running_task_is_followed(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator(task_mode=True, task_polls=1)
    backend = make_backend(await serve(sim, wire))
    device = await first_free(backend)
    monitors: list[str] = []

    async def journal(monitor: str) -> None:
        monitors.append(monitor)

    wire.add(ADD, as_200())
    operation = await backend.attach(device, HOST, on_operation=journal)
    assert monitors == [f"{MONITORS}/1"] == [operation.op_id]
    assert sim.history == [("attach", device.attach_unit, HOST)]


@pytest.mark.parametrize("state", ["Killed", "Exception", "Cancelled"])
async def test_a_task_that_ends_killed_or_cancelled_fails_saying_so(
    serve: Serve, make_backend: Make, state: str
) -> None:
    wire = Wire()
    sim = simulator(task_mode=True, task_polls=5)
    backend = make_backend(await serve(sim, wire))
    device = await first_free(backend)
    ended = {
        "@odata.id": "/redfish/v1/TaskService/Tasks/1",
        "TaskState": state,
        "Messages": [{"MessageId": "Base.1.18.GeneralError", "Message": "stopped by the operator"}],
    }
    wire.add(f"GET {MONITORS}/1", answer(200, ended))
    with pytest.raises(FabricError, match=f"TaskState {state}: stopped by the operator"):
        await backend.attach(device, HOST)
    assert sim.history == []


async def test_resume_of_a_killed_task_without_effect_sends_the_change_again(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator(task_mode=True, task_polls=0)
    url = await serve(sim, wire)
    backend = make_backend(url)
    device = await first_free(backend)
    with pytest.raises(Crash):
        await backend.attach(device, HOST, on_operation=crash)
    wire.add(f"GET {MONITORS}/1", answer(200, {"TaskState": "Killed"}))
    monitors: list[str] = []

    async def journal(monitor: str) -> None:
        monitors.append(monitor)

    operation = await make_backend(url).resume(
        f"{MONITORS}/1", device, HOST, attach=True, on_operation=journal
    )
    assert operation.state is OperationState.COMPLETED
    assert monitors == [f"{MONITORS}/2"] == [operation.op_id]
    assert sim.history == [("attach", device.attach_unit, HOST)]


# --- error bodies, statuses and ETags -------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        pytest.param(
            answer(406, {"message": "Compute block\n may not be removed"}),
            "HTTP 406: Compute block may not be removed",
            id="message-only-json",
        ),
        pytest.param(
            answer(400, text="bad block reference\r\nsee the log"),
            "HTTP 400: bad block reference see the log",
            id="plain-text",
        ),
        pytest.param(
            answer(
                405,
                text="<html><body><h1>Method Not Allowed</h1></body></html>",
                headers={"Content-Type": "text/html"},
            ),
            "HTTP 405: Method Not Allowed",
            id="html",
        ),
        pytest.param(answer(501, text="x" * 2000), "HTTP 501: " + "x" * 200, id="capped"),
    ],
)
async def test_refusals_show_the_services_text_and_are_not_retried(
    serve: Serve, make_backend: Make, reply: Override, says: str
) -> None:
    wire = Wire()
    sim = simulator()
    backend = make_backend(await serve(sim, wire))
    device = await first_free(backend)
    wire.add(ADD, reply)
    with pytest.raises(FabricError) as caught:
        await backend.attach(device, HOST)
    assert type(caught.value) is FabricError
    assert not caught.value.retryable
    assert says in str(caught.value)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 500
    assert len(wire.writes_to(ADD)) == 1
    assert sim.history == []


def etag_rewrite(
    *, header: Callable[[str], str] | None = None, body: Callable[[str], str] | None = None
) -> Callable[[web.Response], None]:
    def rewrite(response: web.Response) -> None:
        if response.status != 200:
            return
        if header is not None and "ETag" in response.headers:
            response.headers["ETag"] = header(response.headers["ETag"])
        if body is not None:
            resource = body_of(response)
            resource["@odata.etag"] = body(resource["@odata.etag"])
            response.body = json.dumps(resource).encode()

    return rewrite


@pytest.mark.parametrize(
    "rewrite",
    [
        pytest.param(etag_rewrite(header=lambda tag: f'"{tag}"'), id="header-quoted-twice"),
        pytest.param(
            etag_rewrite(header=lambda tag: 'W/"unlike-the-body"'), id="header-unlike-the-body"
        ),
        pytest.param(
            etag_rewrite(header=lambda tag: f'"{tag}"', body=lambda tag: f'"{tag}"'),
            id="both-quoted-twice",
        ),
    ],
)
async def test_misquoted_etags_do_not_cause_precondition_failures(
    serve: Serve, make_backend: Make, rewrite: Callable[[web.Response], None]
) -> None:
    wire = Wire()
    sim = simulator(offer_actions=False, require_if_match=True)
    wire.rewrites[f"{SYSTEMS}/{HOST}"] = rewrite
    backend = make_backend(await serve(sim, wire))
    device = await first_free(backend)
    await backend.attach(device, HOST)
    await backend.detach(device, HOST)
    assert [key for key, _, _ in wire.writes] == [f"PATCH {SYSTEMS}/{HOST}"] * 2
    assert backend.retries["precondition"] == 0


async def test_a_service_refusing_its_own_unchanged_etag_gets_one_write_without_if_match(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator(offer_actions=False)
    wire.rewrites[f"{SYSTEMS}/{HOST}"] = etag_rewrite(
        header=lambda _: '"stale"', body=lambda _: '"stale"'
    )
    backend = make_backend(await serve(sim, wire))
    device = await first_free(backend)
    await backend.attach(device, HOST)
    sent = wire.writes_to(f"PATCH {SYSTEMS}/{HOST}")
    assert [headers.get("If-Match") for _, headers, _ in sent] == ['"stale"', None]
    assert sim.history == [("attach", device.attach_unit, HOST)]


async def test_a_500_for_a_dangling_device_link_rejects_that_device_after_one_retry(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator()
    block = sim.block_uris()[0]
    ghost = f"{block}/Drives/ghost"
    sim.tree[block]["Drives"] = [{"@odata.id": ghost}]
    sim.fail_next(100, method="GET", path_prefix=ghost, status=500)
    backend = make_backend(await serve(sim, wire))

    listing = await backend.list_devices()

    assert len(listing.items) == 8
    [rejected] = listing.rejected
    assert (rejected.vendor_id, rejected.kind) == (ghost, "fetch-failed")
    assert ghost in rejected.reason and "HTTP 500" in rejected.reason
    assert wire.calls[f"GET {ghost}"] == 2


async def test_a_500_on_the_service_root_or_a_page_still_fails_the_listing(
    serve: Serve, make_backend: Make
) -> None:
    wire = Wire()
    sim = simulator()
    url = await serve(sim, wire)
    wire.add("GET /redfish/v1/", *[answer(500)] * FAST.attempts)
    with pytest.raises(FabricUnavailable, match="HTTP 500"):
        await make_backend(url).list_devices()
    wire.add(f"GET {BLOCKS}", *[answer(500)] * FAST.attempts)
    with pytest.raises(FabricUnavailable, match="HTTP 500"):
        await make_backend(url).list_devices()


# --- one physical device, one device --------------------------------------------------------


@pytest.mark.parametrize("identity", ["serial", "uuid"])
async def test_one_physical_device_under_two_uris_is_listed_once(
    serve: Serve, make_backend: Make, identity: str
) -> None:
    sim = simulator()
    url = await serve(sim)
    plain = await make_backend(url).list_devices()
    first, second = plain.items[0], plain.items[5]
    assert first.attach_unit != second.attach_unit
    sim.tree[second.vendor_id]["SerialNumber"] = first.serial
    assert first.uuid is not None
    sim.tree[second.vendor_id]["UUID"] = first.uuid.upper()

    listing = await make_backend(url, device_identity=identity).list_devices()

    assert [d.vendor_id for d in listing.items] == [
        d.vendor_id for d in plain.items if d is not second
    ]
    [rejected] = listing.rejected
    assert (rejected.vendor_id, rejected.kind) == (second.vendor_id, "duplicate")
    assert first.vendor_id in rejected.reason and second.vendor_id in rejected.reason
    # By URI (the default) they stay two devices.
    assert len((await make_backend(url).list_devices()).items) == 8


# --- settings -------------------------------------------------------------------------------


async def test_the_new_fabric_settings_reach_the_backend_through_the_factory(serve: Serve) -> None:
    from app.configload import load_settings
    from app.fabric.factory import backend_from_settings

    sim = simulator(auth="none")
    url = await serve(sim)
    first, second = sim.block_uris()[:2]
    settings = load_settings(
        environ={
            "FABRIC_DRA_FABRIC__URL": url,
            "FABRIC_DRA_FABRIC__AUTH": "none",
            "FABRIC_DRA_FABRIC__SERVER_OWNED_BLOCKS": f"{first.rsplit('/', 1)[-1]}, {second}",
            "FABRIC_DRA_FABRIC__DEVICE_IDENTITY": "serial",
            "FABRIC_DRA_FABRIC__VERIFY_TIMEOUT_SECONDS": "0.25",
            "FABRIC_DRA_FABRIC__VERIFY_POLL_SECONDS": "0.05",
        }
    )
    assert settings.fabric.server_owned_blocks == (first.rsplit("/", 1)[-1], second)
    defaults = load_settings(environ={}).fabric
    assert (defaults.server_owned_blocks, defaults.device_identity) == ((), "uri")
    assert (defaults.verify_poll_seconds, defaults.verify_timeout_seconds) == (0.2, 10.0)
    backend = backend_from_settings(settings.fabric)
    assert isinstance(backend, RedfishBackend)
    try:
        listing = await backend.list_devices()
        assert listing.local_units == (first, second)
        third = listing.items[0]
        sim.tree[listing.items[1].vendor_id]["SerialNumber"] = third.serial
        assert [r.kind for r in (await backend.list_devices()).rejected] == ["duplicate"]
        free = next(d for d in listing.items if d.host_id is None)
        sim.fail_next(1, method="POST", path_prefix=f"{SYSTEMS}/{HOST}/Actions", status=204)
        with pytest.raises(FabricNotEffective, match=r"0\.25 s"):
            await backend.attach(free, HOST)
    finally:
        await backend.close()


def test_bad_verification_or_identity_settings_are_refused() -> None:
    from app.config import ConfigError
    from app.configload import load_settings

    with pytest.raises(ConfigError, match=r"fabric\.device_identity"):
        load_settings(environ={"FABRIC_DRA_FABRIC__DEVICE_IDENTITY": "name"})
    with pytest.raises(ConfigError, match=r"fabric\.verify_timeout_seconds"):
        load_settings(environ={"FABRIC_DRA_FABRIC__VERIFY_TIMEOUT_SECONDS": "0"})
    with pytest.raises(ValueError, match="device identity"):
        RedfishBackend("http://h", auth="none", device_identity="name")  # type: ignore[arg-type]
