"""The kubelet stand-in against fake DRA plugins served over real gRPC on unix sockets: the
registration handshake (accepted, refused with the reason sent back, deregistration, restart),
the DRA client's answer checks and errors, the health stream, and prepare/unprepare of pods
in the Kubernetes API emulator."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from builders import eventually

from app.kube.client import KubeClient
from app.node.grpcapi import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    drahealth_v1beta1_pb2,
    drahealth_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubelet.dra import ClaimRef, DraClient, DraError
from fabric_dra_sim.kubelet.kubelet import KubeletError, KubeletStandIn
from fabric_dra_sim.kubelet.registration import PluginWatcher

DRIVER = "fabric.example.com"
CLAIMS = "resource.k8s.io/v1"
NODE = "node-a"


@pytest.fixture
def root() -> Iterator[Path]:
    """A short directory under /tmp: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    (path / "reg").mkdir()
    (path / "cdi").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class FakePlugin:
    """A DRA plugin: Registration on ``reg/<name>.sock``, DRAPlugin v1 and/or v1beta1 (and
    optionally health v1beta1) on ``<name>-dra.sock``. Prepare writes one CDI spec per claim into
    ``cdi_dir`` and answers its CDI id; the knobs below make it misbehave."""

    root: Path
    name: str = DRIVER
    services: tuple[str, ...] = ("v1.DRAPlugin",)
    plugin_type: str = "DRAPlugin"
    endpoint: str | None = None  # None: the DRA socket; "": left empty
    reg_name: str | None = None
    serve: tuple[str, ...] = ("v1",)
    health: bool = False
    claim_errors: dict[str, str] = field(default_factory=dict)
    skip_uids: set[str] = field(default_factory=set)
    extra_uid: str | None = None
    stall: bool = False
    statuses: list[tuple[bool, str]] = field(default_factory=list)
    prepared: list[list[str]] = field(default_factory=list)
    unprepared: list[list[str]] = field(default_factory=list)
    server: Any = None

    @property
    def reg_socket(self) -> Path:
        return self.root / "reg" / (self.reg_name or f"{self.name}.sock")

    @property
    def dra_socket(self) -> Path:
        return self.root / f"{self.name}-dra.sock"

    def advertised_endpoint(self) -> str:
        return str(self.dra_socket) if self.endpoint is None else self.endpoint

    def write_spec(self, claim_uid: str) -> str:
        device = f"{claim_uid}-gpu-0"
        spec = {
            "cdiVersion": "0.6.0",
            "kind": f"{DRIVER}/gpu",
            "containerEdits": {"env": [f"FABRIC_DRA_DEVICES=gpu-0:uuid-{claim_uid[:4]}:"]},
            "devices": [
                {
                    "name": device,
                    "containerEdits": {
                        "env": ["FABRIC_DRA_DEVICE_GPU_0_TYPE=gpu"],
                        "deviceNodes": [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}],
                    },
                }
            ],
        }
        path = self.root / "cdi" / f"{DRIVER}-gpu_{claim_uid}.json"
        path.write_text(json.dumps(spec))
        return f"{DRIVER}/gpu={device}"

    async def start(self) -> FakePlugin:
        server = grpc.aio.server()
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(
            _Registration(self), server
        )
        if "v1" in self.serve:
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_Dra(self, dra_v1_pb2), server)
        if "v1beta1" in self.serve:
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
                _Dra(self, dra_v1beta1_pb2), server
            )
        if self.health:
            drahealth_v1beta1_pb2_grpc.add_DRAResourceHealthServicer_to_server(_Health(), server)
        server.add_insecure_port(f"unix://{self.dra_socket}")
        server.add_insecure_port(f"unix://{self.reg_socket}")
        await server.start()
        self.server = server
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=0)


