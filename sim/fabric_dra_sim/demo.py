"""``fabric-dra demo``: the whole controller on simulated fabrics and clusters, on one machine.

Two clusters, because no Kubernetes release serves both allocation modes:

* a Kubernetes 1.34 cluster (resource.k8s.io v1; DRADeviceBindingConditions on) for the
  structured-parameters story, with its own Redfish fabric simulator;
* a Kubernetes 1.31 cluster (resource.k8s.io v1alpha3 with PodSchedulingContexts) for the
  classic-DRA story, with its own fabric simulator.

Each cluster is the Kubernetes API emulator with one Node per simulated server (labelled with
its region and rack), a scheduler stand-in and the claim-controller stand-in, and its own
fabric-dra service (``fabric-dra run``'s) with its own SQLite database, all in this process.
The demo tells what happens to a pod with a claim made from a ResourceClaimTemplate on the
first cluster and a pod with a classic claim on the second, from pending to attached and
back, and serves the first service's dashboard until Ctrl-C (``--once``: tell the story and
exit).

On both clusters the story ends where a real cluster's does, in a container: every node
runs fabric-dra's node plugin (:class:`app.node.agent.NodeAgent`, ``fabric-dra node``'s) and a
kubelet stand-in (:class:`fabric_dra_sim.kubelet.kubelet.KubeletStandIn`) on unix sockets under
a folder in /tmp, with a fake host (:class:`fabric_dra_sim.fakehost.FakeHost`) where
:class:`fabric_dra_sim.hostsim.HostSim` makes a device appear while the fabric simulator has it
attached to that node's server. When the pod is bound, its node's kubelet stand-in prepares it
and the demo prints the container edits a runtime would apply (CDI devices, device nodes,
environment); when the pod is deleted, the stand-in unprepares it and the CDI spec goes. The
second cluster's claims have no ``status.devices``: its node plugins ask that cluster's service
for a claim's devices (``node.controller_url``, its admin API's ``/api/v1/claim-devices/{uid}``).
The node side is :mod:`fabric_dra_sim.demo_nodes`.

Settings come from ``--config`` and ``FABRIC_DRA_*`` as for ``fabric-dra run`` (the admin token,
pools, node labels, logging, the database, the controllers' timings, ...), over the demo's own
defaults (short poll and grace periods, the dashboard on 127.0.0.1). Those the demo sets itself,
the fabric and Kubernetes connections, the host mapping and ``controller.mode``, are refused in
one line (:data:`DEMO_OWNED`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import signal
import tempfile
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from app.commands.common import Settings, settings_options_with
from app.config import (
    ENV_CONFIG_FILE,
    ENV_PREFIX,
    NESTED_DELIMITER,
    ConfigError,
    read_secret,
)
from app.configload import load_settings
from app.db.engine import run_to_end
from fabric_dra_sim.demo_nodes import NodeSide
from fabric_dra_sim.demo_nodes import say as _say
from fabric_dra_sim.demo_nodes import until as _until
from fabric_dra_sim.demo_workload import Workload

DEMO_DATABASE = "sqlite+aiosqlite:///fabric-dra-demo.db"
# What the demo sets itself, as it runs its own fabrics and clusters: section -> the settings
# of it (None: all of them). Given in a config file or the environment, they are refused.
DEMO_OWNED: dict[str, frozenset[str] | None] = {
    "fabric": frozenset(
        {"url", "auth", "username_file", "password_file", "ca_bundle", "tls_verify"}
    ),
    "kube": None,
    "hosts": None,
    "controller": frozenset({"mode"}),
    "node": frozenset(
        {
            "node_name",
            "plugin_registry_dir",
            "plugins_dir",
            "cdi_dir",
            "host_root",
            "controller_url",
            "health_port",
            "health_host",
        }
    ),
}
OWNED_REASON = (
    "the demo runs its own fabric simulators and emulated Kubernetes clusters and sets it "
    "itself; leave it out (it is for fabric-dra run and fabric-dra node)"
)
# The demo's defaults, under what the user gives: a quick story on one machine.
DEMO_DEFAULTS: dict[str, dict[str, Any]] = {
    # Charts sampled every 5 s, so that the workload shows on them within a minute.
    "admin": {"host": "127.0.0.1", "history_interval_seconds": 5},
    "controller": {"orphan_grace_seconds": 5},
    "inventory": {"poll_interval_seconds": 2},
    "leader": {"namespace": "kube-system"},
}
# Used unless the user gives any of them (they must stay ordered: lease > renew > retry).
DEMO_LEADER_TIMINGS = {
    "lease_duration_seconds": 6,
    "renew_deadline_seconds": 4,
    "retry_period_seconds": 1,
}
STRUCTURED_NS = "demo-structured"
CLASSIC_NS = "demo-classic"
V1 = "resource.k8s.io/v1"
V1ALPHA3 = "resource.k8s.io/v1alpha3"
# Binding conditions are alpha in 1.34; the structured story uses them.
STRUCTURED_GATES = {"DRADeviceBindingConditions": True}


def classic_database(url: str) -> str:
    """The second cluster's database: ``<name>-classic.db`` beside a SQLite file, else a
    SQLite file ``fabric-dra-demo-classic.db`` here (each service needs its own inventory)."""
    prefix = "sqlite+aiosqlite:///"
    if url.startswith(prefix) and url.endswith(".db"):
        return url[: -len(".db")] + "-classic.db"
    return prefix + "fabric-dra-demo-classic.db"


async def check_database(url: str) -> None:
    """Open ``url`` and run ``SELECT 1``, as ``fabric-dra inventory`` reports a database.

    Raises:
        click.ClickException: one line, ``database <url without credentials>: <error type>:
            <first line of the driver's reason>``.
    """
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    from app.config import redact_url
    from app.db.engine import Database

    try:
        database = Database.connect(url)
    except ValueError as err:
        raise click.ClickException(f"database {redact_url(url)}: {err}") from None
    try:
        async with database.engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
    except (SQLAlchemyError, OSError) as err:
        raise click.ClickException(
            f"database {redact_url(url)}: {type(err).__name__}: "
            f"{redact_url(str(err).splitlines()[0])}"
        ) from None
    finally:
        await database.dispose()


@dataclass
class DemoCluster:
    """One emulated cluster with its fabric simulator, its service and its stand-ins.

    Attributes:
        label: ``Kubernetes 1.34`` or ``Kubernetes 1.31``, for the story.
        version: the resource.k8s.io version its objects are written in.
        mode: the service's ``controller.mode``.
    """

    label: str
    version: str
    mode: str
    sim: Any = None
    emu: Any = None
    service: Any = None
    stand_in: Any = None
    nodes: NodeSide | None = None


class Demo:
    """The simulated worlds and the controllers, started and stopped together."""

    def __init__(
        self, settings: Settings, workdir: Path, regions: int, racks: int, per_rack: int
    ) -> None:
        self.base_settings = settings
        self.workdir = workdir
        self.spec = (regions, racks, per_rack)
        self.password = secrets.token_urlsafe(16)
        self.stack = contextlib.AsyncExitStack()
        self.structured = DemoCluster("Kubernetes 1.34", V1, "structured")
        self.classic = DemoCluster("Kubernetes 1.31", V1ALPHA3, "control-plane")

    @property
    def service(self) -> Any:
        """The first cluster's service (the dashboard's)."""
        return self.structured.service

    async def start(self, admin_port: int) -> None:
        """Start both clusters: simulators, emulators, services, stand-ins."""
        from fabric_dra_sim.kubeapi import KubeEmulator

        base = self.base_settings
        database = base.database.url if "url" in base.database.model_fields_set else DEMO_DATABASE
        # Before anything starts: a database that cannot be opened or an admin token file that
        # cannot be read is the user's first error, not a traceback from the middle of the
        # first service's start.
        for url in (database, classic_database(database)):
            await check_database(url)
        if base.admin.token_file is not None:
            read_secret(base.admin.token_file, "admin.token_file")
        await self._start_cluster(
            self.structured,
            KubeEmulator(kubernetes_version="1.34", feature_gates=STRUCTURED_GATES),
            seed=1,
            database=database,
            admin_port=admin_port,
            what="resource.k8s.io v1, binding conditions on",
        )
        await self._start_cluster(
            self.classic,
            KubeEmulator(kubernetes_version="1.31"),
            seed=2,
            database=classic_database(database),
            admin_port=0,
            what="resource.k8s.io v1alpha3 with PodSchedulingContexts",
        )

    async def _start_cluster(
        self,
        cluster: DemoCluster,
        emu: Any,
        *,
        seed: int,
        database: str,
        admin_port: int,
        what: str,
    ) -> None:
        from app.fabric.redfish.backend import RedfishBackend
        from app.service import Service
        from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

        regions, racks, per_rack = self.spec
        cluster.sim = RedfishSimulator(
            spec=InventorySpec(
                regions=regions,
                racks_per_region=racks,
                devices_per_rack=per_rack,
                hosts_per_rack=2,
                device_mix="mixed",
                seed=seed,
            ),
            username="demo",
            password=self.password,
            auth="session",
        )
        fabric_url = await cluster.sim.start()
        self.stack.push_async_callback(cluster.sim.stop)
        cluster.emu = emu
        kube_url = await emu.start()
        self.stack.push_async_callback(emu.stop)
        backend = RedfishBackend(fabric_url, username="demo", password=self.password)
        try:
            hosts = (await backend.list_hosts()).items
        finally:
            await backend.close()
        for host in hosts:
            emu.create(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": host.hostname, "labels": self._node_labels(host)},
                }
            )
        namespace = STRUCTURED_NS if cluster is self.structured else CLASSIC_NS
        emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        self._device_classes(cluster)
        _say(
            f"{cluster.label} (emulated, {what}) at {kube_url}: {len(hosts)} nodes, one per "
            f"server of its Redfish fabric simulator at {fabric_url} "
            f"({len(cluster.sim.block_uris())} resource blocks in {regions * racks} racks)"
        )
        cluster.service = Service(
            self._settings(cluster, fabric_url, kube_url, database, admin_port)
        )
        # Stopped even when its start fails half-way (its HTTP sessions are open by then).
        self.stack.push_async_callback(cluster.service.stop, 10.0)
        await cluster.service.start()
        _say(
            f"fabric-dra on {cluster.label}: controller.mode {cluster.mode}, database "
            f"{database.removeprefix('sqlite+aiosqlite:///')}"
        )
        await self._stand_ins(cluster, kube_url)
        await self._nodes(cluster, hosts, kube_url)

    def _node_labels(self, host: Any) -> dict[str, str]:
        """A node's labels: its hostname and its server's location under the configured
        node label keys (region, rack and every pool grouping key the server has)."""
        settings = self.base_settings
        labels = {"kubernetes.io/hostname": host.hostname}
        for key in ("region", "rack", *settings.pools.grouping_keys):
            value = getattr(host.location, key, None)
            if value:
                labels[settings.node_labels.for_key(key)] = value
        return labels

    def _settings(
        self, cluster: DemoCluster, fabric_url: str, kube_url: str, database: str, admin_port: int
    ) -> Settings:
        """One cluster's service settings: the demo's defaults, then what the user gave
        (``--config``, ``FABRIC_DRA_*``, flags), then what the demo sets itself."""
        (self.workdir / "username").write_text("demo\n")
        (self.workdir / "password").write_text(self.password + "\n")
        given = self.base_settings.model_dump(exclude_unset=True)
        defaults = {section: dict(values) for section, values in DEMO_DEFAULTS.items()}
        if not set(given.get("leader", {})) & set(DEMO_LEADER_TIMINGS):
            defaults["leader"].update(DEMO_LEADER_TIMINGS)
        own = {
            "database": {"url": database},
            "fabric": {
                "url": fabric_url,
                "username_file": str(self.workdir / "username"),
                "password_file": str(self.workdir / "password"),
            },
            "kube": {"mode": "url", "url": kube_url},
            "admin": {"port": admin_port},
            "controller": {"mode": cluster.mode},
        }
        return load_settings(environ={}, flags=_merge(_merge(defaults, given), own))

    def _device_classes(self, cluster: DemoCluster) -> None:
        driver = self.base_settings.driver_name
        kinds = ("gpu", "fpga", "nvme", "cxl-memory") if cluster is self.structured else ("gpu",)
        for kind in kinds:
            selector = (
                f'device.driver == "{driver}" && '
                f'device.attributes["{driver}"].deviceType == "{kind}"'
            )
            cluster.emu.create(
                {
                    "apiVersion": cluster.version,
                    "kind": "DeviceClass",
                    "metadata": {"name": f"fabric-{kind}"},
                    "spec": {"selectors": [{"cel": {"expression": selector}}]},
                }
            )

    async def _stand_ins(self, cluster: DemoCluster, kube_url: str) -> None:
        from app.kube.client import KubeAuthMode, KubeClientSettings, connect
        from app.kube.versions import ResourceApiVersion
        from fabric_dra_sim.scheduler.classic import ClassicScheduler, ClassicSchedulerSettings
        from fabric_dra_sim.scheduler.structured import StructuredScheduler, StructuredSettings

        client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=kube_url))
        self.stack.push_async_callback(client.close)
        stand_in: Any
        if cluster is self.structured:
            stand_in = StructuredScheduler(
                client,
                ResourceApiVersion.V1,
                StructuredSettings(
                    namespace=STRUCTURED_NS, poll_interval_s=0.5, retry_interval_s=0.5
                ),
            )
            what = "kube-scheduler with structured parameters"
        else:
            stand_in = ClassicScheduler(client, ClassicSchedulerSettings(namespace=CLASSIC_NS))
            what = "the 1.31 kube-scheduler's PodSchedulingContexts"
        await stand_in.start()
        self.stack.push_async_callback(stand_in.stop)
        cluster.stand_in = stand_in
        _say(
            f"stand-ins on {cluster.label}: {what}, and the resourceclaim controller "
            f"(resource.k8s.io/{cluster.version.rsplit('/', 1)[1]})"
        )

    async def _nodes(self, cluster: DemoCluster, hosts: Sequence[Any], kube_url: str) -> None:
        """The node side of ``cluster`` (:class:`fabric_dra_sim.demo_nodes.NodeSide`). The
        1.31 cluster's claims carry no ``status.devices``: its node plugins ask the cluster's
        service for a claim's devices (``node.controller_url``, its admin API)."""
        if cluster is self.structured:
            cluster.nodes = NodeSide(cluster.label, "[1.34]", STRUCTURED_NS)
            version, controller_url = "v1", None
        else:
            cluster.nodes = NodeSide(cluster.label, "[1.31]", CLASSIC_NS)
            host = _dashboard_host(cluster.service.settings.admin.host)
            version = V1ALPHA3.rsplit("/", 1)[1]
            controller_url = f"http://{host}:{cluster.service.admin_port}"
        await cluster.nodes.start(
            self.stack,
            cluster.service.settings,
            hosts,
            cluster.sim,
            kube_url,
            resource_version=version,
            controller_url=controller_url,
        )

    async def stop(self) -> None:
        """Stop everything, newest first."""
        await self.stack.aclose()

    # ------------------------------------------------------------------ the story
    async def story(self) -> None:
        """Inventory, publish, then one structured and one classic claim, there and back."""
        for cluster in (self.structured, self.classic):
            await self._published(cluster)
        await self._structured_claim()
        await self._classic_claim()

    async def _published(self, cluster: DemoCluster) -> None:
        from app.inventory.queries import list_status, pool_devices
        from app.pools import PoolConfig, desired_pools

        service = cluster.service
        status = await _until(
            lambda: _synced(list_status(service.db)), f"the inventory of {cluster.label}"
        )
        expected = set(
            desired_pools(
                await pool_devices(service.db), PoolConfig.from_settings(service.settings)
            )
        )
        await _until(
            lambda: {s["spec"]["pool"]["name"] for s in self._slices(cluster)} == expected,
            f"the slices of {cluster.label}",
        )
        _say(
            f"{cluster.label}: inventory synced ({status.device_count} devices, "
            f"{status.host_count} servers in {len(expected)} pools); "
            f"{len(self._slices(cluster))} ResourceSlices published "
            f"({cluster.version.rsplit('/', 1)[1]})"
        )

    def _slices(self, cluster: DemoCluster) -> list[dict[str, Any]]:
        return [
            s
            for s in cluster.emu.list(cluster.version, "ResourceSlice")
            if s["spec"]["driver"] == self.base_settings.driver_name
        ]

    async def _structured_claim(self) -> None:
        emu = self.structured.emu
        emu.create(
            {
                "apiVersion": V1,
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-gpu", "namespace": STRUCTURED_NS},
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
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "trainer", "namespace": STRUCTURED_NS},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "trainer",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                },
            }
        )
        _say(
            f"[1.34] pod {STRUCTURED_NS}/trainer created with ResourceClaimTemplate one-gpu "
            f"(structured parameters)"
        )
        name = await _until(
            lambda: _template_claim(emu, STRUCTURED_NS, "trainer"),
            "the claim made from the template",
        )
        _say(f"[1.34] the claim controller made ResourceClaim {name} for the pod")
        claim = await _until(lambda: _allocated(emu, V1, STRUCTURED_NS, name), "allocation")
        result = claim["status"]["allocation"]["devices"]["results"][0]
        _say(
            f"[1.34] claim allocated by the scheduler: device {result['device']} in pool "
            f"{result['pool']}; the scheduler waits for the binding condition"
        )
        await _until(lambda: _ready(emu, STRUCTURED_NS, name), "the binding condition")
        _say("[1.34] device attached through Redfish; binding condition FabricDeviceReady is True")
        node = await _until(lambda: _bound(emu, STRUCTURED_NS, "trainer"), "the pod's binding")
        _say(f"[1.34] pod bound to node {node}")
        nodes = _node_side(self.structured)
        demo_node = nodes.node(node)
        specs = await nodes.prepare(demo_node, "trainer")
        on_host = nodes.shown_on(node)
        emu.delete("v1", "Pod", "trainer", STRUCTURED_NS)
        await nodes.unprepare(demo_node, "trainer", specs)
        await _until(
            lambda: emu.get(V1, "ResourceClaim", name, STRUCTURED_NS) is None,
            "the claim's deletion",
        )
        await _until(lambda: _no_reservations(self.structured.service), "the detach")
        await nodes.wait_gone(node, on_host)
        _say(
            "[1.34] claim deallocated and deleted, device detached and released; it is gone "
            f"from node {node}'s host"
        )

    async def _classic_claim(self) -> None:
        emu = self.classic.emu
        driver = self.base_settings.driver_name
        emu.create(
            {
                "apiVersion": V1ALPHA3,
                "kind": "ResourceClaim",
                "metadata": {"name": "classic-gpu", "namespace": CLASSIC_NS},
                "spec": {
                    "controller": driver,
                    "devices": {"requests": [{"name": "gpu", "deviceClassName": "fabric-gpu"}]},
                },
            }
        )
        emu.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "inference", "namespace": CLASSIC_NS},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "inference",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "classic-gpu"}],
                },
            }
        )
        _say(
            f"[1.31] pod {CLASSIC_NS}/inference created with claim classic-gpu (classic DRA: "
            f"spec.controller {driver})"
        )
        claim = await _until(
            lambda: _allocated(emu, V1ALPHA3, CLASSIC_NS, "classic-gpu"),
            "the control-plane allocation",
        )
        result = claim["status"]["allocation"]["devices"]["results"][0]
        _say(
            f"[1.31] fabric-dra answered the PodSchedulingContext and allocated device "
            f"{result['device']} for the selected node"
        )
        node = await _until(lambda: _bound(emu, CLASSIC_NS, "inference"), "the pod's binding")
        await _until(lambda: _attached_count(self.classic.service), "the attach")
        _say(f"[1.31] device attached; pod bound to node {node}")
        nodes = _node_side(self.classic)
        demo_node = nodes.node(node)
        specs = await nodes.prepare(demo_node, "inference")
        on_host = nodes.shown_on(node)
        counters = self.classic.stand_in.claim_controller.counters
        emu.delete("v1", "Pod", "inference", CLASSIC_NS)
        await nodes.unprepare(demo_node, "inference", specs)
        await _until(lambda: counters.deallocation_requests, "the deallocation request")
        await _until(
            lambda: not _claim_status(emu, "classic-gpu").get("allocation"),
            "the deallocation",
            timeout_s=90,
        )
        await _until(lambda: _no_reservations(self.classic.service), "the detach", timeout_s=90)
        await nodes.wait_gone(node, on_host)
        _say(
            "[1.31] the claim controller requested deallocation, fabric-dra detached the device "
            f"and deallocated the claim; it is gone from node {node}'s host"
        )
        emu.delete(V1ALPHA3, "ResourceClaim", "classic-gpu", CLASSIC_NS)
        await _until(
            lambda: emu.get(V1ALPHA3, "ResourceClaim", "classic-gpu", CLASSIC_NS) is None,
            "the claim's removal",
        )
        _say("[1.31] claim deleted")


