"""``fabric-dra demo`` takes the settings of ``fabric-dra run`` that make sense on its own
simulated fabrics and clusters (from ``--config`` and ``FABRIC_DRA_*``), and refuses, in one
line, those it sets itself (the fabric and Kubernetes connections, the host mapping, the mode).

Each command runs as a real subprocess (``python -m app``), so what is checked is what a
person sees. The story ends in a container: the node plugin prepares the pod's claim through the
kubelet stand-in and the demo prints the container's edits. The host simulator behind that end
is checked in test_hostsim.py; the node side's own parts (:mod:`fabric_dra_sim.demo_nodes`)
are checked here in process.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import click
import pytest

from fabric_dra_sim.demo_nodes import DemoNode, NodeSide, container_story
from fabric_dra_sim.kubelet.cdi_check import ContainerEdits

FABRIC_DRA = [sys.executable, "-m", "app"]
SMALL = ("--regions", "1", "--racks-per-region", "1", "--devices-per-rack", "4")
TOKEN = "demo-admin-token-0123456789"


def _env(env: dict[str, str] | None) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
    return {**clean, **(env or {})}


async def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, limit_s: float = 60
) -> tuple[int, str, str]:
    """Run ``fabric-dra args``; returns the exit status, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        *FABRIC_DRA,
        *args,
        cwd=cwd,
        env=_env(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), limit_s)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def one_error_line(code: int, err: str, *expected: str) -> str:
    """Assert a failure reported as exactly one ``Error:`` line holding ``expected``."""
    assert code != 0, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("Error: "), err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("given", ["config", "environment"])
async def test_the_demo_honours_the_admin_token_file(tmp_path: Path, given: str) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    args: list[str] = []
    env: dict[str, str] = {}
    if given == "config":
        (tmp_path / "demo.yaml").write_text(f"admin:\n  token_file: {tmp_path / 'token'}\n")
        args = ["--config", str(tmp_path / "demo.yaml")]
    else:
        env = {"FABRIC_DRA_ADMIN__TOKEN_FILE": str(tmp_path / "token")}
    with (tmp_path / "stderr").open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *FABRIC_DRA,
            "demo",
            "--admin-port",
            "0",
            *SMALL,
            *args,
            cwd=tmp_path,
            env=_env(env),
            stdout=asyncio.subprocess.PIPE,
            # A file, not a pipe nobody reads while the demo serves: a full pipe would stall it.
            stderr=stderr,
        )
    assert process.stdout is not None
    try:
        seen: list[str] = []
        while True:
            line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
            assert line, "".join(seen) + (tmp_path / "stderr").read_text()
            seen.append(line)
            found = re.search(r"dashboards: (http://127\.0\.0\.1:\d+)/", line)
            if found:
                break
        api = found.group(1) + "/api/v1"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{api}/devices") as answer:
                assert answer.status == 200
                name = (await answer.json())["items"][0]["name"]
            cordon = f"{api}/devices/{name}/cordon"
            async with http.post(cordon, json={"reason": "test"}) as answer:
                assert answer.status == 401, await answer.text()
            wrong = {"Authorization": "Bearer not-the-token"}
            async with http.post(cordon, json={"reason": "test"}, headers=wrong) as answer:
                assert answer.status == 403, await answer.text()
            right = {"Authorization": f"Bearer {TOKEN}"}
            async with http.post(cordon, json={"reason": "test"}, headers=right) as answer:
                assert answer.status == 200, await answer.text()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
        await asyncio.wait_for(process.communicate(), 30)
    err = (tmp_path / "stderr").read_text()
    assert process.returncode == 0, err
    assert "Traceback" not in err


async def test_the_demo_honours_pools_and_controller_settings_of_its_config(
    tmp_path: Path,
) -> None:
    (tmp_path / "demo.yaml").write_text(
        "pools:\n  grouping_keys: [region]\n"
        "node_labels:\n  region: example.com/region\n"
        "inventory:\n  poll_interval_seconds: 1\n"
    )
    code, out, err = await cli(
        "demo", "--once", "--admin-port", "0", "--config", "demo.yaml", cwd=tmp_path
    )
    assert code == 0, err
    # 2 regions of 2 racks: 4 pools by region and rack, 2 by region only.
    assert "inventory synced (32 devices, 8 servers in 2 pools); 2 ResourceSlices" in out, out
    assert "[1.31] claim deleted" in out


