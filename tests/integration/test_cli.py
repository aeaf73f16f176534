"""The fabric-dra command line, run as a real subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from app.db.migrate import head_revision
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

FABRIC_DRA = [sys.executable, "-m", "app"]


async def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, limit_s: float = 90
) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
    process = await asyncio.create_subprocess_exec(
        *FABRIC_DRA,
        *args,
        cwd=cwd,
        env={**clean, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), limit_s)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture
async def simulator() -> AsyncIterator[str]:
    sim = RedfishSimulator(
        spec=InventorySpec(regions=1, racks_per_region=2, devices_per_rack=3, hosts_per_rack=1),
        username="operator",
        password="pa55-word-XYZ",
    )
    yield await sim.start()
    await sim.stop()


def credentials(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "user").write_text("operator\n")
    (tmp_path / "password").write_text("pa55-word-XYZ\n")
    return {
        "FABRIC_DRA_FABRIC__USERNAME_FILE": str(tmp_path / "user"),
        "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(tmp_path / "password"),
    }


async def test_help_lists_every_command(tmp_path: Path) -> None:
    code, out, _ = await cli("--help", cwd=tmp_path)
    assert code == 0
    for command in ("db", "demo", "inventory", "sim"):
        assert command in out
    for sub in (["db", "upgrade"], ["db", "current"], ["inventory"], ["sim", "redfish"], ["demo"]):
        code, out, err = await cli(*sub, "--help", cwd=tmp_path)
        assert code == 0, err
        assert "Usage:" in out


@pytest.mark.parametrize(
    "args",
    [
        ["nope"],
        ["inventory", "--no-such-flag"],
        ["db", "nope"],
        ["forget"],
        ["sim", "redfish", "--profile", "nope"],
        ["nodes", "--log-level", "LOUD"],
    ],
)
async def test_every_usage_error_is_one_line_naming_the_help(
    tmp_path: Path, args: list[str]
) -> None:
    code, _, err = await cli(*args, cwd=tmp_path)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "--help" in lines[0], err


async def test_demo_once_tells_the_story_from_a_clean_directory(tmp_path: Path) -> None:
    code, out, err = await cli("demo", "--once", "--admin-port", "0", cwd=tmp_path)
    assert code == 0, err
    for line in (
        "Kubernetes 1.34 (emulated, resource.k8s.io v1, binding conditions on)",
        "Kubernetes 1.31 (emulated, resource.k8s.io v1alpha3 with PodSchedulingContexts)",
        "fabric-dra on Kubernetes 1.34: controller.mode structured",
        "fabric-dra on Kubernetes 1.31: controller.mode control-plane",
        "Kubernetes 1.34: inventory synced (32 devices, 8 servers in 4 pools); "
        "4 ResourceSlices published (v1)",
        "Kubernetes 1.31: inventory synced (32 devices, 8 servers in 4 pools); "
        "4 ResourceSlices published (v1alpha3)",
        "[1.34] the claim controller made ResourceClaim trainer-gpu-",
        "binding condition FabricDeviceReady is True",
        "[1.34] container main of pod demo-structured/trainer gets: fabric.example.com/gpu=",
        "[1.34] claim deallocated and deleted, device detached and released",
        "fabric-dra answered the PodSchedulingContext",
        "[1.31] container main of pod demo-classic/inference gets: fabric.example.com/gpu=",
        "[1.31] the claim controller requested deallocation, fabric-dra detached "
        "the device and deallocated the claim",
        "[1.31] claim deleted",
        "dashboards: http://127.0.0.1:",
    ):
        assert line in out, out
    assert "Traceback" not in err
    assert (tmp_path / "fabric-dra-demo.db").exists()
    assert (tmp_path / "fabric-dra-demo-classic.db").exists()


async def test_inventory_sync_reads_every_fabric_manager_and_names_the_one_that_failed(
    tmp_path: Path, simulator: str
) -> None:
    credentials(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    entry = {
        "username_file": str(tmp_path / "user"),
        "password_file": str(tmp_path / "password"),
        "retry_attempts": 1,
        "timeout_seconds": 2,
    }
    fabrics = [
        {"name": "hall-a", "url": simulator, **entry},
        {"name": "hall-b", "url": closed, **entry},
    ]
    env = {"FABRIC_DRA_FABRICS": json.dumps(fabrics)}
    code, out, err = await cli("inventory", "--sync", cwd=tmp_path, env=env)
    assert code == 1, out + err
    warnings = [line for line in err.splitlines() if line.startswith("Warning: sync failed")]
    assert len(warnings) == 1, err
    assert "showing the last known inventory" in warnings[0]
    assert "hall-b: " in warnings[0] and "hall-a: " not in warnings[0]
    assert "6 devices in 2 racks from 2 fabric managers" in out
    assert "hall-a: us-east / rack-01: 3 devices" in out
    assert "fabric manager hall-a: ok" in out
    assert "fabric manager hall-b: failing, last complete sync never" in out

    code, out, err = await cli("inventory", "-o", "json", cwd=tmp_path, env=env)
    assert code == 0, err
    data = json.loads(out)
    assert {d["backend"] for d in data["devices"]} == {"hall-a"}
    assert sorted(b["backend"] for b in data["backends"]) == ["hall-a", "hall-b"]
    assert data["unconfigured_managers"] == {}

    # hall-a renamed in the settings: its devices are still in the database, not published.
    fabrics[0]["name"] = "hall-c"
    env = {"FABRIC_DRA_FABRICS": json.dumps(fabrics)}
    code, out, err = await cli("inventory", cwd=tmp_path, env=env)
    assert code == 0, err
    assert "hall-a: us-east / rack-01: 3 devices (fabric manager not configured" in out
    assert "fabric manager hall-a is not configured: its 6 devices are not published" in out
    assert "fabric manager hall-a (not configured): ok, last complete sync" in out
    code, out, err = await cli("inventory", "-o", "json", cwd=tmp_path, env=env)
    assert code == 0, err
    assert json.loads(out)["unconfigured_managers"] == {"hall-a": 6}


async def test_inventory_sync_prints_a_table_and_json(tmp_path: Path, simulator: str) -> None:
    env = {"FABRIC_DRA_FABRIC__URL": simulator, **credentials(tmp_path)}
    code, out, err = await cli("inventory", "--sync", cwd=tmp_path, env=env)
    assert code == 0, err
    assert "sync failed" not in err
    assert "6 devices in 2 racks" in out
    assert "us-east / rack-01: 3 devices" in out and "us-east / rack-02: 3 devices" in out
    assert "fabric manager redfish: ok" in out
    assert "pa55-word-XYZ" not in out + err

    code, out, err = await cli("inventory", "--json", cwd=tmp_path, env=env)
    assert code == 0, err
    data = json.loads(out)
    assert len(data["devices"]) == 6
    assert {d["rack"] for d in data["devices"]} == {"rack-01", "rack-02"}
    assert data["backends"][0]["stale"] is False

    code, out, err = await cli("inventory", "-o", "yaml", cwd=tmp_path, env=env)
    assert code == 0, err
    assert yaml.safe_load(out) == data
    code, out, err = await cli("inventory", "-o", "wide", cwd=tmp_path, env=env)
    assert code == 0, err
    header = next(line for line in out.splitlines() if "SERIAL" in line).split()
    assert header[-5:] == ["STATE", "SERIAL", "FIRMWARE", "VENDOR", "ID"]
    code, _, err = await cli("inventory", "-o", "xml", cwd=tmp_path, env=env)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "'xml' is not one of" in err


async def test_inventory_sync_with_the_fabric_down_keeps_data_and_says_why(
    tmp_path: Path, simulator: str
) -> None:
    env = {"FABRIC_DRA_FABRIC__URL": simulator, **credentials(tmp_path)}
    assert (await cli("inventory", "--sync", cwd=tmp_path, env=env))[0] == 0
    env["FABRIC_DRA_FABRIC__URL"] = "http://127.0.0.1:9"
    env["FABRIC_DRA_FABRIC__RETRY_ATTEMPTS"] = "1"
    code, out, err = await cli("inventory", "--sync", cwd=tmp_path, env=env)
    assert code == 1
    assert len(sync_warnings(err)) == 1 and "cannot connect" in err
    assert "6 devices in 2 racks" in out and "failing" in out

    code, out, err = await cli("inventory", "--sync", "--json", cwd=tmp_path, env=env)
    assert code == 1 and len(sync_warnings(err)) == 1
    data = json.loads(out)
    assert len(data["devices"]) == 6 and data["backends"][0]["consecutive_failures"] == 2


def sync_warnings(err: str) -> list[str]:
    """The command's own warning lines (log lines may come too, at the default log level)."""
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("Warning: sync failed")]


