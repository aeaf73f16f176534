"""Several fabric managers at once, over real HTTP: two Redfish simulators standing for two
halls whose managers use the same resource ids and the same locations for different devices
and servers, one controller, the Kubernetes API emulator."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import eventually
from sqlalchemy import select

from app.configload import load_settings
from app.db.models import Device
from app.service import Service
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

DRIVER = "fabric.example.com"
CLAIMS = "resource.k8s.io/v1"
HALLS = ("hall-a", "hall-b")
NODE = {hall: f"{hall}-us-east-rack-01-1" for hall in HALLS}
eventually = partial(eventually, timeout_s=25)


@pytest.fixture
async def halls() -> AsyncIterator[
    tuple[KubeEmulator, dict[str, RedfishSimulator], dict[str, str]]
]:
    """Two simulators with identical trees (same block URIs, same system ids, same region and
    rack) but their own server hostnames, and the emulator with one labelled Node per hall."""
    sims: dict[str, RedfishSimulator] = {}
    urls: dict[str, str] = {}
    for hall in HALLS:
        sims[hall] = RedfishSimulator(
            spec=InventorySpec(
                regions=1,
                racks_per_region=1,
                devices_per_rack=4,
                hosts_per_rack=1,
                host_prefix=hall,
            ),
            username="ops",
            password="s3cret-pw",
            auth="session",
        )
        urls[hall] = await sims[hall].start()
    emu = KubeEmulator(served_resource_versions=("v1",), feature_gates=all_gates_on("1.34"))
    await emu.start()
    for hall in HALLS:
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": NODE[hall],
                    "labels": {
                        "kubernetes.io/hostname": NODE[hall],
                        "topology.kubernetes.io/region": "us-east",
                        "fabric-dra.io/rack": "rack-01",
                        "fabric-dra.io/fabric-manager": hall,
                    },
                },
            }
        )
    yield emu, sims, urls
    await emu.stop()
    for sim in sims.values():
        await sim.stop()


def _service(tmp_path: Path, emu: KubeEmulator, urls: dict[str, str], database_url: str) -> Service:
    (tmp_path / "user").write_text("ops\n")
    (tmp_path / "password").write_text("s3cret-pw\n")
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "fabrics": [
                    {
                        "name": hall,
                        "url": urls[hall],
                        "username_file": str(tmp_path / "user"),
                        "password_file": str(tmp_path / "password"),
                        "retry_attempts": 1,
                        "timeout_seconds": 2,
                    }
                    for hall in HALLS
                ]
            }
        )
    )
    return Service(
        load_settings(
            config_file=config,
            environ={
                "FABRIC_DRA_DATABASE__URL": database_url,
                "FABRIC_DRA_KUBE__MODE": "url",
                "FABRIC_DRA_KUBE__URL": emu.url,
                "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
                "FABRIC_DRA_ADMIN__PORT": "0",
                "FABRIC_DRA_LEADER__ENABLED": "false",
                "FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS": "0.5",
                "FABRIC_DRA_INVENTORY__EVENTS_POLL_INTERVAL_SECONDS": "0.5",
                "FABRIC_DRA_INVENTORY__STALE_AFTER_FAILURES": "2",
            },
        )
    )


def _slices(emu: KubeEmulator) -> list[dict[str, Any]]:
    return [s for s in emu.list(CLAIMS, "ResourceSlice") if s["spec"]["driver"] == DRIVER]


def _pools(emu: KubeEmulator) -> dict[str, list[str]]:
    pools: dict[str, list[str]] = {}
    for s in _slices(emu):
        pools.setdefault(s["spec"]["pool"]["name"], []).extend(
            d["name"] for d in s["spec"]["devices"]
        )
    return pools


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


def _held(sim: RedfishSimulator) -> list[str]:
    """The systems holding a block of ``sim``, one entry per held block."""
    return [system for system in sim.attachments().values() if system]


def _conditions(emu: KubeEmulator, name: str) -> dict[str, str]:
    claim = emu.get(CLAIMS, "ResourceClaim", name, "default") or {}
    return {
        c["type"]: c.get("reason", "")
        for e in (claim.get("status") or {}).get("devices") or []
        for c in e.get("conditions") or []
        if c["status"] == "True"
    }


async def test_two_managers_keep_their_devices_pools_attaches_and_staleness_apart(
    tmp_path: Path,
    halls: tuple[KubeEmulator, dict[str, RedfishSimulator], dict[str, str]],
    database_url: str,
) -> None:
    emu, sims, urls = halls
    service = _service(tmp_path, emu, urls, database_url)
    await service.start()
    try:
        # One pool per manager, though both report the same blocks in the same rack.
        await eventually(
            lambda: (
                sorted(_pools(emu)) == [f"{h}/us-east/rack-01" for h in HALLS]
                and all(len(v) == 4 for v in _pools(emu).values())
            ),
            what="a pool of four devices per fabric manager",
        )
        pools = _pools(emu)
        assert len({d for names in pools.values() for d in names}) == 8
        for s in _slices(emu):
            hall = s["spec"]["pool"]["name"].split("/")[0]
            terms = s["spec"]["nodeSelector"]["nodeSelectorTerms"]
            assert {
                "key": "fabric-dra.io/fabric-manager",
                "operator": "In",
                "values": [hall],
            } in terms[0]["matchExpressions"]
        async with service.db.read() as session:
            rows = (await session.execute(select(Device.backend, Device.vendor_id))).all()
        by_manager = {h: sorted(v for b, v in rows if b == h) for h in HALLS}
        assert by_manager["hall-a"] == by_manager["hall-b"]  # same vendor ids, two devices each

        # A hall-b device for the hall-b node: attached on hall-b's manager only.
        pool_b = "hall-b/us-east/rack-01"
        device_b = sorted(pools[pool_b])[0]
        _allocate(emu, "c-b", pool_b, device_b, NODE["hall-b"])
        await eventually(
            lambda: "FabricDeviceReady" in _conditions(emu, "c-b"), what="the hall-b attach"
        )
        system = "node-us-east-rack-01-1"  # the same system id on both managers
        assert _held(sims["hall-b"]) == [system]
        assert _held(sims["hall-a"]) == []

        # A hall-a device for the hall-b node: no attach can join them, and none is sent.
        pool_a = "hall-a/us-east/rack-01"
        device_a = sorted(pools[pool_a])[0]
        _allocate(emu, "c-cross", pool_a, device_a, NODE["hall-b"])
        await eventually(
            lambda: "FabricDeviceFailed" in _conditions(emu, "c-cross"),
            what="the cross-manager claim failing",
        )
        assert _held(sims["hall-a"]) == []
        assert _held(sims["hall-b"]) == [system]
        claim = emu.get(CLAIMS, "ResourceClaim", "c-cross", "default")
        messages = [
            c.get("message", "")
            for e in claim["status"]["devices"]
            for c in e["conditions"]
            if c["type"] == "FabricDeviceFailed"
        ]
        assert messages and "is on fabric manager hall-a" in messages[0], messages

        # hall-a's manager goes away: only its devices are stale.
        await sims["hall-a"].stop()

        async def only_a_stale() -> bool:
            managers = {m["name"]: m for m in (await service.status())["managers"]}
            return managers["hall-a"]["state"] == "stale" and managers["hall-b"]["state"] == "ok"

        await eventually(only_a_stale, what="hall-a stale, hall-b fresh")
        managers = {m["name"]: m for m in (await service.status())["managers"]}
        assert managers["hall-a"]["url"] == urls["hall-a"]
        assert managers["hall-b"]["inventory"]["device_count"] == 4

        # hall-b keeps working: the release detaches there.
        claim = emu.get(CLAIMS, "ResourceClaim", "c-b", "default")
        claim["status"] = {}
        emu.update_status(claim)
        await eventually(lambda: _held(sims["hall-b"]) == [], what="the hall-b detach")
    finally:
        await service.stop(deadline_s=5)


async def test_a_manager_dropped_from_the_settings_is_no_longer_published(
    tmp_path: Path,
    halls: tuple[KubeEmulator, dict[str, RedfishSimulator], dict[str, str]],
    caplog: pytest.LogCaptureFixture,
    database_url: str,
) -> None:
    emu, _sims, urls = halls
    service = _service(tmp_path, emu, urls, database_url)
    await service.start()
    try:
        await eventually(lambda: len(_pools(emu)) == 2, what="both managers' pools")
    finally:
        await service.stop(deadline_s=5)
    # The single form again, naming the one manager kept.
    single = Service(
        load_settings(
            environ={
                "FABRIC_DRA_DATABASE__URL": database_url,
                "FABRIC_DRA_FABRIC__NAME": "hall-a",
                "FABRIC_DRA_FABRIC__URL": urls["hall-a"],
                "FABRIC_DRA_FABRIC__USERNAME_FILE": str(tmp_path / "user"),
                "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(tmp_path / "password"),
                "FABRIC_DRA_KUBE__MODE": "url",
                "FABRIC_DRA_KUBE__URL": emu.url,
                "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
                "FABRIC_DRA_ADMIN__PORT": "0",
                "FABRIC_DRA_LEADER__ENABLED": "false",
                "FABRIC_DRA_NODE_LABELS__MANAGER": "example.com/unused",
            }
        )
    )
    await single.start()
    try:
        # One manager: pools are region/rack again, and hall-b's devices are not offered.
        await eventually(
            lambda: sorted(_pools(emu)) == ["us-east/rack-01"], what="hall-a's pool alone"
        )
        assert len(_pools(emu)["us-east/rack-01"]) == 4
        assert (
            "fabric manager hall-b is not configured but has 4 devices in the database"
            in caplog.text
        )
    finally:
        await single.stop(deadline_s=5)
