"""RBAC in the Kubernetes API emulator, driven by the real client: the controller's service
account may do exactly what deploy/base/rbac.yaml (and deploy/controlplane/rbac.yaml) grant,
and gets the API server's 403 Forbidden for anything else, while the admin stays
unrestricted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fabric_dra_sim.kubeapi import KubeEmulator, RbacPolicy
from fabric_dra_sim.kubeapi import cli as kube_cli

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BASE_RBAC = DEPLOY / "base" / "rbac.yaml"
CONTROLPLANE_RBAC = DEPLOY / "controlplane" / "rbac.yaml"
SA = "system:serviceaccount:fabric-dra:fabric-dra"
SA_TOKEN = "controller-token"
ADMIN_TOKEN = "admin-token"
DRIVER = "fabric.example.com"


def _config(url: str, token: str) -> client.Configuration:
    return client.Configuration(
        host=url, api_key={"BearerToken": token}, api_key_prefix={"BearerToken": "Bearer"}
    )


def _slice(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "allNodes": True,
            "pool": {"name": "us-east/rack-01", "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def _claim(name: str, api_version: str = "resource.k8s.io/v1") -> dict[str, Any]:
    request: dict[str, Any] = (
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.fabric.example.com"}}
        if api_version == "resource.k8s.io/v1"
        else {"name": "gpu", "deviceClassName": "gpu.fabric.example.com"}
    )
    spec: dict[str, Any] = {"devices": {"requests": [request]}}
    if api_version.endswith("v1alpha3"):
        spec["controller"] = DRIVER
    return {
        "apiVersion": api_version,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


async def _forbidden(call: Any) -> dict[str, Any]:
    """Await ``call`` expecting 403; return the Status body."""
    with pytest.raises(ApiException) as caught:
        await call
    assert caught.value.status == 403, caught.value.body
    body: dict[str, Any] = json.loads(caught.value.body or b"{}")
    assert (body["kind"], body["status"], body["reason"], body["code"]) == (
        "Status",
        "Failure",
        "Forbidden",
        403,
    )
    return body


class Cluster:
    """An emulator with RBAC, plus an admin client and a client acting as the controller."""

    def __init__(
        self, emulator: KubeEmulator, admin: client.ApiClient, controller: client.ApiClient
    ) -> None:
        self.emulator = emulator
        self.admin = admin
        self.controller = controller


@contextlib.asynccontextmanager
async def _cluster(
    manifests: list[Path], versions: tuple[str, ...] = ("v1",), git_version: str = "v1.34.0"
) -> AsyncIterator[Cluster]:
    emulator = KubeEmulator(
        served_resource_versions=versions,
        git_version=git_version,
        token=ADMIN_TOKEN,
        tokens={SA_TOKEN: SA},
        rbac=RbacPolicy.from_manifests(manifests),
    )
    url = await emulator.start()
    try:
        async with (
            client.ApiClient(_config(url, ADMIN_TOKEN)) as admin,
            client.ApiClient(_config(url, SA_TOKEN)) as controller,
        ):
            yield Cluster(emulator, admin, controller)
    finally:
        await emulator.stop()


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    """resource.k8s.io/v1 with the structured-mode RBAC of deploy/base/rbac.yaml."""
    async with _cluster([BASE_RBAC]) as value:
        yield value


async def test_the_controller_publishes_resource_slices_but_may_not_patch_them(
    cluster: Cluster,
) -> None:
    api: Any = client.ResourceV1Api(cluster.controller)
    created = await api.create_resource_slice(_slice("s1"))
    fetched = await api.read_resource_slice("s1")
    assert [s.metadata.name for s in (await api.list_resource_slice()).items] == ["s1"]
    fetched.spec.pool.generation = 1
    replaced = await api.replace_resource_slice("s1", fetched)
    assert replaced.metadata.resource_version != created.metadata.resource_version
    body = await _forbidden(api.patch_resource_slice("s1", {"metadata": {"labels": {"a": "b"}}}))
    assert body["message"] == (
        'resourceslices.resource.k8s.io "s1" is forbidden: User "system:serviceaccount:'
        'fabric-dra:fabric-dra" cannot patch resource "resourceslices" in API group '
        '"resource.k8s.io" at the cluster scope'
    )
    assert body["details"] == {"name": "s1", "group": "resource.k8s.io", "kind": "resourceslices"}
    await _forbidden(api.delete_collection_resource_slice())
    await api.delete_resource_slice("s1")
    assert cluster.emulator.list("resource.k8s.io/v1", "ResourceSlice") == []


async def test_the_controller_reads_claims_and_writes_only_their_status(
    cluster: Cluster,
) -> None:
    cluster.emulator.create(_claim("c1"))
    api: Any = client.ResourceV1Api(cluster.controller)
    claim = await api.read_namespaced_resource_claim("c1", "default")
    assert [
        c.metadata.name for c in (await api.list_resource_claim_for_all_namespaces()).items
    ] == ["c1"]
    assert len((await api.list_namespaced_resource_claim("default")).items) == 1
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {SA_TOKEN}"}) as session,
        session.get(
            f"{cluster.emulator.url}/apis/resource.k8s.io/v1/resourceclaims",
            params={"watch": "true", "timeoutSeconds": "1"},
        ) as response,
    ):
        assert response.status == 200
        first = json.loads(await response.content.readline())
        assert first["type"] == "ADDED"
    patched = await api.patch_namespaced_resource_claim_status(
        "c1", "default", {"metadata": {"annotations": {"seen": "yes"}}}
    )
    assert patched.metadata.name == "c1"
    replaced = await api.replace_namespaced_resource_claim_status("c1", "default", patched)
    assert replaced.metadata.name == "c1"
    # Finalizers and allocation on the main resource are control-plane mode only.
    claim.metadata.finalizers = [f"{DRIVER}/deletion-protection"]
    await _forbidden(api.replace_namespaced_resource_claim("c1", "default", claim))
    body = await _forbidden(api.delete_namespaced_resource_claim("c1", "default"))
    assert body["message"].endswith(
        'cannot delete resource "resourceclaims" in API group "resource.k8s.io" in the '
        'namespace "default"'
    )
    await _forbidden(api.create_namespaced_resource_claim("default", _claim("c2")))
    assert cluster.emulator.get("resource.k8s.io/v1", "ResourceClaim", "c1", "default")


async def test_the_controller_reads_device_classes_nodes_and_pods_only(
    cluster: Cluster,
) -> None:
    admin_core: Any = client.CoreV1Api(cluster.admin)
    await admin_core.create_node({"metadata": {"name": "n1"}})
    await admin_core.create_namespaced_pod("default", _pod("p1"))
    cluster.emulator.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.fabric.example.com"},
            "spec": {},
        }
    )
    resource: Any = client.ResourceV1Api(cluster.controller)
    core: Any = client.CoreV1Api(cluster.controller)
    assert (await resource.read_device_class("gpu.fabric.example.com")).metadata.name
    assert len((await resource.list_device_class()).items) == 1
    await _forbidden(resource.create_device_class({"metadata": {"name": "x"}, "spec": {}}))
    assert (await core.read_node("n1")).metadata.name == "n1"
    assert len((await core.list_node()).items) == 1
    body = await _forbidden(core.create_node({"metadata": {"name": "n2"}}))
    assert body["message"] == (
        'nodes is forbidden: User "system:serviceaccount:fabric-dra:fabric-dra" cannot '
        'create resource "nodes" in API group "" at the cluster scope'
    )
    await _forbidden(core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}}))
    assert (await core.read_namespaced_pod("p1", "default")).metadata.name == "p1"
    assert len((await core.list_pod_for_all_namespaces()).items) == 1
    await _forbidden(core.delete_namespaced_pod("p1", "default"))
    await _forbidden(core.list_namespaced_secret("fabric-dra"))


async def test_the_controller_reports_events_in_both_groups(cluster: Cluster) -> None:
    core: Any = client.CoreV1Api(cluster.controller)
    regarding = {
        "kind": "ResourceClaim",
        "name": "c1",
        "namespace": "default",
        "apiVersion": "resource.k8s.io/v1",
    }
    created = await core.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "c1.attach"},
            "involvedObject": regarding,
            "reason": "Attached",
            "message": "attached gpu-0",
            "type": "Normal",
        },
    )
    await core.patch_namespaced_event("c1.attach", "default", {"count": 2})
    assert created.metadata.name == "c1.attach"
    # Listed and watched (the node plugin's reports, app/claims/nodereports.py), never read
    # one by one; events.k8s.io is only written.
    assert [e.metadata.name for e in (await core.list_event_for_all_namespaces()).items] == [
        "c1.attach"
    ]
    await _forbidden(core.read_namespaced_event("c1.attach", "default"))
    events: Any = client.EventsV1Api(cluster.controller)
    await events.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "c1.attach2"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": f"{DRIVER}/controller",
            "reportingInstance": "replica-1",
            "action": "Attach",
            "reason": "Attached",
            "regarding": regarding,
            "type": "Normal",
        },
    )
    await _forbidden(events.delete_namespaced_event("c1.attach2", "default"))
    await _forbidden(events.list_event_for_all_namespaces())


async def test_the_controller_holds_its_lease_only_in_its_namespace(cluster: Cluster) -> None:
    # The Role's namespace exists because the policy names it.
    assert cluster.emulator.get("v1", "Namespace", "fabric-dra") is not None
    api: Any = client.CoordinationV1Api(cluster.controller)
    lease = {"metadata": {"name": "fabric-dra"}, "spec": {"holderIdentity": "replica-1"}}
    await api.create_namespaced_lease("fabric-dra", lease)
    current = await api.read_namespaced_lease("fabric-dra", "fabric-dra")
    current.spec.holder_identity = "replica-2"
    renewed = await api.replace_namespaced_lease("fabric-dra", "fabric-dra", current)
    assert renewed.spec.holder_identity == "replica-2"
    await _forbidden(api.delete_namespaced_lease("fabric-dra", "fabric-dra"))
    await _forbidden(api.list_namespaced_lease("fabric-dra"))
    body = await _forbidden(api.create_namespaced_lease("default", lease))
    assert body["message"].endswith('in the namespace "default"')


async def test_a_wiped_restart_brings_the_roles_namespace_back(cluster: Cluster) -> None:
    await cluster.emulator.restart(keep_store=False)
    api: Any = client.CoordinationV1Api(cluster.controller)
    await api.create_namespaced_lease(
        "fabric-dra", {"metadata": {"name": "fabric-dra"}, "spec": {}}
    )


async def test_the_admin_is_unrestricted_and_other_tokens_are_refused(
    cluster: Cluster,
) -> None:
    core: Any = client.CoreV1Api(cluster.admin)
    await core.create_node({"metadata": {"name": "n1"}})
    resource: Any = client.ResourceV1Api(cluster.admin)
    await resource.delete_collection_resource_slice()
    async with client.ApiClient(_config(cluster.emulator.url, "wrong")) as stranger:
        with pytest.raises(ApiException) as caught:
            await client.CoreV1Api(stranger).list_node()
        assert caught.value.status == 401
    # Discovery is open to every authenticated user, as system:discovery grants it.
    versions = await client.CoreApi(cluster.controller).get_api_versions()
    assert versions.versions == ["v1"]
    groups = await client.ApisApi(cluster.controller).get_api_versions()
    assert "resource.k8s.io" in [g.name for g in groups.groups]
    refused = [r for r in cluster.emulator.requests if r.status == 403]
    assert refused == []


async def test_refusals_are_in_the_request_log(cluster: Cluster) -> None:
    core: Any = client.CoreV1Api(cluster.controller)
    await _forbidden(core.create_node({"metadata": {"name": "n1"}}))
    assert [(r.method, r.path, r.status) for r in cluster.emulator.requests] == [
        ("POST", "/api/v1/nodes", 403)
    ]


async def test_control_plane_mode_needs_the_control_plane_role() -> None:
    for manifests, allowed in (([BASE_RBAC], False), ([BASE_RBAC, CONTROLPLANE_RBAC], True)):
        async with _cluster(manifests, ("v1alpha3",), "v1.31.0") as cluster:
            group, version = "resource.k8s.io", "v1alpha3"
            cluster.emulator.create(_claim("c1", f"{group}/{version}"))
            cluster.emulator.create(
                {
                    "apiVersion": f"{group}/{version}",
                    "kind": "PodSchedulingContext",
                    "metadata": {"name": "p1", "namespace": "default"},
                    "spec": {"potentialNodes": ["n1"]},
                }
            )
            api: Any = client.CustomObjectsApi(cluster.controller)
            calls = [
                api.get_namespaced_custom_object(
                    group, version, "default", "podschedulingcontexts", "p1"
                ),
                api.list_cluster_custom_object(group, version, "podschedulingcontexts"),
                api.patch_namespaced_custom_object_status(
                    group,
                    version,
                    "default",
                    "podschedulingcontexts",
                    "p1",
                    {"status": {"resourceClaims": [{"name": "gpu", "unsuitableNodes": []}]}},
                    _content_type="application/merge-patch+json",
                ),
                api.patch_namespaced_custom_object(
                    group,
                    version,
                    "default",
                    "resourceclaims",
                    "c1",
                    {"metadata": {"finalizers": [f"{DRIVER}/deletion-protection"]}},
                    _content_type="application/merge-patch+json",
                ),
            ]
            for call in calls:
                if allowed:
                    await call
                else:
                    await _forbidden(call)
            # Neither mode may create or delete scheduling contexts: the scheduler does.
            await _forbidden(
                api.delete_namespaced_custom_object(
                    group, version, "default", "podschedulingcontexts", "p1"
                )
            )


# -- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rbac-manifests", str(BASE_RBAC)], "--rbac-token-file"),
        (["--rbac-token-file", "TOKEN"], "needs --rbac-manifests"),
    ],
)
def test_cli_refuses_half_an_rbac_setup(tmp_path: Path, args: list[str], message: str) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    result = CliRunner().invoke(
        kube_cli, [a.replace("TOKEN", str(token)) for a in args], catch_exceptions=False
    )
    assert result.exit_code == 2
    assert message in result.output


async def test_cli_enforces_rbac_from_the_deploy_folder(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(f"{SA_TOKEN}\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from app.cli import main; main()",
        "sim",
        "kube",
        "--port",
        "0",
        "--rbac-manifests",
        str(DEPLOY),
        "--rbac-user",
        SA,
        "--rbac-token-file",
        str(token),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:")
        async with client.ApiClient(_config(url, SA_TOKEN)) as controller:
            core: Any = client.CoreV1Api(controller)
            assert (await core.list_node()).items == []
            await _forbidden(core.create_node({"metadata": {"name": "n1"}}))
            lease = {"metadata": {"name": "fabric-dra"}, "spec": {}}
            leases: Any = client.CoordinationV1Api(controller)
            await leases.create_namespaced_lease("fabric-dra", lease)
        # Without the controller's token the caller is the unrestricted admin.
        async with client.ApiClient(client.Configuration(host=url)) as admin:
            admin_core: Any = client.CoreV1Api(admin)
            await admin_core.create_node({"metadata": {"name": "n1"}})
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)
    assert process.returncode == 0
