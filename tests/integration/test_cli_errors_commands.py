"""Every command-line error is one line: ``Error: ...`` naming the flag or setting, no traceback.

Each command runs as a real subprocess (``python -m app``), so what is checked is what a
person sees, the interpreter's shutdown messages included.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from app.config import ConfigError, http_origin_problem
from app.configload import load_settings
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import PROFILES, resolve_gates

FABRIC_DRA = [sys.executable, "-m", "app"]


async def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, limit_s: float = 60
) -> tuple[int, str, str]:
    """Run ``fabric-dra args``; returns the exit status, stdout and stderr."""
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


def one_error_line(code: int, err: str, *expected: str) -> str:
    """Assert a failure reported as exactly one ``Error:`` line holding ``expected``."""
    assert code != 0, err
    assert "Traceback" not in err
    assert "Exception ignored" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("Error: "), err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 something listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.fixture
async def kube_1_34() -> AsyncIterator[str]:
    emu = KubeEmulator(kubernetes_version="1.34")
    yield await emu.start()
    await emu.stop()


@pytest.fixture
async def kube_1_31() -> AsyncIterator[str]:
    emu = KubeEmulator(kubernetes_version="1.31")
    yield await emu.start()
    await emu.stop()


async def serving_line(*args: str, cwd: Path) -> str:
    """Start ``fabric-dra sim kube args``, return its first stdout line, stop it (SIGINT at
    once: the line means it is serving and stops cleanly on a signal, exit status 0)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
    process = await asyncio.create_subprocess_exec(
        *FABRIC_DRA,
        "sim",
        "kube",
        *args,
        cwd=cwd,
        env=clean,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        if not line:
            assert process.stderr is not None
            raise AssertionError((await process.stderr.read()).decode())
        return line.decode().strip()
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        assert process.stderr is not None
        err = await asyncio.wait_for(process.stderr.read(), 60)
        await asyncio.wait_for(process.wait(), 60)
        assert process.returncode == 0, err.decode()


# -- fabric-dra sim kube ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--port", "-1"], ["'--port'", "-1 is not in the range"]),
        (["--port", "70000"], ["'--port'", "70000 is not in the range"]),
        (["--host", "999.1.1.1", "--port", "0"], ["--host", "999.1.1.1"]),
        (["--history-size", "-5"], ["'--history-size'", "x>=1"]),
        (["--history-size", "0"], ["'--history-size'"]),
        (["--feature-gates", "AllAlpha=true"], ["--feature-gates", "AllAlpha is not supported"]),
        (["--feature-gates", "AllBeta=false"], ["--feature-gates", "AllBeta is not supported"]),
        (
            ["--kubernetes-version", "1.35", "--feature-gates", "DynamicResourceAllocation=false"],
            ["--feature-gates", "locked to true"],
        ),
    ],
)
async def test_sim_kube_refuses_bad_flags_in_one_line(
    tmp_path: Path,
    args: list[str],
    expected: list[str],
) -> None:
    code, _, err = await cli("sim", "kube", *args, cwd=tmp_path)
    one_error_line(code, err, *expected, "sim kube --help')")


async def test_sim_kube_on_a_busy_port_names_the_port(tmp_path: Path, busy_port: int) -> None:
    code, _, err = await cli("sim", "kube", "--port", str(busy_port), cwd=tmp_path)
    one_error_line(code, err, "--port", str(busy_port), "Address already in use")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"- metadata: {name: [\n", "is not valid YAML at line"),
        (b"\xff\xfe\x00garbage", "is not UTF-8 text"),
        (b"- metadata: {name: Bad_Name}\n", 'Node 1: Node "Bad_Name" is invalid: metadata.name'),
        (b"kind: Node\n", "must be a YAML list of Node objects"),
        (b"a: " + b"[" * 2000 + b"]" * 2000 + b"\n", "is nested too deeply to read"),
    ],
)
async def test_sim_kube_refuses_a_bad_nodes_file_in_one_line(
    tmp_path: Path,
    content: bytes,
    expected: str,
) -> None:
    (tmp_path / "nodes.yaml").write_bytes(content)
    code, _, err = await cli(
        "sim", "kube", "--port", "0", "--nodes-file", str(tmp_path / "nodes.yaml"), cwd=tmp_path
    )
    one_error_line(code, err, "--nodes-file", expected)


