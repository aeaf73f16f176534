"""``fabric-dra node`` put together: the Kubernetes client, the plugin, its gRPC servers, the
health loop and a small HTTP endpoint (``/healthz``, ``/readyz``, ``/metrics``) for probes.

RBAC it needs (deploy/base/node-rbac.yaml): get ResourceClaims; create Events.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import shutil
import socket
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from app.aio import cancel_and_wait, running_loop_name
from app.config import ConfigError, Settings, read_secret
from app.jsontypes import JsonDict
from app.kube.client import KubeClient, call_json, connect
from app.kube.errors import KubeError, KubeNotFound, KubeVersionError
from app.kube.factory import kube_client_settings
from app.kube.versions import (
    ResourceApiVersion,
    choose_version,
    claim_from_wire,
    discover_served_versions,
    read_claim_call,
)
from app.node.checkpoint import Checkpoint
from app.node.metrics import NodeMetrics
from app.node.plan import ClaimNotPreparable, ClaimReadFailed, ClaimRef
from app.node.plugin import NodePlugin
from app.node.server import PluginServers, health_loop

log = logging.getLogger(__name__)

EVENT_COMPONENT = "fabric-dra-node"
NODE_NAME_ENV = "NODE_NAME"
JOURNAL_TIMEOUT_S = 5.0
MAX_JOURNAL_BYTES = 1024 * 1024


def node_name(settings: Settings, environ: dict[str, str] | None = None) -> str:
    """``node.node_name``, else the ``NODE_NAME`` environment variable.

    Raises:
        ConfigError: neither is set.
    """
    env = os.environ if environ is None else environ
    name = settings.node.node_name or env.get(NODE_NAME_ENV)
    if not name:
        raise ConfigError(
            "setting node.node_name: not set, and NODE_NAME is not in the environment "
            "(set it from the downward API: fieldRef spec.nodeName)"
        )
    return name


def check_node_settings(settings: Settings) -> None:
    """What can be checked before the first prepare: the host root exists, the hook's program
    is there, the CDI and kubelet directories are absolute.

    Raises:
        ConfigError: one line naming the setting.
    """
    node = settings.node
    for name in ("cdi_dir", "plugins_dir", "plugin_registry_dir", "host_root"):
        path = getattr(node, name)
        if not path.is_absolute():
            raise ConfigError(f"setting node.{name}: {str(path)!r} is not an absolute path")
    if not (node.host_root / "sys").is_dir():
        raise ConfigError(
            f"setting node.host_root: {str(node.host_root)!r} has no sys directory (mount the "
            "host's /sys there)"
        )
    if node.hook:
        program = node.hook[0]
        found = shutil.which(program) if "/" not in program else program
        if found is None or not os.access(found, os.X_OK):
            raise ConfigError(f"setting node.hook: {program!r} is not an executable program")


def checkpoint_path(settings: Settings) -> Any:
    """``<plugins_dir>/<driver>/checkpoint.json``."""
    return settings.node.plugins_dir / settings.driver_name / "checkpoint.json"


class NodeAgent:
    """Everything ``fabric-dra node`` runs. ``start`` then ``stop``.

    Args:
        settings: all settings (``node``, ``kube``, ``driver_name``, ``pools``).
        node: this node's name (:func:`node_name`).
    """

    def __init__(self, settings: Settings, node: str) -> None:
        self.settings = settings
        self.node = node
        self.registry = CollectorRegistry()
        self.metrics = NodeMetrics.create(self.registry)
        self.kube: KubeClient | None = None
        self.version = ResourceApiVersion.V1
        self.plugin: NodePlugin | None = None
        self.servers: PluginServers | None = None
        self.http: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.health_port: int | None = None

    async def start(self) -> None:
        """Connect, load the checkpoint, listen.

        Raises:
            ConfigError, KubeError, OSError, CheckpointError: it could not start (one line).
        """
        s = self.settings
        check_node_settings(s)
        self.kube = await connect(kube_client_settings(s.kube))
        served = await discover_served_versions(self.kube.api)
        fixed = s.kube.resource_api_version
        if fixed != "auto":
            if fixed not in served:
                raise KubeVersionError(
                    f"kube.resource_api_version is {fixed}, but the API server serves "
                    f"resource.k8s.io {', '.join(served) or 'nothing'}"
                )
            self.version = ResourceApiVersion(fixed)
        else:
            try:
                self.version = choose_version(served)
            except KubeVersionError:
                # Kubernetes 1.31: claims in v1alpha3 (classic DRA)
                self.version = choose_version(served, control_plane=True)
        api_client = self.kube.api
        if self.version is ResourceApiVersion.V1ALPHA3 and s.node.controller_url is None:
            log.warning(
                "resource.k8s.io v1alpha3 (Kubernetes 1.31): claims carry no status.devices, so "
                "without node.controller_url no prepare can learn that its device is attached"
            )
        if s.node.controller_url is not None:
            headers = {}
            if s.node.controller_token_file is not None:
                token = read_secret(s.node.controller_token_file, "node.controller_token_file")
                headers["Authorization"] = f"Bearer {token.get_secret_value()}"
            self.http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=JOURNAL_TIMEOUT_S), headers=headers
            )

        async def read_claim(namespace: str, name: str) -> JsonDict:
            what = f"read ResourceClaim {namespace}/{name}"
            try:
                wire = await call_json(
                    read_claim_call(api_client, self.version, namespace, name), what
                )
            except KubeNotFound:
                raise ClaimNotPreparable(f"claim {namespace}/{name} not found") from None
            except KubeError as err:
                # The message names the call already.
                raise ClaimReadFailed(str(err)) from None
            return claim_from_wire(wire, self.version, owned=True)

        self.plugin = NodePlugin(
            driver=s.driver_name,
            node=self.node,
            settings=s.node,
            read_claim=read_claim,
            ready_types=s.pools.binding_conditions,
            failed_types=s.pools.binding_failure_conditions,
            checkpoint=Checkpoint(checkpoint_path(s)),
            read_journal=self._read_journal if self.http is not None else None,
            post_event=self._post_event,
            metrics=self.metrics,
        )
        for note in self.plugin.start():
            log.warning("%s", note)
        self.servers = PluginServers(
            self.plugin,
            s.driver_name,
            s.node.plugin_registry_dir,
            s.node.plugins_dir,
            self.metrics,
        )
        await self.servers.start()
        await self._start_http()
        self._tasks.append(
            asyncio.create_task(
                health_loop(self.plugin, s.node.health_interval_seconds), name="node-health"
            )
        )
        log.info(
            "node plugin for DRA driver %s on node %s started (resource.k8s.io/%s, event loop %s)",
            s.driver_name,
            self.node,
            self.version.value,
            running_loop_name(),
        )

    async def _read_journal(self, uid: str) -> list[JsonDict]:
        assert self.http is not None
        url = f"{self.settings.node.controller_url}/api/v1/claim-devices/{uid}"
        try:
            async with self.http.get(url) as response:
                if response.status == 404:
                    return []
                if response.status != 200:
                    raise ClaimReadFailed(f"the controller answered {response.status} for {url}")
                raw = await response.content.read(MAX_JOURNAL_BYTES + 1)
                if len(raw) > MAX_JOURNAL_BYTES:
                    raise ClaimReadFailed(f"the controller's answer for {url} is over 1 MiB")
                body = json.loads(raw)
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            detail = str(err) or type(err).__name__
            raise ClaimReadFailed(f"cannot ask the controller ({url}): {detail}") from None
        devices = body.get("devices") if isinstance(body, dict) else None
        if not isinstance(devices, list):
            raise ClaimReadFailed(f"the controller's answer for {url} has no devices list")
        return [d for d in devices if isinstance(d, dict)]

    async def _post_event(self, claim: ClaimRef, type_: str, reason: str, message: str) -> None:
        if self.kube is None:
            return
        from kubernetes_asyncio.client import CoreV1Api

        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{claim.name}.", "namespace": claim.namespace},
            "involvedObject": {
                "apiVersion": self.version.api_version,
                "kind": "ResourceClaim",
                "namespace": claim.namespace,
                "name": claim.name,
                "uid": claim.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message,
            "source": {"component": EVENT_COMPONENT, "host": self.node},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": f"{EVENT_COMPONENT}-{self.node}"[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await call_json(
                CoreV1Api(self.kube.api).create_namespaced_event(
                    claim.namespace, body, _preload_content=False
                ),
                f"create Event for claim {claim}",
            )
        except KubeError as err:
            log.warning("cannot tell claim %s about %s: %s", claim, reason, err)

    async def _start_http(self) -> None:
        app = web.Application()

        async def healthz(request: web.Request) -> web.Response:
            ok = self.servers is not None and self.servers.serving
            return web.Response(status=200 if ok else 503, text="ok\n" if ok else "not serving\n")

        async def readyz(request: web.Request) -> web.Response:
            if self.servers is None or not self.servers.serving:
                return web.Response(status=503, text="not serving\n")
            if not self.servers.registration.registered.is_set():
                error = self.servers.registration.last_error[:500]
                text = f"not registered with the kubelet yet{': ' + error if error else ''}\n"
                return web.Response(status=503, text=text)
            return web.Response(text="ok\n")

        async def metrics(request: web.Request) -> web.Response:
            body = generate_latest(self.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.settings.node.health_host, self.settings.node.health_port
        )
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        for sock in sockets:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                self.health_port = int(sock.getsockname()[1])
                break

    async def stop(self) -> None:
        """Stop everything; sockets are removed, the checkpoint and CDI specs stay."""
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        if self.servers is not None:
            await self.servers.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.http is not None:
            await self.http.close()
        if self.kube is not None:
            await self.kube.close()
