"""Schema migrations (Alembic), run in-process inside the event loop.

The Alembic scripts live in the project's top-level ``migrations/`` folder, shipped in the wheel
as the package ``app.migrations``. On PostgreSQL an advisory lock serialises replicas that start
at once, so only one of them migrates.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

# An arbitrary constant shared by every fabric-dra replica: pg_advisory_lock(key).
_PG_LOCK_KEY = 0x6661627269632D64  # "fabric-d"


def _script_location() -> str:
    # ``migrations/`` is mapped to ``app.migrations`` by setup.py, which type checkers cannot see.
    module = importlib.import_module("app.migrations")
    return str(Path(str(module.__file__)).parent)


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic Config pointing at the migration scripts, carrying ``connection``."""
    config = Config()
    config.set_main_option("script_location", _script_location())
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision id in the scripts.

    Raises:
        RuntimeError: the scripts have no single head.
    """
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError("the migration scripts have no single head")
    return head


def revisions() -> list[str]:
    """Every revision id in the scripts, oldest first."""
    script = ScriptDirectory.from_config(alembic_config())
    return [r.revision for r in reversed(list(script.walk_revisions()))]


async def _run(engine: AsyncEngine, action: Any) -> Any:
    async with engine.connect() as conn:
        locked = engine.dialect.name == "postgresql"
        if locked:
            await conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _PG_LOCK_KEY})
            await conn.commit()
        try:
            result = await conn.run_sync(action)
            await conn.commit()
            return result
        finally:
            if locked:
                await conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _PG_LOCK_KEY})
                await conn.commit()


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Upgrade the schema to ``revision`` (default: the newest).

    Raises:
        alembic.util.CommandError: an unknown revision.
    """
    await _run(engine, lambda conn: command.upgrade(alembic_config(conn), revision))


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    """Downgrade the schema to ``revision`` (``base`` removes every table).

    Raises:
        alembic.util.CommandError: an unknown revision.
    """
    await _run(engine, lambda conn: command.downgrade(alembic_config(conn), revision))


async def current(engine: AsyncEngine) -> str | None:
    """The schema's current revision, or None for an empty database."""

    def read(conn: Connection) -> str | None:
        return MigrationContext.configure(conn).get_current_revision()

    async with engine.connect() as conn:
        result: str | None = await conn.run_sync(read)
        return result