class _Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    def __init__(self, plugin: FakePlugin) -> None:
        self.plugin = plugin

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(
            type=self.plugin.plugin_type,
            name=self.plugin.name,
            endpoint=self.plugin.advertised_endpoint(),
            supported_versions=list(self.plugin.services),
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.plugin.statuses.append((request.plugin_registered, request.error))
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class _Dra:
    def __init__(self, plugin: FakePlugin, pb2: Any) -> None:
        self.plugin = plugin
        self.pb2 = pb2

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        plugin = self.plugin
        plugin.prepared.append([c.uid for c in request.claims])
        if plugin.stall:
            await asyncio.sleep(60)
        answer = self.pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            if claim.uid in plugin.skip_uids:
                continue
            if claim.uid in plugin.claim_errors:
                answer.claims[claim.uid].error = plugin.claim_errors[claim.uid]
                continue
            device = answer.claims[claim.uid].devices.add()
            device.request_names.append("gpu")
            device.pool_name = "rack-1"
            device.device_name = "gpu-0"
            device.cdi_device_ids.append(plugin.write_spec(claim.uid))
        if plugin.extra_uid:
            answer.claims[plugin.extra_uid].error = ""
        return answer

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        self.plugin.unprepared.append([c.uid for c in request.claims])
        answer = self.pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            answer.claims[claim.uid].error = self.plugin.claim_errors.get(claim.uid, "")
        return answer


class _Health:
    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        message = drahealth_v1beta1_pb2.NodeWatchResourcesResponse()
        entry = message.devices.add()
        entry.device.pool_name = "rack-1"
        entry.device.device_name = "gpu-0"
        entry.health = drahealth_v1beta1_pb2.HEALTHY
        entry.last_updated_time = 1700000000
        yield message


@pytest.fixture
async def plugins() -> AsyncIterator[Callable[..., Any]]:
    started: list[FakePlugin] = []

    async def _start(root: Path, **options: Any) -> FakePlugin:
        plugin = await FakePlugin(root, **options).start()
        started.append(plugin)
        return plugin

    yield _start
    for plugin in started:
        await plugin.stop()


@pytest.fixture
async def watcher(root: Path) -> AsyncIterator[PluginWatcher]:
    found = PluginWatcher(root / "reg", poll_s=0.05)
    await found.start()
    yield found
    await found.stop()


# ---- registration


@pytest.mark.parametrize(
    ("services", "serve", "chosen"),
    [
        (("v1.DRAPlugin",), ("v1",), "v1.DRAPlugin"),
        (("v1beta1.DRAPlugin",), ("v1beta1",), "v1beta1.DRAPlugin"),
        (("v1.DRAPlugin", "v1beta1.DRAPlugin"), ("v1", "v1beta1"), "v1.DRAPlugin"),
        (("v1alpha4.Node", "v1beta1.DRAPlugin"), ("v1beta1",), "v1beta1.DRAPlugin"),
    ],
    ids=["v1-only", "v1beta1-only", "both", "unknown-then-v1beta1"],
)
async def test_a_plugin_is_registered_with_the_service_chosen_and_told_so(
    root: Path,
    plugins: Callable[..., Any],
    watcher: PluginWatcher,
    services: tuple[str, ...],
    serve: tuple[str, ...],
    chosen: str,
) -> None:
    plugin = await plugins(root, services=services, serve=serve)
    # The watcher records the handshake after the plugin was told: wait for the record.
    await eventually(
        lambda: [e.kind for e in watcher.events_for(plugin.reg_socket)] == ["registered"],
        what="the handshake recorded",
    )
    assert plugin.statuses == [(True, "")]
    registered = watcher.plugins[DRIVER]
    assert (registered.endpoint, registered.service) == (str(plugin.dra_socket), chosen)


REFUSALS = [
    ({"services": ("v1alpha4.Node",)}, "none of services supported by the plugin"),
    ({"services": ()}, "empty list of supported gRPC services"),
    ({"plugin_type": "CSIPlugin"}, "no handler registered for plugin type: CSIPlugin"),
    ({"name": "Not_A_Driver"}, "plugin name must be a DNS subdomain"),
    ({"endpoint": "/tmp/no-such-dir-xyz/dra.sock"}, "endpoint is not an existing unix socket"),
    ({"endpoint": "relative.sock"}, "endpoint is not an existing unix socket"),
]


@pytest.mark.parametrize(("options", "reason"), REFUSALS, ids=[r for _, r in REFUSALS])
async def test_an_invalid_plugin_is_refused_and_the_reason_is_sent_back(
    root: Path,
    plugins: Callable[..., Any],
    watcher: PluginWatcher,
    options: dict[str, Any],
    reason: str,
) -> None:
    plugin = await plugins(root, **options)
    await eventually(
        lambda: bool(watcher.events_for(plugin.reg_socket)), what="the handshake recorded"
    )
    assert watcher.events_for(plugin.reg_socket)[0].kind == "refused"
    registered, error = plugin.statuses[0]
    assert registered is False
    assert reason in error and error.startswith("RegisterPlugin error -- ")
    assert watcher.plugins == {}


async def test_an_empty_endpoint_means_the_registration_socket(
    root: Path, plugins: Callable[..., Any], watcher: PluginWatcher
) -> None:
    plugin = await plugins(root, endpoint="")
    await eventually(lambda: DRIVER in watcher.plugins, what="registration")
    assert watcher.plugins[DRIVER].endpoint == str(plugin.reg_socket)


async def test_a_second_instance_on_the_same_endpoint_is_refused(
    root: Path, plugins: Callable[..., Any], watcher: PluginWatcher
) -> None:
    first = await plugins(root)
    await eventually(lambda: first.statuses == [(True, "")], what="first registration")
    second = await plugins(root, reg_name="again.sock", endpoint=str(first.dra_socket))
    await eventually(lambda: bool(second.statuses), what="second status")
    assert second.statuses[0][0] is False
    assert "already registered for DRA driver plugin" in second.statuses[0][1]


async def test_dot_files_and_non_sockets_are_ignored(
    root: Path, plugins: Callable[..., Any]
) -> None:
    hidden = await plugins(root, reg_name=".hidden.sock")
    (root / "reg" / "plain.sock").write_text("not a socket")
    watcher = PluginWatcher(root / "reg")
    await watcher.scan_once()
    assert watcher.events == [] and hidden.statuses == []


async def test_sockets_in_sub_directories_are_found(
    root: Path, plugins: Callable[..., Any]
) -> None:
    (root / "reg" / "sub").mkdir()
    plugin = await plugins(root, reg_name="sub/plugin.sock")
    watcher = PluginWatcher(root / "reg")
    await watcher.scan_once()
    assert plugin.statuses == [(True, "")]


async def test_a_socket_nobody_serves_is_a_failed_handshake_retried_later(root: Path) -> None:
    path = root / "reg" / "dead.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # bound, never listening: connections are refused
    try:
        watcher = PluginWatcher(root / "reg", dial_timeout_s=0.5, retry_initial_s=600)
        await watcher.scan_once()
        await watcher.scan_once()  # inside the backoff: no second attempt
        assert [e.kind for e in watcher.events] == ["failed"]
        assert "dial failed" in watcher.events[0].error
    finally:
        dead.close()


async def test_removing_the_socket_deregisters_and_a_restart_handshakes_again(
    root: Path, plugins: Callable[..., Any], watcher: PluginWatcher
) -> None:
    plugin = await plugins(root)
    await eventually(
        lambda: [e.kind for e in watcher.events_for(plugin.reg_socket)] == ["registered"],
        what="registration recorded",
    )
    await watcher.restart()
    assert plugin.statuses == [(True, ""), (True, "")]
    kinds = [e.kind for e in watcher.events_for(plugin.reg_socket)]
    assert kinds == ["registered", "deregistered", "registered"]
    plugin.reg_socket.unlink()
    await eventually(lambda: DRIVER not in watcher.plugins, what="deregistration")
    assert watcher.events_for(plugin.reg_socket)[-1].kind == "deregistered"


async def test_a_refused_plugin_that_comes_back_fixed_is_registered(
    root: Path, plugins: Callable[..., Any], watcher: PluginWatcher
) -> None:
    broken = await plugins(root, services=("v1alpha4.Node",))
    await eventually(lambda: bool(broken.statuses), what="refusal")
    await broken.stop()
    broken.reg_socket.unlink(missing_ok=True)
    broken.dra_socket.unlink(missing_ok=True)
    fixed = await plugins(root)
    await eventually(lambda: fixed.statuses == [(True, "")], what="registration of the fix")


def test_bad_watcher_settings_are_refused(root: Path) -> None:
    with pytest.raises(ValueError, match="poll_s must be > 0"):
        PluginWatcher(root, poll_s=0)
    with pytest.raises(ValueError, match="kubelet_services must not be empty"):
        PluginWatcher(root, kubelet_services=())


# ---- DRA client


def _claims(n: int) -> list[ClaimRef]:
    return [ClaimRef("default", str(uuid.uuid4()), f"claim-{i}") for i in range(n)]


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_prepare_and_unprepare_return_each_claims_result(
    root: Path, plugins: Callable[..., Any], version: str
) -> None:
    claims = _claims(2)
    plugin = await plugins(root, serve=(version,), claim_errors={claims[1].uid: "no such device"})
    async with DraClient(str(plugin.dra_socket), f"{version}.DRAPlugin", DRIVER) as dra:
        results = await dra.prepare(claims, timeout_s=10)
        assert results[claims[1].uid].error == "no such device"
        (device,) = results[claims[0].uid].devices
        assert device.cdi_device_ids == (f"{DRIVER}/gpu={claims[0].uid}-gpu-0",)
        assert device.request_names == ("gpu",)
        assert await dra.unprepare(claims[:1], timeout_s=10) == {claims[0].uid: ""}


async def test_a_claim_missing_from_the_answer_is_an_error(
    root: Path, plugins: Callable[..., Any]
) -> None:
    claims = _claims(2)
    plugin = await plugins(root, skip_uids={claims[1].uid})
    async with DraClient(str(plugin.dra_socket), "v1.DRAPlugin", DRIVER) as dra:
        with pytest.raises(
            DraError, match=rf"skipped 1 ResourceClaims: default/claim-1 \({claims[1].uid}\)"
        ):
            await dra.prepare(claims, timeout_s=10)


async def test_an_answer_for_an_unknown_claim_is_an_error(
    root: Path, plugins: Callable[..., Any]
) -> None:
    plugin = await plugins(root, extra_uid="not-asked")
    async with DraClient(str(plugin.dra_socket), "v1.DRAPlugin", DRIVER) as dra:
        with pytest.raises(DraError, match="unknown claim UID not-asked"):
            await dra.prepare(_claims(1), timeout_s=10)


async def test_a_plugin_that_does_not_answer_in_time_is_a_deadline_error(
    root: Path, plugins: Callable[..., Any]
) -> None:
    plugin = await plugins(root, stall=True)
    async with DraClient(str(plugin.dra_socket), "v1.DRAPlugin", DRIVER) as dra:
        with pytest.raises(
            DraError, match=r"NodePrepareResources.*no answer within 0.3s"
        ) as caught:
            await dra.prepare(_claims(1), timeout_s=0.3)
    assert caught.value.code == "DEADLINE_EXCEEDED"
    assert DRIVER in str(caught.value)


async def test_a_service_the_plugin_does_not_serve_is_unimplemented(
    root: Path, plugins: Callable[..., Any]
) -> None:
    plugin = await plugins(root, serve=("v1beta1",))
    async with DraClient(str(plugin.dra_socket), "v1.DRAPlugin", DRIVER) as dra:
        with pytest.raises(DraError) as caught:
            await dra.prepare(_claims(1), timeout_s=10)
    assert caught.value.code == "UNIMPLEMENTED"


async def test_an_endpoint_nobody_serves_is_unavailable(root: Path) -> None:
    async with DraClient(str(root / "nothing.sock"), "v1.DRAPlugin", DRIVER) as dra:
        with pytest.raises(DraError, match="plugin not reachable") as caught:
            await dra.unprepare(_claims(1), timeout_s=5)
    assert caught.value.code == "UNAVAILABLE"


def test_bad_client_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unsupported service 'v1alpha4\.Node'"):
        DraClient("/tmp/x.sock", "v1alpha4.Node")
    with pytest.raises(ValueError, match="absolute path"):
        DraClient("x.sock", "v1.DRAPlugin")


async def test_health_falls_back_to_v1beta1_and_none_means_no_health(
    root: Path, plugins: Callable[..., Any]
) -> None:
    with_health = await plugins(root, health=True)
    without = await plugins(root, name="other.example.com")
    async with DraClient(str(with_health.dra_socket), "v1.DRAPlugin", DRIVER) as dra:
        stream = await dra.watch_health(first_timeout_s=10)
        assert stream is not None
        updates = [u async for u in stream]
    assert [u.version for u in updates] == ["v1beta1"]
    (entry,) = updates[0].devices
    assert (entry.pool_name, entry.device_name, entry.health) == ("rack-1", "gpu-0", "Healthy")
    async with DraClient(str(without.dra_socket), "v1.DRAPlugin", "other") as dra:
        assert await dra.watch_health(first_timeout_s=10) is None


# ---- prepare / unprepare pods in the emulator


def _claim(emu: KubeEmulator, name: str, pods: list[dict[str, Any]]) -> dict[str, Any]:
    claim = emu.create(
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
    node_selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
        ]
    }
    results = [{"request": "gpu", "driver": DRIVER, "pool": "rack-1", "device": "gpu-0"}]
    claim["status"] = {
        "allocation": {"devices": {"results": results}, "nodeSelector": node_selector},
        "reservedFor": [
            {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
            for p in pods
        ],
    }
    return emu.update_status(claim)


def _pod(emu: KubeEmulator, name: str, claim: str, node: str = NODE) -> dict[str, Any]:
    return emu.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": "app", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}},
                    {"name": "side", "image": "busybox"},
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            },
        }
    )


