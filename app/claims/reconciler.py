"""The structured-parameters claim reconciler: attach what the scheduler allocated, release
what it let go, and tell the scheduler through binding conditions.

One reconcile per claim (keyed by uid, one at a time per claim):

1. gather: the claim from the informer cache, its active reservations, the node (from the
   allocation's node selector, else from the consumer pod), the node's fabric host, and our
   opaque config;
2. plan: :func:`app.claims.plan.plan_claim`;
3. apply: releases first (``detaching`` is journalled before each detach), then reservations
   and attaches (``attaching`` is journalled before each attach);
4. record: the claim's ``status.devices`` (binding or failure conditions, ``data``), Events
   (Attached, AttachFailed, WaitingForDetach, Detached), metrics.

A device the scheduler allocated while another reservation still holds it (its detach is in
progress, or the previous claim's release has not run yet) is waited for rather than failed:
the binding condition is False with reason ``WaitingForDetach`` and no failure condition, and
the claim is queued again as soon as the journal commits that device's release
(:func:`app.claims.plan.wait_for_holder`).

A periodic sweep (:mod:`app.claims.sweep`) releases reservations whose claim has been missing
for the grace period (the controller may have been down when it went away), reports devices
the fabric shows attached with no reservation (and detaches them when configured to), and
keeps the reservation gauges. The claim's ``status.devices`` is written by
:mod:`app.claims.status`.
On start, :meth:`ClaimReconciler.recover` compares unfinished journal entries with the fabric
and settles each one before any new work (DESIGN.md invariants 1-3).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from app.claims.drift import DriftTarget
from app.claims.fabric_ops import (
    EVENT_FLUSH_S,
    EventRecorder,
    FabricOps,
    failed_report,
)
from app.claims.model import (
    REASON_ATTACH_FAILED,
    REASON_BAD_CONFIG,
    REASON_DEVICE_LOST,
    REASON_WAITING_FOR_DETACH,
    DeviceReport,
    EffectiveConfig,
    InvalidClaimConfig,
    WantedDevice,
    consumer_pods,
    effective_config,
    node_from_allocation,
    rfc3339,
    wanted_devices,
)
from app.claims.plan import (
    ClaimPlan,
    ClaimWants,
    HeldWait,
    plan_claim,
    reservation_key,
    wait_for_holder,
)
from app.claims.settings import ControllerSettings
from app.claims.status import ClaimStatusWriter
from app.claims.sweep import ClaimSweep
from app.clock import utcnow
from app.db.engine import Database
from app.fabric.backend import FabricBackend
from app.fabric.errors import FabricError
from app.fabric.types import FabricDevice
from app.hostmap import (
    HostIndex,
    HostRef,
    host_ref_for_node,
    node_identity,
    same_node_identity,
)
from app.inventory.queries import host_refs
from app.journal import (
    FAILED,
    ClaimRef,
    DeviceHeld,
    HeldDevice,
    Journal,
    ReservationView,
    UnknownDevice,
)
from app.jsontypes import JsonDict
from app.kube.client import KubeClient, call_json
from app.kube.errors import KubeError, KubeNotFound
from app.kube.informer import Informer
from app.kube.runtime import Controller, ErrorRing, Pass, RecentError, RuntimeSettings
from app.kube.versions import ResourceApiVersion, claim_from_wire, resource_api
from app.kube.workqueue import WorkQueue
from app.metrics import ClaimMetrics

log = logging.getLogger(__name__)
MAX_RECENT_ERRORS = 100
MODE = "structured"


@dataclass(frozen=True)
class ClaimSettings(ControllerSettings):
    """Settings of the claim reconciler: those of :class:`ControllerSettings` (workers are
    claims reconciled at once; the informers are the claim and node informers) and

    Attributes:
        binding_conditions, binding_failure_conditions: condition types we set.
        orphan_grace_s: a reservation whose claim is missing this long is released.
        sweep_interval_s: time between sweeps.
        detach_unmanaged: detach devices attached with no reservation (after the grace).
    """

    binding_conditions: tuple[str, ...] = ("FabricDeviceReady",)
    binding_failure_conditions: tuple[str, ...] = ("FabricDeviceFailed",)
    orphan_grace_s: float = 60.0
    sweep_interval_s: float = 30.0
    detach_unmanaged: bool = False


class ClaimReconciler:
    """Reserves, attaches, reports, detaches and releases the devices of ResourceClaims.

    Args:
        client: the Kubernetes client.
        version: the resource.k8s.io version in use (v1, v1beta2 or v1beta1).
        db: the database (journal and inventory).
        backend: the fabric backend.
        settings: see :class:`ClaimSettings`.
        metrics: optional.
        clock: aware UTC time.
        on_failed_device: called when a device's attach failed for good (so that the
            publisher stops offering it); optional.
        checkpoint: awaited at the named steps ``after-intent`` (attaching written, attach
            not sent), ``after-attach`` (attach done, not yet recorded) and ``before-status``
            (recorded, claim status not yet written); crash tests use it to stop the process
            at exactly that step. None in production.
    """

    def __init__(
        self,
        client: KubeClient,
        version: ResourceApiVersion,
        db: Database,
        backend: FabricBackend,
        settings: ClaimSettings,
        *,
        metrics: ClaimMetrics | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        on_failed_device: Callable[[], None] | None = None,
        checkpoint: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.client = client
        self.version = version
        self.db = db
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.on_failed_device = on_failed_device
        self._checkpoint = checkpoint
        self.journal = Journal(db, clock)
        self.queue: WorkQueue[str] = WorkQueue(settings.queue)
        self._resources = resource_api(client.api, version)
        self._core = CoreV1Api(client.api)
        self.events = EventRecorder(self._core, settings.identity, version.api_version, clock)
        self.ops = FabricOps(
            self.journal,
            backend,
            self.events,
            metrics=metrics,
            clock=clock,
            on_error=self._error,
            on_failed_device=on_failed_device,
            checkpoint=self._at,
            max_detach_attempts=settings.max_detach_attempts,
        )
        self.claims = Informer(
            self._resources.list_resource_claim_for_all_namespaces,
            replace(settings.informer, name="resourceclaims"),
            # The informer hands over each decoded object: no copy is needed.
            converter=lambda obj: claim_from_wire(obj, version, owned=True),
        )
        self.nodes = Informer(
            self._core.list_node,
            replace(settings.informer, name="nodes"),
            converter=node_identity,  # a node's status is neither read nor kept
        )
        self.claims.add_handler(self._on_claim)
        self.nodes.add_handler(self._on_node)
        self._waiting: dict[str, str] = {}
        # Device name -> uids of claims waiting for another reservation of it to be released
        # (any mode's: the journal's release listener covers this process's writes of both
        # modes and of the admin actions; the sweep covers releases by other processes).
        self._release_waiters: dict[str, set[str]] = {}
        self._host_index: HostIndex | None = None
        self._host_index_at = -1e9
        # One rebuild at a time: the workers that find the index stale together wait for it.
        self._host_index_lock = asyncio.Lock()
        self._mapping_changes = 0  # node or host changes that may change the mapping
        self._retry_reason: dict[str, str] = {}
        self.recent_errors: ErrorRing[RecentError] = ErrorRing(
            RecentError, lambda: self.clock(), MAX_RECENT_ERRORS
        )
        self.runtime: Controller[str] = Controller(
            self,
            RuntimeSettings("claims", settings.workers, MAX_RECENT_ERRORS),
            self.queue,
            informers=(self.claims, self.nodes),
            errors=self.recent_errors,
            describe=self._name,
            on_error=self._failed,
            on_requeue=self._requeued,
            on_done=self._settled,
            observe=self._observe,
        )
        self.status_writer = ClaimStatusWriter(
            self._resources,
            version,
            settings.driver_name,
            settings.binding_conditions,
            settings.binding_failure_conditions,
            lambda: self.clock(),
            metrics,
        )
        self.sweeper = ClaimSweep(
            self.journal,
            db,
            backend,
            self.claims,
            self.queue.add,
            self._release_waiters,
            mode=MODE,
            interval_s=settings.sweep_interval_s,
            orphan_grace_s=settings.orphan_grace_s,
            detach_unmanaged=settings.detach_unmanaged,
            metrics=metrics,
        )
        self.runtime.add_loop("claims-sweep", self.sweeper.loop)
        self.node_from_pod_claims: set[str] = set()
        self.started = self.runtime.started

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the informers, recover unfinished journal entries, then start the workers
        and the sweep. Returns once the workers run."""
        self.events.open()
        await self.runtime.start(self._prepare)

    async def _prepare(self) -> None:
        await self.recover()
        self.journal.feed.add_release_listener(self._on_release)
        for reservation in await self.journal.active():
            if reservation.mode == MODE:
                self.queue.add(reservation.claim.uid)
        for uid in self.claims.uids():
            self.queue.add(uid)

    async def stop(self, drain_s: float = 10.0) -> None:
        """Stop taking work, let in-flight reconciles finish (up to ``drain_s`` seconds, then
        they are cancelled: the journal makes that safe), send the queued Events, stop the
        informers. Events not sent within ``min(EVENT_FLUSH_S, drain_s)`` seconds are dropped."""
        self.journal.feed.remove_release_listener(self._on_release)
        await self.runtime.stop(
            drain_s,
            before_informers=lambda: self.events.close(timeout_s=min(EVENT_FLUSH_S, drain_s)),
        )

    def informers(self) -> tuple[Informer, ...]:
        """The informers this reconciler runs (for metrics)."""
        return (self.claims, self.nodes)

    def is_healthy(self) -> bool:
        """True while both informers are synced and healthy and no worker has died."""
        return self.runtime.is_healthy()

    # ------------------------------------------------------------------ events
    async def _on_claim(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        metadata = obj.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        if not uid:
            return
        if event == "DELETED":
            self.queue.add(uid)
        elif (self._concerns_us(obj) or (old and self._concerns_us(old))) and (
            old is None
            or _what_we_act_on(old, self.settings.driver_name)
            != _what_we_act_on(obj, self.settings.driver_name)
        ):
            # Our own status writes come back as events; they change nothing we act on.
            self.queue.add(uid)

    async def _on_node(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        # A node that appears or changes labels may be what a waiting claim needs. A status
        # update (most node events) changes nothing read here.
        if event == "MODIFIED" and old is not None and same_node_identity(old, obj):
            return
        self._mapping_changed()

    def hosts_changed(self) -> None:
        """Say that the inventory's hosts changed (a sync wrote host rows): the node -> host
        index is read again at its next use, not up to ``hosts_refresh_s`` later, and the
        claims waiting (for a host, say) are worked on again."""
        self._mapping_changed()

    def _mapping_changed(self) -> None:
        self._mapping_changes += 1
        self._host_index_at = -1e9
        for uid in list(self._waiting):
            self.queue.add(uid)

    def _on_release(self, device: HeldDevice | None) -> None:
        # A release was committed (None: a write's outcome is unknown): the claims waiting for
        # that device are queued now rather than after their backoff.
        if device is None:
            waiters = {uid for uids in self._release_waiters.values() for uid in uids}
        else:
            waiters = set(self._release_waiters.get(device.device_name, ()))
        for uid in waiters:
            self.queue.add(uid)

    def _concerns_us(self, claim: Mapping[str, Any]) -> bool:
        # Claims of the control-plane mode (classic DRA) are that controller's business.
        if (claim.get("spec") or {}).get("controller") or (
            (claim.get("status") or {}).get("allocation") or {}
        ).get("controller"):
            return False
        return bool(wanted_devices(claim, self.settings.driver_name)) or any(
            e.get("driver") == self.settings.driver_name
            for e in (claim.get("status") or {}).get("devices") or []
            if isinstance(e, Mapping)
        )

    def drift_target(self) -> DriftTarget:
        """How drift found by the inventory reaches this reconciler (:mod:`app.claims.drift`):
        the claim is queued, and its pass reports and attaches a lost device again."""
        return DriftTarget(self.ops, self.claim_by_uid, self.queue.add)

    def claim_by_uid(self, uid: str) -> JsonDict | None:
        """The cached claim with ``uid``, or None when it is gone."""
        return self.claims.by_uid(uid)

    # ------------------------------------------------------------------ runtime hooks
    def _failed(self, uid: str, err: Exception) -> None:
        # Any failure is recorded and retried with backoff; a worker never dies of it.
        self._error(uid, f"reconcile failed: {type(err).__name__}: {err}")
        log.warning(
            "claim %s: reconcile failed: %s",
            self._name(uid),
            err,
            exc_info=not isinstance(err, FabricError | KubeError),
        )

    def _requeued(self, uid: str, delay: float) -> None:
        retry = self._retry_reason.pop(uid, None)
        if retry is not None:
            log.info(
                "claim %s: trying again in %.2f s (retry %d): %s",
                self._name(uid),
                delay,
                self.queue.num_requeues(uid),
                retry,
            )

    def _settled(self, uid: str) -> None:
        self._retry_reason.pop(uid, None)

    def _observe(self, done: Pass[str]) -> None:
        if self.metrics:
            self.metrics.reconciles.labels(done.result).inc()
            self.metrics.reconcile_seconds.observe(done.seconds)
            self.metrics.queue_depth.set(done.queue_depth)

    def _name(self, uid: str) -> str:
        where = self.claims.key_of_uid(uid)
        return f"{where[0]}/{where[1]}" if where else f"uid {uid}"

    def _error(self, uid: str, message: str) -> None:
        self.recent_errors.record(self._name(uid), message)
        self._retry_reason[uid] = message

    async def _still_there(self, uid: str, reservation: ReservationView) -> JsonDict | None:
        """The claim of ``reservation`` read from the API server when it still exists with
        ``uid`` (v1 shape), else None (404, or a new claim under the same name).

        Raises:
            KubeError: the read failed (retried with backoff: nothing is released meanwhile).
        """
        ref = reservation.claim
        try:
            raw = await call_json(
                self._resources.read_namespaced_resource_claim(
                    ref.name, ref.namespace, _preload_content=False
                ),
                f"read ResourceClaim {ref}",
            )
        except KubeNotFound:
            return None
        claim = claim_from_wire(raw, self.version, owned=True)
        if (claim.get("metadata") or {}).get("uid") != uid:
            return None
        log.info("claim %s: the watch reported it deleted, but it exists: nothing released", ref)
        return claim

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self, uid: str) -> bool:
        """Reconcile one claim. Returns True when it must be looked at again later.

        Raises:
            KubeError, FabricError, SQLAlchemyError: a failure to retry with backoff.
        """
        claim = self.claim_by_uid(uid)
        reservations = [r for r in await self.journal.for_claim(uid) if r.mode == MODE]
        if claim is None and not reservations:
            self._waiting.pop(uid, None)
            self._end_release_waits(uid)
            return False
        if claim is None:
            # The cache says gone and devices are held: confirm with the API server before
            # releasing anything, since a replayed or out-of-order DELETED must not detach
            # the devices of a claim that still exists.
            claim = await self._still_there(uid, reservations[0])
        wants, configs = await self._wants(claim)
        plan = plan_claim(wants, reservations, self.clock())
        requeue = plan.requeue
        reports: dict[WantedDevice, DeviceReport] = {}

        for reservation in plan.release:
            requeue |= not await self._release(reservation, claim)
        attach: list[tuple[ReservationView, FabricDevice | None]] = [(r, None) for r in plan.attach]
        for reservation in plan.retry:
            again = await self.ops.retry_repair(reservation, claim)
            if again is not None:
                attach.append((again, None))
        # One device: reserved with its attach journalled in one transaction. Several: every
        # one is held first (pending), then each attach is journalled as it is sent, so that
        # no attempt is counted for an attach that a failure before it never sent.
        attach_now = len(plan.reserve) == 1
        held_waits: dict[str, str] = {}
        for wanted in plan.reserve:
            reserved_or_report = await self._reserve(claim, wanted, wants, attach_now)
            if isinstance(reserved_or_report, DeviceReport):
                reports[wanted] = reserved_or_report
                if reserved_or_report.reason == REASON_WAITING_FOR_DETACH:
                    held_waits[wanted.device] = reserved_or_report.message
            else:
                attach.append(reserved_or_report)
        self._end_release_waits(uid, keep=held_waits.keys())
        requeue |= bool(held_waits)
        for reservation in plan.ready:
            key = WantedDevice(reservation.request, reservation.pool, reservation.device_name)
            reports[key] = await self._ready_report(key, reservation)
        for reservation in plan.failed:
            key = WantedDevice(reservation.request, reservation.pool, reservation.device_name)
            reports[key] = failed_report(key, reservation)
        lost = {
            reservation_key(r): DeviceReport(
                reservation_key(r),
                False,
                REASON_DEVICE_LOST,
                r.last_error or "the device lost its attachment",
                failed=False,
            )
            for r, _ in attach
            if r.attached_at is not None
        }
        if lost and claim is not None:
            # The device was attached and the fabric lost it: say so before attaching it
            # again, so that nothing reads the claim as ready meanwhile.
            claim = (
                await self.status_writer.write(claim, [*reports.values(), *lost.values()]) or claim
            )
        for reservation, device in attach:
            key = reservation_key(reservation)
            report, retry = await self.ops.attach(
                reservation,
                claim,
                configs.get(reservation.request, EffectiveConfig()),
                device=device,
            )
            requeue |= retry
            reports[key] = report
        for wanted, reason in plan.refuse:
            reports[wanted] = DeviceReport(wanted, False, REASON_BAD_CONFIG, reason)
        if plan.refuse and claim is not None:
            await self._event(claim, "Warning", REASON_BAD_CONFIG, plan.refuse[0][1])

        if plan.waiting:
            self._waiting[uid] = plan.waiting[0][1]
        elif held_waits:
            self._waiting[uid] = next(iter(held_waits.values()))
        else:
            self._waiting.pop(uid, None)
        if claim is not None and (reports or self._has_our_status(claim)):
            await self._at("before-status")
            await self.status_writer.write(claim, list(reports.values()))
        return requeue

    async def _at(self, step: str) -> None:
        if self._checkpoint is not None:
            await self._checkpoint(step)

    def _has_our_status(self, claim: Mapping[str, Any]) -> bool:
        return any(
            isinstance(e, Mapping) and e.get("driver") == self.settings.driver_name
            for e in (claim.get("status") or {}).get("devices") or []
        )

    async def _wants(self, claim: JsonDict | None) -> tuple[ClaimWants, dict[str, EffectiveConfig]]:
        if claim is None or not self._concerns_us(claim):
            return ClaimWants(), {}
        wanted = tuple(wanted_devices(claim, self.settings.driver_name))
        if not wanted:
            return ClaimWants(), {}
        configs: dict[str, EffectiveConfig] = {}
        config_error = None
        try:
            configs = effective_config(
                claim, self.settings.driver_name, {w.request for w in wanted}
            )
        except InvalidClaimConfig as err:
            config_error = f"invalid configuration for {self.settings.driver_name}: {err}"
        node = node_from_allocation(claim)
        if node is None:
            node = await self._node_from_pods(claim)
        host = await self._host_for(node) if node else None
        return ClaimWants(
            wanted,
            node,
            host.host_id if host else None,
            config_error,
            (host.backend or None) if host else None,
        ), configs

    async def _node_from_pods(self, claim: JsonDict) -> str | None:
        # Without binding conditions the allocation names the pool's nodes, not one node: the
        # node is only known once a consumer pod is bound to it.
        metadata = claim.get("metadata") or {}
        namespace = str(metadata.get("namespace") or "")
        for pod_name in consumer_pods(claim):
            try:
                pod = await call_json(
                    self._core.read_namespaced_pod(pod_name, namespace, _preload_content=False),
                    f"read Pod {namespace}/{pod_name}",
                )
            except KubeNotFound:
                continue
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                uid = str(metadata.get("uid"))
                if uid not in self.node_from_pod_claims:
                    self.node_from_pod_claims.add(uid)
                    log.warning(
                        "claim %s/%s: the allocation does not name one node (binding "
                        "conditions are off on this cluster); attaching to node %s of pod %s "
                        "as fast as possible, but the pod may start before its device is "
                        "attached",
                        namespace,
                        metadata.get("name"),
                        node,
                        pod_name,
                    )
                    if self.metrics:
                        self.metrics.node_from_pod.inc()
                return str(node)
        return None

    def _host_index_stale(self) -> bool:
        return (
            self._host_index is None
            or time.monotonic() - self._host_index_at > self.settings.hosts_refresh_s
        )

    async def _host_for(self, node_name: str) -> HostRef | None:
        if self._host_index_stale():
            async with self._host_index_lock:
                # Checked again: the worker that held the lock may have rebuilt it meanwhile.
                if self._host_index_stale():
                    changes, started = self._mapping_changes, time.monotonic()
                    self._host_index = HostIndex.build(
                        await host_refs(self.db), match=self.settings.host_match
                    )
                    # A change during the read marked it stale again: it stays so.
                    if self._mapping_changes == changes:
                        self._host_index_at = started
        index = self._host_index
        assert index is not None
        node = self.nodes.get(node_name)
        if node is None:
            return None
        return host_ref_for_node(node, index, self.settings.host_match, self.settings.host_key)

    async def _reserve(
        self, claim: JsonDict | None, wanted: WantedDevice, wants: ClaimWants, attach_now: bool
    ) -> tuple[ReservationView, FabricDevice | None] | DeviceReport:
        """Reserve ``wanted`` (the plan reserves only once the node and host are known); with
        ``attach_now``, journal its attach in the same transaction.

        Returns:
            (the reservation, the device when its attach was journalled), or the report of a
            device that cannot be reserved: ``WaitingForDetach`` (not ready, not failed; the
            claim is queued again when the holder's release is committed) while another
            reservation holds it (see :func:`app.claims.plan.wait_for_holder`), else
            ``AttachFailed`` (a ``detach-failed`` holder, or a device gone from the inventory).
        """
        assert claim is not None
        assert wants.node is not None
        assert wants.host_id is not None
        metadata = claim.get("metadata") or {}
        ref = ClaimRef(
            str(metadata.get("uid")), str(metadata.get("namespace")), str(metadata.get("name"))
        )
        seen = self.journal.feed.version
        try:
            if not attach_now:
                return await self.journal.reserve(
                    ref,
                    wanted.request,
                    wanted.device,
                    wanted.pool,
                    MODE,
                    wants.node,
                    wants.host_id,
                    manager=wants.manager,
                ), None
            return await self.journal.reserve_for_attach(
                ref,
                wanted.request,
                wanted.device,
                wanted.pool,
                MODE,
                wants.node,
                wants.host_id,
                manager=wants.manager,
            )
        except DeviceHeld as err:
            verdict = wait_for_holder(
                wanted.device,
                err.reservation,
                mode=MODE,
                holder_keeps=self._holder_keeps(err.reservation),
            )
            if verdict.wait:
                await self._wait_for_release(claim, ref.uid, wanted.device, verdict, seen)
                return DeviceReport(
                    wanted, False, REASON_WAITING_FOR_DETACH, verdict.message, failed=False
                )
            message = verdict.message
        except UnknownDevice as err:
            message = f"device {wanted.device} cannot be reserved: {err}"
        self._error(ref.uid, message)
        await self._event(claim, "Warning", REASON_ATTACH_FAILED, message)
        return DeviceReport(wanted, False, REASON_ATTACH_FAILED, message)

    def _holder_keeps(self, holder: ReservationView | None) -> bool:
        """True when ``holder``'s claim is cached, not being deleted, and its allocation still
        has the held device: a live claim keeps it (not a release that has yet to run)."""
        if holder is None:
            return False
        claim = self.claim_by_uid(holder.claim.uid)
        if claim is None or (claim.get("metadata") or {}).get("deletionTimestamp"):
            return False
        return any(
            w.device == holder.device_name and w.pool == holder.pool
            for w in wanted_devices(claim, self.settings.driver_name)
        )

    async def _wait_for_release(
        self, claim: JsonDict, uid: str, device: str, verdict: HeldWait, seen: int
    ) -> None:
        """Register claim ``uid`` as waiting for ``device`` (one Event when the wait starts,
        Warning for a double allocation); ``seen`` is the journal feed's version before the
        reserve, so that a release committed meanwhile queues the claim again at once."""
        waiters = self._release_waiters.setdefault(device, set())
        self._retry_reason[uid] = verdict.message
        if uid not in waiters:
            waiters.add(uid)
            log.info("claim %s: %s", self._name(uid), verdict.message)
            if verdict.live:
                self._error(uid, verdict.message)
            await self._event(
                claim,
                "Warning" if verdict.live else "Normal",
                REASON_WAITING_FOR_DETACH,
                verdict.message,
            )
        changes = self.journal.feed.since(seen)
        if changes is None or any(not held and d.device_name == device for held, d in changes):
            self.queue.add(uid)

    def _end_release_waits(self, uid: str, keep: Collection[str] = ()) -> None:
        """Claim ``uid`` no longer waits for any device but those in ``keep``."""
        for device in [
            d for d, uids in self._release_waiters.items() if uid in uids and d not in keep
        ]:
            waiters = self._release_waiters[device]
            waiters.discard(uid)
            if not waiters:
                del self._release_waiters[device]

    async def _ready_report(self, key: WantedDevice, reservation: ReservationView) -> DeviceReport:
        try:
            device = await self.journal.fabric_device(reservation)
        except UnknownDevice:
            device = None
        return self.ops.ready_report(key, reservation, device)

    async def _release(self, reservation: ReservationView, claim: JsonDict | None) -> bool:
        """Detach (when anything may have been sent) and release. True when done."""
        return await self.ops.release(reservation, claim)

    # ------------------------------------------------------------------ writes to the claim
    async def _event(self, claim: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        await self.events.record(claim, type_, reason, message)

    # ------------------------------------------------------------------ recovery and sweep
    async def recover(self) -> dict[str, int]:
        """Settle this mode's unfinished journal entries against the fabric (run once, before
        the workers): see :meth:`app.claims.fabric_ops.FabricOps.recover`.

        Returns:
            Counts of what was done: ``{"attached": n, "left": n}``.
        """
        return await self.ops.recover(modes=(MODE,))

    async def sweep(self) -> None:
        """Run the periodic sweep once (see :class:`app.claims.sweep.ClaimSweep`)."""
        await self.sweeper.sweep()

    @property
    def unmanaged(self) -> list[dict[str, str]]:
        """The devices the fabric showed attached with no reservation at the last sweep."""
        return self.sweeper.unmanaged

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        """A JSON-ready summary for the admin API."""
        return {
            "synced": self.claims.has_synced.is_set() and self.nodes.has_synced.is_set(),
            "healthy": self.is_healthy(),
            "queue_depth": len(self.queue),
            "claims_seen": len(self.claims.uids()),
            "waiting": [
                {"claim": self._name(uid), "reason": reason}
                for uid, reason in sorted(self._waiting.items())
            ],
            "unmanaged_attachments": list(self.unmanaged),
            "node_learnt_from_pod": len(self.node_from_pod_claims),
            "recent_errors": [
                {"at": rfc3339(e.at), "claim": e.subject, "message": e.message}
                for e in self.recent_errors.latest(20)
            ],
        }


def _what_we_act_on(claim: Mapping[str, Any], driver_name: str) -> tuple[Any, ...]:
    """The parts of a claim a reconcile depends on, compared between an event's old and new
    object: our driver's allocation results, the allocation's node selector and device config,
    the consumers (``reservedFor``), deletion and the uid. ``status.devices`` is left out, other
    drivers' entries included: ours are our own writes coming back, and theirs are copied
    unchanged into whatever we write."""
    metadata = claim.get("metadata") or {}
    status = claim.get("status") or {}
    allocation = status.get("allocation") or {}
    return (
        tuple(wanted_devices(claim, driver_name)),
        repr(allocation.get("nodeSelector")),
        repr((allocation.get("devices") or {}).get("config")),
        repr(status.get("reservedFor")),
        metadata.get("deletionTimestamp"),
        metadata.get("uid"),
    )


__all__ = ["FAILED", "ClaimPlan", "ClaimReconciler", "ClaimSettings"]
