"""The Redfish backend over real HTTP, against the Redfish simulator."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from builders import REDFISH_DATA

from app.fabric.backend import FabricBackend
from app.fabric.errors import (
    FabricAuthError,
    FabricConflict,
    FabricError,
    FabricInvalidData,
    FabricNotFound,
    FabricPreconditionFailed,
    FabricTimeout,
    FabricUnavailable,
)
from app.fabric.redfish.backend import RedfishBackend
from app.fabric.redfish.parse.chassis import MAX_CHASSIS_DEPTH
from app.fabric.redfish.task_monitor import FabricTaskTimeout
from app.fabric.redfish.transport import RetrySettings
from app.fabric.types import DeviceType, FabricDevice, OperationState
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

DATA = REDFISH_DATA
COMPOSABILITY = DATA / "dmtf-public-composability"
BLOCKS = "/redfish/v1/CompositionService/ResourceBlocks"
SESSIONS = "/redfish/v1/SessionService/Sessions"
SYSTEMS = "/redfish/v1/Systems"
PASSWORD = "s3cret-Passw0rd"
BASIC = {"Authorization": aiohttp.encode_basic_auth("admin", PASSWORD)}
FAST = RetrySettings(attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05, max_retry_after_s=0.1)
SMALL = InventorySpec(regions=1, racks_per_region=2, devices_per_rack=4, hosts_per_rack=2)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Override = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


@dataclass
class Script:
    """Middleware in front of a simulator: answers chosen requests itself, counts the rest.

    ``overrides`` maps ``"METHOD /path?query"`` to a list of handlers used once each, in order.
    """

    overrides: dict[str, list[Override]] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    peak: int = 0

    def add(self, key: str, *handlers: Override) -> None:
        self.overrides.setdefault(key, []).extend(handlers)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = f"{request.method} {request.path_qs}"
        self.calls[key] += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            queued = self.overrides.get(key)
            if queued:
                return await queued.pop(0)(request, handler)
            return await handler(request)
        finally:
            self.in_flight -= 1


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None) -> Override:
    async def respond(request: web.Request, handler: Handler) -> web.StreamResponse:
        if body is None:
            return web.Response(status=status, headers=headers)
        return web.json_response(body, status=status, headers=headers)

    return respond


Serve = Callable[..., Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serve a simulator's app on 127.0.0.1 port 0 (optionally TLS, optionally scripted)."""
    runners: list[web.AppRunner] = []

    async def _serve(
        sim: RedfishSimulator, *, script: Script | None = None, tls: ssl.SSLContext | None = None
    ) -> str:
        app = sim.make_app()
        if script is not None:
            app.middlewares.append(script.middleware)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        port = runner.addresses[0][1]
        return f"{'https' if tls else 'http'}://127.0.0.1:{port}"

    yield _serve
    for runner in runners:
        await runner.cleanup()


Make = Callable[..., RedfishBackend]


@pytest.fixture
async def make_backend(serve: Serve) -> AsyncIterator[Make]:
    """Backends with fast retries; closed (logged out) before the servers stop."""
    made: list[RedfishBackend] = []

    def _make(url: str, **kwargs: Any) -> RedfishBackend:
        kwargs.setdefault("username", "admin")
        kwargs.setdefault("password", PASSWORD)
        kwargs.setdefault("retry", FAST)
        kwargs.setdefault("timeout_s", 5.0)
        kwargs.setdefault("task_poll_interval_s", 0.01)
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