@pytest.mark.parametrize(
    ("config", "env", "expected"),
    [
        ("fabric:\n  url: https://fm.example:443\n", {}, "setting fabric.url (from demo.yaml)"),
        (
            "fabric:\n  username_file: /etc/user\n",
            {},
            "setting fabric.username_file (from demo.yaml)",
        ),
        ("kube:\n  mode: kubeconfig\n  kubeconfig: /kc\n", {}, "setting kube."),
        ("hosts:\n  match: label\n", {}, "setting hosts.match (from demo.yaml)"),
        (
            None,
            {"FABRIC_DRA_KUBE__URL": "https://10.0.0.1:6443"},
            "setting kube.url (from environment FABRIC_DRA_KUBE__URL)",
        ),
        (
            None,
            {"FABRIC_DRA_CONTROLLER__MODE": "structured"},
            "setting controller.mode (from environment FABRIC_DRA_CONTROLLER__MODE)",
        ),
        ("node:\n  cdi_dir: /var/run/cdi\n", {}, "setting node.cdi_dir (from demo.yaml)"),
    ],
)
async def test_a_setting_the_demo_makes_itself_is_refused_in_one_line(
    tmp_path: Path, config: str | None, env: dict[str, str], expected: str
) -> None:
    args = ["demo", "--once", "--admin-port", "0"]
    if config is not None:
        (tmp_path / "demo.yaml").write_text(config)
        args += ["--config", "demo.yaml"]
    code, out, err = await cli(*args, cwd=tmp_path, env=env)
    one_error_line(code, err, expected, "the demo runs its own", "demo --help")
    assert code == 2
    assert out == ""


async def test_the_demo_offers_no_fabric_url_and_refuses_it_in_one_line(tmp_path: Path) -> None:
    code, out, err = await cli(
        "demo", "--once", "--admin-port", "0", "--fabric-url", "http://127.0.0.1:1", cwd=tmp_path
    )
    one_error_line(code, err, "--fabric-url", "the demo runs its own fabric")
    assert code == 2
    assert out == ""
    code, out, _ = await cli("demo", "--help", cwd=tmp_path)
    assert code == 0
    assert "--fabric-url" not in out
    assert "sqlite+aiosqlite:///fabric-dra-demo.db" in " ".join(out.split())


async def test_an_admin_token_file_it_cannot_read_stops_the_demo_in_one_line(
    tmp_path: Path,
) -> None:
    code, out, err = await cli(
        "demo",
        "--once",
        "--admin-port",
        "0",
        cwd=tmp_path,
        env={"FABRIC_DRA_ADMIN__TOKEN_FILE": str(tmp_path / "missing")},
    )
    one_error_line(code, err, "admin.token_file", "missing")
    assert code == 1
    assert out == ""


async def test_the_demo_story_ends_in_a_container_and_the_cdi_spec_goes_with_the_pod(
    tmp_path: Path,
) -> None:
    code, out, err = await cli(
        "demo", "--once", "--admin-port", "0", *SMALL, cwd=tmp_path, limit_s=110
    )
    assert code == 0, err
    assert "Traceback" not in err
    lines = out.splitlines()

    def index(pattern: str) -> tuple[int, re.Match[str]]:
        for number, line in enumerate(lines):
            found = re.search(pattern, line)
            if found:
                return number, found
        raise AssertionError(f"no line matching {pattern!r} in:\n{out}")

    registered, sockets = index(r"node plugin on each of the 2 nodes.*unix sockets under (\S+)\)")
    prepared, spec = index(r"\[1\.34\] kubelet on (\S+): NodePrepareResources.* CDI spec (\S+)$")
    node, spec_file = spec.group(1), spec.group(2)
    assert re.fullmatch(r"fabric\.example\.com-gpu_[0-9a-f-]{36}\.json", spec_file), spec_file
    gets, container = index(
        r"container main of pod demo-structured/trainer gets: fabric\.example\.com/gpu=(\S+)$"
    )
    device_nodes, nodes = index(r"^\s+device nodes: (.*)$")
    assert "/dev/nvidia0 (c 195:0)" in nodes.group(1), nodes.group(1)
    assert "/dev/nvidiactl (c 195:255)" in nodes.group(1), nodes.group(1)
    gone, _ = index(
        rf"\[1\.34\] pod deleted: the kubelet on {re.escape(node)} called "
        rf"NodeUnprepareResources; CDI spec {re.escape(spec_file)} is gone"
    )
    # The 1.34 container's lines only: those between its "gets" line and the unprepare.
    env = [
        line.strip().removeprefix("env ")
        for line in lines[gets:gone]
        if line.startswith("      env ")
    ]
    assert env == sorted(env), env
    names = {entry.partition("=")[0]: entry.partition("=")[2] for entry in env}
    uuids = [v for k, v in names.items() if re.fullmatch(r"FABRIC_DRA_DEVICE_\w+_UUID", k)]
    assert len(uuids) == 1 and re.fullmatch(r"[0-9a-f-]{36}", uuids[0]), env
    assert names["FABRIC_DRA_DEVICES"].split(":")[1] == uuids[0], env
    assert any(k.endswith("_TYPE") and v == "gpu" for k, v in names.items()), env
    left, _ = index(rf"it is gone from node {re.escape(node)}'s host")
    assert registered < prepared < gets < device_nodes < gone < left
    # The CDI device name is <claim uid>-<device>; the spec file ends in _<claim uid>.json.
    claim_uid = spec_file.removesuffix(".json").rpartition("_")[2]
    assert container.group(1).startswith(f"{claim_uid}-"), container.group(1)
    # 1.31: no status.devices; the node plugin asks the controller's journal (admin API).
    classic_prepared, _ = index(
        r"\[1\.31\] kubelet on \S+: NodePrepareResources answered by fabric-dra's node plugin"
    )
    classic_gets, _ = index(
        r"\[1\.31\] container main of pod demo-classic/inference gets: fabric\.example\.com/gpu="
    )
    classic_gone, _ = index(
        r"\[1\.31\] pod deleted: the kubelet on \S+ called NodeUnprepareResources"
    )
    assert classic_prepared < classic_gets < classic_gone
    assert "[1.31] claim deleted" in out
    # The nodes' folder (sockets, CDI specs, fake hosts) is removed when the demo stops.
    assert not await asyncio.to_thread(os.path.exists, sockets.group(1))


