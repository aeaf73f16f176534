"""The fault matrix and the crash test on NEC CDIM: each hazard of layout-apply injected into
the CDIM simulator under a running service; the claim must end as the hazard allows (ready,
or failed with the reason), the installation must take applies again, and a device must never
be connected twice or to the wrong CPU.

The crash test runs ``fabric-dra run`` as its own process and kills it (SIGKILL) while its
apply runs: the restarted controller follows the journalled apply instead of sending a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from builders import eventually

from app.configload import load_settings
from app.db.engine import Database
from app.journal import Journal
from app.reservations import ATTACHED, ATTACHING, DETACHING
from app.service import Service
from fabric_dra_sim.cdim import CdimSimulator
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on

pytestmark = pytest.mark.slow

DRIVER = "fabric.example.com"
CLAIMS = "resource.k8s.io/v1"
eventually = partial(eventually, timeout_s=30)


class Installation:
    """The emulator with one Node per CPU (labelled with the CPU's id), and the simulator."""

    def __init__(self, emu: KubeEmulator, sim: CdimSimulator, url: str) -> None:
        self.emu, self.sim, self.url = emu, sim, url
        self.node_of = {cpu: f"node-{i}" for i, cpu in enumerate(sim.cpu_ids())}

    def environ(self, database: str) -> dict[str, str]:
        return {
            "FABRIC_DRA_DATABASE__URL": database,
            "FABRIC_DRA_FABRIC__KIND": "cdim",
            "FABRIC_DRA_FABRIC__URL": self.url,
            "FABRIC_DRA_FABRIC__VERIFY_POLL_SECONDS": "0.05",
            "FABRIC_DRA_FABRIC__BUSY_TIMEOUT_SECONDS": "1",
            "FABRIC_DRA_FABRIC__TIMEOUT_SECONDS": "2",
            "FABRIC_DRA_HOSTS__MATCH": "label",
            "FABRIC_DRA_POOLS__GROUPING_KEYS": "manager",
            "FABRIC_DRA_KUBE__MODE": "url",
            "FABRIC_DRA_KUBE__URL": self.emu.url,
            "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
            "FABRIC_DRA_ADMIN__PORT": "0",
            "FABRIC_DRA_LEADER__ENABLED": "false",
            "FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS": "0.3",
            "FABRIC_DRA_INVENTORY__STALE_AFTER_FAILURES": "2",
        }

    def devices(self) -> dict[str, str]:
        """Published device name -> CDIM deviceID (by the name's readable part)."""
        out = {}
        for s in self.emu.list(CLAIMS, "ResourceSlice"):
            for d in s["spec"]["devices"]:
                out[d["name"]] = next(
                    g for g in self.sim.composable_ids() if d["name"].startswith(g)
                )
        return out

    def allocate(self, name: str, device: str, cpu: str) -> None:
        self.emu.create(
            {
                "apiVersion": CLAIMS,
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]
                    }
                },
            }
        )
        claim = self.emu.get(CLAIMS, "ResourceClaim", name, "default")
        term = {"key": "metadata.name", "operator": "In", "values": [self.node_of[cpu]]}
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": "cdim", "device": device}
                    ]
                },
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [term]}]},
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}],
        }
        self.emu.update_status(claim)

    def free(self, name: str) -> None:
        claim = self.emu.get(CLAIMS, "ResourceClaim", name, "default")
        claim["status"] = {}
        self.emu.update_status(claim)

    def condition(self, name: str) -> tuple[str, str] | None:
        """(type, message) of the claim's true condition, if any."""
        claim = self.emu.get(CLAIMS, "ResourceClaim", name, "default") or {}
        for entry in (claim.get("status") or {}).get("devices") or []:
            for c in entry.get("conditions") or []:
                if c["status"] == "True":
                    return c["type"], c.get("message", "")
        return None

    def connects(self, device_id: str) -> int:
        return sum(1 for op, _, d in self.sim.hardware_calls if op == "connect" and d == device_id)


