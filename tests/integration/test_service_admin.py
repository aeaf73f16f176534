"""The admin endpoint as the service wires it, over real HTTP against the Kubernetes API
emulator and the Redfish simulator: the what-if sees exactly the pools the service publishes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from builders import eventually

from app.config import Settings
from app.configload import load_settings
from app.service import Service
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

DRIVER = "fabric.example.com"
V1 = "resource.k8s.io/v1"
NODE = "node-us-east-rack-01-1"
TOKEN = "admin-token-123"
WAIT_S = 60  # generous: the suite runs on busy two-core machines


@pytest.fixture
async def simulator() -> AsyncIterator[tuple[RedfishSimulator, str]]:
    """Two GPUs in one rack, the first of them Critical (so it is tainted or withheld)."""
    sim = RedfishSimulator(
        spec=InventorySpec(regions=1, racks_per_region=1, devices_per_rack=2, hosts_per_rack=1),
        username="ops",
        password="s3cret-pw",
        auth="session",
    )
    url = await sim.start()
    sim.set_health(sim.block_uris()[0], "Critical")
    yield sim, url
    await sim.stop()


async def emulator(taints: bool) -> KubeEmulator:
    """Kubernetes 1.34 with DRADeviceTaints off (its default) or on, one labelled Node and
    a DeviceClass for our driver's GPUs."""
    emu = (
        KubeEmulator(kubernetes_version="1.34", feature_gates=all_gates_on("1.34"))
        if taints
        else KubeEmulator(kubernetes_version="1.34")
    )
    await emu.start()
    emu.create(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "labels": {
                    "kubernetes.io/hostname": NODE,
                    "topology.kubernetes.io/region": "us-east",
                    "fabric-dra.io/rack": "rack-01",
                },
            },
        }
    )
    emu.create(
        {
            "apiVersion": V1,
            "kind": "DeviceClass",
            "metadata": {"name": "fabric-gpu"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    return emu


def settings_for(tmp_path: Path, emu: KubeEmulator, fabric_url: str, database: str) -> Settings:
    (tmp_path / "user").write_text("ops\n")
    (tmp_path / "password").write_text("s3cret-pw\n")
    (tmp_path / "token").write_text(TOKEN + "\n")
    return load_settings(
        environ={
            "FABRIC_DRA_DRIVER_NAME": DRIVER,
            "FABRIC_DRA_DATABASE__URL": database,
            "FABRIC_DRA_FABRIC__URL": fabric_url,
            "FABRIC_DRA_FABRIC__USERNAME_FILE": str(tmp_path / "user"),
            "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(tmp_path / "password"),
            "FABRIC_DRA_KUBE__MODE": "url",
            "FABRIC_DRA_KUBE__URL": emu.url,
            "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
            "FABRIC_DRA_ADMIN__PORT": "0",
            "FABRIC_DRA_ADMIN__TOKEN_FILE": str(tmp_path / "token"),
            "FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS": "1",
            "FABRIC_DRA_LEADER__ENABLED": "false",
        }
    )


def published_devices(emu: KubeEmulator) -> list[dict[str, Any]]:
    return [
        d
        for s in emu.list(V1, "ResourceSlice")
        if s["spec"]["driver"] == DRIVER
        for d in s["spec"].get("devices") or []
    ]


async def ask_what_if(port: int, spec: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{port}/api/v1/allocations/what-if", json=spec) as response,
    ):
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body


TWO_TOLERANT_GPUS = {
    "devices": {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "fabric-gpu",
                    "count": 2,
                    "tolerations": [{"operator": "Exists"}],
                },
            }
        ]
    }
}
"""Both GPUs, the Critical one's taint tolerated: possible only where taints are published."""


@pytest.mark.parametrize("taints", [False, True], ids=["taints-dropped", "taints-kept"])
async def test_the_what_if_uses_the_pools_as_published_with_or_without_taints(
    tmp_path: Path,
    database_url: str,
    simulator: tuple[RedfishSimulator, str],
    taints: bool,
) -> None:
    _, fabric_url = simulator
    emu = await emulator(taints)
    service = Service(settings_for(tmp_path, emu, fabric_url, database_url))
    await service.start()
    try:
        if taints:
            # The Critical GPU is published with its NoSchedule taint.
            await eventually(
                lambda: (
                    len(published_devices(emu)) == 2
                    and any(d.get("taints") for d in published_devices(emu))
                ),
                timeout_s=WAIT_S,
                what="both GPUs published, one tainted",
            )
        else:
            # The server drops taints: the publisher learns it and withholds the Critical GPU.
            await eventually(
                lambda: len(published_devices(emu)) == 1,
                timeout_s=WAIT_S,
                what="the Critical GPU withheld",
            )
            assert not any(d.get("taints") for d in published_devices(emu))
        assert service.admin_port
        [answer] = (await ask_what_if(service.admin_port, TWO_TOLERANT_GPUS))["nodes"]
        assert answer["node"] == NODE
        published = {d["name"] for d in published_devices(emu)}
        if taints:
            assert answer["satisfiable"] is True, answer
            results = answer["allocation"]["devices"]["results"]
            assert {r["device"] for r in results} == published
        else:
            # Only one GPU is offered to the scheduler: the what-if must not count the other.
            assert answer["satisfiable"] is False, answer
            assert answer["failure"] is not None
    finally:
        await service.stop(deadline_s=10)
        await emu.stop()
