"""Shared parts of the reliability tests: a simulated cluster (the Kubernetes API emulator with
Nodes and a DeviceClass, the Redfish simulator), the settings that point fabric-dra at it, a
controller run as a separate process, and the end-state checks of invariants 1-3.

The end-state checks read only what a person could inspect too: the emulator's claims, the
simulator's attachments and history, and the reservation journal in the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import os
import signal
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any

import aiohttp
import builders
from sqlalchemy import select

from app.config import Settings
from app.configload import load_settings
from app.db.engine import Database
from app.db.models import Reservation
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

DRIVER = "fabric.example.com"
V1 = "resource.k8s.io/v1"
NODES = ["node-us-east-rack-01-1", "node-us-east-rack-01-2"]
FABRIC_USER = "ops-user"
FABRIC_PASSWORD = "Fabr1c-S3cret-pw-9f2c"
ADMIN_TOKEN = "Adm1n-T0ken-7d41e0"
UNSETTLED_STATES = ("pending", "attaching", "detaching")
OVERLAP_SLACK_S = 1.0


eventually = partial(builders.eventually, timeout_s=20)
"""The tests' one :func:`builders.eventually`, waiting 20 s by default (a whole controller runs
beside the test)."""


@dataclass
class Cluster:
    """The emulator and simulator a test drives, plus the files fabric-dra reads."""

    emu: KubeEmulator
    sim: RedfishSimulator
    sim_url: str
    tmp_path: Path

    def environ(self, database_url: str, **extra: str) -> dict[str, str]:
        """``FABRIC_DRA_*`` settings for a controller against this cluster."""
        (self.tmp_path / "user").write_text(FABRIC_USER + "\n")
        (self.tmp_path / "password").write_text(FABRIC_PASSWORD + "\n")
        (self.tmp_path / "token").write_text(ADMIN_TOKEN + "\n")
        return {
            "FABRIC_DRA_DATABASE__URL": database_url,
            "FABRIC_DRA_FABRIC__URL": self.sim_url,
            "FABRIC_DRA_FABRIC__USERNAME_FILE": str(self.tmp_path / "user"),
            "FABRIC_DRA_FABRIC__PASSWORD_FILE": str(self.tmp_path / "password"),
            "FABRIC_DRA_FABRIC__RETRY_ATTEMPTS": "2",
            "FABRIC_DRA_FABRIC__TIMEOUT_SECONDS": "5",
            "FABRIC_DRA_KUBE__MODE": "url",
            "FABRIC_DRA_KUBE__URL": self.emu.url,
            "FABRIC_DRA_ADMIN__HOST": "127.0.0.1",
            "FABRIC_DRA_ADMIN__PORT": "0",
            "FABRIC_DRA_ADMIN__TOKEN_FILE": str(self.tmp_path / "token"),
            "FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS": "1",
            # The faults here hit the REST API the polls read; the event stream stays on.
            "FABRIC_DRA_INVENTORY__EVENTS_POLL_INTERVAL_SECONDS": "1",
            "FABRIC_DRA_INVENTORY__STALE_AFTER_FAILURES": "1",
            "FABRIC_DRA_CONTROLLER__ORPHAN_GRACE_SECONDS": "1",
            "FABRIC_DRA_LEADER__NAMESPACE": "default",
            "FABRIC_DRA_LEADER__IDENTITY": "controller-0",
            "FABRIC_DRA_LEADER__LEASE_DURATION_SECONDS": "3",
            "FABRIC_DRA_LEADER__RENEW_DEADLINE_SECONDS": "2",
            "FABRIC_DRA_LEADER__RETRY_PERIOD_SECONDS": "0.5",
            **extra,
        }

    def settings(self, database_url: str, **extra: str) -> Settings:
        """Validated settings for an in-process :class:`app.service.Service`."""
        return load_settings(environ=self.environ(database_url, **extra))

    # ---- objects
    def create_pod(self, name: str, template: str = "one-gpu") -> None:
        """A pod with one claim made from ``template``."""
        self.emu.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "containers": [{"name": "c", "image": "busybox"}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                },
            }
        )

    def create_claim(self, name: str, spec: dict[str, Any] | None = None) -> None:
        """A ResourceClaim asking one device of class fabric-gpu."""
        self.emu.create(
            {
                "apiVersion": V1,
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": spec or claim_spec(),
            }
        )

    def claims(self) -> list[dict[str, Any]]:
        """Every ResourceClaim in the default namespace."""
        return self.emu.list(V1, "ResourceClaim", "default")

    def pods(self) -> list[dict[str, Any]]:
        """Every Pod in the default namespace."""
        return self.emu.list("v1", "Pod", "default")

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        """Events (of ``reason`` when given)."""
        return [
            e
            for e in self.emu.list("v1", "Event", "default")
            if reason is None or e.get("reason") == reason
        ]


def claim_spec(count: int = 1) -> dict[str, Any]:
    """The spec of a claim for ``count`` fabric-gpu devices."""
    return {
        "devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu", "count": count}}
            ]
        }
    }


HOST_LABEL = "fabric-dra.io/host-id"
"""The node label naming the node's fabric host (used where HostNames are placeholders)."""


