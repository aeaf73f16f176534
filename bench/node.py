"""Benchmark: the node plugin's NodePrepareResources latency once the devices are attached.

A real :class:`app.node.agent.NodeAgent` (what ``fabric-dra node`` runs) serves its DRA
socket; the kubelet stand-in's DRA client (``fabric_dra_sim.kubelet.dra.DraClient``) calls
NodePrepareResources (API v1) over that unix socket, one call after the other, each for one
claim: a pod with one claim (the kubelet puts all of a pod's claims of one driver in one call,
pkg/kubelet/cm/dra/manager.go ``prepareResources``). The claims live in the Kubernetes API
emulator (a process of its own, as in the other benchmarks), already allocated to this node
and ready: our ``status.devices`` entry of every device has FabricDeviceReady True and the
device's identity in its ``data``. The host is a fake one (``fabric_dra_sim.fakehost``: /sys,
/proc and /dev under a temporary folder) with 8 NVIDIA GPUs and 8 NVMe drives (more drives
when a claim asks for more), so every prepare reads the claim from the API server, finds each
device in sysfs by its NVMe serial, writes a CDI spec and the checkpoint (with fsync), and
answers.

Each claim is unprepared right after its prepare (timed on its own): a node holds a few
claims at a time, and its drives are reused claim after claim, so the checkpoint stays the
size it has on a real node. The first ``--warmup`` claims are not counted.

Figures: prepare latency per call as the client sees it (p50, p99, mean, max, ms), prepares
per second (sequential calls: claims / the sum of their latencies), this whole process's CPU
per prepare call (``time.process_time``: the plugin and the client, worker threads included;
also in reference units, see ``bench.common.reference_cpu_seconds``), unprepare p50 and p99,
and peak memory. Target: prepare p99 < 100 ms.

    python -m bench.node [--devices-per-claim 1] [--claims 200] [--warmup 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from app.config import Settings
from app.node.agent import NodeAgent
from bench.common import (
    at_least,
    command_line,
    kube_emulator_process,
    peak_rss_mib,
    reference_cpu_seconds,
    reference_units,
    run_benchmark,
    write_figures,
)
from fabric_dra_sim.fakehost import FakeHost
from fabric_dra_sim.kubelet.dra import ClaimRef, DraClient

DRIVER = "fabric.example.com"
NODE = "node-bench"
POOL = "rack-1"
NAMESPACE = "default"
CLAIMS_PATH = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
HOST_GPUS = 8
HOST_DRIVES = 8
MAX_DEVICES_PER_CLAIM = 64
SERVICE = "v1.DRAPlugin"


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile (0..1, nearest rank) of ``values`` given in seconds, in ms.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return round(ordered[index] * 1000, 2)


def drive_serial(index: int) -> str:
    """The NVMe serial number of the fake host's drive ``index`` (20 characters at most)."""
    return f"S6BENCH{index:08d}"


def build_host(root: Path, drives: int) -> FakeHost:
    """A fake host under ``root``: :data:`HOST_GPUS` GPUs and ``drives`` NVMe drives (each
    its own PCI function, distinct serials), as a node with a few attached devices shows
    them."""
    host = FakeHost(root)
    for index in range(HOST_GPUS):
        host.nvidia_gpu(
            f"0000:{0x3B + index:02x}:00.0", uuid=str(uuid.UUID(int=index + 1)), minor=index
        )
    for index in range(drives):
        host.nvme(index, serial=drive_serial(index), address=f"0000:{0x80 + index:02x}:00.0")
    return host


def _ready_entry(index: int) -> dict[str, Any]:
    condition = {
        "status": "True",
        "reason": "Attached",
        "message": "attached",
        "lastTransitionTime": "2026-12-01T00:00:00Z",
    }
    return {
        "driver": DRIVER,
        "pool": POOL,
        "device": f"nvme-{index}",
        "conditions": [
            {"type": "FabricDeviceReady", **condition},
            {**condition, "type": "FabricDeviceFailed", "status": "False", "message": ""},
        ],
        "data": {
            "node": NODE,
            "host": "sys-bench",
            "deviceType": "nvme",
            "serialNumber": drive_serial(index),
        },
    }


