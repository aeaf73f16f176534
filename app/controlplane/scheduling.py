"""The control-plane scheduling pass: answer a PodSchedulingContext, and allocate its pod's
claims once the scheduler selected a node.

One pass per context (key ``("context", namespace, name)``). Gather: the pod, its claims of
our driver that are not allocated, and a :class:`app.controlplane.snapshot.Snapshot` (pools,
classes, nodes and hosts, devices in use). When ``spec.selectedNode`` is set, all those claims
are allocated together for exactly that node; on success our finalizer goes on each claim
first, the devices are reserved in the journal (mode ``control-plane``), and
``status.allocation`` (with ``controller``) and the pod in ``reservedFor`` are written in one
status update per claim. Otherwise (no selected node, it cannot serve the claims, or a device
was taken meanwhile) each claim's ``status.resourceClaims`` entry lists the unsuitable
potential nodes.

Allocation decisions are serialised by one lock around gather and allocate, which awaits
nothing but the snapshot: the devices chosen are held in memory at once
(:meth:`app.controlplane.plan.InUse.hold_pending`), so each decision sees the choices of the
one before, and the journal is written after the lock is let go (database round trips under
the lock capped the decisions per second). Those holds are a part of the in-use index of their
own, which the journal's full re-reads do not drop, and end once the allocations are written
(the claims hold the devices then) or the attempt failed. The journal's unique index still
refuses an exclusive device another mode or process holds (DeviceHeld): the reservations made
are released, the memory holds end, and the context is answered again from fresh data.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.allocator import Node, SpecError, claim_from_object
from app.allocator.model import DeviceId
from app.allocator.pools import selector_matches
from app.controlplane import plan as cp
from app.controlplane.allocation import (
    MODE,
    REASON_DEVICE_TAKEN,
    VERSION,
    WRITE_ATTEMPTS,
)
from app.controlplane.snapshot import Snapshot
from app.journal import ClaimRef, DeviceHeld, ReservationView, UnknownDevice
from app.jsontypes import JsonDict
from app.kube.client import call_json
from app.kube.update import status_write_body, update_with_retry
from app.kube.versions import GROUP

if TYPE_CHECKING:
    from app.controlplane.controller import ControlPlaneController

REASON_ALLOCATION_FAILED = "AllocationFailed"
REASON_INVALID_CLAIM = "InvalidClaim"


@dataclass(frozen=True, slots=True)
class Reserved:
    """Every device of every pending claim is reserved for the selected node.

    Attributes:
        allocations: the allocation result of each claim, by claim uid.
        taken: the reservations made.
    """

    allocations: Mapping[str, Mapping[str, Any]]
    taken: tuple[ReservationView, ...]


@dataclass(frozen=True, slots=True)
class Taken:
    """A device was taken meanwhile (another mode holds it): nothing is reserved, and the
    context is answered again from fresh data."""


@dataclass(frozen=True, slots=True)
class Choice:
    """The allocation decided for the selected node, before the journal is written.

    Attributes:
        allocations: the allocation result of each claim, by claim uid.
        host: the fabric host id of the selected node.
        held: by claim uid, the devices this decision holds in memory
            (:meth:`app.controlplane.plan.InUse.hold_pending`) until its allocations are
            written or it fails.
    """

    allocations: Mapping[str, Mapping[str, Any]]
    host: str
    held: Mapping[str, frozenset[DeviceId]]


def resource_version(obj: Mapping[str, Any]) -> int:
    """``metadata.resourceVersion`` as an integer (etcd's revision); -1 when it is not one."""
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or -1)
    except ValueError:
        return -1


