"""``fabric-dra nodes``: the pure NodeSelector matching and report, then the command as a
subprocess against an emulator started here and a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from builders import MemoryBackend, gpu, host

from app.commands.nodes import build_report, node_selector_matches, render_table
from app.db.engine import Database
from app.fabric.types import Location
from app.hostmap import Ambiguity, HostRef
from app.inventory import InventorySync
from app.pools import PoolConfig, PoolDevice, desired_pools
from fabric_dra_sim.kubeapi import KubeEmulator

REGION = "topology.kubernetes.io/region"
RACK = "fabric-dra.io/rack"
LABELS = {"zone": "a", "gen": "5", "name": "x"}


HINT = (
    "with hosts.match=hostname no node maps to them by this name; give each host its "
    "own HostName, or match by label, annotation or provider_id"
)


def term(
    *expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields:
        body["matchFields"] = fields
    return {"nodeSelectorTerms": [body]}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


# --------------------------------------------------------------------------- pure part
@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        (term(expr("zone", "In", "a", "b")), True),
        (term(expr("zone", "In", "b")), False),
        (term(expr("zone", "NotIn", "b")), True),
        (term(expr("zone", "NotIn", "a")), False),
        (term(expr("missing", "NotIn", "a")), True),
        (term(expr("zone", "Exists")), True),
        (term(expr("missing", "Exists")), False),
        (term(expr("missing", "DoesNotExist")), True),
        (term(expr("zone", "DoesNotExist")), False),
        (term(expr("gen", "Gt", "4")), True),
        (term(expr("gen", "Gt", "5")), False),
        (term(expr("gen", "Lt", "6")), True),
        (term(expr("gen", "Lt", "5")), False),
        (term(expr("zone", "Gt", "1")), False),  # not an integer label
        (term(expr("missing", "Lt", "9")), False),
        (term(expr("gen", "Gt", "4", "5")), False),  # Gt takes exactly one value
        (term(expr("zone", "Sideways", "a")), False),  # unknown operator
        (term(expr("zone", "In", "a"), expr("gen", "In", "6")), False),  # expressions are ANDed
        (term(fields=[expr("metadata.name", "In", "node-1")]), True),
        (term(fields=[expr("metadata.name", "NotIn", "node-1")]), False),
        ({"nodeSelectorTerms": [{}]}, False),  # an empty term matches nothing
        ({"nodeSelectorTerms": []}, False),
        (
            {
                "nodeSelectorTerms": [
                    term(expr("zone", "In", "b"))["nodeSelectorTerms"][0],
                    term(expr("zone", "In", "a"))["nodeSelectorTerms"][0],
                ]
            },
            True,
        ),
    ],
)
def test_node_selectors_follow_the_core_operators(selector: dict[str, Any], matches: bool) -> None:
    assert node_selector_matches(selector, LABELS, "node-1") is matches


def node(name: str, region: str | None = None, rack: str | None = None) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if region:
        labels[REGION] = region
    if rack:
        labels[RACK] = rack
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def test_the_report_maps_nodes_to_hosts_and_pools_and_lists_what_does_not_fit() -> None:
    config = PoolConfig(
        driver_name="fabric.example.com", node_labels={"region": REGION, "rack": RACK}
    )
    pools = desired_pools(
        [
            PoolDevice("gpu-a", "gpu", Location(region="us-east", rack="rack-01")),
            PoolDevice("gpu-b", "gpu", Location(region="us-west", rack="rack-02")),
        ],
        config,
    )
    hosts = [HostRef("h1", "node-1.example.com"), HostRef("h2", "node-2"), HostRef("h9", None)]
    report = build_report(
        [
            node("node-2", "us-east", "rack-01"),
            node("node-1", "us-east", "rack-01"),
            node("lonely", "eu", "rack-01"),
        ],
        hosts,
        pools,
        "hostname",
        "",
    )
    assert [(r.node, r.host, r.pools) for r in report.rows] == [
        ("lonely", None, ()),
        ("node-1", "h1", ("us-east/rack-01",)),
        ("node-2", "h2", ("us-east/rack-01",)),
    ]
    assert report.unmapped_nodes == ("lonely",)
    assert report.unmatched_hosts == ("h9",)
    assert report.unreachable_pools == ("us-west/rack-02",)
    assert report.warnings == [
        "node lonely maps to no fabric host",
        "host h9 is not a node of this cluster",
        "pool us-west/rack-02 is reachable from no node; label its nodes "
        "topology.kubernetes.io/region=us-west fabric-dra.io/rack=rack-02",
    ]
    table = render_table(report)
    assert table.splitlines()[0].split() == ["NODE", "HOST", "POOLS"]
    assert "lonely  -     -" in table and "3 warnings:" in table


def test_a_hostname_shared_by_several_hosts_is_named_and_maps_no_node() -> None:
    hosts = [
        HostRef("sys-1", "localhost"),
        HostRef("sys-2", "localhost"),
        HostRef("sys-3", "LOCALHOST"),
        HostRef("sys-4", "node-4"),
        HostRef("sys-5", None),
    ]
    nodes = [node("localhost"), node("node-4"), node("node-5")]
    report = build_report(nodes, hosts, {}, "hostname", "")
    shared = "hostname 'localhost' is shared by hosts sys-1, sys-2, sys-3"
    assert [(r.node, r.host, r.reason) for r in report.rows] == [
        ("localhost", None, shared),
        ("node-4", "sys-4", None),
        ("node-5", None, None),
    ]
    assert report.ambiguous == (Ambiguity("hostname", "localhost", ("sys-1", "sys-2", "sys-3")),)
    assert report.unmatched_hosts == ("sys-1", "sys-2", "sys-3", "sys-5")
    assert report.warnings == [
        f"{shared}: {HINT}",
        f"node localhost maps to no fabric host: {shared}",
        "node node-5 maps to no fabric host",
        "host sys-5 is not a node of this cluster",
    ]
    data = report.to_json()
    assert data["ambiguous_hosts"] == [
        {"key": "hostname", "value": "localhost", "hosts": ["sys-1", "sys-2", "sys-3"]}
    ]
    assert data["nodes"][0] == {"node": "localhost", "host": None, "pools": [], "reason": shared}
    assert f"  {shared}: {HINT}" in render_table(report)
    # -o wide adds why each node maps to no host.
    wide = render_table(report, wide=True).splitlines()
    assert wide[0].split() == ["NODE", "HOST", "POOLS", "REASON"]
    assert wide[1].split()[:3] == ["localhost", "-", "-"] and wide[1].endswith(shared)
    assert wide[2].split() == ["node-4", "sys-4", "-", "-"]
    assert "REASON" not in render_table(report).splitlines()[0]


def test_shared_hostnames_do_not_matter_when_nodes_are_matched_by_label() -> None:
    key = "fabric-dra.io/host-id"
    hosts = [HostRef("sys-1", "localhost"), HostRef("sys-2", "localhost")]
    labelled = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "localhost", "labels": {key: "sys-2"}},
    }
    report = build_report([labelled], hosts, {}, "label", key)
    assert [(r.node, r.host, r.reason) for r in report.rows] == [("localhost", "sys-2", None)]
    assert report.ambiguous == ()
    assert report.warnings == ["host sys-1 is not a node of this cluster"]


# --------------------------------------------------------------------------- the command
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def fabric_dra(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def settings_env(kube_url: str, database_url: str) -> dict[str, str]:
    return {
        "FABRIC_DRA_KUBE__MODE": "url",
        "FABRIC_DRA_KUBE__URL": kube_url,
        "FABRIC_DRA_DATABASE__URL": database_url,
        "FABRIC_DRA_LOG__LEVEL": "ERROR",
    }


async def test_nodes_prints_hosts_pools_and_warnings(db: Database, database_url: str) -> None:
    backend = MemoryBackend(
        [gpu(i, region="us-east", rack="rack-01") for i in range(3)]
        + [gpu(i, region="us-west", rack="rack-02") for i in range(2)],
        [
            host(1, region="us-east", rack="rack-01"),
            host(2, region="us-east", rack="rack-01"),
            host(1, region="us-west", rack="rack-02"),
        ],
    )
    assert (await InventorySync(backend, db).sync_once()).ok
    emu = KubeEmulator()
    for name in ("node-us-east-rack-01-1", "node-us-east-rack-01-2"):
        emu.create(node(name, "us-east", "rack-01"))
    emu.create(node("gpu-less", "eu-central", "rack-07"))
    url = await emu.start()
    try:
        env = settings_env(url, database_url)
        code, out, err = await fabric_dra("nodes", "--json", env=env)
        assert code == 0, err
        report = json.loads(out)
        assert report["nodes"] == [
            {"node": "gpu-less", "host": None, "pools": [], "reason": None},
            {
                "node": "node-us-east-rack-01-1",
                "host": "us-east-rack-01-1",
                "pools": ["us-east/rack-01"],
                "reason": None,
            },
            {
                "node": "node-us-east-rack-01-2",
                "host": "us-east-rack-01-2",
                "pools": ["us-east/rack-01"],
                "reason": None,
            },
        ]
        assert report["ambiguous_hosts"] == []
        assert report["unmapped_nodes"] == ["gpu-less"]
        assert report["unmatched_hosts"] == ["us-west-rack-02-1"]
        assert report["unreachable_pools"] == ["us-west/rack-02"]

        code, out, err = await fabric_dra("nodes", env=env)
        assert code == 0, err
        assert "node-us-east-rack-01-1  us-east-rack-01-1  us-east/rack-01" in out
        assert "pool us-west/rack-02 is reachable from no node" in out
    finally:
        await emu.stop()


async def test_nodes_names_the_hosts_that_share_a_placeholder_hostname(
    db: Database, database_url: str
) -> None:
    backend = MemoryBackend(
        [gpu(0)],
        [host(i, hostname="localhost") for i in (1, 2)] + [host(3)],
    )
    assert (await InventorySync(backend, db).sync_once()).ok
    emu = KubeEmulator()
    emu.create(node("localhost", "us-east", "rack-01"))
    emu.create(node("node-us-east-rack-01-3", "us-east", "rack-01"))
    url = await emu.start()
    try:
        env = settings_env(url, database_url)
        code, out, err = await fabric_dra("nodes", "--json", env=env)
        assert code == 0, err
        report = json.loads(out)
        shared = "hostname 'localhost' is shared by hosts us-east-rack-01-1, us-east-rack-01-2"
        assert report["ambiguous_hosts"] == [
            {
                "key": "hostname",
                "value": "localhost",
                "hosts": ["us-east-rack-01-1", "us-east-rack-01-2"],
            }
        ]
        assert [(n["node"], n["host"], n["reason"]) for n in report["nodes"]] == [
            ("localhost", None, shared),
            ("node-us-east-rack-01-3", "us-east-rack-01-3", None),
        ]

        code, out, err = await fabric_dra("nodes", env=env)
        assert code == 0, err
        assert f"{shared}: {HINT}" in out
        assert f"node localhost maps to no fabric host: {shared}" in out
        assert "Traceback" not in err
    finally:
        await emu.stop()


async def test_an_unreachable_api_server_is_one_clear_line(db: Database, database_url: str) -> None:
    env = settings_env(f"http://127.0.0.1:{free_port()}", database_url)
    code, out, err = await fabric_dra("nodes", env=env)
    assert code == 1 and out == ""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("Error: Kubernetes API http://127.0.0.1:") and "list Nodes" in err


async def test_a_database_without_schema_is_one_clear_line(tmp_path: Path) -> None:
    emu = KubeEmulator()
    url = await emu.start()
    try:
        (tmp_path / "empty.db").touch()  # an empty SQLite database (a missing one: no file)
        env = settings_env(url, f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
        code, out, err = await fabric_dra("nodes", env=env)
    finally:
        await emu.stop()
    assert code == 1 and out == ""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "has no schema yet" in err
