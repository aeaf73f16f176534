"""Soak, short form: claim cycles in a row through the reconciler (``python -m bench.soak`` in a
process of its own, so that pytest's own memory does not blur the figure), and resident memory
must not grow after the warm-up.

The full form is ``python -m bench.soak`` (2,000 cycles, about four minutes on two cores);
``FABRIC_DRA_SOAK_CYCLES`` lengthens this test. The bound is the full form's 10%: after the
warm-up the measured process holds about 128 MiB (the interpreter, SQLAlchemy, the Kubernetes
client models), so 10% is about 13 MiB, several times the allocator noise seen between runs
(1-2 MiB), and the full run grew 3.7% (4.7 MiB) over 1,800 cycles. This short form therefore
catches only gross leaks (some 60 KiB per cycle and more over its 150 measured cycles); the
slow kind needs the full form.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

CYCLES = int(os.environ.get("FABRIC_DRA_SOAK_CYCLES", "200"))
WARMUP = max(50, CYCLES // 10)
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(90 + CYCLES)
async def test_claim_cycles_in_a_row_do_not_grow_resident_memory() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.soak",
        "--cycles",
        str(CYCLES),
        "--warmup",
        str(WARMUP),
        "--max-growth",
        "0.10",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60 + CYCLES)
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    assert lines, f"no figures; stderr: {err.decode()[-2000:]}"
    figures = json.loads(lines[-1])
    print(figures)
    assert figures["cycles"] == CYCLES
    assert figures["rss_growth_after_warmup"] <= 0.10, figures
    assert process.returncode == 0, figures
