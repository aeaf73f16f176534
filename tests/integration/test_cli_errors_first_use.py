"""Bad input met at first use, not in the settings, is still one line: a database that is
reachable but unusable, a kubeconfig or token file that cannot be used, a simulator address
that cannot be bound, the admin address of ``run``; a group without a subcommand prints its help.

Each command runs as a real subprocess (``python -m app``), as in test_cli_errors_commands.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from test_cli_errors_commands import busy_port, cli, kube_1_34, one_error_line

from app.db.engine import make_engine
from app.db.migrate import upgrade

__all__ = ["busy_port", "kube_1_34"]  # fixtures used below

PG_ADMIN_URL = os.environ.get(
    "FABRIC_DRA_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
NO_ROLE = "fabric_dra_no_such_role"
NO_ROLE_URL = make_url(PG_ADMIN_URL).set(username=NO_ROLE, password="pw-not-shown")


def _not_a_database(tmp_path: Path) -> tuple[str, list[str]]:
    (tmp_path / "x.log").write_text("a log file, not a database\n" * 100)
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.log'}"
    return url, [f"database {url}", "file is not a database"]


def _missing_directory(tmp_path: Path) -> tuple[str, list[str]]:
    url = "sqlite+aiosqlite:////nonexistent/x.db"
    return url, [f"database {url}", "directory /nonexistent does not exist"]


def _unknown_role(tmp_path: Path) -> tuple[str, list[str]]:
    url = NO_ROLE_URL.render_as_string(hide_password=False)
    return url, ["database postgresql", f'role "{NO_ROLE}" does not exist']


def _a_directory(tmp_path: Path) -> tuple[str, list[str]]:
    url = f"sqlite+aiosqlite:///{tmp_path}"
    return url, [f"database {url}", "is a directory"]


COMMANDS = {
    "db-current": ["db", "current"],
    "db-upgrade": ["db", "upgrade"],
    "inventory": ["inventory"],
    "inventory-sync": ["inventory", "--sync"],
    "nodes": ["nodes"],
    # With a fabric manager that needs no credentials: its settings are checked first.
    "run": [
        "run",
        "--admin-port",
        "0",
        "--log-level",
        "ERROR",
        "--fabric-url",
        "http://127.0.0.1:9",
    ],
}
# Every command with the file that is not a database; the other cases with one command of
# each kind (a read, a migration, the service) to keep the subprocesses few.
CASES = [(_not_a_database, name) for name in COMMANDS] + [
    (case, name)
    for case in (_missing_directory, _unknown_role, _a_directory)
    for name in ("db-upgrade", "inventory", "run")
]


@pytest.mark.parametrize(
    ("case", "name"), CASES, ids=[f"{case.__name__.strip('_')}-{name}" for case, name in CASES]
)
async def test_an_unusable_database_is_one_line_in_every_command(
    tmp_path: Path, case: Callable[[Path], tuple[str, list[str]]], name: str
) -> None:
    url, expected = case(tmp_path)
    code, out, err = await cli(
        *COMMANDS[name],
        "--database-url",
        url,
        cwd=tmp_path,
        env={"FABRIC_DRA_FABRIC__AUTH": "none"},
    )
    assert code == 1, err
    line = one_error_line(code, err, *expected)
    assert "pw-not-shown" not in line
    assert "Background on this error" not in line
    assert out == ""


@pytest.mark.parametrize("command", [["inventory"], ["nodes"]], ids=" ".join)
async def test_reading_a_database_that_does_not_exist_says_so_and_creates_nothing(
    tmp_path: Path, command: list[str]
) -> None:
    code, out, err = await cli(*command, cwd=tmp_path)
    one_error_line(
        code,
        err,
        "database sqlite+aiosqlite:///fabric-dra.db: fabric-dra.db does not exist",
        "no inventory yet (it was not created)",
        "run `fabric-dra inventory --sync`",
    )
    assert code == 1 and out == ""
    assert not (tmp_path / "fabric-dra.db").exists()


# -- fabric-dra nodes: the Kubernetes client's files -----------------------------------------


@pytest.fixture
async def migrated(tmp_path: Path) -> str:
    """A migrated SQLite database in ``tmp_path``: ``nodes`` reads it before Kubernetes."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}"
    engine = make_engine(url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()
    return url


KUBECONFIG_OK = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: secret-token-in-kubeconfig}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize(
    ("files", "env", "expected"),
    [
        ({}, {"KUBECONFIG": "none.yaml"}, ["kubeconfig none.yaml: no such file"]),
        ({}, {"KUBECONFIG": "/tmp"}, ["kubeconfig /tmp: is a directory"]),
        (
            {"bad.yaml": "users: [{name: u, user: {token: secret-token-in-kubeconfig}\n"},
            {"KUBECONFIG": "bad.yaml"},
            ["kubeconfig bad.yaml: invalid YAML at line"],
        ),
        (
            {"empty.yaml": ""},
            {"KUBECONFIG": "empty.yaml"},
            ["kubeconfig empty.yaml: not a kubeconfig"],
        ),
        (
            {"list.yaml": "- a\n"},
            {"KUBECONFIG": "list.yaml"},
            ["kubeconfig list.yaml: not a kubeconfig"],
        ),
        (
            {"kc.yaml": KUBECONFIG_OK},
            {"KUBECONFIG": "kc.yaml", "CONTEXT": "nope"},
            ["kubeconfig kc.yaml", "Expected object with name nope"],
        ),
        (
            {"kc.yaml": "clusters: 5\n"},
            {"KUBECONFIG": "kc.yaml"},
            ["kubeconfig kc.yaml: clusters is a number, not a list of {name, cluster} entries"],
        ),
        (
            {"kc.yaml": KUBECONFIG_OK.replace('"http://127.0.0.1:1"', "7")},
            {"KUBECONFIG": "kc.yaml"},
            ["kubeconfig kc.yaml: clusters[0].cluster.server is a number, not text"],
        ),
        (
            {"kc.yaml": KUBECONFIG_OK.replace("{cluster: c, user: u}", "3")},
            {"KUBECONFIG": "kc.yaml"},
            ["kubeconfig kc.yaml: contexts[0].context is a number, not a mapping"],
        ),
        (
            {"kc.yaml": "a: " + "[" * 2000 + "]" * 2000 + "\n"},
            {"KUBECONFIG": "kc.yaml"},
            ["kubeconfig kc.yaml: nested too deeply to read"],
        ),
        (
            {},
            {"MODE": "url", "URL": "http://x", "TOKEN_FILE": "/nope"},
            ["bearer token file /nope", "No such file or directory"],
        ),
    ],
    ids=[
        *("missing", "directory", "invalid-yaml", "empty", "not-a-mapping", "context"),
        *("clusters-not-a-list", "server-not-text", "context-not-a-mapping", "too-deep"),
        "token-file",
    ],
)
async def test_nodes_with_an_unusable_kube_file_is_one_line(
    tmp_path: Path,
    migrated: str,
    files: dict[str, str],
    env: dict[str, str],
    expected: list[str],
) -> None:
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    environ = {f"FABRIC_DRA_KUBE__{key}": value for key, value in env.items()}
    environ.setdefault("FABRIC_DRA_KUBE__MODE", "kubeconfig")
    code, out, err = await cli("nodes", "--database-url", migrated, cwd=tmp_path, env=environ)
    assert code == 1, err
    line = one_error_line(code, err, "Kubernetes client: ", *expected)
    assert "secret-token-in-kubeconfig" not in line
    assert "current-context" not in line
    assert out == ""