async def make_cluster(tmp_path: Path, *, devices: int = 4, **sim_options: Any) -> Cluster:
    """Start the simulator (session auth with the test credentials) and the emulator (v1),
    with the rack's two Nodes, the DeviceClass and a one-device claim template."""
    sim = RedfishSimulator(
        spec=InventorySpec(
            regions=1, racks_per_region=1, devices_per_rack=devices, hosts_per_rack=2
        ),
        username=FABRIC_USER,
        password=FABRIC_PASSWORD,
        auth="session",
        **sim_options,
    )
    sim_url = await sim.start()
    # The service publishes taints and binding conditions: alpha gates, off by default in 1.34.
    emu = KubeEmulator(served_resource_versions=("v1",), feature_gates=all_gates_on("1.34"))
    await emu.start()
    for node in NODES:
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node,
                    "labels": {
                        "kubernetes.io/hostname": node,
                        "topology.kubernetes.io/region": "us-east",
                        "fabric-dra.io/rack": "rack-01",
                        HOST_LABEL: node,
                    },
                },
            }
        )
    emu.create(
        {
            "apiVersion": V1,
            "kind": "DeviceClass",
            "metadata": {"name": "fabric-gpu"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    emu.create(
        {
            "apiVersion": V1,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": "default"},
            "spec": {"spec": claim_spec()},
        }
    )
    return Cluster(emu, sim, sim_url, tmp_path)


async def close_cluster(cluster: Cluster) -> None:
    """Stop the emulator and the simulator."""
    await cluster.emu.stop()
    await cluster.sim.stop()


# ---------------------------------------------------------------------------- HTTP helpers
async def http(
    method: str,
    url: str,
    *,
    token: str | None = None,
    data: bytes | str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    """One request; returns (status, body text)."""
    all_headers = dict(headers or {})
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    timeout = aiohttp.ClientTimeout(total=15)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.request(method, url, data=data, headers=all_headers) as response,
    ):
        return response.status, await response.text()


# ---------------------------------------------------------------------------- the process
@dataclass
class Controller:
    """``python -m app run`` as a child process; output goes to ``log_path`` (appended)."""

    environ: dict[str, str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    starts: int = 0
    kills: int = 0
    _log: IO[bytes] | None = field(default=None, repr=False)

    async def start(self) -> None:
        """Start the process (it must not be running)."""
        assert self.process is None or self.process.returncode is not None
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._log.write(f"\n===== start {self.starts} =====\n".encode())
        self._log.flush()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
        env.update(self.environ)
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app",
            "run",
            "--shutdown-deadline",
            "5",
            stdout=self._log,
            stderr=self._log,
            env=env,
        )
        self.starts += 1

    async def kill(self) -> None:
        """SIGKILL the process and reap it."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()
            self.kills += 1

    async def terminate(self, timeout_s: float = 20) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout_s``); returns the exit code."""
        if self.process is None:
            return None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), timeout_s)
            except TimeoutError:
                await self.kill()
        return self.process.returncode

    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.returncode is None

    def close(self) -> None:
        """Close the log file."""
        if self._log is not None:
            self._log.close()
            self._log = None

    def current_log(self) -> str:
        """The output of the current (last started) process."""
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace")
            return text.rsplit(f"===== start {self.starts - 1} =====", 1)[-1]
        return ""

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the process's output."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


# ---------------------------------------------------------------------------- invariants
@dataclass(frozen=True)
class Interval:
    """One reservation's life: [created, released)."""

    device: str
    claim_uid: str
    claim: str
    state: str
    exclusive: bool
    created: dt.datetime
    released: dt.datetime | None


async def journal_rows(database_url: str) -> list[Interval]:
    """Every reservation ever written (released ones included)."""
    database = Database.connect(database_url)
    try:
        async with database.read() as session:
            rows = (await session.scalars(select(Reservation).order_by(Reservation.id))).all()
            return [
                Interval(
                    r.device_name,
                    r.claim_uid,
                    f"{r.claim_namespace}/{r.claim_name}",
                    r.state,
                    r.exclusive,
                    r.created_at,
                    r.released_at,
                )
                for r in rows
            ]
    finally:
        await database.dispose()


def overlapping_holds(
    rows: list[Interval],
    slack_s: float = OVERLAP_SLACK_S,
) -> list[tuple[Interval, Interval]]:
    """Pairs of exclusive reservations of one device by different claims whose lives overlap
    by more than ``slack_s`` (invariant 1: must be empty).

    The journal stamps ``created_at`` before its existence check and ``released_at`` before
    its UPDATE, not at commit: a reserve that waited for the database's write lock while the
    previous holder's release committed carries an earlier stamp than that release (seen:
    50 ms under load). The partial unique index is what refuses a real overlap; the slack only
    absorbs that stamping order, a real double hold lasts as long as an attach at least.
    """
    found = []
    by_device: dict[str, list[Interval]] = {}
    for row in rows:
        if row.exclusive:
            by_device.setdefault(row.device, []).append(row)
    for items in by_device.values():
        items.sort(key=lambda r: _naive(r.created))
        for earlier, later in itertools.pairwise(items):
            if earlier.claim_uid == later.claim_uid:
                continue
            if (
                earlier.released is None
                or (_naive(earlier.released) - _naive(later.created)).total_seconds() > slack_s
            ):
                found.append((earlier, later))
    return found


def _naive(moment: dt.datetime) -> dt.datetime:
    # SQLite drops the zone (UTC is stored); PostgreSQL keeps it: compare as naive UTC.
    return moment.astimezone(dt.UTC).replace(tzinfo=None) if moment.tzinfo else moment


def history_problems(history: list[tuple[str, str, str]]) -> list[str]:
    """Per block, attach and detach must alternate with the same System: never two attaches
    in a row (a device given to a second node while held) nor a detach of what was not
    attached."""
    problems = []
    held: dict[str, str] = {}
    for index, (op, block, system) in enumerate(history):
        if op == "attach":
            if block in held:
                problems.append(
                    f"#{index}: attach of {block} to {system} while attached to {held[block]}"
                )
            held[block] = system
        else:
            if held.get(block) != system:
                problems.append(
                    f"#{index}: detach of {block} from {system}, attached to {held.get(block)}"
                )
            held.pop(block, None)
    return problems


def ready(claim: dict[str, Any], device: str) -> bool:
    """Our FabricDeviceReady condition is True for ``device`` on ``claim``."""
    for entry in (claim.get("status") or {}).get("devices") or []:
        if entry.get("device") == device and entry.get("driver") == DRIVER:
            return any(
                c.get("type") == "FabricDeviceReady" and c.get("status") == "True"
                for c in entry.get("conditions") or []
            )
    return False


def allocated(claim: dict[str, Any]) -> tuple[list[str], str | None]:
    """(devices of our driver, the node named by the node selector) of a claim."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    devices = [
        r["device"]
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == DRIVER
    ]
    node = None
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for field_ in term.get("matchFields") or []:
            if field_.get("key") == "metadata.name" and field_.get("values"):
                node = field_["values"][0]
    return devices, node


async def device_blocks(database_url: str) -> dict[str, str]:
    """device name -> ResourceBlock URI, from the inventory."""
    from app.db.models import Device

    database = Database.connect(database_url)
    try:
        async with database.read() as session:
            rows = (await session.execute(select(Device.name, Device.attach_unit))).all()
            return dict(rows)
    finally:
        await database.dispose()


def end_state_problems(cluster: Cluster, blocks: dict[str, str], rows: list[Interval]) -> list[str]:
    """Everything wrong with a settled cluster (invariants 1-3); empty when all is well.

    * every live allocation's devices are attached exactly once, to the allocation's node,
      and reported ready on the claim;
    * nothing is attached that no live allocation holds;
    * no two exclusive reservations of one device overlapped; attach/detach alternate;
    * no active reservation without a live claim; nothing pending/attaching/detaching.
    """
    problems: list[str] = []
    live_uids = set()
    wanted: dict[str, str] = {}  # block -> node
    for claim in cluster.claims():
        live_uids.add(claim["metadata"]["uid"])
        devices, node = allocated(claim)
        name = claim["metadata"]["name"]
        for device in devices:
            block = blocks.get(device)
            if block is None:
                problems.append(f"claim {name}: device {device} is not in the inventory")
                continue
            wanted[block] = node or "?"
            holders = cluster.sim.holders(block)
            if holders != [node]:
                problems.append(
                    f"claim {name}: device {device} should be attached once to "
                    f"{node}, the fabric says {holders}"
                )
            if not ready(claim, device):
                problems.append(f"claim {name}: device {device} is not reported ready")
    devices = set(blocks.values())
    for block, system in cluster.sim.attachments().items():
        # Only our devices' blocks: a server's own compute block is never ours to judge.
        if system and block not in wanted and block in devices:
            problems.append(f"block {block} is attached to {system} with no live allocation")
    for earlier, later in overlapping_holds(rows):
        problems.append(
            f"device {earlier.device} held by {earlier.claim} and {later.claim} "
            f"at once ({earlier.created}..{earlier.released} vs {later.created})"
        )
    problems += history_problems(cluster.sim.history)
    for row in rows:
        if row.state in UNSETTLED_STATES:
            problems.append(f"reservation of {row.device} for {row.claim} left {row.state}")
        if row.state != "released" and row.claim_uid not in live_uids:
            problems.append(
                f"reservation of {row.device} ({row.state}) for {row.claim}, which is gone"
            )
    return problems
