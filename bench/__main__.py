"""The benchmark suite: ``python -m bench`` runs every benchmark, prints a table of figures and
targets, and writes ``bench/results.json``.

Each case runs in its own Python process (``python -m bench.<name> ... --json FILE``), and that
process starts the Redfish simulator and the Kubernetes API emulator in processes of their own,
so the figures (CPU, peak resident memory) are the controller's alone and one case's peak
memory does not leak into the next one's.

    python -m bench                   # full mode: every size, up to 100,000 devices
    python -m bench --short           # the quick run for CI (about a minute and a half)
    python -m bench --only publish    # one benchmark (repeat --only for more)
    python -m bench --list            # the cases of a mode, and stop

A full run of every benchmark also copies its table into README.md, between the
``bench:results`` markers of the Performance section (``--no-readme`` leaves README.md alone).
The exit status is 1 when a case failed or timed out, else 0; missed targets are reported in
the table and in the results (``"met": false``), not in the exit status.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REFERENCE_RECORDS, REFERENCE_ROUNDS, command_line

HERE = Path(__file__).resolve().parent
DEFAULT_RESULTS = HERE / "results.json"
README = HERE.parent / "README.md"
README_START = "<!-- bench:results:start -->"
README_END = "<!-- bench:results:end -->"
BENCHMARKS = (
    "inventory_sync",
    "publish",
    "claims",
    "drift",
    "events",
    "controlplane",
    "allocate",
    "journal",
    "kubeapi",
    "node",
    "cdim",
)
_DATABASES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
MB = 1_000_000 / 2**20  # MiB per MB: targets speak of MB, the kernel reports KiB


@dataclass(frozen=True)
class Case:
    """One run of one benchmark script in its own process."""

    benchmark: str
    label: str
    args: tuple[str, ...]
    timeout_s: float


@dataclass
class Outcome:
    """What one case produced."""

    case: Case
    status: str  # "ok", "failed" or "timeout"
    seconds: float
    figures: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    # os.getloadavg() (1, 5 and 15 minutes) just before and just after the case ran.
    load_start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # The share of the machine's CPU time the hypervisor gave other guests while the case ran
    # (steal, %), or None where /proc/stat does not say.
    steal_percent: float | None = None


def cases(short: bool) -> list[Case]:
    """Every case of the chosen mode, in the order they run."""
    sizes = (1_000,) if short else (1_000, 10_000, 100_000)
    out: list[Case] = []
    for devices in sizes:
        # The 100,000 inventory is bounded at 30 minutes; smaller sizes at 10.
        out.append(
            Case(
                "inventory_sync",
                f"{devices:,} devices",
                ("--devices", str(devices)),
                1800 if devices >= 100_000 else 600,
            )
        )
    if not short:
        # The same listing without $expand (one GET per block and per device), for comparison.
        out.append(
            Case(
                "inventory_sync",
                "10,000 devices, no $expand",
                ("--devices", "10000", "--no-expand"),
                900,
            )
        )
    for devices in sizes:
        out.append(
            Case(
                "publish",
                f"{devices:,} devices",
                ("--devices", str(devices)),
                1800 if devices >= 100_000 else 600,
            )
        )
    claims = 60 if short else 400
    # The claim path on both databases, and (full mode) as the inventory grows.
    claim_cases = (
        ((1_000, "sqlite"), (1_000, "postgresql"))
        if short
        else ((1_000, "sqlite"), (1_000, "postgresql"), (10_000, "sqlite"), (100_000, "sqlite"))
    )
    for devices, database in claim_cases:
        out.append(
            Case(
                "claims",
                f"{claims} claims, {devices:,} devices, {_DATABASES[database]}",
                (
                    "--claims",
                    str(claims),
                    "--workers",
                    "8",
                    "--devices",
                    str(devices),
                    "--database",
                    database,
                ),
                1200 if devices >= 100_000 else 600,
            )
        )
    if short:
        out.append(
            Case(
                "drift",
                "1,000 devices, 4 devices lost",
                ("--devices", "1000", "--samples", "4"),
                300,
            )
        )
    else:
        out.append(
            Case(
                "drift",
                "10,000 devices, 10 devices lost",
                ("--devices", "10000", "--samples", "10"),
                1200,
            )
        )
    # A health change to its taint in the slice: with events, and with polling back to back.
    event_cases = (
        ((1_000, "events"),)
        if short
        else ((10_000, "events"), (10_000, "polling"), (100_000, "events"))
    )
    for devices, mode in event_cases:
        samples = 10 if short else 20
        out.append(
            Case(
                "events",
                f"{devices:,} devices, {samples} changes, {mode}",
                ("--devices", str(devices), "--samples", str(samples), "--mode", mode),
                1800 if devices >= 100_000 else 600,
            )
        )
    if short:
        out.append(
            Case(
                "controlplane",
                "2,000 devices, 40 pods",
                (
                    "--devices",
                    "2000",
                    "--racks",
                    "40",
                    "--pods",
                    "40",
                    "--in-flight",
                    "8",
                    "--warmup",
                    "5",
                ),
                300,
            )
        )
        out.append(
            Case("allocate", "10,000 devices, 300 allocations", ("--allocations", "300"), 300)
        )
    else:
        # Pods in flight (16 and 64), both databases, and the inventory's growth. 600 pods
        # measured (about 4 s; in a window of 2 s one pause of 0.2 s cost a tenth of the
        # figure) where the inventory has room for them; of the 1,000 devices the claim
        # selects 400, which take the warm-up's 20 pods and 300 more.
        for devices, pods, in_flight, database in (
            (10_000, 600, 16, "sqlite"),
            (10_000, 600, 64, "sqlite"),
            (10_000, 600, 16, "postgresql"),
            (1_000, 300, 16, "sqlite"),
            (100_000, 600, 16, "sqlite"),
        ):
            out.append(
                Case(
                    "controlplane",
                    f"{devices:,} devices, {pods} pods, {in_flight} in flight, "
                    f"{_DATABASES[database]}",
                    (
                        "--devices",
                        str(devices),
                        "--pods",
                        str(pods),
                        "--in-flight",
                        str(in_flight),
                        "--database",
                        database,
                    ),
                    1800 if devices >= 100_000 else 1200,
                )
            )
        # Node events as a real cluster sends them: each kubelet reports its Node's status at
        # least every 5 minutes, so 400 nodes send a few a second and a big cluster tens. 20
        # a second over 400 nodes; none of them changes a pool's reach or a host.
        out.append(
            Case(
                "controlplane",
                "10,000 devices on 400 nodes, 600 pods, 16 in flight, SQLite, "
                "20 Node status writes/s",
                (
                    "--devices",
                    "10000",
                    "--racks",
                    "400",
                    "--pods",
                    "600",
                    "--in-flight",
                    "16",
                    "--database",
                    "sqlite",
                    "--node-updates",
                    "20",
                ),
                1200,
            )
        )
        # The allocator alone as pools are added (125 devices each; a node reaches a quarter
        # of them): its cost must grow no faster than the pools a node reaches. Every case
        # makes the same 150 allocations, which all fit in the smallest, so each case does
        # the same work against the same number of devices in use.
        for pools in (8, 80, 800):
            out.append(
                Case(
                    "allocate",
                    f"{pools * 125:,} devices in {pools} pools, 150 allocations",
                    ("--allocations", "150", "--devices", str(pools * 125), "--pools", str(pools)),
                    900,
                )
            )
    # A reserve as the journal fills with active reservations (and a history of released
    # ones): its cost must not grow with them.
    devices, released, reserves = (2_000, 5_000, 200) if short else (20_000, 50_000, 1_000)
    for database in ("sqlite",) if short else ("sqlite", "postgresql"):
        for active in (0, devices // 2):
            out.append(
                Case(
                    "journal",
                    f"{active:,} active and {released:,} released reservations, "
                    f"{_DATABASES[database]}",
                    (
                        "--devices",
                        str(devices),
                        "--active",
                        str(active),
                        "--released",
                        str(released),
                        "--reserves",
                        str(reserves),
                        "--database",
                        database,
                    ),
                    300,
                )
            )
    requests = 50 if short else 500
    out.append(
        Case("kubeapi", f"{requests} requests of each kind", ("--requests", str(requests)), 300)
    )
    for per_claim, claims in ((1, 40), (8, 20)) if short else ((1, 200), (8, 100)):
        out.append(
            Case(
                "node",
                f"{claims} claims of {per_claim} device{'s' if per_claim > 1 else ''}",
                ("--devices-per-claim", str(per_claim), "--claims", str(claims)),
                300,
            )
        )
    # NEC CDIM: attaches one at a time and many at once (batched and not), claims end to end;
    # the short run uses a fifth of a real installation's apply time.
    in_flight, sequential, apply_s = (8, 2, "0.2") if short else (32, 8, "1.0")
    out.append(
        Case(
            "cdim",
            f"{in_flight} in flight, applies of {apply_s} s",
            (
                "--in-flight",
                str(in_flight),
                "--sequential",
                str(sequential),
                "--apply-seconds",
                apply_s,
            ),
            600,
        )
    )
    return out


def run_case(case: Case) -> Outcome:
    """Run ``case`` (see :func:`_run_case`), with the load average at its start and end and
    the CPU time stolen meanwhile (:func:`steal_percent`)."""
    load_start = os.getloadavg()
    cpu_start = machine_cpu_ticks()
    outcome = _run_case(case)
    outcome.load_start, outcome.load_end = load_start, os.getloadavg()
    outcome.steal_percent = steal_percent(cpu_start, machine_cpu_ticks())
    return outcome


def machine_cpu_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(all CPU time, stolen CPU time) of the machine since boot, in clock ticks, from the
    ``cpu`` line of ``/proc/stat`` (proc(5): user, nice, system, idle, iowait, irq, softirq,
    steal; guest time is counted in user already and left out); None where it cannot be read.
    """
    try:
        with stat.open(encoding="ascii") as lines:
            first = lines.readline().split()
        if first[0] != "cpu":
            return None
        ticks = [int(v) for v in first[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    if len(ticks) < 8:
        return None
    return sum(ticks), ticks[7]


def steal_percent(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time between two :func:`machine_cpu_ticks` readings that
    the hypervisor gave to other guests (steal), in %: a busy host that the load average does
    not show. None when either reading is missing or no time passed."""
    if start is None or end is None or end[0] <= start[0]:
        return None
    return 100.0 * max(0, end[1] - start[1]) / (end[0] - start[0])


def _load(values: Sequence[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def _steal(percent: float | None) -> str:
    return "not known" if percent is None else f"{percent:.1f} %"


def _run_case(case: Case) -> Outcome:
    """Run ``case`` in a new process group (so that a timeout also ends the simulator and
    emulator it started); return its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        log = Path(tmp) / "output.log"
        command = [sys.executable, "-m", f"bench.{case.benchmark}", *case.args, "--json", str(out)]
        started = time.perf_counter()
        with log.open("wb") as sink:
            process = subprocess.Popen(
                command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=HERE.parent,
                start_new_session=True,
            )
            try:
                code = process.wait(case.timeout_s)
            except subprocess.TimeoutExpired:
                _end_group(process)
                return Outcome(
                    case,
                    "timeout",
                    time.perf_counter() - started,
                    error=f"did not finish within {case.timeout_s:.0f} s",
                )
            except BaseException:
                _end_group(process)
                raise
        seconds = time.perf_counter() - started
        if code != 0 or not out.exists():
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            return Outcome(
                case, "failed", seconds, error=f"exit status {code}: " + " | ".join(tail)
            )
        return Outcome(case, "ok", seconds, figures=json.loads(out.read_text()))


def _end_group(process: subprocess.Popen[bytes]) -> None:
    """End the process group that ``process`` leads (it and what it started)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# --- the table: which figures to show, and the targets ----------------------------------------


@dataclass(frozen=True)
class Metric:
    """One figure of a benchmark's output, shown in the table, with its target if any.

    ``value`` reads the figure from the case's output lines (None: not applicable there);
    ``target`` is (text, test); ``when`` limits the target to some cases (e.g. 100,000
    devices).
    """

    benchmark: str
    name: str
    value: Callable[[list[dict[str, Any]]], float | int | None]
    unit: str = ""
    target: tuple[str, Callable[[float], bool]] | None = None
    when: Callable[[list[dict[str, Any]]], bool] = lambda _: True


def _key(name: str, step: str | None = None) -> Callable[[list[dict[str, Any]]], Any]:
    def read(figures: list[dict[str, Any]]) -> Any:
        for line in figures:
            if (step is None or line.get("step") == step) and name in line:
                return line[name]
        return None

    return read


def _ratio(numerator: str, denominator: str) -> Callable[[list[dict[str, Any]]], Any]:
    def read(figures: list[dict[str, Any]]) -> Any:
        line = figures[0]
        return round(line[numerator] / line[denominator], 3) if line[denominator] else None

    return read


def _mb(name: str) -> Callable[[list[dict[str, Any]]], Any]:
    def read(figures: list[dict[str, Any]]) -> Any:
        value = _key(name)(figures)
        return None if value is None else round(value / MB, 1)

    return read


def _ms(name: str, step: str | None = None) -> Callable[[list[dict[str, Any]]], Any]:
    def read(figures: list[dict[str, Any]]) -> Any:
        value = _key(name, step)(figures)
        return None if value is None else round(value * 1000, 1)

    return read


def _at_least(devices: int) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda figures: int(figures[0].get("devices", 0)) >= devices


METRICS: tuple[Metric, ...] = (
    Metric("inventory_sync", "devices listed", _key("devices")),
    Metric("inventory_sync", "device listing", _key("list_devices_seconds"), "s"),
    Metric("inventory_sync", "first sync", _key("first_sync_seconds"), "s"),
    Metric("inventory_sync", "first sync rows written", _key("first_sync_rows_written")),
    Metric("inventory_sync", "first sync CPU", _key("first_sync_cpu_seconds"), "s"),
    Metric(
        "inventory_sync",
        "first sync CPU per 1,000 devices",
        _key("first_sync_ref_units_per_1000_devices"),
        "ref",
    ),
    Metric("inventory_sync", "no-change sync", _key("nochange_sync_seconds"), "s"),
    Metric(
        "inventory_sync",
        "no-change sync rows written",
        _key("nochange_sync_rows_written"),
        target=("0", lambda v: v == 0),
    ),
    Metric("inventory_sync", "peak resident memory", _mb("peak_rss_mib"), "MB"),
    Metric("publish", "slices", _key("slices")),
    Metric("publish", "first publish", _key("first_publish_seconds"), "s"),
    Metric(
        "publish",
        "first publish writes / minimum",
        _ratio("first_publish_writes", "minimum_writes"),
        target=("1.0", lambda v: v == 1),
    ),
    Metric("publish", "first publish CPU", _key("first_publish_cpu_seconds"), "s"),
    Metric(
        "publish",
        "first publish CPU per 1,000 devices",
        _key("first_publish_ref_units_per_1000_devices"),
        "ref",
    ),
    Metric(
        "publish",
        "peak resident memory",
        _mb("peak_rss_mib"),
        "MB",
        target=("< 400 at 100,000 devices", lambda v: v < 400),
        when=_at_least(100_000),
    ),
    Metric(
        "publish",
        "no-change resync writes",
        _key("nochange_resync_writes"),
        target=("0", lambda v: v == 0),
    ),
    Metric(
        "publish",
        "no-change resync CPU",
        _key("nochange_resync_cpu_seconds"),
        "s",
        target=("< 2 s at 100,000 devices", lambda v: v < 2),
        when=_at_least(100_000),
    ),
    Metric(
        "publish",
        "one device changed: writes",
        _key("one_change_writes"),
        target=("1", lambda v: v == 1),
    ),
    Metric(
        "publish",
        "restart adoption writes",
        _key("restart_adopt_writes"),
        target=("0", lambda v: v == 0),
    ),
    Metric(
        "claims",
        "claims per second",
        _key("claims_per_second"),
        "/s",
        target=(">= 150", lambda v: v >= 150),
    ),
    Metric("claims", "reconcile p50", _key("reconcile_p50_ms"), "ms"),
    Metric(
        "claims",
        "reconcile p99",
        _key("reconcile_p99_ms"),
        "ms",
        target=("< 50 ms", lambda v: v < 50),
    ),
    Metric("claims", "reconcile p99 in the burst", _key("burst_reconcile_p99_ms"), "ms"),
    Metric(
        "claims",
        "CPU per claim cycle",
        _key("cpu_ms_per_claim_cycle"),
        "ms",
        target=("<= 8 ms", lambda v: v <= 8),
    ),
    Metric("claims", "CPU per claim cycle (ratio)", _key("ref_units_per_claim_cycle"), "ref"),
    Metric(
        "claims", "fabric reads to verify, per attach or detach", _key("verify_reads_per_operation")
    ),
    *(
        Metric("claims", f"{label} CPU per claim cycle", _key(key), "ms")
        for key, label in (
            ("fabric_simulator_cpu_ms_per_claim_cycle", "Redfish simulator"),
            ("emulator_cpu_ms_per_claim_cycle", "API emulator"),
            ("status_writer_cpu_ms_per_claim_cycle", "status writer (scheduler's part)"),
            ("database_server_cpu_ms_per_claim_cycle", "PostgreSQL server"),
            ("all_processes_cpu_ms_per_claim_cycle", "all processes'"),
        )
    ),
    Metric(
        "claims",
        "database statements per claim cycle",
        _key("database_statements_per_claim_cycle"),
    ),
    Metric(
        "claims",
        "database transactions per claim cycle",
        _key("database_transactions_per_claim_cycle"),
    ),
    Metric(
        "claims",
        "claim cycles per second (attach and release)",
        _key("claim_cycles_per_second"),
        "/s",
    ),
    Metric(
        "claims",
        "claim cycles per second the CPUs allow (CPUs / all processes' CPU per cycle)",
        _key("cpu_bound_claim_cycles_per_second"),
        "/s",
    ),
    Metric("claims", "peak resident memory", _mb("peak_rss_mib"), "MB"),
    Metric("drift", "full inventory sync", _key("full_sync_seconds_mean"), "s"),
    Metric("drift", "device lost -> claim not ready, p50", _key("lost_to_not_ready_p50_s"), "s"),
    Metric("drift", "device lost -> claim not ready, p99", _key("lost_to_not_ready_p99_s"), "s"),
    Metric(
        "drift",
        "device lost -> attached and ready again, p99",
        _key("lost_to_ready_again_p99_s"),
        "s",
    ),
    Metric("events", "change -> taint in the slice, p50", _key("latency_p50_s"), "s"),
    Metric(
        "events",
        "change -> taint in the slice, p99",
        _key("latency_p99_s"),
        "s",
        target=("< 2 with events", lambda v: v < 2),
        when=lambda f: _key("mode")(f) == "events",
    ),
    Metric("events", "CPU per change", _key("cpu_ms_per_change"), "ms"),
    Metric(
        "events",
        "ResourceSlice writes per change",
        _key("slice_writes_per_change"),
        target=("1", lambda v: v == 1),
    ),
    Metric(
        "events",
        "device rows written per change",
        _key("device_rows_per_change"),
        target=("1", lambda v: v == 1),
        when=lambda f: _key("mode")(f) == "events",
    ),
    Metric("events", "peak resident memory", _mb("peak_rss_mib"), "MB"),
    Metric(
        "controlplane",
        "allocations per second",
        _key("allocations_per_second", "allocations"),
        "/s",
        target=(">= 150", lambda v: v >= 150),
    ),
    Metric("controlplane", "pod to bind p50", _key("p50_ms", "allocations"), "ms"),
    Metric("controlplane", "pod to bind p99", _key("p99_ms", "allocations"), "ms"),
    Metric(
        "controlplane",
        "API requests per allocation",
        _key("api_requests_per_allocation", "allocations"),
    ),
    Metric(
        "controlplane",
        "CPU per allocation",
        _ms("cpu_seconds_per_allocation", "allocations"),
        "ms",
        target=("<= 8 ms", lambda v: v <= 8),
    ),
    Metric(
        "controlplane",
        "CPU per allocation (ratio)",
        _key("ref_units_per_allocation", "allocations"),
        "ref",
    ),
    *(
        Metric(
            "controlplane", f"pod to bind, {label}, p50", _key(f"{key}_p50_ms", "allocations"), "ms"
        )
        for key, label in (
            ("to_context", "until the scheduling context is written"),
            ("driver_answers", "waiting for the driver's answers"),
            ("node_selection", "choosing the node"),
            ("driver_allocation", "waiting for the driver's allocation"),
            ("to_bind", "reserving and binding"),
        )
    ),
    Metric(
        "controlplane",
        "scheduling context passes per allocation",
        _key("context_passes_per_allocation", "allocations"),
    ),
    Metric(
        "controlplane",
        "emulator CPU per allocation",
        _key("emulator_cpu_ms_per_allocation", "allocations"),
        "ms",
    ),
    Metric(
        "controlplane",
        "scheduler stand-in CPU per allocation",
        _key("standin_cpu_ms_per_allocation", "allocations"),
        "ms",
    ),
    Metric(
        "controlplane",
        "PostgreSQL server CPU per allocation",
        _key("database_server_cpu_ms_per_allocation", "allocations"),
        "ms",
    ),
    Metric(
        "controlplane",
        "all processes' CPU per allocation",
        _key("all_processes_cpu_ms_per_allocation", "allocations"),
        "ms",
    ),
    Metric(
        "controlplane",
        "allocations per second the CPUs allow (CPUs / all processes' CPU per allocation)",
        _key("cpu_bound_allocations_per_second", "allocations"),
        "/s",
    ),
    Metric(
        "controlplane",
        "Node status writes meanwhile (warm-up included)",
        lambda f: _key("node_status_writes", "allocations")(f) or None,
    ),
    Metric(
        "controlplane",
        "node answers worked out per allocation",
        _key("node_answers_computed_per_allocation", "allocations"),
    ),
    Metric("journal", "CPU per reserve", _key("cpu_ms_per_reserve", "reserves"), "ms"),
    Metric(
        "journal",
        "PostgreSQL server CPU per reserve",
        lambda f: (
            _key("database_server_cpu_ms_per_reserve", "reserves")(f)
            if _key("database", "reserves")(f) == "postgresql"
            else None
        ),
        "ms",
    ),
    Metric("journal", "reserve p99", _key("p99_ms", "reserves"), "ms"),
    Metric(
        "allocate",
        "allocations per second (allocator alone)",
        _key("allocations_per_second", "allocations"),
        "/s",
    ),
    Metric("allocate", "allocation p99", _key("p99_ms", "allocations"), "ms"),
    Metric("allocate", "pools a node reaches", _key("reachable_pools", "allocations")),
    Metric(
        "allocate",
        "time per allocation per pool reached",
        _key("mean_us_per_reachable_pool", "allocations"),
        "us",
    ),
    *(
        Metric(
            "kubeapi",
            f"emulator CPU per {label}, rules {state}",
            _key(f"{key}_ms_rules_{state}"),
            "ms",
        )
        for key, label in (
            ("create_slice", "slice create (32 devices)"),
            ("update_slice_cycle", "slice GET + PUT"),
            ("claim_status_cycle", "claim status GET + PUT"),
            ("create_claim", "claim create"),
            ("list_50_slices", "list of 50 slices"),
        )
        for state in ("on", "off")
    ),
    Metric(
        "cdim", "attaches per second, one at a time", _key("sequential_attaches_per_second"), "/s"
    ),
    Metric(
        "cdim",
        "attaches per second, all in flight, batched",
        _key("batched_attaches_per_second"),
        "/s",
    ),
    Metric("cdim", "applies for those, batched", _key("batched_applies")),
    Metric(
        "cdim",
        "attaches per second, all in flight, not batched",
        _key("unbatched_attaches_per_second"),
        "/s",
    ),
    Metric("cdim", "claims per second end to end", _key("claims_per_second"), "/s"),
    Metric("cdim", "applies for those claims", _key("claim_applies")),
    Metric("cdim", "releases per second end to end", _key("releases_per_second"), "/s"),
    Metric("cdim", "controller CPU per claim cycle", _key("cpu_ms_per_claim_cycle"), "ms"),
    Metric("node", "prepare p50", _key("prepare_p50_ms"), "ms"),
    Metric(
        "node",
        "prepare p99",
        _key("prepare_p99_ms"),
        "ms",
        target=("< 100 ms", lambda v: v < 100),
    ),
    Metric("node", "prepares per second (sequential)", _key("prepares_per_second"), "/s"),
    Metric("node", "CPU per prepare", _key("prepare_cpu_ms_per_call"), "ms"),
    Metric("node", "CPU per prepare (ratio)", _key("ref_units_per_prepare"), "ref"),
    Metric("node", "unprepare p99", _key("unprepare_p99_ms"), "ms"),
    Metric("node", "peak resident memory", _mb("peak_rss_mib"), "MB"),
)


def rows(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """One row per shown figure: benchmark, case, metric, value, unit, target, met."""
    out: list[dict[str, Any]] = []
    for outcome in outcomes:
        case = outcome.case
        out.append(
            {
                "benchmark": case.benchmark,
                "case": case.label,
                "metric": "load average (1, 5, 15 min) at start / end",
                "value": f"{_load(outcome.load_start)} / {_load(outcome.load_end)}",
                "unit": "",
                "target": "",
                "met": None,
            }
        )
        out.append(
            {
                "benchmark": case.benchmark,
                "case": case.label,
                "metric": "CPU time stolen by the hypervisor meanwhile (steal)",
                "value": _steal(outcome.steal_percent),
                "unit": "",
                "target": "",
                "met": None,
            }
        )
        if outcome.status != "ok":
            out.append(
                {
                    "benchmark": case.benchmark,
                    "case": case.label,
                    "metric": "result",
                    "value": outcome.status,
                    "unit": "",
                    "target": "ok",
                    "met": False,
                    "note": outcome.error,
                }
            )
            continue
        for metric in METRICS:
            if metric.benchmark != case.benchmark:
                continue
            value = metric.value(outcome.figures)
            if value is None:
                continue
            target, met = "", None
            if metric.target is not None and metric.when(outcome.figures):
                target, met = metric.target[0], bool(metric.target[1](value))
            out.append(
                {
                    "benchmark": case.benchmark,
                    "case": case.label,
                    "metric": metric.name,
                    "value": value,
                    "unit": metric.unit,
                    "target": target,
                    "met": met,
                }
            )
    out.extend(_allocator_growth(outcomes))
    return out


def _allocator_growth(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """The allocator's growth from its smallest case to its largest: the time per allocation
    grows by some factor, the pools a node reaches by another; their quotient (time per pool
    reached, largest over smallest) is at most 1 when the cost grows no faster than linearly."""
    points = []
    for outcome in outcomes:
        if outcome.case.benchmark == "allocate" and outcome.status == "ok":
            per_pool = _key("mean_us_per_reachable_pool", "allocations")(outcome.figures)
            reached = _key("reachable_pools", "allocations")(outcome.figures)
            # A failed allocation costs less than one that succeeds: cases with failures do
            # other work, and are not compared.
            failures = _key("failures", "allocations")(outcome.figures)
            if per_pool and reached and not failures:
                points.append((reached, per_pool, outcome.case.label))
    if len(points) < 2:
        return []
    points.sort()
    (small_reach, small, small_label), (large_reach, large, large_label) = points[0], points[-1]
    if large_reach <= small_reach:
        return []
    value = round(large / small, 3)
    return [
        {
            "benchmark": "allocate",
            "case": " -> ".join(label.split(", ")[0] for label in (small_label, large_label)),
            "metric": "growth of the time per allocation per pool reached",
            "value": value,
            "unit": "x",
            "target": "<= 1 (linear)",
            "met": value <= 1,
        }
    ]


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(table_rows: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    """The rows as an aligned text table, or a Markdown one."""
    header = ("benchmark", "case", "metric", "value", "target", "met")
    cells = [header] + [
        (
            r["benchmark"],
            r["case"],
            r["metric"],
            f"{_shown(r['value'])} {r['unit']}".strip(),
            r["target"],
            {True: "yes", False: "NO", None: ""}[r["met"]],
        )
        for r in table_rows
    ]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in cells[1:]]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def update_readme(
    path: Path, results: dict[str, Any], table_rows: Sequence[dict[str, Any]]
) -> bool:
    """Put the table of a full run between the README markers; False when they are missing."""
    if not path.exists():
        return False
    text = path.read_text(encoding="utf-8")
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        return False
    machine = results["machine"]
    block = (
        f"{README_START}\n"
        f"Latest full run: {results['finished_at']}, {machine['cpus']} CPUs, Python "
        f"{machine['python']}, reference workload {results['reference']['cpu_seconds']} s "
        f'of CPU ("ref" below), the benchmark run took {results["seconds"]:.0f} s.\n\n'
        f"{table(table_rows, markdown=True)}\n"
    )
    path.write_text(text[:start] + block + text[end:], encoding="utf-8")
    return True


def _reference_seconds(outcomes: Sequence[Outcome]) -> float | None:
    values = [
        line["reference_cpu_seconds"]
        for o in outcomes
        for line in o.figures
        if "reference_cpu_seconds" in line
    ]
    return round(sorted(values)[len(values) // 2], 4) if values else None


def _cannot_write(path: Path) -> str | None:
    """Why the results could not be written to ``path`` (checked before the benchmarks run,
    not after), or None."""
    if path.is_dir():
        return "is a folder"
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as err:
        return f"cannot be written ({err.strerror or err})"
    if not existed:
        path.unlink()
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite; return the exit status."""
    parser = command_line(__doc__, "bench")
    parser.add_argument(
        "--short", action="store_true", help="the quick run for CI: small sizes only"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=BENCHMARKS,
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=DEFAULT_RESULTS,
        help="where to write the results (default: bench/results.json)",
    )
    parser.add_argument(
        "--no-readme", action="store_true", help="do not copy a full run's table into README.md"
    )
    parser.add_argument("--list", action="store_true", help="list the cases and stop")
    options = parser.parse_args(argv)
    problem = _cannot_write(options.results)
    if problem is not None:
        parser.error(f"--results {options.results}: {problem}")
    chosen = [c for c in cases(options.short) if not options.only or c.benchmark in options.only]
    if options.list:
        for case in chosen:
            print(f"{case.benchmark:15} {case.label:36} {' '.join(case.args)}")
        return 0

    started_at = dt.datetime.now(dt.UTC)
    started = time.perf_counter()
    outcomes: list[Outcome] = []
    for case in chosen:
        print(f"running {case.benchmark} ({case.label}) ...", file=sys.stderr, flush=True)
        outcome = run_case(case)
        print(
            f"  {outcome.status} in {outcome.seconds:.1f} s, load average "
            f"{_load(outcome.load_start)} at start, {_load(outcome.load_end)} at end, "
            f"steal {_steal(outcome.steal_percent)}"
            + (f": {outcome.error}" if outcome.error else ""),
            file=sys.stderr,
            flush=True,
        )
        outcomes.append(outcome)
    table_rows = rows(outcomes)
    results: dict[str, Any] = {
        "mode": "short" if options.short else "full",
        "only": options.only or [],
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - started, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "reference": {
            "description": f"CPU seconds of bench.common.reference_workload ({REFERENCE_RECORDS:,}"
            " device-like records: JSON encode, decode, sort, encode, SHA-256),"
            f" fastest of {REFERENCE_ROUNDS}, in the benchmark's own process;"
            " 'ref' figures are CPU seconds divided by it",
            "cpu_seconds": _reference_seconds(outcomes),
        },
        "cases": [
            {
                "benchmark": o.case.benchmark,
                "case": o.case.label,
                "args": list(o.case.args),
                "status": o.status,
                "seconds": round(o.seconds, 1),
                "load_average_start": list(o.load_start),
                "load_average_end": list(o.load_end),
                "steal_percent": o.steal_percent,
                "error": o.error,
                "figures": o.figures,
            }
            for o in outcomes
        ],
        "table": table_rows,
        "targets_missed": [r for r in table_rows if r["met"] is False],
    }
    options.results.parent.mkdir(parents=True, exist_ok=True)
    options.results.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(table(table_rows))
    print(f"\nresults: {options.results}")
    complete = not options.short and not options.only and all(o.status == "ok" for o in outcomes)
    if complete and not options.no_readme:
        if update_readme(README, results, table_rows):
            print(f"README: figures copied into {README}")
        else:
            print(f"README: no {README_START} marker in {README}; not copied")
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the running case was ended with its group
        print("interrupted: no results written", file=sys.stderr)
        sys.exit(130)
