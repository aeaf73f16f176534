"""Fault injection, the request log, authentication and restarts."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from fabric_dra_sim.kubeapi import KubeEmulator

Builders = dict[str, Callable[..., dict[str, Any]]]


def untyped(api: Any) -> Any:
    """The typed client APIs take plain dicts at run time; their stubs only allow models."""
    return api


async def test_429_carries_retry_after_in_header_and_status(
    emulator: KubeEmulator,
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    emulator.fail_next(1, method="POST", path_regex="/resourceslices$", status=429, retry_after=7)
    api: Any = client.ResourceV1Api(api_client)
    with pytest.raises(ApiException) as caught:
        await api.create_resource_slice(builders["slice"]("s1"))
    assert caught.value.status == 429
    assert caught.value.headers is not None
    assert caught.value.headers["Retry-After"] == "7"
    body = json.loads(caught.value.body or b"{}")
    assert (body["reason"], body["details"]["retryAfterSeconds"]) == ("TooManyRequests", 7)
    # Only one request failed.
    assert (await api.create_resource_slice(builders["slice"]("s1"))).metadata.name == "s1"


@pytest.mark.parametrize(
    ("status", "reason"), [(500, "InternalError"), (409, "Conflict"), (503, "ServiceUnavailable")]
)
async def test_injected_failures_are_real_status_bodies(
    emulator: KubeEmulator,
    api_client: client.ApiClient,
    status: int,
    reason: str,
) -> None:
    emulator.fail_next(2, method="GET", path_regex="resourceslices", status=status)
    api: Any = client.ResourceV1Api(api_client)
    for _ in range(2):
        with pytest.raises(ApiException) as caught:
            await api.list_resource_slice()
        body = json.loads(caught.value.body or b"{}")
        assert (caught.value.status, body["kind"], body["reason"], body["code"]) == (
            status,
            "Status",
            reason,
            status,
        )
    assert (await api.list_resource_slice()).items == []


async def test_faults_only_hit_matching_method_and_path(
    emulator: KubeEmulator,
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    emulator.fail_next(1, method="DELETE", path_regex="resourceslices")
    api: Any = client.ResourceV1Api(api_client)
    await api.create_resource_slice(builders["slice"]("s1"))
    await untyped(client.CoreV1Api(api_client)).list_node()
    with pytest.raises(ApiException):
        await api.delete_resource_slice("s1")
    await api.delete_resource_slice("s1")


async def test_latency_slows_every_request(
    emulator: KubeEmulator,
    api_client: client.ApiClient,
) -> None:
    emulator.latency_s = 0.2
    loop = asyncio.get_running_loop()
    started = loop.time()
    await untyped(client.ResourceV1Api(api_client)).list_resource_slice()
    assert loop.time() - started >= 0.2
    emulator.latency_s = 0.0


async def test_drop_fields_silently_removes_gated_fields(
    emulator: KubeEmulator,
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    emulator.drop_fields(
        "resourceslices",
        [
            "spec.devices[].bindingConditions",
            "spec.devices[].bindingFailureConditions",
            "spec.devices[].bindsToNode",
        ],
    )
    body = builders["slice"]("s1", devices=2)
    for device in body["spec"]["devices"]:
        device.update(
            {
                "bindsToNode": True,
                "bindingConditions": ["example.com/ready"],
                "bindingFailureConditions": ["example.com/failed"],
            }
        )
    created = await untyped(client.ResourceV1Api(api_client)).create_resource_slice(body)
    for device in created.spec.devices:
        assert device.binds_to_node is None
        assert device.binding_conditions is None
        assert device.binding_failure_conditions is None
    assert created.spec.devices[0].attributes["model"].string == "a100"


async def test_request_log_counts_writes(
    emulator: KubeEmulator,
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await api.create_resource_slice(builders["slice"]("s1"))
    await api.read_resource_slice("s1")
    await api.patch_resource_slice("s1", {"metadata": {"labels": {"a": "b"}}})
    writes = emulator.writes("/resourceslices")
    assert [(w.method, w.status) for w in writes] == [("POST", 201), ("PATCH", 200)]
    assert writes[1].content_type == "application/strategic-merge-patch+json"
    assert emulator.writes("/resourceclaims") == []
    assert any(
        r.method == "GET" and r.path.endswith("/resourceslices/s1") for r in emulator.requests
    )


async def test_bearer_token_is_required_when_configured() -> None:
    emu = KubeEmulator(token="s3cret")
    url = await emu.start()
    try:
        async with client.ApiClient(client.Configuration(host=url)) as anonymous:
            with pytest.raises(ApiException) as caught:
                await untyped(client.ResourceV1Api(anonymous)).list_resource_slice()
            assert caught.value.status == 401
        config = client.Configuration(
            host=url, api_key={"BearerToken": "s3cret"}, api_key_prefix={"BearerToken": "Bearer"}
        )
        async with client.ApiClient(config) as authorised:
            listed = await untyped(client.ResourceV1Api(authorised)).list_resource_slice()
            assert listed.items == []
    finally:
        await emu.stop()


async def test_restart_keeping_the_store_on_the_same_port(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    url = emulator.url
    emulator.create(builders["slice"]("s1"))
    await emulator.restart()
    assert emulator.url == url
    async with client.ApiClient(client.Configuration(host=url)) as api_client:
        listed = await untyped(client.ResourceV1Api(api_client)).list_resource_slice()
        assert [s.metadata.name for s in listed.items] == ["s1"]


async def test_restart_losing_the_store_makes_old_versions_expire(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    created = emulator.create(builders["slice"]("s1"))
    await emulator.restart(keep_store=False)
    async with client.ApiClient(client.Configuration(host=emulator.url)) as api_client:
        api: Any = client.ResourceV1Api(api_client)
        listed = await api.list_resource_slice()
        assert listed.items == []
        assert int(listed.metadata.resource_version) > int(created["metadata"]["resourceVersion"])
        assert (await untyped(client.CoreV1Api(api_client)).read_namespace("default")).metadata.name
        async with watch.Watch() as w:
            with pytest.raises(ApiException) as caught:
                async for _ in w.stream(
                    api.list_resource_slice,
                    timeout_seconds=2,
                    resource_version=created["metadata"]["resourceVersion"],
                ):
                    pass
        assert caught.value.status == 410


async def test_stop_ends_open_watches(emulator: KubeEmulator, api_client: client.ApiClient) -> None:
    api: Any = client.ResourceV1Api(api_client)

    async def consume() -> list[Any]:
        async with watch.Watch() as w:
            return [
                e
                async for e in w.stream(
                    api.list_resource_slice, resource_version="0", timeout_seconds=30
                )
            ]

    task = asyncio.create_task(consume())
    for _ in range(500):
        if emulator.open_watches:
            break
        await asyncio.sleep(0.01)
    await emulator.stop()
    assert await asyncio.wait_for(task, 5) == []


async def test_http_control_endpoints(emulator: KubeEmulator, builders: Builders) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{emulator.url}/_emulator/fail_next",
            json={"n": 1, "method": "GET", "path_regex": "nodes", "status": 500},
        ) as resp:
            assert resp.status == 200
        async with session.get(f"{emulator.url}/api/v1/nodes") as resp:
            assert resp.status == 500
        async with session.post(f"{emulator.url}/_emulator/compact") as resp:
            assert int((await resp.json())["resourceVersion"]) >= 1
        async with session.get(f"{emulator.url}/_emulator/requests") as resp:
            log = await resp.json()
        assert log[-1] == {
            "method": "GET",
            "path": "/api/v1/nodes",
            "status": 500,
            "content_type": "",
            "query": "",
        }


async def test_method_not_allowed_and_bad_json_get_status_bodies(
    emulator: KubeEmulator,
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.put(
            f"{emulator.url}/apis/resource.k8s.io/v1/resourceslices", json={}
        ) as resp:
            assert resp.status == 405
            assert (await resp.json())["reason"] == "MethodNotAllowed"
        async with session.post(
            f"{emulator.url}/apis/resource.k8s.io/v1/resourceslices",
            data=b"{not json",
            headers={"Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 400
            assert (await resp.json())["kind"] == "Status"
        async with session.get(f"{emulator.url}/apis/resource.k8s.io/v1/widgets") as resp:
            assert resp.status == 404
            assert (await resp.json())["reason"] == "NotFound"


async def test_a_held_answer_follows_its_watch_event_and_a_dropped_event_is_never_sent(
    emulator: KubeEmulator,
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    start = (await api.list_resource_slice()).metadata.resource_version
    events: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    async def consume() -> None:
        async with watch.Watch() as w:
            async for event in w.stream(
                api.list_resource_slice, resource_version=start, timeout_seconds=30
            ):
                await events.put((event["type"], event["object"].metadata.name))

    watching = asyncio.create_task(consume())
    try:
        hold = emulator.hold_response(method="POST", path_regex="/resourceslices$")
        creating = asyncio.create_task(api.create_resource_slice(builders["slice"]("s1")))
        await asyncio.wait_for(hold.reached.wait(), 10)
        assert await asyncio.wait_for(events.get(), 10) == ("ADDED", "s1")
        assert not creating.done()
        emulator.drop_events("resourceslices", "DELETED", name="s1")
        emulator.delete("resource.k8s.io/v1", "ResourceSlice", "s1")
        hold.release()
        assert (await asyncio.wait_for(creating, 10)).metadata.name == "s1"
        emulator.create(builders["slice"]("s2"))
        # The DELETED of s1 was kept from the watch: the next event is s2's.
        assert await asyncio.wait_for(events.get(), 10) == ("ADDED", "s2")
        with pytest.raises(ValueError, match="unknown event type"):
            emulator.drop_events("resourceslices", "GONE")
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
