"""Lists with selectors and pages, and watches: resume, bookmarks, timeouts, 410, cut streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from fabric_dra_sim.kubeapi import KubeEmulator

Builders = dict[str, Callable[..., dict[str, Any]]]


async def _make_slices(api: Any, builders: Builders) -> None:
    specs: list[tuple[str, dict[str, str], dict[str, Any]]] = [
        ("a", {"tier": "gold", "rack": "r1"}, {"allNodes": True}),
        ("b", {"tier": "silver", "rack": "r1"}, {"nodeName": "node-1"}),
        ("c", {"tier": "bronze"}, {"nodeName": "node-2", "driver": "other.example.com"}),
    ]
    for name, labels, spec in specs:
        body = builders["slice"](name, **spec)
        body["metadata"]["labels"] = labels
        await api.create_resource_slice(body)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=gold", ["a"]),
        ("tier==gold", ["a"]),
        ("tier!=gold", ["b", "c"]),
        ("tier in (gold,silver)", ["a", "b"]),
        ("tier notin (gold, silver)", ["c"]),
        ("rack", ["a", "b"]),
        ("!rack", ["c"]),
        ("rack=r1,tier!=gold", ["b"]),
        ("", ["a", "b", "c"]),
    ],
)
async def test_label_selectors(
    api_client: client.ApiClient, builders: Builders, selector: str, expected: list[str]
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await _make_slices(api, builders)
    listed = await api.list_resource_slice(label_selector=selector)
    assert [s.metadata.name for s in listed.items] == expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("metadata.name=b", ["b"]),
        ("metadata.name!=b", ["a", "c"]),
        ("spec.driver=fabric.example.com", ["a", "b"]),
        ("spec.nodeName=node-1", ["b"]),
        ("spec.nodeName=", ["a"]),
        ("spec.driver=fabric.example.com,spec.nodeName!=node-1", ["a"]),
    ],
)
async def test_field_selectors_on_resource_slices(
    api_client: client.ApiClient,
    builders: Builders,
    selector: str,
    expected: list[str],
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await _make_slices(api, builders)
    listed = await api.list_resource_slice(field_selector=selector)
    assert [s.metadata.name for s in listed.items] == expected


async def test_unsupported_field_selector_or_bad_label_selector_is_400(
    api_client: client.ApiClient,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    with pytest.raises(ApiException) as caught:
        await api.list_resource_slice(field_selector="spec.pool.name=x")
    assert caught.value.status == 400
    assert "field label not supported" in json.loads(caught.value.body or b"{}")["message"]
    with pytest.raises(ApiException) as caught:
        await api.list_resource_slice(label_selector="a in (b")
    assert caught.value.status == 400


async def test_pod_field_selector_on_node_name(api_client: client.ApiClient) -> None:
    core: Any = client.CoreV1Api(api_client)
    for name, node in (("p1", "node-1"), ("p2", "node-2")):
        await core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": name},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
            },
        )
    pods = await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-2")
    assert [p.metadata.name for p in pods.items] == ["p2"]


async def test_limit_and_continue_page_through_everything(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    for i in range(5):
        await api.create_resource_slice(builders["slice"](f"s{i}"))
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        page = await api.list_resource_slice(limit=2, _continue=token)
        pages += 1
        seen.extend(s.metadata.name for s in page.items)
        token = page.metadata._continue
        if not token:
            break
        assert page.metadata.remaining_item_count == 5 - len(seen)
    assert seen == [f"s{i}" for i in range(5)]
    assert pages == 3


async def test_continue_token_older_than_history_is_410(
    emulator: KubeEmulator,
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    for i in range(3):
        await api.create_resource_slice(builders["slice"](f"s{i}"))
    page = await api.list_resource_slice(limit=1)
    await api.create_resource_slice(builders["slice"]("later"))
    emulator.compact()
    with pytest.raises(ApiException) as caught:
        await api.list_resource_slice(limit=1, _continue=page.metadata._continue)
    assert caught.value.status == 410
    assert json.loads(caught.value.body or b"{}")["reason"] == "Expired"


async def _collect(stream: Any, count: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async for event in stream:
        events.append(event)
        if len(events) == count:
            break
    return events


async def test_watch_from_a_version_sees_added_modified_deleted_in_order(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    start = (await api.list_resource_slice()).metadata.resource_version
    created = await api.create_resource_slice(builders["slice"]("s1"))
    created.spec.pool.generation = 1
    await api.replace_resource_slice("s1", created)
    await api.delete_resource_slice("s1")
    async with watch.Watch() as w:
        events = await _collect(
            w.stream(api.list_resource_slice, resource_version=start, timeout_seconds=5), 3
        )
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    versions = [int(e["object"].metadata.resource_version) for e in events]
    assert versions == sorted(versions)
    assert events[1]["object"].spec.pool.generation == 1


async def test_list_then_watch_from_zero_gets_current_state_then_live_events(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await api.create_resource_slice(builders["slice"]("existing"))
    async with watch.Watch() as w:
        stream = w.stream(api.list_resource_slice, resource_version="0", timeout_seconds=5)
        first = await stream.__anext__()
        assert (first["type"], first["object"].metadata.name) == ("ADDED", "existing")
        await api.create_resource_slice(builders["slice"]("new"))
        second = await stream.__anext__()
        assert (second["type"], second["object"].metadata.name) == ("ADDED", "new")


async def test_watch_with_selector_reports_objects_leaving_as_deleted(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    body = builders["slice"]("s1")
    body["metadata"]["labels"] = {"managed": "yes"}
    created = await api.create_resource_slice(body)
    start = created.metadata.resource_version
    await api.patch_resource_slice("s1", {"metadata": {"labels": {"managed": "no"}}})
    async with watch.Watch() as w:
        events = await _collect(
            w.stream(
                api.list_resource_slice,
                resource_version=start,
                label_selector="managed=yes",
                timeout_seconds=5,
            ),
            1,
        )
    assert events[0]["type"] == "DELETED"


async def test_bookmarks_arrive_periodically_and_at_timeout(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    created = await api.create_resource_slice(builders["slice"]("s1"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with watch.Watch() as w:
        events = [
            e
            async for e in w.stream(
                api.list_resource_slice,
                resource_version=created.metadata.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=1,
            )
        ]
    elapsed = loop.time() - started
    assert 0.9 <= elapsed < 3
    assert events
    assert all(e["type"] == "BOOKMARK" for e in events)
    # interval 0.2 s over 1 s, plus the one at the timeout
    assert len(events) >= 4
    assert (
        events[-1]["raw_object"]["metadata"]["resourceVersion"] == created.metadata.resource_version
    )
    assert w.resource_version == created.metadata.resource_version


async def test_timeout_seconds_ends_the_stream_without_bookmarks(
    api_client: client.ApiClient,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    async with watch.Watch() as w:
        events = [
            e
            async for e in w.stream(
                api.list_resource_slice, resource_version="0", timeout_seconds=1
            )
        ]
    assert events == []


async def test_watch_from_a_compacted_version_is_410_expired(
    emulator: KubeEmulator,
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    first = await api.create_resource_slice(builders["slice"]("s1"))
    await api.create_resource_slice(builders["slice"]("s2"))
    emulator.compact()
    async with watch.Watch() as w:
        with pytest.raises(ApiException) as caught:
            await _collect(
                w.stream(
                    api.list_resource_slice,
                    resource_version=first.metadata.resource_version,
                    timeout_seconds=2,
                ),
                1,
            )
    assert caught.value.status == 410
    assert "Expired" in str(caught.value.reason)


async def test_small_history_expires_old_versions() -> None:
    emu = KubeEmulator(history_size=2)
    url = await emu.start()
    try:
        async with client.ApiClient(client.Configuration(host=url)) as api_client:
            core: Any = client.CoreV1Api(api_client)
            start = (await core.list_node()).metadata.resource_version
            for i in range(4):
                await core.create_node({"metadata": {"name": f"n{i}"}})
            async with (
                aiohttp.ClientSession() as session,
                session.get(
                    f"{url}/api/v1/nodes",
                    params={"watch": "1", "resourceVersion": start},
                ) as resp,
            ):
                line = json.loads(await resp.content.readline())
            assert line["type"] == "ERROR"
            assert line["object"]["code"] == 410
            assert line["object"]["reason"] == "Expired"
    finally:
        await emu.stop()


async def test_close_watches_cuts_open_streams(
    emulator: KubeEmulator,
    api_client: client.ApiClient,
) -> None:
    api: Any = client.ResourceV1Api(api_client)

    async def consume() -> None:
        async with watch.Watch() as w:
            async for _ in w.stream(
                api.list_resource_slice, resource_version="0", timeout_seconds=30
            ):
                pass

    task = asyncio.create_task(consume())
    for _ in range(500):
        if emulator.open_watches:
            break
        await asyncio.sleep(0.01)
    assert emulator.open_watches == 1
    await emulator.close_watches()
    with pytest.raises(aiohttp.ClientPayloadError):
        await asyncio.wait_for(task, 5)


async def test_send_initial_events_ends_with_the_initial_events_end_bookmark(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    emulator.create(builders["slice"]("s1"))
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{emulator.url}/apis/resource.k8s.io/v1/resourceslices",
            params={
                "watch": "true",
                "sendInitialEvents": "true",
                "allowWatchBookmarks": "true",
                "resourceVersionMatch": "NotOlderThan",
                "timeoutSeconds": "1",
            },
        ) as resp,
    ):
        lines = [json.loads(line) async for line in resp.content if line.strip()]
    assert lines[0]["type"] == "ADDED"
    assert lines[1]["type"] == "BOOKMARK"
    assert lines[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
