"""The tests' own habits: shared data is found through one helper (relative to the checkout, or
``FABRIC_DRA_SHARED_DATA``), and there is one way to wait for an asynchronous outcome
(``builders.eventually``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
HELPERS = TESTS / "builders.py"


def _sources() -> list[Path]:
    return sorted(
        p
        for folder in (TESTS, ROOT / "bench")
        for p in folder.rglob("*.py")
        if p != HELPERS and p != Path(__file__).resolve()
    )


def _read_builders(tmp_path: Path, **environ: str) -> list[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FABRIC_DRA_SHARED_DATA", "REDFISH_DATA_DIR")
    }
    env.update(environ)
    code = "import builders; print(builders.SHARED_DATA); print(builders.REDFISH_DATA)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=TESTS, env=env, check=True, capture_output=True, text=True
    )
    return done.stdout.split()


def test_shared_data_is_beside_the_checkout_or_where_the_environment_says(tmp_path: Path) -> None:
    assert _read_builders(tmp_path) == [
        str(ROOT.parent / "shared" / "data"),
        str(ROOT.parent / "shared" / "data" / "redfish"),
    ]
    assert _read_builders(tmp_path, FABRIC_DRA_SHARED_DATA=str(tmp_path)) == [
        str(tmp_path),
        str(tmp_path / "redfish"),
    ]


def test_no_test_or_benchmark_finds_shared_data_on_its_own() -> None:
    # An absolute machine path, or a path built to the shared folder beside the checkout.
    absolute = re.compile(r"""["']/(work|home)/""")
    own_way = re.compile(r"""/\s*["']shared["']""")
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in _sources()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if absolute.search(line) or own_way.search(line)
    ]
    assert offenders == [], "use builders.SHARED_DATA / builders.REDFISH_DATA"


def test_there_is_one_eventually() -> None:
    waits = re.compile(r"^\s*(async\s+)?def\s+(eventually|wait_until|wait_for|_wait\w*|_until)\b")
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in _sources()
        if p.is_relative_to(TESTS)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if waits.match(line)
    ]
    assert offenders == [], "wait with builders.eventually"
