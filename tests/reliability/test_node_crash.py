"""The node plugin killed between its CDI spec write and its answer to the kubelet.

``fabric-dra node`` runs in its own process (first a copy that SIGKILLs itself right after its
first CDI spec write, then the real one on the same directories); the kubelet stand-in and the
Kubernetes API emulator run here. Whatever the kubelet does next -- prepare again, or give up
and unprepare -- nothing is left behind and nothing is prepared twice: one spec per claim and
device type, one checkpoint record, and none of either after the unprepare.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from builders import eventually

from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from fabric_dra_sim.fakehost import FakeHost
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on
from fabric_dra_sim.kubelet.dra import ClaimRef, DraClient
from fabric_dra_sim.kubelet.kubelet import KubeletError, KubeletStandIn

HERE = Path(__file__).resolve().parent
DRIVER = "fabric.example.com"
NODE = "node-a"
SERIAL = "S5GXNX0T654321"


@pytest.fixture
def root() -> Any:
    folder = Path(tempfile.mkdtemp(prefix="nodecrash-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def emu() -> AsyncIterator[KubeEmulator]:
    emulator = KubeEmulator(kubernetes_version="1.34", feature_gates=all_gates_on("1.34"))
    await emulator.start()
    yield emulator
    await emulator.stop()


@pytest.fixture
async def client(emu: KubeEmulator) -> AsyncIterator[KubeClient]:
    kube = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emu.url))
    yield kube
    await kube.close()


class NodeProcess:
    """One ``fabric-dra node`` process (``script`` None: the real command)."""

    def __init__(self, emu: KubeEmulator, root: Path, log: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
        self.env.update(
            {
                "FABRIC_DRA_DRIVER_NAME": DRIVER,
                "FABRIC_DRA_KUBE__MODE": "url",
                "FABRIC_DRA_KUBE__URL": emu.url,
                "FABRIC_DRA_NODE__NODE_NAME": NODE,
                "FABRIC_DRA_NODE__PLUGIN_REGISTRY_DIR": str(root / "reg"),
                "FABRIC_DRA_NODE__PLUGINS_DIR": str(root / "plugins"),
                "FABRIC_DRA_NODE__CDI_DIR": str(root / "cdi"),
                "FABRIC_DRA_NODE__HOST_ROOT": str(root / "host"),
                "FABRIC_DRA_NODE__HEALTH_PORT": "0",
                "FABRIC_DRA_NODE__HEALTH_HOST": "127.0.0.1",
                "FABRIC_DRA_NODE__DEVICE_POLL_SECONDS": "0.05",
            }
        )
        self.log = log
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, script: Path | None = None) -> None:
        args = [str(script)] if script else ["-m", "app", "node"]
        with self.log.open("ab") as out:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, *args, stdout=out, stderr=out, env=self.env, cwd=HERE.parents[1]
            )

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def make_objects(emu: KubeEmulator) -> str:
    pod = emu.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p1", "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "containers": [
                    {"name": "app", "image": "busybox", "resources": {"claims": [{"name": "d"}]}}
                ],
                "resourceClaims": [{"name": "d", "resourceClaimName": "c1"}],
            },
        }
    )
    claim = emu.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c1", "namespace": "default"},
            "spec": {
                "devices": {"requests": [{"name": "d", "exactly": {"deviceClassName": "nvme"}}]}
            },
        }
    )
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
        ]
    }
    ready = [
        {
            "type": t,
            "status": s,
            "reason": "Attached",
            "message": "",
            "lastTransitionTime": "2026-12-01T00:00:00Z",
        }
        for t, s in (("FabricDeviceReady", "True"), ("FabricDeviceFailed", "False"))
    ]
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "d", "driver": DRIVER, "pool": "rack-1", "device": "nvme-0"}
                ]
            },
            "nodeSelector": selector,
        },
        "reservedFor": [{"resource": "pods", "name": "p1", "uid": pod["metadata"]["uid"]}],
        "devices": [
            {
                "driver": DRIVER,
                "pool": "rack-1",
                "device": "nvme-0",
                "conditions": ready,
                "data": {"node": NODE, "deviceType": "nvme", "serialNumber": SERIAL},
            }
        ],
    }
    return str(emu.update_status(claim)["metadata"]["uid"])


def checkpoint(root: Path) -> dict[str, Any]:
    claims = json.loads((root / "plugins" / DRIVER / "checkpoint.json").read_text())["claims"]
    assert isinstance(claims, dict)
    return claims


@pytest.mark.parametrize("then", ["prepare-again", "unprepare"])
async def test_a_plugin_killed_between_cdi_write_and_answer_leaves_nothing_behind(
    then: str, emu: KubeEmulator, client: KubeClient, root: Path, tmp_path: Path
) -> None:
    FakeHost(root / "host").nvme(0, serial=SERIAL)
    uid = make_objects(emu)
    node = NodeProcess(emu, root, tmp_path / "node.log")
    kubelet = KubeletStandIn(NODE, client, root / "reg", root / "cdi", timeout_s=20)
    await kubelet.start()
    try:
        await node.start(HERE / "node_crash_plugin.py")
        await eventually(lambda: DRIVER in kubelet.watcher.plugins, 60, "first registration")
        with pytest.raises(KubeletError):
            await kubelet.prepare_pod("default", "p1")
        assert node.process is not None
        assert await node.process.wait() == -signal.SIGKILL
        spec = root / "cdi" / f"{DRIVER}-nvme_{uid}.json"
        assert spec.is_file()  # written, never answered
        assert checkpoint(root)[uid]["state"] == "preparing"

        registration = root / "reg" / f"{DRIVER}-reg.sock"
        # tmpfs hands a freed inode number out again: compare the change time too.
        first = registration.stat()
        old = (first.st_ino, first.st_ctime_ns)
        await node.start()

        def listening_again() -> bool:
            try:
                now = registration.stat()
            except FileNotFoundError:
                return False
            return (now.st_ino, now.st_ctime_ns) != old

        await eventually(listening_again, 60, "the new plugin's registration socket")
        await kubelet.restart()
        await eventually(lambda: DRIVER in kubelet.watcher.plugins, 60, "registration again")
        if then == "prepare-again":
            edits = await kubelet.prepare_pod("default", "p1")
            assert edits["app"].devices == [f"{DRIVER}/nvme={uid}-nvme-0"]
            assert sorted(p.name for p in (root / "cdi").iterdir()) == [spec.name]
            assert list(checkpoint(root)) == [uid]
            assert checkpoint(root)[uid]["state"] == "prepared"
            await kubelet.unprepare_pod("default", "p1")
        else:
            plugin = kubelet.watcher.plugins[DRIVER]
            dra = DraClient(plugin.endpoint, plugin.service)
            try:
                answer = await dra.unprepare([ClaimRef("default", uid, "c1")], timeout_s=20)
            finally:
                await dra.close()
            assert answer[uid] == ""
        assert list((root / "cdi").iterdir()) == []
        assert checkpoint(root) == {}
        # The real command served the kubelet's gRPC calls above on uvloop (event_loop auto).
        logged = (tmp_path / "node.log").read_text(errors="replace")
        assert f"on node {NODE} started (resource.k8s.io/v1, event loop uvloop)" in logged
    finally:
        await kubelet.stop()
        await node.stop()
        print((tmp_path / "node.log").read_text(errors="replace")[-3000:])
