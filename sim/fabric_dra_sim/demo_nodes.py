"""The node side of ``fabric-dra demo``: what runs on the nodes of one emulated cluster.

For every node a short folder under /tmp (unix socket paths must stay under 108 bytes), with
fabric-dra's node plugin (:class:`app.node.agent.NodeAgent`, ``fabric-dra node``'s), a kubelet
stand-in (:class:`fabric_dra_sim.kubelet.kubelet.KubeletStandIn`) and a fake host
(:class:`fabric_dra_sim.fakehost.FakeHost`); and one :class:`fabric_dra_sim.hostsim.HostSim`
that shows a device on a node's fake host while the fabric simulator has it attached to that
node's server. :class:`NodeSide` starts them (their stops go on the demo's exit stack), has a
pod prepared and unprepared on a node and tells the container edits a runtime would apply.

:func:`say` and :func:`until`, the demo's way of telling and waiting, live here so that both
halves of the demo share them.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from app.commands.common import Settings

# How often the kubelet stand-ins look for plugin registrations, in seconds.
WATCH_POLL_S = 0.5


def say(text: str) -> None:
    """One line of the story on stdout, after a ``==>`` marker."""
    click.echo(click.style("==> ", fg="cyan", bold=True) + text)


async def until(
    check: Callable[[], Awaitable[Any] | Any], what: str, timeout_s: float = 60.0
) -> Any:
    """Poll ``check`` every 0.1 s until it returns something truthy; that value is returned.

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


@dataclass
class DemoNode:
    """One emulated node with its node plugin and kubelet stand-in.

    Attributes:
        name: the Node's name (its server's HostName).
        host_id: its server's fabric host id (the System ``Id``).
        root: its folder: ``reg/`` (plugin registry), ``plugins/``, ``cdi/``, ``host/``.
        fake: its fake host under ``root/host``.
        agent: the node plugin (:class:`app.node.agent.NodeAgent`).
        kubelet: the kubelet stand-in (:class:`fabric_dra_sim.kubelet.kubelet.KubeletStandIn`).
    """

    name: str
    host_id: str
    root: Path
    fake: Any
    agent: Any = None
    kubelet: Any = None

    @property
    def cdi_dir(self) -> Path:
        """Where its node plugin writes CDI specs and its kubelet stand-in reads them."""
        return self.root / "cdi"

    def cdi_specs(self) -> list[str]:
        """The names of the CDI spec files there now."""
        if not self.cdi_dir.is_dir():
            return []
        return sorted(p.name for p in self.cdi_dir.iterdir() if p.suffix == ".json")


def container_story(pod: str, container: str, edits: Any, tag: str = "[1.34]") -> list[str]:
    """What a runtime would apply to ``container`` of ``pod`` (``namespace/name``) for its
    :class:`fabric_dra_sim.kubelet.cdi_check.ContainerEdits`, as lines: the CDI device ids
    (after ``tag``, the cluster's mark in the story), then the device nodes
    (``path (type major:minor)``), the mounts, and the environment sorted by name, one a
    line."""
    devices = ", ".join(edits.devices) or "no CDI devices"
    lines = [f"{tag} container {container} of pod {pod} gets: {devices}"]
    nodes = [
        f"{d.get('path')} ({d.get('type', '?')} {d.get('major', '?')}:{d.get('minor', '?')})"
        for d in edits.device_nodes
    ]
    lines.append(f"device nodes: {', '.join(nodes) or 'none'}")
    for mount in edits.mounts:
        options = ",".join(mount.get("options") or ())
        lines.append(f"mount: {mount.get('hostPath')} -> {mount.get('containerPath')} ({options})")
    lines.extend(f"env {name}={value}" for name, value in sorted(edits.env_map().items()))
    return lines