@pytest.fixture
async def cdim() -> AsyncIterator[Installation]:
    sim = CdimSimulator(
        cpus=2,
        gpus=6,
        apply_overhead_s=0.2,
        step_s=0.02,
        retry_interval_s=0.02,
        sync_interval_s=None,
    )
    url = await sim.start()
    emu = KubeEmulator(served_resource_versions=("v1",), feature_gates=all_gates_on("1.34"))
    await emu.start()
    installation = Installation(emu, sim, url)
    for cpu, node in installation.node_of.items():
        labels = {
            "kubernetes.io/hostname": node,
            "fabric-dra.io/host-id": cpu,
            "fabric-dra.io/fabric-manager": "cdim",
        }
        emu.create(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}}
        )
    yield installation
    await emu.stop()
    await sim.stop()


@contextlib.asynccontextmanager
async def running(cdim: Installation, tmp_path: Path) -> AsyncIterator[Service]:
    service = Service(load_settings(environ=cdim.environ(f"sqlite+aiosqlite:///{tmp_path}/c.db")))
    await service.start()
    try:
        await eventually(lambda: len(cdim.devices()) == 6, what="six devices published")
        yield service
    finally:
        await service.stop(deadline_s=5)


async def test_a_device_held_by_another_cpu_behind_the_caches_back_fails_and_frees_cdim(
    cdim: Installation, tmp_path: Path
) -> None:
    cpu_a, cpu_b = cdim.sim.cpu_ids()
    async with running(cdim, tmp_path):
        names = sorted(cdim.devices())
        held = cdim.devices()[names[0]]
        cdim.sim.connect_out_of_band(held, cpu_b)  # the cache still shows it free
        cdim.allocate("c1", names[0], cpu_a)
        await eventually(
            lambda: (cdim.condition("c1") or ("",))[0] == "FabricDeviceFailed",
            what="the claim failing",
        )
        assert "the hardware refused" in (cdim.condition("c1") or ("", ""))[1]
        assert cdim.sim.holder(held) == cpu_b  # not taken from its holder
        assert all(a.status != "SUSPENDED" for a in cdim.sim.applies.values())
        cdim.allocate("c2", names[1], cpu_a)  # the installation takes applies again
        await eventually(
            lambda: (cdim.condition("c2") or ("",))[0] == "FabricDeviceReady", what="c2 ready"
        )


async def test_an_orphaned_apply_holds_claims_back_until_someone_cancels_it(
    cdim: Installation, tmp_path: Path
) -> None:
    cpu_a, cpu_b = cdim.sim.cpu_ids()
    async with running(cdim, tmp_path):
        names = sorted(cdim.devices())
        cdim.sim.faults.orphan_next = 1
        other = cdim.sim.composable_ids()[5]
        import aiohttp

        async with aiohttp.ClientSession() as http:
            body = {
                "procedures": [
                    {
                        "operationID": 1,
                        "operation": "connect",
                        "targetCPUID": cpu_b,
                        "targetDeviceID": other,
                        "dependencies": [],
                    }
                ]
            }
            async with http.post(cdim.url + "/cdim/api/v1/layout-apply", json=body) as response:
                orphan = (await response.json())["applyID"]
            cdim.allocate("c1", names[0], cpu_a)
            await asyncio.sleep(2.5)
            assert cdim.condition("c1") is None or cdim.condition("c1")[0] != "FabricDeviceReady"
            async with http.put(
                cdim.url + f"/cdim/api/v1/layout-apply/{orphan}", params={"action": "cancel"}
            ) as response:
                assert response.status == 409  # E40028: its worker is gone; now FAILED
        await eventually(
            lambda: (cdim.condition("c1") or ("",))[0] == "FabricDeviceReady", what="c1 ready"
        )
        assert cdim.connects(cdim.devices()[names[0]]) == 1


