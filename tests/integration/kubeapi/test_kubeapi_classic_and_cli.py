"""Classic DRA objects on a v1alpha3 server, and the ``fabric-dra sim kube`` command."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fabric_dra_sim.kubeapi import KubeEmulator


async def test_v1alpha3_claims_with_controller_and_scheduling_contexts() -> None:
    # kubernetes-asyncio 36 has no typed v1alpha3 claim API (its ResourceV1alpha3Api is the
    # 1.36 one): classic DRA objects go through the generic CustomObjectsApi.
    emu = KubeEmulator(served_resource_versions=("v1alpha3",), git_version="v1.31.0")
    url = await emu.start()
    group, version, merge = "resource.k8s.io", "v1alpha3", "application/merge-patch+json"
    try:
        async with client.ApiClient(client.Configuration(host=url)) as api_client:
            api: Any = client.CustomObjectsApi(api_client)
            claim = await api.create_namespaced_custom_object(
                group,
                version,
                "default",
                "resourceclaims",
                {
                    "apiVersion": "resource.k8s.io/v1alpha3",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "c"},
                    "spec": {
                        "controller": "fabric.example.com",
                        "devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu"}]},
                    },
                },
            )
            assert claim["spec"]["controller"] == "fabric.example.com"
            context = await api.create_namespaced_custom_object(
                group,
                version,
                "default",
                "podschedulingcontexts",
                {
                    "apiVersion": "resource.k8s.io/v1alpha3",
                    "kind": "PodSchedulingContext",
                    "metadata": {"name": "pod-1"},
                    "spec": {"potentialNodes": ["n1", "n2"]},
                    "status": {"resourceClaims": [{"name": "ignored"}]},
                },
            )
            assert "status" not in context
            answered = await api.patch_namespaced_custom_object_status(
                group,
                version,
                "default",
                "podschedulingcontexts",
                "pod-1",
                {"status": {"resourceClaims": [{"name": "gpu", "unsuitableNodes": ["n2"]}]}},
                _content_type=merge,
            )
            assert answered["status"]["resourceClaims"][0]["unsuitableNodes"] == ["n2"]
            assert "generation" not in answered["metadata"]
            status = await api.patch_namespaced_custom_object_status(
                group,
                version,
                "default",
                "resourceclaims",
                "c",
                {
                    "status": {
                        "allocation": {
                            "controller": "fabric.example.com",
                            "devices": {
                                "results": [
                                    {
                                        "request": "gpu",
                                        "driver": "fabric.example.com",
                                        "pool": "p",
                                        "device": "d0",
                                    }
                                ]
                            },
                        },
                        "deallocationRequested": True,
                    }
                },
                _content_type=merge,
            )
            assert status["status"]["deallocationRequested"] is True
            with pytest.raises(ApiException) as caught:
                await api.create_namespaced_custom_object(
                    group,
                    version,
                    "default",
                    "resourceclaims",
                    {
                        "apiVersion": "resource.k8s.io/v1alpha3",
                        "kind": "ResourceClaim",
                        "metadata": {"name": "bad"},
                        "spec": {
                            "devices": {
                                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]
                            }
                        },
                    },
                    field_validation="Strict",
                )
            assert caught.value.status == 400
    finally:
        await emu.stop()


async def test_cli_serves_nodes_from_a_file_until_sigterm(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("- metadata: {name: node-1, labels: {rack: r1}}\n- metadata: {name: node-2}\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from app.cli import main; main()",
        "sim",
        "kube",
        "--port",
        "0",
        "--resource-versions",
        "v1,v1beta1",
        "--nodes-file",
        str(nodes),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/api/v1/nodes") as resp:
                names = [n["metadata"]["name"] for n in (await resp.json())["items"]]
            async with session.get(f"{url}/apis/resource.k8s.io") as resp:
                group = json.loads(await resp.text())
        assert names == ["node-1", "node-2"]
        assert [v["version"] for v in group["versions"]] == ["v1", "v1beta1"]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
