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
prints ``{"abandoned": n}`` (selected nodes the scheduler gave up) and exits. The first line
it prints is ``{"ready": true}``.

    python -m bench.classic_scheduler URL CLAIM_SPEC_JSON
"""

from __future__ import annotations

import asyncio
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


async def run(url: str, spec: dict[str, Any]) -> None:
    """Create pods as asked, schedule them, report each bind, until standard input closes."""
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
        _say({"ready": True})
        try:
            while line := await reader.readline():
                index = int(json.loads(line)["create"])
                created[f"default/p{index}"] = loop.time()
                await _create(core, custom, index, spec)
        finally:
            await scheduler.stop()
        _say({"abandoned": scheduler.abandoned})


def main() -> None:
    """Entry point: ``python -m bench.classic_scheduler URL CLAIM_SPEC_JSON``."""
    aio.run(run(sys.argv[1], json.loads(sys.argv[2])))


if __name__ == "__main__":
    main()
