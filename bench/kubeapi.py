"""The Kubernetes API emulator's own cost: CPU per request, with its rules on and off.

Every other benchmark runs the emulator with ``--no-validation`` so that its Python checks do
not compete with the controller for the machine's cores. This one measures what those checks
cost: it starts ``fabric-dra sim kube`` in a process of its own, once with every rule on and
once with ``--no-validation``, sends the same mix of requests the controller makes (slice
create and update, claim create, claim status write, get, paged list, lease renewal) and reads
the emulator process's CPU time from /proc before and after each kind of request.

    python -m bench.kubeapi --requests 200 --json out.json
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import at_least, command_line, run_benchmark, server_process, write_figures

RESOURCE = "/apis/resource.k8s.io/v1"
SLICES = f"{RESOURCE}/resourceslices"
CLAIMS = f"{RESOURCE}/namespaces/default/resourceclaims"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
DRIVER = "fabric.example.com"
DEVICES_PER_SLICE = 32


def _slice(index: int) -> dict[str, Any]:
    devices = [
        {
            "name": f"gpu-{index}-{d}",
            "attributes": {
                "model": {"string": "X100"},
                "serial": {"string": f"SN{index:05d}{d:02d}"},
                "firmware": {"version": "1.2.3"},
                "index": {"int": d},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for d in range(DEVICES_PER_SLICE)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"bench-{index:05d}"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": f"rack-{index}", "generation": 1, "resourceSliceCount": 1},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "fabric.example.com/rack",
                                "operator": "In",
                                "values": [f"rack-{index}"],
                            }
                        ]
                    }
                ]
            },
            "devices": devices,
        },
    }


def _claim(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"claim-{index:05d}", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "fabric-gpu",
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": 'device.attributes["fabric.example.com"]'
                                        '.model == "X100"'
                                    }
                                }
                            ],
                        },
                    }
                ]
            }
        },
    }


def _allocation(index: int) -> dict[str, Any]:
    return {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER,
                        "pool": f"rack-{index}",
                        "device": f"gpu-{index}-0",
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [f"node-{index}"]}
                        ]
                    }
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": f"pod-{index}", "uid": f"uid-{index:08d}"}],
    }


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Client:
    """A bare JSON client (aiohttp): the emulator's cost is what is measured, not ours."""

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http

    async def call(
        self, method: str, path: str, body: Any = None, expect: tuple[int, ...] = (200, 201)
    ) -> Any:
        """One request; raises RuntimeError on an unexpected status."""
        async with self.http.request(method, path, json=body) as response:
            text = await response.text()
            if response.status not in expect:
                raise RuntimeError(f"{method} {path}: HTTP {response.status}: {text[:300]}")
            return json.loads(text) if text else None


async def _measure(
    cpu: Callable[[], float], count: int, step: Callable[[int], Awaitable[None]]
) -> float:
    """Milliseconds of emulator CPU per call of ``step`` over ``count`` calls."""
    before = cpu()
    for index in range(count):
        await step(index)
    return (cpu() - before) * 1000 / count


async def run_once(requests: int, validate: bool) -> dict[str, float]:
    """Start an emulator (rules on or off), run the mix; emulator CPU ms per request kind."""
    args = ["sim", "kube"] + ([] if validate else ["--no-validation"])
    async with (
        server_process("Kubernetes API emulator", args) as server,
        aiohttp.ClientSession(base_url=server.url) as http,
    ):
        client = Client(http)
        await client.call(
            "POST",
            "/apis/resource.k8s.io/v1/deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "fabric-gpu"},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )
        await client.call(
            "POST",
            LEASES,
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "bench", "namespace": "default"},
                "spec": {
                    "holderIdentity": "bench",
                    "leaseDurationSeconds": 15,
                    "acquireTime": _micro_now(),
                    "renewTime": _micro_now(),
                },
            },
        )
        figures: dict[str, float] = {}

        async def create_slice(i: int) -> None:
            await client.call("POST", SLICES, _slice(i))

        async def update_slice(i: int) -> None:
            current = await client.call("GET", f"{SLICES}/bench-{i:05d}")
            changed = copy.deepcopy(current)
            changed["spec"]["pool"]["generation"] += 1
            changed["spec"]["devices"][0]["attributes"]["model"] = {"string": "X200"}
            await client.call("PUT", f"{SLICES}/bench-{i:05d}", changed)

        async def create_claim(i: int) -> None:
            await client.call("POST", CLAIMS, _claim(i))

        async def write_status(i: int) -> None:
            claim = await client.call("GET", f"{CLAIMS}/claim-{i:05d}")
            claim["status"] = _allocation(i)
            await client.call("PUT", f"{CLAIMS}/claim-{i:05d}/status", claim)

        async def get_slice(i: int) -> None:
            await client.call("GET", f"{SLICES}/bench-{i:05d}")

        async def list_slices(_i: int) -> None:
            await client.call("GET", f"{SLICES}?limit=50")

        async def renew_lease(_i: int) -> None:
            lease = await client.call("GET", f"{LEASES}/bench")
            lease["spec"]["renewTime"] = _micro_now()
            await client.call("PUT", f"{LEASES}/bench", lease)

        cpu = server.cpu_seconds
        figures["create_slice_ms"] = await _measure(cpu, requests, create_slice)
        figures["get_ms"] = await _measure(cpu, requests, get_slice)
        # Read-modify-write cycles (GET then PUT), as the controller makes them.
        figures["update_slice_cycle_ms"] = await _measure(cpu, requests, update_slice)
        figures["create_claim_ms"] = await _measure(cpu, requests, create_claim)
        figures["claim_status_cycle_ms"] = await _measure(cpu, requests, write_status)
        figures["list_50_slices_ms"] = await _measure(cpu, max(1, requests // 10), list_slices)
        figures["lease_renewal_cycle_ms"] = await _measure(cpu, requests, renew_lease)
        return {k: round(v, 3) for k, v in figures.items()}


async def run(requests: int) -> list[dict[str, Any]]:
    """Both runs; one figure line with ``<kind>_ms_rules_on`` / ``_rules_off`` pairs."""
    on = await run_once(requests, validate=True)
    off = await run_once(requests, validate=False)
    line: dict[str, Any] = {"requests_per_kind": requests, "devices_per_slice": DEVICES_PER_SLICE}
    for key, value in on.items():
        line[key.replace("_ms", "_ms_rules_on")] = value
        line[key.replace("_ms", "_ms_rules_off")] = off[key]
    mean_on = sum(on.values()) / len(on)
    mean_off = sum(off.values()) / len(off)
    line["mean_ms_rules_on"] = round(mean_on, 3)
    line["mean_ms_rules_off"] = round(mean_off, 3)
    return [line]


def main() -> None:
    """Command line: ``python -m bench.kubeapi [--requests N] [--json FILE]``."""
    parser = command_line(__doc__, "bench.kubeapi")
    parser.add_argument("--requests", type=at_least(1), default=200, help="requests of each kind")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    write_figures(args.json, run_benchmark(run(args.requests)))


if __name__ == "__main__":
    main()
