"""The control-plane (classic DRA) controller: answers PodSchedulingContexts, allocates claims
on the selected node, attaches, and deallocates. resource.k8s.io/v1alpha3, Kubernetes 1.31.

This module is the wiring: settings, the informers and their event handlers, the work queue
and the controller runtime (:mod:`app.kube.runtime`), the claim writes both passes share (the
mutation cache of our own writes, reads, Warning Events), and the admin status. The work is
two passes over one queue (keys ``("context", namespace, name)`` and ``("claim", uid, "")``):

* the scheduling pass (:mod:`app.controlplane.scheduling`) answers a context and allocates
  its pod's claims once a node is selected, from a snapshot
  (:mod:`app.controlplane.snapshot`) of pools, classes, nodes, hosts and devices in use;
* the claim pass (:mod:`app.controlplane.allocation`) attaches an allocated claim's devices,
  and deallocates (detach, release, clear the allocation, remove our finalizer).

Contexts are answered again when slices, classes, nodes, claims or our reservations change,
and every ``resync_interval_s``. On start the journal's unfinished control-plane entries are
settled against the fabric (:meth:`app.claims.fabric_ops.FabricOps.recover`) before any
worker runs; reservations of claims that never got their allocation written are released by
the claim pass.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

from app.allocator import Allocator
from app.claims.drift import DriftTarget
from app.claims.fabric_ops import EVENT_FLUSH_S, EventRecorder, FabricOps
from app.claims.model import rfc3339
from app.claims.settings import ControllerSettings
from app.clock import utcnow
from app.controlplane import plan as cp
from app.controlplane.allocation import JSON_PATCH, MODE, VERSION, WRITE_ATTEMPTS, ClaimPass
from app.controlplane.scheduling import SchedulingPass, resource_version
from app.controlplane.snapshot import SnapshotCache
from app.db.engine import Database
from app.fabric.backend import FabricBackend
from app.fabric.errors import FabricError
from app.heap import HeapSettler
from app.hostmap import node_identity, same_node_identity
from app.inventory.queries import host_refs
from app.journal import Journal
from app.jsontypes import JsonDict
from app.kube.client import FIELD_VALIDATION_STRICT, KubeClient, call_json
from app.kube.errors import KubeBadRequest, KubeConflict, KubeError, KubeNotFound
from app.kube.informer import Informer, InformerSettings
from app.kube.runtime import Controller, ErrorRing, Pass, RecentError, RuntimeSettings
from app.kube.update import status_write_body, update_with_retry
from app.kube.versions import GROUP, claim_from_wire, claim_to_wire
from app.kube.versions import slice_from_wire as _slice_from_wire
from app.kube.workqueue import WorkQueue
from app.metrics import ClaimMetrics

log = logging.getLogger(__name__)
Key = tuple[str, str, str]
R = TypeVar("R")
MAX_RECENT_ERRORS = 100


@dataclass(frozen=True)
class ControlPlaneSettings(ControllerSettings):
    """Settings of the control-plane controller: those of :class:`ControllerSettings` (claims
    whose ``spec.controller`` names the driver are ours; workers are contexts and claims
    worked on at once) and

    Attributes:
        resync_interval_s: every open context and every claim we hold devices for is looked at
            again this often (catches journal changes of the other mode).
        refresh_delay_s: open contexts are answered again this long after a change of
            slices, classes, nodes or allocations, so that a burst of changes costs one pass.
    """

    resync_interval_s: float = 30.0
    refresh_delay_s: float = 0.05
    informer: InformerSettings = field(
        default_factory=lambda: InformerSettings(name="control-plane")
    )


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
        heap: settles the heap after the pools are rebuilt (see :mod:`app.heap`); None
            leaves the collector alone.
        on_failed_device: called when a device's attach failed for good or a failed repair
            is tried again, so that the pools are published again (the failed device is
            withheld or tainted, then offered again).
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
        heap: HeapSettler | None = None,
        on_failed_device: Callable[[], None] | None = None,
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
        self.custom: Any = CustomObjectsApi(client.api)
        self.events = EventRecorder(self._core, settings.identity, VERSION.api_version, clock)
        self.ops = FabricOps(
            self.journal,
            backend,
            self.events,
            metrics=metrics,
            clock=clock,
            on_error=self._claim_error,
            checkpoint=self.at,
            max_detach_attempts=settings.max_detach_attempts,
            on_failed_device=on_failed_device,
        )
        self.queue: WorkQueue[Key] = WorkQueue(replace(settings.queue, name="control-plane"))
        self.claims = self._informer(
            "resourceclaims", lambda obj: claim_from_wire(obj, VERSION, owned=True)
        )
        self.contexts = self._informer("podschedulingcontexts")
        self.slices = self._informer("resourceslices", lambda obj: _slice_from_wire(obj, VERSION))
        self.classes = self._informer("deviceclasses")
        self.pods = Informer(
            self._core.list_pod_for_all_namespaces,
            replace(settings.informer, name="pods"),
            converter=cp.pod_view,  # every pod of the cluster: only what is read is kept
        )
        self.nodes = Informer(
            self._core.list_node,
            replace(settings.informer, name="nodes"),
            converter=node_identity,  # a node's status is neither read nor kept
        )
        self.claims.add_handler(self._on_claim)
        self.contexts.add_handler(self._on_context)
        self.slices.add_handler(self._on_slice)
        self.classes.add_handler(self._on_class)
        self.nodes.add_handler(self._on_node)
        self.pods.add_handler(self._on_pod)
        self._claim_locks: dict[str, asyncio.Lock] = {}
        # The claims our last writes returned, by uid (see cached_claim).
        self._written: dict[str, JsonDict] = {}
        # By uid, the resourceVersion of a write of ours whose claim pass was queued when the
        # write returned (see queue_after_write): its echo from the informer needs no other.
        self._covered_echoes: dict[str, str] = {}
        self.snapshots = SnapshotCache(
            self.slices,
            self.classes,
            self.nodes,
            driver_name=settings.driver_name,
            host_refs=lambda: host_refs(db),
            held=self.journal.held,
            feed=self.journal.feed,
            host_match=settings.host_match,
            host_key=settings.host_key,
            hosts_refresh_s=settings.hosts_refresh_s,
            answers=self.answers,
            heap=heap,
        )
        self.scheduling = SchedulingPass(self)
        self.claim_pass = ClaimPass(self)
        self.warned: dict[str, str] = {}
        self.recent_errors: ErrorRing[RecentError] = ErrorRing(
            RecentError, lambda: self.clock(), MAX_RECENT_ERRORS
        )
        self.runtime: Controller[Key] = Controller(
            self,
            RuntimeSettings("control-plane", settings.workers, MAX_RECENT_ERRORS),
            self.queue,
            informers=self._informers,
            errors=self.recent_errors,
            describe=self._subject,
            expected=(FabricError, KubeError),
            observe=self._observe,
        )
        self.runtime.add_loop("control-plane-resync", self._resync_loop)
        self.allocations = 0
        self.started = self.runtime.started

    def _informer(
        self, plural: str, converter: Callable[[JsonDict], JsonDict] | None = None
    ) -> Informer:
        list_function = functools.partial(
            self.custom.list_cluster_custom_object, GROUP, VERSION.value, plural
        )
        return Informer(
            list_function, replace(self.settings.informer, name=plural), converter=converter
        )

    @property
    def _informers(self) -> tuple[Informer, ...]:
        return (self.claims, self.contexts, self.slices, self.classes, self.pods, self.nodes)

    def informers(self) -> tuple[Informer, ...]:
        """The informers this controller runs (for metrics)."""
        return self._informers

    @property
    def in_use(self) -> cp.InUse:
        """Our devices in use (claims' allocations and the journal's held devices)."""
        return self.snapshots.in_use

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the informers, settle unfinished control-plane journal entries, then start
        the workers and the resync loop. Returns once the workers run."""
        self.events.open()
        await self.runtime.start(self._prepare)

    async def _prepare(self) -> None:
        await self.ops.recover(modes=(MODE,))
        for reservation in await self.journal.active():
            if reservation.mode == MODE:
                self.queue.add(("claim", reservation.claim.uid, ""))
        self._enqueue_everything()

    async def stop(self, events_timeout_s: float = EVENT_FLUSH_S) -> None:
        """Stop taking work, stop the workers, send the queued Events (those not sent within
        ``events_timeout_s`` seconds are dropped), stop the informers."""
        await self.runtime.stop(
            before_informers=lambda: self.events.close(timeout_s=events_timeout_s)
        )

    def is_healthy(self) -> bool:
        """True while every informer is synced and healthy and no worker has died."""
        return self.runtime.is_healthy()

    def status(self) -> dict[str, Any]:
        """A JSON-ready summary for the admin API."""
        return {
            "synced": self.runtime.synced(),
            "healthy": self.is_healthy(),
            "queue_depth": len(self.queue),
            "open_scheduling_contexts": len(self.contexts.keys()),
            "claims_seen": len(self._our_claim_uids()),
            "allocations": self.allocations,
            "answers": [
                {
                    "context": f"{ns}/{name}",
                    "claims": [
                        {"name": claim, "unsuitableNodes": nodes} for claim, nodes in answer.items()
                    ],
                }
                for (ns, name), answer in sorted(self.scheduling.last_answers.items())
            ],
            "recent_errors": [
                {"at": rfc3339(e.at), "subject": e.subject, "message": e.message}
                for e in self.recent_errors.latest(20)
            ],
        }

    async def at(self, step: str) -> None:
        """Await the crash-test checkpoint ``step``, if there is one."""
        if self._checkpoint is not None:
            await self._checkpoint(step)

    # ------------------------------------------------------------------ events
    def _enqueue_contexts(self) -> None:
        open_contexts = self.contexts.keys()
        for namespace, name in open_contexts:
            self.queue.add_after(("context", namespace, name), self.settings.refresh_delay_s)

    def _enqueue_everything(self) -> None:
        self._enqueue_contexts()
        for uid in self._our_claim_uids():
            self.queue.add(("claim", uid, ""))

    def _our_claim_uids(self) -> list[str]:
        driver = self.settings.driver_name
        return [
            uid for uid in self.claims.uids() if cp.is_ours(self.claims.by_uid(uid) or {}, driver)
        ]

    async def _on_claim(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        metadata = obj.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        if not uid:
            return
        self.in_use.set_claim(
            uid,
            frozenset() if event == "DELETED" else cp.claim_devices(obj, self.settings.driver_name),
        )
        # Any event of the claim ends the wait for an echo: the echo itself, or a newer state
        # (a relist, another client's write) that is acted on as usual.
        covered = self._covered_echoes.pop(uid, None)
        own_echo = (
            event == "MODIFIED"
            and covered is not None
            and str((obj.get("metadata") or {}).get("resourceVersion")) == covered
        )
        if event == "DELETED":
            self._written.pop(uid, None)
            lock = self._claim_locks.get(uid)
            if lock is not None and not lock.locked():
                del self._claim_locks[uid]
        mine = cp.is_ours(obj, self.settings.driver_name)
        # Changes a claim pass does not act on (our own finalizer patch, say) are not queued,
        # nor a new claim that waits for its allocation (the context pass allocates it; what
        # an allocation that stopped halfway left behind is released by the pass that follows
        # the failed write, or after a restart, by the start); the periodic resync still
        # looks at every claim.
        if event == "DELETED" or (
            mine
            and not own_echo
            and (
                cp.claim_phase(obj, self.settings.driver_name) != "pending"
                if old is None
                else _claim_work(obj) != _claim_work(old)
            )
        ):
            self.queue.add(("claim", uid, ""))
        # An allocation made or given back changes what is free for every open context; a
        # claim that appears or goes away may be one a pod waits for.
        if (
            old is None
            or event == "DELETED"
            or cp.allocation_of(obj) != cp.allocation_of(old)
            or cp.being_deleted(obj) != cp.being_deleted(old)
        ):
            self._enqueue_contexts()

    async def _on_context(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        metadata = obj.get("metadata") or {}
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name")))
        if event == "DELETED":
            self.scheduling.forget(key)
            return
        # The scheduler writes the spec (potential and selected nodes); the status holds the
        # drivers' answers. Our own answer coming back needs no new pass; any other change
        # (another driver's answer, ours overwritten or cleared) gets one.
        written = self.scheduling.written.get(key)
        if (
            old is None
            or obj.get("spec") != old.get("spec")
            or (
                obj.get("status") != old.get("status")
                and (written is None or resource_version(obj) != resource_version(written))
            )
        ):
            self.queue.add(("context", *key))

    async def _on_slice(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        self.snapshots.changed("slices")
        self._enqueue_contexts()

    async def _on_class(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        self.snapshots.changed("classes")
        self._enqueue_contexts()

    async def _on_node(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        if event == "MODIFIED" and old is not None and same_node_identity(old, obj):
            # A status update (most node events): no pool's reach and no host changed, so the
            # cached nodes, host map and answers stay and no context is answered again.
            return
        self.snapshots.changed("nodes", "hosts")
        self._enqueue_contexts()

    async def _on_pod(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        if (obj.get("spec") or {}).get("nodeName") or cp.being_deleted(obj):
            return  # bound or going: its context pass would do nothing (SchedulingPass.sync)
        if event == "MODIFIED" and old is not None and cp.same_pod_view(old, obj):
            return  # a status condition, say: nothing its context pass reads changed
        metadata = obj.get("metadata") or {}
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name")))
        if self.contexts.get(key[1], key[0]) is not None:
            self.queue.add(("context", *key))

    def mark_inventory_changed(self) -> None:
        """Forget cached pools and hosts and answer every open context again (call after an
        inventory sync changed devices or hosts)."""
        self.snapshots.changed("slices", "nodes", "hosts")
        self._enqueue_contexts()

    # ------------------------------------------------------------------ work
    async def reconcile(self, key: Key) -> bool:
        """One pass over ``key`` (the runtime's :class:`app.kube.runtime.Reconciler`).

        Returns:
            True to look at the key again after its backoff.

        Raises:
            KubeError, FabricError, SQLAlchemyError: a failure to retry with backoff.
        """
        if key[0] == "context":
            return await self.sync_context(key[1], key[2])
        return await self.sync_claim(key[1])

    async def sync_context(self, namespace: str, name: str) -> bool:
        """Answer one PodSchedulingContext, and allocate when a node is selected: see
        :meth:`app.controlplane.scheduling.SchedulingPass.sync`."""
        return await self.scheduling.sync(namespace, name)

    async def sync_claim(self, uid: str) -> bool:
        """Attach, or deallocate, one claim: see
        :meth:`app.controlplane.allocation.ClaimPass.sync`."""
        return await self.claim_pass.sync(uid)

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

    def _observe(self, done: Pass[Key]) -> None:
        if self.metrics:
            self.metrics.reconciles.labels(done.result).inc()
            self.metrics.reconcile_seconds.observe(done.seconds)

    def _subject(self, key: Key) -> str:
        if key[0] == "context":
            return f"PodSchedulingContext {key[1]}/{key[2]}"
        where = self.claims.key_of_uid(key[1]) if self._is_ours(key[1]) else None
        return f"ResourceClaim {where[0]}/{where[1]}" if where else f"ResourceClaim uid {key[1]}"

    def _is_ours(self, uid: str) -> bool:
        claim = self.claims.by_uid(uid)
        return claim is not None and cp.is_ours(claim, self.settings.driver_name)

    def _claim_error(self, uid: str, message: str) -> None:
        self.recent_errors.record(self._subject(("claim", uid, "")), message)

    def claim_lock(self, uid: str) -> asyncio.Lock:
        """The lock a claim's pass holds, and a scheduling pass allocating it."""
        return self._claim_locks.setdefault(uid, asyncio.Lock())

    def claim_by_uid(self, uid: str) -> JsonDict | None:
        """The newest known claim of ours with ``uid`` (see :meth:`cached_claim`), or None
        when it is gone or not ours."""
        where = self.claims.key_of_uid(uid) if self._is_ours(uid) else None
        if where is None:
            return None
        claim = self.cached_claim(where[1], where[0])
        if claim is None or (claim.get("metadata") or {}).get("uid") != uid:
            return None
        return claim

    def drift_target(self) -> DriftTarget:
        """How drift found by the inventory reaches this controller (:mod:`app.claims.drift`):
        a lost device's claim is queued and attached again."""
        return DriftTarget(
            self.ops, self.claim_by_uid, lambda uid: self.queue.add(("claim", uid, ""))
        )

    # ------------------------------------------------------------------ claim reads and writes
    def cached_claim(self, name: str, namespace: str) -> JsonDict | None:
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
        if resource_version(written) > resource_version(cached):
            return written
        del self._written[uid]
        return cached

    def queue_after_write(self, written: JsonDict) -> None:
        """Queue the claim pass of a claim we just wrote (``written``: what the write
        returned), at once rather than when the informer delivers the write; that delivery
        (the echo, of the same resourceVersion) then queues no second pass. The pass reads the
        written claim from the mutation cache (:meth:`cached_claim`), so it acts on the state
        the echo carries or a newer one."""
        metadata = written.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        if not uid:
            return
        cached = self.claims.by_uid(uid)
        if cached is not None and resource_version(cached) >= resource_version(written) >= 0:
            # The echo came first (the watch ran ahead of the write's answer) and queued the
            # pass; it waits for the claim's lock, which the writer holds, so it will see this.
            return
        self._covered_echoes[uid] = str(metadata.get("resourceVersion"))
        self.queue.add(("claim", uid, ""))

    def remember(self, raw: JsonDict) -> JsonDict:
        """Keep a claim our write returned (wire shape) in the mutation cache; return it in
        the v1 shape."""
        claim = claim_from_wire(raw, VERSION, owned=True)
        self._written[str((claim.get("metadata") or {}).get("uid"))] = claim
        return claim

    async def read_object(self, plural: str, namespace: str, name: str) -> JsonDict | None:
        """Read a resource.k8s.io/v1alpha3 object from the API server; None on 404.

        Raises:
            KubeError: the read failed.
        """
        try:
            return await call_json(
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION.value, namespace, plural, name, _preload_content=False
                ),
                f"read {plural} {namespace}/{name}",
            )
        except KubeNotFound:
            return None

    async def read_claim(self, namespace: str, name: str) -> JsonDict | None:
        """Read a claim (v1 shape) from the API server; None on 404.

        Raises:
            KubeError: the read failed.
        """
        raw = await self.read_object("resourceclaims", namespace, name)
        return claim_from_wire(raw, VERSION, owned=True) if raw is not None else None

    async def update_claim(
        self,
        claim: JsonDict,
        attempt: Callable[[JsonDict], Awaitable[R]],
        *,
        gone: R,
        guarded_patch: bool = False,
    ) -> R:
        """Run ``attempt`` (decide from the claim, then write it) until it returns without a
        stale resourceVersion (409), or with ``guarded_patch`` also a failed JSON patch
        ``test`` (422): each retry reads the claim again and decides again. ``gone`` when the
        claim is gone or re-created.

        Raises:
            KubeError: the last conflict, or another failure of a read or of ``attempt``.
        """
        metadata = claim.get("metadata") or {}
        namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
        return await update_with_retry(
            claim,
            attempt,
            lambda: self.read_claim(namespace, name),
            gone=gone,
            attempts=WRITE_ATTEMPTS,
            uid=str(metadata.get("uid")),
            retry_on=(KubeConflict, KubeBadRequest) if guarded_patch else (KubeConflict,),
        )

    async def patch_claim(
        self, namespace: str, name: str, patch: list[JsonDict], what: str
    ) -> JsonDict:
        """Apply a JSON patch to a claim; the server's answer (wire shape).

        Raises:
            KubeError: the patch failed (``what`` names it).
        """
        return await call_json(
            self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION.value,
                namespace,
                "resourceclaims",
                name,
                patch,
                _content_type=JSON_PATCH,
                _preload_content=False,
            ),
            what,
        )

    async def write_claim_status(self, claim: JsonDict, *, strict: bool = False) -> JsonDict:
        """Replace a claim's status with ``claim``'s (v1 shape); the written claim, kept in
        the mutation cache (see :meth:`remember`). ``strict``: the server refuses a field it
        would drop.

        Raises:
            KubeError: the update failed.
        """
        metadata = claim.get("metadata") or {}
        namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
        options = {"field_validation": FIELD_VALIDATION_STRICT} if strict else {}
        return self.remember(
            await call_json(
                self.custom.replace_namespaced_custom_object_status(
                    GROUP,
                    VERSION.value,
                    namespace,
                    "resourceclaims",
                    name,
                    status_write_body(claim_to_wire(claim, VERSION)),
                    _preload_content=False,
                    **options,
                ),
                f"update ResourceClaim {namespace}/{name} status",
            )
        )

    async def warn(self, claim: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning Event, once per claim and message (answers are recomputed often)."""
        uid = str((claim.get("metadata") or {}).get("uid"))
        self._claim_error(uid, message)
        if self.warned.get(uid) == message:
            return
        self.warned[uid] = message
        log.warning(
            "claim %s/%s: %s",
            (claim.get("metadata") or {}).get("namespace"),
            (claim.get("metadata") or {}).get("name"),
            message,
        )
        await self.events.record(claim, "Warning", reason, message)


def _claim_work(claim: Mapping[str, Any]) -> tuple[Any, ...]:
    """The parts of a claim that a claim pass acts on (see :func:`cp.claim_phase` and
    :class:`app.controlplane.allocation.ClaimPass`): who allocates it, its allocation, its
    consumers, deallocation and deletion."""
    status = claim.get("status") or {}
    return (
        (claim.get("spec") or {}).get("controller"),
        status.get("allocation"),
        status.get("reservedFor"),
        status.get("deallocationRequested"),
        (claim.get("metadata") or {}).get("deletionTimestamp"),
    )


__all__ = ["ControlPlaneController", "ControlPlaneSettings"]