def _node_side(cluster: DemoCluster) -> NodeSide:
    """The node side of a started cluster."""
    assert cluster.nodes is not None, f"{cluster.label}: nodes not started"
    return cluster.nodes


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``top`` over it, section by section."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def owned_setting(settings: Settings) -> str | None:
    """The first setting given (in a config file, the environment or a flag) that the demo
    sets itself (:data:`DEMO_OWNED`), as ``section.name``; None when there is none."""
    given = settings.model_dump(exclude_unset=True)
    if given.get("fabrics"):
        return "fabrics"
    for section, names in DEMO_OWNED.items():
        for name in sorted(given.get(section) or {}):
            if names is None or name in names:
                return f"{section}.{name}"
    return None


def _source(name: str, config_file: Path | None) -> str:
    """Where a setting given to the demo came from: an environment variable or the file."""
    present = {key.upper() for key in os.environ}
    section = name.split(".", 1)[0]
    for variable in (ENV_PREFIX + name.replace(".", NESTED_DELIMITER), ENV_PREFIX + section):
        if variable.upper() in present:
            return f"from environment {variable.upper()}"
    config_file = config_file or (
        Path(os.environ[ENV_CONFIG_FILE]) if os.environ.get(ENV_CONFIG_FILE) else None
    )
    return f"from {config_file}" if config_file is not None else "given"


