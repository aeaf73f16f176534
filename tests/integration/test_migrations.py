"""Migrations: the stairway (upgrade, downgrade, upgrade) and models matching migrations."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import Connection

from app.db.engine import make_engine
from app.db.migrate import alembic_config, current, downgrade, head_revision, upgrade
from app.db.models import Base


def _revisions() -> list[str]:
    script = ScriptDirectory.from_config(alembic_config())
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


async def test_every_revision_upgrades_downgrades_and_upgrades_again(
    empty_database_url: str,
) -> None:
    engine = make_engine(empty_database_url)
    try:
        previous = "base"
        for revision in _revisions():
            await upgrade(engine, revision)
            assert await current(engine) == revision
            await downgrade(engine, previous)
            assert await current(engine) == (None if previous == "base" else previous)
            await upgrade(engine, revision)
            previous = revision
        assert await current(engine) == head_revision()
        await downgrade(engine, "base")

        def tables(conn: Connection) -> set[str]:
            return set(inspect(conn).get_table_names()) - {"alembic_version"}

        async with engine.connect() as conn:
            assert await conn.run_sync(tables) == set()
    finally:
        await engine.dispose()


async def test_models_and_migrations_agree(empty_database_url: str) -> None:
    engine = make_engine(empty_database_url)
    try:
        await upgrade(engine)

        def diff(conn: Connection) -> list[Any]:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))

        async with engine.connect() as conn:
            assert await conn.run_sync(diff) == []
    finally:
        await engine.dispose()


async def test_upgrading_twice_is_harmless(empty_database_url: str) -> None:
    engine = make_engine(empty_database_url)
    try:
        await upgrade(engine)
        await upgrade(engine)
        assert await current(engine) == head_revision()
    finally:
        await engine.dispose()
