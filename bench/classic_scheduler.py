"""The classic-DRA workload for ``bench.controlplane``, from a process of its own: pods and
claims created on request, and the scheduler stand-in.

Creating the pods and claims (the users' work) and kube-scheduler's part of the classic
protocol (scheduling contexts, potential nodes, node selection, binding) are not the
controller's work: running them here keeps their CPU out of the controller's figures and off
the controller's event loop. For each line ``{"create": i}`` on its standard input it creates
claim ``c<i>`` (the ``--claim`` JSON, named) and pod ``p<i>`` using it in namespace
``default``; it runs :class:`fabric_dra_sim.scheduler.classic.ClassicScheduler` with the benchmark's
short intervals, and prints one JSON line per bound pod, ``{"bound": "default/p<i>",
"seconds": <from the pod's creation to its binding>, "steps": {<step>: <seconds from the
pod's creation>}}`` (the steps of ``ClassicScheduler.timeline``). When its standard input closes it
prints ``{"abandoned": n, "node_status_writes": n}`` (selected nodes the scheduler gave up,
Node status writes made) and exits. The first line it prints is ``{"ready": true}``.

With ``NODE_UPDATES`` above 0 it also writes that many Node statuses per second, each node in
turn, as kubelets report theirs (a merge patch of ``status.conditions`` with a new heartbeat
time): the node events a controller sees on a real cluster, where most are these.

    python -m bench.classic_scheduler URL CLAIM_SPEC_JSON [NODE_UPDATES]
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import json
import sys
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

from app import aio
from app.kube.client import KubeAuthMode, KubeClientSettings, call_json, connect
from app.kube.informer import InformerSettings
from fabric_dra_sim.scheduler.classic import ClassicScheduler, ClassicSchedulerSettings


def _say(line: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


async def _create(core: CoreV1Api, custom: Any, index: int, spec: dict[str, Any]) -> None:
    await call_json(
        custom.create_namespaced_custom_object(
            "resource.k8s.io",
            "v1alpha3",
            "default",
            "resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1alpha3",
                "kind": "ResourceClaim",
                "metadata": {"name": f"c{index}"},
                "spec": spec,
            },
            _preload_content=False,
        ),
        "create ResourceClaim",
    )
    body: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{index}"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"c{index}"}],
        },
    }
    await call_json(
        core.create_namespaced_pod("default", body, _preload_content=False), "create Pod"
    )


async def _report_node_status(core: CoreV1Api, per_second: float, written: list[int]) -> None:
    """Write a Node's status ``per_second`` times a second, each node in turn; count the
    writes in ``written[0]``. Runs until cancelled."""
    listed = await call_json(core.list_node(_preload_content=False), "list Nodes")
    names = [str(n["metadata"]["name"]) for n in listed.get("items") or []]
    if not names:
        return
    loop = asyncio.get_running_loop()
    due = loop.time()
    for turn in itertools.count():
        due += 1 / per_second
        await asyncio.sleep(max(0.0, due - loop.time()))
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body: Any = {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ]
            }
        }
        name = names[turn % len(names)]
        await call_json(
            core.patch_node_status(name, body, _preload_content=False), "patch Node status"
        )
        written[0] += 1


async def run(url: str, spec: dict[str, Any], node_updates: float = 0.0) -> None:
    """Create pods as asked, schedule them, report each bind, until standard input closes;
    meanwhile write ``node_updates`` Node statuses per second."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    informer = InformerSettings(name="bench", watch_timeout_s=300, page_size=500)
    async with await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=url)) as client:
        core, custom = CoreV1Api(client.api), CustomObjectsApi(client.api)
        scheduler = ClassicScheduler(
            client,
            ClassicSchedulerSettings(
                # A fallback only: the stand-in waits for informer events.
                poll_interval_s=0.05,
                answer_timeout_s=60,
                allocation_timeout_s=60,
                retry_interval_s=0.05,
                informer=informer,
            ),
        )
        created: dict[str, float] = {}

        def bound(key: str) -> None:
            started = created.pop(key, None)
            if started is not None:
                steps = scheduler.timeline.pop(key, {})
                _say(
                    {
                        "bound": key,
                        "seconds": loop.time() - started,
                        "steps": {step: at - started for step, at in steps.items()},
                    }
                )

        scheduler.on_bound = bound
        await scheduler.start()
        written = [0]
        reporter = (
            asyncio.create_task(_report_node_status(core, node_updates, written))
            if node_updates > 0
            else None
        )
        _say({"ready": True})
        try:
            while line := await reader.readline():
                index = int(json.loads(line)["create"])
                created[f"default/p{index}"] = loop.time()
                await _create(core, custom, index, spec)
        finally:
            if reporter is not None:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
            await scheduler.stop()
        _say({"abandoned": scheduler.abandoned, "node_status_writes": written[0]})


def main() -> None:
    """Entry point: ``python -m bench.classic_scheduler URL CLAIM_SPEC_JSON [NODE_UPDATES]``."""
    node_updates = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    aio.run(run(sys.argv[1], json.loads(sys.argv[2]), node_updates))


if __name__ == "__main__":
    main()
