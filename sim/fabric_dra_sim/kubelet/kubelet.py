"""A kubelet stand-in for DRA: registers plugins (:mod:`.registration`), prepares a bound pod's
claims through their drivers' plugins (:mod:`.dra`), checks the CDI specs the plugins wrote
(:mod:`.cdi_check`) and resolves each container's CDI ids to the edits a runtime would apply;
unprepares when the pod goes.

Rules taken from pkg/kubelet/cm/dra/manager.go (kubernetes/kubernetes):

* the pod's claims are ``spec.resourceClaims`` resolved with ``status.resourceClaimStatuses``
  (k8s.io/dynamic-resource-allocation/resourceclaim ``Name``: a template claim without a status
  entry is an error, one whose entry has no claim name needs nothing);
* a claim made from a template must be owned by the pod (``IsForPod``); every claim must list
  the pod in ``status.reservedFor`` and be allocated; every driver of its allocation must be
  registered; all of that is checked before any plugin is called;
* claims are prepared once per node: a claim already prepared (for another pod) only gains the
  pod as a user; a claim with the same name but another uid is an error;
* one NodePrepareResources call per driver with all that driver's claims; a call error, a
  per-claim error, an unknown or a skipped claim fails the pod's prepare;
* a container gets the CDI ids of the devices of each ``resources.claims`` entry: all the
  claim's devices, or those serving ``request`` (a device serving ``request/sub`` counts)
  (``ClaimInfo.cdiDevicesAsList``);
* unprepare: for each claim of the pod, drop the pod as a user; when no pod on the node uses it
  any more, NodeUnprepareResources on each of its drivers, then forget it; the record survives
  :meth:`KubeletStandIn.restart` (the kubelet's checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from app.kube.client import KubeClient, call_json
from app.kube.errors import KubeError
from app.kube.versions import ResourceApiVersion, read_claim_call
from fabric_dra_sim.kubelet.cdi_check import CdiError, ContainerEdits, load_specs, resolve
from fabric_dra_sim.kubelet.dra import ClaimRef, DraClient, DraError, PreparedDevice
from fabric_dra_sim.kubelet.registration import KUBELET_SERVICES, PluginWatcher
from fabric_dra_sim.scheduler.common import (
    is_finished,
    owner_pod_uid,
    pod_key,
    pod_uid,
    reserved_for_pod,
)

log = logging.getLogger(__name__)


class KubeletError(Exception):
    """Preparing or unpreparing a pod failed; one line naming the pod and, where it applies,
    the claim and the driver."""


@dataclass(slots=True)
class PreparedClaim:
    """What the stand-in remembers about one claim on its node (the checkpoint entry).

    Attributes:
        ref: namespace, uid, name.
        drivers: the drivers of its allocation.
        pods: uids of the pods using it.
        devices: driver -> the devices its plugin prepared.
        prepared: NodePrepareResources succeeded for every driver.
    """

    ref: ClaimRef
    drivers: tuple[str, ...]
    pods: set[str] = field(default_factory=set)
    devices: dict[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)
    prepared: bool = False

    def cdi_ids(self, request: str) -> list[str]:
        """The CDI ids of the devices serving ``request`` ('' = every device)."""
        out: list[str] = []
        for devices in self.devices.values():
            for device in devices:
                if not request or any(
                    r == request or r.startswith(f"{request}/") for r in device.request_names
                ):
                    out.extend(device.cdi_device_ids)
        return out


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod the stand-in prepared: enough to unprepare it once the pod object is gone.

    Attributes:
        namespace, name, uid: the pod.
        claims: the uids of its claims, in order.
    """

    namespace: str
    name: str
    uid: str
    claims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _PodClaim:
    pod_claim_name: str
    claim: Mapping[str, Any]
    drivers: tuple[str, ...]


def _allocation_drivers(claim: Mapping[str, Any]) -> tuple[str, ...]:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or ()
    return tuple(dict.fromkeys(str(r.get("driver")) for r in results if r.get("driver")))


def _claim_ref(claim: Mapping[str, Any]) -> ClaimRef:
    meta = claim.get("metadata") or {}
    return ClaimRef(str(meta.get("namespace") or ""), str(meta.get("uid") or ""), str(meta["name"]))


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]


