"""The dashboard in a real browser: headless Chromium loads it from the app on 127.0.0.1.

Chromium runs with a fresh profile and no network beyond the page; the test checks that the
screenshot is a real PNG, that the rendered DOM shows the pools, and that the console is clean
(a blocked inline style or any other Content-Security-Policy violation is a console error).
"""

from __future__ import annotations

import asyncio
import shutil
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select
from test_admin import Live, live_status, make_context, seed

from app.admin.app import serve
from app.admin.history import History, take_sample
from app.db.engine import Database
from app.db.models import Device, Reservation
from app.journal import Journal

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTH, HEIGHT = 1440, 1200
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-extensions",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
)

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (Debian: apt-get install -y chromium); the dashboard's "
    "server-side rendering is still tested in test_admin.py",
)


@pytest.fixture
async def dashboard_url(db: Database) -> AsyncIterator[str]:
    seeded = await seed(db)
    # Things that need an operator: a detach the fabric refused for good, and a device another
    # server holds with no reservation of ours.
    journal = Journal(db)
    assert await journal.begin_detach(seeded.attached) is not None
    assert (
        await journal.transition(
            seeded.attached,
            ["detaching"],
            "detach-failed",
            error="detach: HTTP 406: the block is in use",
        )
        is not None
    )
    async with db.write() as session:
        held = select(Reservation.device_id).where(Reservation.state != "released")
        free = (
            await session.scalars(
                select(Device).where(Device.id.not_in(held)).order_by(Device.name).limit(1)
            )
        ).one()
        free.host_id = "someone-elses-server"
    # Broken states that get banners: a stale inventory, leadership lost a minute ago, and a
    # field the API server dropped.
    status = live_status()
    status["inventory"][0].update(stale=True, consecutive_failures=4, last_error="timeout")
    status["leader"].update(lost_at=status["inventory"][0]["last_attempt_at"], lost_count=1)
    status["publisher"]["dropped_paths"] = ["spec.devices[].taints"]
    context = make_context(db, seeded, Live(status=status))
    # An hour of history: utilisation rising, one attach time, claims waiting.
    context.history = History(window_s=3600, interval_s=30)
    start = time.time() - 3600
    for step in range(0, 3600, 30):
        await take_sample(context, context.history, start + step)
    runner = await serve(context, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/"
    finally:
        await runner.cleanup()


async def chromium(profile: Path, *args: str) -> tuple[str, str]:
    """Run headless Chromium with a fresh profile; returns (stdout, stderr)."""
    assert CHROMIUM is not None
    process = await asyncio.create_subprocess_exec(
        CHROMIUM,
        *FLAGS,
        f"--user-data-dir={profile}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, err.decode(errors="replace")[-3000:]
    return out.decode(errors="replace"), err.decode(errors="replace")


def console_lines(stderr: str) -> list[str]:
    """Chromium's log lines for page console messages (CSP violations among them)."""
    return [
        line
        for line in stderr.splitlines()
        if "CONSOLE" in line or "Content Security Policy" in line
    ]


async def test_the_dashboard_renders_in_chromium_with_a_clean_console(
    dashboard_url: str, tmp_path: Path
) -> None:
    screenshot = tmp_path / "dashboard.png"
    _, stderr = await chromium(
        tmp_path / "profile-1",
        f"--window-size={WIDTH},{HEIGHT}",
        f"--screenshot={screenshot}",
        dashboard_url,
    )
    data = screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (WIDTH, HEIGHT)
    assert console_lines(stderr) == []

    dom, stderr = await chromium(tmp_path / "profile-2", "--dump-dom", dashboard_url)
    for text in (
        "us-east/rack-01",
        "us-east/rack-02",
        "us-west/rack-07",
        "Recent errors",
        "update ResourceSlice: 409",
        "team-c/claim-c",
        '<svg class="bar"',
        "banner-detach-failed",
        "HTTP 406: the block is in use",
        "banner-held-elsewhere",
        "someone-elses-server",
        "Needs an operator",
        "banner-stale-memory",
        "The inventory of fabric manager memory is stale.",
        "banner-leadership-lost",
        "banner-dropped-fields",
        "spec.devices[].taints",
        '<div class="cards stale">',
        'id="history"',
        '<svg class="spark small"',
    ):
        assert text in dom, text
    assert console_lines(stderr) == []
