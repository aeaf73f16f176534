"""``fabric-dra demo``: the whole controller on a simulated fabric and cluster, on one machine.

It starts the Redfish fabric simulator, the Kubernetes API emulator (serving resource.k8s.io
v1 and the classic v1alpha3) with one Node per simulated server, labelled with its region and
rack, the scheduler stand-ins (structured parameters and classic DRA), and the real service
(``fabric-dra run``'s) on a SQLite file, all in this process. Then it tells what happens to a
pod with a structured claim and a pod with a classic claim, from pending to attached and back,
and serves the dashboard until Ctrl-C (``--once``: tell the story and exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import click

from app.commands.common import Settings, settings_options_with
from app.config import load_settings

DEMO_DATABASE = "sqlite+aiosqlite:///fabric-dra-demo.db"
STRUCTURED_NS = "demo-structured"
CLASSIC_NS = "demo-classic"
V1 = "resource.k8s.io/v1"
V1ALPHA3 = "resource.k8s.io/v1alpha3"


def _say(text: str) -> None:
    click.echo(click.style("==> ", fg="cyan", bold=True) + text)


async def _until(check: Callable[[], Awaitable[Any] | Any], what: str,
                 timeout_s: float = 60.0) -> Any:
    """Poll ``check`` until it returns something truthy; that value is returned.

    Raises:
        click.ClickException: it did not happen within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise click.ClickException(f"the demo stalled waiting for {what}")
        await asyncio.sleep(0.1)