class SchedulingPass:
    """Answers the scheduling contexts of one :class:`ControlPlaneController`, whose
    informers, snapshot cache, allocator, journal and claim writes it uses.

    Attributes:
        last_answers: the last answer of each context, by (namespace, name), for the admin
            view.
        written: the contexts our last status writes returned (newer than the cache until the
            informer delivers them), by (namespace, name).
    """

    def __init__(self, controller: ControlPlaneController) -> None:
        self.controller = controller
        self.last_answers: dict[tuple[str, str], dict[str, list[str]]] = {}
        self.written: dict[tuple[str, str], JsonDict] = {}
        self._lock = asyncio.Lock()

    def forget(self, key: tuple[str, str]) -> None:
        """The context ``key`` was deleted."""
        self.last_answers.pop(key, None)
        self.written.pop(key, None)

    async def sync(self, namespace: str, name: str) -> bool:
        """Answer one PodSchedulingContext, and allocate when a node is selected.

        Returns:
            True when it must be looked at again later (a device was taken meanwhile).

        Raises:
            KubeError, SQLAlchemyError: a failure to retry with backoff.
        """
        c = self.controller
        context = c.contexts.get(name, namespace)
        if context is None or cp.being_deleted(context):
            return False
        pod = c.pods.get(name, namespace)
        if pod is None or (pod.get("spec") or {}).get("nodeName") or cp.being_deleted(pod):
            return False
        pending: list[tuple[str, JsonDict]] = []
        for ref in cp.pod_claims(pod):
            claim = c.cached_claim(ref.claim_name, namespace) if ref.claim_name else None
            if (
                claim is not None
                and cp.is_ours(claim, c.settings.driver_name)
                and cp.allocation_of(claim) is None
                and not cp.being_deleted(claim)
            ):
                pending.append((ref.name, claim))
        if not pending:
            return False
        spec = context.get("spec") or {}
        selected = str(spec.get("selectedNode") or "")
        potential = cp.answer_nodes([str(n) for n in spec.get("potentialNodes") or []], selected)
        uids = {str(claim["metadata"]["uid"]) for _, claim in pending}
        async with contextlib.AsyncExitStack() as stack:
            if selected:
                # The claims' own passes wait while their allocation is made and written.
                for uid in sorted(uids):
                    await stack.enter_async_context(c.claim_lock(uid))
            try:
                return await self._answer_or_allocate(
                    namespace, name, pod, pending, selected, potential, uids
                )
            except BaseException:
                if selected:
                    # An allocation that stopped halfway may have left reservations behind:
                    # the claims' own passes release them (once the locks held here go).
                    for uid in uids:
                        c.queue.add(("claim", uid, ""))
                raise

    async def _answer_or_allocate(
        self,
        namespace: str,
        name: str,
        pod: JsonDict,
        pending: list[tuple[str, JsonDict]],
        selected: str,
        potential: list[str],
        uids: set[str],
    ) -> bool:
        c = self.controller
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
        warnings: list[tuple[JsonDict, str, str]] = []
        choice: Choice | None = None
        answers: dict[str, list[str]] = {}
        async with self._lock:
            # Only the decision is made under the lock, awaiting nothing but the snapshot:
            # the devices it chooses are held in memory at once (so the next decision sees
            # them), and the journal is written after the lock is let go.
            snapshot = await c.snapshots.snapshot(uids)
            parsed: list[cp.Pending] = []
            for pod_claim, claim in pending:
                try:
                    parsed.append(cp.Pending(pod_claim, claim_from_object(claim)))
                except SpecError as err:
                    warnings.append((claim, REASON_INVALID_CLAIM, f"cannot allocate: {err}"))
            if len(parsed) < len(pending):
                answers = {p: list(potential[: cp.MAX_NODES]) for p, _ in pending}
            else:
                if selected:
                    choice = self._choose(pending, parsed, selected, snapshot, warnings)
                if choice is None:
                    answers = self._answers(parsed, potential, snapshot)
        for claim, reason, message in warnings:
            await c.warn(claim, reason, message)
        requeue = False
        if choice is not None:
            outcome = await self._reserve(pending, choice, selected)
            if isinstance(outcome, Reserved):
                try:
                    await c.at("after-reserve")
                    return not await self._write_allocations(pod, pending, outcome, selected)
                finally:
                    # Written: the claims' allocations hold the devices now (and the
                    # journal, for exclusive ones); not written: they were released.
                    self._let_go(choice)
            requeue = True
            async with self._lock:
                snapshot = await c.snapshots.snapshot(uids)
                answers = self._answers(parsed, potential, snapshot)
        self.last_answers[(namespace, name)] = answers
        await self._write_answers(namespace, name, answers)
        return requeue

    def _answers(
        self, parsed: list[cp.Pending], potential: list[str], snapshot: Snapshot
    ) -> dict[str, list[str]]:
        c = self.controller
        return cp.unsuitable_nodes(
            c.allocator,
            parsed,
            snapshot.classes,
            snapshot.pools,
            snapshot.in_use,
            potential,
            self._suitable_nodes(parsed, snapshot),
            snapshot.hosts,
            snapshot.reachable,
            c.answers,
        )

    @staticmethod
    def _suitable_nodes(pending: list[cp.Pending], snapshot: Snapshot) -> dict[str, Node]:
        """Nodes that every class of the pending requests accepts (v1alpha3 DeviceClass
        ``suitableNodes``, a core NodeSelector)."""
        selectors = [
            snapshot.class_selectors[a.device_class_name]
            for p in pending
            for r in p.claim.requests
            for a in r.alternatives
            if a.device_class_name in snapshot.class_selectors
        ]
        if not selectors:
            return dict(snapshot.nodes)
        return {
            name: node
            for name, node in snapshot.nodes.items()
            if all(selector_matches(s, node) for s in selectors)
        }

    def _choose(
        self,
        pending: list[tuple[str, JsonDict]],
        parsed: list[cp.Pending],
        node_name: str,
        snapshot: Snapshot,
        warnings: list[tuple[JsonDict, str, str]],
    ) -> Choice | None:
        """Allocate the pending claims for exactly ``node_name`` and hold the chosen devices
        in memory (:meth:`app.controlplane.plan.InUse.hold_pending`). Called under the lock;
        awaits nothing.

        Returns:
            the choice; None when the node cannot serve the claims (it is answered as
            unsuitable; the allocator's reason goes to ``warnings``).
        """
        c = self.controller
        driver = c.settings.driver_name
        node = self._suitable_nodes(parsed, snapshot).get(node_name)
        host = snapshot.hosts.get(node_name)
        if node is None or host is None:
            return None
        outcome = c.allocator.allocate(
            [p.claim for p in parsed],
            snapshot.classes,
            snapshot.reachable.get(node_name, snapshot.pools),
            snapshot.in_use,
            node,
        )
        if outcome.failure is not None:
            for _, claim in pending:
                warnings.append(
                    (
                        claim,
                        REASON_ALLOCATION_FAILED,
                        f"node {node_name}: {outcome.failure.message}",
                    )
                )
            return None
        # Every result the journal will reserve (admin access too: its row is exclusive).
        held = {
            uid: c.snapshots.in_use.hold_pending(
                uid, [(driver, w.pool, w.device) for w in cp.chosen_devices(allocation, driver)]
            )
            for uid, allocation in outcome.allocations.items()
        }
        return Choice(outcome.allocations, host, held)

    async def _reserve(
        self, pending: list[tuple[str, JsonDict]], choice: Choice, node_name: str
    ) -> Reserved | Taken:
        """Reserve every device of every claim of ``choice`` in the journal, or none.

        Leftover reservations of these claims (an allocation that stopped before its status
        write) are not read here: the claim's own pass, queued once the allocation is
        written, has failed or was refused, releases every reservation the allocation does
        not name (:func:`app.claims.plan.plan_claim`).

        Returns:
            :class:`Reserved` on success; :class:`Taken` when a device was taken meanwhile
            (another mode, another process, or a decision made from a journal read that did
            not have ours yet): answer again from fresh data.

        Raises:
            SQLAlchemyError: the journal could not be written (the devices held in memory
                are let go; what was reserved is released by the claims' passes).
        """
        c = self.controller
        driver = c.settings.driver_name
        taken: list[ReservationView] = []
        try:
            for _, claim in pending:
                metadata = claim["metadata"]
                ref = ClaimRef(
                    str(metadata["uid"]), str(metadata["namespace"]), str(metadata["name"])
                )
                chosen = cp.chosen_devices(choice.allocations[ref.uid], driver)
                for wanted in chosen:
                    taken.append(
                        await c.journal.reserve(
                            ref,
                            wanted.request,
                            wanted.device,
                            wanted.pool,
                            MODE,
                            node_name,
                            choice.host,
                            manager=c.snapshots.manager_of(node_name),
                        )
                    )
        except (DeviceHeld, UnknownDevice) as err:
            try:
                for reservation in taken:
                    await c.ops.release(reservation, None)
            finally:
                # After the releases: until then the journal still holds those devices.
                self._let_go(choice)
            for _, claim in pending:
                # Its own pass releases what an earlier attempt left (it may be the very
                # device refused here).
                c.queue.add(("claim", str(claim["metadata"]["uid"]), ""))
                await c.warn(
                    claim,
                    REASON_DEVICE_TAKEN,
                    f"node {node_name}: {err}; answering the scheduler again",
                )
            return Taken()
        except BaseException:
            self._let_go(choice)
            raise
        return Reserved(choice.allocations, tuple(taken))

    def _let_go(self, choice: Choice) -> None:
        """End the in-memory holds of a choice: its allocations are written (the claims hold
        the devices) or it failed. A device the journal reserved before a failure is held by
        the journal's feed until it is released."""
        for uid, devices in choice.held.items():
            self.controller.snapshots.in_use.drop_pending(uid, devices)

    async def _write_allocations(
        self, pod: JsonDict, pending: list[tuple[str, JsonDict]], reserved: Reserved, node_name: str
    ) -> bool:
        """One status update per claim: allocation (with controller) and the pod reserved.
        A claim that cannot be written has its new reservations released. True when all
        were written."""
        c = self.controller
        consumer = cp.consumer_ref(pod)
        complete = True
        for _, claim in pending:
            uid = str(claim["metadata"]["uid"])
            written = await self._write_allocation(
                claim, reserved.allocations[uid], consumer, node_name
            )
            if written is not None:
                c.allocations += 1
                c.queue_after_write(written)
                continue
            complete = False
            for reservation in reserved.taken:
                if reservation.claim.uid == uid:
                    await c.ops.release(reservation, None)
            c.queue.add(("claim", uid, ""))
        return complete

    async def _write_answers(
        self, namespace: str, name: str, answers: Mapping[str, list[str]]
    ) -> None:
        c = self.controller
        cached = c.contexts.get(name, namespace)
        written = self.written.get((namespace, name))
        if cached is not None and written is not None:
            if resource_version(written) > resource_version(cached):
                # The informer has not delivered our last write yet: compare with what we
                # wrote, not with the older cached status.
                cached = written
            else:
                del self.written[(namespace, name)]
        current = list(((cached or {}).get("status") or {}).get("resourceClaims") or [])
        if cached is not None and cp.same_claim_entries(
            cp.merged_claim_entries(current, answers), current
        ):
            return

        async def write(context: JsonDict) -> None:
            status = context.get("status") or {}
            entries = cp.merged_claim_entries(status.get("resourceClaims") or [], answers)
            if cp.same_claim_entries(entries, status.get("resourceClaims") or []):
                return
            body = {**status_write_body(context), "status": {**status, "resourceClaims": entries}}
            self.written[(namespace, name)] = await call_json(
                c.custom.replace_namespaced_custom_object_status(
                    GROUP,
                    VERSION.value,
                    namespace,
                    "podschedulingcontexts",
                    name,
                    body,
                    _preload_content=False,
                ),
                f"update PodSchedulingContext {namespace}/{name} status",
            )

        await update_with_retry(
            cached,
            write,
            lambda: c.read_object("podschedulingcontexts", namespace, name),
            gone=None,
            attempts=WRITE_ATTEMPTS,
        )

    async def _ensure_finalizer(self, claim: JsonDict) -> JsonDict | None:
        """The claim with our finalizer (added by a guarded JSON patch), or None when it is
        gone, being deleted, or was allocated meanwhile."""
        c = self.controller
        metadata = claim.get("metadata") or {}
        namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))

        async def add(current: JsonDict) -> JsonDict | None:
            if cp.being_deleted(current) or cp.allocation_of(current) is not None:
                return None
            patch = cp.add_finalizer_patch(current, c.finalizer)
            if patch is None:
                return current
            return c.remember(
                await c.patch_claim(
                    namespace,
                    name,
                    patch,
                    f"add finalizer {c.finalizer} to ResourceClaim {namespace}/{name}",
                )
            )

        return await c.update_claim(claim, add, gone=None, guarded_patch=True)

    async def _write_allocation(
        self,
        claim: JsonDict,
        allocation: Mapping[str, Any],
        consumer: Mapping[str, str],
        node_name: str,
    ) -> JsonDict | None:
        """Write allocation and reservedFor in one status update. Returns the claim that
        holds the allocation (as written, or as found when an earlier write of ours whose
        answer was lost made it); None when the claim is gone, being deleted, or allocated
        otherwise meanwhile."""
        c = self.controller
        metadata = claim.get("metadata") or {}

        async def write(current: JsonDict) -> JsonDict | None:
            if cp.being_deleted(current):
                return None
            body = cp.allocated_status(
                current, allocation, c.settings.driver_name, consumer, node_name
            )
            if cp.allocation_of(current) is not None:
                # Ours already (an earlier write whose answer was lost), or someone else's.
                return current if cp.allocation_of(current) == cp.allocation_of(body) else None
            # Strict: an allocation field the server drops would be a silent bug.
            written = await c.write_claim_status(body, strict=True)
            uid = str(metadata.get("uid"))
            # In use from now, not from when the informer delivers the write.
            c.in_use.set_claim(uid, cp.claim_devices(written, c.settings.driver_name))
            c.warned.pop(uid, None)
            return written

        return await c.update_claim(claim, write, gone=None)


__all__ = [
    "Choice",
    "Reserved",
    "SchedulingPass",
    "Taken",
    "resource_version",
]