async def test_sim_kube_on_ipv6_shows_the_address_in_brackets(tmp_path: Path) -> None:
    line = await serving_line("--host", "::1", "--port", "0", cwd=tmp_path)
    assert " at http://[::1]:" in line, line


@pytest.mark.parametrize("version", ["1.31", "1.34"])
async def test_sim_kube_accepts_the_dynamic_resource_allocation_gate(
    tmp_path: Path,
    version: str,
) -> None:
    line = await serving_line(
        "--port",
        "0",
        "--kubernetes-version",
        version,
        "--feature-gates",
        "DynamicResourceAllocation=true",
        cwd=tmp_path,
    )
    assert f"(Kubernetes {version})" in line


@pytest.mark.parametrize(
    ("version", "on", "locked"),
    [
        # pkg/features/kube_features.go: alpha from 1.26, beta (off) from 1.32, GA (on) in 1.34,
        # locked to true from 1.35; the emulator's 1.31 profile turns it on (classic DRA needs it).
        ("1.31", True, False),
        ("1.34", True, False),
        ("1.35", True, True),
        ("1.37", True, True),
    ],
)
def test_dynamic_resource_allocation_gate_follows_the_release(
    version: str,
    on: bool,
    locked: bool,
) -> None:
    prof = PROFILES[version]
    assert prof.gate_defaults["DynamicResourceAllocation"] is on
    assert ("DynamicResourceAllocation" in prof.locked) is locked
    assert "DynamicResourceAllocation" in resolve_gates(prof, {"DynamicResourceAllocation": True})


def test_dynamic_resource_allocation_can_be_turned_off_on_1_31() -> None:
    gates = resolve_gates(PROFILES["1.31"], {"DynamicResourceAllocation": False})
    assert "DynamicResourceAllocation" not in gates


# -- fabric-dra sim scheduler / claim-controller ---------------------------------------------

BAD_KUBE_URLS = [
    ("http://127.0.0.1:99999", "invalid port"),
    ("http://127.0.0.1:0", "invalid port"),
    ("http://[::1", "is not a valid URL"),
    ("http://127.0.0.1:abc", "invalid port"),
    (" http://127.0.0.1:6443", "leading or trailing whitespace"),
    ("http://127.0.0.1:6443 ", "leading or trailing whitespace"),
    ("http://127.0.0.1:6443/some/path", "has a path ('/some/path')"),
    ("http://127.0.0.1:6443?x=1", "has a query"),
    ("http://127.0.0.1:6443/#frag", "has a fragment"),
    ("ftp://127.0.0.1:6443", "does not start with http:// or https://"),
    ("http://", "has no host"),
    ("http://me:pw@127.0.0.1:6443", "user information"),
]


@pytest.mark.parametrize("command", ["scheduler", "claim-controller"])
@pytest.mark.parametrize(("url", "expected"), BAD_KUBE_URLS)
async def test_stand_ins_refuse_a_bad_kube_url_before_connecting(
    tmp_path: Path,
    command: str,
    url: str,
    expected: str,
) -> None:
    code, _, err = await cli("sim", command, "--kube-url", url, cwd=tmp_path)
    line = one_error_line(code, err, "'--kube-url'", expected, f"sim {command} --help')")
    assert ":pw@" not in line


async def test_classic_scheduler_is_refused_on_1_34_in_one_line(
    tmp_path: Path,
    kube_1_34: str,
) -> None:
    code, _, err = await cli(
        "sim", "scheduler", "--kube-url", kube_1_34, "--mode", "classic", cwd=tmp_path
    )
    one_error_line(code, err, "--mode classic", "serves v1", "v1alpha3 with podschedulingcontexts")


async def test_structured_scheduler_is_refused_on_1_31_in_one_line(
    tmp_path: Path,
    kube_1_31: str,
) -> None:
    code, _, err = await cli(
        "sim", "scheduler", "--kube-url", kube_1_31, "--mode", "structured", cwd=tmp_path
    )
    one_error_line(code, err, "serves v1alpha3")


def test_an_origin_with_a_trailing_slash_or_ipv6_host_is_fine() -> None:
    for url in (
        "http://127.0.0.1:6443",
        "https://api.example/",
        "http://[::1]:6443",
        "https://10.0.0.1",
    ):
        assert http_origin_problem(url) is None, url