# -- fabric-dra sim redfish ------------------------------------------------------------------


async def test_sim_redfish_on_a_busy_port_names_the_port(tmp_path: Path, busy_port: int) -> None:
    code, _, err = await cli("sim", "redfish", "--port", str(busy_port), cwd=tmp_path)
    assert code == 2
    one_error_line(code, err, "--port", str(busy_port), "Address already in use", "redfish --help")


async def test_sim_redfish_on_an_unknown_host_names_the_host(tmp_path: Path) -> None:
    code, _, err = await cli("sim", "redfish", "--host", "999.0.0.1", "--port", "0", cwd=tmp_path)
    assert code == 2
    one_error_line(code, err, "--host", "'999.0.0.1'", "redfish --help")


async def test_sim_redfish_with_a_password_file_that_is_not_text_is_one_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "pw").write_bytes(b"\xff\xfe")
    code, _, err = await cli("sim", "redfish", "--password-file", "pw", cwd=tmp_path)
    assert code == 2
    one_error_line(code, err, "--password-file", "not UTF-8 text")


# -- fabric-dra run: the admin address -------------------------------------------------------


async def test_run_with_an_admin_host_that_does_not_resolve_names_admin_host(
    tmp_path: Path, kube_1_34: str
) -> None:
    (tmp_path / "user").write_text("admin")
    (tmp_path / "password").write_text("password")
    env = {
        "FABRIC_DRA_KUBE__MODE": "url",
        "FABRIC_DRA_KUBE__URL": kube_1_34,
        "FABRIC_DRA_FABRIC__URL": "http://127.0.0.1:9",
        "FABRIC_DRA_FABRIC__USERNAME_FILE": str(tmp_path / "user"),
        "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(tmp_path / "password"),
        "FABRIC_DRA_ADMIN__HOST": "999.1.1.1",
        "FABRIC_DRA_LEADER__ENABLED": "false",
    }
    code, _, err = await cli("run", "--log-level", "ERROR", cwd=tmp_path, env=env)
    assert code == 1, err
    one_error_line(code, err, "cannot start", "admin.host '999.1.1.1'", "admin.port 8080")


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_run_without_a_fabric_manager_is_a_usage_error_before_anything_starts(
    tmp_path: Path,
) -> None:
    # A missing fabric.url was found after the database was created and migrated, and the
    # start-up log lines, with exit 1; other settings errors are one line with exit 2.
    code, out, err = await cli("run", cwd=tmp_path)
    assert code == 2, err
    one_error_line(code, err, "fabric.url is not set", "FABRIC_DRA_FABRIC__URL", "run --help")
    assert out == ""
    assert _names(tmp_path) == [], "nothing is created"
    (tmp_path / "user").write_text("admin")
    code, _, err = await cli(
        "run",
        cwd=tmp_path,
        env={
            "FABRIC_DRA_FABRIC__URL": "http://127.0.0.1:9",
            "FABRIC_DRA_FABRIC__USERNAME_FILE": str(tmp_path / "user"),
            "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(tmp_path / "no-such-file"),
        },
    )
    assert code == 2, err
    one_error_line(code, err, "fabric.password_file", "no-such-file")
    assert _names(tmp_path) == ["user"]


# -- groups without a subcommand -------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [[], ["db"], ["sim"]], ids=lambda c: " ".join(["fabric-dra", *c])
)
async def test_a_group_without_a_subcommand_prints_its_help(
    tmp_path: Path, command: list[str]
) -> None:
    code, out, err = await cli(*command, cwd=tmp_path)
    assert code == 0, err
    assert err == ""
    usage = out.splitlines()[0]
    assert usage.startswith("Usage: ") and usage.endswith(" [OPTIONS] COMMAND [ARGS]..."), out
    assert usage.split()[-4 - len(command) : -3] == ["app", *command], usage  # python -m app
    assert "\nCommands:\n" in out
    assert not out.startswith("Error")
    help_code, help_out, _ = await cli(*command, "--help", cwd=tmp_path)
    assert help_code == 0
    assert out == help_out