async def test_hardware_trouble_inside_an_apply_ends_with_the_device_connected_once(
    cdim: Installation, tmp_path: Path
) -> None:
    cpu_a = cdim.sim.cpu_ids()[0]
    async with running(cdim, tmp_path):
        names = sorted(cdim.devices())
        cdim.sim.faults.hw_503 = 2  # retried by layout-apply itself
        cdim.allocate("c1", names[0], cpu_a)
        await eventually(
            lambda: (cdim.condition("c1") or ("",))[0] == "FabricDeviceReady", what="c1 ready"
        )
        # A dropped connection to the hardware: the outcome is unknown; it happened here.
        cdim.sim.faults.hw_drop, cdim.sim.faults.hw_drop_takes_effect = 1, True
        cdim.allocate("c2", names[1], cpu_a)
        await eventually(
            lambda: (cdim.condition("c2") or ("",))[0] == "FabricDeviceReady", what="c2 ready"
        )
        device = cdim.devices()[names[1]]
        # Sent again after the unknown outcome (the cache cannot tell), to the same CPU only:
        # the hardware takes a repeated connect to the same CPU as done.
        calls = [(op, cpu) for op, cpu, d in cdim.sim.hardware_calls if d == device]
        assert calls == [("connect", cpu_a), ("connect", cpu_a)]
        assert cdim.sim.holder(device) == cpu_a
        cdim.free("c1")
        cdim.free("c2")
        await eventually(
            lambda: all(cdim.sim.holder(g) is None for g in cdim.sim.composable_ids()),
            what="both disconnected",
        )


async def test_cdim_down_marks_its_inventory_stale_until_it_returns(
    cdim: Installation, tmp_path: Path
) -> None:
    async with running(cdim, tmp_path) as service:
        port = int(cdim.url.rsplit(":", 1)[1])
        await cdim.sim.stop()

        async def state() -> str:
            return str((await service.status())["managers"][0]["state"])

        await eventually(lambda: _is(state, "stale"), what="stale")
        await cdim.sim.start(port=port)
        await eventually(lambda: _is(state, "ok"), what="fresh again")


async def _is(read: Any, value: str) -> bool:
    return await read() == value


async def _run_service(environ: dict[str, str], log: Path) -> asyncio.subprocess.Process:
    """``fabric-dra run`` as a process of its own, its output in ``log``."""
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app",
            "run",
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")},
                **environ,
            },
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )


