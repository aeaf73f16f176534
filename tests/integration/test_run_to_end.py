"""The commands' event loop stays open until the SQLite driver's threads have ended.

aiosqlite hands a connection's last step back to the loop from its own thread; after a failed
connect that happens while the command is already printing its one-line error. With the loop
closed first, the thread died with "Exception in thread ..." on stderr (seen under load).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from app.db.engine import Database, driver_threads_ended, run_to_end


def _driver_threads() -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.is_alive() and t.name.endswith("(_connection_worker_thread)")
    ]


async def _failed_connect(url: str) -> None:
    db = Database.connect(url)
    try:
        async with db.read() as session:
            await session.execute(text("select 1"))
    finally:
        await db.dispose()


@pytest.mark.parametrize("attempt", range(5))
def test_a_failed_connect_leaves_no_driver_thread_once_the_loop_closes(
    tmp_path: Path, attempt: int
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/x.db"
    # Only this test's threads count: another test of this worker may still hold one.
    before = set(_driver_threads())
    with pytest.raises(Exception, match="unable to open database file"):
        run_to_end(_failed_connect(url))
    assert [name for name in _driver_threads() if name not in before] == []


def test_the_wait_for_driver_threads_is_bounded() -> None:
    # A thread named as the driver's that does not end: the wait gives up, it does not hang.
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="Thread-x (_connection_worker_thread)")
    thread.start()
    try:
        assert asyncio.run(driver_threads_ended(timeout_s=0.05)) is False
    finally:
        release.set()
        thread.join()
    if not _driver_threads():  # none left by another test of this worker either
        assert asyncio.run(driver_threads_ended(timeout_s=0.05)) is True


def test_a_connection_left_open_at_exit_is_said(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="Thread-y (_connection_worker_thread)")
    thread.start()

    async def nothing() -> int:
        return 7

    try:
        assert run_to_end(nothing()) == 7
    finally:
        release.set()
        thread.join()
    assert "a database connection is still open at exit" in caplog.text
