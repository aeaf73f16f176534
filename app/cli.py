"""The ``fabric-dra`` command line.

Subcommands are loaded lazily so that ``fabric-dra --help`` stays fast and the simulators
(``app.sim``) are imported only by the ``sim`` commands.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click


class LazyGroup(click.Group):
    """A click group whose subcommands live in other modules, imported on first use.

    ``lazy`` maps a command name to ``"module:attribute"``.
    """

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            module_name, attribute = self.lazy[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attribute)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


class CommandLine(LazyGroup):
    """The top-level group: every error, usage errors included, is one line on stderr.

    click's own standalone handling prints a usage error as three lines (the usage, a hint,
    the error); here it is ``Error: <what is wrong> (see 'fabric-dra <command> --help')``.
    Exit statuses are click's: 2 for usage errors, 1 for other errors.
    """

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        extra["windows_expand_args"] = windows_expand_args
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False,
                                  **extra)
        except click.UsageError as err:
            where = f" (see '{err.ctx.command_path} --help')" if err.ctx is not None else ""
            click.echo(f"Error: {' '.join(err.format_message().split())}{where}", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            click.echo(f"Error: {' '.join(err.format_message().split())}", err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


@click.group(
    cls=CommandLine,
    lazy={
        "db": "app.commands.db:db",
        "inventory": "app.commands.inventory:inventory",
        "demo": "app.commands.demo:demo",
        "run": "app.commands.run:run",
        "nodes": "app.commands.nodes:nodes",
        "forget": "app.commands.forget:forget",
        "sim": "app.cli:sim",
    },
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="fabric-dra")
def main() -> None:
    """fabric-dra: publish network-attached fabric devices to Kubernetes through DRA.

    Settings come from a YAML file (--config or FABRIC_DRA_CONFIG), environment variables
    (FABRIC_DRA_...) and flags; see `fabric-dra <command> --help`.
    """


@click.group(
    cls=LazyGroup,
    lazy={
        "redfish": "app.sim.redfish:cli",
        "kube": "app.sim.kubeapi:cli",
        "scheduler": "app.sim.scheduler:cli",
        "claim-controller": "app.sim.scheduler:claim_controller_cli",
    },
)
def sim() -> None:
    """Simulators for demos and tests: a Redfish fabric manager, a Kubernetes API, and stand-ins
    for kube-scheduler and the claim controller."""
