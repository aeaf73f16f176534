"""The whole claim cycle on NEC CDIM: the service, the Kubernetes API emulator and the CDIM
simulator over real HTTP (structured parameters: the claim is allocated, the controller
connects the device through layout-apply, reports it ready, and disconnects it on release)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from builders import eventually

from app.configload import load_settings
from app.service import Service
from fabric_dra_sim.cdim import CdimSimulator
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on

DRIVER = "fabric.example.com"
CLAIMS = "resource.k8s.io/v1"
eventually = partial(eventually, timeout_s=25)


@pytest.fixture
async def installation() -> AsyncIterator[tuple[KubeEmulator, CdimSimulator, str]]:
    sim = CdimSimulator(
        cpus=2,
        gpus=4,
        apply_overhead_s=0.2,
        step_s=0.02,
        retry_interval_s=0.02,
        sync_interval_s=None,
        token="gw-token",
    )
    url = await sim.start()
    emu = KubeEmulator(served_resource_versions=("v1",), feature_gates=all_gates_on("1.34"))
    await emu.start()
    for index, cpu in enumerate(sim.cpu_ids()):
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"node-{index}",
                    "labels": {
                        "kubernetes.io/hostname": f"node-{index}",
                        "fabric-dra.io/host-id": cpu,
                        "fabric-dra.io/fabric-manager": "cdim",
                    },
                },
            }
        )
    yield emu, sim, url
    await emu.stop()
    await sim.stop()


def _slices(emu: KubeEmulator) -> list[dict[str, Any]]:
    return [s for s in emu.list(CLAIMS, "ResourceSlice") if s["spec"]["driver"] == DRIVER]


def _allocate(emu: KubeEmulator, name: str, pool: str, device: str, node: str) -> None:
    emu.create(
        {
            "apiVersion": CLAIMS,
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]
                }
            },
        }
    )
    claim = emu.get(CLAIMS, "ResourceClaim", name, "default")
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}],
    }
    emu.update_status(claim)


def _conditions(emu: KubeEmulator, name: str) -> dict[str, str]:
    claim = emu.get(CLAIMS, "ResourceClaim", name, "default") or {}
    return {
        c["type"]: c.get("reason", "")
        for e in (claim.get("status") or {}).get("devices") or []
        for c in e.get("conditions") or []
        if c["status"] == "True"
    }


async def test_a_claim_is_connected_through_layout_apply_and_disconnected_on_release(
    tmp_path: Path,
    installation: tuple[KubeEmulator, CdimSimulator, str],
    database_url: str,
) -> None:
    emu, sim, url = installation
    (tmp_path / "token").write_text("gw-token\n")
    service = Service(
        load_settings(
            environ={
                "FABRIC_DRA_DATABASE__URL": database_url,
                "FABRIC_DRA_FABRIC__KIND": "cdim",
                "FABRIC_DRA_FABRIC__URL": url,
                "FABRIC_DRA_FABRIC__TOKEN_FILE": str(tmp_path / "token"),
                "FABRIC_DRA_FABRIC__VERIFY_POLL_SECONDS": "0.05",
                "FABRIC_DRA_HOSTS__MATCH": "label",
                "FABRIC_DRA_POOLS__GROUPING_KEYS": "manager",
                "FABRIC_DRA_KUBE__MODE": "url",
                "FABRIC_DRA_KUBE__URL": emu.url,
                "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
                "FABRIC_DRA_ADMIN__PORT": "0",
                "FABRIC_DRA_LEADER__ENABLED": "false",
                "FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS": "0.3",
            }
        )
    )
    await service.start()
    try:
        await eventually(
            lambda: (
                [s["spec"]["pool"]["name"] for s in _slices(emu)] == ["cdim"]
                and len(_slices(emu)[0]["spec"]["devices"]) == 4
            ),
            what="one pool of four GPUs (no CPU, no built-in part)",
        )
        selector = _slices(emu)[0]["spec"]["nodeSelector"]["nodeSelectorTerms"][0]
        assert selector["matchExpressions"] == [
            {"key": "fabric-dra.io/fabric-manager", "operator": "In", "values": ["cdim"]}
        ]
        names = sorted(d["name"] for d in _slices(emu)[0]["spec"]["devices"])
        cpu = sim.cpu_ids()[1]
        _allocate(emu, "c1", "cdim", names[0], "node-1")
        await eventually(lambda: "FabricDeviceReady" in _conditions(emu, "c1"), what="ready")
        gpu = next(g for g in sim.composable_ids() if sim.holder(g) is not None)
        assert sim.holder(gpu) == cpu and sim.posts == 1
        # The inventory cache has not synced: several syncs later the device still counts as
        # attached (the backend reads its own writes), and nothing is sent again.
        await asyncio.sleep(1.5)
        assert "FabricDeviceReady" in _conditions(emu, "c1") and sim.posts == 1
        assert service.last_drift == []

        claim = emu.get(CLAIMS, "ResourceClaim", "c1", "default")
        claim["status"] = {}
        emu.update_status(claim)
        await eventually(lambda: sim.holder(gpu) is None, what="the disconnect")
        assert sim.posts == 2
        assert [a.procedures[0]["operation"] for a in sim.applies.values()] == [
            "connect",
            "disconnect",
        ]
    finally:
        await service.stop(deadline_s=5)
