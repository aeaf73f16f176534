"""fieldValidation over HTTP: unknown and duplicate fields on POST, PUT, every PATCH type and
server-side apply, answered the way kube-apiserver answers them, with Warning headers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from fabric_dra_sim.kubeapi import KubeEmulator

Builders = dict[str, Callable[..., dict[str, Any]]]
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
JSON = {"Content-Type": "application/json"}
MERGE = {"Content-Type": "application/merge-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}


@pytest.fixture
async def http(emulator: KubeEmulator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=emulator.url) as session:
        yield session


async def _send(
    http: aiohttp.ClientSession, method: str, path: str, body: Any, headers: dict[str, str] = JSON
) -> tuple[int, list[str], dict[str, Any]]:
    data = body if isinstance(body, str) else json.dumps(body)
    async with http.request(method, path, data=data, headers=headers) as response:
        return response.status, response.headers.getall("Warning", []), await response.json()


def _with_unknown(builders: Builders) -> dict[str, Any]:
    body = builders["slice"]("s1")
    body["spec"]["devices"][0]["colour"] = "red"
    body["spec"]["foo"] = 1
    return body


async def test_a_create_without_the_parameter_warns_and_drops_each_unknown_field(
    http: aiohttp.ClientSession,
    builders: Builders,
    emulator: KubeEmulator,
) -> None:
    status, warnings, body = await _send(http, "POST", SLICES, _with_unknown(builders))
    assert status == 201
    assert warnings == [
        '299 - "unknown field \\"spec.devices[0].colour\\""',
        '299 - "unknown field \\"spec.foo\\""',
    ]
    stored = emulator.get("resource.k8s.io/v1", "ResourceSlice", "s1")
    assert stored is not None
    assert "foo" not in stored["spec"] and "colour" not in stored["spec"]["devices"][0]
    assert body["spec"] == stored["spec"]
    assert stored["spec"]["devices"][0]["attributes"] == {"model": {"string": "a100"}}


async def test_strict_refuses_a_create_with_the_real_message(
    http: aiohttp.ClientSession,
    builders: Builders,
    emulator: KubeEmulator,
) -> None:
    status, warnings, body = await _send(
        http, "POST", f"{SLICES}?fieldValidation=Strict", _with_unknown(builders)
    )
    assert (status, warnings, body["reason"]) == (400, [], "BadRequest")
    assert body["message"] == (
        'strict decoding error: unknown field "spec.devices[0].colour", unknown field "spec.foo"'
    )
    assert emulator.get("resource.k8s.io/v1", "ResourceSlice", "s1") is None


async def test_ignore_drops_unknown_fields_silently(
    http: aiohttp.ClientSession,
    builders: Builders,
) -> None:
    status, warnings, body = await _send(
        http, "POST", f"{SLICES}?fieldValidation=Ignore", _with_unknown(builders)
    )
    assert (status, warnings) == (201, [])
    assert "foo" not in body["spec"]


@pytest.mark.parametrize(
    ("method", "path", "options"),
    [
        ("POST", SLICES, "CreateOptions"),
        ("PUT", f"{SLICES}/s1", "UpdateOptions"),
        ("PATCH", f"{SLICES}/s1", "PatchOptions"),
    ],
)
async def test_an_unknown_directive_is_422_before_the_body_is_read(
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    options: str,
) -> None:
    status, _, body = await _send(
        http,
        method,
        f"{path}?fieldValidation=Loose",
        "not json",
        MERGE if method == "PATCH" else JSON,
    )
    assert status == 422
    assert body["message"] == (
        f'{options}.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "Loose": '
        'supported values: "", "Ignore", "Strict", "Warn"'
    )


async def test_duplicate_keys_warn_or_fail_and_the_last_value_is_kept(
    http: aiohttp.ClientSession,
    builders: Builders,
) -> None:
    text = json.dumps(builders["slice"]("s1")).replace(
        '"allNodes": true', '"allNodes": false, "allNodes": true'
    )
    status, _, body = await _send(http, "POST", f"{SLICES}?fieldValidation=Strict", text)
    assert (status, body["message"]) == (
        400,
        'strict decoding error: duplicate field "spec.allNodes"',
    )
    status, warnings, body = await _send(http, "POST", SLICES, text)
    assert (status, warnings) == (201, ['299 - "duplicate field \\"spec.allNodes\\""'])
    assert body["spec"]["allNodes"] is True


async def test_a_put_follows_the_directive_too(
    http: aiohttp.ClientSession,
    builders: Builders,
) -> None:
    _, _, created = await _send(http, "POST", SLICES, builders["slice"]("s1"))
    created["spec"]["pool"]["depth"] = 3
    status, _, body = await _send(http, "PUT", f"{SLICES}/s1?fieldValidation=Strict", created)
    assert (status, body["message"]) == (
        400,
        'strict decoding error: unknown field "spec.pool.depth"',
    )
    status, warnings, body = await _send(http, "PUT", f"{SLICES}/s1", created)
    assert (status, warnings) == (200, ['299 - "unknown field \\"spec.pool.depth\\""'])
    assert "depth" not in body["spec"]["pool"]


async def test_wrong_json_types_are_400_in_every_mode(
    http: aiohttp.ClientSession,
    builders: Builders,
) -> None:
    body = builders["slice"]("s1")
    body["spec"]["allNodes"] = "yes"
    for mode in ("Ignore", "Warn", "Strict"):
        status, _, answer = await _send(http, "POST", f"{SLICES}?fieldValidation={mode}", body)
        assert status == 400, mode
        assert "cannot unmarshal string into Go struct field" in answer["message"]


async def test_warnings_go_out_with_an_error_answer_too(
    http: aiohttp.ClientSession,
    builders: Builders,
) -> None:
    body = _with_unknown(builders)
    del body["spec"]["pool"]
    status, warnings, answer = await _send(http, "POST", SLICES, body)
    assert (status, answer["reason"]) == (422, "Invalid")
    assert warnings == [
        '299 - "unknown field \\"spec.devices[0].colour\\""',
        '299 - "unknown field \\"spec.foo\\""',
    ]


async def test_rule_warnings_and_decoding_warnings_share_the_headers(
    http: aiohttp.ClientSession,
    builders: Builders,
) -> None:
    body = builders["slice"]("s1", driver="Fabric.example.com")
    body["spec"]["foo"] = 1
    status, warnings, _ = await _send(http, "POST", SLICES, body)
    assert status == 201
    assert warnings[0] == '299 - "unknown field \\"spec.foo\\""'
    assert any("driver names should be lowercase" in w for w in warnings[1:])
    # The next request starts with no warnings of its own.
    status, warnings, _ = await _send(http, "DELETE", f"{SLICES}/s1", {})
    assert (status, warnings) == (200, [])


@pytest.mark.parametrize(
    ("headers", "patch", "shown"),
    [
        (MERGE, '{"spec": {"foo": 1}}', None),
        (STRATEGIC, '{"spec": {"foo": 1}}', "map[spec:map[foo:1]]"),
        (JSON_PATCH, '[{"op": "add", "path": "/spec/foo", "value": 1}]', None),
    ],
)
async def test_patches_warn_and_drop_or_under_strict_are_422_on_field_patch(
    http: aiohttp.ClientSession,
    builders: Builders,
    headers: dict[str, str],
    patch: str,
    shown: str | None,
) -> None:
    await _send(http, "POST", SLICES, builders["slice"]("s1"))
    status, warnings, body = await _send(http, "PATCH", f"{SLICES}/s1", patch, headers)
    assert (status, warnings) == (200, ['299 - "unknown field \\"spec.foo\\""'])
    assert "foo" not in body["spec"]
    status, _, body = await _send(
        http, "PATCH", f"{SLICES}/s1?fieldValidation=Strict", patch, headers
    )
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"].startswith(' "" is invalid: patch: Invalid value: ')
    assert body["message"].endswith(': strict decoding error: unknown field "spec.foo"')
    assert body["details"]["causes"][0]["field"] == "patch"
    if shown is not None:
        assert json.dumps(shown) in body["message"]
    status, warnings, _ = await _send(
        http, "PATCH", f"{SLICES}/s1?fieldValidation=Ignore", patch, headers
    )
    assert (status, warnings) == (200, [])


async def test_a_merge_patch_reports_its_duplicate_keys_then_the_unknown_fields(
    http: aiohttp.ClientSession,
    builders: Builders,
) -> None:
    await _send(http, "POST", SLICES, builders["slice"]("s1"))
    status, warnings, _ = await _send(
        http, "PATCH", f"{SLICES}/s1", '{"spec": {"bar": 1, "bar": 2}}', MERGE
    )
    assert (status, warnings) == (
        200,
        ['299 - "duplicate field \\"spec.bar\\""', '299 - "unknown field \\"spec.bar\\""'],
    )


async def test_a_json_patch_operation_with_an_unknown_field_warns(
    http: aiohttp.ClientSession,
    builders: Builders,
) -> None:
    await _send(http, "POST", SLICES, builders["slice"]("s1"))
    status, warnings, _ = await _send(
        http,
        "PATCH",
        f"{SLICES}/s1",
        '[{"op": "replace", "path": "/spec/allNodes", "value": true, "comment": "x"}]',
        JSON_PATCH,
    )
    assert (status, warnings) == (200, ['299 - "json patch unknown field \\"[0].comment\\""'])


@pytest.mark.parametrize(
    "mode", ["", "&fieldValidation=Ignore", "&fieldValidation=Warn", "&fieldValidation=Strict"]
)
async def test_apply_refuses_unknown_fields_in_every_mode_with_a_500(
    http: aiohttp.ClientSession,
    mode: str,
) -> None:
    config = (
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: s1\n"
        "spec:\n  driver: fabric.example.com\n  allNodes: true\n  foo: 1\n"
        "  pool: {name: p, generation: 0, resourceSliceCount: 1}\n"
    )
    status, _, body = await _send(
        http, "PATCH", f"{SLICES}/s1?fieldManager=me{mode}", config, APPLY
    )
    assert status == 500
    assert body["message"] == (
        "failed to create typed patch object (/s1; resource.k8s.io/v1, Kind=ResourceSlice): "
        ".spec.foo: field not declared in schema"
    )


async def test_apply_duplicate_keys_follow_the_directive(http: aiohttp.ClientSession) -> None:
    config = (
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: s1\n"
        "spec:\n  driver: fabric.example.com\n  allNodes: false\n  allNodes: true\n"
        "  pool: {name: p, generation: 0, resourceSliceCount: 1}\n"
    )
    path = f"{SLICES}/s1?fieldManager=me"
    status, _, body = await _send(http, "PATCH", f"{path}&fieldValidation=Strict", config, APPLY)
    assert (status, body["message"]) == (
        400,
        "error strict decoding patch: error converting YAML to JSON: yaml: unmarshal "
        'errors:\n  line 8: key "allNodes" already set in map',
    )
    status, warnings, body = await _send(http, "PATCH", path, config, APPLY)
    assert (status, warnings) == (201, ['299 - "line 8: key \\"allNodes\\" already set in map"'])
    assert body["spec"]["allNodes"] is True


async def test_the_python_client_reads_the_warnings_of_a_typed_call(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    response = await api.create_resource_slice(_with_unknown(builders), _preload_content=False)
    try:
        assert response.status == 201
        assert response.headers.getall("Warning") == [
            '299 - "unknown field \\"spec.devices[0].colour\\""',
            '299 - "unknown field \\"spec.foo\\""',
        ]
    finally:
        response.release()
