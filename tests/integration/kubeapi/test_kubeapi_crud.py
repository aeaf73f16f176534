"""Create, read, update and delete through the typed client: versions, conflicts, generation,
generateName, the status split and deletion with finalizers and preconditions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fabric_dra_sim.kubeapi import KubeEmulator, StatusError


def untyped(api: Any) -> Any:
    """The typed client APIs take plain dicts at run time; their stubs only allow models."""
    return api


Builders = dict[str, Callable[..., dict[str, Any]]]


def body_of(err: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body or b"{}")
    return body


async def test_resource_slice_create_get_list_replace_delete(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    created = await api.create_resource_slice(builders["slice"]("s1"))
    assert created.metadata.uid
    assert created.metadata.generation == 1
    assert created.metadata.creation_timestamp is not None
    fetched = await api.read_resource_slice("s1")
    assert fetched.metadata.resource_version == created.metadata.resource_version
    listed = await api.list_resource_slice()
    assert [s.metadata.name for s in listed.items] == ["s1"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)
    fetched.spec.pool.generation = 1
    replaced = await api.replace_resource_slice("s1", fetched)
    assert replaced.spec.pool.generation == 1
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    deleted = await api.delete_resource_slice("s1")
    assert deleted.metadata.name == "s1"
    assert int(deleted.metadata.resource_version) > int(replaced.metadata.resource_version)
    with pytest.raises(ApiException) as caught:
        await api.read_resource_slice("s1")
    assert caught.value.status == 404
    assert body_of(caught.value)["reason"] == "NotFound"


async def test_claim_create_read_and_delete_in_a_namespace(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    claim = await api.create_namespaced_resource_claim("default", builders["claim"]())
    assert claim.metadata.namespace == "default"
    assert claim.status is None
    all_claims = await api.list_resource_claim_for_all_namespaces()
    assert [c.metadata.name for c in all_claims.items] == ["claim-a"]
    await api.delete_namespaced_resource_claim("claim-a", "default")
    assert (await api.list_namespaced_resource_claim("default")).items == []


async def test_create_in_a_missing_namespace_is_404(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    with pytest.raises(ApiException) as caught:
        await untyped(client.ResourceV1Api(api_client)).create_namespaced_resource_claim(
            "nowhere", builders["claim"](namespace="nowhere")
        )
    assert caught.value.status == 404
    assert body_of(caught.value)["details"]["kind"] == "namespaces"


async def test_create_with_a_resource_version_is_refused(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    body = builders["slice"]("s1")
    body["metadata"]["resourceVersion"] = "5"
    with pytest.raises(ApiException) as caught:
        await untyped(client.ResourceV1Api(api_client)).create_resource_slice(body)
    assert caught.value.status == 500
    assert "resourceVersion should not be set" in body_of(caught.value)["message"]


async def test_create_of_an_existing_name_is_409_already_exists(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await api.create_resource_slice(builders["slice"]("dup"))
    with pytest.raises(ApiException) as caught:
        await api.create_resource_slice(builders["slice"]("dup"))
    assert caught.value.status == 409
    assert body_of(caught.value)["reason"] == "AlreadyExists"


async def test_replace_with_a_stale_resource_version_is_409_conflict(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    first = await api.create_resource_slice(builders["slice"]("s1"))
    first.metadata.labels = {"a": "1"}
    await api.replace_resource_slice("s1", first)
    first.metadata.labels = {"a": "2"}
    with pytest.raises(ApiException) as caught:
        await api.replace_resource_slice("s1", first)
    assert caught.value.status == 409
    assert body_of(caught.value)["reason"] == "Conflict"
    assert "the object has been modified" in body_of(caught.value)["message"]


async def test_replace_without_resource_version_is_unconditional(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await api.create_resource_slice(builders["slice"]("s1"))
    body = builders["slice"]("s1")
    body["metadata"]["labels"] = {"x": "y"}
    replaced = await api.replace_resource_slice("s1", body)
    assert replaced.metadata.labels == {"x": "y"}


async def test_generation_bumps_on_spec_change_only(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    created = await api.create_resource_slice(builders["slice"]("s1"))
    created.metadata.labels = {"only": "metadata"}
    relabelled = await api.replace_resource_slice("s1", created)
    assert relabelled.metadata.generation == 1
    relabelled.spec.pool.generation = 5
    respecced = await api.replace_resource_slice("s1", relabelled)
    assert respecced.metadata.generation == 2


async def test_a_no_op_replace_keeps_the_resource_version(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    created = await api.create_resource_slice(builders["slice"]("s1"))
    again = await api.replace_resource_slice("s1", created)
    assert again.metadata.resource_version == created.metadata.resource_version


async def test_generate_name_appends_five_random_characters(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    body = builders["slice"]("")
    body["metadata"] = {"generateName": "0-fabric-"}
    names = {(await api.create_resource_slice(body)).metadata.name for _ in range(3)}
    assert len(names) == 3
    for name in names:
        assert name.startswith("0-fabric-")
        assert len(name) == len("0-fabric-") + 5


async def test_main_endpoint_ignores_status_and_status_endpoint_ignores_the_rest(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    body = builders["claim"]()
    body["status"] = {"allocation": builders["allocation"]()}
    claim = await api.create_namespaced_resource_claim("default", body)
    assert claim.status is None
    status_body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "claim-a", "namespace": "default", "labels": {"ignored": "yes"}},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": builders["allocation"]()},
    }
    updated = await api.replace_namespaced_resource_claim_status("claim-a", "default", status_body)
    assert updated.status.allocation.devices.results[0].device == "gpu-0"
    assert updated.metadata.labels is None
    assert updated.spec.devices.requests[0].name == "gpu"
    assert updated.metadata.generation == claim.metadata.generation
    main_body = api_client.sanitize_for_serialization(
        await api.read_namespaced_resource_claim("claim-a", "default")
    )
    main_body.pop("status")
    main_body["metadata"]["labels"] = {"kept": "yes"}
    after = await api.replace_namespaced_resource_claim("claim-a", "default", main_body)
    assert after.metadata.labels == {"kept": "yes"}
    assert after.status.allocation is not None


async def test_claim_spec_is_immutable(api_client: client.ApiClient, builders: Builders) -> None:
    api: Any = client.ResourceV1Api(api_client)
    claim = await api.create_namespaced_resource_claim("default", builders["claim"]())
    claim.spec.devices.requests[0].name = "other"
    with pytest.raises(ApiException) as caught:
        await api.replace_namespaced_resource_claim("claim-a", "default", claim)
    assert caught.value.status == 422
    assert body_of(caught.value)["details"]["causes"][0]["field"] == "spec"


async def test_finalizers_hold_deletion_until_the_last_is_removed(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    body = builders["claim"]()
    body["metadata"]["finalizers"] = ["fabric.example.com/a", "fabric.example.com/b"]
    await api.create_namespaced_resource_claim("default", body)
    marked = await api.delete_namespaced_resource_claim("claim-a", "default")
    assert marked.metadata is not None
    still = await api.read_namespaced_resource_claim("claim-a", "default")
    assert still.metadata.deletion_timestamp is not None
    # A second delete changes nothing.
    await api.delete_namespaced_resource_claim("claim-a", "default")
    with pytest.raises(ApiException) as caught:
        await api.patch_namespaced_resource_claim(
            "claim-a", "default", {"metadata": {"finalizers": ["fabric.example.com/new"]}}
        )
    assert caught.value.status == 422
    cause = body_of(caught.value)["details"]["causes"][0]
    assert cause["field"] == "metadata.finalizers"
    assert cause["reason"] == "FieldValueForbidden"
    assert '[]string{"fabric.example.com/new"}' in cause["message"]
    await api.patch_namespaced_resource_claim(
        "claim-a",
        "default",
        [{"op": "remove", "path": "/metadata/finalizers/0"}],
        _content_type="application/json-patch+json",
    )
    assert (await api.read_namespaced_resource_claim("claim-a", "default")).metadata.finalizers == [
        "fabric.example.com/b"
    ]
    await api.patch_namespaced_resource_claim(
        "claim-a",
        "default",
        [{"op": "remove", "path": "/metadata/finalizers"}],
        _content_type="application/json-patch+json",
    )
    with pytest.raises(ApiException) as caught:
        await api.read_namespaced_resource_claim("claim-a", "default")
    assert caught.value.status == 404


async def test_delete_preconditions_on_uid_and_resource_version(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    created = await api.create_resource_slice(builders["slice"]("s1"))
    for preconditions in (
        client.V1Preconditions(uid="not-the-uid"),
        client.V1Preconditions(resource_version="1"),
    ):
        with pytest.raises(ApiException) as caught:
            await api.delete_resource_slice(
                "s1", body=client.V1DeleteOptions(preconditions=preconditions)
            )
        assert caught.value.status == 409
        # k8s.io/apiserver pkg/registry/rest/delete.go BeforeDelete
        assert "in the precondition" in body_of(caught.value)["message"]
    await api.delete_resource_slice(
        "s1",
        body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(
                uid=created.metadata.uid, resource_version=created.metadata.resource_version
            )
        ),
    )
    assert (await api.list_resource_slice()).items == []


async def test_delete_collection_by_label(api_client: client.ApiClient, builders: Builders) -> None:
    api: Any = client.ResourceV1Api(api_client)
    for name, pool in (("a", "x"), ("b", "x"), ("c", "y")):
        body = builders["slice"](name)
        body["metadata"]["labels"] = {"pool": pool}
        await api.create_resource_slice(body)
    await api.delete_collection_resource_slice(label_selector="pool=x")
    assert [s.metadata.name for s in (await api.list_resource_slice()).items] == ["c"]


async def test_core_objects_nodes_pods_binding_leases_events(
    api_client: client.ApiClient,
) -> None:
    core: Any = client.CoreV1Api(api_client)
    await core.create_node({"metadata": {"name": "node-1", "labels": {"rack": "r1"}}})
    pod = await core.create_namespaced_pod(
        "default",
        {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
    )
    assert pod.status.phase == "Pending"
    # The server answers a binding with a Status, which the typed client cannot turn into a
    # V1Binding (as with a real API server): read the raw response.
    response = await core.create_namespaced_pod_binding(
        "p",
        "default",
        {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "node-1"}},
        _preload_content=False,
    )
    assert response.status == 201
    response.release()
    assert (await core.read_namespaced_pod("p", "default")).spec.node_name == "node-1"
    lease_api: Any = client.CoordinationV1Api(api_client)
    lease = await lease_api.create_namespaced_lease(
        "kube-system",
        {
            "metadata": {"name": "fabric-dra"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
        },
    )
    lease.spec.holder_identity = "b"
    assert (
        await lease_api.replace_namespaced_lease("fabric-dra", "kube-system", lease)
    ).spec.holder_identity == "b"
    events: Any = client.EventsV1Api(api_client)
    event = await events.create_namespaced_event(
        "default",
        {
            "metadata": {"generateName": "claim-a."},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "fabric.example.com/controller",
            "reportingInstance": "fabric-dra-0",
            "action": "Attach",
            "reason": "Attached",
            "type": "Normal",
            "note": "attached",
        },
    )
    assert event.metadata.name.startswith("claim-a.")
    namespaces = await core.list_namespace()
    assert {"default", "kube-system"} <= {n.metadata.name for n in namespaces.items}


async def test_deleting_a_namespace_deletes_its_objects(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    core: Any = client.CoreV1Api(api_client)
    await core.create_namespace({"metadata": {"name": "team"}})
    api: Any = client.ResourceV1Api(api_client)
    await api.create_namespaced_resource_claim("team", builders["claim"](namespace="team"))
    await core.delete_namespace("team")
    assert (await api.list_resource_claim_for_all_namespaces()).items == []


def test_direct_store_access_validates_and_round_trips(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    created = emulator.create(builders["claim"]())
    assert created["metadata"]["resourceVersion"]
    assert emulator.get("resource.k8s.io/v1", "ResourceClaim", "claim-a", "default") is not None
    assert emulator.get("resource.k8s.io/v1", "ResourceClaim", "nope", "default") is None
    created["status"] = {"allocation": builders["allocation"]()}
    updated = emulator.update_status(created)
    assert updated["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert len(emulator.list("resource.k8s.io/v1", "ResourceClaim", "default")) == 1
    emulator.delete("resource.k8s.io/v1", "ResourceClaim", "claim-a", "default")
    assert emulator.list("resource.k8s.io/v1", "ResourceClaim") == []
    with pytest.raises(StatusError) as caught:
        emulator.create(builders["slice"]("bad", driver="Not_A_Domain"))
    assert caught.value.code == 422


async def test_objects_are_one_storage_across_v1_v1beta2_and_v1beta1(
    builders: Builders,
) -> None:
    emu = KubeEmulator(served_resource_versions=("v1", "v1beta2", "v1beta1"))
    url = await emu.start()
    try:
        async with client.ApiClient(client.Configuration(host=url)) as api_client:
            v1: Any = client.ResourceV1Api(api_client)
            v1beta2: Any = client.ResourceV1beta2Api(api_client)
            v1beta1: Any = client.ResourceV1beta1Api(api_client)
            await v1beta2.create_resource_slice(
                builders["slice"]("s1", api_version="resource.k8s.io/v1beta2")
            )
            through_v1 = await v1.read_resource_slice("s1")
            assert through_v1.api_version == "resource.k8s.io/v1"
            assert [s.metadata.name for s in (await v1.list_resource_slice()).items] == ["s1"]
            through_v1beta1 = await v1beta1.read_resource_slice("s1")
            assert through_v1beta1.api_version == "resource.k8s.io/v1beta1"
            assert through_v1beta1.spec.devices[0].basic.attributes["model"].string == "a100"
            assert [s.metadata.name for s in (await v1beta1.list_resource_slice()).items] == ["s1"]
            # The name is taken in the group-resource whatever the version.
            with pytest.raises(ApiException) as caught:
                await v1beta1.create_resource_slice(
                    {
                        "apiVersion": "resource.k8s.io/v1beta1",
                        "kind": "ResourceSlice",
                        "metadata": {"name": "s1"},
                        "spec": {
                            "driver": "fabric.example.com",
                            "allNodes": True,
                            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
                        },
                    }
                )
            assert caught.value.status == 409
    finally:
        await emu.stop()
