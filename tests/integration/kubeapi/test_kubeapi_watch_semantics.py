"""List and watch semantics over HTTP: paged lists as one snapshot, invalid option
combinations, versions not reached yet, restarts, ERROR 410 inside live watches, and the watch
faults (delayed responses, replayed events, expired watches) with the request log's query."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.listing import INCONSISTENT_CONTINUE, LIST_TOO_OLD

Builders = dict[str, Callable[..., dict[str, Any]]]
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as http:
        yield http


async def _get(
    session: aiohttp.ClientSession, url: str, **params: str
) -> tuple[int, dict[str, Any], Any]:
    async with session.get(url, params=params) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def _lines(
    resp: aiohttp.ClientResponse, count: int, timeout_s: float = 5.0
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout_s):
        while len(out) < count:
            raw = await resp.content.readline()
            if not raw:
                break
            if raw.strip():
                out.append(json.loads(raw))
    return out


async def _watching(emu: KubeEmulator, count: int) -> None:
    """Return once ``count`` watches are open (the server registered them)."""
    async with asyncio.timeout(5):
        while True:
            if emu.open_watches >= count:
                return
            await asyncio.sleep(0.01)


def _names(body: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in body["items"]]


def _nodes(emu: KubeEmulator, *names: str) -> list[dict[str, Any]]:
    return [
        emu.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}) for n in names
    ]


# -- 1. paged lists are one snapshot -------------------------------------------------------
async def test_the_pages_of_a_list_show_the_first_pages_snapshot(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
    builders: Builders,
) -> None:
    for i in range(5):
        emulator.create(builders["slice"](f"s{i}"))
    url = emulator.url + SLICES
    _, _, first = await _get(session, url, limit="2")
    list_rv = first["metadata"]["resourceVersion"]
    assert _names(first) == ["s0", "s1"]
    before = {
        s["metadata"]["name"]: s for s in emulator.list("resource.k8s.io/v1", "ResourceSlice")
    }
    # Changes after the first page: one modified, one deleted, one created in the range.
    changed = emulator.get("resource.k8s.io/v1", "ResourceSlice", "s3")
    assert changed is not None
    changed["metadata"]["labels"] = {"changed": "yes"}
    emulator.update(changed)
    emulator.delete("resource.k8s.io/v1", "ResourceSlice", "s4")
    emulator.create(builders["slice"]("s2a"))
    _, _, second = await _get(
        session, url, limit="2", **{"continue": first["metadata"]["continue"]}
    )
    _, _, third = await _get(
        session, url, limit="2", **{"continue": second["metadata"]["continue"]}
    )
    assert _names(second) + _names(third) == ["s2", "s3", "s4"]
    assert second["items"][1] == before["s3"]  # as it was, not as it is
    assert second["metadata"]["resourceVersion"] == third["metadata"]["resourceVersion"] == list_rv
    assert "continue" not in third["metadata"]
    # A new list sees the present.
    _, _, fresh = await _get(session, url)
    assert _names(fresh) == ["s0", "s1", "s2", "s2a", "s3"]


async def test_an_exact_list_shows_an_old_version_and_410_once_it_is_compacted(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    first, _ = _nodes(emulator, "n1", "n2")
    at = first["metadata"]["resourceVersion"]
    emulator.delete("v1", "Node", "n1")
    url = emulator.url + "/api/v1/nodes"
    status, _, body = await _get(session, url, resourceVersion=at, resourceVersionMatch="Exact")
    assert (status, _names(body), body["metadata"]["resourceVersion"]) == (200, ["n1"], at)
    # The legacy form (a version and a limit, no match) reads at that version too.
    _, _, legacy = await _get(session, url, resourceVersion=at, limit="10")
    assert _names(legacy) == ["n1"]
    # NotOlderThan lists the present.
    _, _, latest = await _get(session, url, resourceVersion=at, resourceVersionMatch="NotOlderThan")
    assert _names(latest) == ["n2"]
    emulator.compact()
    status, _, body = await _get(session, url, resourceVersion=at, resourceVersionMatch="Exact")
    assert (status, body["reason"], body["message"]) == (410, "Expired", LIST_TOO_OLD)


async def test_a_compacted_continue_token_is_410_with_a_token_to_go_on_at_the_latest(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    _nodes(emulator, "a", "b", "c")
    url = emulator.url + "/api/v1/nodes"
    _, _, first = await _get(session, url, limit="1")
    emulator.delete("v1", "Node", "c")
    emulator.compact()
    status, _, body = await _get(
        session, url, limit="1", **{"continue": first["metadata"]["continue"]}
    )
    assert (status, body["reason"], body["message"]) == (410, "Expired", INCONSISTENT_CONTINUE)
    status, _, rest = await _get(session, url, **{"continue": body["metadata"]["continue"]})
    assert (status, _names(rest)) == (200, ["b"])


# -- 2. invalid list option combinations --------------------------------------------------
@pytest.mark.parametrize(
    ("params", "code", "message"),
    [
        (
            {"resourceVersionMatch": "NotOlderThan"},
            422,
            'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        (
            {"sendInitialEvents": "true"},
            422,
            'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: '
            "sendInitialEvents is forbidden for list",
        ),
        (
            {"resourceVersion": "0", "resourceVersionMatch": "Exact"},
            422,
            'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
            'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
        ),
        (
            {"resourceVersion": "1", "resourceVersionMatch": "Newest"},
            422,
            'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Unsupported value: '
            '"Newest": supported values: "Exact", "NotOlderThan", ""',
        ),
        (
            {"watch": "true", "sendInitialEvents": "true"},
            422,
            'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ),
        (
            {"watch": "true", "resourceVersion": "1", "resourceVersionMatch": "NotOlderThan"},
            422,
            'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ),
        (
            {"resourceVersion": "x"},
            400,
            'invalid resource version: resourceVersion: Invalid value: "x": strconv.ParseUint: '
            'parsing "x": invalid syntax',
        ),
    ],
)
async def test_invalid_list_options_get_kube_apiservers_status(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
    params: dict[str, str],
    code: int,
    message: str,
) -> None:
    status, _, body = await _get(session, emulator.url + SLICES, **params)
    assert (status, body["code"], body["message"]) == (code, code, message)


async def test_continue_with_a_resource_version_is_400_and_with_a_match_422(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    _nodes(emulator, "a", "b")
    url = emulator.url + "/api/v1/nodes"
    _, _, first = await _get(session, url, limit="1")
    token = first["metadata"]["continue"]
    status, _, body = await _get(session, url, resourceVersion="3", **{"continue": token})
    assert (status, body["message"]) == (
        400,
        "specifying resource version is not allowed when using continue",
    )
    status, _, body = await _get(
        session, url, resourceVersion="3", resourceVersionMatch="Exact", **{"continue": token}
    )
    assert status == 422
    assert "resourceVersionMatch is forbidden when continue is provided" in body["message"]
    status, _, body = await _get(session, url, resourceVersion="0", **{"continue": token})
    assert (status, _names(body)) == (200, ["b"])


# -- 3. versions not reached yet ----------------------------------------------------------
async def test_a_list_at_a_future_version_is_504_after_the_wait(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    assert emulator.fresh_wait_s == 3.0  # kube-apiserver's blockTimeout
    emulator.fresh_wait_s = 0.2
    future = str(emulator.resource_version + 50)
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, headers, body = await _get(
        session, emulator.url + SLICES, resourceVersion=future, resourceVersionMatch="NotOlderThan"
    )
    assert loop.time() - started >= 0.2
    assert (status, body["reason"]) == (504, "Timeout")
    assert body["message"].startswith(f"Timeout: Too large resource version: {future}, current: ")
    assert body["details"]["causes"] == [
        {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
    ]
    assert body["details"]["retryAfterSeconds"] == 1
    assert headers["Retry-After"] == "1"


async def test_a_list_waits_for_a_version_reached_during_the_wait(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    emulator.fresh_wait_s = 2.0
    target = emulator.resource_version + 1
    request = asyncio.create_task(
        _get(session, emulator.url + "/api/v1/nodes", resourceVersion=str(target))
    )
    await asyncio.sleep(0.1)
    assert not request.done()
    _nodes(emulator, "late")
    status, _, body = await request
    assert (status, _names(body)) == (200, ["late"])


async def test_a_watch_for_initial_events_at_a_future_version_gets_an_error_504_event(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    emulator.fresh_wait_s = 0.1
    future = str(emulator.resource_version + 50)
    async with session.get(
        emulator.url + SLICES,
        params={
            "watch": "true",
            "sendInitialEvents": "true",
            "resourceVersion": future,
            "resourceVersionMatch": "NotOlderThan",
        },
    ) as resp:
        assert resp.status == 200
        lines = await _lines(resp, 2)
    assert [line["type"] for line in lines] == ["ERROR"]
    assert lines[0]["object"]["code"] == 504


async def test_a_plain_watch_from_a_future_version_starts_there(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    start = emulator.resource_version
    async with session.get(
        emulator.url + "/api/v1/nodes", params={"watch": "true", "resourceVersion": str(start + 2)}
    ) as resp:
        assert resp.status == 200
        _nodes(emulator, "n1", "n2", "n3")
        lines = await _lines(resp, 1)
    # Events up to the requested version are skipped (the cache watcher's version filter).
    assert [(line["type"], line["object"]["metadata"]["name"]) for line in lines] == [
        ("ADDED", "n3")
    ]


async def test_a_legacy_watch_from_zero_gets_the_initial_events_end_bookmark(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    # Kubernetes 1.34 has WatchList on: SetListOptionsDefaults turns a watch from "0" into
    # sendInitialEvents=true.
    _nodes(emulator, "n1")
    async with session.get(
        emulator.url + "/api/v1/nodes",
        params={"watch": "true", "resourceVersion": "0", "allowWatchBookmarks": "true"},
    ) as resp:
        lines = await _lines(resp, 2)
    assert lines[0]["type"] == "ADDED"
    assert lines[1]["type"] == "BOOKMARK"
    assert lines[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


# -- 4. restarts --------------------------------------------------------------------------
async def test_after_a_restart_old_versions_are_410_on_watch_but_pages_go_on(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    first, _ = _nodes(emulator, "a", "b")
    url = emulator.url + "/api/v1/nodes"
    _, _, page = await _get(session, url, limit="1")
    await emulator.restart()
    async with session.get(
        url, params={"watch": "true", "resourceVersion": first["metadata"]["resourceVersion"]}
    ) as resp:
        lines = await _lines(resp, 1)
    assert lines[0]["type"] == "ERROR"
    assert (lines[0]["object"]["code"], lines[0]["object"]["reason"]) == (410, "Expired")
    assert lines[0]["object"]["message"].startswith(
        f"too old resource version: {first['metadata']['resourceVersion']} ("
    )
    # From the current version the watch works.
    current = str(emulator.resource_version)
    async with session.get(url, params={"watch": "true", "resourceVersion": current}) as resp:
        _nodes(emulator, "c")
        lines = await _lines(resp, 1)
    assert lines[0]["type"] == "ADDED"
    # The continue token is etcd's: it outlives the API server.
    status, _, rest = await _get(session, url, **{"continue": page["metadata"]["continue"]})
    assert (status, _names(rest)) == (200, ["b"])


# -- 5. ERROR 410 inside live watches -----------------------------------------------------
async def test_a_watcher_a_whole_window_behind_gets_error_410(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    emulator.set_history_size("nodes", 3)
    start = str(emulator.resource_version)
    async with session.get(
        emulator.url + "/api/v1/nodes", params={"watch": "true", "resourceVersion": start}
    ) as resp:
        await _watching(emulator, 1)
        # Written without a pause, the watch cannot drain: it falls a window behind.
        _nodes(emulator, *(f"n{i}" for i in range(6)))
        lines = await _lines(resp, 10)
    assert [line["type"] for line in lines] == ["ADDED"] * 3 + ["ERROR"]
    assert lines[-1]["object"]["code"] == 410
    # Other resources keep the default window.
    assert emulator.open_watches == 0


async def test_expire_watches_sends_error_410_into_live_watches(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    start = str(emulator.resource_version)
    async with (
        session.get(
            emulator.url + "/api/v1/nodes", params={"watch": "true", "resourceVersion": start}
        ) as nodes,
        session.get(
            emulator.url + SLICES, params={"watch": "true", "resourceVersion": start}
        ) as slices,
    ):
        await _watching(emulator, 2)
        assert emulator.expire_watches("nodes") == 1
        lines = await _lines(nodes, 2)
        assert [line["type"] for line in lines] == ["ERROR"]
        assert (
            lines[0]["object"]["message"]
            == "The resourceVersion for the provided watch is too old."
        )
        assert emulator.open_watches == 1
        async with session.post(emulator.url + "/_emulator/expire_watches", json={}) as resp:
            assert (await resp.json()) == {"expired": 1}
        assert [line["type"] for line in await _lines(slices, 2)] == ["ERROR"]


# -- 6. faults: replayed events, delayed responses, the request log -----------------------
async def test_replay_event_sends_an_old_event_into_live_watches(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    (created,) = _nodes(emulator, "n1")
    node = dict(created)
    node["metadata"] = {**created["metadata"], "labels": {"v": "2"}}
    updated = emulator.update(node)
    current = updated["metadata"]["resourceVersion"]
    async with session.get(
        emulator.url + "/api/v1/nodes", params={"watch": "true", "resourceVersion": current}
    ) as resp:
        await _watching(emulator, 1)
        replayed = emulator.replay_event("nodes", "n1")
        lines = await _lines(resp, 1)
    assert replayed == created["metadata"]["resourceVersion"]
    assert lines[0]["type"] == "ADDED"
    assert lines[0]["object"]["metadata"]["resourceVersion"] == replayed
    with pytest.raises(LookupError):
        emulator.replay_event("nodes", "n1", resource_version="999999")
    with pytest.raises(ValueError, match="unknown resource"):
        emulator.replay_event("widgets", "n1")


async def test_a_delayed_response_arrives_after_its_watch_event(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    _nodes(emulator, "n1")
    emulator.delay_responses(0.3, method="PATCH", path_regex="/nodes/n1$", n=1)
    start = str(emulator.resource_version)
    async with session.get(
        emulator.url + "/api/v1/nodes", params={"watch": "true", "resourceVersion": start}
    ) as resp:
        await _watching(emulator, 1)
        patch = asyncio.create_task(
            session.patch(
                emulator.url + "/api/v1/nodes/n1",
                data=json.dumps({"metadata": {"labels": {"a": "b"}}}),
                headers={"Content-Type": "application/merge-patch+json"},
            )
        )
        lines = await _lines(resp, 1)
        assert lines[0]["type"] == "MODIFIED"
        assert not patch.done()
        async with await patch as answer:
            assert answer.status == 200
            assert (await answer.json())["metadata"]["resourceVersion"] == lines[0]["object"][
                "metadata"
            ]["resourceVersion"]
    # The rule was used up: the next write answers at once.
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with session.patch(
        emulator.url + "/api/v1/nodes/n1",
        data=b"{}",
        headers={"Content-Type": "application/merge-patch+json"},
    ) as answer:
        assert answer.status == 200
    assert loop.time() - started < 0.25


async def test_the_request_log_keeps_the_query_string(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    await _get(session, emulator.url + "/api/v1/nodes", labelSelector="a=b", limit="5")
    record = emulator.requests[-1]
    assert record.path == "/api/v1/nodes"
    assert record.query == "labelSelector=a%3Db&limit=5"
    assert record.url == "/api/v1/nodes?labelSelector=a%3Db&limit=5"


async def test_watch_fault_control_routes(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    (created,) = _nodes(emulator, "n1")
    emulator.update({**created, "metadata": {**created["metadata"], "labels": {"x": "y"}}})
    base = emulator.url + "/_emulator/"
    async with session.post(
        base + "delay_responses",
        json={"seconds": 0.1, "method": "GET", "path_regex": "/nodes$", "n": 1},
    ) as resp:
        assert resp.status == 200
    loop = asyncio.get_running_loop()
    started = loop.time()
    await _get(session, emulator.url + "/api/v1/nodes")
    assert loop.time() - started >= 0.1
    async with session.post(
        base + "replay_event", json={"resource": "nodes", "name": "n1"}
    ) as resp:
        assert (await resp.json()) == {"resourceVersion": created["metadata"]["resourceVersion"]}
    for route, body in (
        ("replay_event", {"resource": "nodes"}),
        ("replay_event", {"resource": "nodes", "name": "missing"}),
        ("expire_watches", {"resource": "widgets"}),
        ("delay_responses", {"seconds": -1}),
    ):
        async with session.post(base + route, json=body) as resp:
            assert resp.status == 400, route
            assert (await resp.json())["reason"] == "BadRequest"


async def test_remaining_item_count_is_only_given_without_selectors(
    emulator: KubeEmulator,
    session: aiohttp.ClientSession,
) -> None:
    # k8s.io/apiserver pkg/storage/continue.go PrepareContinueToken: etcd's count includes
    # objects a selector would drop, so none is given then.
    _nodes(emulator, "a", "b", "c")
    url = emulator.url + "/api/v1/nodes"
    _, _, plain = await _get(session, url, limit="1")
    _, _, selected = await _get(session, url, limit="1", labelSelector="!missing")
    assert plain["metadata"]["remainingItemCount"] == 2
    assert "remainingItemCount" not in selected["metadata"]
    assert selected["metadata"]["continue"]


async def test_events_queued_together_arrive_in_order_before_the_410_that_follows_them(
    emulator: KubeEmulator, session: aiohttp.ClientSession
) -> None:
    # Several events and the watch's expiry queued before the stream runs again: the events
    # go out (in one write) and the ERROR 410 after them, as the watch cache sends them.
    url = emulator.url + "/api/v1/nodes"
    _, _, listed = await _get(session, url)
    async with session.get(
        url,
        params={"watch": "true", "resourceVersion": listed["metadata"]["resourceVersion"]},
    ) as resp:
        await _watching(emulator, 1)
        _nodes(emulator, "n1", "n2", "n3")
        assert emulator.expire_watches("nodes") == 1
        lines = await _lines(resp, 5)
        assert await resp.content.read() == b""  # the stream ended
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in lines[:3]] == [
        ("ADDED", "n1"),
        ("ADDED", "n2"),
        ("ADDED", "n3"),
    ]
    assert len(lines) == 4
    assert lines[3]["type"] == "ERROR" and lines[3]["object"]["code"] == 410
