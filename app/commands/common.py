"""What every subcommand shares: settings flags, logging, and running a coroutine."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click

from app.config import ConfigError, Settings, load_settings
from app.logs import setup_logging

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def settings_options(command: F) -> F:
    """Add the settings flags to ``command`` and pass it a validated ``settings`` argument.

    A bad setting ends the command with exit status 2 and one line naming it.
    """
    return _with_settings(command, None)


def settings_options_with(extra: Callable[..., dict[str, Any]]) -> Callable[[F], F]:
    """Like :func:`settings_options`; ``extra`` maps the command's own options (keyword
    arguments) to more settings flags (a nested dict), so they pass through the same
    validation and precedence as every other setting."""
    return lambda command: _with_settings(command, extra)


def _with_settings(command: F, extra: Callable[..., dict[str, Any]] | None) -> F:

    @click.option(
        "--config",
        "config_file",
        type=click.Path(path_type=Path),
        help="YAML settings file (default: $FABRIC_DRA_CONFIG).",
    )
    @click.option("--driver-name", help="DRA driver name [fabric.example.com].")
    @click.option(
        "--database-url", help="SQLAlchemy database URL [sqlite+aiosqlite:///fabric-dra.db]."
    )
    @click.option("--fabric-url", help="Fabric manager origin, e.g. https://fm.example:443.")
    @click.option(
        "--log-level",
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        help="Log level [INFO].",
    )
    @click.option("--log-json/--no-log-json", default=None, help="Log JSON lines.")
    @functools.wraps(command)
    def wrapper(
        *args: Any,
        config_file: Path | None,
        driver_name: str | None,
        database_url: str | None,
        fabric_url: str | None,
        log_level: str | None,
        log_json: bool | None,
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

    return wrapper  # type: ignore[return-value]


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion; a :class:`ConfigError` becomes a clean CLI error."""
    try:
        return asyncio.run(coroutine)
    except ConfigError as err:
        raise click.ClickException(str(err)) from None


__all__ = ["Settings", "run", "settings_options"]
