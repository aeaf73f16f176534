"""Benchmark: allocations per second of the control-plane allocator.

10,000 devices (GPUs and NICs) in 80 pools of 125 devices, each pool's slice selecting the nodes
of one of 4 regions, so a node reaches 20 pools (2,500 devices). Each allocation is one pod claim
with a ``gpu`` request and a ``nic`` request joined by a matchAttribute constraint on the rack,
with CEL selectors on both classes (type and a capacity threshold) and on the GPU request (model
and a firmware version comparison). Allocated devices stay in use, so later allocations search
past them. Prints JSON lines: gathering the pools, one CEL evaluation, the cold first
allocation (the first on each of the 4 nodes fills the selector cache for its pools; those are
not counted below, and the slowest is shown), then allocations/s, p50/p99 latency per
allocation (wall time of the allocator alone; in reference units too, see
``bench.common.reference_cpu_seconds``) and cache hit rates.

    python -m bench.allocate [--allocations 2000] [--devices 10000] [--pools 80] [--json FILE]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from app.allocator import Allocator, Node, claim_from_json, device_class_from_json, gather_pools
from bench.common import (
    at_least,
    command_line,
    reference_cpu_seconds,
    reference_units,
    write_figures,
)

DRIVER = "fabric.example.com"
REGION = "topology.kubernetes.io/region"
REGIONS = ("us-east", "us-west", "eu-central", "ap-south")


def make_slices(devices: int, pools: int) -> list[dict[str, Any]]:
    """One slice per pool; GPUs and NICs alternate, models and firmware vary."""
    per_pool = devices // pools
    out = []
    for p in range(pools):
        region = REGIONS[p % len(REGIONS)]
        rack = f"rack-{p:03d}"
        items = []
        for i in range(per_pool):
            gpu = i % 2 == 0
            attributes: dict[str, Any] = {
                "deviceType": {"string": "gpu" if gpu else "nic"},
                "model": {"string": ("H100", "A100", "L40S")[i % 3] if gpu else "CX7"},
                "rack": {"string": rack},
                "region": {"string": region},
                "firmwareVersion": {"version": f"1.{i % 4}.{i % 7}"},
                "health": {"string": "OK"},
            }
            item: dict[str, Any] = {
                "name": f"{'gpu' if gpu else 'nic'}-{p:03d}-{i:03d}",
                "attributes": attributes,
            }
            if gpu:
                item["capacity"] = {"memory": {"value": ("80Gi", "40Gi", "48Gi")[i % 3]}}
            items.append(item)
        out.append(
            {
                "spec": {
                    "driver": DRIVER,
                    "pool": {"name": f"{region}/{rack}", "generation": 1, "resourceSliceCount": 1},
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": REGION, "operator": "In", "values": [region]}
                                ]
                            }
                        ]
                    },
                    "devices": items,
                }
            }
        )
    return out


CLASSES = {
    "gpu": device_class_from_json(
        {
            "metadata": {"name": "gpu"},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f'device.driver == "{DRIVER}" && '
                            f'device.attributes["{DRIVER}"].deviceType == "gpu" '
                            f'&& device.capacity["{DRIVER}"].memory'
                            '.compareTo(quantity("40Gi")) >= 0'
                        }
                    }
                ],
                "config": [{"opaque": {"driver": DRIVER, "parameters": {"profile": "gpu"}}}],
            },
        }
    ),
    "nic": device_class_from_json(
        {
            "metadata": {"name": "nic"},
            "spec": {
                "selectors": [
                    {"cel": {"expression": f'device.attributes["{DRIVER}"].deviceType == "nic"'}}
                ]
            },
        }
    ),
}
CLAIM_SPEC = {
    "devices": {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpu",
                    "selectors": [
                        {
                            "cel": {
                                "expression": f'device.attributes["{DRIVER}"].model '
                                'in ["H100", "A100"] && '
                                f'device.attributes["{DRIVER}"].firmwareVersion'
                                '.isGreaterThan(semver("1.1.0"))'
                            }
                        }
                    ],
                },
            },
            {"name": "nic", "exactly": {"deviceClassName": "nic"}},
        ],
        "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": f"{DRIVER}/rack"}],
    }
}


def measure(allocations: int, devices: int, pool_count: int) -> list[dict[str, Any]]:
    """Run the benchmark; return its figure lines."""
    reference = reference_cpu_seconds()
    lines: list[dict[str, Any]] = [
        {"step": "reference", "reference_cpu_seconds": round(reference, 4)}
    ]
    started = time.perf_counter()
    pools = gather_pools(make_slices(devices, pool_count))
    lines.append(
        {
            "step": "gather_pools",
            "devices": sum(len(p.devices) for p in pools),
            "pools": len(pools),
            "seconds": round(time.perf_counter() - started, 3),
        }
    )

    allocator = Allocator()
    environment = allocator.environment
    expression = environment.compile(CLASSES["gpu"].selectors[0])
    sample = pools[0].devices[0]
    rounds = 20_000
    started = time.perf_counter()
    for _ in range(rounds):
        environment.evaluate([expression], sample)
    lines.append(
        {
            "step": "cel_evaluation",
            "selector": "gpu class",
            "microseconds": round((time.perf_counter() - started) / rounds * 1e6, 2),
        }
    )

    nodes = [Node(f"node-{r}", {REGION: region}) for r, region in enumerate(REGIONS)]
    in_use: set[tuple[str, str, str]] = set()
    latencies: list[float] = []
    failures = 0
    cold = None
    colds: list[float] = []
    for index in range(allocations):
        claim = claim_from_json(
            CLAIM_SPEC, uid=f"uid-{index}", namespace="bench", name=f"claim-{index}"
        )
        node = nodes[index % len(nodes)]
        started = time.perf_counter()
        result = allocator.allocate([claim], CLASSES, pools, in_use, node)
        elapsed = time.perf_counter() - started
        if cold is None:
            cold = elapsed
            lines.append({"step": "first_allocation", "milliseconds": round(elapsed * 1e3, 2)})
        if index < len(nodes):
            # The first allocation on each node fills the selector cache for the pools that
            # reach it: a cold cost, shown apart, not counted among the allocations.
            colds.append(elapsed)
        else:
            latencies.append(elapsed)
        if not result.ok:
            failures += 1
            in_use.clear()
            continue
        for allocation in result.allocations.values():
            for entry in allocation["devices"]["results"]:
                in_use.add((entry["driver"], entry["pool"], entry["device"]))
    stats = allocator.stats()
    lookups = stats["selector_hits"] + stats["selector_misses"]
    compiles = stats["compile_hits"] + stats["compile_misses"]
    ordered = sorted(latencies)
    # A node reaches the pools of its region (the slices select the nodes of one region).
    reachable = statistics.mean(
        sum(1 for p in range(pool_count) if REGIONS[p % len(REGIONS)] == region)
        for region in REGIONS
    )
    lines.append(
        {
            "step": "allocations",
            "devices": devices,
            "pools": pool_count,
            "reachable_pools": reachable,
            "count": len(latencies),
            "cold_allocations_ms_max": round(max(colds) * 1e3, 2),
            "failures": failures,
            "allocations_per_second": round(len(latencies) / sum(latencies), 1),
            "p50_ms": round(statistics.median(ordered) * 1e3, 3),
            "mean_us_per_reachable_pool": round(
                statistics.mean(ordered) * 1e6 / max(reachable, 1), 3
            ),
            "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1e3, 3),
            "selector_cache_hit_rate": round(stats["selector_hits"] / lookups, 4),
            "compile_cache_hit_rate": round(stats["compile_hits"] / compiles, 4),
            "cel_evaluations": stats["selector_evaluations"],
            "ref_units_per_allocation": round(
                reference_units(sum(latencies) / max(1, len(latencies)), reference), 5
            ),
        }
    )
    return lines


def main() -> None:
    """Run the benchmark and print JSON lines."""
    parser = command_line(__doc__, "bench.allocate")
    parser.add_argument(
        "--allocations",
        type=at_least(5),
        default=2000,
        help="at least 5: the first one on each of the 4 nodes is timed apart",
    )
    parser.add_argument("--devices", type=at_least(1), default=10_000, help="devices in the pools")
    parser.add_argument("--pools", type=at_least(1), default=80, help="pools (one rack each)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    write_figures(args.json, measure(args.allocations, args.devices, args.pools))


if __name__ == "__main__":
    main()