@pytest.fixture
async def kubelet(root: Path, client: KubeClient) -> AsyncIterator[KubeletStandIn]:
    standin = KubeletStandIn(NODE, client, root / "reg", root / "cdi", timeout_s=10)
    await standin.start()
    yield standin
    await standin.stop()


async def test_a_shared_claim_is_prepared_once_and_unprepared_after_its_last_pod(
    root: Path, emu: KubeEmulator, plugins: Callable[..., Any], kubelet: KubeletStandIn
) -> None:
    plugin = await plugins(root)
    await eventually(
        lambda: [e.kind for e in kubelet.watcher.events_for(plugin.reg_socket)] == ["registered"],
        what="registration recorded",
    )
    first, second = _pod(emu, "p1", "shared"), _pod(emu, "p2", "shared")
    claim = _claim(emu, "shared", [first, second])
    uid = claim["metadata"]["uid"]

    edits = await kubelet.prepare_pod("default", "p1")
    assert edits["app"].devices == [f"{DRIVER}/gpu={uid}-gpu-0"]
    assert edits["app"].env_map()["FABRIC_DRA_DEVICE_GPU_0_TYPE"] == "gpu"
    assert [n["path"] for n in edits["app"].device_nodes] == ["/dev/null"]
    assert edits["side"].devices == []
    await kubelet.prepare_pod("default", "p2")
    assert plugin.prepared == [[uid]]

    await kubelet.restart()  # the record survives, the plugin handshakes again
    assert plugin.statuses == [(True, ""), (True, "")]
    await kubelet.unprepare_pod("default", "p1")
    assert plugin.unprepared == []
    await kubelet.unprepare_pod("default", "p2")
    assert plugin.unprepared == [[uid]]
    assert kubelet.claims == {} and kubelet.pods == {}
    await kubelet.unprepare_pod("default", "p2")  # already done: nothing is called
    assert plugin.unprepared == [[uid]]


