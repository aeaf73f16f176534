"""The node plugin end to end: `NodeAgent` (the real composition of `fabric-dra node`) on real
unix sockets, the kubelet stand-in handshaking with it and calling NodePrepareResources /
NodeUnprepareResources over gRPC, claims in the Kubernetes API emulator, devices on a fake host
(sysfs under a temporary folder), CDI specs checked against the CDI JSON schema."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from builders import eventually

from app.config import Settings
from app.kube.client import KubeClient
from app.node.agent import NodeAgent
from app.node.grpcapi import dra_v1_pb2, dra_v1_pb2_grpc, drahealth_v1_pb2, drahealth_v1_pb2_grpc
from fabric_dra_sim.fakehost import FakeHost
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubelet.cdi_check import validate_spec
from fabric_dra_sim.kubelet.kubelet import KubeletError, KubeletStandIn

DRIVER = "fabric.example.com"
NODE = "node-a"
CLAIMS = "resource.k8s.io/v1"
GPU_UUID = "3f2a6b1c-0d4e-4f5a-8b9c-0123456789ab"
NVME_SERIAL = "S5GXNX0T123456"


@pytest.fixture
def root() -> Any:
    # Unix socket paths must stay under 108 bytes: a short folder in /tmp.
    folder = Path(tempfile.mkdtemp(prefix="nodeplug-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def host(root: Path) -> FakeHost:
    fake = FakeHost(root / "host")
    fake.nvidia_gpu("0000:3b:00.0", uuid=GPU_UUID, minor=0)
    fake.nvme(0, serial=NVME_SERIAL, address="0000:5e:00.0")
    return fake


def node_settings(emu: KubeEmulator, root: Path, **node: Any) -> Settings:
    return Settings.model_validate(
        {
            "driver_name": DRIVER,
            "kube": {"mode": "url", "url": emu.url},
            "node": {
                "node_name": NODE,
                "plugin_registry_dir": str(root / "reg"),
                "plugins_dir": str(root / "plugins"),
                "cdi_dir": str(root / "cdi"),
                "host_root": str(root / "host"),
                "health_port": 0,
                "health_host": "127.0.0.1",
                "device_wait_seconds": 5,
                "device_poll_seconds": 0.05,
                "health_interval_seconds": 0.1,
                **node,
            },
        }
    )


@pytest.fixture
async def start_agent(emu: KubeEmulator, root: Path) -> AsyncIterator[Callable[..., Any]]:
    agents: list[NodeAgent] = []

    async def _start(**node: Any) -> NodeAgent:
        agent = NodeAgent(node_settings(emu, root, **node), NODE)
        await agent.start()
        agents.append(agent)
        return agent

    yield _start
    for agent in agents:
        await agent.stop()


@pytest.fixture
async def kubelet(root: Path, client: KubeClient) -> AsyncIterator[KubeletStandIn]:
    standin = KubeletStandIn(NODE, client, root / "reg", root / "cdi", timeout_s=10)
    await standin.start()
    yield standin
    await standin.stop()


def ready_entry(pool: str, device: str, data: dict[str, Any], status: str = "True") -> Any:
    return {
        "driver": DRIVER,
        "pool": pool,
        "device": device,
        "conditions": [
            {
                "type": "FabricDeviceReady",
                "status": status,
                "reason": "Attached" if status == "True" else "Attaching",
                "message": "attached" if status == "True" else "attach in progress",
                "lastTransitionTime": "2026-12-01T00:00:00Z",
            },
            {
                "type": "FabricDeviceFailed",
                "status": "False",
                "reason": "Attached",
                "message": "",
                "lastTransitionTime": "2026-12-01T00:00:00Z",
            },
        ],
        "data": data,
    }


GPU_DATA = {"node": NODE, "host": "sys-1", "deviceType": "gpu", "uuid": GPU_UUID}
NVME_DATA = {"node": NODE, "host": "sys-1", "deviceType": "nvme", "serialNumber": NVME_SERIAL}


def make_pod(emu: KubeEmulator, name: str, claim: str, node: str = NODE) -> Any:
    return emu.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": "app", "image": "busybox", "resources": {"claims": [{"name": "dev"}]}}
                ],
                "resourceClaims": [{"name": "dev", "resourceClaimName": claim}],
            },
        }
    )


def make_claim(
    emu: KubeEmulator,
    name: str,
    pod: Any,
    results: list[dict[str, str]],
    devices: list[Any],
    *,
    node: str = NODE,
    config: list[Any] | None = None,
) -> Any:
    requests = sorted({r["request"] for r in results})
    claim = emu.create(
        {
            "apiVersion": CLAIMS,
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": r, "exactly": {"deviceClassName": "fabric-gpu"}} for r in requests
                    ]
                }
            },
        }
    )
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    allocation: dict[str, Any] = {
        "devices": {"results": [{"driver": DRIVER, **r} for r in results]},
        "nodeSelector": selector,
    }
    if config:
        allocation["devices"]["config"] = config
    claim["status"] = {
        "allocation": allocation,
        "reservedFor": [
            {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        ],
        "devices": devices,
    }
    return emu.update_status(claim)


GPU_RESULT = {"request": "dev", "pool": "rack-1", "device": "gpu-0"}
NVME_RESULT = {"request": "dev", "pool": "rack-1", "device": "nvme-0"}


async def test_a_pod_gets_its_devices_through_cdi_and_loses_them_on_unprepare(
    emu: KubeEmulator, root: Path, host: FakeHost, start_agent: Any, kubelet: KubeletStandIn
) -> None:
    agent = await start_agent()
    await eventually(lambda: DRIVER in kubelet.watcher.plugins, what="registration")
    await eventually(
        lambda: agent.servers is not None and agent.servers.registration.registered.is_set(),
        what="told",
    )
    pod = make_pod(emu, "p1", "c1")
    claim = make_claim(
        emu,
        "c1",
        pod,
        [GPU_RESULT, NVME_RESULT],
        [ready_entry("rack-1", "gpu-0", GPU_DATA), ready_entry("rack-1", "nvme-0", NVME_DATA)],
        config=[
            {
                "source": "FromClaim",
                "requests": ["dev"],
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": "fabric-dra.io/v1alpha1",
                        "kind": "FabricDeviceConfig",
                        "env": {"MODEL_DIR": "/models"},
                    },
                },
            }
        ],
    )
    uid = claim["metadata"]["uid"]

    edits = (await kubelet.prepare_pod("default", "p1"))["app"]

    assert sorted(edits.devices) == [
        f"{DRIVER}/gpu={uid}-gpu-0",
        f"{DRIVER}/nvme={uid}-nvme-0",
    ]
    env = edits.env_map()
    assert env["FABRIC_DRA_DEVICE_GPU_0_UUID"] == GPU_UUID
    assert env["FABRIC_DRA_DEVICE_NVME_0_SERIAL"] == NVME_SERIAL
    assert env["MODEL_DIR"] == "/models"
    nodes = {n["path"]: (n.get("type"), n.get("major"), n.get("minor")) for n in edits.device_nodes}
    assert nodes["/dev/nvme0"] == ("c", 241, 0)
    assert nodes["/dev/nvme0n1"] == ("b", 259, 1)
    specs = sorted((root / "cdi").glob("*.json"))
    assert [p.name for p in specs] == [
        f"{DRIVER}-gpu_{uid}.json",
        f"{DRIVER}-nvme_{uid}.json",
    ]
    for path in specs:
        assert validate_spec(json.loads(path.read_text())) == []

    # A repeat (the kubelet lost its answer) gets the same answer and writes nothing new.
    before = {p.name: p.stat().st_mtime_ns for p in specs}
    async with grpc.aio.insecure_channel(f"unix://{agent.servers.dra_path}") as channel:  # type: ignore[union-attr]
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        again = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="default", name="c1", uid=uid)]
            )
        )
    assert sorted(d.cdi_device_ids[0] for d in again.claims[uid].devices) == sorted(edits.devices)
    assert {p.name: p.stat().st_mtime_ns for p in specs} == before

    await kubelet.unprepare_pod("default", "p1")
    assert list((root / "cdi").glob("*.json")) == []
    assert agent.plugin is not None and agent.plugin.checkpoint.records == {}


async def test_a_device_not_attached_yet_is_waited_for(
    emu: KubeEmulator, root: Path, host: FakeHost, start_agent: Any, kubelet: KubeletStandIn
) -> None:
    await start_agent()
    await eventually(lambda: DRIVER in kubelet.watcher.plugins, what="registration")
    pod = make_pod(emu, "p1", "c1")
    claim = make_claim(
        emu, "c1", pod, [GPU_RESULT], [ready_entry("rack-1", "gpu-0", GPU_DATA, status="False")]
    )
    preparing = asyncio.create_task(kubelet.prepare_pod("default", "p1"))
    await asyncio.sleep(0.3)  # the prepare is waiting; make the device ready
    assert not preparing.done()
    claim = emu.get(CLAIMS, "ResourceClaim", "c1", "default")
    assert claim is not None
    claim["status"]["devices"] = [ready_entry("rack-1", "gpu-0", GPU_DATA)]
    emu.update_status(claim)
    edits = await preparing
    assert edits["app"].devices == [f"{DRIVER}/gpu={claim['metadata']['uid']}-gpu-0"]


async def test_claims_that_cannot_be_prepared_get_their_own_error(
    emu: KubeEmulator, root: Path, host: FakeHost, start_agent: Any
) -> None:
    agent = await start_agent(device_wait_seconds=0.5)
    pod = make_pod(emu, "p1", "good")
    good = make_claim(emu, "good", pod, [GPU_RESULT], [ready_entry("rack-1", "gpu-0", GPU_DATA)])
    elsewhere = make_claim(emu, "elsewhere", pod, [GPU_RESULT], [], node="node-b")
    missing = make_claim(
        emu,
        "missing",
        pod,
        [{"request": "dev", "pool": "rack-1", "device": "gpu-9"}],
        [
            ready_entry(
                "rack-1", "gpu-9", {**GPU_DATA, "uuid": "00000000-1111-4222-8333-444444444444"}
            )
        ],
    )
    bad_config = make_claim(
        emu,
        "badconfig",
        pod,
        [GPU_RESULT],
        [ready_entry("rack-1", "gpu-0", GPU_DATA)],
        config=[
            {
                "source": "FromClaim",
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": "fabric-dra.io/v1alpha1",
                        "kind": "FabricDeviceConfig",
                        "mounts": [{"hostPath": "/etc", "containerPath": "/host-etc"}],
                    },
                },
            }
        ],
    )
    other_driver = emu.create(
        {
            "apiVersion": CLAIMS,
            "kind": "ResourceClaim",
            "metadata": {"name": "other", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "x", "exactly": {"deviceClassName": "c"}}]}},
        }
    )
    other_driver["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "x", "driver": "gpu.example.com", "pool": "p", "device": "d"}
                ]
            }
        }
    }
    other_driver = emu.update_status(other_driver)

    def ref(c: Any) -> Any:
        m = c["metadata"]
        return dra_v1_pb2.Claim(namespace="default", name=m["name"], uid=m["uid"])

    claims = [good, elsewhere, missing, bad_config, other_driver]
    async with grpc.aio.insecure_channel(f"unix://{agent.servers.dra_path}") as channel:  # type: ignore[union-attr]
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        answer = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref(c) for c in claims])
        )
        gone = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="default", name="nosuch", uid="u-1")]
            )
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace="default", name="x", uid="")]
                )
            )
    by_name = {c["metadata"]["name"]: answer.claims[c["metadata"]["uid"]] for c in claims}
    assert by_name["good"].error == "" and len(by_name["good"].devices) == 1
    assert "allocated to node node-b, not to this node node-a" in by_name["elsewhere"].error
    assert (
        "gpu-9" in by_name["missing"].error and "not found on this host" in by_name["missing"].error
    )
    assert "00000000-1111-4222-8333-444444444444" in by_name["missing"].error
    assert "mount of host path /etc is not allowed" in by_name["badconfig"].error
    assert by_name["other"].error == "" and list(by_name["other"].devices) == []
    assert gone.claims["u-1"].error == "claim default/nosuch not found"
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [p.name for p in (root / "cdi").glob("*.json")] == [
        f"{DRIVER}-gpu_{good['metadata']['uid']}.json"
    ]


async def test_an_unwritable_cdi_directory_is_a_claim_error_naming_it(
    emu: KubeEmulator, root: Path, host: FakeHost, start_agent: Any, kubelet: KubeletStandIn
) -> None:
    (root / "blocker").write_text("a file where a directory should be\n")
    await start_agent(cdi_dir=str(root / "blocker" / "cdi"))
    await eventually(lambda: DRIVER in kubelet.watcher.plugins, what="registration")
    pod = make_pod(emu, "p1", "c1")
    make_claim(emu, "c1", pod, [GPU_RESULT], [ready_entry("rack-1", "gpu-0", GPU_DATA)])
    with pytest.raises(KubeletError, match=r"cannot write CDI spec .*blocker/cdi"):
        await kubelet.prepare_pod("default", "p1")


async def test_a_restarted_plugin_and_a_restarted_kubelet_still_unprepare(
    emu: KubeEmulator, root: Path, host: FakeHost, start_agent: Any, kubelet: KubeletStandIn
) -> None:
    first = await start_agent()
    await eventually(lambda: DRIVER in kubelet.watcher.plugins, what="registration")
    pod = make_pod(emu, "p1", "c1")
    make_claim(emu, "c1", pod, [GPU_RESULT], [ready_entry("rack-1", "gpu-0", GPU_DATA)])
    await kubelet.prepare_pod("default", "p1")
    assert len(list((root / "cdi").glob("*.json"))) == 1

    await first.stop()
    await eventually(lambda: DRIVER not in kubelet.watcher.plugins, what="deregistration")
    second = await start_agent()
    await kubelet.restart()
    await eventually(lambda: DRIVER in kubelet.watcher.plugins, what="registration again")
    assert second.plugin is not None and len(second.plugin.checkpoint.records) == 1
    await kubelet.unprepare_pod("default", "p1")
    assert list((root / "cdi").glob("*.json")) == []
    assert second.plugin.checkpoint.records == {}


async def test_a_removed_registration_socket_is_made_again(
    emu: KubeEmulator, root: Path, host: FakeHost, start_agent: Any, kubelet: KubeletStandIn
) -> None:
    agent = await start_agent()
    assert agent.servers is not None
    agent.servers.watch_interval_s = 0.05
    await eventually(lambda: DRIVER in kubelet.watcher.plugins, what="registration")
    agent.servers.registration_path.unlink()
    await eventually(lambda: agent.servers.recreated >= 1, what="socket made again")  # type: ignore[union-attr]
    await eventually(lambda: DRIVER in kubelet.watcher.plugins, what="registered again")


async def test_a_vanished_device_is_unhealthy_and_told_on_the_claim(
    emu: KubeEmulator, root: Path, host: FakeHost, start_agent: Any, kubelet: KubeletStandIn
) -> None:
    agent = await start_agent()
    await eventually(lambda: DRIVER in kubelet.watcher.plugins, what="registration")
    pod = make_pod(emu, "p1", "c1")
    make_claim(emu, "c1", pod, [NVME_RESULT], [ready_entry("rack-1", "nvme-0", NVME_DATA)])
    await kubelet.prepare_pod("default", "p1")
    assert agent.plugin is not None
    await eventually(lambda: len(agent.plugin.health) == 1, what="first health check")  # type: ignore[union-attr]

    async with grpc.aio.insecure_channel(f"unix://{agent.servers.dra_path}") as channel:  # type: ignore[union-attr]
        stream = drahealth_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            drahealth_v1_pb2.NodeWatchResourcesRequest()
        )
        first = await stream.read()
        assert [(d.device.device_name, d.health) for d in first.devices] == [
            ("nvme-0", drahealth_v1_pb2.HEALTHY)
        ]
        (root / "host/sys/class/nvme/nvme0").unlink()  # the device is gone from the host
        update = await asyncio.wait_for(stream.read(), timeout=10)
        stream.cancel()
    assert [(d.device.device_name, d.health) for d in update.devices] == [
        ("nvme-0", drahealth_v1_pb2.UNHEALTHY)
    ]
    assert NVME_SERIAL in update.devices[0].message

    def told() -> bool:
        return any(
            e.get("reason") == "DeviceNotPresentOnNode" and e["involvedObject"]["name"] == "c1"
            for e in emu.list("v1", "Event", "default")
        )

    await eventually(told, what="an Event on the claim")


async def test_a_kubelet_that_speaks_only_v1beta1_is_served(
    emu: KubeEmulator, root: Path, host: FakeHost, start_agent: Any, client: KubeClient
) -> None:
    # Kubernetes 1.32 and 1.33 kubelets know v1beta1.DRAPlugin only.
    await start_agent()
    old = KubeletStandIn(
        NODE,
        client,
        root / "reg",
        root / "cdi",
        timeout_s=10,
        kubelet_services=("v1beta1.DRAPlugin",),
    )
    await old.start()
    try:
        await eventually(lambda: DRIVER in old.watcher.plugins, what="registration")
        assert old.watcher.plugins[DRIVER].service == "v1beta1.DRAPlugin"
        pod = make_pod(emu, "p1", "c1")
        claim = make_claim(emu, "c1", pod, [GPU_RESULT], [ready_entry("rack-1", "gpu-0", GPU_DATA)])
        edits = await old.prepare_pod("default", "p1")
        assert edits["app"].devices == [f"{DRIVER}/gpu={claim['metadata']['uid']}-gpu-0"]
        await old.unprepare_pod("default", "p1")
        assert list((root / "cdi").glob("*.json")) == []
    finally:
        await old.stop()


async def test_a_kubelet_that_speaks_no_version_we_serve_refuses_us(
    emu: KubeEmulator, root: Path, host: FakeHost, start_agent: Any, client: KubeClient
) -> None:
    agent = await start_agent()
    future = KubeletStandIn(
        NODE, client, root / "reg", root / "cdi", kubelet_services=("v2.DRAPlugin",)
    )
    await future.start()
    try:
        await eventually(
            lambda: agent.servers is not None and agent.servers.registration.last_error != "",
            what="the refusal told to the plugin",
        )
        assert DRIVER not in future.watcher.plugins
        assert not agent.servers.registration.registered.is_set()  # type: ignore[union-attr]
    finally:
        await future.stop()


async def test_the_probes_say_serving_then_registered_and_metrics_count_prepares(
    emu: KubeEmulator, root: Path, host: FakeHost, start_agent: Any, client: KubeClient
) -> None:
    import aiohttp

    agent = await start_agent()
    base = f"http://127.0.0.1:{agent.health_port}"
    async with aiohttp.ClientSession() as http:

        async def get(path: str) -> tuple[int, str]:
            async with http.get(base + path) as response:
                return response.status, await response.text()

        assert (await get("/healthz"))[0] == 200
        status, text = await get("/readyz")
        assert status == 503 and "not registered with the kubelet yet" in text
        kubelet = KubeletStandIn(NODE, client, root / "reg", root / "cdi", timeout_s=10)
        await kubelet.start()
        try:
            await eventually(lambda: DRIVER in kubelet.watcher.plugins, what="registration")
            await eventually(
                lambda: (
                    agent.servers is not None and agent.servers.registration.registered.is_set()
                ),
                what="told",
            )
            assert (await get("/readyz"))[0] == 200
            pod = make_pod(emu, "p1", "c1")
            make_claim(emu, "c1", pod, [GPU_RESULT], [ready_entry("rack-1", "gpu-0", GPU_DATA)])
            await kubelet.prepare_pod("default", "p1")
        finally:
            await kubelet.stop()
        status, metrics = await get("/metrics")
    assert status == 200
    assert 'fabric_dra_node_claims_total{method="prepare",result="ok"} 1.0' in metrics
    assert "fabric_dra_node_prepared_claims 1.0" in metrics
    assert "fabric_dra_node_registered 1.0" in metrics


async def test_a_kubernetes_1_31_kubelet_registers_by_version_and_calls_v1alpha4(
    emu: KubeEmulator, root: Path, host: FakeHost, start_agent: Any, client: KubeClient
) -> None:
    await start_agent()
    old = KubeletStandIn(
        NODE, client, root / "reg", root / "cdi", timeout_s=10, kubelet_services=("v1alpha3.Node",)
    )
    await old.start()
    try:
        await eventually(lambda: DRIVER in old.watcher.plugins, what="registration")
        assert old.watcher.plugins[DRIVER].service == "v1alpha3.Node"
        pod = make_pod(emu, "p1", "c1")
        claim = make_claim(emu, "c1", pod, [GPU_RESULT], [ready_entry("rack-1", "gpu-0", GPU_DATA)])
        edits = await old.prepare_pod("default", "p1")
        assert edits["app"].devices == [f"{DRIVER}/gpu={claim['metadata']['uid']}-gpu-0"]
        await old.unprepare_pod("default", "p1")
        assert list((root / "cdi").glob("*.json")) == []
    finally:
        await old.stop()
