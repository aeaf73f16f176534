"""``fabric-dra demo --fabric cdim``: the controller on a simulated NEC CDIM installation.

One emulated Kubernetes 1.34 cluster (structured parameters, binding conditions on) with one
Node per CDIM CPU (labelled with the CPU's deviceID), the structured scheduler stand-in, the
CDIM simulator (:class:`fabric_dra_sim.cdim.CdimSimulator`, with a real installation's one
second per apply) and fabric-dra (``fabric-dra run``'s service, ``fabric.kind: cdim``).

The story: the inventory is read from configuration-manager and published; a pod's claim is
allocated by the scheduler and its GPU connected through layout-apply before the pod binds;
eight pods at once have their GPUs connected in shared applies; then everything is deleted and
disconnected. The node plugin is not run here: CDIM exposes no GPU UUID or PCI address, which
the node side's GPU finder needs (docs/fabric-cdim.md).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from app.config import Settings
from app.configload import load_settings
from fabric_dra_sim.demo_nodes import say as _say
from fabric_dra_sim.demo_nodes import until as _until

V1 = "resource.k8s.io/v1"
NAMESPACE = "demo-cdim"
CDIM_DATABASE = "sqlite+aiosqlite:///fabric-dra-demo-cdim.db"
GATES = {"DRADeviceBindingConditions": True, "DRADeviceTaints": True}


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "containers": [
                {"name": "main", "image": "trainer", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        },
    }


def _bound(emu: Any, name: str) -> str | None:
    pod = emu.get("v1", "Pod", name, NAMESPACE) or {}
    return (pod.get("spec") or {}).get("nodeName")


async def run_cdim_demo(
    settings: Settings, defaults: dict[str, Any], once: bool, admin_port: int, wait: Any
) -> None:
    """Tell the CDIM story (see the module docstring); with ``once`` False, serve the
    dashboard until ``wait()`` returns.

    Args:
        settings: what the user gave (``--config``, ``FABRIC_DRA_*``, flags).
        defaults: the demo's defaults, under what the user gave.
        once: stop after the story.
        admin_port: the dashboard's port (0: any free one).
        wait: an awaitable factory that returns on Ctrl-C.
    """
    from app.kube.client import KubeAuthMode, KubeClientSettings, connect
    from app.kube.versions import ResourceApiVersion
    from app.service import Service
    from fabric_dra_sim.cdim import BASE, CdimSimulator
    from fabric_dra_sim.kubeapi import KubeEmulator
    from fabric_dra_sim.scheduler.structured import StructuredScheduler, StructuredSettings

    async with contextlib.AsyncExitStack() as stack:
        sim = CdimSimulator(cpus=4, gpus=12, nvme=2, apply_overhead_s=1.0, sync_interval_s=600)
        fabric_url = await sim.start()
        stack.push_async_callback(sim.stop)
        emu = KubeEmulator(kubernetes_version="1.34", feature_gates=GATES)
        kube_url = await emu.start()
        stack.push_async_callback(emu.stop)
        for index, cpu in enumerate(sim.cpu_ids()):
            labels = {
                "kubernetes.io/hostname": f"node-{index}",
                "fabric-dra.io/host-id": cpu,
                "fabric-dra.io/fabric-manager": "cdim",
            }
            emu.create(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": f"node-{index}", "labels": labels},
                }
            )
        emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        driver = settings.driver_name
        for kind in ("gpu", "nvme"):
            expression = (
                f'device.driver == "{driver}" && '
                f'device.attributes["{driver}"].deviceType == "{kind}"'
            )
            emu.create(
                {
                    "apiVersion": V1,
                    "kind": "DeviceClass",
                    "metadata": {"name": f"fabric-{kind}"},
                    "spec": {"selectors": [{"cel": {"expression": expression}}]},
                }
            )
        _say(
            f"Kubernetes 1.34 (emulated) at {kube_url}: {len(sim.cpu_ids())} nodes, each "
            f"labelled with its CPU's deviceID; NEC CDIM simulator at {fabric_url}{BASE} "
            f"(configuration-manager and layout-apply, 1 s per apply, one apply at a time)"
        )
        given = settings.model_dump(exclude_unset=True)
        database = (
            settings.database.url
            if "url" in settings.database.model_fields_set
            else (CDIM_DATABASE)
        )
        own = {
            "database": {"url": database},
            "fabric": {"kind": "cdim", "url": fabric_url, "verify_poll_seconds": 0.1},
            "hosts": {"match": "label", "key": "fabric-dra.io/host-id"},
            "pools": {"grouping_keys": ["manager"]},
            "kube": {"mode": "url", "url": kube_url},
            "admin": {"port": admin_port},
            "controller": {"mode": "structured"},
        }
        service = Service(load_settings(environ={}, flags=_merge(_merge(defaults, given), own)))
        stack.push_async_callback(service.stop, 10.0)
        await service.start()
        client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=kube_url))
        stack.push_async_callback(client.close)
        scheduler = StructuredScheduler(
            client,
            ResourceApiVersion.V1,
            StructuredSettings(namespace=NAMESPACE, poll_interval_s=0.5, retry_interval_s=0.5),
        )
        await scheduler.start()
        stack.push_async_callback(scheduler.stop)

        def slices() -> list[dict[str, Any]]:
            return [s for s in emu.list(V1, "ResourceSlice") if s["spec"]["driver"] == driver]

        await _until(lambda: bool(slices()), "the slices")
        published = sum(len(s["spec"]["devices"]) for s in slices())
        _say(
            f"fabric-dra: inventory read from configuration-manager ({published} devices; "
            f"CPUs and their built-in parts left out); pool "
            f"{slices()[0]['spec']['pool']['name']} published, reaching the nodes labelled "
            f"fabric-dra.io/fabric-manager=cdim"
        )
        emu.create(
            {
                "apiVersion": V1,
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-gpu", "namespace": NAMESPACE},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}
                            ]
                        }
                    }
                },
            }
        )
        started = time.monotonic()
        emu.create(_pod("trainer"))
        node = await _until(lambda: _bound(emu, "trainer"), "the pod's binding")
        applies = list(sim.applies.values())
        _say(
            f"[cdim] pod {NAMESPACE}/trainer: claim allocated by the scheduler, its GPU "
            f"connected to {node}'s CPU through layout-apply (apply {applies[-1].apply_id}, "
            f"journalled before it was polled), binding condition True, pod bound to {node} in "
            f"{time.monotonic() - started:.1f} s"
        )
        before = len(sim.applies)
        started = time.monotonic()
        names = [f"worker-{i}" for i in range(8)]
        for name in names:
            emu.create(_pod(name))
        for name in names:
            await _until(lambda n=name: _bound(emu, n), f"pod {name}'s binding")  # type: ignore[misc]
        _say(
            f"[cdim] 8 pods at once: their GPUs connected in {len(sim.applies) - before} "
            f"applies (waiting attaches share one; CDIM runs one apply at a time), all bound in "
            f"{time.monotonic() - started:.1f} s"
        )
        for name in ["trainer", *names]:
            emu.delete("v1", "Pod", name, NAMESPACE)

        def all_free() -> bool:
            return all(sim.holder(d) is None for d in sim.composable_ids())

        await _until(all_free, "the disconnects")
        _say(
            "[cdim] pods deleted: claims deallocated, every GPU disconnected through "
            "layout-apply and released"
        )
        _say(
            "[cdim] the node plugin is not run on CDIM here: CDIM exposes no GPU UUID or PCI "
            "address, which the node side needs to find a GPU on the host (docs/fabric-cdim.md)"
        )
        host = service.settings.admin.host
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        _say(f"dashboard: http://{host}:{service.admin_port}/   (API: /api/v1/status, /metrics)")
        if not once:
            _say("serving until Ctrl-C")
            await wait()
    _say("stopped")


__all__ = ["CDIM_DATABASE", "run_cdim_demo"]
