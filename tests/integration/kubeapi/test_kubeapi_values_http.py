"""Decoded values and defaults over HTTP: what the real client reads back after a write, and
the 400 a value the Go decoder refuses gets."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on
from fabric_dra_sim.kubeapi.errors import StatusError

Builders = dict[str, Callable[..., dict[str, Any]]]


def untyped(api: Any) -> Any:
    """The typed client APIs take plain dicts at run time; their stubs only allow models."""
    return api


async def raw(call: Any) -> dict[str, Any]:
    response = await call
    body: dict[str, Any] = json.loads(await response.read())
    return body


async def test_quantities_are_answered_and_stored_canonical(
    api_client: client.ApiClient, builders: Builders
) -> None:
    api = untyped(client.ResourceV1Api(api_client))
    body = builders["slice"]()
    body["spec"]["devices"][0]["capacity"] = {
        "memory": {"value": "1024Mi"},
        "cores": {"value": "1000m"},
        "share": {"value": "1500m"},
    }
    created = await raw(api.create_resource_slice(body, _preload_content=False))
    assert created["spec"]["devices"][0]["capacity"] == {
        "memory": {"value": "1Gi"},
        "cores": {"value": "1"},
        "share": {"value": "1500m"},
    }
    read = await raw(api.read_resource_slice("slice-a", _preload_content=False))
    assert read["spec"]["devices"][0]["capacity"] == created["spec"]["devices"][0]["capacity"]


async def test_a_malformed_quantity_is_400_with_the_decoder_message(
    api_client: client.ApiClient, builders: Builders
) -> None:
    api = untyped(client.ResourceV1Api(api_client))
    body = builders["slice"]()
    body["spec"]["devices"][0]["capacity"] = {"memory": {"value": "16GB"}}
    with pytest.raises(ApiException) as caught:
        await api.create_resource_slice(body)
    assert caught.value.status == 400
    status = json.loads(caught.value.body)
    assert status["reason"] == "BadRequest"
    assert status["message"] == (
        'ResourceSlice in version "v1" cannot be handled as a ResourceSlice: quantities must '
        "match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )


async def test_an_int64_out_of_range_is_400(
    api_client: client.ApiClient, builders: Builders
) -> None:
    api = untyped(client.ResourceV1Api(api_client))
    body = builders["slice"]()
    body["spec"]["pool"]["resourceSliceCount"] = 2**63
    with pytest.raises(ApiException) as caught:
        await api.create_resource_slice(body)
    assert caught.value.status == 400
    assert "ResourcePool.spec.pool.resourceSliceCount of type int64" in caught.value.body


async def test_taints_get_a_time_on_create_and_a_new_one_when_an_update_omits_it(
    emulator: KubeEmulator, api_client: client.ApiClient, builders: Builders
) -> None:
    api = untyped(client.ResourceV1Api(api_client))
    body = builders["slice"]()
    body["spec"]["devices"][0]["taints"] = [
        {"key": "d.example.com/unhealthy", "effect": "NoSchedule"}
    ]
    created = await raw(api.create_resource_slice(body, _preload_content=False))
    taint = created["spec"]["devices"][0]["taints"][0]
    assert taint["timeAdded"].endswith("Z") and len(taint["timeAdded"]) == 20
    # Sent back with the time it has: unchanged, nothing written.
    same = await raw(api.replace_resource_slice("slice-a", created, _preload_content=False))
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    # Sent without it: defaulting has no view of the stored object and stamps it again.
    created["spec"]["devices"][0]["taints"][0].pop("timeAdded")
    stamped = await raw(api.replace_resource_slice("slice-a", created, _preload_content=False))
    assert stamped["spec"]["devices"][0]["taints"][0]["timeAdded"].endswith("Z")


async def test_claims_are_answered_with_their_defaults(
    api_client: client.ApiClient, builders: Builders
) -> None:
    api = untyped(client.ResourceV1Api(api_client))
    created = await raw(
        api.create_namespaced_resource_claim("default", builders["claim"](), _preload_content=False)
    )
    exact = created["spec"]["devices"]["requests"][0]["exactly"]
    assert (exact["allocationMode"], exact["count"]) == ("ExactCount", 1)


async def test_claim_condition_times_come_back_in_utc_whole_seconds(
    api_client: client.ApiClient, builders: Builders
) -> None:
    api = untyped(client.ResourceV1Api(api_client))
    claim = await raw(
        api.create_namespaced_resource_claim("default", builders["claim"](), _preload_content=False)
    )
    claim["status"] = {
        "allocation": {
            **builders["allocation"](),
            "allocationTimestamp": "2026-01-01T01:00:00.5+01:00",
        }
    }
    written = await raw(
        api.replace_namespaced_resource_claim_status(
            "claim-a", "default", claim, _preload_content=False
        )
    )
    assert written["status"]["allocation"]["allocationTimestamp"] == "2026-01-01T00:00:00Z"


async def test_lease_micro_times_need_six_fraction_digits(api_client: client.ApiClient) -> None:
    api = untyped(client.CoordinationV1Api(api_client))
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l", "namespace": "default"},
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "renewTime": "2026-01-02T03:04:05+00:00",
        },
    }
    with pytest.raises(ApiException) as caught:
        await api.create_namespaced_lease("default", lease)
    assert caught.value.status == 400
    assert json.loads(caught.value.body)["message"] == (
        'Lease in version "v1" cannot be handled as a Lease: parsing time '
        '"2026-01-02T03:04:05+00:00" as "2006-01-02T15:04:05.000000Z07:00": cannot parse '
        '"+00:00" as ".000000"'
    )
    lease["spec"]["renewTime"] = "2026-01-02T04:04:05.000000+01:00"
    created = await raw(api.create_namespaced_lease("default", lease, _preload_content=False))
    assert created["spec"]["renewTime"] == "2026-01-02T03:04:05.000000Z"


async def test_lease_durations_are_int32(api_client: client.ApiClient) -> None:
    api = untyped(client.CoordinationV1Api(api_client))
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l", "namespace": "default"},
        "spec": {"leaseDurationSeconds": 2**31},
    }
    with pytest.raises(ApiException) as caught:
        await api.create_namespaced_lease("default", lease)
    assert caught.value.status == 400
    assert (
        "json: cannot unmarshal number 2147483648 into Go struct field "
        "LeaseSpec.spec.leaseDurationSeconds of type int32"
    ) in caught.value.body


@pytest.fixture
async def unvalidated() -> AsyncIterator[KubeEmulator]:
    emu = KubeEmulator(
        kubernetes_version="1.34", feature_gates=all_gates_on("1.34"), validate=False
    )
    await emu.start()
    try:
        yield emu
    finally:
        await emu.stop()


async def test_values_are_decoded_and_defaulted_without_validation(
    unvalidated: KubeEmulator, builders: Builders
) -> None:
    body = builders["slice"]()
    body["spec"]["devices"][0]["capacity"] = {"memory": {"value": "2048Mi"}}
    body["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    created = unvalidated.create(body)
    device = created["spec"]["devices"][0]
    assert device["capacity"]["memory"]["value"] == "2Gi"
    assert "timeAdded" in device["taints"][0]
    body["metadata"]["name"] = "slice-b"
    body["spec"]["devices"][0]["capacity"] = {"memory": {"value": "1.5.5"}}
    with pytest.raises(StatusError) as caught:
        unvalidated.create(body)
    assert caught.value.code == 400
