"""Write mechanics over HTTP: DELETE answers per kind and case, dryRun on every verb, PUT name
checks, server-side apply against Update managers, field selector errors, generation per kind
and bearer token authentication.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fabric_dra_sim.kubeapi import KubeEmulator

Builders = dict[str, Callable[..., dict[str, Any]]]
RESOURCE = "/apis/resource.k8s.io/v1"
CLAIMS = f"{RESOURCE}/namespaces/default/resourceclaims"
SLICES = f"{RESOURCE}/resourceslices"
PODS = "/api/v1/namespaces/default/pods"
APPLY = "application/apply-patch+yaml"


async def _call(
    emulator: KubeEmulator,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            emulator.url + path,
            headers={"Content-Type": content_type, **(headers or {})},
            data=None if body is None else json.dumps(body),
        ) as response,
    ):
        return response.status, await response.json(content_type=None)


def _pod(name: str, node: str = "", **spec: Any) -> dict[str, Any]:
    body_spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}], **spec}
    if node:
        body_spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body_spec}


async def test_delete_held_by_finalizers_answers_200_with_the_marked_object(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    claim = builders["claim"]()
    claim["metadata"]["finalizers"] = ["fabric.example.com/cleanup"]
    await _call(emulator, "POST", CLAIMS, claim)
    status, body = await _call(emulator, "DELETE", f"{CLAIMS}/claim-a")
    assert status == 200
    assert body["kind"] == "ResourceClaim"
    assert body["metadata"]["deletionTimestamp"]
    assert body["metadata"]["deletionGracePeriodSeconds"] == 0
    # Already being deleted: the same answer, nothing written.
    again_status, again = await _call(emulator, "DELETE", f"{CLAIMS}/claim-a")
    assert again_status == 200
    assert again["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]
    # orphanDependents=false on an object that stays is the one 202.
    status, _ = await _call(emulator, "DELETE", f"{CLAIMS}/claim-a", {"orphanDependents": False})
    assert status == 202
    # A create under the held name says why it clashes.
    status, clash = await _call(emulator, "POST", CLAIMS, builders["claim"]())
    assert status == 409
    assert clash["message"].startswith("object is being deleted: ")


@pytest.mark.parametrize(
    ("path", "body", "answer"),
    [
        (SLICES, None, "ResourceSlice"),
        (
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "l1"},
                "spec": {"holderIdentity": "me"},
            },
            "Status",
        ),
        (
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "l1"}},
            "Namespace",
        ),
    ],
)
async def test_a_removal_answers_with_the_object_or_a_status_per_kind(
    emulator: KubeEmulator,
    builders: Builders,
    path: str,
    body: Any,
    answer: str,
) -> None:
    body = body or builders["slice"]("l1")
    created_status, _ = await _call(emulator, "POST", path, body)
    assert created_status == 201
    status, deleted = await _call(emulator, "DELETE", f"{path}/l1")
    assert status == 200
    assert deleted["kind"] == answer
    if answer == "Status":
        assert deleted["status"] == "Success"
        assert deleted["details"]["kind"] == "leases"
    if answer == "Namespace":
        assert deleted["status"]["phase"] == "Terminating"
        assert deleted["metadata"]["deletionTimestamp"]
    status, _ = await _call(emulator, "GET", f"{path}/l1")
    assert status == 404


async def test_graceful_pod_deletion_answers_200_with_the_terminating_pod(
    emulator: KubeEmulator,
) -> None:
    await _call(emulator, "POST", PODS, _pod("p1", node="n1", terminationGracePeriodSeconds=20))
    status, body = await _call(emulator, "DELETE", f"{PODS}/p1")
    assert status == 200
    assert body["kind"] == "Pod"
    assert body["metadata"]["deletionGracePeriodSeconds"] == 20
    assert body["metadata"]["deletionTimestamp"]
    # No kubelet has containers to stop here: the pod is gone at once.
    assert (await _call(emulator, "GET", f"{PODS}/p1"))[0] == 404


async def test_a_terminating_pod_with_a_finalizer_goes_when_the_finalizer_does(
    emulator: KubeEmulator,
) -> None:
    pod = _pod("p2", node="n1")
    pod["metadata"]["finalizers"] = ["example.com/keep"]
    await _call(emulator, "POST", PODS, pod)
    status, body = await _call(emulator, "DELETE", f"{PODS}/p2")
    assert status == 200
    assert body["metadata"]["deletionGracePeriodSeconds"] == 30
    status, kept = await _call(emulator, "GET", f"{PODS}/p2")
    assert status == 200
    assert kept["metadata"]["deletionGracePeriodSeconds"] == 0
    status, _ = await _call(
        emulator,
        "PATCH",
        f"{PODS}/p2",
        {"metadata": {"finalizers": None}},
        content_type="application/merge-patch+json",
    )
    assert status == 200
    assert (await _call(emulator, "GET", f"{PODS}/p2"))[0] == 404


async def test_dry_run_validates_and_stores_nothing_on_every_verb(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    status, created = await _call(emulator, "POST", f"{SLICES}?dryRun=All", builders["slice"]("s1"))
    assert status == 201 and created["metadata"]["uid"]
    assert (await _call(emulator, "GET", f"{SLICES}/s1"))[0] == 404
    bad = builders["slice"]("s1")
    bad["spec"]["driver"] = "Not A Driver"
    assert (await _call(emulator, "POST", f"{SLICES}?dryRun=All", bad))[0] == 422
    await _call(emulator, "POST", SLICES, builders["slice"]("s1"))
    _, stored = await _call(emulator, "GET", f"{SLICES}/s1")
    stored["metadata"]["labels"] = {"a": "b"}
    status, updated = await _call(emulator, "PUT", f"{SLICES}/s1?dryRun=All", stored)
    assert status == 200 and updated["metadata"]["labels"] == {"a": "b"}
    status, _ = await _call(
        emulator,
        "PATCH",
        f"{SLICES}/s1?dryRun=All",
        {"metadata": {"labels": {"c": "d"}}},
        content_type="application/merge-patch+json",
    )
    assert status == 200
    status, _ = await _call(
        emulator,
        "PATCH",
        f"{SLICES}/s1?dryRun=All&fieldManager=publisher&force=true",
        builders["slice"]("s1", devices=2),
        content_type=APPLY,
    )
    assert status == 200
    status, deleted = await _call(emulator, "DELETE", f"{SLICES}/s1?dryRun=All")
    assert status == 200 and deleted["kind"] == "ResourceSlice"
    status, now = await _call(emulator, "GET", f"{SLICES}/s1")
    assert status == 200
    assert now["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert "labels" not in now["metadata"]
    assert len(now["spec"]["devices"]) == 1


@pytest.mark.parametrize(
    ("method", "suffix", "kind"),
    [
        ("POST", "", "CreateOptions"),
        ("PUT", "/s1", "UpdateOptions"),
        ("PATCH", "/s1", "PatchOptions"),
        ("DELETE", "/s1", "DeleteOptions"),
    ],
)
async def test_an_unknown_dry_run_value_is_422_invalid(
    emulator: KubeEmulator,
    builders: Builders,
    method: str,
    suffix: str,
    kind: str,
) -> None:
    await _call(emulator, "POST", SLICES, builders["slice"]("s1"))
    body = {} if method == "PATCH" else builders["slice"]("s1") if method != "DELETE" else None
    status, answer = await _call(
        emulator,
        method,
        f"{SLICES}{suffix}?dryRun=yes",
        body,
        content_type="application/merge-patch+json" if method == "PATCH" else "application/json",
    )
    assert status == 422
    assert answer["message"] == (
        f'{kind}.meta.k8s.io "" is invalid: dryRun: Unsupported '
        'value: []string{"yes"}: supported values: "All"'
    )


async def test_a_put_without_a_name_is_400(emulator: KubeEmulator, builders: Builders) -> None:
    await _call(emulator, "POST", SLICES, builders["slice"]("s1"))
    nameless = builders["slice"]("s1")
    del nameless["metadata"]["name"]
    status, answer = await _call(emulator, "PUT", f"{SLICES}/s1", nameless)
    assert status == 400
    assert answer["message"] == (
        "the name of the object (s1 based on URL) was undeterminable: name must be provided"
    )
    status, answer = await _call(emulator, "PUT", f"{SLICES}/s1", builders["slice"]("s2"))
    assert status == 400
    assert answer["message"] == (
        "the name of the object (s2) does not match the name on the URL (s1)"
    )


async def test_apply_conflicts_with_a_put_writer_until_forced(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await api.create_resource_slice(builders["slice"]("s1"), field_manager="installer")
    changed = builders["slice"]("s1")
    changed["spec"]["pool"]["generation"] = 4
    with pytest.raises(ApiException) as caught:
        await api.patch_resource_slice(
            "s1", changed, field_manager="publisher", _content_type=APPLY
        )
    assert caught.value.status == 409
    answer = json.loads(caught.value.body)
    assert answer["message"] == (
        'Apply failed with 1 conflict: conflict with "installer" '
        "using resource.k8s.io/v1: .spec.pool.generation"
    )
    assert answer["details"]["causes"][0]["reason"] == "FieldManagerConflict"
    forced = await api.patch_resource_slice(
        "s1", changed, field_manager="publisher", force=True, _content_type=APPLY
    )
    assert forced.spec.pool.generation == 4
    owners = {(e.manager, e.operation) for e in forced.metadata.managed_fields}
    assert owners == {("installer", "Update"), ("publisher", "Apply")}
    # The installer lost .spec.pool.generation: its next update is recorded, no conflict.
    assert "f:generation" not in json.dumps(
        next(e.fields_v1 for e in forced.metadata.managed_fields if e.manager == "installer")
    )


async def test_unsupported_field_selectors_are_400(emulator: KubeEmulator) -> None:
    status, answer = await _call(emulator, "GET", f"{SLICES}?fieldSelector=spec.pool.name%3Dx")
    assert status == 400
    assert answer["message"] == (
        "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: spec.pool.name"
    )
    status, answer = await _call(emulator, "GET", f"{CLAIMS}?fieldSelector=status.x%3Dy")
    assert status == 400
    assert answer["message"] == (
        '"status.x" is not a known field selector: only "metadata.name", "metadata.namespace"'
    )
    status, _ = await _call(emulator, "GET", f"{PODS}?fieldSelector=spec.host%3Dn1")
    assert status == 200


async def test_claims_carry_no_generation_and_classes_do(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    _, claim = await _call(emulator, "POST", CLAIMS, builders["claim"]())
    assert "generation" not in claim["metadata"]
    _, device_class = await _call(
        emulator,
        "POST",
        f"{RESOURCE}/deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu"},
            "spec": {},
        },
    )
    assert device_class["metadata"]["generation"] == 1


async def test_an_unknown_bearer_token_is_401_when_only_user_tokens_are_set() -> None:
    emu = KubeEmulator(tokens={"user-token": "system:serviceaccount:fabric-dra:fabric-dra"})
    await emu.start()
    try:
        status, answer = await _call(
            emu, "GET", SLICES, headers={"Authorization": "Bearer guessed"}
        )
        assert status == 401 and answer["reason"] == "Unauthorized"
        assert (await _call(emu, "GET", SLICES, headers={"Authorization": "Bearer user-token"}))[
            0
        ] == 200
    finally:
        await emu.stop()
