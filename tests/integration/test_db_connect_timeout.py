"""A PostgreSQL server that accepts the connection and never answers fails a command in
``POSTGRESQL_CONNECT_TIMEOUT_S`` (asyncpg's own default is 60 s), in one line."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.db import engine as db_engine
from app.db.engine import DatabaseUnavailable, check_usable, make_engine


async def test_a_silent_postgresql_server_fails_within_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setattr(db_engine, "POSTGRESQL_CONNECT_TIMEOUT_S", 1.0)
    engine = make_engine(f"postgresql+asyncpg://someuser:secret@127.0.0.1:{port}/fabric")
    started = time.monotonic()
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            await check_usable(engine)
    finally:
        await engine.dispose()
        for writer in held:
            writer.close()
        server.close()
    assert time.monotonic() - started < 30  # asyncpg alone would wait 60 s
    message = str(caught.value)
    assert message == (
        f"database postgresql+asyncpg://***@127.0.0.1:{port}/fabric: "
        "no answer within 1 s (TimeoutError)"
    )
    assert "secret" not in message and "someuser" not in message
