"""The Redfish listing with ``$expand``: the backend reads the ResourceBlocks and Systems
collections expanded when the service offers it, and lists exactly what it lists without."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from app.fabric.errors import FabricUnavailable
from app.fabric.redfish import reader as reader_module
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


async def _serve_with(
    sim: RedfishSimulator, queries: list[str], change: Callable[[web.Request], web.Request | None]
) -> tuple[str, web.AppRunner]:
    """Serve ``sim``, recording each GET of the blocks collection as path?query; ``change``
    may rewrite a request (a service that drops a parameter) or answer it with 400 (None)."""

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "GET" and request.path == BLOCKS:
            queries.append(request.query_string)
            changed = change(request)
            if changed is None:
                return web.json_response(
                    {"error": {"code": "Base.1.8.QueryNotSupported"}}, status=400
                )
            request = changed
        return await handler(request)

    app = sim.make_app()
    app.middlewares.append(record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}", runner


def _without_skip(request: web.Request) -> web.Request:
    query = {k: v for k, v in request.query.items() if k != "$skip"}
    return request.clone(rel_url=request.rel_url.with_query(query))


def _refusing_top(request: web.Request) -> web.Request | None:
    return None if "$top" in request.query else request


def _as_is(request: web.Request) -> web.Request:
    return request


@pytest.mark.parametrize(
    ("change", "top_pages", "page_size"),
    [
        pytest.param(_as_is, True, None, id="honoured-one-body"),
        pytest.param(_as_is, True, 3, id="honoured-paged-by-3"),
        # A service that ignores $skip cannot page by $skip itself: one body.
        pytest.param(_without_skip, False, None, id="skip-ignored"),
        pytest.param(_refusing_top, False, None, id="top-refused-one-body"),
        pytest.param(_refusing_top, False, 3, id="top-refused-paged-by-3"),
    ],
)
async def test_a_collection_is_read_top_members_at_a_time_when_offered(
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[web.Request], web.Request | None],
    top_pages: bool,
    page_size: int | None,
) -> None:
    # A service that offers $top/$skip is asked for TOP_PAGE members at a time, each window
    # after the first starting at the last member read, with the service's own nextLink
    # pages followed inside a window. One that ignores $skip or refuses $top is read whole,
    # from then on without $top. Every way lists exactly what a plain listing lists.
    monkeypatch.setattr(reader_module, "TOP_PAGE", 5)
    sim = RedfishSimulator(spec=SPEC, auth="none", expand=True, page_size=page_size)
    plain = RedfishSimulator(spec=SPEC, auth="none", expand=False)
    queries: list[str] = []
    url, runner = await _serve_with(sim, queries, change)
    plain_url, plain_runner = await _serve_with(plain, [], _as_is)
    backend = RedfishBackend(url, auth="none")
    reference = RedfishBackend(plain_url, auth="none")
    try:
        devices = await backend.list_devices()
        first = list(queries)
        again = await backend.list_devices()
        want = await reference.list_devices()
    finally:
        await backend.close()
        await reference.close()
        await runner.cleanup()
        await plain_runner.cleanup()
    assert len(sim.block_uris()) == 32
    key = sorted(d.vendor_id for d in want.items)
    assert len(key) == 32
    assert sorted(d.vendor_id for d in devices.items) == key and not devices.rejected
    assert sorted(d.vendor_id for d in again.items) == key
    if top_pages:
        assert all("$top" in q for q in queries), queries
        if page_size is None:
            # 32 blocks, windows of 5 overlapping by one: 0-4, 4-8, ..., 24-28, 28-31.
            skips = [dict(part.split("=", 1) for part in q.split("&")).get("$skip") for q in first]
            assert skips == [None, "4", "8", "12", "16", "20", "24", "28"], first
    else:
        # The first try with $top, one more look (or a refusal), then the whole collection;
        # the next listing asks without $top at once.
        assert "$top" in first[0] and "$top" not in first[-1]
        assert all("$top" not in q for q in queries[len(first) :])


async def test_a_collection_that_changes_between_windows_fails_the_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A block removed while the second window is asked for shifts every later member by
    # one: without the overlap check one block would be missing from a listing that looks
    # whole, and the inventory would take it for gone.
    monkeypatch.setattr(reader_module, "TOP_PAGE", 5)
    sim = RedfishSimulator(spec=SPEC, auth="none", expand=True)
    queries: list[str] = []

    removed: list[object] = []

    def remove_first_block(request: web.Request) -> web.Request:
        if "$skip=4" in request.query_string and not removed:
            removed.append(sim.tree[BLOCKS]["Members"].pop(0))
        return request

    url, runner = await _serve_with(sim, queries, remove_first_block)
    backend = RedfishBackend(url, auth="none")
    try:
        with pytest.raises(FabricUnavailable, match="changed while it was read"):
            await backend.list_devices()
        # Read again later, the listing is whole (31 blocks now).
        again = await backend.list_devices()
    finally:
        await backend.close()
        await runner.cleanup()
    assert len(again.items) == 31 and not again.rejected
