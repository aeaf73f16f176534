"""PATCH through the typed client: strategic merge, JSON patch, merge patch, server-side apply."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException


def untyped(api: Any) -> Any:
    """The typed client APIs take plain dicts at run time; their stubs only allow models."""
    return api


Builders = dict[str, Callable[..., dict[str, Any]]]
APPLY = "application/apply-patch+yaml"
JSON_PATCH = "application/json-patch+json"
MERGE = "application/merge-patch+json"


def body_of(err: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body or b"{}")
    return body


async def _claim(
    api_client: client.ApiClient, builders: Builders, finalizers: list[str] | None = None
) -> Any:
    body = builders["claim"]()
    if finalizers:
        body["metadata"]["finalizers"] = finalizers
    return await untyped(client.ResourceV1Api(api_client)).create_namespaced_resource_claim(
        "default", body
    )


async def test_strategic_merge_merges_finalizers_as_a_set(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await _claim(api_client, builders, ["a.example.com/one"])
    patched = await api.patch_namespaced_resource_claim(
        "claim-a", "default", {"metadata": {"finalizers": ["b.example.com/two"]}}
    )
    assert patched.metadata.finalizers == ["a.example.com/one", "b.example.com/two"]
    # A shorter list removes nothing.
    patched = await api.patch_namespaced_resource_claim(
        "claim-a", "default", {"metadata": {"finalizers": ["b.example.com/two"]}}
    )
    assert patched.metadata.finalizers == ["a.example.com/one", "b.example.com/two"]
    patched = await api.patch_namespaced_resource_claim(
        "claim-a",
        "default",
        {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a.example.com/one"]}},
    )
    assert patched.metadata.finalizers == ["b.example.com/two"]


async def test_strategic_merge_on_status_merges_reserved_for_and_device_conditions(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await _claim(api_client, builders)
    consumer = {"resource": "pods", "name": "p1", "uid": "uid-1"}
    await api.patch_namespaced_resource_claim_status(
        "claim-a",
        "default",
        {"status": {"allocation": builders["allocation"](), "reservedFor": [consumer]}},
    )
    patched = await api.patch_namespaced_resource_claim_status(
        "claim-a",
        "default",
        {"status": {"reservedFor": [{"resource": "pods", "name": "p2", "uid": "uid-2"}]}},
    )
    assert [c.uid for c in patched.status.reserved_for] == ["uid-1", "uid-2"]
    device = {"driver": "fabric.example.com", "pool": "us-east/rack-1", "device": "gpu-0"}
    condition = {
        "type": "Attached",
        "status": "False",
        "reason": "Attaching",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    await api.patch_namespaced_resource_claim_status(
        "claim-a", "default", {"status": {"devices": [{**device, "conditions": [condition]}]}}
    )
    ready = {**condition, "type": "Ready", "status": "True", "reason": "Ready"}
    patched = await api.patch_namespaced_resource_claim_status(
        "claim-a",
        "default",
        {
            "status": {
                "devices": [
                    {
                        **device,
                        "conditions": [
                            {**condition, "status": "True", "reason": "Attached"},
                            ready,
                        ],
                    }
                ]
            }
        },
    )
    conditions = {c.type: c.status for c in patched.status.devices[0].conditions}
    assert conditions == {"Attached": "True", "Ready": "True"}
    patched = await api.patch_namespaced_resource_claim_status(
        "claim-a", "default", {"status": {"reservedFor": [{"uid": "uid-1", "$patch": "delete"}]}}
    )
    assert [c.uid for c in patched.status.reserved_for] == ["uid-2"]


async def test_strategic_merge_replaces_lists_without_a_merge_key(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await api.create_resource_slice(builders["slice"]("s1", devices=2))
    patched = await api.patch_resource_slice("s1", {"spec": {"devices": [{"name": "only"}]}})
    assert [d.name for d in patched.spec.devices] == ["only"]


async def test_json_patch_test_failure_is_422(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await _claim(api_client, builders, ["a.example.com/one"])
    with pytest.raises(ApiException) as caught:
        await api.patch_namespaced_resource_claim(
            "claim-a",
            "default",
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
                {"op": "remove", "path": "/metadata/finalizers/0"},
            ],
            _content_type=JSON_PATCH,
        )
    assert caught.value.status == 422
    body = body_of(caught.value)
    assert body["reason"] == "Invalid"
    assert "test failed" in body["details"]["causes"][0]["message"]


async def test_json_patch_guarded_by_resource_version_removes_a_finalizer(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    claim = await _claim(api_client, builders, ["a.example.com/one", "b.example.com/two"])
    patched = await api.patch_namespaced_resource_claim(
        "claim-a",
        "default",
        [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": claim.metadata.resource_version,
            },
            {"op": "test", "path": "/metadata/finalizers/0", "value": "a.example.com/one"},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ],
        _content_type=JSON_PATCH,
    )
    assert patched.metadata.finalizers == ["b.example.com/two"]


async def test_json_patch_on_a_missing_path_is_422_and_a_malformed_patch_400(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await _claim(api_client, builders)
    with pytest.raises(ApiException) as caught:
        await api.patch_namespaced_resource_claim(
            "claim-a",
            "default",
            [{"op": "remove", "path": "/metadata/finalizers/0"}],
            _content_type=JSON_PATCH,
        )
    assert caught.value.status == 422
    with pytest.raises(ApiException) as caught:
        await api.patch_namespaced_resource_claim(
            "claim-a", "default", [{"op": "explode", "path": "/x"}], _content_type=JSON_PATCH
        )
    assert caught.value.status == 400


async def test_merge_patch_null_deletes_and_lists_replace(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await _claim(api_client, builders, ["a.example.com/one"])
    await api.patch_namespaced_resource_claim(
        "claim-a", "default", {"metadata": {"labels": {"a": "1", "b": "2"}}}, _content_type=MERGE
    )
    patched = await api.patch_namespaced_resource_claim(
        "claim-a",
        "default",
        {"metadata": {"labels": {"a": None}, "finalizers": ["b.example.com/x"]}},
        _content_type=MERGE,
    )
    assert patched.metadata.labels == {"b": "2"}
    assert patched.metadata.finalizers == ["b.example.com/x"]


async def test_patch_with_a_stale_resource_version_is_409(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await _claim(api_client, builders)
    with pytest.raises(ApiException) as caught:
        await api.patch_namespaced_resource_claim(
            "claim-a",
            "default",
            {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}},
            _content_type=MERGE,
        )
    assert caught.value.status == 409


async def test_unknown_patch_type_is_415(api_client: client.ApiClient, builders: Builders) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await _claim(api_client, builders)
    with pytest.raises(ApiException) as caught:
        await api.patch_namespaced_resource_claim(
            "claim-a", "default", {"metadata": {}}, _content_type="application/json"
        )
    assert caught.value.status == 415
    assert body_of(caught.value)["reason"] == "UnsupportedMediaType"


async def test_patch_of_a_missing_object_is_404(api_client: client.ApiClient) -> None:
    with pytest.raises(ApiException) as caught:
        await untyped(client.ResourceV1Api(api_client)).patch_resource_slice(
            "nope", {"metadata": {"labels": {"a": "b"}}}
        )
    assert caught.value.status == 404


async def test_server_side_apply_creates_updates_and_records_the_manager(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    config = builders["slice"]("s1", devices=2)
    config["metadata"]["labels"] = {"owner": "publisher"}
    created = await api.patch_resource_slice(
        "s1", config, field_manager="publisher", force=True, _content_type=APPLY
    )
    assert created.metadata.generation == 1
    managers = {(m.manager, m.operation) for m in created.metadata.managed_fields}
    assert managers == {("publisher", "Apply")}
    # Applying a smaller intent removes what the manager no longer sends.
    smaller = builders["slice"]("s1", devices=1)
    updated = await api.patch_resource_slice(
        "s1", smaller, field_manager="publisher", force=True, _content_type=APPLY
    )
    assert updated.metadata.labels is None
    assert [d.name for d in updated.spec.devices] == ["gpu-0"]
    assert updated.metadata.generation == 2
    # The same intent again writes nothing.
    again = await api.patch_resource_slice(
        "s1", smaller, field_manager="publisher", force=True, _content_type=APPLY
    )
    assert again.metadata.resource_version == updated.metadata.resource_version


async def test_server_side_apply_conflicts_unless_forced(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await api.patch_resource_slice(
        "s1", builders["slice"]("s1"), field_manager="first", _content_type=APPLY
    )
    other = builders["slice"]("s1")
    other["spec"]["pool"]["generation"] = 3
    with pytest.raises(ApiException) as caught:
        await api.patch_resource_slice("s1", other, field_manager="second", _content_type=APPLY)
    assert caught.value.status == 409
    assert "conflict" in body_of(caught.value)["message"]
    forced = await api.patch_resource_slice(
        "s1", other, field_manager="second", force=True, _content_type=APPLY
    )
    assert forced.spec.pool.generation == 3


async def test_server_side_apply_needs_a_field_manager(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    with pytest.raises(ApiException) as caught:
        await untyped(client.ResourceV1Api(api_client)).patch_resource_slice(
            "s1", builders["slice"]("s1"), _content_type=APPLY
        )
    assert caught.value.status == 422
    assert body_of(caught.value)["details"]["causes"][0]["field"] == "fieldManager"


async def test_server_side_apply_to_status_sets_only_status(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await _claim(api_client, builders)
    config = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "claim-a", "namespace": "default", "labels": {"x": "y"}},
        "status": {"allocation": builders["allocation"]()},
    }
    applied = await api.patch_namespaced_resource_claim_status(
        "claim-a", "default", config, field_manager="scheduler", force=True, _content_type=APPLY
    )
    assert applied.status.allocation is not None
    assert applied.metadata.labels is None
    entry = next(m for m in applied.metadata.managed_fields if m.manager == "scheduler")
    assert entry.subresource == "status"
