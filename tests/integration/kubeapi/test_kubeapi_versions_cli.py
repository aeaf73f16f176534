"""``fabric-dra sim kube --kubernetes-version ... --feature-gates ...``."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import aiohttp
import pytest
from click.testing import CliRunner

from fabric_dra_sim.kubeapi import cli


@pytest.mark.parametrize(
    ("args", "flag", "message"),
    [
        (
            ["--kubernetes-version", "1.33"],
            "--kubernetes-version",
            "unsupported Kubernetes version '1.33'; supported: 1.31, 1.34, 1.35, 1.36, 1.37",
        ),
        (["--feature-gates", "DRADeviceTaints"], "--feature-gates", "missing bool value"),
        (["--feature-gates", "DRADeviceTaints=maybe"], "--feature-gates", "invalid value of"),
        (
            ["--feature-gates", "NoSuchGate=true"],
            "--feature-gates",
            "unrecognized feature gate: NoSuchGate",
        ),
        (
            ["--kubernetes-version", "1.34", "--feature-gates", "DRAControlPlaneController=true"],
            "--feature-gates",
            "unrecognized feature gate: DRAControlPlaneController",
        ),
        (
            ["--kubernetes-version", "1.37", "--feature-gates", "DRAPrioritizedList=false"],
            "--feature-gates",
            "feature is locked to true",
        ),
        (
            ["--resource-versions", "v1,v1alpha3"],
            "--resource-versions",
            "Kubernetes 1.34 cannot serve resource.k8s.io v1alpha3",
        ),
        (
            ["--kubernetes-version", "1.31", "--resource-versions", "v1"],
            "--resource-versions",
            "Kubernetes 1.31 cannot serve resource.k8s.io v1",
        ),
    ],
)
def test_bad_versions_and_gates_are_one_clear_line(
    args: list[str], flag: str, message: str
) -> None:
    result = CliRunner().invoke(cli, ["--port", "0", *args])
    assert result.exit_code == 2
    error_lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error_lines) == 1, result.output
    assert flag in error_lines[0]
    assert message in error_lines[0]


async def test_the_cli_serves_the_release_and_gates_it_was_given() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from app.cli import main; main()",
        "sim",
        "kube",
        "--port",
        "0",
        "--kubernetes-version",
        "v1.31.4",
        "--feature-gates",
        "DRAControlPlaneController=false",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert "Kubernetes 1.31" in line
        assert "resource.k8s.io v1alpha3" in line
        url = line.strip().rsplit(" ", 1)[-1]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/version") as resp:
                info = await resp.json()
            async with session.get(f"{url}/apis/resource.k8s.io") as resp:
                group = json.loads(await resp.text())
            # The gate off: spec.controller is dropped silently, the claim still created.
            async with session.post(
                f"{url}/apis/resource.k8s.io/v1alpha3/namespaces/default/resourceclaims",
                json={
                    "apiVersion": "resource.k8s.io/v1alpha3",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "c"},
                    "spec": {
                        "controller": "fabric.example.com",
                        "devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu"}]},
                    },
                },
            ) as resp:
                created = await resp.json()
                status = resp.status
        assert info["gitVersion"] == "v1.31.4"
        assert [v["version"] for v in group["versions"]] == ["v1alpha3"]
        assert status == 201, created
        assert "controller" not in created["spec"]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