# -- fabric-dra run and the settings ---------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"FABRIC_DRA_KUBE__MODE": "url", "FABRIC_DRA_KUBE__URL": "http://127.0.0.1:99999"},
            ["setting kube.url", "FABRIC_DRA_KUBE__URL", "invalid port"],
        ),
        ({"FABRIC_DRA_KUBE__URL": "http://[::1"}, ["setting kube.url", "not a valid URL"]),
        ({"FABRIC_DRA_KUBE__URL": "http://10.0.0.1:6443/k8s"}, ["setting kube.url", "a path"]),
        (
            {"FABRIC_DRA_FABRIC__URL": "http://127.0.0.1:99999"},
            ["setting fabric.url", "FABRIC_DRA_FABRIC__URL", "invalid port"],
        ),
        ({"FABRIC_DRA_FABRIC__URL": "https://fm.example:443?x=1"}, ["setting fabric.url", "query"]),
        (
            {"FABRIC_DRA_CONTROLLER__MODE": "both"},
            [
                "setting controller.mode",
                "no Kubernetes release serves both modes",
                "use auto, structured or control-plane",
            ],
        ),
    ],
)
async def test_run_refuses_bad_settings_in_one_line_before_connecting(
    tmp_path: Path,
    env: dict[str, str],
    expected: list[str],
) -> None:
    code, _, err = await cli("run", cwd=tmp_path, env=env)
    assert code == 2
    one_error_line(code, err, *expected)


async def test_run_mode_flag_no_longer_offers_both(tmp_path: Path) -> None:
    code, _, err = await cli("run", "--mode", "both", cwd=tmp_path)
    one_error_line(code, err, "'--mode'", "'structured', 'control-plane', 'auto'")
    code, out, _ = await cli("run", "--help", cwd=tmp_path)
    assert code == 0
    assert "both" not in out


def test_a_bad_mode_value_does_not_list_both_as_valid() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"FABRIC_DRA_CONTROLLER__MODE": "bogus"})
    assert "'structured', 'control-plane' or 'auto'" in str(caught.value)
    assert "both" not in str(caught.value)