def claim_body(name: str, devices: Sequence[int]) -> dict[str, Any]:
    """A ResourceClaim ``name`` asking for ``len(devices)`` NVMe drives in one request."""
    request: dict[str, Any] = {"deviceClassName": "fabric-nvme"}
    if len(devices) > 1:
        request |= {"allocationMode": "ExactCount", "count": len(devices)}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "disks", "exactly": request}]}},
    }


def claim_status(name: str, devices: Sequence[int]) -> dict[str, Any]:
    """The status of claim ``name`` allocated to :data:`NODE` with drives ``devices``, every
    one attached and ready (as the controller writes it)."""
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
        ]
    }
    results = [
        {"request": "disks", "driver": DRIVER, "pool": POOL, "device": f"nvme-{i}"} for i in devices
    ]
    return {
        "allocation": {"devices": {"results": results}, "nodeSelector": selector},
        "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}],
        "devices": [_ready_entry(i) for i in devices],
    }


async def create_claims(url: str, count: int, per_claim: int, drives: int) -> list[ClaimRef]:
    """Create ``count`` claims of ``per_claim`` drives each (drives taken round robin from
    the host's ``drives``) in the emulator at ``url``, allocated and ready; their refs.

    Raises:
        aiohttp.ClientResponseError: the emulator refused a write.
    """
    refs = []
    async with aiohttp.ClientSession(base_url=url) as http:
        for number in range(count):
            name = f"bench-{number:05d}"
            devices = [(number * per_claim + k) % drives for k in range(per_claim)]
            async with http.post(CLAIMS_PATH, json=claim_body(name, devices)) as response:
                response.raise_for_status()
                claim = await response.json()
            claim["status"] = claim_status(name, devices)
            async with http.put(f"{CLAIMS_PATH}/{name}/status", json=claim) as response:
                response.raise_for_status()
            refs.append(ClaimRef(NAMESPACE, claim["metadata"]["uid"], name))
    return refs


def agent_settings(kube_url: str, root: Path) -> Settings:
    """The node plugin's settings: this node, folders under ``root``, the fake host."""
    return Settings.model_validate(
        {
            "driver_name": DRIVER,
            "kube": {"mode": "url", "url": kube_url},
            "node": {
                "node_name": NODE,
                "plugin_registry_dir": str(root / "reg"),
                "plugins_dir": str(root / "plugins"),
                "cdi_dir": str(root / "cdi"),
                "host_root": str(root / "host"),
                "health_port": 0,
                "health_host": "127.0.0.1",
            },
        }
    )


async def _prepare(client: DraClient, ref: ClaimRef, per_claim: int) -> None:
    result = (await client.prepare([ref]))[ref.uid]
    if result.error or len(result.devices) != per_claim:
        raise RuntimeError(
            f"prepare of claim {ref.name}: {result.error or 'no error'}, "
            f"{len(result.devices)} device(s) of {per_claim}"
        )


async def _unprepare(client: DraClient, ref: ClaimRef) -> None:
    error = (await client.unprepare([ref]))[ref.uid]
    if error:
        raise RuntimeError(f"unprepare of claim {ref.name}: {error}")


async def _cycles(
    client: DraClient, refs: Sequence[ClaimRef], per_claim: int, warmup: int
) -> dict[str, list[float]]:
    """Prepare then unprepare each claim; the wall and CPU seconds of each counted call."""
    times: dict[str, list[float]] = {"prepare": [], "prepare_cpu": [], "unprepare": []}
    for index, ref in enumerate(refs):
        cpu0, started = time.process_time(), time.perf_counter()
        await _prepare(client, ref, per_claim)
        prepared, cpu1 = time.perf_counter(), time.process_time()
        await _unprepare(client, ref)
        done = time.perf_counter()
        if index >= warmup:
            times["prepare"].append(prepared - started)
            times["prepare_cpu"].append(cpu1 - cpu0)
            times["unprepare"].append(done - prepared)
    return times


