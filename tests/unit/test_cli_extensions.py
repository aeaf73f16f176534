"""The product's command line and the simulators' distribution (sim/, fabric-dra-sim).

``fabric-dra sim ...`` and ``fabric-dra demo`` come from the ``fabric_dra.commands`` entry
points of fabric-dra-sim; without it they say what to install. The product's code never
imports the simulators.
"""

from __future__ import annotations

import ast
from importlib.metadata import EntryPoint, EntryPoints
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import app.cli as cli_module
from app.cli import COMMAND_GROUP, extension_commands, main

ROOT = Path(__file__).resolve().parents[2]
SIMULATORS = "fabric_dra_sim"


@click.command()
def hello() -> None:
    """Say hello (an extension command for these tests)."""
    click.echo("hello from an extension")


def _installed(monkeypatch: pytest.MonkeyPatch, *points: tuple[str, str]) -> None:
    """Pretend that only ``points`` (name, "module:attribute") are in the entry-point group."""
    found = EntryPoints(EntryPoint(name, value, COMMAND_GROUP) for name, value in points)

    def entry_points(*, group: str) -> EntryPoints:
        assert group == COMMAND_GROUP
        return found

    monkeypatch.setattr(cli_module, "entry_points", entry_points)


@pytest.mark.parametrize(
    "args",
    [
        ["demo"],
        ["demo", "--once", "--admin-port", "0"],
        ["demo", "--help"],
        ["sim"],
        ["sim", "--help"],
        ["sim", "redfish", "--port", "0"],
    ],
)
def test_without_the_simulators_demo_and_sim_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    _installed(monkeypatch)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"fabric-dra {args[0]} needs the simulators: pip install -e ./sim"
    ]


def test_without_the_simulators_the_help_still_lists_demo_and_sim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _installed(monkeypatch)
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    listed = {
        line.split()[0]
        for line in result.stdout.splitlines()
        if line.startswith("  ") and line.split()
    }
    assert {"db", "demo", "inventory", "nodes", "run", "sim"} <= listed
    assert "pip install -e ./sim" in result.stdout


def test_an_installed_distribution_adds_commands_through_the_entry_point_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _installed(monkeypatch, ("hello", f"{__name__}:hello"))
    assert set(extension_commands()) == {"hello"}
    result = CliRunner().invoke(main, ["hello"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "hello from an extension\n"
    assert "hello" in CliRunner().invoke(main, ["--help"]).stdout


def test_an_entry_point_never_replaces_a_built_in_command(monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch, ("db", f"{__name__}:hello"))
    result = CliRunner().invoke(main, ["db", "--help"])
    assert result.exit_code == 0, result.output
    assert "hello" not in result.stdout and "upgrade" in result.stdout


def test_an_entry_point_that_is_not_a_command_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _installed(monkeypatch, ("odd", f"{__name__}:SIMULATORS"))
    result = CliRunner().invoke(main, ["odd"])
    assert result.exit_code == 1, result.output
    assert len(result.stderr.splitlines()) == 1
    assert "odd" in result.stderr and COMMAND_GROUP in result.stderr


def test_with_fabric_dra_sim_installed_demo_and_sim_are_its_commands() -> None:
    from fabric_dra_sim.cli import sim
    from fabric_dra_sim.demo import demo

    points = extension_commands()
    assert points["demo"].value == "fabric_dra_sim.demo:demo"
    assert points["sim"].value == "fabric_dra_sim.cli:sim"
    ctx = click.Context(main, info_name="fabric-dra")
    assert main.get_command(ctx, "demo") is demo
    assert main.get_command(ctx, "sim") is sim


def test_the_product_never_imports_the_simulators() -> None:
    offenders = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source, str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(name.split(".")[0] == SIMULATORS for name in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        if SIMULATORS in source:  # importlib.import_module("...") and the like
            offenders.append(f"{path.relative_to(ROOT)} names {SIMULATORS}")
    assert not offenders
    assert not (ROOT / "app" / "sim").exists()