@dataclass
class NodeSide:
    """The nodes of one emulated cluster: :class:`DemoNode` by name, and the host simulator.

    Attributes:
        label: the cluster's name in the story (``Kubernetes 1.34``).
        tag: its mark at the start of story lines (``[1.34]``).
        namespace: the namespace of its pods.
        nodes: node name -> :class:`DemoNode`, filled by :meth:`start`.
        host_sim: the :class:`fabric_dra_sim.hostsim.HostSim`, set by :meth:`start`.
        base: the folder holding every node's folder (removed when the demo stops).
    """

    label: str
    tag: str
    namespace: str
    nodes: dict[str, DemoNode] = field(default_factory=dict)
    host_sim: Any = None
    base: Path | None = None

    async def start(
        self,
        stack: contextlib.AsyncExitStack,
        settings: Settings,
        hosts: Sequence[Any],
        fabric: Any,
        kube_url: str,
        *,
        resource_version: str = "v1",
        controller_url: str | None = None,
    ) -> None:
        """Start a node plugin, a kubelet stand-in and a fake host for each of ``hosts``, then
        the host simulator, and wait until every plugin is registered with its kubelet.

        Args:
            stack: the demo's exit stack; every stop (and the folder's removal) goes on it,
                also when a start fails half-way.
            settings: the cluster's service settings; each node plugin gets them with its own
                ``node`` folders, name and probe address.
            hosts: the fabric's servers (:class:`app.fabric.types.Host`: ``hostname``,
                ``host_id``), one node each.
            fabric: the cluster's Redfish simulator (read by the host simulator).
            kube_url: the cluster's API server.
            resource_version: the resource.k8s.io version the kubelet stand-ins read claims in
                (``v1``, ``v1alpha3``).
            controller_url: ``node.controller_url``, the service's admin URL the node plugins
                ask for a claim's devices when the claim has no ``status.devices`` (1.31).

        Raises:
            click.ClickException: a plugin did not register within 60 s.
            ConfigError, KubeError, OSError: a node plugin could not start.
        """
        from app.kube.client import KubeAuthMode, KubeClientSettings, connect
        from app.kube.versions import ResourceApiVersion
        from fabric_dra_sim.hostsim import HostSim

        # Unix socket paths must stay under 108 bytes: a short folder in /tmp, not the
        # (possibly long) temporary directory of the demo.
        base = Path(tempfile.mkdtemp(prefix="fabric-dra-nodes-", dir="/tmp"))
        self.base = base
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=kube_url))
        stack.push_async_callback(client.close)
        version = ResourceApiVersion(resource_version)
        for index, host in enumerate(hosts):
            node = await self._start_node(
                stack, settings, client, base / f"n{index}", host, version, controller_url
            )
            self.nodes[node.name] = node
        self.host_sim = HostSim(fabric, {n.name: (n.host_id, n.fake) for n in self.nodes.values()})
        await self.host_sim.start()
        stack.push_async_callback(self.host_sim.stop)
        driver = settings.driver_name
        await until(
            lambda: all(driver in n.kubelet.watcher.plugins for n in self.nodes.values()),
            "the node plugins' registration with the kubelet stand-ins",
        )
        asks = (
            f"; for a claim's devices they ask fabric-dra's admin API at {controller_url}"
            if controller_url is not None
            else ""
        )
        say(
            f"{self.label}: fabric-dra's node plugin on each of the {len(self.nodes)} "
            f"nodes, registered with the node's kubelet stand-in (unix sockets under {base}); "
            f"a fake host per node shows the devices attached to its server{asks}"
        )

    async def _start_node(
        self,
        stack: contextlib.AsyncExitStack,
        settings: Settings,
        client: Any,
        root: Path,
        host: Any,
        version: Any,
        controller_url: str | None,
    ) -> DemoNode:
        from app.kube.versions import ResourceApiVersion
        from app.node.agent import NodeAgent
        from fabric_dra_sim.fakehost import FakeHost
        from fabric_dra_sim.kubelet.kubelet import KubeletStandIn
        from fabric_dra_sim.kubelet.registration import KUBELET_131_SERVICES, KUBELET_SERVICES

        node = DemoNode(str(host.hostname), host.host_id, root, FakeHost(root / "host"))
        update: dict[str, Any] = {
            "node_name": node.name,
            "plugin_registry_dir": root / "reg",
            "plugins_dir": root / "plugins",
            "cdi_dir": node.cdi_dir,
            "host_root": root / "host",
            "controller_url": controller_url,
            "health_port": 0,
            "health_host": "127.0.0.1",
        }
        if controller_url is not None and settings.admin.require_token_for_reads:
            update["controller_token_file"] = settings.admin.token_file
        node_settings = settings.node.model_copy(update=update)
        node.agent = NodeAgent(settings.model_copy(update={"node": node_settings}), node.name)
        # Stopped even when its start fails half-way (sockets may be open by then).
        stack.push_async_callback(node.agent.stop)
        await node.agent.start()
        node.kubelet = KubeletStandIn(
            node.name,
            client,
            root / "reg",
            node.cdi_dir,
            resource_version=version,
            watch_poll_s=WATCH_POLL_S,
            # A 1.31 kubelet speaks dra/v1alpha4 only, found by a version number.
            kubelet_services=(
                KUBELET_131_SERVICES if version is ResourceApiVersion.V1ALPHA3 else KUBELET_SERVICES
            ),
        )
        stack.push_async_callback(node.kubelet.stop)
        await node.kubelet.start()
        return node

    def node(self, name: str) -> DemoNode:
        """The node called ``name``.

        Raises:
            click.ClickException: the demo runs no node plugin there.
        """
        found = self.nodes.get(name)
        if found is None:
            raise click.ClickException(f"the demo has no node plugin on node {name}")
        return found

    def shown_on(self, name: str) -> list[tuple[str, str]]:
        """The (node, block URI) keys of the devices on node ``name``'s fake host now."""
        return [k for k in self.host_sim.shown if k[0] == name]

    async def wait_gone(self, name: str, keys: Sequence[tuple[str, str]]) -> None:
        """Wait until none of ``keys`` (from :meth:`shown_on`) is on node ``name``'s host.

        Raises:
            click.ClickException: still there after 60 s.
        """
        await until(
            lambda: not any(k in self.host_sim.shown for k in keys),
            f"the device to leave node {name}'s host",
        )

    async def prepare(self, node: DemoNode, pod: str) -> list[str]:
        """The kubelet stand-in of ``node`` prepares ``pod`` (in :attr:`namespace`); the
        container edits are told. Returns the CDI spec files written.

        Raises:
            click.ClickException: the prepare failed (the host simulator's notes added).
        """
        from fabric_dra_sim.kubelet.kubelet import KubeletError

        before = set(node.cdi_specs())
        try:
            edits = await node.kubelet.prepare_pod(self.namespace, pod)
        except KubeletError as err:
            notes = [n for n in self.host_sim.notes if n.startswith(f"node {node.name}:")]
            extra = f" ({'; '.join(notes)})" if notes else ""
            raise click.ClickException(
                f"the kubelet stand-in on node {node.name} could not prepare the pod: {err}{extra}"
            ) from None
        specs = [s for s in node.cdi_specs() if s not in before]
        shown = self.host_sim.shown
        where = ", ".join(v.pci_address for k, v in sorted(shown.items()) if k[0] == node.name)
        say(
            f"{self.tag} kubelet on {node.name}: NodePrepareResources answered by fabric-dra's "
            f"node plugin, which found the device on the host (PCI {where or '?'}) and wrote CDI "
            f"spec {', '.join(specs) or '(none)'}"
        )
        for container, container_edits in edits.items():
            lines = container_story(
                f"{self.namespace}/{pod}", container, container_edits, tag=self.tag
            )
            say(lines[0])
            for line in lines[1:]:
                click.echo(f"      {line}")
        return specs

    async def unprepare(self, node: DemoNode, pod: str, specs: list[str]) -> None:
        """The kubelet stand-in of ``node`` unprepares ``pod``; its CDI specs must be gone.

        Raises:
            click.ClickException: the unprepare failed or a spec is still there.
        """
        from fabric_dra_sim.kubelet.kubelet import KubeletError

        try:
            await node.kubelet.unprepare_pod(self.namespace, pod)
        except KubeletError as err:
            raise click.ClickException(
                f"the kubelet stand-in on node {node.name} could not unprepare the pod: {err}"
            ) from None
        left = [s for s in specs if s in node.cdi_specs()]
        if left:
            raise click.ClickException(
                f"node {node.name}: CDI spec {', '.join(left)} still in {node.cdi_dir} after "
                "NodeUnprepareResources"
            )
        say(
            f"{self.tag} pod deleted: the kubelet on {node.name} called NodeUnprepareResources; "
            f"CDI spec {', '.join(specs) or '(none)'} is gone"
        )
