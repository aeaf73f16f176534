"""Shared fixtures: a leaked-task check, and fresh migrated databases on SQLite and PostgreSQL.

Databases: every test that asks for ``db`` runs once per database kind in
``FABRIC_DRA_TEST_DATABASES`` (default ``sqlite,postgresql``). PostgreSQL databases are cloned
from a template migrated once per session (``CREATE DATABASE ... TEMPLATE``), SQLite ones copied
from a migrated file, so each test starts from an empty schema at head in a few milliseconds.
``FABRIC_DRA_TEST_PG_ADMIN_URL`` names the PostgreSQL server (default
``postgresql://postgres@127.0.0.1:5432/postgres``). An unreachable PostgreSQL fails the tests
that need it: it is not skipped silently.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, settings

from app.db.engine import Database, make_engine
from app.db.migrate import upgrade

# Property tests check behaviour, not speed: a loaded CI machine must not fail them on time.
settings.register_profile("fabric-dra", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fabric-dra")

PG_ADMIN_URL = os.environ.get(
    "FABRIC_DRA_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
DATABASE_KINDS = [
    kind.strip()
    for kind in os.environ.get("FABRIC_DRA_TEST_DATABASES", "sqlite,postgresql").split(",")
    if kind.strip()
]
_RUN_ID = uuid.uuid4().hex[:8]
_counter = itertools.count()


def _pg_url(database: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base.replace('postgresql://', 'postgresql+asyncpg://', 1)}/{database}"


async def _pg_admin(*statements: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def _run_in_thread(coroutine_function: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Run a coroutine function to completion on a loop of its own, in a thread of its own.

    Session fixtures are first requested from inside a test's running loop, where
    ``asyncio.run`` is not allowed; a thread has no running loop.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, coroutine_function(*args)).result()


async def _migrate(url: str) -> None:
    engine = make_engine(url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head, to copy for each test."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    _run_in_thread(_migrate, f"sqlite+aiosqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """The name of a PostgreSQL database migrated to head, to clone for each test."""
    name = f"fabric_dra_tmpl_{_RUN_ID}"
    _run_in_thread(_pg_admin, f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}"')
    _run_in_thread(_migrate, _pg_url(name))
    yield name
    _run_in_thread(_pg_admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=DATABASE_KINDS)
def database_kind(request: pytest.FixtureRequest) -> str:
    """``sqlite`` or ``postgresql``: tests using it run once per kind."""
    return str(request.param)


@pytest.fixture
async def database_url(
    database_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[str]:
    """The URL of a fresh database migrated to head."""
    if database_kind == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "fabric-dra.db"
        shutil.copyfile(template, path)
        yield f"sqlite+aiosqlite:///{path}"
        return
    template_name: str = request.getfixturevalue("pg_template")
    name = f"fabric_dra_t_{_RUN_ID}_{next(_counter)}"
    await _pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{template_name}"')
    yield _pg_url(name)
    await _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def empty_database_url(database_kind: str, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a fresh, empty database (no schema), for migration tests."""
    if database_kind == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
        return
    name = f"fabric_dra_e_{_RUN_ID}_{next(_counter)}"
    await _pg_admin(f'CREATE DATABASE "{name}"')
    yield _pg_url(name)
    await _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    """A :class:`Database` on a fresh migrated database; disposed after the test."""
    database = Database.connect(database_url)
    yield database
    await database.dispose()


@pytest.fixture
async def _no_leaked_tasks() -> AsyncIterator[None]:
    yield
    # Let cancelled tasks finish their cleanup before looking.
    for _ in range(3):
        await asyncio.sleep(0)
    leaked = [
        task
        for task in asyncio.all_tasks()
        if task is not asyncio.current_task() and not task.done()
    ]
    for task in leaked:
        task.cancel()
    assert not leaked, f"test left asyncio tasks running: {leaked}"


@pytest.fixture(autouse=True)
def _leak_check(request: pytest.FixtureRequest) -> None:
    """Fail any async test that leaves asyncio tasks behind (torn down after its fixtures)."""
    if asyncio.iscoroutinefunction(getattr(request.node, "function", None)):
        request.getfixturevalue("_no_leaked_tasks")
