"""Discovery documents of the emulator, read through the typed kubernetes-asyncio APIs."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fabric_dra_sim.kubeapi import KubeEmulator


def untyped(api: Any) -> Any:
    """The typed client APIs take plain dicts at run time; their stubs only allow models."""
    return api


@pytest.mark.parametrize(
    ("kubernetes_version", "versions"),
    [
        ("1.34", ("v1",)),
        ("1.34", ("v1beta2", "v1beta1")),
        ("1.35", ("v1beta1",)),
        ("1.31", ("v1alpha3",)),
        ("1.37", ("v1", "v1beta2", "v1beta1")),
    ],
)
async def test_served_resource_versions_are_discovered_with_the_first_preferred(
    kubernetes_version: str,
    versions: tuple[str, ...],
) -> None:
    emu = KubeEmulator(kubernetes_version=kubernetes_version, served_resource_versions=versions)
    url = await emu.start()
    try:
        async with client.ApiClient(client.Configuration(host=url)) as api:
            groups = await untyped(client.ApisApi(api)).get_api_versions()
            resource = next(g for g in groups.groups if g.name == "resource.k8s.io")
            assert [v.version for v in resource.versions] == list(versions)
            assert resource.preferred_version.version == versions[0]
            names = {g.name for g in groups.groups}
            assert {"events.k8s.io", "coordination.k8s.io"} <= names
            group = await untyped(client.ResourceApi(api)).get_api_group()
            assert group.preferred_version.group_version == f"resource.k8s.io/{versions[0]}"
    finally:
        await emu.stop()


async def test_v1_resource_list_has_verbs_scope_kinds_and_the_status_subresource(
    api_client: client.ApiClient,
) -> None:
    resources = await untyped(client.ResourceV1Api(api_client)).get_api_resources()
    by_name = {r.name: r for r in resources.resources}
    assert set(by_name) == {
        "resourceslices",
        "resourceclaims",
        "resourceclaims/status",
        "deviceclasses",
        "resourceclaimtemplates",
    }
    assert by_name["resourceslices"].namespaced is False
    assert by_name["resourceclaims"].namespaced is True
    assert by_name["resourceclaims"].kind == "ResourceClaim"
    assert "watch" in by_name["resourceslices"].verbs
    assert by_name["resourceclaims/status"].verbs == ["get", "patch", "update"]


async def test_v1alpha3_serves_pod_scheduling_contexts_with_status() -> None:
    emu = KubeEmulator(kubernetes_version="1.31")
    url = await emu.start()
    try:
        async with client.ApiClient(client.Configuration(host=url)) as api:
            resources = await untyped(client.ResourceV1alpha3Api(api)).get_api_resources()
            names = {r.name for r in resources.resources}
            assert {"podschedulingcontexts", "podschedulingcontexts/status"} <= names
    finally:
        await emu.stop()


async def test_core_and_coordination_discovery_and_version(api_client: client.ApiClient) -> None:
    core = await untyped(client.CoreV1Api(api_client)).get_api_resources()
    names = {r.name for r in core.resources}
    assert {"nodes", "pods", "pods/status", "pods/binding", "namespaces", "events"} <= names
    versions = await untyped(client.CoreApi(api_client)).get_api_versions()
    assert versions.versions == ["v1"]
    leases = await untyped(client.CoordinationV1Api(api_client)).get_api_resources()
    assert [r.name for r in leases.resources] == ["leases"]
    info = await untyped(client.VersionApi(api_client)).get_code()
    assert info.git_version == "v1.34.0"
    assert (info.major, info.minor) == ("1", "34")


@pytest.mark.parametrize(
    ("given", "git_version", "minor"),
    [
        ({"kubernetes_version": "v1.31.4"}, "v1.31.4", "31"),
        ({"kubernetes_version": "1.36"}, "v1.36.0", "36"),
        ({"kubernetes_version": "v1.37"}, "v1.37.0", "37"),
        ({"git_version": "v1.35.1"}, "v1.35.1", "35"),
    ],
)
async def test_the_kubernetes_version_is_what_version_reports(
    given: dict[str, str],
    git_version: str,
    minor: str,
) -> None:
    emu = KubeEmulator(**given)  # type: ignore[arg-type]
    url = await emu.start()
    try:
        async with client.ApiClient(client.Configuration(host=url)) as api:
            info = await untyped(client.VersionApi(api)).get_code()
            assert (info.git_version, info.major, info.minor) == (git_version, "1", minor)
    finally:
        await emu.stop()


async def test_an_unserved_version_is_404(api_client: client.ApiClient) -> None:
    with pytest.raises(ApiException) as caught:
        await untyped(client.ResourceV1beta1Api(api_client)).get_api_resources()
    assert caught.value.status == 404
    with pytest.raises(ApiException) as caught:
        await untyped(client.ResourceV1beta1Api(api_client)).list_resource_slice()
    assert caught.value.status == 404


def test_an_unknown_resource_version_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("cannot serve resource.k8s.io v2")):
        KubeEmulator(served_resource_versions=("v2",))


def test_versions_no_release_serves_together_are_refused() -> None:
    # v1 (1.34+) and the classic-DRA v1alpha3 (1.31) never share a cluster.
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Kubernetes 1.34 cannot serve resource.k8s.io v1alpha3; it serves v1, v1beta2, v1beta1"
        ),
    ):
        KubeEmulator(served_resource_versions=("v1", "v1alpha3"))
    with pytest.raises(
        ValueError, match=re.escape("Kubernetes 1.31 cannot serve resource.k8s.io v1")
    ):
        KubeEmulator(kubernetes_version="1.31", served_resource_versions=("v1",))
