"""``fabric-dra db``: schema migrations."""

from __future__ import annotations

import re
import sys

import click
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy.exc import SQLAlchemyError

from app.commands.common import Settings, run, settings_options
from app.config import redact_url
from app.db import migrate
from app.db.engine import check_usable, make_engine, missing_sqlite_file, unusable

# A relative step: "+1" up or "-1" down from the current revision (Alembic's notation).
_RELATIVE = re.compile(r"[+-][1-9][0-9]*")


def _known_forms() -> str:
    return (
        f"head, base, {', '.join(migrate.revisions())}, or a step from the current revision "
        "(+1; -1 after '--')"
    )


def check_revision(revision: str) -> str:
    """``revision`` when the scripts know it: ``head``, ``base``, a revision id or a relative
    step (``+N``, ``-N``).

    Raises:
        click.BadParameter: anything else, naming what is accepted (checked before the
            database is touched; Alembic's own answer to some forms, ``head+3`` say, is an
            internal assertion).
    """
    if revision in ("head", "base") or _RELATIVE.fullmatch(revision):
        return revision
    if revision in migrate.revisions():
        return revision
    raise click.BadParameter(f"unknown revision {revision!r}: give {_known_forms()}")


async def _do(settings: Settings, action: str, revision: str | None) -> str | None:
    engine = make_engine(settings.database.url)
    try:
        await check_usable(engine)
        if action == "upgrade":
            await migrate.upgrade(engine, revision or "head")
        elif action == "downgrade":
            assert revision is not None
            await migrate.downgrade(engine, revision)
        return await migrate.current(engine)
    except CommandError as err:
        if isinstance(err.__cause__, RevisionError):
            # A target that is no step from here: "-5" with two revisions, "head" as a
            # downgrade. Nothing was changed.
            raise click.UsageError(
                f"cannot {action} to {revision}: {err}; the database is unchanged"
            ) from None
        raise click.ClickException(f"migration failed: {err}") from None
    except (SQLAlchemyError, OSError) as err:
        raise unusable(engine, err) from None
    finally:
        await engine.dispose()


@click.group()
def db() -> None:
    """Database schema: upgrade, downgrade, show the current revision."""


@db.command()
@click.argument("revision", default="head", callback=lambda _c, _p, v: check_revision(v))
@settings_options
def upgrade(revision: str, settings: Settings) -> None:
    """Upgrade the schema to REVISION (default: head, the newest)."""
    now = run(_do(settings, "upgrade", revision), settings.event_loop)
    click.echo(f"database at revision {now}")


@db.command()
@click.argument("revision", callback=lambda _c, _p, v: check_revision(v))
@click.option(
    "--yes",
    is_flag=True,
    help="Do not ask: a downgrade drops tables or columns, and the rows in them.",
)
@settings_options
def downgrade(revision: str, yes: bool, settings: Settings) -> None:
    """Downgrade the schema to REVISION ('base' removes every table, with its rows)."""
    if not yes:
        question = (
            f"Downgrade {redact_url(settings.database.url)} to {revision}? Tables or columns "
            "are dropped with their rows"
        )
        if not sys.stdin.isatty():
            raise click.UsageError(
                "a downgrade drops tables or columns with their rows; give --yes to go on"
            )
        click.confirm(question, abort=True)
    now = run(_do(settings, "downgrade", revision), settings.event_loop)
    click.echo(f"database at revision {now or 'base (empty)'}")


@db.command()
@settings_options
def current(settings: Settings) -> None:
    """Print the schema's current revision ('none' for an empty database). A SQLite file that
    does not exist is not created."""
    head = migrate.head_revision()
    missing = missing_sqlite_file(make_engine(settings.database.url))
    if missing is not None:
        click.echo(f"none (no database file at {missing}; head is {head})")
        return
    now = run(_do(settings, "current", None), settings.event_loop)
    state = "up to date" if now == head else f"head is {head}"
    click.echo(f"{now or 'none'} ({state})")