def test_the_container_story_lists_devices_nodes_mounts_and_the_environment_sorted() -> None:
    edits = ContainerEdits(
        env=["B=2", "A=1", "B=3"],
        device_nodes=[{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
        mounts=[{"hostPath": "/data", "containerPath": "/mnt", "options": ["ro", "bind"]}],
        devices=["example.com/gpu=one"],
    )
    assert container_story("ns/pod", "main", edits, tag="[1.31]") == [
        "[1.31] container main of pod ns/pod gets: example.com/gpu=one",
        "device nodes: /dev/nvidia0 (c 195:0)",
        "mount: /data -> /mnt (ro,bind)",
        "env A=1",
        "env B=3",
    ]
    empty = container_story("ns/pod", "sidecar", ContainerEdits())
    assert empty == [
        "[1.34] container sidecar of pod ns/pod gets: no CDI devices",
        "device nodes: none",
    ]


def test_a_node_without_a_node_plugin_is_refused_by_name(tmp_path: Path) -> None:
    side = NodeSide("Kubernetes 1.34", "[1.34]", "demo-structured")
    side.nodes["worker-1"] = DemoNode("worker-1", "host-1", tmp_path, fake=None)
    assert side.node("worker-1").host_id == "host-1"
    with pytest.raises(click.ClickException, match="the demo has no node plugin on node worker-9"):
        side.node("worker-9")
    assert side.nodes["worker-1"].cdi_specs() == []
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "b.json").write_text("{}")
    (tmp_path / "cdi" / "a.json").write_text("{}")
    (tmp_path / "cdi" / "notes.txt").write_text("")
    assert side.nodes["worker-1"].cdi_specs() == ["a.json", "b.json"]


async def test_the_cdim_demo_tells_the_story_on_layout_apply(tmp_path: Path) -> None:
    code, out, err = await cli(
        "demo", "--fabric", "cdim", "--once", "--admin-port", "0", cwd=tmp_path, limit_s=120
    )
    assert code == 0, err
    assert "Traceback" not in err
    for line in (
        "NEC CDIM simulator at http://127.0.0.1:",
        "pool cdim published",
        "its GPU connected to node-",
        "binding condition True, pod bound to node-",
    ):
        assert line in out, out
    # Eight pods at once share applies: fewer applies than pods.
    shared = re.search(r"8 pods at once: their GPUs connected in (\d+) applies", out)
    assert shared is not None and int(shared.group(1)) < 8, out
    assert "every GPU disconnected through layout-apply and released" in out
    assert (tmp_path / "fabric-dra-demo-cdim.db").exists()


async def test_sigterm_during_the_start_stops_the_demo_cleanly(tmp_path: Path) -> None:
    # A signal before "serving until Ctrl-C" used to kill the process (exit 143) and leave the
    # node plugins' temporary folders behind.
    process = await asyncio.create_subprocess_exec(
        *FABRIC_DRA,
        "demo",
        *SMALL,
        "--admin-port",
        "0",
        cwd=tmp_path,
        env=_env(None),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        first = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert first.startswith("==> "), first
        process.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()[-2000:]
    assert out.decode().strip().splitlines()[-1] == "==> stopped"
    assert "serving until Ctrl-C" not in out.decode()
    assert "Traceback" not in err.decode()