async def test_run_prepares_bound_pods_and_unprepares_deleted_ones(
    root: Path, emu: KubeEmulator, plugins: Callable[..., Any], kubelet: KubeletStandIn
) -> None:
    plugin = await plugins(root)
    pod = _pod(emu, "p1", "c1")
    uid = _claim(emu, "c1", [pod])["metadata"]["uid"]
    _pod(emu, "elsewhere", "c1", node="node-b")
    kubelet.run_in_background()
    await eventually(lambda: plugin.prepared == [[uid]], what="prepare by the loop")
    emu.delete("v1", "Pod", "p1", "default")
    await eventually(lambda: plugin.unprepared == [[uid]], what="unprepare by the loop")
    assert kubelet.errors == {}


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("other-node", "bound to node node-b, not to node-a"),
        ("not-reserved", "is not in status.reservedFor"),
        ("no-driver", f"DRA driver {DRIVER} is not registered"),
        (
            "claim-error",
            f"DRA driver {DRIVER}: NodePrepareResources failed for ResourceClaim c1: boom",
        ),
        ("missing-claim", "fetch ResourceClaim c1"),
        ("bad-spec", "containerEdits/env/0"),
    ],
)
async def test_prepare_pod_errors_name_the_pod_claim_and_driver(
    root: Path,
    emu: KubeEmulator,
    plugins: Callable[..., Any],
    kubelet: KubeletStandIn,
    case: str,
    message: str,
) -> None:
    pod = _pod(emu, "p1", "c1", node="node-b" if case == "other-node" else NODE)
    if case != "missing-claim":
        uid = _claim(emu, "c1", [] if case == "not-reserved" else [pod])["metadata"]["uid"]
    if case != "no-driver":
        errors = {uid: "boom"} if case == "claim-error" else {}
        await plugins(root, claim_errors=errors)
        await eventually(lambda: DRIVER in kubelet.watcher.plugins, what="registration")
    if case == "bad-spec":
        (root / "cdi" / "other.json").write_text(
            json.dumps(
                {
                    "cdiVersion": "0.6.0",
                    "kind": "a/b",
                    "containerEdits": {"env": ["X"]},
                    "devices": [{"name": "d", "containerEdits": {"env": ["A=1"]}}],
                }
            )
        )
    with pytest.raises(KubeletError) as caught:
        await kubelet.prepare_pod("default", "p1")
    assert str(caught.value).startswith("pod default/p1: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_a_template_claim_must_exist_and_be_owned_by_the_pod(
    root: Path, emu: KubeEmulator, plugins: Callable[..., Any], kubelet: KubeletStandIn
) -> None:
    await plugins(root)
    await eventually(lambda: DRIVER in kubelet.watcher.plugins, what="registration")
    pod = emu.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "t1", "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "app", "image": "busybox"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tmpl"}],
            },
        }
    )
    with pytest.raises(KubeletError, match="pod claim gpu: waiting for the ResourceClaim"):
        await kubelet.prepare_pod("default", "t1")
    _claim(emu, "t1-gpu-x", [pod])  # reserved for the pod, but not owned by it
    pod["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "t1-gpu-x"}]}
    emu.update_status(pod)
    with pytest.raises(KubeletError, match="was not created for the pod"):
        await kubelet.prepare_pod("default", "t1")
