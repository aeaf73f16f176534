"""Pure modules import no I/O library (DESIGN.md: "Dependencies point one way").

Each module is imported in a fresh interpreter, since the test process has long loaded
SQLAlchemy, aiohttp and the Kubernetes client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IO_LIBRARIES = (
    "sqlalchemy",
    "aiohttp",
    "kubernetes_asyncio",
    "asyncpg",
    "aiosqlite",
    "tenacity",
    "alembic",
)
PURE_MODULES = (
    "app.reservations",
    "app.heldfeed",
    "app.claims.plan",
    "app.claims.drift",
    "app.controlplane.plan",
    "app.pools",
    "app.allocator",
    "app.naming",
    "app.publisher.plan",
    "app.publisher.view",
    "app.inventory.plan",
)
PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
io = set(json.loads(sys.argv[2]))
print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & io)))
"""


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_module_loads_no_io_library(module: str) -> None:
    finished = subprocess.run(
        [sys.executable, "-c", PROBE, module, json.dumps(IO_LIBRARIES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout) == []


def test_the_journal_still_exposes_the_reservation_values() -> None:
    import app.journal as journal
    import app.reservations as reservations

    for name in reservations.__all__:
        assert getattr(journal, name) is getattr(reservations, name)


def test_a_lazy_package_export_is_the_class_of_its_module() -> None:
    import app.controlplane
    import app.inventory
    import app.publisher
    from app.controlplane.controller import ControlPlaneController
    from app.inventory.sync import InventorySync
    from app.publisher.publisher import Publisher

    assert app.publisher.Publisher is Publisher
    assert app.controlplane.ControlPlaneController is ControlPlaneController
    assert app.inventory.InventorySync is InventorySync
    with pytest.raises(AttributeError):
        _ = app.publisher.NoSuchName  # type: ignore[attr-defined]
