"""What every subcommand shares: settings flags, logging, and running a coroutine."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click

from app.aio import EventLoopChoice
from app.config import ConfigError, Settings, redact_url
from app.configload import load_settings
from app.db.engine import DatabaseUnavailable, run_to_end
from app.logs import setup_logging

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///fabric-dra.db"


def settings_options(command: F) -> F:
    """Add the settings flags to ``command`` and pass it a validated ``settings`` argument.

    A bad setting ends the command with exit status 2 and one line naming it.
    """
    return _with_settings(command, None)


def settings_options_with(
    extra: Callable[..., dict[str, Any]],
    *,
    fabric_url: bool = True,
    database_default: str = DEFAULT_DATABASE_URL,
    database_url: bool = True,
) -> Callable[[F], F]:
    """Like :func:`settings_options`; ``extra`` maps the command's own options (keyword
    arguments) to more settings flags (a nested dict), so they pass through the same
    validation and precedence as every other setting.

    Args:
        fabric_url: offer ``--fabric-url`` (a command that brings its own fabric does not).
        database_default: the database the command uses when none is set, for the help.
        database_url: offer ``--database-url`` (a command without a database does not).
    """
    return lambda command: _with_settings(
        command, extra, fabric_url, database_default, database_url
    )


def _with_settings(
    command: F,
    extra: Callable[..., dict[str, Any]] | None,
    offer_fabric_url: bool = True,
    database_default: str = DEFAULT_DATABASE_URL,
    offer_database_url: bool = True,
) -> F:
    options = [
        click.option(
            "--config",
            "config_file",
            type=click.Path(path_type=Path),
            help="YAML settings file (default: $FABRIC_DRA_CONFIG).",
        ),
        click.option("--driver-name", help="DRA driver name [fabric.example.com]."),
    ]
    if offer_database_url:
        options.append(
            click.option("--database-url", help=f"SQLAlchemy database URL [{database_default}].")
        )
    if offer_fabric_url:
        options.append(
            click.option("--fabric-url", help="Fabric manager origin, e.g. https://fm.example:443.")
        )
    options += [
        click.option(
            "--log-level",
            type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
            help="Log level [INFO].",
        ),
        click.option("--log-json/--no-log-json", default=None, help="Log JSON lines."),
    ]

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        config_file: Path | None,
        driver_name: str | None,
        log_level: str | None,
        log_json: bool | None,
        database_url: str | None = None,
        fabric_url: str | None = None,
        **kwargs: Any,
    ) -> Any:
        flags: dict[str, Any] = {
            "driver_name": driver_name,
            "database": {"url": database_url},
            "fabric": {"url": fabric_url},
            "log": {"level": log_level, "json_format": log_json},
        }
        if extra is not None:
            for section, values in extra(**kwargs).items():
                if isinstance(values, dict):
                    flags.setdefault(section, {}).update(values)
                else:
                    flags[section] = values
        try:
            settings = load_settings(config_file, flags)
        except ConfigError as err:
            raise click.UsageError(str(err)) from None
        setup_logging(settings.log.level, settings.log.json_format)
        return command(*args, settings=settings, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


def run(coroutine: Coroutine[Any, Any, T], event_loop: EventLoopChoice = "auto") -> T:
    """Run ``coroutine`` to completion on a loop of ``event_loop`` (the ``event_loop``
    setting); a :class:`ConfigError` or a :class:`DatabaseUnavailable` becomes a clean CLI
    error."""
    try:
        return run_to_end(coroutine, event_loop)
    except (ConfigError, DatabaseUnavailable) as err:
        raise click.ClickException(str(err)) from None


def no_schema(settings: Settings, missing: Path | None = None) -> click.ClickException:
    """The error of a read-only command whose database has no schema yet; ``missing``: the
    SQLite file does not exist (and the command did not create it)."""
    where = f"database {redact_url(settings.database.url)}"
    if missing is not None:
        return click.ClickException(
            f"{where}: {missing} does not exist, so there is no inventory yet (it was not "
            "created): run `fabric-dra inventory --sync` to list the fabric manager, or "
            "`fabric-dra db upgrade`"
        )
    return click.ClickException(
        f"{where} has no schema yet: run `fabric-dra db upgrade` or `fabric-dra inventory --sync`"
    )


__all__ = ["Settings", "no_schema", "run", "settings_options"]
