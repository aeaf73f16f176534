"""The ``fabric-dra`` command line.

Subcommands are loaded lazily so that ``fabric-dra --help`` stays fast. Other distributions add
commands through the ``fabric_dra.commands`` entry-point group: the simulators' distribution
(fabric-dra-sim, in ``sim/``) adds ``sim`` and ``demo`` that way, so the product never imports
the simulators, and without them those two commands say what to install.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import click

# The entry-point group through which an installed distribution adds top-level commands: each
# entry point is ``name = "module:attribute"``, naming a click command.
COMMAND_GROUP = "fabric_dra.commands"
# The commands the simulators' distribution (sim/, fabric-dra-sim) provides, and how to get it.
SIMULATOR_COMMANDS = ("demo", "sim")
SIMULATORS_INSTALL = "pip install -e ./sim"


def extension_commands() -> dict[str, EntryPoint]:
    """The commands installed distributions add: command name -> entry point (not loaded).

    Source: the ``fabric_dra.commands`` entry-point group of every installed distribution
    (``importlib.metadata.entry_points``); of two with one name, the first found is kept.
    """
    found: dict[str, EntryPoint] = {}
    for entry_point in entry_points(group=COMMAND_GROUP):
        found.setdefault(entry_point.name, entry_point)
    return found


def _needs_simulators(name: str) -> click.Command:
    """A stand-in for ``fabric-dra <name>`` while fabric-dra-sim is not installed: whatever its
    arguments (``--help`` included), it prints one line on stderr naming what to install and
    exits with status 2."""

    def explain() -> None:
        click.echo(f"fabric-dra {name} needs the simulators: {SIMULATORS_INSTALL}", err=True)
        raise click.exceptions.Exit(2)

    return click.Command(
        name,
        callback=explain,
        add_help_option=False,
        help=f"(needs the simulators: {SIMULATORS_INSTALL})",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


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
    Exit statuses are click's: 2 for usage errors, 1 for other errors. A group called without
    a subcommand prints its help on stdout, as ``--help`` does, and exits with status 0.

    Besides its own commands it offers those of :func:`extension_commands` (its own win on a
    name clash), and ``demo`` and ``sim`` always: without the simulators they say what to
    install.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *extension_commands(), *SIMULATOR_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Its own command, else an installed distribution's, else the simulators' stand-in.

        Raises:
            click.ClickException: the entry point of that name is not a click command.
        """
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        entry_point = extension_commands().get(cmd_name)
        if entry_point is not None:
            loaded = entry_point.load()
            if not isinstance(loaded, click.Command):
                raise click.ClickException(
                    f"the {COMMAND_GROUP} entry point {cmd_name} = {entry_point.value} is not "
                    "a click command"
                )
            return loaded
        if cmd_name in SIMULATOR_COMMANDS:
            return _needs_simulators(cmd_name)
        return None

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        extra["windows_expand_args"] = windows_expand_args
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as err:
            # A group called without a subcommand (``fabric-dra``, ``fabric-dra db``): not an
            # error to squash into one line, but a request for its help, printed as --help does.
            click.echo(err.ctx.get_help(), color=err.ctx.color)
            sys.exit(0)
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
        "run": "app.commands.run:run",
        "nodes": "app.commands.nodes:nodes",
        "status": "app.commands.actions:status",
        "reservations": "app.commands.actions:reservations",
        "cordon": "app.commands.actions:cordon",
        "uncordon": "app.commands.actions:uncordon",
        "release": "app.commands.actions:release",
        "forget": "app.commands.actions:forget",
        "node": "app.commands.node:node",
    },
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="fabric-dra")
def main() -> None:
    """fabric-dra: publish network-attached fabric devices to Kubernetes through DRA.

    Settings come from a YAML file (--config or FABRIC_DRA_CONFIG), environment variables
    (FABRIC_DRA_...) and flags; see `fabric-dra <command> --help`.
    """