def _refuse_fabric_url(ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    if value is not None:
        raise click.UsageError(
            "--fabric-url: the demo runs its own fabric simulators and emulated Kubernetes "
            "clusters; it takes no fabric or cluster settings (those are for fabric-dra run)",
            ctx,
        )


def _dashboard_host(host: str) -> str:
    """The address to show for a dashboard bound to ``host``."""
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


async def _no_reservations(service: Any) -> bool:
    from app.journal import Journal

    return not await Journal(service.db).active()


async def _attached_count(service: Any) -> int:
    from app.journal import ATTACHED, Journal

    return len(await Journal(service.db).active([ATTACHED]))


async def _synced(statuses: Awaitable[list[Any]]) -> Any:
    found = [s for s in await statuses if s.last_success_at is not None]
    return found[0] if found else None


def _template_claim(emu: Any, namespace: str, pod: str) -> str | None:
    found = emu.get("v1", "Pod", pod, namespace) or {}
    for entry in (found.get("status") or {}).get("resourceClaimStatuses") or []:
        if entry.get("resourceClaimName"):
            return str(entry["resourceClaimName"])
    return None


def _claim_status(emu: Any, name: str) -> dict[str, Any]:
    claim = emu.get(V1ALPHA3, "ResourceClaim", name, CLASSIC_NS) or {}
    return dict(claim.get("status") or {})


def _allocated(emu: Any, api_version: str, namespace: str, name: str) -> dict[str, Any] | None:
    claim = emu.get(api_version, "ResourceClaim", name, namespace)
    if claim and (claim.get("status") or {}).get("allocation"):
        return dict(claim)
    return None


def _ready(emu: Any, namespace: str, name: str) -> bool:
    claim = emu.get(V1, "ResourceClaim", name, namespace) or {}
    return any(
        c.get("type") == "FabricDeviceReady" and c.get("status") == "True"
        for e in (claim.get("status") or {}).get("devices") or []
        for c in e.get("conditions") or []
    )


def _bound(emu: Any, namespace: str, name: str) -> str | None:
    pod = emu.get("v1", "Pod", name, namespace) or {}
    return (pod.get("spec") or {}).get("nodeName")


async def _run(
    settings: Settings, once: bool, admin_port: int, regions: int, racks: int, per_rack: int
) -> None:
    stopping = _stop_on_signal()
    with tempfile.TemporaryDirectory(prefix="fabric-dra-demo-") as tmp:
        demo = Demo(settings, Path(tmp), regions, racks, per_rack)
        try:
            await _tell(demo, once, admin_port, stopping)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not stopping.is_set() or current is None:
                raise
            current.uncancel()  # the signal's own cancellation: stop as asked
        finally:
            await demo.stop()
    _say("stopped")


async def _tell(demo: Demo, once: bool, admin_port: int, stopping: asyncio.Event) -> None:
    await demo.start(admin_port)
    await demo.story()
    host = _dashboard_host(demo.structured.service.settings.admin.host)
    _say(
        f"dashboards: http://{host}:{demo.structured.service.admin_port}/ "
        f"(Kubernetes 1.34), http://{host}:{demo.classic.service.admin_port}/ "
        f"(Kubernetes 1.31)   (API: /api/v1/status, /metrics)"
    )
    if once:
        return
    workload = Workload(
        demo.structured.emu,
        STRUCTURED_NS,
        lambda node: _node_side(demo.structured).node(node).kubelet,
    )
    workload.start()
    _say(
        f"[1.34] a small workload keeps up to {workload.settings.pods} pods with "
        f"fabric claims coming and going in namespace {STRUCTURED_NS}"
    )
    _say("serving until Ctrl-C")
    try:
        await stopping.wait()
    finally:
        await workload.stop()


def _stop_on_signal() -> asyncio.Event:
    """An event that SIGINT or SIGTERM sets. The first signal also cancels the calling task,
    so that one arriving during the start or the story stops the demo there, cleanly (its
    simulators, node plugins and temporary folders); later ones are ignored while it stops."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def on_signal() -> None:
        if stop.is_set():
            return
        stop.set()
        if task is not None:
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal)
    return stop


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _flags(admin_port: int | None, **_: Any) -> dict[str, Any]:
    return {"admin": {"port": admin_port}}


@click.command()
@click.option("--once", is_flag=True, help="Tell the story, then stop everything and exit.")
@click.option(
    "--admin-port",
    default=None,
    type=click.IntRange(0, 65535),
    help="Port of the first cluster's dashboard and admin API (admin.port; 0: any free port; "
    "the second cluster's always takes a free one) [8080].",
)
@click.option(
    "--regions",
    default=2,
    show_default=True,
    type=click.IntRange(1, 20),
    help="Regions of each simulated fabric (each region is a group of racks and pools).",
)
@click.option(
    "--racks-per-region",
    default=2,
    show_default=True,
    type=click.IntRange(1, 50),
    help="Racks in each region; each rack is one pool, with two servers (two nodes).",
)
@click.option(
    "--devices-per-rack",
    default=8,
    show_default=True,
    type=click.IntRange(4, 512),
    help="Fabric devices in each rack (a mix of GPUs, FPGAs, NVMe drives and CXL memory).",
)
@click.option(
    "--fabric",
    "fabric_kind",
    type=click.Choice(["redfish", "cdim"]),
    default="redfish",
    show_default=True,
    help="The simulated fabric manager: Redfish (two clusters, node plugins included) or NEC "
    "CDIM (one 1.34 cluster; --regions and the rack options do not apply; database "
    "./fabric-dra-demo-cdim.db by default).",
)
@click.option(
    "--fabric-url", hidden=True, expose_value=False, callback=_refuse_fabric_url, is_eager=True
)
@settings_options_with(_flags, fabric_url=False, database_default=DEMO_DATABASE)
def demo(
    once: bool,
    fabric_kind: str,
    admin_port: int | None,
    regions: int,
    racks_per_region: int,
    devices_per_rack: int,
    settings: Settings,
) -> None:
    """Run fabric-dra against simulated Redfish fabrics and Kubernetes clusters.

    No cluster or hardware needed: everything runs in this process. Two emulated clusters, as
    no Kubernetes release serves both allocation modes: 1.34 (structured parameters) and 1.31
    (classic DRA), each with its own fabric and fabric-dra. Each needs its own database: the
    first cluster's is --database-url (default ./fabric-dra-demo.db); the second's is the same
    SQLite file name with "-classic" added (./fabric-dra-demo-classic.db by default), or
    ./fabric-dra-demo-classic.db when --database-url is not a SQLite file. Every node runs the
    node plugin and a kubelet stand-in, and each story ends with the edits the pod's container
    gets. The first dashboard is served at http://127.0.0.1:8080 until Ctrl-C.

    Settings come from --config and FABRIC_DRA_* as for fabric-dra run (admin.token_file,
    pools, node_labels, log, database, controller and inventory timings, node.device_wait_seconds,
    ...); the fabric and Kubernetes connections, hosts, controller.mode and the node plugin's
    folders, node name and probe address are the demo's own and refused.
    """
    owned = owned_setting(settings)
    if owned is not None:
        ctx = click.get_current_context()
        raise click.UsageError(
            f"setting {owned} ({_source(owned, ctx.params.get('config_file'))}): {OWNED_REASON}",
            ctx,
        )
    admin_port = settings.admin.port
    if settings.log.level == "INFO":
        # The story is the demo's output; the service's routine lines would drown it.
        quiet: tuple[str, ...] = ("app", "fabric_dra_sim.kubelet", "fabric_dra_sim.hostsim")
        if fabric_kind == "cdim":
            quiet += ("fabric_dra_sim.scheduler",)
        for name in quiet:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        if fabric_kind == "cdim":
            from fabric_dra_sim.demo_cdim import run_cdim_demo

            given = settings.model_dump(exclude_unset=True)
            defaults = {section: dict(values) for section, values in DEMO_DEFAULTS.items()}
            if not set(given.get("leader", {})) & set(DEMO_LEADER_TIMINGS):
                defaults["leader"].update(DEMO_LEADER_TIMINGS)
            run_to_end(
                run_cdim_demo(settings, defaults, once, admin_port, _wait_for_signal),
                settings.event_loop,
            )
            return
        run_to_end(
            _run(settings, once, admin_port, regions, racks_per_region, devices_per_rack),
            settings.event_loop,
        )
    except ConfigError as err:
        raise click.ClickException(f"the demo could not start: {err}") from None
    except OSError as err:
        # The service may re-raise the bind error with its own message, the cause beneath.
        code = err.errno or getattr(err.__cause__, "errno", None)
        if code not in (errno.EADDRINUSE, errno.EACCES):
            raise click.ClickException(f"the demo could not start: {err}") from None
        raise click.ClickException(
            f"--admin-port {admin_port}: {os.strerror(code)}; try --admin-port 0 (any free port)"
        ) from None
