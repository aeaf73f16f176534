"""Bad HTTP input answered as kube-apiserver answers it: malformed DeleteOptions and Binding
bodies, deep nesting, media types, the body size limit, JSON nulls, decode errors on fields
that are dropped later, strict query parameters, single-object GETs at a resourceVersion,
the bearer scheme and the public info paths.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.bodies import MAX_REQUEST_BODY_BYTES
from fabric_dra_sim.kubeapi.cluster import all_gates_on

Builders = dict[str, Callable[..., dict[str, Any]]]
RESOURCE = "/apis/resource.k8s.io"
SLICES = f"{RESOURCE}/v1/resourceslices"
CLAIMS = f"{RESOURCE}/v1/namespaces/default/resourceclaims"
PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
async def beta_emulator() -> AsyncIterator[KubeEmulator]:
    """A 1.34 emulator serving resource.k8s.io v1, v1beta1 and v1beta2."""
    emu = KubeEmulator(
        kubernetes_version="1.34",
        feature_gates=all_gates_on("1.34"),
        served_resource_versions=["v1", "v1beta1", "v1beta2"],
    )
    await emu.start()
    try:
        yield emu
    finally:
        await emu.stop()


async def _raw(
    emulator: KubeEmulator,
    method: str,
    path: str,
    data: bytes | str | io.BytesIO | None = None,
    *,
    content_type: str | None = "application/json",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    sent = dict(headers or {})
    if content_type is not None:
        sent["Content-Type"] = content_type
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            emulator.url + path,
            headers=sent,
            data=data,
        ) as response,
    ):
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text


async def _call(
    emulator: KubeEmulator, method: str, path: str, body: Any = None, **kwargs: Any
) -> tuple[int, Any]:
    return await _raw(emulator, method, path, None if body is None else json.dumps(body), **kwargs)


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


# -- 1. no 500 for malformed bodies -------------------------------------------------------------


async def test_delete_with_preconditions_of_the_wrong_type_is_400_and_keeps_the_object(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    await _call(emulator, "POST", SLICES, builders["slice"]("x"))
    status, body = await _call(emulator, "DELETE", f"{SLICES}/x", {"preconditions": "x"})
    assert status == 400
    assert body["reason"] == "BadRequest"
    assert body["message"] == (
        "json: cannot unmarshal string into Go struct field "
        "DeleteOptions.preconditions of type v1.Preconditions"
    )
    assert (await _call(emulator, "GET", f"{SLICES}/x"))[0] == 200


async def test_binding_with_a_target_of_the_wrong_type_is_400(emulator: KubeEmulator) -> None:
    await _call(emulator, "POST", PODS, _pod("p1"))
    status, body = await _call(
        emulator,
        "POST",
        f"{PODS}/p1/binding",
        {"apiVersion": "v1", "kind": "Binding", "target": "x"},
    )
    assert status == 400
    assert "Binding.target of type v1.ObjectReference" in body["message"]


async def test_a_body_nested_too_deep_is_400(emulator: KubeEmulator) -> None:
    status, body = await _raw(emulator, "POST", SLICES, "[" * 100_000)
    assert status == 400
    assert body["message"].endswith("exceeded max depth")
    status, body = await _raw(emulator, "DELETE", f"{SLICES}/x", "[" * 100_000)
    assert status == 400


# -- 2. DeleteOptions are decoded before anything is deleted ------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": "Pod"}, 'no kind "Pod" is registered for version "meta.k8s.io/v1"'),
        ({"apiVersion": "v1", "kind": "Pod"}, 'no kind "Pod" is registered for version "v1"'),
        (
            {"orphanDependents": "yes"},
            "json: cannot unmarshal string into Go struct field "
            "DeleteOptions.orphanDependents of type bool",
        ),
        (
            {"dryRun": "All"},
            "json: cannot unmarshal string into Go struct field "
            "DeleteOptions.dryRun of type []string",
        ),
        (
            {"gracePeriodSeconds": 1.5},
            "json: cannot unmarshal number 1.5 into Go struct field "
            "DeleteOptions.gracePeriodSeconds of type int64",
        ),
        (
            {"preconditions": {"uid": 5}},
            "json: cannot unmarshal number 5 into Go struct field "
            "DeleteOptions.preconditions.uid of type types.UID",
        ),
    ],
)
async def test_bad_delete_options_are_400_and_delete_nothing(
    emulator: KubeEmulator,
    builders: Builders,
    options: dict[str, Any],
    message: str,
) -> None:
    await _call(emulator, "POST", SLICES, builders["slice"]("x"))
    status, body = await _call(emulator, "DELETE", f"{SLICES}/x", options)
    assert (status, body["reason"]) == (400, "BadRequest")
    assert body["message"].startswith(message)
    assert (await _call(emulator, "GET", f"{SLICES}/x"))[0] == 200


async def test_delete_options_of_any_api_version_decode_as_an_unversioned_type(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    # DeleteOptions is registered unversioned in the meta scheme: any group version works.
    await _call(emulator, "POST", SLICES, builders["slice"]("x"))
    status, _ = await _call(
        emulator,
        "DELETE",
        f"{SLICES}/x",
        {
            "apiVersion": "bogus/v9",
            "kind": "DeleteOptions",
            "dryRun": ["All"],
            "preconditions": None,
        },
    )
    assert status == 200
    assert (await _call(emulator, "GET", f"{SLICES}/x"))[0] == 200


# -- 3. v1beta1 requests are validated in their converted form ----------------------------------


@pytest.mark.parametrize(
    "extra",
    [{"deviceClassName": "gpu"}, {"count": 2}, {"selectors": []}, {"allocationMode": "All"}],
)
async def test_v1beta1_request_with_exact_fields_and_first_available_is_422(
    beta_emulator: KubeEmulator,
    extra: dict[str, Any],
) -> None:
    emulator = beta_emulator
    claim = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        **extra,
                        "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}],
                    }
                ]
            }
        },
    }
    status, body = await _call(
        emulator, "POST", f"{RESOURCE}/v1beta1/namespaces/default/resourceclaims", claim
    )
    assert status == 422, body
    assert body["details"]["causes"][0]["field"] == "spec.devices.requests[0]"
    assert "multiple fields are set" in body["message"]


async def test_v1beta1_request_with_only_first_available_is_accepted(
    beta_emulator: KubeEmulator,
) -> None:
    emulator = beta_emulator
    claim = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]}
                ]
            }
        },
    }
    status, body = await _call(
        emulator, "POST", f"{RESOURCE}/v1beta1/namespaces/default/resourceclaims", claim
    )
    assert status == 201, body
    _, shown = await _call(emulator, "GET", f"{CLAIMS}/c")
    assert "exactly" not in shown["spec"]["devices"]["requests"][0]


# -- 4. nulls become Go zero values -------------------------------------------------------------


async def test_nulls_are_never_stored(emulator: KubeEmulator, builders: Builders) -> None:
    claim = builders["claim"]("c")
    claim["metadata"].update(
        {
            "annotations": {"a": None},
            "labels": {"a": None},
            "ownerReferences": None,
            "generateName": None,
        }
    )
    status, body = await _call(emulator, "POST", CLAIMS, claim)
    assert status == 201, body
    meta = body["metadata"]
    assert meta["annotations"] == {"a": ""}
    assert meta["labels"] == {"a": ""}
    assert "ownerReferences" not in meta
    assert "generateName" not in meta
    assert "null" not in json.dumps((await _call(emulator, "GET", f"{CLAIMS}/c"))[1])


async def test_a_null_struct_in_a_list_is_validated_as_the_zero_struct(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    claim = builders["claim"]("c")
    claim["metadata"]["ownerReferences"] = [None]
    status, body = await _call(emulator, "POST", CLAIMS, claim)
    assert status == 422, body
    assert "ownerReferences[0]" in body["message"]


async def test_a_null_finalizer_is_an_empty_one_and_refused(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    claim = builders["claim"]("c")
    claim["metadata"]["finalizers"] = [None]
    status, body = await _call(emulator, "POST", CLAIMS, claim)
    assert status == 422, body
    assert "metadata.finalizers[0]" in body["message"]


async def test_a_null_capacity_value_is_not_served_as_null(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    resource_slice = builders["slice"]("x")
    resource_slice["spec"]["devices"][0]["capacity"] = {"memory": None}
    status, body = await _call(emulator, "POST", SLICES, resource_slice)
    if status == 201:
        assert body["spec"]["devices"][0]["capacity"]["memory"] is not None
    else:
        assert status == 422, body


# -- 5. decode errors on fields that are dropped later ------------------------------------------


async def test_managed_fields_of_the_wrong_type_are_400(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    claim = builders["claim"]("c")
    claim["metadata"]["managedFields"] = "x"
    status, body = await _call(emulator, "POST", CLAIMS, claim)
    assert status == 400, body
    assert "cannot unmarshal string" in body["message"]
    assert "metadata.managedFields" in body["message"]


async def test_binding_conditions_of_the_wrong_type_are_400_with_the_gate_off(
    builders: Builders,
) -> None:
    emu = KubeEmulator(kubernetes_version="1.34")
    await emu.start()
    try:
        resource_slice = builders["slice"]("x")
        resource_slice["spec"]["devices"][0]["bindingConditions"] = "x"
        status, body = await _call(emu, "POST", SLICES, resource_slice)
        assert status == 400, body
        assert "bindingConditions" in body["message"]
    finally:
        await emu.stop()


# -- 6. media types and the size limit ----------------------------------------------------------


async def test_text_plain_is_415(emulator: KubeEmulator, builders: Builders) -> None:
    status, body = await _call(
        emulator, "POST", SLICES, builders["slice"](), content_type="text/plain"
    )
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")
    assert body["message"] == (
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json, application/yaml, application/vnd.kubernetes.protobuf"
    )


async def test_protobuf_is_415_as_for_a_type_without_protobuf(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    status, body = await _call(
        emulator,
        "PUT",
        f"{SLICES}/x",
        builders["slice"]("x"),
        content_type="application/vnd.kubernetes.protobuf",
    )
    assert status == 415
    assert body["message"].endswith("application/json, application/yaml")


async def test_yaml_bodies_are_accepted(emulator: KubeEmulator, builders: Builders) -> None:
    import yaml

    status, body = await _raw(
        emulator,
        "POST",
        SLICES,
        yaml.safe_dump(builders["slice"]("y")),
        content_type="application/yaml",
    )
    assert status == 201, body
    assert body["metadata"]["name"] == "y"


async def test_a_body_over_3_mib_is_413(emulator: KubeEmulator) -> None:
    too_big = io.BytesIO(b" " * (MAX_REQUEST_BODY_BYTES + 1))
    status, body = await _raw(emulator, "POST", SLICES, too_big)
    assert (status, body["reason"]) == (413, "RequestEntityTooLarge")
    assert body["message"] == "Request entity too large: limit is 3145728"


# -- 7. query parameters, GET at a resourceVersion, authentication ------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "limit=99999999999999999999",
        "limit=5_0",
        "watch=1&timeoutSeconds=abc",
        "labelSelector=a>x",
        "labelSelector=%ff",
        "labelSelector=a=b=c",
    ],
)
async def test_bad_list_query_parameters_are_400(emulator: KubeEmulator, query: str) -> None:
    status, body = await _raw(emulator, "GET", f"{SLICES}?{query}", content_type=None)
    assert status == 400, body
    assert body["reason"] == "BadRequest"


async def test_label_selector_greater_than_matches_integers(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    for name, tier in (("a", "1"), ("b", "5")):
        resource_slice = builders["slice"](name)
        resource_slice["metadata"]["labels"] = {"tier": tier}
        await _call(emulator, "POST", SLICES, resource_slice)
    status, body = await _raw(
        emulator, "GET", f"{SLICES}?labelSelector=tier%3E2", content_type=None
    )
    assert status == 200
    assert [i["metadata"]["name"] for i in body["items"]] == ["b"]


async def test_get_with_an_unparsable_resource_version_is_refused(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    await _call(emulator, "POST", SLICES, builders["slice"]("x"))
    status, body = await _raw(emulator, "GET", f"{SLICES}/x?resourceVersion=abc", content_type=None)
    assert status == 500
    assert body["message"] == (
        'resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax'
    )


async def test_get_at_a_future_resource_version_waits_then_is_504(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    _, created = await _call(emulator, "POST", SLICES, builders["slice"]("x"))
    emulator._faults.fresh_wait_s = 0.1
    future = int(created["metadata"]["resourceVersion"]) + 100
    status, body = await _raw(
        emulator, "GET", f"{SLICES}/x?resourceVersion={future}", content_type=None
    )
    assert status == 504
    assert body["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"
    current = created["metadata"]["resourceVersion"]
    status, _ = await _raw(
        emulator, "GET", f"{SLICES}/x?resourceVersion={current}", content_type=None
    )
    assert status == 200


async def test_get_waits_for_a_resource_version_that_arrives(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    _, created = await _call(emulator, "POST", SLICES, builders["slice"]("x"))
    emulator._faults.fresh_wait_s = 3.0
    future = int(created["metadata"]["resourceVersion"]) + 1
    waiting = asyncio.ensure_future(
        _raw(emulator, "GET", f"{SLICES}/x?resourceVersion={future}", content_type=None)
    )
    await asyncio.sleep(0.05)
    await _call(emulator, "POST", SLICES, builders["slice"]("y"))
    status, _ = await waiting
    assert status == 200


async def test_lowercase_bearer_scheme_and_public_paths(builders: Builders) -> None:
    emu = KubeEmulator(kubernetes_version="1.34", token="tok")
    await emu.start()
    try:
        status, _ = await _raw(
            emu, "GET", SLICES, content_type=None, headers={"Authorization": "bearer tok"}
        )
        assert status == 200
        status, _ = await _raw(emu, "GET", SLICES, content_type=None)
        assert status == 401
        for path in ("/healthz", "/livez", "/readyz", "/version"):
            status, _ = await _raw(emu, "GET", path, content_type=None)
            assert status == 200, path
        status, _ = await _raw(
            emu, "GET", "/healthz", content_type=None, headers={"Authorization": "Bearer wrong"}
        )
        assert status == 401
    finally:
        await emu.stop()


async def test_allow_watch_bookmarks_takes_any_value_but_false_as_true(
    emulator: KubeEmulator,
) -> None:
    status, _ = await _raw(
        emulator,
        "GET",
        f"{SLICES}?watch=1&allowWatchBookmarks=x&timeoutSeconds=1",
        content_type=None,
    )
    assert status == 200


async def test_a_client_leaving_mid_body_logs_no_error(
    emulator: KubeEmulator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    host, port = emulator.url.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST " + SLICES.encode() + b" HTTP/1.1\r\nHost: x\r\n"
        b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"a":'
    )
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    await writer.wait_closed()
    for _ in range(50):
        if emulator.requests:
            break
        await asyncio.sleep(0.01)
    assert [r.method for r in emulator.requests] == ["POST"]
    assert not [r for r in caplog.records if r.levelno >= 40]
    del reader


async def test_an_ipv6_host_is_bracketed_in_the_url() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    emulator = KubeEmulator()
    try:
        url = await emulator.start("::1")
    except OSError:
        pytest.skip("::1 is not configured here")
    try:
        assert url.startswith("http://[::1]:")
        async with aiohttp.ClientSession() as http, http.get(f"{url}/version") as response:
            assert response.status == 200
    finally:
        await emulator.stop()