class Demo:
    """The simulated world and the controller, started and stopped together."""

    def __init__(self, settings: Settings, workdir: Path, regions: int, racks: int,
                 per_rack: int) -> None:
        self.base_settings = settings
        self.workdir = workdir
        self.spec = (regions, racks, per_rack)
        self.password = secrets.token_urlsafe(16)
        self.stack = contextlib.AsyncExitStack()
        self.sim: Any = None
        self.emu: Any = None
        self.service: Any = None

    async def start(self, admin_port: int) -> None:
        """Start the simulator, the emulator, the stand-ins and the service."""
        from app.fabric.redfish import RedfishBackend
        from app.service import Service
        from app.sim.kubeapi import KubeEmulator
        from app.sim.redfish import InventorySpec, RedfishSimulator

        regions, racks, per_rack = self.spec
        self.sim = RedfishSimulator(
            spec=InventorySpec(regions=regions, racks_per_region=racks,
                               devices_per_rack=per_rack, hosts_per_rack=2, device_mix="mixed",
                               seed=1),
            username="demo", password=self.password, auth="session")
        fabric_url = await self.sim.start()
        self.stack.push_async_callback(self.sim.stop)
        _say(f"Redfish fabric simulator at {fabric_url}: {len(self.sim.block_uris())} resource "
             f"blocks in {regions * racks} racks, {len(self.sim.system_ids())} servers")

        self.emu = KubeEmulator(served_resource_versions=("v1", "v1alpha3"),
                                git_version="v1.34.0")
        kube_url = await self.emu.start()
        self.stack.push_async_callback(self.emu.stop)
        backend = RedfishBackend(fabric_url, username="demo", password=self.password)
        try:
            hosts = (await backend.list_hosts()).items
        finally:
            await backend.close()
        for host in hosts:
            self.emu.create({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": host.hostname, "labels": {
                    "kubernetes.io/hostname": host.hostname,
                    "topology.kubernetes.io/region": host.location.region,
                    "fabric-dra.io/rack": host.location.rack}}})
        for namespace in (STRUCTURED_NS, CLASSIC_NS):
            self.emu.create({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": namespace}})
        self._device_classes()
        _say(f"Kubernetes API emulator at {kube_url} (resource.k8s.io v1 and v1alpha3): "
             f"{len(hosts)} nodes labelled with their region and rack")

        self.service = Service(self._settings(fabric_url, kube_url, admin_port))
        await self.service.start()
        self.stack.push_async_callback(self.service.stop, 10.0)
        await self._stand_ins(kube_url)

    def _settings(self, fabric_url: str, kube_url: str, admin_port: int) -> Settings:
        (self.workdir / "username").write_text("demo\n")
        (self.workdir / "password").write_text(self.password + "\n")
        base = self.base_settings
        database = DEMO_DATABASE if base.database.url == "sqlite+aiosqlite:///fabric-dra.db" \
            else base.database.url
        return load_settings(environ={}, flags={
            "driver_name": base.driver_name,
            "database": {"url": database},
            "fabric": {"url": fabric_url, "username_file": str(self.workdir / "username"),
                       "password_file": str(self.workdir / "password")},
            "kube": {"mode": "url", "url": kube_url},
            "admin": {"host": "127.0.0.1", "port": admin_port},
            "controller": {"mode": "both", "orphan_grace_seconds": 5},
            "inventory": {"poll_interval_seconds": 2},
            "leader": {"namespace": "kube-system", "lease_duration_seconds": 6,
                       "renew_deadline_seconds": 4, "retry_period_seconds": 1},
            "log": {"level": base.log.level, "json_format": base.log.json_format},
        })

    def _device_classes(self) -> None:
        driver = self.base_settings.driver_name
        for kind in ("gpu", "fpga", "nvme", "cxl-memory"):
            selector = (f'device.driver == "{driver}" && '
                        f'device.attributes["{driver}"].deviceType == "{kind}"')
            self.emu.create({"apiVersion": V1, "kind": "DeviceClass",
                             "metadata": {"name": f"fabric-{kind}"},
                             "spec": {"selectors": [{"cel": {"expression": selector}}]}})
        gpu = f'device.driver == "{driver}" && device.attributes["{driver}"].deviceType == "gpu"'
        self.emu.create({"apiVersion": V1ALPHA3, "kind": "DeviceClass",
                         "metadata": {"name": "fabric-classic-gpu"},
                         "spec": {"selectors": [{"cel": {"expression": gpu}}]}})

    async def _stand_ins(self, kube_url: str) -> None:
        from app.kube.client import KubeAuthMode, KubeClientSettings, connect
        from app.kube.versions import ResourceApiVersion
        from app.sim.scheduler.classic import ClassicScheduler, ClassicSchedulerSettings
        from app.sim.scheduler.structured import StructuredScheduler, StructuredSettings

        client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=kube_url))
        self.stack.push_async_callback(client.close)
        structured = StructuredScheduler(client, ResourceApiVersion.V1, StructuredSettings(
            namespace=STRUCTURED_NS, poll_interval_s=0.5, retry_interval_s=0.5))
        classic = ClassicScheduler(client, ClassicSchedulerSettings(namespace=CLASSIC_NS))
        await structured.start()
        self.stack.push_async_callback(structured.stop)
        await classic.start()
        self.stack.push_async_callback(classic.stop)
        _say("scheduler stand-ins running: structured parameters and classic DRA")

    async def stop(self) -> None:
        """Stop everything, newest first."""
        await self.stack.aclose()

    # ------------------------------------------------------------------ the story
    async def story(self) -> None:
        """Inventory, publish, then one structured and one classic claim, there and back."""
        from app.inventory.queries import list_status, pool_devices
        from app.pools import PoolConfig, desired_pools

        status = await _until(lambda: _synced(list_status(self.service.db)), "the inventory")
        expected = set(desired_pools(await pool_devices(self.service.db),
                                     PoolConfig.from_settings(self.service.settings)))
        _say(f"inventory synced: {status.device_count} devices, {status.host_count} servers "
             f"in {len(expected)} pools")
        await _until(lambda: all(
            {s["spec"]["pool"]["name"] for s in self._slices(version)} == expected
            for version in (V1, V1ALPHA3)), "the slices")
        _say(f"slices published: {len(self._slices(V1))} ResourceSlices (v1) and "
             f"{len(self._slices(V1ALPHA3))} (v1alpha3) for {len(expected)} pools")
        await self._structured_claim()
        await self._classic_claim()

    def _slices(self, api_version: str) -> list[dict[str, Any]]:
        return [s for s in self.emu.list(api_version, "ResourceSlice")
                if s["spec"]["driver"] == self.base_settings.driver_name]

    async def _structured_claim(self) -> None:
        emu = self.emu
        emu.create({"apiVersion": V1, "kind": "ResourceClaim",
                    "metadata": {"name": "gpu", "namespace": STRUCTURED_NS},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                        "deviceClassName": "fabric-gpu"}}]}}})
        emu.create({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "trainer", "namespace": STRUCTURED_NS},
                    "spec": {"containers": [{"name": "main", "image": "trainer"}],
                             "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}]}})
        _say(f"pod {STRUCTURED_NS}/trainer created with claim gpu (structured parameters)")
        claim = await _until(lambda: _allocated(emu, V1, STRUCTURED_NS, "gpu"), "allocation")
        result = claim["status"]["allocation"]["devices"]["results"][0]
        _say(f"claim allocated by the scheduler: device {result['device']} in pool "
             f"{result['pool']}; the scheduler waits for the binding condition")
        await _until(lambda: _ready(emu, STRUCTURED_NS, "gpu"), "the binding condition")
        _say("device attached through Redfish; binding condition FabricDeviceReady is True")
        node = await _until(lambda: _bound(emu, STRUCTURED_NS, "trainer"), "the pod's binding")
        _say(f"pod bound to node {node}")
        emu.delete("v1", "Pod", "trainer", STRUCTURED_NS)
        await _until(lambda: not _allocated(emu, V1, STRUCTURED_NS, "gpu"), "deallocation")
        await _until(lambda: self._no_reservations(), "the detach")
        _say("pod deleted: claim deallocated, device detached and released")

    async def _classic_claim(self) -> None:
        emu = self.emu
        driver = self.base_settings.driver_name
        emu.create({"apiVersion": V1ALPHA3, "kind": "ResourceClaim",
                    "metadata": {"name": "classic-gpu", "namespace": CLASSIC_NS},
                    "spec": {"controller": driver, "devices": {"requests": [
                        {"name": "gpu", "deviceClassName": "fabric-classic-gpu"}]}}})
        emu.create({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "inference", "namespace": CLASSIC_NS},
                    "spec": {"containers": [{"name": "main", "image": "inference"}],
                             "resourceClaims": [{"name": "gpu",
                                                 "resourceClaimName": "classic-gpu"}]}})
        _say(f"pod {CLASSIC_NS}/inference created with claim classic-gpu (classic DRA: "
             f"spec.controller {driver})")
        claim = await _until(lambda: _allocated(emu, V1ALPHA3, CLASSIC_NS, "classic-gpu"),
                             "the control-plane allocation")
        result = claim["status"]["allocation"]["devices"]["results"][0]
        _say(f"fabric-dra answered the PodSchedulingContext and allocated device "
             f"{result['device']} for the selected node")
        node = await _until(lambda: _bound(emu, CLASSIC_NS, "inference"), "the pod's binding")
        await _until(lambda: self._attached_count(), "the attach")
        _say(f"device attached; pod bound to node {node}")
        emu.delete("v1", "Pod", "inference", CLASSIC_NS)
        emu.delete(V1ALPHA3, "ResourceClaim", "classic-gpu", CLASSIC_NS)
        await _until(lambda: self._no_reservations(), "the detach", timeout_s=90)
        _say("pod and claim deleted: device detached, claim finalizer removed")

    async def _no_reservations(self) -> bool:
        from app.journal import Journal

        return not await Journal(self.service.db).active()

    async def _attached_count(self) -> int:
        from app.journal import ATTACHED, Journal

        return len(await Journal(self.service.db).active([ATTACHED]))


async def _synced(statuses: Awaitable[list[Any]]) -> Any:
    found = [s for s in await statuses if s.last_success_at is not None]
    return found[0] if found else None


def _allocated(emu: Any, api_version: str, namespace: str, name: str) -> dict[str, Any] | None:
    claim = emu.get(api_version, "ResourceClaim", name, namespace)
    if claim and (claim.get("status") or {}).get("allocation"):
        return dict(claim)
    return None


def _ready(emu: Any, namespace: str, name: str) -> bool:
    claim = emu.get(V1, "ResourceClaim", name, namespace) or {}
    return any(c.get("type") == "FabricDeviceReady" and c.get("status") == "True"
               for e in (claim.get("status") or {}).get("devices") or []
               for c in e.get("conditions") or [])


def _bound(emu: Any, namespace: str, name: str) -> str | None:
    pod = emu.get("v1", "Pod", name, namespace) or {}
    return (pod.get("spec") or {}).get("nodeName")


async def _run(settings: Settings, once: bool, admin_port: int, regions: int, racks: int,
               per_rack: int) -> None:
    with tempfile.TemporaryDirectory(prefix="fabric-dra-demo-") as tmp:
        demo = Demo(settings, Path(tmp), regions, racks, per_rack)
        try:
            await demo.start(admin_port)
            await demo.story()
            port = demo.service.admin_port
            _say(f"dashboard: http://127.0.0.1:{port}/   (API: /api/v1/status, /metrics)")
            if not once:
                _say("serving until Ctrl-C")
                await _wait_for_signal()
        finally:
            await demo.stop()
    _say("stopped")


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _no_flags(**_: Any) -> dict[str, Any]:
    return {}


@click.command()
@click.option("--once", is_flag=True, help="Tell the story, then stop everything and exit.")
@click.option("--admin-port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the dashboard and admin API (0: any free port).")
@click.option("--regions", default=2, show_default=True, type=click.IntRange(1, 20))
@click.option("--racks-per-region", default=2, show_default=True, type=click.IntRange(1, 50))
@click.option("--devices-per-rack", default=8, show_default=True, type=click.IntRange(4, 512))
@settings_options_with(_no_flags)
def demo(once: bool, admin_port: int, regions: int, racks_per_region: int,
         devices_per_rack: int, settings: Settings) -> None:
    """Run fabric-dra against a simulated Redfish fabric and Kubernetes cluster.

    No cluster or hardware needed: everything runs in this process. The inventory goes to
    ./fabric-dra-demo.db unless --database-url is given. The dashboard is served at
    http://127.0.0.1:8080 until Ctrl-C.
    """
    if settings.log.level == "INFO":
        # The story is the demo's output; the service's routine lines would drown it.
        logging.getLogger("app").setLevel(logging.WARNING)
    try:
        asyncio.run(_run(settings, once, admin_port, regions, racks_per_region,
                         devices_per_rack))
    except OSError as err:
        raise click.ClickException(
            f"{err}; is port {admin_port} in use? Try --admin-port 0") from None