@pytest.mark.parametrize("url", ["http://[::1]:8443", "https://fm.example:443/"])
def test_fabric_url_takes_ipv6_and_a_trailing_slash(url: str) -> None:
    settings = load_settings(environ={"FABRIC_DRA_FABRIC__URL": url})
    assert settings.fabric.url == url.rstrip("/")


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """A server that accepts connections, reads what comes and never answers (an API server
    stuck behind a load balancer, a half-open connection): its URL."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()


def _run_against(url: str) -> dict[str, str]:
    return {
        "FABRIC_DRA_KUBE__MODE": "url",
        "FABRIC_DRA_KUBE__URL": url,
        "FABRIC_DRA_FABRIC__AUTH": "none",
        "FABRIC_DRA_FABRIC__URL": "http://127.0.0.1:1",
        "FABRIC_DRA_ADMIN__PORT": "0",
        "FABRIC_DRA_LEADER__ENABLED": "false",
    }


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_run_stops_on_a_signal_while_start_up_waits_on_the_api_server(
    tmp_path: Path, sig: signal.Signals
) -> None:
    # Start-up waits on discovery, which a silent server never answers: SIGTERM (a pod's
    # deletion) or Ctrl-C must still stop the service, cleanly and at once.
    async with silent_server() as url:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
        process = await asyncio.create_subprocess_exec(
            *FABRIC_DRA,
            "run",
            cwd=tmp_path,
            env={**clean, **_run_against(url)},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            # A background job inherits SIGINT ignored: give the service the default.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        assert process.stderr is not None
        started = b""
        while b"starting" not in started:
            line = await asyncio.wait_for(process.stderr.readline(), 60)
            assert line, "the service ended before it started"
            started = line
        process.send_signal(sig)
        rest = await asyncio.wait_for(process.stderr.read(), 30)
        assert await process.wait() == 0
    err = rest.decode()
    assert "stopping before start-up finished" in err
    assert "Traceback" not in err and "Error" not in err


async def test_run_gives_up_on_an_api_server_that_never_answers(tmp_path: Path) -> None:
    async with silent_server() as url:
        code, _, err = await cli(
            "run",
            cwd=tmp_path,
            env={**_run_against(url), "FABRIC_DRA_KUBE__REQUEST_TIMEOUT_SECONDS": "1"},
        )
    assert code == 1
    errors = [line for line in err.splitlines() if not line[:4].isdigit()]  # no log lines
    assert errors == ["Error: cannot start: discover resource.k8s.io: timed out"], err


async def test_run_refuses_a_request_timeout_that_is_not_finite(tmp_path: Path) -> None:
    for value in ("nan", "inf", "0", "-1"):
        code, _, err = await cli(
            "run", cwd=tmp_path, env={"FABRIC_DRA_KUBE__REQUEST_TIMEOUT_SECONDS": value}
        )
        assert code == 2
        one_error_line(code, err, "setting kube.request_timeout_seconds", repr(value))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # A NaN passes every range check (each comparison is false): refused by name.
        (
            ["status", "--admin-url", "http://127.0.0.1:1", "--timeout", "nan"],
            ["'--timeout'", "'nan' is not a finite number"],
        ),
        (
            ["reservations", "--admin-url", "http://127.0.0.1:1", "--timeout", "inf"],
            ["'--timeout'", "inf is not in the range 0.1<=x<=86400.0"],
        ),
        (
            ["status", "--admin-url", "http://127.0.0.1:1", "--timeout", "1e308"],
            ["'--timeout'", "not in the range"],
        ),
        (["run", "--shutdown-deadline", "nan"], ["'--shutdown-deadline'", "not a finite number"]),
        (["sim", "redfish", "--latency", "nan"], ["'--latency'", "not a finite number"]),
        (["sim", "redfish", "--latency", "1e9"], ["'--latency'", "0<=x<=600"]),
        (["sim", "redfish", "--error-rate", "nan"], ["'--error-rate'", "not a finite number"]),
        (
            ["sim", "scheduler", "--kube-url", "http://127.0.0.1:1", "--poll-interval", "nan"],
            ["'--poll-interval'", "not a finite number"],
        ),
        (["sim", "cdim", "--apply-seconds", "nan"], ["'--apply-seconds'", "not a finite number"]),
        # Whole numbers are called so, not click's "integer range".
        (["release", "abc"], ["'RESERVATION_ID'", "'abc' is not a valid whole number"]),
        (["run", "--admin-port", "x"], ["'--admin-port'", "'x' is not a valid whole number"]),
        # A generated inventory too large to build before the first answer.
        (["sim", "redfish", "--regions", "99999999"], ["'--regions'", "0<=x<=10000"]),
        (
            ["sim", "redfish", "--regions", "1000", "--racks-per-region", "1000"],
            ["makes 16,000,000 devices", "at most 500,000 are generated"],
        ),
        (
            ["sim", "redfish", "--regions", "1", "--racks-per-region", "100000"],
            ["makes 1,600,000 devices", "at most 500,000 are generated"],
        ),
        (
            [
                *("sim", "redfish", "--regions", "100"),
                *("--devices-per-rack", "1", "--hosts-per-rack", "10000"),
            ],
            ["makes 4,000,000 hosts", "at most 100,000 are generated"],
        ),
    ],
)
async def test_numbers_out_of_reason_are_refused_in_one_line(
    tmp_path: Path, args: list[str], expected: list[str]
) -> None:
    code, _, err = await cli(*args, cwd=tmp_path)
    assert code == 2
    one_error_line(code, err, *expected)


# -- fabric-dra demo -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "sqlite+aiosqlite:////nonexistent/dir/x.db",
            ["database sqlite+aiosqlite:////nonexistent/dir/x.db", "unable to open database file"],
        ),
        (
            "postgresql://nosuch:secret@127.0.0.1:1/x",
            [
                "database postgresql+asyncpg://***@127.0.0.1:1/x",
                "ConnectionRefusedError: [Errno 111]",
            ],
        ),
    ],
)
async def test_demo_with_a_database_it_cannot_open_says_so_in_one_line(
    tmp_path: Path,
    url: str,
    expected: list[str],
) -> None:
    code, out, err = await cli("demo", "--once", "--database-url", url, cwd=tmp_path)
    line = one_error_line(code, err, *expected)
    assert "admin-port" not in line
    assert "secret" not in line
    assert out == ""


async def test_demo_with_its_admin_port_busy_names_it_and_closes_everything(
    tmp_path: Path,
    busy_port: int,
) -> None:
    code, _, err = await cli("demo", "--once", "--admin-port", str(busy_port), cwd=tmp_path)
    one_error_line(
        code, err, f"--admin-port {busy_port}", "Address already in use", "try --admin-port 0"
    )
    assert "Unclosed" not in err
