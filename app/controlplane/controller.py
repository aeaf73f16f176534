"""The control-plane (classic DRA) controller: answers PodSchedulingContexts, allocates claims
on the selected node, attaches, and deallocates. resource.k8s.io/v1alpha3, Kubernetes 1.31.

Two kinds of work, one queue (keys ``("context", namespace, name)`` and ``("claim", uid, "")``):

* a **scheduling context** (gather: the pod, its claims of our driver that are not allocated,
  pools from our ResourceSlices, device classes, nodes and their fabric hosts, devices in use
  from the claims and the journal): when ``spec.selectedNode`` is set, allocate all those
  claims together for exactly that node; on success add our finalizer to each claim, reserve
  the devices in the journal (mode ``control-plane``), and write ``status.allocation`` (with
  ``controller``) and the pod in ``reservedFor`` in one status update per claim. Otherwise (no
  selected node, or it cannot serve the claims, or a device was taken meanwhile) write, for
  each such claim, its ``status.resourceClaims`` entry with the unsuitable potential nodes.
  Contexts are answered again when slices, classes, nodes, claims or our reservations change,
  and every ``resync_interval_s``.
* a **claim** (gather: the claim, its control-plane reservations): allocated claims get their
  devices attached (journal ``attaching`` before each call, Events Attached / AttachFailed);
  a claim being deleted or with ``deallocationRequested`` and nothing in ``reservedFor`` has
  its devices detached and released, then ``allocation`` and ``deallocationRequested`` are
  cleared in one status update, then our finalizer is removed by a JSON patch guarded by a
  ``test`` of the finalizers list.

Allocation decisions are serialised by one lock around gather, allocate and reserve, so each
sees the reservations of the one before; the journal's unique index still refuses a device
another mode holds (DeviceHeld): the context is then answered again from fresh data. On start
the journal's unfinished control-plane entries are settled against the fabric
(:meth:`app.claims.fabric_ops.FabricOps.recover`) before any worker runs; reservations of
claims that never got their allocation written are released by the claim pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

from app.allocator import (
    Allocator,
    DeviceClass,
    Node,
    Pool,
    SpecError,
    claim_from_object,
    device_class_from_json,
    gather_pools,
    node_from_json,
)
from app.allocator.model import DeviceId
from app.allocator.pools import selector_matches
from app.claims.drift import DriftTarget
from app.claims.fabric_ops import DEFAULT_DETACH_ATTEMPTS, EventRecorder, FabricOps
from app.claims.model import (
    EffectiveConfig,
    InvalidClaimConfig,
    effective_config,
    node_from_allocation,
    rfc3339,
)
from app.claims.plan import ClaimWants, plan_claim
from app.clock import utcnow
from app.controlplane import plan as cp
from app.db.engine import Database
from app.fabric.backend import FabricBackend
from app.fabric.errors import FabricError
from app.hostmap import HostIndex, host_for_node
from app.inventory.queries import host_refs
from app.journal import (
    ClaimRef,
    DeviceHeld,
    Journal,
    ReservationView,
    UnknownDevice,
)
from app.kube.client import FIELD_VALIDATION_STRICT, KubeClient, call_json
from app.kube.errors import KubeBadRequest, KubeConflict, KubeError, KubeNotFound
from app.kube.informer import Informer, InformerSettings
from app.kube.versions import GROUP, ResourceApiVersion, claim_from_wire, claim_to_wire
from app.kube.versions import slice_from_wire as _slice_from_wire
from app.kube.workqueue import ShutDown, WorkQueue, WorkQueueSettings
from app.metrics import ClaimMetrics

log = logging.getLogger(__name__)
JsonDict = dict[str, Any]
Key = tuple[str, str, str]
MODE = "control-plane"
VERSION = ResourceApiVersion.V1ALPHA3
WRITE_ATTEMPTS = 5
MAX_RECENT_ERRORS = 100
JSON_PATCH = "application/json-patch+json"
REASON_ALLOCATION_FAILED = "AllocationFailed"
REASON_INVALID_CLAIM = "InvalidClaim"
REASON_DEVICE_TAKEN = "DeviceTaken"
REASON_DEALLOCATED = "Deallocated"
HELD_MAX_AGE_S = 2.0



@dataclass(frozen=True)
class ControlPlaneSettings:
    """Settings of the control-plane controller.

    Attributes:
        driver_name: our DRA driver; claims whose ``spec.controller`` names it are ours.
        host_match, host_key: node -> fabric host rule (see :mod:`app.hostmap`).
        workers: contexts and claims worked on at once.
        resync_interval_s: every open context and every claim we hold devices for is looked at
            again this often (catches journal changes of the other mode).
        hosts_refresh_s: how long the node -> host index is reused.
        refresh_delay_s: open contexts are answered again this long after a change of
            slices, classes, nodes or allocations, so that a burst of changes costs one pass.
        informer: base settings of the informers (the name is replaced).
        queue: work queue settings.
        identity: this replica's name, for Events.
        max_detach_attempts: transient detach failures in a row before ``detach-failed``.
    """

    driver_name: str
    host_match: str = "hostname"
    host_key: str = "fabric-dra.io/host-id"
    workers: int = 8
    resync_interval_s: float = 30.0
    hosts_refresh_s: float = 10.0
    refresh_delay_s: float = 0.05
    max_detach_attempts: int = DEFAULT_DETACH_ATTEMPTS
    informer: InformerSettings = field(
        default_factory=lambda: InformerSettings(name="control-plane"))
    queue: WorkQueueSettings = field(default_factory=WorkQueueSettings)
    identity: str = "fabric-dra"


@dataclass(frozen=True, slots=True)
class ControlPlaneError:
    """A recent problem, for the admin view."""

    at: dt.datetime
    subject: str
    message: str


@dataclass(frozen=True, slots=True)
class _Snapshot:
    pools: tuple[Pool, ...]
    classes: Mapping[str, DeviceClass]
    class_selectors: Mapping[str, Mapping[str, Any]]
    in_use: Collection[DeviceId]
    nodes: Mapping[str, Node]
    hosts: Mapping[str, str]
    reachable: Mapping[str, tuple[Pool, ...]]


class ControlPlaneController:
    """Classic DRA: allocates claims whose ``spec.controller`` is our driver.

    Args:
        client: the Kubernetes client (the server must serve resource.k8s.io/v1alpha3 with
            podschedulingcontexts; see :mod:`app.modes`).
        db: the database (journal and inventory).
        backend: the fabric backend.
        settings: see :class:`ControlPlaneSettings`.
        metrics: optional; the claim metrics, shared with the structured reconciler.
        clock: aware UTC time.
        allocator: one to reuse (its CEL caches); a new one otherwise.
        checkpoint: awaited at ``after-reserve`` (devices reserved, allocation not written),
            ``after-intent`` and ``after-attach`` (see :class:`FabricOps`); crash tests stop
            the controller there. None in production.
    """

    def __init__(
        self,
        client: KubeClient,
        db: Database,
        backend: FabricBackend,
        settings: ControlPlaneSettings,
        metrics: ClaimMetrics | None = None,
        *,
        clock: Callable[[], dt.datetime] = utcnow,
        allocator: Allocator | None = None,
        checkpoint: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.client = client
        self.db = db
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.allocator = allocator or Allocator()
        self.answers = cp.NodeAnswers()
        self._checkpoint = checkpoint
        self.finalizer = cp.finalizer_name(settings.driver_name)
        self.journal = Journal(db, clock)
        self._core = CoreV1Api(client.api)
        self._custom: Any = CustomObjectsApi(client.api)
        self.events = EventRecorder(self._core, settings.identity, VERSION.api_version, clock)
        self.ops = FabricOps(self.journal, backend, self.events, metrics=metrics, clock=clock,
                             on_error=self._claim_error, checkpoint=self._at,
                             max_detach_attempts=settings.max_detach_attempts)
        self.queue: WorkQueue[Key] = WorkQueue(replace(settings.queue, name="control-plane"))
        self.claims = self._informer("resourceclaims",
                                     lambda obj: claim_from_wire(obj, VERSION, owned=True))
        self.contexts = self._informer("podschedulingcontexts")
        self.slices = self._informer("resourceslices",
                                     lambda obj: _slice_from_wire(obj, VERSION))
        self.classes = self._informer("deviceclasses")
        self.pods = Informer(self._core.list_pod_for_all_namespaces,
                             replace(settings.informer, name="pods"))
        self.nodes = Informer(self._core.list_node, replace(settings.informer, name="nodes"))
        self.claims.add_handler(self._on_claim)
        self.contexts.add_handler(self._on_context)
        self.slices.add_handler(self._on_slice)
        self.classes.add_handler(self._on_class)
        self.nodes.add_handler(self._on_node)
        self.pods.add_handler(self._on_pod)
        self._by_uid: dict[str, tuple[str, str]] = {}
        self._claim_locks: dict[str, asyncio.Lock] = {}
        self._written: dict[str, JsonDict] = {}
        self._lock = asyncio.Lock()
        self._pools: tuple[Pool, ...] | None = None
        self._class_cache: tuple[dict[str, DeviceClass], dict[str, Mapping[str, Any]]] | None = (
            None)
        self._hosts: dict[str, str] | None = None
        self._nodes: dict[str, Node] | None = None
        self._reachable: dict[str, tuple[Pool, ...]] | None = None
        self._hosts_at = -1e9
        # Our devices in use: claims' allocations from the claim events, the journal's held
        # devices from its feed (see _refresh_held).
        self.in_use = cp.InUse()
        self._held_version = 0
        self._held_read_at = -1e9
        self._answers: dict[tuple[str, str], dict[str, list[str]]] = {}
        # The scheduling contexts our last status writes returned (newer than the cache until
        # the informer delivers them), by (namespace, name).
        self._context_written: dict[tuple[str, str], JsonDict] = {}
        self._warned: dict[str, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.recent_errors: deque[ControlPlaneError] = deque(maxlen=MAX_RECENT_ERRORS)
        self.allocations = 0
        self.started = asyncio.Event()

    def _informer(self, plural: str,
                  converter: Callable[[JsonDict], JsonDict] | None = None) -> Informer:
        list_function = functools.partial(self._custom.list_cluster_custom_object, GROUP,
                                          VERSION.value, plural)
        return Informer(list_function, replace(self.settings.informer, name=plural),
                        converter=converter)

    @property
    def _informers(self) -> tuple[Informer, ...]:
        return (self.claims, self.contexts, self.slices, self.classes, self.pods, self.nodes)

    def informers(self) -> tuple[Informer, ...]:
        """The informers this controller runs (for metrics)."""
        return self._informers

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the informers, settle unfinished control-plane journal entries, then start
        the workers and the resync loop. Returns once the workers run."""
        self.events.open()
        for informer in self._informers:
            informer.start()
        for informer in self._informers:
            await informer.has_synced.wait()
        await self.ops.recover(modes=(MODE,))
        for reservation in await self.journal.active():
            if reservation.mode == MODE:
                self.queue.add(("claim", reservation.claim.uid, ""))
        self._enqueue_everything()
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"control-plane-worker-{i}")
            for i in range(self.settings.workers)
        ]
        self._tasks.append(asyncio.create_task(self._resync_loop(), name="control-plane-resync"))
        self.started.set()

    async def stop(self) -> None:
        """Stop taking work, stop the workers, send the queued Events, stop the informers."""
        self.queue.shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except BaseException as err:  # a worker that died must not stop the shutdown
                log.error("control-plane task %s had died: %r", task.get_name(), err)
        self._tasks = []
        await self.events.close()
        for informer in self._informers:
            await informer.stop()

    def is_healthy(self) -> bool:
        """True while every informer is synced and healthy and no worker has died."""
        return all(i.is_healthy() for i in self._informers) and not any(
            t.done() for t in self._tasks)

    def status(self) -> dict[str, Any]:
        """A JSON-ready summary for the admin API."""
        return {
            "synced": all(i.has_synced.is_set() for i in self._informers),
            "healthy": self.is_healthy(),
            "queue_depth": len(self.queue),
            "open_scheduling_contexts": len(self.contexts.keys()),
            "claims_seen": len(self._by_uid),
            "allocations": self.allocations,
            "answers": [
                {"context": f"{ns}/{name}", "claims": [
                    {"name": claim, "unsuitableNodes": nodes} for claim, nodes in answer.items()]}
                for (ns, name), answer in sorted(self._answers.items())
            ],
            "recent_errors": [
                {"at": rfc3339(e.at), "subject": e.subject, "message": e.message}
                for e in list(self.recent_errors)[-20:]
            ],
        }

    async def _at(self, step: str) -> None:
        if self._checkpoint is not None:
            await self._checkpoint(step)

    # ------------------------------------------------------------------ events
    def _enqueue_contexts(self) -> None:
        open_contexts = self.contexts.keys()
        for namespace, name in open_contexts:
            self.queue.add_after(("context", namespace, name), self.settings.refresh_delay_s)

    def _enqueue_everything(self) -> None:
        self._enqueue_contexts()
        for uid in list(self._by_uid):
            self.queue.add(("claim", uid, ""))

    async def _on_claim(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        metadata = obj.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        if not uid:
            return
        self.in_use.set_claim(uid, frozenset() if event == "DELETED" else cp.claim_devices(
            obj, self.settings.driver_name))
        if event == "DELETED":
            self._by_uid.pop(uid, None)
            self._written.pop(uid, None)
            lock = self._claim_locks.get(uid)
            if lock is not None and not lock.locked():
                del self._claim_locks[uid]
        elif cp.is_ours(obj, self.settings.driver_name):
            self._by_uid[uid] = (str(metadata.get("namespace") or ""), str(metadata.get("name")))
        mine = cp.is_ours(obj, self.settings.driver_name)
        # Changes a claim pass does not act on (our own finalizer patch, say) are not queued,
        # nor a new claim that waits for its allocation (the context pass allocates it; what
        # an allocation that stopped halfway left behind is released by the pass that follows
        # the failed write, or after a restart, by the start); the periodic resync still
        # looks at every claim.
        if event == "DELETED" or (mine and (
                cp.claim_phase(obj, self.settings.driver_name) != "pending" if old is None
                else _claim_work(obj) != _claim_work(old))):
            self.queue.add(("claim", uid, ""))
        # An allocation made or given back changes what is free for every open context; a
        # claim that appears or goes away may be one a pod waits for.
        if old is None or event == "DELETED" or cp.allocation_of(obj) != cp.allocation_of(
                old) or cp.being_deleted(obj) != cp.being_deleted(old):
            self._enqueue_contexts()

    async def _on_context(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        metadata = obj.get("metadata") or {}
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name")))
        if event == "DELETED":
            self._answers.pop(key, None)
            self._context_written.pop(key, None)
            return
        # The scheduler writes the spec (potential and selected nodes); the status holds the
        # drivers' answers. Our own answer coming back needs no new pass; any other change
        # (another driver's answer, ours overwritten or cleared) gets one.
        written = self._context_written.get(key)
        if old is None or obj.get("spec") != old.get("spec") or (
                obj.get("status") != old.get("status")
                and (written is None or _resource_version(obj) != _resource_version(written))):
            self.queue.add(("context", *key))

    async def _on_slice(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        self._pools = None
        self._enqueue_contexts()

    async def _on_class(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        self._class_cache = None
        self._enqueue_contexts()

    async def _on_node(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        self._hosts = None
        self._nodes = None
        self._enqueue_contexts()

    async def _on_pod(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        metadata = obj.get("metadata") or {}
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name")))
        if self.contexts.get(key[1], key[0]) is not None:
            self.queue.add(("context", *key))

    def mark_inventory_changed(self) -> None:
        """Forget cached pools and hosts and answer every open context again (call after an
        inventory sync changed devices or hosts)."""
        self._pools = None
        self._hosts = None
        self._nodes = None
        self._enqueue_contexts()

    # ------------------------------------------------------------------ workers
    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            started = time.monotonic()
            try:
                if key[0] == "context":
                    requeue = await self.sync_context(key[1], key[2])
                else:
                    requeue = await self.sync_claim(key[1])
            except Exception as err:
                # Recorded and retried with backoff; a worker never dies of it.
                self._record_error(self._subject(key), f"{type(err).__name__}: {err}")
                log.warning("%s: sync failed: %s", self._subject(key), err,
                            exc_info=not isinstance(err, FabricError | KubeError))
                self.queue.add_rate_limited(key)
                self._count("error", started)
            else:
                if requeue:
                    self.queue.add_rate_limited(key)
                else:
                    self.queue.forget(key)
                self._count("requeued" if requeue else "ok", started)
            finally:
                self.queue.done(key)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_interval_s)
            self._enqueue_everything()
            try:
                for reservation in await self.journal.active():
                    if reservation.mode == MODE:
                        self.queue.add(("claim", reservation.claim.uid, ""))
            except Exception as err:
                log.warning("control-plane resync: cannot read the journal: %s", err)

    def _count(self, result: str, started: float) -> None:
        if self.metrics:
            self.metrics.reconciles.labels(result).inc()
            self.metrics.reconcile_seconds.observe(time.monotonic() - started)

    def _subject(self, key: Key) -> str:
        if key[0] == "context":
            return f"PodSchedulingContext {key[1]}/{key[2]}"
        where = self._by_uid.get(key[1])
        return f"ResourceClaim {where[0]}/{where[1]}" if where else f"ResourceClaim uid {key[1]}"

    def _record_error(self, subject: str, message: str) -> None:
        self.recent_errors.append(ControlPlaneError(self.clock(), subject, message))

    def _claim_error(self, uid: str, message: str) -> None:
        self._record_error(self._subject(("claim", uid, "")), message)

    def claim_by_uid(self, uid: str) -> JsonDict | None:
        """The newest known claim with ``uid`` (see :meth:`_claim`), or None when gone."""
        where = self._by_uid.get(uid)
        if where is None:
            return None
        claim = self._claim(where[1], where[0])
        if claim is None or (claim.get("metadata") or {}).get("uid") != uid:
            return None
        return claim

    def drift_target(self) -> DriftTarget:
        """How drift found by the inventory reaches this controller (:mod:`app.claims.drift`):
        a lost device's claim is queued and attached again."""
        return DriftTarget(self.ops, self.claim_by_uid,
                           lambda uid: self.queue.add(("claim", uid, "")))

    def _claim(self, name: str, namespace: str) -> JsonDict | None:
        """The cached claim, or the copy our own last write returned when the informer has
        not delivered that write yet (client-go's integer-resourceVersion mutation cache):
        acting on the older state would undo our own allocation."""
        cached = self.claims.get(name, namespace or None)
        if cached is None:
            return None
        uid = str((cached.get("metadata") or {}).get("uid"))
        written = self._written.get(uid)
        if written is None:
            return cached
        if _resource_version(written) > _resource_version(cached):
            return written
        del self._written[uid]
        return cached

    def _remember(self, raw: JsonDict) -> JsonDict:
        """Keep a claim our write returned (wire shape) in the mutation cache; return it in
        the v1 shape."""
        claim = claim_from_wire(raw, VERSION, owned=True)
        self._written[str((claim.get("metadata") or {}).get("uid"))] = claim
        return claim

    # ------------------------------------------------------------------ gather
    async def _snapshot(self, exclude_uids: set[str]) -> _Snapshot:
        # The awaits come first: an event handled while one waits may reset any cache
        # (a slice event sets _pools to None), so from here on nothing awaits and the caches
        # are built and read as one consistent snapshot.
        hosts = await self._host_map()
        await self._refresh_held()
        driver = self.settings.driver_name
        if self._pools is None:
            self._reachable = None
            self.answers.clear()
            self._pools = gather_pools(
                s for s in self.slices.objects() if (s.get("spec") or {}).get("driver") == driver)
        if self._class_cache is None:
            classes: dict[str, DeviceClass] = {}
            selectors: dict[str, Mapping[str, Any]] = {}
            for obj in self.classes.objects():
                parsed = device_class_from_json(obj)
                classes[parsed.name] = parsed
                suitable = (obj.get("spec") or {}).get("suitableNodes")
                if isinstance(suitable, Mapping):
                    selectors[parsed.name] = suitable
            self._class_cache = (classes, selectors)
            self.answers.clear()
        in_use = self.in_use.view(exclude_uids)
        if self._nodes is None:
            self._nodes = {n.name: n for n in map(node_from_json, self.nodes.objects())}
            self.answers.clear()
            self._reachable = {}
        reachable = self._reachable
        if reachable is None or not reachable:
            # Which pools reach which node changes only with slices or nodes: worked out once.
            reachable = {name: tuple(p for p in self._pools if p.reaches_node(node))
                         for name, node in self._nodes.items()}
            self._reachable = reachable
        return _Snapshot(self._pools, self._class_cache[0], self._class_cache[1], in_use,
                         self._nodes, hosts, reachable)

    async def _refresh_held(self) -> None:
        """Bring the journal's part of :attr:`in_use` up to date: from the feed of this
        process's journal writes when it has every change since the last look, else (and at
        least every ``HELD_MAX_AGE_S``: another process, the admin command say, may write the
        journal) by reading every held device. Something stale is safe: the journal's unique
        index refuses a device held meanwhile (DeviceHeld), and the context is answered again
        from a fresh read."""
        now = time.monotonic()
        feed = self.journal.feed
        driver = self.settings.driver_name
        changes = None if now - self._held_read_at >= HELD_MAX_AGE_S else feed.since(
            self._held_version)
        if changes is None:
            version = feed.version
            self.in_use.set_held(await self.journal.held(), driver)
            self._held_version, self._held_read_at = version, now
            return
        for held, device in changes:
            if held:
                self.in_use.hold(device, driver)
            else:
                self.in_use.release(device, driver)
        self._held_version = feed.version

    async def _host_map(self) -> dict[str, str]:
        """Node name -> fabric host id, for the nodes that map to a host."""
        now = time.monotonic()
        if self._hosts is None or now - self._hosts_at > self.settings.hosts_refresh_s:
            index = HostIndex.build(await host_refs(self.db))
            hosts: dict[str, str] = {}
            for node in self.nodes.objects():
                host = host_for_node(node, index, self.settings.host_match,
                                     self.settings.host_key)
                if host is not None:
                    hosts[str((node.get("metadata") or {}).get("name"))] = host
            self._hosts, self._hosts_at = hosts, now
        return self._hosts

    # ------------------------------------------------------------------ scheduling contexts
    async def sync_context(self, namespace: str, name: str) -> bool:
        """Answer one PodSchedulingContext, and allocate when a node is selected.

        Returns:
            True when it must be looked at again later (a device was taken meanwhile).

        Raises:
            KubeError, SQLAlchemyError: a failure to retry with backoff.
        """
        context = self.contexts.get(name, namespace)
        if context is None or cp.being_deleted(context):
            return False
        pod = self.pods.get(name, namespace)
        if pod is None or (pod.get("spec") or {}).get("nodeName") or cp.being_deleted(pod):
            return False
        pending: list[tuple[str, JsonDict]] = []
        for ref in cp.pod_claims(pod):
            claim = self._claim(ref.claim_name, namespace) if ref.claim_name else None
            if (claim is not None and cp.is_ours(claim, self.settings.driver_name)
                    and cp.allocation_of(claim) is None and not cp.being_deleted(claim)):
                pending.append((ref.name, claim))
        if not pending:
            return False
        spec = context.get("spec") or {}
        selected = str(spec.get("selectedNode") or "")
        potential = cp.answer_nodes([str(n) for n in spec.get("potentialNodes") or []],
                                    selected)
        uids = {str(c["metadata"]["uid"]) for _, c in pending}
        async with contextlib.AsyncExitStack() as stack:
            if selected:
                # The claims' own passes wait while their allocation is made and written.
                for uid in sorted(uids):
                    await stack.enter_async_context(self._claim_lock(uid))
            try:
                return await self._answer_or_allocate(namespace, name, pod, pending,
                                                      selected, potential, uids)
            except BaseException:
                if selected:
                    # An allocation that stopped halfway may have left reservations behind:
                    # the claims' own passes release them (once the locks held here go).
                    for uid in uids:
                        self.queue.add(("claim", uid, ""))
                raise

    def _claim_lock(self, uid: str) -> asyncio.Lock:
        return self._claim_locks.setdefault(uid, asyncio.Lock())

    async def _answer_or_allocate(
        self, namespace: str, name: str, pod: JsonDict, pending: list[tuple[str, JsonDict]],
        selected: str, potential: list[str], uids: set[str],
    ) -> bool:
        if selected:
            # Our finalizer goes on before anything is allocated (upstream: "add finalizer
            # before allocating"), so a claim deleted from here on waits for its release.
            fresh: list[tuple[str, JsonDict]] = []
            for pod_claim, claim in pending:
                with_finalizer = await self._ensure_finalizer(claim)
                if with_finalizer is None:
                    return True  # gone, deleted or allocated meanwhile: the cache catches up
                fresh.append((pod_claim, with_finalizer))
            pending = fresh
        requeue = False
        reserved: tuple[Mapping[str, Mapping[str, Any]], list[ReservationView]] | None = None
        async with self._lock:
            snapshot = await self._snapshot(uids)
            parsed: list[cp.Pending] = []
            for pod_claim, claim in pending:
                try:
                    parsed.append(cp.Pending(pod_claim, claim_from_object(claim)))
                except SpecError as err:
                    await self._warn(claim, REASON_INVALID_CLAIM, f"cannot allocate: {err}")
            if len(parsed) < len(pending):
                answers = {p: list(potential[: cp.MAX_NODES]) for p, _ in pending}
            else:
                if selected:
                    outcome = await self._allocate_and_reserve(pending, parsed, selected,
                                                               snapshot)
                    if outcome is False:
                        requeue = True
                        snapshot = await self._snapshot(uids)
                    elif outcome is not None:
                        reserved = outcome
                if reserved is None:
                    answers = cp.unsuitable_nodes(
                        self.allocator, parsed, snapshot.classes, snapshot.pools,
                        snapshot.in_use, potential, self._suitable_nodes(parsed, snapshot),
                        snapshot.hosts, snapshot.reachable, self.answers)
        if reserved is not None:
            await self._at("after-reserve")
            return not await self._write_allocations(pod, pending, *reserved, selected)
        self._answers[(namespace, name)] = answers
        await self._write_answers(namespace, name, answers)
        return requeue

    def _suitable_nodes(self, pending: list[cp.Pending],
                        snapshot: _Snapshot) -> dict[str, Node]:
        """Nodes that every class of the pending requests accepts (v1alpha3 DeviceClass
        ``suitableNodes``, a core NodeSelector)."""
        selectors = [snapshot.class_selectors[a.device_class_name]
                     for p in pending for r in p.claim.requests for a in r.alternatives
                     if a.device_class_name in snapshot.class_selectors]
        if not selectors:
            return dict(snapshot.nodes)
        return {name: node for name, node in snapshot.nodes.items()
                if all(selector_matches(s, node) for s in selectors)}

    async def _allocate_and_reserve(
        self, pending: list[tuple[str, JsonDict]], parsed: list[cp.Pending], node_name: str,
        snapshot: _Snapshot,
    ) -> tuple[Mapping[str, Mapping[str, Any]], list[ReservationView]] | Literal[False] | None:
        """Allocate the pending claims for exactly ``node_name`` and reserve every device of
        every claim, or none. Returns (allocations by claim uid, reservations) on success;
        False when a device was taken meanwhile (answer again from fresh data); None when the
        node cannot serve the claims (it is answered as unsuitable). Called under the lock."""
        driver = self.settings.driver_name
        node = self._suitable_nodes(parsed, snapshot).get(node_name)
        host = snapshot.hosts.get(node_name)
        if node is None or host is None:
            return None
        outcome = self.allocator.allocate([p.claim for p in parsed], snapshot.classes,
                                          snapshot.reachable.get(node_name, snapshot.pools),
                                          snapshot.in_use, node)
        if outcome.failure is not None:
            for _, claim in pending:
                await self._warn(claim, REASON_ALLOCATION_FAILED,
                                 f"node {node_name}: {outcome.failure.message}")
            return None
        taken: list[ReservationView] = []
        try:
            for _, claim in pending:
                metadata = claim["metadata"]
                ref = ClaimRef(str(metadata["uid"]), str(metadata["namespace"]),
                               str(metadata["name"]))
                chosen = cp.chosen_devices(outcome.allocations[ref.uid], driver)
                for wanted in chosen:
                    taken.append(await self.journal.reserve(
                        ref, wanted.request, wanted.device, wanted.pool, MODE, node_name, host))
                leftovers = [r for r in await self.journal.for_claim(ref.uid) if r.mode == MODE]
                for stale in cp.stale_reservations(
                        leftovers, {(w.request, w.pool, w.device) for w in chosen}):
                    await self.ops.release(stale, claim)
        except (DeviceHeld, UnknownDevice) as err:
            for reservation in taken:
                await self.ops.release(reservation, None)
            for _, claim in pending:
                await self._warn(claim, REASON_DEVICE_TAKEN,
                                 f"node {node_name}: {err}; answering the scheduler again")
            return False
        return outcome.allocations, taken

    async def _write_allocations(
        self, pod: JsonDict, pending: list[tuple[str, JsonDict]],
        allocations: Mapping[str, Mapping[str, Any]], taken: list[ReservationView],
        node_name: str,
    ) -> bool:
        """One status update per claim: allocation (with controller) and the pod reserved.
        A claim that cannot be written has its new reservations released. True when all
        were written."""
        consumer = cp.consumer_ref(pod)
        complete = True
        for _, claim in pending:
            uid = str(claim["metadata"]["uid"])
            if await self._write_allocation(claim, allocations[uid], consumer, node_name):
                self.allocations += 1
            else:
                complete = False
                for reservation in taken:
                    if reservation.claim.uid == uid:
                        await self.ops.release(reservation, None)
            self.queue.add(("claim", uid, ""))
        return complete

    async def _write_answers(self, namespace: str, name: str,
                             answers: Mapping[str, list[str]]) -> None:
        cached = self.contexts.get(name, namespace)
        written = self._context_written.get((namespace, name))
        if cached is not None and written is not None:
            if _resource_version(written) > _resource_version(cached):
                # The informer has not delivered our last write yet: compare with what we
                # wrote, not with the older cached status.
                cached = written
            else:
                del self._context_written[(namespace, name)]
        current = list(((cached or {}).get("status") or {}).get("resourceClaims") or [])
        if cached is not None and cp.same_claim_entries(
                cp.merged_claim_entries(current, answers), current):
            return
        context = cached
        for attempt in range(WRITE_ATTEMPTS):
            if context is None:
                return
            status = context.get("status") or {}
            entries = cp.merged_claim_entries(status.get("resourceClaims") or [], answers)
            if attempt and cp.same_claim_entries(entries, status.get("resourceClaims") or []):
                return
            body = {**context, "status": {**status, "resourceClaims": entries}}
            try:
                self._context_written[(namespace, name)] = await call_json(
                    self._custom.replace_namespaced_custom_object_status(
                        GROUP, VERSION.value, namespace, "podschedulingcontexts", name, body,
                        _preload_content=False),
                    f"update PodSchedulingContext {namespace}/{name} status")
                return
            except KubeNotFound:
                return
            except KubeConflict:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
                context = await self._read("podschedulingcontexts", namespace, name)

    # ------------------------------------------------------------------ claims
    async def sync_claim(self, uid: str) -> bool:
        """Attach, or deallocate, one claim. Returns True to look again later.

        Raises:
            KubeError, FabricError, SQLAlchemyError: a failure to retry with backoff.
        """
        async with self._claim_lock(uid):
            return await self._sync_claim(uid)

    async def _sync_claim(self, uid: str) -> bool:
        claim = self.claim_by_uid(uid)
        reservations = [r for r in await self.journal.for_claim(uid) if r.mode == MODE]
        phase = cp.claim_phase(claim, self.settings.driver_name)
        if phase in ("gone", "foreign", "pending"):
            # Pending: reservations left by an allocation that stopped before its status
            # write; nothing was sent to the fabric for them. Gone: detach what it held.
            done = True
            for reservation in reservations:
                done &= await self.ops.release(reservation, claim)
            return not done
        assert claim is not None
        if phase == "deleting":
            return False
        if phase == "deallocate":
            return await self._deallocate(claim, reservations)
        return await self._attach_claim(claim, reservations)

    async def _attach_claim(self, claim: JsonDict,
                            reservations: list[ReservationView]) -> bool:
        driver = self.settings.driver_name
        allocation = cp.allocation_of(claim) or {}
        if allocation.get("controller") not in (None, driver):
            return False
        wanted = cp.wanted_results(claim, driver)
        configs: dict[str, EffectiveConfig] = {}
        config_error = None
        try:
            configs = effective_config(claim, driver, {w.request for w in wanted})
        except InvalidClaimConfig as err:
            config_error = f"invalid configuration for {driver}: {err}"
        node = next((r.node for r in reservations if r.node), None) or node_from_allocation(
            claim) or self._consumer_node(claim)
        host = None
        if node is not None:
            host = next((r.host_id for r in reservations if r.node == node and r.host_id),
                        None) or (await self._host_map()).get(node)
        plan = plan_claim(ClaimWants(wanted, node, host, config_error), reservations)
        requeue = plan.requeue
        for reservation in plan.release:
            requeue |= not await self.ops.release(reservation, claim)
        attach = list(plan.attach)
        metadata = claim["metadata"]
        ref = ClaimRef(str(metadata["uid"]), str(metadata["namespace"]), str(metadata["name"]))
        for item in plan.reserve:
            try:
                attach.append(await self.journal.reserve(ref, item.request, item.device,
                                                         item.pool, MODE, node, host))
            except (DeviceHeld, UnknownDevice) as err:
                await self._warn(claim, REASON_DEVICE_TAKEN,
                                 f"device {item.device} cannot be reserved: {err}")
        for reservation in attach:
            _, retry = await self.ops.attach(
                reservation, claim, configs.get(reservation.request, EffectiveConfig()))
            requeue |= retry
        for _, reason in plan.refuse[:1]:
            await self._warn(claim, "InvalidConfig", reason)
        return requeue

    def _consumer_node(self, claim: JsonDict) -> str | None:
        namespace = str((claim.get("metadata") or {}).get("namespace") or "")
        for consumer in cp.reserved_for(claim):
            if consumer.get("resource") != "pods":
                continue
            name = str(consumer.get("name"))
            pod = self.pods.get(name, namespace)
            if pod and (pod.get("spec") or {}).get("nodeName"):
                return str(pod["spec"]["nodeName"])
            context = self.contexts.get(name, namespace)
            if context and (context.get("spec") or {}).get("selectedNode"):
                return str(context["spec"]["selectedNode"])
        return None

    async def _deallocate(self, claim: JsonDict, reservations: list[ReservationView]) -> bool:
        done = True
        for reservation in reservations:
            done &= await self.ops.release(reservation, claim)
        if not done:
            return True
        metadata = claim.get("metadata") or {}
        namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
        current: JsonDict | None = claim
        for attempt in range(WRITE_ATTEMPTS):
            if current is None or (current.get("metadata") or {}).get("uid") != metadata.get(
                    "uid"):
                return False
            if cp.claim_phase(current, self.settings.driver_name) != "deallocate":
                return True  # a consumer came back meanwhile: look again
            try:
                if cp.needs_status_clear(current):
                    current = self._remember(await call_json(
                        self._custom.replace_namespaced_custom_object_status(
                            GROUP, VERSION.value, namespace, "resourceclaims", name,
                            claim_to_wire(cp.cleared_status(current), VERSION),
                            _preload_content=False),
                        f"update ResourceClaim {namespace}/{name} status"))
                    if reservations:
                        await self.events.record(current, "Normal", REASON_DEALLOCATED,
                                                 "devices released; allocation cleared")
                patch = cp.remove_finalizer_patch(current, self.finalizer)
                if patch is not None:
                    await call_json(self._custom.patch_namespaced_custom_object(
                        GROUP, VERSION.value, namespace, "resourceclaims", name, patch,
                        _content_type=JSON_PATCH, _preload_content=False),
                        f"remove finalizer {self.finalizer} from ResourceClaim "
                        f"{namespace}/{name}")
                self._warned.pop(str(metadata.get("uid")), None)
                return False
            except KubeNotFound:
                return False
            except (KubeConflict, KubeBadRequest):
                # Stale resourceVersion or a failed `test`: read again and decide again.
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
                current = await self._read_claim(namespace, name)
        return True

    # ------------------------------------------------------------------ writes to claims
    async def _read(self, plural: str, namespace: str, name: str) -> JsonDict | None:
        try:
            return await call_json(self._custom.get_namespaced_custom_object(
                GROUP, VERSION.value, namespace, plural, name, _preload_content=False),
                f"read {plural} {namespace}/{name}")
        except KubeNotFound:
            return None

    async def _read_claim(self, namespace: str, name: str) -> JsonDict | None:
        raw = await self._read("resourceclaims", namespace, name)
        return claim_from_wire(raw, VERSION, owned=True) if raw is not None else None

    async def _ensure_finalizer(self, claim: JsonDict) -> JsonDict | None:
        """The claim with our finalizer (added by a guarded JSON patch), or None when it is
        gone, being deleted, or was allocated meanwhile."""
        metadata = claim.get("metadata") or {}
        namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
        current: JsonDict | None = claim
        for attempt in range(WRITE_ATTEMPTS):
            if (current is None or cp.being_deleted(current)
                    or cp.allocation_of(current) is not None
                    or (current.get("metadata") or {}).get("uid") != metadata.get("uid")):
                return None
            patch = cp.add_finalizer_patch(current, self.finalizer)
            if patch is None:
                return current
            try:
                return self._remember(await call_json(self._custom.patch_namespaced_custom_object(
                    GROUP, VERSION.value, namespace, "resourceclaims", name, patch,
                    _content_type=JSON_PATCH, _preload_content=False),
                    f"add finalizer {self.finalizer} to ResourceClaim {namespace}/{name}"))
            except KubeNotFound:
                return None
            except (KubeConflict, KubeBadRequest):
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
                current = await self._read_claim(namespace, name)
        return None

    async def _write_allocation(self, claim: JsonDict, allocation: Mapping[str, Any],
                                consumer: Mapping[str, str], node_name: str) -> bool:
        """Write allocation and reservedFor in one status update. False when the claim is
        gone, being deleted, or allocated otherwise meanwhile."""
        metadata = claim.get("metadata") or {}
        namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
        current: JsonDict | None = claim
        for attempt in range(WRITE_ATTEMPTS):
            if (current is None or cp.being_deleted(current)
                    or (current.get("metadata") or {}).get("uid") != metadata.get("uid")):
                return False
            body = cp.allocated_status(current, allocation, self.settings.driver_name, consumer,
                                       node_name)
            if cp.allocation_of(current) is not None:
                # Ours already (an earlier write whose answer was lost), or someone else's.
                return cp.allocation_of(current) == cp.allocation_of(body)
            try:
                # Strict: an allocation field the server drops would be a silent bug.
                self._remember(await call_json(self._custom.replace_namespaced_custom_object_status(
                    GROUP, VERSION.value, namespace, "resourceclaims", name,
                    claim_to_wire(body, VERSION), field_validation=FIELD_VALIDATION_STRICT,
                    _preload_content=False),
                    f"update ResourceClaim {namespace}/{name} status"))
                self._warned.pop(str(metadata.get("uid")), None)
                return True
            except KubeNotFound:
                return False
            except KubeConflict:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
                current = await self._read_claim(namespace, name)
        return False

    async def _warn(self, claim: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning Event, once per claim and message (answers are recomputed often)."""
        uid = str((claim.get("metadata") or {}).get("uid"))
        self._claim_error(uid, message)
        if self._warned.get(uid) == message:
            return
        self._warned[uid] = message
        log.warning("claim %s/%s: %s", (claim.get("metadata") or {}).get("namespace"),
                    (claim.get("metadata") or {}).get("name"), message)
        await self.events.record(claim, "Warning", reason, message)


def _claim_work(claim: Mapping[str, Any]) -> tuple[Any, ...]:
    """The parts of a claim that a claim pass acts on (see :func:`cp.claim_phase` and
    :meth:`ControlPlaneController._attach_claim`): who allocates it, its allocation, its
    consumers, deallocation and deletion."""
    status = claim.get("status") or {}
    return ((claim.get("spec") or {}).get("controller"), status.get("allocation"),
            status.get("reservedFor"), status.get("deallocationRequested"),
            (claim.get("metadata") or {}).get("deletionTimestamp"))


def _resource_version(obj: Mapping[str, Any]) -> int:
    """``metadata.resourceVersion`` as an integer (etcd's revision); -1 when it is not one."""
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or -1)
    except ValueError:
        return -1


__all__ = ["ControlPlaneController", "ControlPlaneError", "ControlPlaneSettings"]