async def _end(process: asyncio.subprocess.Process, sig: int = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(sig)
    await process.wait()


async def _one_claim_ready(cdim: Installation, environ: dict[str, str], log: Path, end: int) -> str:
    """Run the service until claim c1 is ready on the first published device, on the first
    CPU; end it with ``end`` (a signal). Returns the device's CDIM id."""
    process = await _run_service(environ, log)
    try:
        await eventually(lambda: len(cdim.devices()) == 6, what="six devices published")
        name = sorted(cdim.devices())[0]
        cdim.allocate("c1", name, cdim.sim.cpu_ids()[0])
        await eventually(
            lambda: (cdim.condition("c1") or ("",))[0] == "FabricDeviceReady", what="ready"
        )
        return cdim.devices()[name]
    finally:
        await _end(process, end)


@pytest.mark.parametrize("state", [DETACHING, ATTACHING])
async def test_a_restart_on_a_lagging_cache_still_detaches_an_unfinished_entry(
    cdim: Installation, tmp_path: Path, state: str
) -> None:
    """CDIM's inventory is a cache: after a restart it shows an attached device as free when
    nothing tells the backend otherwise (here layout-apply's record of the connect was
    deleted, as ``DELETE /layout-apply/{id}`` does). Start-up recovery must not take that
    for the truth: a reservation left ``detaching`` (or ``attaching``) by a crash, whose
    claim is gone, is detached, not released with the device still on its CPU."""
    cpu = cdim.sim.cpu_ids()[0]
    database = f"sqlite+aiosqlite:///{tmp_path}/c.db"
    environ = cdim.environ(database)
    device = await _one_claim_ready(cdim, environ, tmp_path / "first.log", signal.SIGKILL)
    assert cdim.sim.holder(device) == cpu
    cdim.sim.applies.clear()
    # The crash came in the middle of the release: the journal says so; the claim lets go.
    db = Database.connect(database)
    try:
        journal = Journal(db)
        (held,) = await journal.active()
        await journal.transition(held.id, [ATTACHED], state)
    finally:
        await db.dispose()
    cdim.free("c1")
    assert cdim.sim.syncs == 1  # the cache still shows the device free
    process = await _run_service(environ, tmp_path / "second.log")
    try:
        await eventually(lambda: cdim.sim.holder(device) is None, what="the device detached")
    finally:
        await _end(process)


async def test_a_clean_restart_on_a_lagging_cache_does_not_take_a_device_for_lost(
    cdim: Installation, tmp_path: Path
) -> None:
    """The cache still shows the device free after the restart (it has not synced since the
    connect); layout-apply's history shows it connected, so the claim stays ready: no
    second connect, no DeviceLost."""
    environ = cdim.environ(f"sqlite+aiosqlite:///{tmp_path}/c.db")
    device = await _one_claim_ready(cdim, environ, tmp_path / "first.log", signal.SIGTERM)
    assert cdim.sim.syncs == 1 and cdim.connects(device) == 1
    log = tmp_path / "second.log"
    process = await _run_service(environ, log)
    try:
        await eventually(
            lambda: "steps of recent applies shown over the inventory cache" in log.read_text(),
            what="the history read",
        )
        await eventually(lambda: "started:" in log.read_text(), what="started")
        # Several inventory polls (0.3 s each), each followed by the drift check.
        await asyncio.sleep(2.0)
    finally:
        await _end(process)
    assert cdim.connects(device) == 1, log.read_text()[-3000:]
    assert (cdim.condition("c1") or ("",))[0] == "FabricDeviceReady"
    lost = [e for e in cdim.emu.list("v1", "Event") if e.get("reason") == "DeviceLost"]
    assert lost == [], lost


async def test_sigkill_while_the_apply_runs_does_not_send_it_twice(
    cdim: Installation, tmp_path: Path
) -> None:
    cdim.sim.apply_overhead_s = 1.5
    cpu_a = cdim.sim.cpu_ids()[0]
    environ = cdim.environ(f"sqlite+aiosqlite:///{tmp_path}/crash.db")
    runs = 0

    async def start() -> asyncio.subprocess.Process:
        nonlocal runs
        runs += 1
        return await _run_service(environ, tmp_path / f"run-{runs}.log")

    process = await start()
    try:
        await eventually(lambda: len(cdim.devices()) == 6, what="devices published")
        name = sorted(cdim.devices())[0]
        device = cdim.devices()[name]
        cdim.allocate("c1", name, cpu_a)
        await eventually(lambda: cdim.sim.posts == 1, what="the apply posted")
        await _end(process, signal.SIGKILL)
        assert next(iter(cdim.sim.applies.values())).status == "IN_PROGRESS"
        process = await start()
        await eventually(
            lambda: (cdim.condition("c1") or ("",))[0] == "FabricDeviceReady", what="ready"
        )
        assert cdim.sim.posts == 1 and cdim.connects(device) == 1
        assert cdim.sim.holder(device) == cpu_a
    finally:
        await _end(process)


CRASH_KILLS = int(os.environ.get("FABRIC_DRA_CDIM_CRASH_KILLS", "6"))
CRASH_SEED = int(
    os.environ.get("FABRIC_DRA_CRASH_SEED", str(random.SystemRandom().randrange(10**9)))
)


async def test_sigkill_at_random_moments_on_cdim_converges(
    cdim: Installation, tmp_path: Path
) -> None:
    """Claims come and go (seeded) while ``fabric-dra run`` is killed at random moments and
    restarted. At the end: every allocated claim is ready with its device on its node's CPU,
    every freed claim's device is free, no apply is left running or suspended, and no device
    was ever connected to a CPU other than its claim's."""
    rng = random.Random(CRASH_SEED)
    context = f"seed {CRASH_SEED}"
    print(f"CDIM crash test: {context}, {CRASH_KILLS} kills")
    cdim.sim.apply_overhead_s = 0.5
    cpus = cdim.sim.cpu_ids()
    environ = cdim.environ(f"sqlite+aiosqlite:///{tmp_path}/crash.db")
    logs: list[Path] = []

    async def start() -> asyncio.subprocess.Process:
        logs.append(tmp_path / f"run-{len(logs)}.log")
        return await _run_service(environ, logs[-1])

    process = await start()
    try:
        await eventually(lambda: len(cdim.devices()) == 6, what=f"devices published ({context})")
        names = sorted(cdim.devices())
        # Each claim always names the same device and CPU: any other pairing is a fault.
        plan = {f"c{i}": (names[i], cpus[i % len(cpus)]) for i in range(len(names))}
        allocated: set[str] = set()
        created: set[str] = set()
        for _ in range(CRASH_KILLS):
            for _ in range(rng.randint(1, 3)):
                claim = rng.choice(sorted(plan))
                if claim in allocated:
                    cdim.free(claim)
                    allocated.discard(claim)
                elif claim not in created:
                    cdim.allocate(claim, *plan[claim])
                    created.add(claim)
                    allocated.add(claim)
            # The kill comes at a random moment of the service's work, not of its start-up
            # (which takes longer than the pause on a busy machine).
            await eventually(
                lambda: "started:" in logs[-1].read_text(errors="replace"),
                what=f"the service started ({context})",
            )
            await asyncio.sleep(rng.uniform(0.2, 2.0))
            await _end(process, signal.SIGKILL)
            process = await start()

        def settled() -> bool:
            for claim, (name, cpu) in plan.items():
                device = cdim.devices()[name]
                if claim in allocated:
                    if (cdim.condition(claim) or ("",))[0] != "FabricDeviceReady":
                        return False
                    if cdim.sim.holder(device) != cpu:
                        return False
                elif cdim.sim.holder(device) is not None:
                    return False
            return all(
                a.status not in ("IN_PROGRESS", "CANCELING", "SUSPENDED")
                for a in cdim.sim.applies.values()
            )

        try:
            await eventually(settled, timeout_s=60, what=f"the end state ({context})")
        except AssertionError:
            _report(cdim, plan, allocated, logs)
            raise
        for claim, (name, cpu) in plan.items():
            device = cdim.devices()[name]
            wrong = [c for op, c, d in cdim.sim.hardware_calls if d == device and c != cpu]
            assert wrong == [], f"{claim}: {device} sent to other CPUs {wrong} ({context})"
    finally:
        await _end(process)


def _report(
    cdim: Installation, plan: dict[str, tuple[str, str]], allocated: set[str], logs: list[Path]
) -> None:
    """Print what the crash test saw when it did not settle: each claim's state against the
    hardware's, the applies, and the tail of the last run's log."""
    for claim, (name, cpu) in sorted(plan.items()):
        device = cdim.devices()[name]
        print(
            f"{claim}: {'allocated' if claim in allocated else 'free'} on {cpu}; "
            f"condition {cdim.condition(claim)}; {device} held by {cdim.sim.holder(device)}"
        )
    for apply_id, a in cdim.sim.applies.items():
        print(f"apply {apply_id}: {a.status}")
    for log in logs[-2:]:
        print(f"--- {log.name} (last 60 lines)")
        print("\n".join(log.read_text(errors="replace").splitlines()[-60:]))
