"""The write rules over HTTP: the 422 answers a real kube-apiserver gives for bad node
selectors, CEL selectors, admin access, claim status and Leases, and what the controller does
with them (the publisher with a bad node label key).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pydantic
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from app.config import NodeLabelSettings
from app.fabric.types import Location
from app.kube.client import KubeAuthMode, KubeClientSettings, connect
from app.kube.informer import InformerSettings
from app.kube.versions import ResourceApiVersion
from app.pools import PoolConfig, PoolDevice, desired_pools
from app.publisher.publisher import Publisher
from app.publisher.settings import PublisherSettings
from fabric_dra_sim.kubeapi import KubeEmulator

DRIVER = "fabric.example.com"


def causes_of(err: ApiException) -> list[dict[str, str]]:
    body: dict[str, Any] = json.loads(err.body or b"{}")
    assert body["kind"] == "Status" and body["reason"] == "Invalid"
    causes: list[dict[str, str]] = body["details"]["causes"]
    return causes


async def test_a_slice_with_an_invalid_node_selector_key_is_422(
    api_client: client.ApiClient,
    builders: dict[str, Any],
) -> None:
    body = builders["slice"](
        "s1",
        nodeSelector={
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "rack label", "operator": "In", "values": ["r1"]}]}
            ]
        },
    )
    with pytest.raises(ApiException) as caught:
        await client.ResourceV1Api(api_client).create_resource_slice(body)
    assert caught.value.status == 422
    assert [c["field"] for c in causes_of(caught.value)] == [
        "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].key"
    ]


async def test_a_device_class_with_a_cel_syntax_error_is_422_with_the_compiler_message(
    api_client: client.ApiClient,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    with pytest.raises(ApiException) as caught:
        await api.create_device_class(
            {
                "metadata": {"name": "gpu"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]},
            }
        )
    assert caught.value.status == 422
    (cause,) = causes_of(caught.value)
    assert cause["field"] == "spec.selectors[0].cel.expression"
    assert "Syntax error" in cause["message"]
    created = await api.create_device_class(
        {
            "metadata": {"name": "gpu"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    assert created.metadata.name == "gpu"


async def test_a_claim_with_all_mode_and_a_count_is_422(api_client: client.ApiClient) -> None:
    with pytest.raises(ApiException) as caught:
        await client.ResourceV1Api(api_client).create_namespaced_resource_claim(
            "default",
            {
                "metadata": {"name": "c"},
                "spec": {
                    "devices": {
                        "requests": [  # type: ignore[arg-type]
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": "gpu",
                                    "allocationMode": "All",
                                    "count": 2,
                                },
                            }
                        ]
                    }
                },
            },
        )
    assert [c["field"] for c in causes_of(caught.value)] == [
        "spec.devices.requests[0].exactly.count"
    ]


async def test_an_allocation_must_name_a_request_of_the_claim(
    api_client: client.ApiClient,
    builders: dict[str, Any],
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await api.create_namespaced_resource_claim("default", builders["claim"]())
    allocation = builders["allocation"]()
    allocation["devices"]["results"][0]["request"] = "nic"
    allocation["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.labels", "operator": "In", "values": ["n1"]}]}
        ]
    }
    with pytest.raises(ApiException) as caught:
        await api.patch_namespaced_resource_claim_status(
            "claim-a",
            "default",
            {"status": {"allocation": allocation}},
            _content_type="application/merge-patch+json",
        )
    assert [c["field"] for c in causes_of(caught.value)] == [
        "status.allocation.devices.results[0].request",
        "status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].key",
    ]


async def test_admin_access_needs_the_namespace_label() -> None:
    emu = KubeEmulator(feature_gates={"DRAAdminAccess": True})
    await emu.start()
    claim: dict[str, Any] = {
        "metadata": {"name": "c"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu", "adminAccess": True}}
                ]
            }
        },
    }
    try:
        async with client.ApiClient(client.Configuration(host=emu.url)) as api_client:
            api: Any = client.ResourceV1Api(api_client)
            with pytest.raises(ApiException) as caught:
                await api.create_namespaced_resource_claim("default", claim)
            assert [c["field"] for c in causes_of(caught.value)] == [
                "spec.devices.requests[0].exactly.adminAccess"
            ]
            await client.CoreV1Api(api_client).create_namespace(
                {
                    "metadata": {  # type: ignore[arg-type]
                        "name": "admin",
                        "labels": {"resource.kubernetes.io/admin-access": "true"},
                    }
                }
            )
            created = await api.create_namespaced_resource_claim("admin", claim)
            assert created.spec.devices.requests[0].exactly.admin_access is True
    finally:
        await emu.stop()


async def test_lease_rules(api_client: client.ApiClient) -> None:
    api: Any = client.CoordinationV1Api(api_client)
    with pytest.raises(ApiException) as caught:
        await api.create_namespaced_lease(
            "default",
            {
                "metadata": {"name": "l"},
                "spec": {"holderIdentity": "me", "leaseDurationSeconds": 0},
            },
        )
    assert [c["field"] for c in causes_of(caught.value)] == ["spec.leaseDurationSeconds"]
    lease = await api.create_namespaced_lease(
        "default",
        {
            "metadata": {"name": "l"},
            "spec": {"holderIdentity": "any holder at all", "leaseDurationSeconds": 15},
        },
    )
    lease.spec.lease_transitions = -1
    with pytest.raises(ApiException) as caught:
        await api.replace_namespaced_lease("l", "default", lease)
    assert [c["field"] for c in causes_of(caught.value)] == ["spec.leaseTransitions"]


async def test_classic_deallocation_needs_an_allocation() -> None:
    emu = KubeEmulator(kubernetes_version="1.31")
    await emu.start()
    group, version = "resource.k8s.io", "v1alpha3"
    try:
        async with client.ApiClient(client.Configuration(host=emu.url)) as api_client:
            api: Any = client.CustomObjectsApi(api_client)
            await api.create_namespaced_custom_object(
                group,
                version,
                "default",
                "resourceclaims",
                {
                    "apiVersion": f"{group}/{version}",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "c"},
                    "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu"}]}},
                },
            )
            with pytest.raises(ApiException) as caught:
                await api.patch_namespaced_custom_object_status(
                    group,
                    version,
                    "default",
                    "resourceclaims",
                    "c",
                    {"status": {"deallocationRequested": True}},
                    _content_type="application/merge-patch+json",
                )
            assert [c["field"] for c in causes_of(caught.value)] == ["status"]
    finally:
        await emu.stop()


# -- the controller against the stricter rules ---------------------------------------------------
def _gpus(count: int) -> list[PoolDevice]:
    return [
        PoolDevice(
            name=f"gpu-{i}",
            device_type="gpu",
            location=Location(region="us-east", rack="rack-1"),
            vendor="Example",
            model="X100",
            memory_mib=1024,
            health="OK",
        )
        for i in range(count)
    ]


@contextlib.asynccontextmanager
async def _publisher(url: str) -> AsyncIterator[Publisher]:
    kube = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=url))
    settings = PublisherSettings(
        debounce_s=0.01,
        workers=2,
        retry_base_s=0.02,
        retry_max_s=0.2,
        request_timeout_s=5.0,
        informer=InformerSettings(
            name="resourceslices",
            watch_timeout_s=5.0,
            watch_timeout_jitter=0.2,
            client_timeout_margin_s=2.0,
            list_timeout_s=5.0,
            backoff_initial_s=0.02,
            backoff_max_s=0.1,
        ),
    )
    publisher = Publisher(kube, ResourceApiVersion.V1, DRIVER, settings, None)
    await publisher.start()
    try:
        yield publisher
    finally:
        await publisher.stop()
        await kube.close()


async def test_a_bad_node_label_key_is_the_real_422_and_is_reported_not_retried(
    emulator: KubeEmulator,
) -> None:
    config = PoolConfig(driver_name=DRIVER, node_labels={"rack": "rack label"})
    desired = desired_pools(_gpus(3), config)
    async with _publisher(emulator.url) as publisher:
        publisher.set_desired(desired)
        await publisher.wait_idle(20)
        publisher.resync_all()
        await publisher.wait_idle(20)
        error = publisher.status().pools["us-east/rack-1"].last_error
        assert error is not None
        assert "HTTP 422 Invalid" in error
        assert "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[1].key" in error
        # Permanent: one attempt per sync, no retry loop, nothing stored.
        posts = [r for r in emulator.writes("resourceslices") if r.method == "POST"]
        assert len(posts) == 2
        assert emulator.list("resource.k8s.io/v1", "ResourceSlice") == []


def test_the_settings_refuse_a_bad_node_label_key_before_anything_is_written() -> None:
    with pytest.raises(pydantic.ValidationError, match="label key"):
        NodeLabelSettings(rack="rack label")


async def test_a_v1alpha3_device_without_basic_is_422() -> None:
    emu = KubeEmulator(kubernetes_version="1.31")
    await emu.start()
    try:
        async with client.ApiClient(client.Configuration(host=emu.url)) as api_client:
            api: Any = client.CustomObjectsApi(api_client)
            with pytest.raises(ApiException) as caught:
                await api.create_cluster_custom_object(
                    "resource.k8s.io",
                    "v1alpha3",
                    "resourceslices",
                    {
                        "apiVersion": "resource.k8s.io/v1alpha3",
                        "kind": "ResourceSlice",
                        "metadata": {"name": "s"},
                        "spec": {
                            "driver": DRIVER,
                            "nodeName": "n1",
                            "devices": [{"name": "d0"}],
                            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
                        },
                    },
                )
            assert caught.value.status == 422
            assert [c["field"] for c in causes_of(caught.value)] == ["spec.devices[0].basic"]
    finally:
        await emu.stop()


async def test_an_uppercase_driver_name_is_accepted_with_a_warning_header(
    emulator: KubeEmulator,
    builders: dict[str, Any],
) -> None:
    body = builders["slice"]("s1", driver="Fabric.Example.com")
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{emulator.url}/apis/resource.k8s.io/v1/resourceslices", json=body) as resp,
    ):
        assert resp.status == 201
        warnings = resp.headers.getall("Warning", [])
    assert warnings == [
        '299 - "spec.driver: driver names should be lowercase; '
        '\\"Fabric.Example.com\\" contains uppercase characters"'
    ]
