"""Fixtures of the reliability tests: a simulated cluster and an in-process service on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from reliability_driver import Cluster, close_cluster, make_cluster
from reliability_service import Running, start_service


@pytest.fixture
async def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    """The emulator and the simulator; ``indirect`` params are simulator options."""
    options: dict[str, Any] = dict(getattr(request, "param", {}) or {})
    made = await make_cluster(tmp_path, **options)
    yield made
    await close_cluster(made)


@pytest.fixture
async def running(cluster: Cluster, tmp_path: Path) -> AsyncIterator[Running]:
    """A started service (SQLite) on ``cluster``."""
    started = await start_service(
        cluster, f"sqlite+aiosqlite:///{tmp_path}/faults.db", FABRIC_DRA_LEADER__ENABLED="false"
    )
    yield started
    await started.service.stop(deadline_s=5)
