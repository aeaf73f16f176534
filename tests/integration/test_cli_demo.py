"""``fabric-dra demo`` takes the settings of ``fabric-dra run`` that make sense on its own
simulated fabrics and clusters (from ``--config`` and ``FABRIC_DRA_*``), and refuses, in one
line, those it sets itself (the fabric and Kubernetes connections, the host mapping, the mode).

Each command runs as a real subprocess (``python -m app``), so what is checked is what a
person sees.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

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
        seen = []
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
