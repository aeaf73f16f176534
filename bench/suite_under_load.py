"""The test suite on a busy machine: run it several times in a row while CPU hogs (one busy
process per core, at normal priority) compete with it, and report each run's time and result.

    python -m bench.suite_under_load                  # 3 runs, one hog per core
    python -m bench.suite_under_load --runs 1 --hogs 0 -- tests/unit   # pytest arguments after --

The suite must stay green like this: a test that depends on a fixed time window instead of
waiting for what matters fails here first. This is not part of ``python -m bench`` (a full run
takes three times the suite's time). The exit status is 1 when any run failed.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import at_least, command_line

ROOT = Path(__file__).resolve().parent.parent


def _spin() -> None:  # pragma: no cover - runs in a child process until killed
    # The parent stops the hogs: a signal to the process group must not make them print.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        pass


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``"0.12 0.34 0.56"``."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_suite(pytest_args: Sequence[str], log: Path) -> tuple[int, float, str]:
    """Run pytest once with its output in ``log``. Returns (exit status, seconds, summary)."""
    started = time.monotonic()
    with log.open("w") as out:
        status = subprocess.call(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    seconds = time.monotonic() - started
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return status, seconds, lines[-1] if lines else ""


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, start the hogs, run the suite ``--runs`` times, stop the hogs."""
    parser = command_line(__doc__, "bench.suite_under_load")
    parser.add_argument("--runs", type=at_least(1), default=3, help="suite runs in a row")
    parser.add_argument(
        "--hogs",
        type=at_least(0),
        default=os.cpu_count() or 1,
        help="busy processes beside the suite (default: one per core)",
    )
    parser.add_argument(
        "--logs",
        type=Path,
        default=Path("suite-under-load"),
        help="directory for each run's pytest output",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = parser.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    print(f"load average before the hogs: {load_average()}; cores: {os.cpu_count()}", flush=True)
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    figures = []
    failed = 0
    try:
        for run in range(1, args.runs + 1):
            log = args.logs / f"run-{run}.log"
            status, seconds, summary = run_suite(args.pytest_args, log)
            failed += status != 0
            figure = {
                "run": run,
                "status": status,
                "seconds": round(seconds, 1),
                "summary": summary,
                "load_average": load_average(),
                "hogs": args.hogs,
            }
            figures.append(figure)
            print(json.dumps(figure), flush=True)
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.join()
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; the hogs are stopped", file=sys.stderr)
        sys.exit(130)