async def measure(per_claim: int, claims: int, warmup: int) -> dict[str, Any]:
    """Run the benchmark: ``claims`` counted claims of ``per_claim`` drives each, after
    ``warmup`` uncounted ones; return the figures (times in ms).

    Raises:
        RuntimeError: a prepare or unprepare failed, or left CDI specs or checkpoint records.
    """
    reference = reference_cpu_seconds()
    drives = max(HOST_DRIVES, per_claim)
    # Unix socket paths must stay under 108 bytes: a short folder in /tmp.
    root = Path(tempfile.mkdtemp(prefix="fdra-nb-", dir="/tmp"))
    try:
        build_host(root / "host", drives)
        async with kube_emulator_process() as kube_url:
            refs = await create_claims(kube_url, warmup + claims, per_claim, drives)
            agent = NodeAgent(agent_settings(kube_url, root), NODE)
            await agent.start()
            try:
                if agent.servers is None or agent.plugin is None:
                    raise RuntimeError("the node agent started without its servers")
                async with DraClient(str(agent.servers.dra_path), SERVICE, DRIVER) as client:
                    times = await _cycles(client, refs, per_claim, warmup)
                left = sorted(p.name for p in (root / "cdi").glob("*.json"))
                if left or agent.plugin.checkpoint.records:
                    raise RuntimeError(
                        f"after unprepare: CDI specs left {left[:3]}, "
                        f"{len(agent.plugin.checkpoint.records)} checkpoint record(s) left"
                    )
            finally:
                await agent.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    prepare, cpu = times["prepare"], sum(times["prepare_cpu"]) / claims
    return {
        "benchmark": "node",
        "devices_per_claim": per_claim,
        "claims": claims,
        "warmup_claims": warmup,
        "service": SERVICE,
        "prepare_p50_ms": percentile(prepare, 0.50),
        "prepare_p99_ms": percentile(prepare, 0.99),
        "prepare_mean_ms": round(statistics.mean(prepare) * 1000, 2),
        "prepare_max_ms": round(max(prepare) * 1000, 2),
        "prepares_per_second": round(claims / sum(prepare), 1),
        "prepare_cpu_ms_per_call": round(cpu * 1000, 2),
        "ref_units_per_prepare": round(reference_units(cpu, reference), 4),
        "unprepare_p50_ms": percentile(times["unprepare"], 0.50),
        "unprepare_p99_ms": percentile(times["unprepare"], 0.99),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "reference_cpu_seconds": round(reference, 4),
    }


def _devices_per_claim(text: str) -> int:
    value = at_least(1)(text)
    if value > MAX_DEVICES_PER_CLAIM:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_DEVICES_PER_CLAIM} (a claim of the fake host's drives), "
            f"got {value}"
        )
    return value


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``python -m bench.node``; bad arguments exit with status 2 and a message."""
    parser = command_line(__doc__, "bench.node")
    parser.add_argument(
        "--devices-per-claim",
        type=_devices_per_claim,
        default=1,
        help=f"NVMe drives in each claim (1 to {MAX_DEVICES_PER_CLAIM})",
    )
    parser.add_argument(
        "--claims", type=at_least(1), default=200, help="claims prepared and counted"
    )
    parser.add_argument(
        "--warmup", type=at_least(0), default=5, help="claims prepared first and not counted"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    options = parser.parse_args(argv)
    figures = run_benchmark(measure(options.devices_per_claim, options.claims, options.warmup))
    write_figures(options.json, [figures])


if __name__ == "__main__":
    main()
