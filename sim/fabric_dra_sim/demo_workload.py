"""A small workload for the demo's dashboard: pods with fabric claims coming and going on the
emulated 1.34 cluster while the demo serves, so that a newcomer sees devices reserved, attached
and released, and the dashboard's charts move.

Each pod asks for one device of a class picked in turn (GPU, NVMe) through a
ResourceClaimTemplate, as a real workload would; the scheduler stand-in allocates it, fabric-dra
attaches it, the node's kubelet stand-in prepares it, and after its lifetime the pod is deleted
and everything is undone. Nothing here is printed: the story is told once, by the demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

V1 = "resource.k8s.io/v1"


@dataclass
class WorkloadSettings:
    """How busy the demo's cluster is.

    Attributes:
        pods: pods alive at once, at most.
        lifetime_s: each pod's life once running, drawn between these two, in seconds.
        start_every_s: seconds between two new pods while fewer than ``pods`` live.
        classes: DeviceClass names to ask for, in turn.
        seed: the random lifetimes' seed.
    """

    pods: int = 6
    lifetime_s: tuple[float, float] = (20.0, 60.0)
    start_every_s: float = 4.0
    # The classes whose devices the demo's fake hosts can show (the Redfish simulator's FPGA
    # and CXL serial numbers are no identity a host shows: fabric_dra_sim.hostsim).
    classes: Sequence[str] = ("fabric-gpu", "fabric-nvme")
    seed: int = 0


@dataclass
class Workload:
    """Keeps up to ``settings.pods`` pods running on ``emu`` until :meth:`stop`.

    Args:
        emu: the cluster's API emulator (``create``, ``get``, ``delete``).
        namespace: an existing namespace the cluster's scheduler and claim controller serve.
        node_of: node name -> its kubelet stand-in (``prepare_pod``, ``unprepare_pod``).
        settings: see :class:`WorkloadSettings`.
    """

    emu: Any
    namespace: str
    node_of: Callable[[str], Any]
    settings: WorkloadSettings = field(default_factory=WorkloadSettings)
    started: int = 0
    finished: int = 0
    failed: int = 0
    _task: asyncio.Task[None] | None = None
    _pods: set[asyncio.Task[None]] = field(default_factory=set)

    def start(self) -> None:
        """Create the claim templates, then start the pods' loop."""
        for device_class in self.settings.classes:
            self.emu.create(
                {
                    "apiVersion": V1,
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": f"workload-{device_class}", "namespace": self.namespace},
                    "spec": {
                        "spec": {
                            "devices": {
                                "requests": [
                                    {"name": "device", "exactly": {"deviceClassName": device_class}}
                                ]
                            }
                        }
                    },
                }
            )
        self._task = asyncio.create_task(self._run(), name="demo-workload")

    async def stop(self) -> None:
        """Stop starting pods and cancel the running ones (their objects stay; the demo's
        clusters are thrown away next)."""
        tasks = [t for t in (self._task, *self._pods) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        rng = random.Random(self.settings.seed)
        while True:
            if len(self._pods) < self.settings.pods:
                device_class = self.settings.classes[self.started % len(self.settings.classes)]
                name = f"workload-{self.started:05d}"
                self.started += 1
                lifetime = rng.uniform(*self.settings.lifetime_s)
                task = asyncio.create_task(self._pod(name, device_class, lifetime))
                self._pods.add(task)
                task.add_done_callback(self._pods.discard)
            await asyncio.sleep(self.settings.start_every_s)

    async def _pod(self, name: str, device_class: str, lifetime: float) -> None:
        emu = self.emu
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {
                    "containers": [
                        {"name": "main", "image": "job", "resources": {"claims": [{"name": "d"}]}}
                    ],
                    "resourceClaims": [
                        {"name": "d", "resourceClaimTemplateName": f"workload-{device_class}"}
                    ],
                },
            }
        )
        kubelet = None
        try:
            node = await _until(lambda: _bound(emu, self.namespace, name), timeout_s=120.0)
            if node is None:
                # Nothing free of that class: give up on this pod; another comes soon.
                self.failed += 1
                return
            kubelet = self.node_of(node)
            await kubelet.prepare_pod(self.namespace, name)
            await asyncio.sleep(lifetime)
            self.finished += 1
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self.failed += 1
            log.warning("demo workload: pod %s: %s", name, err)
        finally:
            # As a kubelet does: the pod's containers stop and its claims are unprepared
            # before the pod object goes (and with it the claim's reservation).
            if kubelet is not None:
                with contextlib.suppress(Exception):
                    await kubelet.unprepare_pod(self.namespace, name)
            with contextlib.suppress(Exception):
                emu.delete("v1", "Pod", name, self.namespace)


def _bound(emu: Any, namespace: str, name: str) -> str | None:
    pod = emu.get("v1", "Pod", name, namespace) or {}
    return (pod.get("spec") or {}).get("nodeName")


async def _until(
    probe: Callable[[], Any | Awaitable[Any]], *, timeout_s: float, interval_s: float = 0.2
) -> Any:
    """``probe()``'s first truthy answer, or None after ``timeout_s`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        answer = probe()
        if isinstance(answer, Awaitable):
            answer = await answer
        if answer:
            return answer
        await asyncio.sleep(interval_s)
    return None
