"""One storage across resource.k8s.io v1, v1beta2 and v1beta1 over HTTP; feature gates that
drop fields; the Kubernetes version a cluster reports."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on

G = "/apis/resource.k8s.io"
DRIVER = "fabric.example.com"


class Http:
    """Plain JSON requests against one emulator (the exact JSON, no client models)."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        async with self.session.request(
            method, self.url + path, data=data, headers={"Content-Type": content_type}
        ) as resp:
            return resp.status, await resp.json()

    async def ok(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        status, answer = await self.call(method, path, body, content_type)
        assert status in (200, 201), answer
        return answer


@pytest.fixture
async def http() -> AsyncIterator[Http]:
    emu = KubeEmulator(
        served_resource_versions=("v1", "v1beta2", "v1beta1"), feature_gates=all_gates_on("1.34")
    )
    url = await emu.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Http(session, url)
    finally:
        await emu.stop()


def beta1_slice(
    name: str, node: str = "node-1", driver: str = DRIVER, **device: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"rack": "r1"}},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
            "devices": [
                {"name": "gpu-0", "basic": {"attributes": {"model": {"string": "a100"}}, **device}}
            ],
        },
    }


async def test_a_v1beta1_slice_is_read_listed_and_updated_through_v1_and_v1beta2(
    http: Http,
) -> None:
    taint = {
        "key": "example.com/unhealthy",
        "effect": "NoSchedule",
        "timeAdded": "2026-01-01T00:00:00Z",
    }
    await http.ok("POST", f"{G}/v1beta1/resourceslices", beta1_slice("s1", taints=[taint]))
    v1 = await http.ok("GET", f"{G}/v1/resourceslices/s1")
    assert v1["apiVersion"] == "resource.k8s.io/v1"
    assert v1["spec"]["devices"] == [
        {"name": "gpu-0", "taints": [taint], "attributes": {"model": {"string": "a100"}}}
    ]
    v1beta2 = await http.ok("GET", f"{G}/v1beta2/resourceslices/s1")
    assert {**v1beta2, "apiVersion": v1["apiVersion"]} == v1
    listed = await http.ok("GET", f"{G}/v1/resourceslices")
    assert listed["apiVersion"] == "resource.k8s.io/v1"
    assert [i["spec"]["devices"][0].get("basic") for i in listed["items"]] == [None]
    # An update through v1 is seen through v1beta1 in its own shape.
    v1["spec"]["devices"][0]["attributes"]["model"] = {"string": "h100"}
    updated = await http.ok("PUT", f"{G}/v1/resourceslices/s1", v1)
    assert updated["metadata"]["generation"] == 2
    beta1 = await http.ok("GET", f"{G}/v1beta1/resourceslices/s1")
    assert beta1["spec"]["devices"][0]["basic"]["attributes"]["model"] == {"string": "h100"}
    assert beta1["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]
    # A merge patch through v1beta1 works on the v1beta1 shape.
    patched = await http.ok(
        "PATCH",
        f"{G}/v1beta1/resourceslices/s1",
        {"metadata": {"labels": {"rack": "r2"}}},
        "application/merge-patch+json",
    )
    assert patched["spec"]["devices"][0]["basic"]["taints"] == [taint]
    status, gone = await http.call("DELETE", f"{G}/v1beta2/resourceslices/s1")
    assert (status, gone["apiVersion"]) == (200, "resource.k8s.io/v1beta2")
    assert (await http.call("GET", f"{G}/v1beta1/resourceslices/s1"))[0] == 404


async def test_a_v1_claim_is_flat_through_v1beta1_and_its_status_written_there_shows_in_v1(
    http: Http,
) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu",
                            "count": 2,
                            "allocationMode": "ExactCount",
                        },
                    }
                ]
            }
        },
    }
    await http.ok("POST", f"{G}/v1/namespaces/default/resourceclaims", claim)
    beta1 = await http.ok("GET", f"{G}/v1beta1/namespaces/default/resourceclaims/c1")
    assert beta1["spec"]["devices"]["requests"] == [
        {"name": "gpu", "deviceClassName": "gpu", "count": 2, "allocationMode": "ExactCount"}
    ]
    beta1["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "p", "device": "gpu-0"},
                    {"request": "gpu", "driver": DRIVER, "pool": "p", "device": "gpu-1"},
                ]
            }
        }
    }
    await http.ok("PUT", f"{G}/v1beta1/namespaces/default/resourceclaims/c1/status", beta1)
    v1 = await http.ok("GET", f"{G}/v1/namespaces/default/resourceclaims/c1")
    assert [r["device"] for r in v1["status"]["allocation"]["devices"]["results"]] == [
        "gpu-0",
        "gpu-1",
    ]
    assert v1["spec"] == claim["spec"]


async def _watch_lines(http: Http, path: str, count: int) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    async with http.session.get(http.url + path) as resp:
        while len(lines) < count:
            raw = await asyncio.wait_for(resp.content.readline(), 10)
            event = json.loads(raw)
            if event["type"] != "BOOKMARK":
                lines.append(event)
    return lines