async def sessions_on(url: str) -> list[str]:
    """Session URIs open on the simulator, read with Basic auth."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(url + SESSIONS, headers=BASIC) as response,
    ):
        body = await response.json()
    return [member["@odata.id"] for member in body["Members"]]


async def first_free_device(backend: RedfishBackend) -> FabricDevice:
    listing = await backend.list_devices()
    return next(d for d in listing.items if d.host_id is None)


# --- listing ------------------------------------------------------------------------------


async def test_generated_fabric_lists_every_gpu_with_region_rack_and_host(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(
        spec=InventorySpec(
            regions=2,
            racks_per_region=4,
            devices_per_rack=16,
            hosts_per_rack=4,
            device_mix="gpu",
            seed=0,
        )
    )
    backend = make_backend(await serve(sim))
    assert isinstance(backend, FabricBackend)
    device = await first_free_device(backend)
    await backend.attach(device, "node-us-west-rack-03-2")

    devices = await backend.list_devices()
    hosts = await backend.list_hosts()

    assert devices.rejected == ()
    assert len(devices.items) == 128
    assert {d.device_type for d in devices.items} == {DeviceType.GPU}
    per_rack = Counter((d.location.region, d.location.rack) for d in devices.items)
    assert per_rack == {
        (region, f"rack-0{rack}"): 16 for region in ("us-east", "us-west") for rack in range(1, 5)
    }
    assert {d.attach_unit for d in devices.items} == set(sim.block_uris())
    assert all(d.location.fabric == f"zone-{d.location.region}" for d in devices.items)
    held = {d.attach_unit: d.host_id for d in devices.items if d.host_id is not None}
    assert held == {device.attach_unit: "node-us-west-rack-03-2"}
    assert held == {b: h for b, h in sim.attachments().items() if h is not None}

    assert hosts.rejected == ()
    assert len(hosts.items) == 32
    for host in hosts.items:
        assert host.hostname == host.host_id
        assert host.hostname.startswith(f"node-{host.location.region}-{host.location.rack}-")
    attached = {h.host_id: h.attached_units for h in hosts.items if h.attached_units}
    assert attached == {"node-us-west-rack-03-2": (device.attach_unit,)}


async def test_paged_collections_are_followed_to_the_end(serve: Serve, make_backend: Make) -> None:
    sim = simulator(spec=InventorySpec(device_mix="mixed"), page_size=5)
    script = Script()
    backend = make_backend(await serve(sim, script=script))
    devices = await backend.list_devices()
    hosts = await backend.list_hosts()
    assert len(devices.items) == 128
    assert Counter(d.device_type for d in devices.items) == {
        DeviceType.GPU: 32,
        DeviceType.FPGA: 32,
        DeviceType.NVME: 32,
        DeviceType.CXL_MEMORY: 32,
    }
    assert len(hosts.items) == 32
    block_pages = [k for k in script.calls if k.startswith(f"GET {BLOCKS}?")]
    assert len(block_pages) == 128 // 5  # every page after the first, each read once


async def test_repeated_members_across_pages_are_listed_once_and_the_count_is_ignored(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator()
    blocks = sim.block_uris()
    script = Script()
    script.add(
        f"GET {BLOCKS}",
        answer(
            200,
            {
                "Members": [{"@odata.id": b} for b in blocks[:3]],
                "Members@odata.count": 1,
                "Members@odata.nextLink": f"{BLOCKS}?page=2",
            },
        ),
    )
    script.add(
        f"GET {BLOCKS}?page=2",
        answer(
            200,
            {
                "Members": [{"@odata.id": b} for b in blocks[2:]] + [{"bad": 1}],
                "Members@odata.count": 1,
            },
        ),
    )
    backend = make_backend(await serve(sim, script=script))
    listing = await backend.list_devices()
    assert sorted(d.attach_unit for d in listing.items) == sorted(blocks)
    assert [(r.vendor_id, r.kind) for r in listing.rejected] == [
        (f"{BLOCKS}#/Members/{len(blocks) - 2}", "bad-type")
    ]


async def test_a_page_that_keeps_failing_fails_the_whole_listing(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(page_size=3)
    script = Script()
    script.add(f"GET {BLOCKS}?$skip=3", *[answer(500)] * FAST.attempts)
    backend = make_backend(await serve(sim, script=script))
    with pytest.raises(FabricUnavailable, match=r"HTTP 500"):
        await backend.list_devices()
    assert script.calls[f"GET {BLOCKS}?$skip=3"] == FAST.attempts


async def test_one_failed_page_read_is_retried(serve: Serve, make_backend: Make) -> None:
    sim = simulator(page_size=3)
    script = Script()
    script.add(f"GET {BLOCKS}?$skip=3", answer(503, headers={"Retry-After": "0"}))
    backend = make_backend(await serve(sim, script=script))
    listing = await backend.list_devices()
    assert len(listing.items) == 8
    assert script.calls[f"GET {BLOCKS}?$skip=3"] == 2


async def test_failing_block_reads_fail_the_listing_instead_of_shrinking_it(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator()
    url = await serve(sim)
    sim.fail_next(100, method="GET", path_prefix=f"{BLOCKS}/us-east-rack-02", status=503)
    backend = make_backend(url)
    with pytest.raises(FabricUnavailable, match="rack-02"):
        await backend.list_devices()


async def test_malformed_collection_json_is_invalid_data(serve: Serve, make_backend: Make) -> None:
    sim = simulator()
    url = await serve(sim)
    sim.fail_next(1, method="GET", path_prefix=BLOCKS, status=200, body='{"Members": [')
    backend = make_backend(url)
    with pytest.raises(FabricInvalidData, match="not valid JSON"):
        await backend.list_devices()


async def test_bad_devices_are_rejected_one_by_one(serve: Serve, make_backend: Make) -> None:
    sim = simulator()
    url = await serve(sim)
    backend = make_backend(url)
    clean = await backend.list_devices()
    gone, garbled, bad_type, no_id = (d.vendor_id for d in clean.items[:4])
    sim.fail_next(1, method="GET", path_prefix=gone, status=404)
    sim.fail_next(1, method="GET", path_prefix=garbled, status=200, body="{not json")
    sim.tree[bad_type]["Manufacturer"] = 42
    del sim.tree[no_id]["@odata.id"]

    listing = await backend.list_devices()

    assert len(listing.items) == len(clean.items) - 4
    reasons = {r.vendor_id: (r.kind, r.reason) for r in listing.rejected}
    assert reasons[gone][0] == "fetch-failed" and "404" in reasons[gone][1]
    assert reasons[garbled][0] == "fetch-failed" and "JSON" in reasons[garbled][1]
    assert reasons[bad_type][0] == "bad-type" and "Manufacturer" in reasons[bad_type][1]
    assert reasons[no_id][0] == "missing-field" and "@odata.id" in reasons[no_id][1]


async def test_dropped_connections_are_retried_on_reads(serve: Serve, make_backend: Make) -> None:
    sim = simulator()
    url = await serve(sim)
    backend = make_backend(
        url, retry=RetrySettings(attempts=8, initial_backoff_s=0.001, max_backoff_s=0.01)
    )
    sim.faults.drop_rate = 0.1
    listing = await backend.list_devices()
    assert len(listing.items) == 8
    assert listing.rejected == ()


async def test_a_fabric_that_drops_everything_is_unavailable(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(auth="none")
    url = await serve(sim)
    sim.faults.drop_rate = 1.0
    backend = make_backend(url, auth="none")
    with pytest.raises(FabricUnavailable, match=r"closed the connection|Connection"):
        await backend.list_hosts()


async def test_listing_reads_each_chassis_once(serve: Serve, make_backend: Make) -> None:
    sim = simulator()
    script = Script()
    backend = make_backend(await serve(sim, script=script))
    await backend.list_devices()
    chassis_reads = {k: n for k, n in script.calls.items() if "/Chassis/" in k}
    assert chassis_reads and set(chassis_reads.values()) == {1}


async def test_a_chassis_chain_is_followed_at_most_max_chassis_depth_deep(
    serve: Serve, make_backend: Make
) -> None:
    """The walk reads a block's chassis and its ContainedBy parents, MAX_CHASSIS_DEPTH
    chassis in all: a Row on the last of them locates the block's devices, and a Rack on the
    next one is never read."""
    sim = simulator()
    script = Script()
    backend = make_backend(await serve(sim, script=script))
    block = (await backend.list_devices()).items[0].attach_unit
    chain = [f"/redfish/v1/Chassis/deep-{level}" for level in range(MAX_CHASSIS_DEPTH + 2)]
    for level, uri in enumerate(chain):
        sim.tree[uri] = {"@odata.id": uri, "Id": f"deep-{level}", "ChassisType": "Enclosure"}
        if level + 1 < len(chain):
            sim.tree[uri]["Links"] = {"ContainedBy": {"@odata.id": chain[level + 1]}}
    last, beyond = chain[MAX_CHASSIS_DEPTH - 1], chain[MAX_CHASSIS_DEPTH]
    sim.tree[last]["Location"] = {"Placement": {"Row": "last-row"}}
    sim.tree[beyond]["Location"] = {"Placement": {"Rack": "beyond-reach"}}
    sim.tree[block]["Links"]["Chassis"] = [{"@odata.id": chain[0]}]

    listing = await backend.list_devices()

    located = [d.location for d in listing.items if d.attach_unit == block]
    assert located
    assert {(place.chassis, place.row, place.rack) for place in located} == {
        ("deep-0", "last-row", None)
    }
    assert [script.calls[f"GET {uri}"] for uri in chain] == [1] * MAX_CHASSIS_DEPTH + [0, 0]


async def test_concurrency_limit_bounds_requests_in_flight(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(spec=InventorySpec(regions=1, racks_per_region=2, devices_per_rack=20))
    sim.faults.latency_s = 0.005
    script = Script()
    backend = make_backend(await serve(sim, script=script), max_concurrency=3)
    assert len((await backend.list_devices()).items) == 40
    assert 1 < script.peak <= 3


async def test_dmtf_composability_mockup_lists_its_gpu_and_drives(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(mockup_dir=COMPOSABILITY)
    backend = make_backend(await serve(sim))
    devices = await backend.list_devices()
    hosts = await backend.list_hosts()
    by_id = {d.vendor_id: d for d in devices.items}
    gpu = by_id[f"{BLOCKS}/OffloadBlock9/Processors/Block9GPU"]
    assert gpu.device_type is DeviceType.GPU
    assert gpu.attach_unit == f"{BLOCKS}/OffloadBlock9"
    assert (gpu.location.chassis, gpu.location.fabric) == ("ComposableModule6", "2")
    assert gpu.host_id is None
    drives = [d for d in devices.items if d.device_type in (DeviceType.NVME, DeviceType.DRIVE)]
    assert len(drives) == 9  # five NVMe drives and the four SAS bays of DriveBlock7
    assert by_id[f"{BLOCKS}/DriveBlock10/Drives/Block10Slot4"].host_id == (
        "SystemAfterAddResourceAction"
    )
    # ComposableModule7 claims to be ComposableModule6 in its @odata.id: its Id wins.
    assert by_id[f"{BLOCKS}/DriveBlock10/Drives/Block10Slot4"].location.chassis == (
        "ComposableModule7"
    )
    assert not any(
        "ComputeBlock" in d.attach_unit or "SystemBlock" in d.attach_unit for d in devices.items
    )
    servers = ("ComputeBlock1", "ComputeBlock2", "SystemBlock11", "SystemBlock12")
    assert set(devices.local_units) == {f"{BLOCKS}/{b}" for b in servers}
    assert devices.rejected == ()
    assert {h.host_id for h in hosts.items} == {
        "ComposedSystem",
        "ComposedSystem2",
        "SystemPreResourceBlock",
        "SystemAfterResourceBlock",
        "SystemAfterAddResourceAction",
    }

    operation = await backend.attach(gpu, "SystemAfterAddResourceAction")
    assert operation.state is OperationState.COMPLETED
    assert sim.attachments()[gpu.attach_unit] == "SystemAfterAddResourceAction"


# --- authentication and TLS ---------------------------------------------------------------


async def test_session_login_is_renewed_once_after_the_session_expires(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(auth="any")
    script = Script()
    url = await serve(sim, script=script)
    backend = make_backend(url)
    await backend.list_hosts()
    assert script.calls[f"POST {SESSIONS}"] == 1
    # Another client ends every session: the backend's token is now refused.
    async with aiohttp.ClientSession() as http:
        for uri in await sessions_on(url):
            async with http.delete(url + uri, headers=BASIC) as response:
                assert response.status == 204
    assert len((await backend.list_hosts()).items) == 4
    assert script.calls[f"POST {SESSIONS}"] == 2
    assert len(await sessions_on(url)) == 1


async def test_a_401_after_renewal_is_an_auth_error(serve: Serve, make_backend: Make) -> None:
    sim = simulator(auth="session")
    script = Script()
    script.add(f"GET {SYSTEMS}", answer(401), answer(401))
    backend = make_backend(await serve(sim, script=script))
    with pytest.raises(FabricAuthError):
        await backend.list_hosts()
    assert script.calls[f"POST {SESSIONS}"] == 2


async def test_close_logs_out_and_is_idempotent(serve: Serve, make_backend: Make) -> None:
    sim = simulator(auth="any")
    url = await serve(sim)
    backend = make_backend(url)
    await backend.list_hosts()
    assert len(await sessions_on(url)) == 1
    await backend.close()
    await backend.close()
    assert await sessions_on(url) == []
    with pytest.raises(FabricError, match="closed"):
        await backend.list_hosts()


async def test_close_does_not_wait_long_for_a_logout_the_service_does_not_answer(
    serve: Serve,
    make_backend: Make,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A shutdown must not hang on a fabric manager that stopped answering: the session is
    # left to expire on the service.
    from app.fabric.redfish import transport

    monkeypatch.setattr(transport, "LOGOUT_TIMEOUT_S", 0.2)
    caplog.set_level("INFO", logger="app.fabric.redfish.transport")
    sim = simulator(auth="any")
    url = await serve(sim)
    backend = make_backend(url)
    await backend.list_hosts()
    sim.faults.latency_s = 2.0
    try:
        await asyncio.wait_for(backend.close(), 1.5)
    finally:
        sim.faults.latency_s = 0
    assert "no answer within 0 s; the session is left to expire" in caplog.text
    with pytest.raises(FabricError, match="closed"):
        await backend.list_hosts()


async def test_basic_auth_lists_without_a_session(serve: Serve, make_backend: Make) -> None:
    sim = simulator(auth="basic")
    script = Script()
    backend = make_backend(await serve(sim, script=script), auth="basic")
    assert len((await backend.list_devices()).items) == 8
    assert script.calls[f"POST {SESSIONS}"] == 0


@pytest.mark.parametrize("auth", ["session", "basic"])
async def test_wrong_password_is_an_auth_error_that_never_shows_it(
    serve: Serve, make_backend: Make, auth: str
) -> None:
    sim = simulator(auth="any")
    wrong = "Wr0ng-Passw0rd-Value"
    backend = make_backend(await serve(sim), auth=auth, password=wrong)
    with pytest.raises(FabricAuthError) as caught:
        await backend.list_hosts()
    assert caught.value.status == 401
    for text in (str(caught.value), repr(caught.value), repr(backend)):
        assert wrong not in text
        assert "admin" not in text
    assert wrong not in repr(vars(backend))


@pytest.fixture(scope="module")
def certificate_authority() -> trustme.CA:
    return trustme.CA()


async def test_tls_from_an_unknown_ca_is_refused_clearly(
    serve: Serve, make_backend: Make, certificate_authority: trustme.CA
) -> None:
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate_authority.issue_cert("127.0.0.1").configure_cert(server_ssl)
    url = await serve(simulator(), tls=server_ssl)
    backend = make_backend(url)
    with pytest.raises(FabricUnavailable) as caught:
        await backend.list_hosts()
    message = str(caught.value)
    assert "TLS verification" in message
    assert "CA bundle" in message
    assert PASSWORD not in message
    assert "object at 0x" not in message


async def test_an_https_url_to_a_plain_http_server_says_it_did_not_speak_tls(
    serve: Serve, make_backend: Make
) -> None:
    url = await serve(simulator())
    backend = make_backend(url.replace("http://", "https://", 1))
    with pytest.raises(FabricUnavailable) as caught:
        await backend.list_hosts()
    message = str(caught.value)
    assert "did not answer in TLS" in message, message
    assert "plain-HTTP server" in message and "http:// URL" in message, message
    assert "SSLContext" not in message and "object at 0x" not in message, message
    assert "CA bundle" not in message, message


async def test_tls_with_the_right_ca_bundle_works(
    serve: Serve, make_backend: Make, certificate_authority: trustme.CA, tmp_path: Path
) -> None:
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate_authority.issue_cert("127.0.0.1").configure_cert(server_ssl)
    url = await serve(simulator(), tls=server_ssl)
    ca_file = tmp_path / "ca.pem"
    certificate_authority.cert_pem.write_to_path(str(ca_file))
    backend = make_backend(url, ca_file=ca_file)
    assert len((await backend.list_devices()).items) == 8
    unverified = make_backend(url, verify_tls=False)
    assert len((await unverified.list_hosts()).items) == 4


def test_an_unreadable_ca_bundle_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="CA bundle"):
        RedfishBackend(
            "https://127.0.0.1:1", username="u", password="p", ca_file=tmp_path / "missing.pem"
        )


# --- attach and detach --------------------------------------------------------------------


@pytest.mark.parametrize("offer_actions", [True, False], ids=["actions", "patch"])
async def test_attach_and_detach_are_idempotent(
    serve: Serve, make_backend: Make, offer_actions: bool
) -> None:
    sim = simulator(offer_actions=offer_actions, require_if_match=not offer_actions)
    script = Script()
    backend = make_backend(await serve(sim, script=script))
    device = await first_free_device(backend)
    host = "node-us-east-rack-01-1"

    first = await backend.attach(device, host)
    again = await backend.attach(device, host)
    assert (first.state, again.state) == (OperationState.COMPLETED, OperationState.COMPLETED)
    assert sim.attachments()[device.attach_unit] == host
    await backend.detach(device, host)
    await backend.detach(device, host)
    assert sim.attachments()[device.attach_unit] is None
    assert sim.history == [
        ("attach", device.attach_unit, host),
        ("detach", device.attach_unit, host),
    ]
    writes = [k for k in script.calls if not k.startswith("GET ") and SESSIONS not in k]
    if offer_actions:
        assert sum(script.calls[k] for k in writes if "/Actions/" in k) == 2
    else:
        assert writes == [f"PATCH {SYSTEMS}/{host}"]
        assert script.calls[f"PATCH {SYSTEMS}/{host}"] == 2


async def test_attach_of_a_block_held_elsewhere_is_a_conflict_without_a_write(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator()
    backend = make_backend(await serve(sim))
    device = await first_free_device(backend)
    await backend.attach(device, "node-us-east-rack-01-1")
    with pytest.raises(FabricConflict, match="node-us-east-rack-01-1"):
        await backend.attach(device, "node-us-east-rack-01-2")
    # Detaching from a host that does not hold it is a success that changes nothing.
    await backend.detach(device, "node-us-east-rack-01-2")
    assert sim.attachments()[device.attach_unit] == "node-us-east-rack-01-1"
    assert len(sim.history) == 1


async def test_a_409_from_the_service_is_a_conflict(serve: Serve, make_backend: Make) -> None:
    sim = simulator()
    url = await serve(sim)
    backend = make_backend(url)
    device = await first_free_device(backend)
    host = "node-us-east-rack-01-1"
    sim.fail_next(1, method="POST", path_prefix=f"{SYSTEMS}/{host}/Actions", status=409)
    with pytest.raises(FabricConflict) as caught:
        await backend.attach(device, host)
    assert caught.value.status == 409
    assert sim.history == []


async def test_unknown_block_or_host_is_not_found(serve: Serve, make_backend: Make) -> None:
    sim = simulator()
    backend = make_backend(await serve(sim))
    device = await first_free_device(backend)
    ghost = FabricDevice(
        vendor_id=f"{BLOCKS}/ghost/Processors/GPU0",
        attach_unit=f"{BLOCKS}/ghost",
        device_type=DeviceType.GPU,
    )
    with pytest.raises(FabricNotFound, match="device not found"):
        await backend.attach(ghost, "node-us-east-rack-01-1")
    with pytest.raises(FabricNotFound, match="host not found"):
        await backend.attach(device, "no-such-node")
    with pytest.raises(FabricNotFound):
        await backend.detach(device, "no-such-node")


async def test_a_stale_etag_is_read_again_and_retried_once(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(offer_actions=False)
    url = await serve(sim)
    backend = make_backend(url)
    device = await first_free_device(backend)
    host = "node-us-east-rack-01-1"
    sim.fail_next(1, method="PATCH", path_prefix=f"{SYSTEMS}/{host}", status=412)
    await backend.attach(device, host)
    assert sim.attachments()[device.attach_unit] == host

    sim.fail_next(2, method="PATCH", path_prefix=f"{SYSTEMS}/{host}", status=412)
    with pytest.raises(FabricPreconditionFailed):
        await backend.detach(device, host)
    assert sim.attachments()[device.attach_unit] == host


@pytest.mark.parametrize("status", [503, 429])
async def test_a_busy_service_is_retried_on_writes(
    serve: Serve, make_backend: Make, status: int
) -> None:
    sim = simulator()
    script = Script()
    backend = make_backend(await serve(sim, script=script))
    device = await first_free_device(backend)
    host = "node-us-east-rack-01-1"
    action = f"POST {SYSTEMS}/{host}/Actions/ComputerSystem.AddResourceBlock"
    script.add(action, answer(status, headers={"Retry-After": "0"}), answer(status))
    await backend.attach(device, host)
    assert sim.history == [("attach", device.attach_unit, host)]
    assert script.calls[action] == 3


async def test_a_500_on_a_write_is_decided_by_reading_the_state(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator()
    script = Script()
    backend = make_backend(await serve(sim, script=script))
    device = await first_free_device(backend)
    host = "node-us-east-rack-01-1"
    action = f"POST {SYSTEMS}/{host}/Actions/ComputerSystem.AddResourceBlock"
    script.add(action, answer(500))
    # A 500 may or may not have acted: the state is read again, and the block is still free,
    # so the write is made again.
    await backend.attach(device, host)
    assert script.calls[action] == 2
    assert sim.history == [("attach", device.attach_unit, host)]


async def test_a_write_that_times_out_is_decided_by_reading_the_state(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator()
    script = Script()
    url = await serve(sim, script=script)
    backend = make_backend(url, timeout_s=0.3)
    device = await first_free_device(backend)
    host = "node-us-east-rack-01-1"

    async def slow_after_acting(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        await asyncio.sleep(0.6)
        return response

    action = f"POST {SYSTEMS}/{host}/Actions/ComputerSystem.AddResourceBlock"
    script.add(action, slow_after_acting)
    operation = await backend.attach(device, host)
    assert operation.state is OperationState.COMPLETED
    assert script.calls[action] == 1  # not sent again: the re-read showed it had happened
    assert sim.history == [("attach", device.attach_unit, host)]


def drop(*, after_acting: bool) -> Override:
    """Close the connection without an answer, before or after the simulator acted."""

    async def respond(request: web.Request, handler: Handler) -> web.StreamResponse:
        if after_acting:
            await handler(request)
        assert request.transport is not None
        request.transport.close()
        return web.Response(status=500)  # discarded: the transport is gone

    return respond


@pytest.mark.parametrize("after_acting", [False, True], ids=["lost-request", "lost-answer"])
@pytest.mark.parametrize("offer_actions", [True, False], ids=["actions", "patch"])
async def test_a_dropped_write_is_decided_by_reading_the_state(
    serve: Serve, make_backend: Make, after_acting: bool, offer_actions: bool
) -> None:
    sim = simulator(offer_actions=offer_actions)
    script = Script()
    backend = make_backend(await serve(sim, script=script))
    device = await first_free_device(backend)
    host = "node-us-east-rack-01-1"
    write = (
        f"POST {SYSTEMS}/{host}/Actions/ComputerSystem.AddResourceBlock"
        if offer_actions
        else f"PATCH {SYSTEMS}/{host}"
    )
    script.add(write, drop(after_acting=after_acting))
    await backend.attach(device, host)
    assert sim.history == [("attach", device.attach_unit, host)]
    # Sent again only when the re-read showed that the first one had not happened.
    assert script.calls[write] == (1 if after_acting else 2)


async def test_writes_survive_random_drops_without_doing_anything_twice(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(
        spec=InventorySpec(
            regions=1, racks_per_region=1, devices_per_rack=4, hosts_per_rack=1, seed=3
        )
    )
    url = await serve(sim)
    backend = make_backend(
        url, retry=RetrySettings(attempts=10, initial_backoff_s=0.001, max_backoff_s=0.01)
    )
    devices = (await backend.list_devices()).items
    host = sim.system_ids()[0]
    sim.faults.drop_rate = 0.3
    for device in devices:
        await backend.attach(device, host)
        await backend.attach(device, host)
    for device in devices:
        await backend.detach(device, host)
    sim.faults.drop_rate = 0.0
    assert set(sim.attachments().values()) == {None}
    expected = [("attach", d.attach_unit, host) for d in devices] + [
        ("detach", d.attach_unit, host) for d in devices
    ]
    assert sim.history == expected


async def test_task_mode_attach_follows_the_monitor_to_completion(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(task_mode=True, task_polls=2)
    script = Script()
    backend = make_backend(await serve(sim, script=script))
    device = await first_free_device(backend)
    host = "node-us-east-rack-01-2"
    operation = await backend.attach(device, host)
    assert operation.state is OperationState.COMPLETED
    assert operation.op_id is not None and "/TaskService/" in operation.op_id
    assert sim.attachments()[device.attach_unit] == host
    assert script.calls[f"GET {operation.op_id}"] == 3
    status = await backend.operation_status(operation.op_id)
    assert status.state is OperationState.COMPLETED
    await backend.detach(device, host)
    assert sim.attachments()[device.attach_unit] is None


async def test_task_mode_attach_that_fails_in_the_task_raises_its_error(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(task_mode=True, task_polls=1)
    script = Script()
    url = await serve(sim, script=script)
    backend = make_backend(url)
    rival = make_backend(url)
    device = await first_free_device(backend)
    host, other = "node-us-east-rack-01-1", "node-us-east-rack-01-2"

    async def taken_meanwhile(request: web.Request, handler: Handler) -> web.StreamResponse:
        # Another client attaches the block to another System after our read, before our
        # task runs: the task fails with ResourceInUse.
        response = await handler(request)
        await rival.attach(device, other)
        return response

    script.add(f"POST {SYSTEMS}/{host}/Actions/ComputerSystem.AddResourceBlock", taken_meanwhile)
    with pytest.raises(FabricConflict, match="task failed"):
        await backend.attach(device, host)
    assert sim.attachments()[device.attach_unit] == other


async def test_a_task_that_outlives_the_timeout_gives_its_monitor(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(task_mode=True, task_polls=10_000)
    backend = make_backend(await serve(sim), task_timeout_s=0.2)
    device = await first_free_device(backend)
    with pytest.raises(FabricTaskTimeout) as caught:
        await backend.attach(device, "node-us-east-rack-01-1")
    assert isinstance(caught.value, FabricTimeout)
    assert "/TaskService/" in caught.value.op_id
    assert caught.value.op_id in str(caught.value)
    status = await backend.operation_status(caught.value.op_id)
    assert status.state is OperationState.RUNNING


MONITORS = "/redfish/v1/TaskService/TaskMonitors"


async def test_an_unreadable_task_monitor_hands_out_the_monitor(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(task_mode=True, task_polls=1)
    script = Script()
    backend = make_backend(await serve(sim, script=script))
    device = await first_free_device(backend)
    host = "node-us-east-rack-01-1"
    script.add(f"GET {MONITORS}/1", *[answer(503)] * FAST.attempts)
    with pytest.raises(FabricTaskTimeout) as caught:
        await backend.attach(device, host)
    assert caught.value.op_id == f"{MONITORS}/1"
    # The task is still there; asking again runs it to the end.
    assert (await backend.operation_status(caught.value.op_id)).state is OperationState.RUNNING
    assert (await backend.operation_status(caught.value.op_id)).state is (OperationState.COMPLETED)
    assert sim.attachments()[device.attach_unit] == host


async def test_a_vanished_task_monitor_is_decided_by_reading_the_state(
    serve: Serve, make_backend: Make
) -> None:
    sim = simulator(task_mode=True, task_polls=0)
    script = Script()
    backend = make_backend(await serve(sim, script=script))
    device = await first_free_device(backend)
    host = "node-us-east-rack-01-1"
    script.add(f"GET {MONITORS}/1", answer(404))
    operation = await backend.attach(device, host)
    assert operation.op_id == f"{MONITORS}/2"
    assert sim.history == [("attach", device.attach_unit, host)]


async def test_operation_status_of_an_unknown_or_foreign_op(
    serve: Serve, make_backend: Make
) -> None:
    backend = make_backend(await serve(simulator()))
    with pytest.raises(FabricNotFound):
        await backend.operation_status("/redfish/v1/TaskService/TaskMonitors/999")
    with pytest.raises(FabricInvalidData, match="outside"):
        await backend.operation_status("http://198.51.100.7/redfish/v1/TaskService/Tasks/1")


async def test_redirects_are_not_followed(serve: Serve, make_backend: Make) -> None:
    script = Script()
    script.add(f"GET {SYSTEMS}", answer(302, headers={"Location": "http://198.51.100.7/x"}))
    backend = make_backend(await serve(simulator(), script=script))
    with pytest.raises(FabricInvalidData, match="not followed"):
        await backend.list_hosts()


async def test_an_injected_session_is_left_open(serve: Serve, make_backend: Make) -> None:
    url = await serve(simulator())
    async with aiohttp.ClientSession() as http:
        backend = make_backend(url, session=http)
        assert len((await backend.list_hosts()).items) == 4
        await backend.close()
        assert not http.closed
        assert await sessions_on(url) == []


@pytest.mark.parametrize(
    ("url", "kwargs", "says"),
    [
        pytest.param("ftp://h", {}, "not an http", id="not-http"),
        pytest.param("https://u:p@h", {}, "credentials", id="credentials-in-url"),
        pytest.param("https://h/redfish", {}, "without a path", id="path"),
        pytest.param("https://h", {"username": None}, "username", id="no-username"),
        pytest.param("https://h", {"auth": "digest"}, "auth mode", id="unknown-auth"),
        pytest.param("https://h", {"max_concurrency": 0}, "positive", id="no-concurrency"),
        pytest.param(
            "https://h", {"retry": RetrySettings(attempts=0)}, "attempts", id="no-attempts"
        ),
    ],
)
def test_bad_settings_are_refused_at_construction(
    url: str, kwargs: dict[str, Any], says: str
) -> None:
    arguments: dict[str, Any] = {"username": "u", "password": "p", **kwargs}
    with pytest.raises(ValueError, match=says) as caught:
        RedfishBackend(url, **arguments)
    assert "u:p" not in str(caught.value)


async def test_a_fabric_that_refuses_connections_is_unavailable(make_backend: Make) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port now.
    backend = make_backend(f"http://127.0.0.1:{port}", auth="none")
    with pytest.raises(FabricUnavailable, match="cannot connect"):
        await backend.list_devices()