class KubeletStandIn:
    """The DRA part of one node's kubelet.

    Args:
        node_name: this node.
        client: the Kubernetes client (pods, ResourceClaims).
        registry_dir: the plugin registry directory to watch.
        cdi_dir: where plugins write CDI specs.
        timeout_s: the deadline of each DRA call (the kubelet's default is 45 s).
        resource_version: the resource.k8s.io version to read claims with.
        poll_s: how often :meth:`run` lists the node's pods; ``watch_poll_s``: how often the
            plugin watcher scans.
        kubelet_services: the DRA services this kubelet speaks, preferred first.

    ``await start()`` starts the plugin watcher; ``await stop()`` stops it and closes the plugin
    connections. :attr:`claims` (claim uid -> :class:`PreparedClaim`) and :attr:`pods`
    (pod uid -> :class:`PodRecord`) are the checkpoint; :attr:`ready` holds the uids of pods
    whose prepare succeeded; :attr:`errors` holds the last error :meth:`run` met per pod
    ("namespace/name").
    """

    def __init__(
        self,
        node_name: str,
        client: KubeClient,
        registry_dir: Path,
        cdi_dir: Path,
        timeout_s: float = 45.0,
        *,
        resource_version: ResourceApiVersion = ResourceApiVersion.V1,
        poll_s: float = 0.2,
        watch_poll_s: float = 0.1,
        kubelet_services: tuple[str, ...] = KUBELET_SERVICES,
    ) -> None:
        if not node_name:
            raise ValueError("kubelet stand-in: node_name must not be empty")
        if timeout_s <= 0 or poll_s <= 0:
            raise ValueError("kubelet stand-in: timeout_s and poll_s must be > 0")
        self.node_name = node_name
        self.cdi_dir = Path(cdi_dir)
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.core = CoreV1Api(client.api)
        self.resource_version = resource_version
        self._api_client = client.api
        self.watcher = PluginWatcher(Path(registry_dir), kubelet_services, watch_poll_s)
        self.claims: dict[str, PreparedClaim] = {}
        self.pods: dict[str, PodRecord] = {}
        self.errors: dict[str, str] = {}
        self.ready: set[str] = set()
        self._clients: dict[tuple[str, str], DraClient] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start watching for plugins."""
        await self.watcher.start()

    async def stop(self) -> None:
        """Stop :meth:`run`'s loop if started, the watcher, and close plugin connections."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.watcher.stop()
        await self._close_clients()

    async def restart(self) -> None:
        """A kubelet restart: plugins handshake again, connections are dropped; the prepared
        claims and pods are kept (the checkpoint)."""
        async with self._lock:
            await self._close_clients()
        await self.watcher.restart()

    async def _close_clients(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for dra in clients:
            await dra.close()

    def _client(self, driver: str, what: str) -> DraClient:
        plugin = self.watcher.plugins.get(driver)
        if plugin is None:
            raise KubeletError(f"{what}: DRA driver {driver} is not registered")
        key = (plugin.endpoint, plugin.service)
        if key not in self._clients:
            self._clients[key] = DraClient(plugin.endpoint, plugin.service, driver)
        return self._clients[key]

    async def _read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return await call_json(
                self.core.read_namespaced_pod(name, namespace, _preload_content=False),
                f"read Pod {namespace}/{name}",
            )
        except KubeError as err:
            raise KubeletError(f"pod {namespace}/{name}: {err}") from err

    async def _read_claim(self, namespace: str, name: str, what: str) -> dict[str, Any]:
        try:
            return await call_json(
                read_claim_call(self._api_client, self.resource_version, namespace, name),
                f"read ResourceClaim {namespace}/{name}",
            )
        except KubeError as err:
            raise KubeletError(f"{what}: fetch ResourceClaim {name}: {err}") from err

    def _claim_names(self, pod: Mapping[str, Any], what: str) -> list[tuple[str, str, bool]]:
        """(pod claim name, claim name, from a template) for each claim the pod uses now."""
        statuses = {
            str(s.get("name")): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
            if isinstance(s, Mapping)
        }
        out: list[tuple[str, str, bool]] = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            name = str(entry.get("name") or "")
            if entry.get("resourceClaimName"):
                out.append((name, str(entry["resourceClaimName"]), False))
            elif entry.get("resourceClaimTemplateName"):
                if name not in statuses:
                    raise KubeletError(
                        f"{what}: pod claim {name}: waiting for the ResourceClaim of template "
                        f"{entry['resourceClaimTemplateName']} (no resourceClaimStatuses entry)"
                    )
                if statuses[name]:
                    out.append((name, str(statuses[name]), True))
            else:
                raise KubeletError(f"{what}: pod claim {name}: neither a claim nor a template")
        return out

    async def _gather(self, pod: Mapping[str, Any], what: str) -> list[_PodClaim]:
        """Read and check every claim of the pod before anything changes (manager.go's
        validation pass)."""
        namespace, _ = pod_key(pod)
        uid = pod_uid(pod)
        gathered: list[_PodClaim] = []
        for pod_claim_name, claim_name, from_template in self._claim_names(pod, what):
            claim = await self._read_claim(namespace, claim_name, what)
            ref = _claim_ref(claim)
            where = f"{what}: ResourceClaim {claim_name} ({ref.uid})"
            if from_template and owner_pod_uid(claim) != uid:
                raise KubeletError(f"{where}: was not created for the pod (pod is not its owner)")
            if not reserved_for_pod(claim, uid):
                raise KubeletError(f"{where}: the pod ({uid}) is not in status.reservedFor")
            if not (claim.get("status") or {}).get("allocation"):
                raise KubeletError(f"{where}: not allocated")
            drivers = _allocation_drivers(claim)
            if not drivers:
                raise KubeletError(f"{where}: the allocation has no device results")
            for driver in drivers:
                self._client(driver, where)
            known = self.claims.get(ref.uid)
            same_name = [
                c
                for c in self.claims.values()
                if (c.ref.namespace, c.ref.name) == (ref.namespace, ref.name)
                and c.ref.uid != ref.uid
            ]
            if same_name and known is None:
                raise KubeletError(
                    f"{where}: an old ResourceClaim with the same name and UID "
                    f"{same_name[0].ref.uid} is still prepared (previous pod force-deleted?)"
                )
            gathered.append(_PodClaim(pod_claim_name, claim, drivers))
        return gathered

    async def _prepare_driver(self, driver: str, refs: list[ClaimRef], what: str) -> None:
        dra = self._client(driver, what)
        try:
            results = await dra.prepare(refs, self.timeout_s)
        except DraError as err:
            raise KubeletError(f"{what}: NodePrepareResources: {err}") from err
        for ref in refs:
            result = results[ref.uid]
            if result.error:
                raise KubeletError(
                    f"{what}: DRA driver {driver}: NodePrepareResources failed for "
                    f"ResourceClaim {ref.name}: {result.error}"
                )
            self.claims[ref.uid].devices[driver] = result.devices

    async def prepare_pod(self, namespace: str, name: str) -> dict[str, ContainerEdits]:
        """Prepare the claims of pod ``namespace/name`` on this node and return, per container
        name (init containers included), the CDI edits it gets (empty for a container using
        no claim).

        Raises:
            KubeletError: the pod is not bound to this node or not readable; a claim is
                unreadable, not owned (template), not reserved for the pod or not allocated; a
                driver is not registered; a DRA call or a claim's prepare failed; a CDI spec in
                ``cdi_dir`` is invalid or a returned CDI id is not defined there.
        """
        what = f"pod {namespace}/{name}"
        async with self._lock:
            pod = await self._read_pod(namespace, name)
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            if node != self.node_name:
                raise KubeletError(
                    f"{what}: bound to node {node or '(none)'!s}, not to {self.node_name}"
                )
            uid = pod_uid(pod)
            gathered = await self._gather(pod, what)
            batches: dict[str, list[ClaimRef]] = {}
            for item in gathered:
                ref = _claim_ref(item.claim)
                entry = self.claims.setdefault(ref.uid, PreparedClaim(ref, item.drivers))
                entry.pods.add(uid)
                if not entry.prepared:
                    for driver in item.drivers:
                        batches.setdefault(driver, []).append(ref)
            self.pods[uid] = PodRecord(
                namespace, name, uid, tuple(_claim_ref(i.claim).uid for i in gathered)
            )
            for driver, refs in batches.items():
                await self._prepare_driver(driver, refs, what)
            for refs in batches.values():
                for ref in refs:
                    self.claims[ref.uid].prepared = True
            edits = self._container_edits(pod, gathered, what)
            self.ready.add(uid)
            return edits

    def _container_edits(
        self, pod: Mapping[str, Any], gathered: list[_PodClaim], what: str
    ) -> dict[str, ContainerEdits]:
        by_pod_claim = {g.pod_claim_name: _claim_ref(g.claim).uid for g in gathered}
        try:
            load_specs(self.cdi_dir)  # every spec file there must be valid, used or not
        except CdiError as err:
            raise KubeletError(f"{what}: {err}") from err
        out: dict[str, ContainerEdits] = {}
        for container in _containers(pod):
            ids: list[str] = []
            for use in (container.get("resources") or {}).get("claims") or ():
                claim_uid = by_pod_claim.get(str(use.get("name")))
                if claim_uid is not None:
                    ids.extend(self.claims[claim_uid].cdi_ids(str(use.get("request") or "")))
            try:
                out[str(container.get("name"))] = resolve(self.cdi_dir, ids)
            except CdiError as err:
                raise KubeletError(f"{what}: container {container.get('name')}: {err}") from err
        return out

    async def unprepare_pod(self, namespace: str, name: str) -> None:
        """Unprepare the claims of a pod this stand-in prepared (found by namespace and name
        in its record: the pod object may be gone). A claim another pod on the node still uses
        stays prepared. Unknown pods are a no-op.

        Raises:
            KubeletError: a driver is not registered, or NodeUnprepareResources failed (the
                call or for a claim); the claim stays recorded so a retry calls again.
        """
        what = f"pod {namespace}/{name}"
        async with self._lock:
            records = [p for p in self.pods.values() if (p.namespace, p.name) == (namespace, name)]
            for record in records:
                await self._unprepare_record(record, what)
                del self.pods[record.uid]
                self.ready.discard(record.uid)

    async def _unprepare_record(self, record: PodRecord, what: str) -> None:
        for claim_uid in record.claims:
            entry = self.claims.get(claim_uid)
            if entry is None:
                continue
            entry.pods.discard(record.uid)
            if entry.pods:
                continue
            for driver in entry.drivers:
                where = f"{what}: ResourceClaim {entry.ref.name} ({claim_uid})"
                dra = self._client(driver, where)
                try:
                    errors = await dra.unprepare([entry.ref], self.timeout_s)
                except DraError as err:
                    entry.pods.add(record.uid)
                    raise KubeletError(f"{where}: NodeUnprepareResources: {err}") from err
                if errors.get(claim_uid):
                    entry.pods.add(record.uid)
                    raise KubeletError(
                        f"{where}: DRA driver {driver}: NodeUnprepareResources failed: "
                        f"{errors[claim_uid]}"
                    )
            del self.claims[claim_uid]

    async def sync_once(self) -> None:
        """One pass of :meth:`run`: prepare the node's pods with claims not prepared yet (not
        finished, not being deleted), unprepare recorded pods that are gone, finished or being
        deleted. Errors go to :attr:`errors` (and are retried on the next pass)."""
        answer = await call_json(
            self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node_name}", _preload_content=False
            ),
            f"list Pods on node {self.node_name}",
        )
        live: dict[str, Mapping[str, Any]] = {}
        for pod in answer.get("items") or ():
            if (pod.get("spec") or {}).get("nodeName") != self.node_name:
                continue
            ending = is_finished(pod) or (pod.get("metadata") or {}).get("deletionTimestamp")
            if not ending:
                live[pod_uid(pod)] = pod
        for record in [r for uid, r in self.pods.items() if uid not in live]:
            await self._attempt(record.namespace, record.name, self.unprepare_pod)
        for uid, pod in live.items():
            if uid not in self.ready and (pod.get("spec") or {}).get("resourceClaims"):
                namespace, name = pod_key(pod)
                await self._attempt(namespace, name, self.prepare_pod)

    async def _attempt(self, namespace: str, name: str, step: Any) -> None:
        key = f"{namespace}/{name}"
        try:
            await step(namespace, name)
        except KubeletError as err:
            if self.errors.get(key) != str(err):
                log.warning("kubelet stand-in %s: %s", self.node_name, err)
            self.errors[key] = str(err)
        else:
            self.errors.pop(key, None)

    async def run(self) -> None:
        """Start the watcher and call :meth:`sync_once` every ``poll_s`` until cancelled."""
        await self.start()
        while True:
            try:
                await self.sync_once()
            except KubeError as err:
                log.warning("kubelet stand-in %s: %s", self.node_name, err)
            await asyncio.sleep(self.poll_s)

    def run_in_background(self) -> asyncio.Task[None]:
        """Start :meth:`run` as a task that :meth:`stop` cancels."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"kubelet-{self.node_name}")
        return self._task


__all__ = ["KubeletError", "KubeletStandIn", "PodRecord", "PreparedClaim"]