async def test_watches_show_every_write_in_their_own_version_with_selectors_applied(
    http: Http,
) -> None:
    listed = await http.ok("GET", f"{G}/v1/resourceslices")
    since = listed["metadata"]["resourceVersion"]
    selector = "fieldSelector=spec.nodeName%3Dnode-1,spec.driver%3D" + DRIVER
    v1_watch = asyncio.create_task(
        _watch_lines(
            http, f"{G}/v1/resourceslices?watch=true&resourceVersion={since}&{selector}", 2
        )
    )
    beta1_watch = asyncio.create_task(
        _watch_lines(
            http,
            f"{G}/v1beta1/resourceslices?watch=true&resourceVersion={since}"
            "&labelSelector=rack%3Dr1",
            3,
        )
    )
    await asyncio.sleep(0.1)
    await http.ok("POST", f"{G}/v1beta1/resourceslices", beta1_slice("s1"))
    await http.ok("POST", f"{G}/v1beta1/resourceslices", beta1_slice("s2", node="node-2"))
    v1_body = await http.ok("GET", f"{G}/v1/resourceslices/s1")
    v1_body["spec"]["devices"][0]["attributes"]["model"] = {"string": "h100"}
    await http.ok("PUT", f"{G}/v1/resourceslices/s1", v1_body)
    seen_v1, seen_beta1 = await asyncio.gather(v1_watch, beta1_watch)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in seen_v1] == [
        ("ADDED", "s1"),
        ("MODIFIED", "s1"),
    ]
    assert {e["object"]["apiVersion"] for e in seen_v1} == {"resource.k8s.io/v1"}
    assert seen_v1[1]["object"]["spec"]["devices"][0]["attributes"]["model"] == {"string": "h100"}
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in seen_beta1] == [
        ("ADDED", "s1"),
        ("ADDED", "s2"),
        ("MODIFIED", "s1"),
    ]
    assert seen_beta1[2]["object"]["spec"]["devices"][0]["basic"]["attributes"]["model"] == {
        "string": "h100"
    }
    # The initial events of a fresh watch are converted too.
    initial = await _watch_lines(
        http, f"{G}/v1beta2/resourceslices?watch=true&fieldSelector=spec.nodeName%3Dnode-2", 1
    )
    assert initial[0]["object"]["apiVersion"] == "resource.k8s.io/v1beta2"
    assert initial[0]["object"]["spec"]["devices"][0]["name"] == "gpu-0"
    assert "basic" not in initial[0]["object"]["spec"]["devices"][0]


async def test_each_write_is_validated_in_the_version_it_was_written_in(http: Http) -> None:
    # v1 shape sent to v1beta1: unknown field there, though v1 would take it.
    body = beta1_slice("s1")
    body["spec"]["devices"] = [{"name": "gpu-0", "attributes": {}}]
    status, answer = await http.call(
        "POST", f"{G}/v1beta1/resourceslices?fieldValidation=Strict", body
    )
    assert status == 400
    assert "strict decoding error" in answer["message"]
    status, _ = await http.call("POST", f"{G}/v1/resourceslices", beta1_slice("s1"))
    assert status == 400
    # The rules of a v1beta1 write name the v1beta1 paths (under basic).
    body = beta1_slice("s1")
    body["spec"]["devices"][0]["basic"]["attributes"] = {"bad name!": {"string": "x"}}
    status, answer = await http.call("POST", f"{G}/v1beta1/resourceslices", body)
    assert status == 422
    assert any(
        c["field"].startswith("spec.devices[0].basic.attributes")
        for c in answer["details"]["causes"]
    ), answer


async def test_a_disabled_gate_drops_fields_silently_and_an_enabled_one_keeps_them() -> None:
    taint = {"key": "k", "effect": "NoSchedule"}
    default = KubeEmulator(served_resource_versions=("v1", "v1beta1"))
    gated = KubeEmulator(feature_gates={"DRADeviceTaints": True})
    for emu, kept in ((default, False), (gated, True)):
        url = await emu.start()
        try:
            async with aiohttp.ClientSession() as session:
                http = Http(session, url)
                status, created = await http.call(
                    "POST",
                    f"{G}/v1/resourceslices",
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {"name": "s1"},
                        "spec": {
                            "driver": DRIVER,
                            "allNodes": True,
                            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
                            "devices": [{"name": "gpu-0", "taints": [taint]}],
                        },
                    },
                )
                assert status == 201
                assert ("taints" in created["spec"]["devices"][0]) is kept
        finally:
            await emu.stop()


async def test_the_cluster_reports_its_release_and_serves_its_defaults() -> None:
    emu = KubeEmulator(kubernetes_version="v1.36.3")
    url = await emu.start()
    try:
        async with aiohttp.ClientSession() as session:
            http = Http(session, url)
            info = await http.ok("GET", "/version")
            assert (info["gitVersion"], info["minor"]) == ("v1.36.3", "36")
            group = await http.ok("GET", G)
            assert [v["version"] for v in group["versions"]] == ["v1"]
    finally:
        await emu.stop()


def test_git_version_is_an_alias_that_must_agree_with_kubernetes_version() -> None:
    assert KubeEmulator(git_version="v1.31.0").cluster.version == "1.31"
    assert KubeEmulator(git_version="v1.36.1", kubernetes_version="1.36").cluster.minor == 36
    with pytest.raises(ValueError, match="contradicts"):
        KubeEmulator(git_version="v1.31.0", kubernetes_version="1.34")
