"""The Redfish listing with ``$expand``: the backend reads the ResourceBlocks and Systems
collections expanded when the service offers it, and lists exactly what it lists without."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from app.fabric.redfish.backend import RedfishBackend
from app.fabric.types import FabricDevice, FabricHost
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

BLOCKS = "/redfish/v1/CompositionService/ResourceBlocks"
SPEC = InventorySpec(
    regions=2, racks_per_region=2, devices_per_rack=8, hosts_per_rack=2, device_mix="mixed"
)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Serve = Callable[[RedfishSimulator, Counter[str]], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serve a simulator on 127.0.0.1, counting the GET requests by path."""
    runners: list[web.AppRunner] = []

    async def _serve(sim: RedfishSimulator, calls: Counter[str]) -> str:
        @web.middleware
        async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.method == "GET":
                calls[request.path] += 1
            return await handler(request)

        app = sim.make_app()
        app.middlewares.append(count)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield _serve
    for runner in runners:
        await runner.cleanup()


async def listing(
    serve: Serve, *, expand: bool, page_size: int | None = None
) -> tuple[list[FabricDevice], list[FabricHost], Counter[str]]:
    sim = RedfishSimulator(spec=SPEC, auth="none", expand=expand, page_size=page_size)
    # One device attached, so that holders are part of what must match.
    block = sim.block_uris()[3]
    system = sim.system_ids()[1]
    sim.state.apply_add(f"/redfish/v1/Systems/{system}", block)
    calls: Counter[str] = Counter()
    backend = RedfishBackend(await serve(sim, calls), auth="none")
    try:
        devices = await backend.list_devices()
        hosts = await backend.list_hosts()
    finally:
        await backend.close()
    assert not devices.rejected and not hosts.rejected
    return (
        sorted(devices.items, key=lambda d: d.vendor_id),
        sorted(hosts.items, key=lambda h: h.host_id),
        calls,
    )


@pytest.mark.parametrize("page_size", [None, 5], ids=["one-page", "paged"])
async def test_an_expanded_listing_equals_the_plain_one_in_far_fewer_requests(
    serve: Serve, page_size: int | None
) -> None:
    plain_devices, plain_hosts, plain_calls = await listing(serve, expand=False)
    devices, hosts, calls = await listing(serve, expand=True, page_size=page_size)
    assert devices == plain_devices and hosts == plain_hosts
    assert len(devices) == 32 and any(d.host_id for d in devices)
    # No block, device or storage resource is read on its own: the collection brought them.
    assert not [path for path in calls if path.startswith(f"{BLOCKS}/")]
    assert sum(calls.values()) < sum(plain_calls.values()) / 3


async def test_expand_is_refused_where_it_is_not_offered_and_beyond_the_levels_offered(
    serve: Serve,
) -> None:
    plain = await serve(RedfishSimulator(spec=SPEC, auth="none"), Counter())
    offered = await serve(RedfishSimulator(spec=SPEC, auth="none", expand=True), Counter())
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{plain}{BLOCKS}", params={"$expand": "."}) as response:
            assert response.status == 501
        async with http.get(f"{offered}{BLOCKS}", params={"$expand": ".($levels=4)"}) as response:
            assert response.status == 400
        async with http.get(f"{offered}/redfish/v1") as response:
            features = (await response.json())["ProtocolFeaturesSupported"]["ExpandQuery"]
            assert features["NoLinks"] is True and features["MaxLevels"] == 3
        async with http.get(f"{offered}{BLOCKS}", params={"$expand": "."}) as response:
            body = await response.json()
            member = body["Members"][0]
            assert member["Id"] and member["@odata.id"].startswith(f"{BLOCKS}/")
            # One level: the block's own references stay links.
            device = next(
                v[0]
                for k, v in member.items()
                if k in ("Processors", "Drives", "Memory", "Storage")
            )
            assert set(device) == {"@odata.id"}


async def test_a_service_that_advertises_expand_but_refuses_it_is_read_without(
    serve: Serve,
) -> None:
    sim = RedfishSimulator(spec=SPEC, auth="none")
    sim.tree["/redfish/v1"]["ProtocolFeaturesSupported"]["ExpandQuery"] = {
        "NoLinks": True,
        "Levels": True,
        "MaxLevels": 3,
    }
    calls: Counter[str] = Counter()
    backend = RedfishBackend(await serve(sim, calls), auth="none")
    try:
        devices = await backend.list_devices()
        again = await backend.list_devices()
    finally:
        await backend.close()
    assert len(devices.items) == len(again.items) == 32 and not devices.rejected
    # Refused on the first collection read (Systems), then never asked for again: the blocks
    # collection is read once per listing.
    assert calls[BLOCKS] == 2