async def test_inventory_sync_with_nothing_listening_exits_1_with_one_warning(
    tmp_path: Path,
) -> None:
    env = {
        "FABRIC_DRA_FABRIC__URL": "http://127.0.0.1:9",
        "FABRIC_DRA_FABRIC__RETRY_ATTEMPTS": "1",
        "FABRIC_DRA_DATABASE__URL": f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}",
        **credentials(tmp_path),
    }
    code, out, err = await cli("inventory", "--sync", cwd=tmp_path, env=env)
    assert code == 1
    [warning] = sync_warnings(err)
    assert "last known inventory" in warning
    assert "FabricUnavailable" in warning and "127.0.0.1:9" in warning
    # Said once on stderr: the sync's own log line would say it again.
    assert len(err.strip().splitlines()) == 1, err
    assert out.startswith("0 devices in 0 racks")
    assert "fabric manager redfish: failing, last complete sync never" in out

    env["FABRIC_DRA_LOG__LEVEL"] = "ERROR"
    code, out, err = await cli("inventory", "--sync", "--json", cwd=tmp_path, env=env)
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and len(sync_warnings(err)) == 1
    assert json.loads(out)["devices"] == []


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["inventory"],
            {"FABRIC_DRA_DRIVER_NAME": "Not_Valid"},
            "setting driver_name (from environment FABRIC_DRA_DRIVER_NAME)",
        ),
        (["inventory", "--sync"], {}, "setting fabric.url is not set"),
        (
            ["inventory", "--sync"],
            {"FABRIC_DRA_FABRIC__URL": "http://127.0.0.1:9"},
            "settings fabric.username_file and fabric.password_file are needed",
        ),
        (
            ["inventory", "--sync"],
            {
                "FABRIC_DRA_FABRIC__URL": "http://127.0.0.1:9",
                "FABRIC_DRA_FABRIC__USERNAME_FILE": "/nonexistent/u",
                "FABRIC_DRA_FABRIC__PASSWORD_FILE": "/nonexistent/p",
            },
            "setting fabric.username_file: cannot read '/nonexistent/u'",
        ),
        (["inventory", "--config", "missing.yaml"], {}, "config file 'missing.yaml'"),
        (["inventory", "--database-url", "mysql://x@y/z"], {}, "unsupported scheme 'mysql'"),
        (["inventory"], {}, "fabric-dra.db does not exist, so there is no inventory yet"),
        (["db", "upgrade", "nonexistent-rev"], {}, "unknown revision 'nonexistent-rev'"),
    ],
)
async def test_bad_input_gives_one_clear_error(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    code, _, err = await cli(*args, cwd=tmp_path, env=env)
    assert code != 0
    assert message in err
    assert "Traceback" not in err


async def test_db_upgrade_current_downgrade(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    code, out, err = await cli("db", "current", "--database-url", url, cwd=tmp_path)
    assert code == 0 and out.startswith("none (no database file at"), err
    assert not (tmp_path / "x.db").exists(), "a read-only command creates no file"
    code, out, err = await cli("db", "upgrade", "--database-url", url, cwd=tmp_path)
    assert code == 0 and f"database at revision {head_revision()}" in out, err
    code, out, _ = await cli("db", "current", "--database-url", url, cwd=tmp_path)
    assert "(up to date)" in out
    # Not on a terminal and without --yes: refused, one line, nothing dropped.
    code, out, err = await cli("db", "downgrade", "base", "--database-url", url, cwd=tmp_path)
    assert code == 2 and "give --yes" in err and len(err.strip().splitlines()) == 1, err
    code, out, _ = await cli("db", "current", "--database-url", url, cwd=tmp_path)
    assert "(up to date)" in out
    # Targets that are no revision, or no step from here: usage errors in one line, the
    # schema untouched.
    for args, message in [
        (["downgrade", "bogusrev", "--yes"], "unknown revision 'bogusrev': give head, base, 0001"),
        (["upgrade", "head+3"], "unknown revision 'head+3'"),
        (["downgrade", "--yes", "--", "-5"], "cannot downgrade to -5: Relative revision -5"),
        (["upgrade", "--", "+1"], "cannot upgrade to +1"),
    ]:
        code, out, err = await cli("db", args[0], "--database-url", url, *args[1:], cwd=tmp_path)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)
        assert "Traceback" not in err
        code, out, _ = await cli("db", "current", "--database-url", url, cwd=tmp_path)
        assert "(up to date)" in out
    code, out, err = await cli(
        "db", "downgrade", "--yes", "--database-url", url, "--", "-1", cwd=tmp_path
    )
    below_head = f"{int(head_revision()) - 1:04d}"  # revisions are numbered 0001, 0002, ...
    assert code == 0 and f"database at revision {below_head}" in out, err
    code, out, err = await cli("db", "upgrade", "--database-url", url, "--", "+1", cwd=tmp_path)
    assert code == 0 and f"database at revision {head_revision()}" in out, err
    code, out, _ = await cli(
        "db", "downgrade", "base", "--yes", "--database-url", url, cwd=tmp_path
    )
    assert code == 0 and "base (empty)" in out


async def test_every_fabric_managers_settings_are_checked_before_any_sync(
    tmp_path: Path, simulator: str
) -> None:
    credentials(tmp_path)
    entry = {"username_file": str(tmp_path / "user"), "password_file": str(tmp_path / "password")}
    fabrics = [{"name": "hall-a", "url": simulator, **entry}, {"name": "hall-b", **entry}]
    env = {"FABRIC_DRA_FABRICS": json.dumps(fabrics)}
    code, _out, err = await cli("inventory", "--sync", cwd=tmp_path, env=env)
    assert code == 1 and "Traceback" not in err
    assert "Error: setting fabrics[hall-b].url is not set" in err
    assert "inventory sync of backend hall-a" not in err  # nothing was synced first
