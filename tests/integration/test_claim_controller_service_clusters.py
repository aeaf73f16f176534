"""The service on clusters that exist: on Kubernetes 1.31 it runs the control-plane mode and
publishes v1alpha3 only; on 1.34 the structured mode and v1 only; ``both`` is refused with a
message that says why, before anything is written."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from builders import eventually

from app.config import ConfigError
from app.configload import load_settings
from app.kube.versions import ResourceApiVersion
from app.modes import ModeError
from app.service import Service
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

DRIVER = "fabric.example.com"
eventually = partial(eventually, timeout_s=20)


@pytest.fixture
async def fabric() -> AsyncIterator[str]:
    sim = RedfishSimulator(
        spec=InventorySpec(regions=1, racks_per_region=1, devices_per_rack=4, hosts_per_rack=2),
        username="ops",
        password="pw",
        auth="session",
    )
    yield await sim.start()
    await sim.stop()


def settings(tmp_path: Path, fabric: str, kube_url: str, mode: str) -> Any:
    (tmp_path / "user").write_text("ops\n")
    (tmp_path / "password").write_text("pw\n")
    return load_settings(
        environ={
            "FABRIC_DRA_DATABASE__URL": f"sqlite+aiosqlite:///{tmp_path}/fd.db",
            "FABRIC_DRA_FABRIC__URL": fabric,
            "FABRIC_DRA_FABRIC__USERNAME_FILE": str(tmp_path / "user"),
            "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(tmp_path / "password"),
            "FABRIC_DRA_KUBE__MODE": "url",
            "FABRIC_DRA_KUBE__URL": kube_url,
            "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
            "FABRIC_DRA_ADMIN__PORT": "0",
            "FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS": "1",
            "FABRIC_DRA_LEADER__ENABLED": "false",
            "FABRIC_DRA_CONTROLLER__MODE": mode,
        }
    )


@pytest.mark.parametrize(
    ("kubernetes", "version", "control_plane"),
    [
        ("1.31", ResourceApiVersion.V1ALPHA3, True),
        ("1.34", ResourceApiVersion.V1, False),
    ],
)
async def test_auto_publishes_in_the_one_version_of_the_cluster(
    tmp_path: Path,
    fabric: str,
    kubernetes: str,
    version: ResourceApiVersion,
    control_plane: bool,
) -> None:
    emu = KubeEmulator(kubernetes_version=kubernetes)
    url = await emu.start()
    service = Service(settings(tmp_path, fabric, url, "auto"))
    try:
        await service.start()
        await eventually(
            lambda: service.leading is not None and bool(service.leading.publishers),
            what="the publisher",
        )
        await eventually(
            lambda: (
                len(
                    [
                        s
                        for s in emu.list(version.api_version, "ResourceSlice")
                        if s["spec"]["driver"] == DRIVER
                    ]
                )
                == 1
            ),
            what="the pool's slice",
        )
        assert service.leading is not None
        assert list(service.leading.publishers) == [version]
        assert service.control_plane_served is control_plane
        assert (service.version is None) is control_plane
    finally:
        await service.stop()
        await emu.stop()


@pytest.mark.parametrize("kubernetes", ["1.31", "1.34"])
async def test_mode_both_is_refused_by_the_settings_before_anything_connects(
    tmp_path: Path,
    fabric: str,
    kubernetes: str,
) -> None:
    emu = KubeEmulator(kubernetes_version=kubernetes)
    url = await emu.start()
    try:
        with pytest.raises(ConfigError) as caught:
            settings(tmp_path, fabric, url, "both")
        assert "no Kubernetes release serves both modes" in str(caught.value)
        assert "use auto, structured or control-plane" in str(caught.value)
        assert emu.requests == []
    finally:
        await emu.stop()


@pytest.mark.parametrize("kubernetes", ["1.31", "1.34"])
async def test_mode_both_given_past_the_settings_is_refused_at_start(
    tmp_path: Path,
    fabric: str,
    kubernetes: str,
) -> None:
    emu = KubeEmulator(kubernetes_version=kubernetes)
    url = await emu.start()
    good = settings(tmp_path, fabric, url, "auto")
    service = Service(
        good.model_copy(update={"controller": good.controller.model_copy(update={"mode": "both"})})
    )
    try:
        with pytest.raises(ModeError) as caught:
            await service.start()
        assert "no Kubernetes release serves both modes" in str(caught.value)
        assert [w for w in emu.writes() if "resourceslices" in w.path] == []
    finally:
        await service.stop()
        await emu.stop()
