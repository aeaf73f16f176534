"""Writes ResourceClaim statuses as kube-scheduler would, from a process of its own.

``bench.claims`` runs this so that the cost of allocating and deallocating the claims (the
scheduler's work, not the controller's) is not counted in the controller's CPU figures, and
does not compete with the controller for its event loop. For each entry of the JSON list on
its standard input (``{"name": ..., "status": {...}}``, claims of namespace ``default``) it
reads the claim and replaces its status, one after the other (at most RATE per second when
given). It prints one JSON line: the
``time.monotonic()`` (shared by all processes on Linux) of its first and last write, the
count, and the CPU seconds this process used while writing (``cpu_seconds``).

    python -m bench.status_writer URL [RATE] < entries.json
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from typing import Any

import aiohttp

from app import aio

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


async def write(
    url: str, entries: list[dict[str, Any]], rate: float | None = None
) -> dict[str, Any]:
    """Replace the status of each claim in ``entries`` (as fast as possible, or ``rate``
    writes per second, evenly spaced); return the timing line."""
    started = time.monotonic()
    cpu0 = _cpu_seconds()
    async with aiohttp.ClientSession(base_url=url) as http:
        for index, entry in enumerate(entries):
            if rate:
                await asyncio.sleep(max(0.0, started + index / rate - time.monotonic()))
            path = f"{CLAIMS}/{entry['name']}"
            async with http.get(path) as response:
                response.raise_for_status()
                claim = await response.json()
            claim["status"] = entry["status"]
            async with http.put(f"{path}/status", json=claim) as response:
                response.raise_for_status()
    return {
        "started": started,
        "finished": time.monotonic(),
        "written": len(entries),
        "cpu_seconds": _cpu_seconds() - cpu0,
    }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    """Run as ``python -m bench.status_writer URL [RATE] < entries.json``."""
    entries = json.load(sys.stdin)
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else None
    print(json.dumps(aio.run(write(sys.argv[1], entries, rate))), flush=True)


if __name__ == "__main__":
    main()
