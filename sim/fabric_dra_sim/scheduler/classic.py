"""The Kubernetes 1.31 scheduler's side of classic DRA (control-plane controller), for tests
and the demo; the 1.31 claim controller's part runs beside it
(:class:`fabric_dra_sim.scheduler.claim_controller.ClaimController` on v1alpha3).

For each pending pod whose claims all have ``spec.controller`` set (resource.k8s.io/v1alpha3):

1. a claim made from a template is waited for until the claim controller has recorded it;
2. a PodSchedulingContext named like the pod, owned by it, gets ``spec.potentialNodes``: the
   schedulable nodes (sorted, at most 128) that every already allocated claim's
   ``nodeSelector`` accepts;
3. once every unallocated claim has its ``status.resourceClaims`` entry, one of the potential
   nodes no entry lists as unsuitable (picked by a hash of the pod's uid, standing in for
   kube-scheduler's scoring) becomes ``spec.selectedNode``; when every node is listed
   the pod stays pending (``unschedulable`` says why) and is tried again as answers change;
4. once every claim is allocated and reserved for the pod, the pod is bound (``pods/binding``)
   to the selected node and the context is deleted. An allocated claim not yet reserved for
   the pod gets it in ``reservedFor``;
5. when the allocation is not done within ``allocation_timeout_s``, or a driver lists the
   selected node as unsuitable, the attempt is abandoned: ``selectedNode`` is cleared and the
   claims allocated for it are given back (the pod leaves ``reservedFor``,
   ``deallocationRequested`` is set).

When a pod is deleted, the claim controller removes it from the ``reservedFor`` of its claims
and requests deallocation of a claim left without consumers (the 1.31 ``syncClaim``); its
scheduling context goes with it (the garbage collector's part, played there too).

Sources: Kubernetes v1.31 pkg/scheduler/framework/plugins/dynamicresources
(PreFilter/Filter/PostFilter/Reserve/Unreserve/PreBind with PodSchedulingContext),
pkg/controller/resourceclaim/controller.go. Claims with no controller (structured parameters)
are left to :mod:`fabric_dra_sim.scheduler.structured`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

from app.allocator import node_from_json
from app.allocator.pools import selector_matches
from app.jsontypes import JsonDict, dumps_json
from app.kube.client import KubeClient, call_json
from app.kube.errors import KubeAlreadyExists, KubeConflict, KubeError, KubeNotFound
from app.kube.informer import Informer, InformerSettings
from app.kube.versions import GROUP, ResourceApiVersion, claim_from_wire, claim_to_wire
from fabric_dra_sim.scheduler.claim_controller import ClaimController, ClaimControllerSettings
from fabric_dra_sim.scheduler.common import (
    bind_pod,
    candidate_nodes,
    consumer_entry,
    is_pending,
    pod_claims,
    pod_key,
    pod_uid,
    reserved_for_pod,
)

log = logging.getLogger(__name__)
VERSION = ResourceApiVersion.V1ALPHA3
MAX_NODES = 128
MERGE_PATCH = "application/merge-patch+json"
WRITE_ATTEMPTS = 5


@dataclass(frozen=True)
class ClassicSchedulerSettings:
    """Settings of the classic stand-in.

    Attributes:
        scheduler_name: pods naming another scheduler are left alone.
        namespace: only pods of this namespace, or None for all.
        poll_interval_s: the longest wait between two looks at a pod's progress (a change
            of a claim, a context or a pod ends a wait sooner).
        answer_timeout_s: how long to wait for every driver's ``resourceClaims`` entry before
            starting the round again.
        allocation_timeout_s: how long after ``selectedNode`` the claims must be allocated.
        retry_interval_s: pause before trying a pod again that fits nowhere.
        informer: base informer settings (the name is replaced).
        claim_controller: also run the claim controller stand-in (v1alpha3, same namespace);
            off where one runs already.
    """

    scheduler_name: str = "default-scheduler"
    namespace: str | None = None
    poll_interval_s: float = 0.02
    answer_timeout_s: float = 10.0
    allocation_timeout_s: float = 10.0
    retry_interval_s: float = 0.2
    informer: InformerSettings = field(
        default_factory=lambda: InformerSettings(name="classic-scheduler")
    )
    claim_controller: bool = True


class ClassicScheduler:
    """Schedules pods whose claims a control-plane DRA driver allocates.

    Args:
        client: the Kubernetes client (resource.k8s.io/v1alpha3 served).
        settings: see :class:`ClassicSchedulerSettings`.

    Attributes:
        bound: ``namespace/name`` -> node of every pod bound so far.
        unschedulable: ``namespace/name`` -> why the pod is waiting now.
        abandoned: how many selected nodes were given up.
        claim_controller: the claim controller stand-in, or None when the settings turn it
            off.
    """

    def __init__(self, client: KubeClient, settings: ClassicSchedulerSettings) -> None:
        self.client = client
        self.settings = settings
        self._core = CoreV1Api(client.api)
        self._custom: Any = CustomObjectsApi(client.api)
        base = settings.informer
        namespace = settings.namespace
        self.pods = Informer(
            functools.partial(self._core.list_namespaced_pod, namespace)
            if namespace
            else self._core.list_pod_for_all_namespaces,
            replace(base, name="pods"),
        )
        self.nodes = Informer(self._core.list_node, replace(base, name="nodes"))
        # Potential nodes by the JSON of the allocated claims' node selectors, until the next
        # node event (see _potential_nodes).
        self._potential: dict[bytes, tuple[str, ...]] = {}
        self.nodes.add_handler(self._nodes_changed)
        self.claims = self._informer("resourceclaims", namespace)
        self.contexts = self._informer("podschedulingcontexts", namespace)
        self.pods.add_handler(self._on_pod)
        # kube-scheduler requeues a pod on the events its plugins registered (1.31
        # pkg/scheduler/framework/plugins/dynamicresources EventsToRegister: PodSchedulingContext
        # and ResourceClaim changes), not on a timer, and its queueing hints
        # (isSchedulableAfterClaimChange, isSchedulableAfterPodSchedulingContextChange) only
        # requeue the pod a changed claim or context belongs to: a wait below ends at the next
        # change of the pod, its context or one of its claims, with poll_interval_s only as
        # its longest wait.
        self._waiters: dict[tuple[str, str, str], set[asyncio.Future[None]]] = {}
        for kind, informer in (
            ("pods", self.pods),
            ("resourceclaims", self.claims),
            ("podschedulingcontexts", self.contexts),
        ):
            informer.add_handler(self._waker(kind))
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.claim_controller = (
            ClaimController(
                client,
                VERSION,
                ClaimControllerSettings(namespace=namespace, informer=base),
                pods=self.pods,
                claims=self.claims,
            )
            if settings.claim_controller
            else None
        )
        self.bound: dict[str, str] = {}
        # Called with ``namespace/name`` as each pod is bound (after ``bound`` has it).
        self.on_bound: Callable[[str], None] | None = None
        # ``namespace/name`` -> step -> loop time of its last round's steps: "context"
        # (written), "answers" (every claim answered), "selected" (node chosen), "allocated"
        # (every claim allocated and reserved, as the cache shows it), "bound".
        self.timeline: dict[str, dict[str, float]] = {}
        self.unschedulable: dict[str, str] = {}
        self.abandoned = 0
        self._running = False

    def _informer(self, plural: str, namespace: str | None) -> Informer:
        if namespace:
            list_function = functools.partial(
                self._custom.list_namespaced_custom_object, GROUP, VERSION.value, namespace, plural
            )
        else:
            list_function = functools.partial(
                self._custom.list_cluster_custom_object, GROUP, VERSION.value, plural
            )
        return Informer(
            list_function,
            replace(self.settings.informer, name=plural),
            converter=lambda obj: (
                # The informer hands over objects it just decoded: converted in place.
                claim_from_wire(obj, VERSION, owned=True) if plural == "resourceclaims" else obj
            ),
        )

    async def start(self) -> None:
        """Start the informers; pods are scheduled from then on."""
        self._running = True
        for informer in (self.nodes, self.claims, self.contexts, self.pods):
            informer.start()
        for informer in (self.nodes, self.claims, self.contexts, self.pods):
            await informer.has_synced.wait()
        if self.claim_controller is not None:
            await self.claim_controller.start()
        for pod in self.pods.objects():
            self._consider(pod)

    async def stop(self) -> None:
        """Stop every pod task and the informers."""
        self._running = False
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.claim_controller is not None:
            await self.claim_controller.stop()
        for informer in (self.pods, self.contexts, self.claims, self.nodes):
            await informer.stop()

    def _step(self, key: str, step: str) -> None:
        self.timeline.setdefault(key, {})[step] = asyncio.get_running_loop().time()

    def _waker(self, kind: str) -> Callable[[str, JsonDict, JsonDict | None], Awaitable[None]]:
        """An informer handler that ends the waits on the changed object of ``kind``."""

        async def wake(_event: str, obj: JsonDict, _old: JsonDict | None) -> None:
            metadata = obj.get("metadata") or {}
            key = (kind, str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
            for waiter in self._waiters.pop(key, ()):
                if not waiter.done():
                    waiter.set_result(None)

        return wake

    async def _next_change(self, pod: JsonDict) -> None:
        """Wait for the next change of ``pod``, its PodSchedulingContext or one of its claims,
        at most ``poll_interval_s``."""
        namespace, name = pod_key(pod)
        keys = [("pods", namespace, name), ("podschedulingcontexts", namespace, name)]
        keys += [
            ("resourceclaims", namespace, c.claim_name) for c in pod_claims(pod) if c.claim_name
        ]
        waiter = asyncio.get_running_loop().create_future()
        for key in keys:
            self._waiters.setdefault(key, set()).add(waiter)
        try:
            await asyncio.wait({waiter}, timeout=self.settings.poll_interval_s)
        finally:
            for key in keys:
                waiting = self._waiters.get(key)
                if waiting is not None:
                    waiting.discard(waiter)
                    if not waiting:
                        del self._waiters[key]
            waiter.cancel()

    # ------------------------------------------------------------------ pods
    async def _on_pod(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        deleting = bool((obj.get("metadata") or {}).get("deletionTimestamp"))
        was_deleting = bool(((old or {}).get("metadata") or {}).get("deletionTimestamp"))
        if event == "DELETED" or deleting:
            if was_deleting and event != "DELETED":
                return
            task = self._tasks.pop(pod_key(obj), None)
            if task is not None:
                task.cancel()
            self.unschedulable.pop("/".join(pod_key(obj)), None)
            return
        self._consider(obj)

    def _consider(self, pod: JsonDict) -> None:
        key = pod_key(pod)
        if not self._running or not is_pending(pod, self.settings.scheduler_name):
            return
        task = self._tasks.get(key)
        if task is None or task.done():
            self._tasks[key] = asyncio.create_task(
                self._schedule(*key), name=f"classic-schedule-{key[1]}"
            )

    async def _schedule(self, namespace: str, name: str) -> None:
        try:
            while self._running:
                pod = self.pods.get(name, namespace)
                if pod is None or not is_pending(pod, self.settings.scheduler_name):
                    return
                try:
                    if await self._round(pod):
                        return
                except KubeError as err:
                    log.info("pod %s/%s: %s; trying again", namespace, name, err)
                    await asyncio.sleep(self.settings.retry_interval_s)
        finally:
            if self._tasks.get((namespace, name)) is asyncio.current_task():
                del self._tasks[(namespace, name)]

    def _claims_of(self, pod: JsonDict) -> list[tuple[str, JsonDict]] | None:
        """(pod-level name, claim) for every claim of the pod, or None while one is missing
        or has no controller (not ours to schedule)."""
        namespace = pod_key(pod)[0]
        out = []
        for ref in pod_claims(pod):
            claim = self.claims.get(ref.claim_name, namespace) if ref.claim_name else None
            if claim is None or not (claim.get("spec") or {}).get("controller"):
                return None
            out.append((ref.name, claim))
        return out

    async def _round(self, pod: JsonDict) -> bool:
        """One scheduling attempt. True when the pod is bound (or gone)."""
        namespace, name = pod_key(pod)
        key = f"{namespace}/{name}"
        if any(c.claim_name is None for c in pod_claims(pod)):
            self.unschedulable[key] = "waiting for the claims made from templates"
            await asyncio.sleep(self.settings.poll_interval_s)
            return False
        claims = self._claims_of(pod)
        if claims is None:
            self.unschedulable[key] = "waiting for claims with a controller"
            await asyncio.sleep(self.settings.poll_interval_s)
            return False
        uid = pod_uid(pod)
        pending = [(n, c) for n, c in claims if not (c.get("status") or {}).get("allocation")]
        potential = self._potential_nodes(claims)
        context = self.contexts.get(name, namespace)
        if not pending:
            selected = ((context or {}).get("spec") or {}).get("selectedNode")
            node = selected if selected in potential else (potential[0] if potential else None)
            if node is None:
                self.unschedulable[key] = "no node accepts the allocated claims"
                await asyncio.sleep(self.settings.retry_interval_s)
                return False
            for _, claim in claims:
                if not reserved_for_pod(claim, uid):
                    await self._reserve_for(claim, pod)
            if await bind_pod(self._core, pod, str(node)):
                self._step(key, "bound")
                self.bound[key] = str(node)
                self.unschedulable.pop(key, None)
                if self.on_bound is not None:
                    self.on_bound(key)
            await self._delete_context(namespace, name)
            return True
        context = await self._ensure_context(pod, potential, context)
        self._step(key, "context")
        names = [n for n, _ in pending]
        entries = await self._wait_for_answers(pod, names)
        if entries is None:
            return False
        self._step(key, "answers")
        unsuitable = {node for n in names for node in entries[n]}
        candidates = [n for n in potential if n not in unsuitable]
        if not candidates:
            self.unschedulable[key] = (
                f"every potential node is unsuitable for claims {', '.join(names)}"
            )
            await asyncio.sleep(self.settings.retry_interval_s)
            return False
        # kube-scheduler scores nodes and breaks ties at random; a stable spread by pod uid
        # keeps pods from all racing for the same first node.
        selected = str(candidates[zlib.crc32(uid.encode()) % len(candidates)])
        await self._patch_context(namespace, name, {"spec": {"selectedNode": selected}})
        self._step(key, "selected")
        if await self._wait_for_allocation(namespace, name, [n for n, _ in claims], pod, selected):
            self._step(key, "allocated")
            return False  # the next round binds
        await self._abandon(pod, selected)
        return False

    def _potential_nodes(self, claims: Sequence[tuple[str, JsonDict]]) -> list[str]:
        selectors = [
            c["status"]["allocation"]["nodeSelector"]
            for _, c in claims
            if ((c.get("status") or {}).get("allocation") or {}).get("nodeSelector")
        ]
        # The answer depends only on the nodes and the selectors: remembered until a node
        # event (_nodes_changed), as kube-scheduler takes its snapshot of the nodes once per
        # cycle and does not parse every node again for each pod.
        key = dumps_json(selectors)
        known = self._potential.get(key)
        if known is not None:
            return list(known)
        names = []
        for node in candidate_nodes(self.nodes.objects()):
            parsed = node_from_json(node)
            if all(selector_matches(s, parsed) for s in selectors):
                names.append(parsed.name)
        names = names[:MAX_NODES]
        if len(self._potential) >= 1024:
            self._potential.clear()
        self._potential[key] = tuple(names)
        return names

    async def _nodes_changed(self, _event: str, _obj: JsonDict, _old: JsonDict | None) -> None:
        self._potential.clear()

    async def _ensure_context(
        self, pod: JsonDict, potential: list[str], context: JsonDict | None
    ) -> JsonDict:
        namespace, name = pod_key(pod)
        if context is not None and (context.get("metadata") or {}).get("deletionTimestamp"):
            await asyncio.sleep(self.settings.poll_interval_s)
            raise KubeConflict(f"PodSchedulingContext {namespace}/{name} is being deleted")
        if context is None:
            body = {
                "apiVersion": VERSION.api_version,
                "kind": "PodSchedulingContext",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": name,
                            "uid": pod_uid(pod),
                            "controller": True,
                        }
                    ],
                },
                "spec": {"potentialNodes": potential},
            }
            try:
                return await call_json(
                    self._custom.create_namespaced_custom_object(
                        GROUP,
                        VERSION.value,
                        namespace,
                        "podschedulingcontexts",
                        body,
                        _preload_content=False,
                    ),
                    f"create PodSchedulingContext {namespace}/{name}",
                )
            except KubeAlreadyExists:
                context = await self._read_context(namespace, name)
                if context is None:
                    raise
        spec = context.get("spec") or {}
        changes: JsonDict = {}
        if list(spec.get("potentialNodes") or []) != potential:
            changes["potentialNodes"] = potential
        if spec.get("selectedNode"):
            changes["selectedNode"] = None  # a new round starts without a choice
        if changes:
            return await self._patch_context(namespace, name, {"spec": changes})
        return context

    async def _wait_for_answers(
        self, pod: JsonDict, names: list[str]
    ) -> dict[str, list[str]] | None:
        """Every named claim's unsuitable nodes, once each has an entry; None on timeout."""
        namespace, name = pod_key(pod)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.answer_timeout_s
        while loop.time() < deadline:
            context = self.contexts.get(name, namespace)
            entries = {
                str(e.get("name")): [str(n) for n in e.get("unsuitableNodes") or []]
                for e in ((context or {}).get("status") or {}).get("resourceClaims") or []
                if isinstance(e, Mapping)
            }
            if all(n in entries for n in names):
                return entries
            await self._next_change(pod)
        self.unschedulable[f"{namespace}/{name}"] = "no answer from the DRA driver"
        return None

    async def _wait_for_allocation(
        self, namespace: str, name: str, names: list[str], pod: JsonDict, selected: str
    ) -> bool:
        """True once every claim is allocated and reserved for the pod; False on timeout or
        when a driver lists ``selected`` as unsuitable for a claim still unallocated."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.allocation_timeout_s
        uid = pod_uid(pod)
        while loop.time() < deadline:
            current = self.pods.get(name, namespace)
            if current is None or pod_uid(current) != uid:
                return True  # gone: the next round ends
            claims = self._claims_of(current) or []
            if len(claims) == len(names) and all(
                (c.get("status") or {}).get("allocation") and reserved_for_pod(c, uid)
                for _, c in claims
            ):
                return True
            context = self.contexts.get(name, namespace) or {}
            unallocated = {n for n, c in claims if not (c.get("status") or {}).get("allocation")}
            for entry in (context.get("status") or {}).get("resourceClaims") or []:
                if entry.get("name") in unallocated and selected in (
                    entry.get("unsuitableNodes") or []
                ):
                    return False
            await self._next_change(pod)
        return False

    async def _abandon(self, pod: JsonDict, selected: str) -> None:
        namespace, name = pod_key(pod)
        self.abandoned += 1
        log.info("pod %s/%s: giving up node %s", namespace, name, selected)
        await self._patch_context(namespace, name, {"spec": {"selectedNode": None}})
        for _, claim in self._claims_of(pod) or []:
            if (claim.get("status") or {}).get("allocation"):
                await self._give_back(claim, pod_uid(pod))

    # ------------------------------------------------------------------ claims
    async def _reserve_for(self, claim: JsonDict, pod: JsonDict) -> None:
        async def change(current: JsonDict) -> JsonDict | None:
            status = current.get("status") or {}
            if not status.get("allocation") or reserved_for_pod(current, pod_uid(pod)):
                return None
            status = {
                **status,
                "reservedFor": [*(status.get("reservedFor") or []), consumer_entry(pod)],
            }
            return {**current, "status": status}

        await self._update_claim_status(claim, change)

    async def _give_back(self, claim: JsonDict, uid: str) -> None:
        """The 1.31 PostFilter/Unreserve: remove pod ``uid`` from ``reservedFor`` and request
        deallocation when no consumer is left."""

        async def change(current: JsonDict) -> JsonDict | None:
            status = dict(current.get("status") or {})
            consumers = [r for r in status.get("reservedFor") or [] if r.get("uid") != uid]
            status["reservedFor"] = consumers
            if not consumers:
                status.pop("reservedFor")
                if status.get("allocation") and (current.get("spec") or {}).get("controller"):
                    status["deallocationRequested"] = True
            if status == (current.get("status") or {}):
                return None
            return {**current, "status": status}

        await self._update_claim_status(claim, change)

    async def _update_claim_status(self, claim: JsonDict, change: Any) -> None:
        metadata = claim.get("metadata") or {}
        namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
        current: JsonDict | None = claim
        for attempt in range(WRITE_ATTEMPTS):
            if current is None or (current.get("metadata") or {}).get("uid") != metadata.get("uid"):
                return
            body = await change(current)
            if body is None:
                return
            try:
                await call_json(
                    self._custom.replace_namespaced_custom_object_status(
                        GROUP,
                        VERSION.value,
                        namespace,
                        "resourceclaims",
                        name,
                        claim_to_wire(body, VERSION),
                        _preload_content=False,
                    ),
                    f"update ResourceClaim {namespace}/{name} status",
                )
                return
            except KubeNotFound:
                return
            except KubeConflict:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
                try:
                    current = claim_from_wire(
                        await call_json(
                            self._custom.get_namespaced_custom_object(
                                GROUP,
                                VERSION.value,
                                namespace,
                                "resourceclaims",
                                name,
                                _preload_content=False,
                            ),
                            f"read ResourceClaim {namespace}/{name}",
                        ),
                        VERSION,
                    )
                except KubeNotFound:
                    return

    # ------------------------------------------------------------------ contexts
    async def _read_context(self, namespace: str, name: str) -> JsonDict | None:
        try:
            return await call_json(
                self._custom.get_namespaced_custom_object(
                    GROUP,
                    VERSION.value,
                    namespace,
                    "podschedulingcontexts",
                    name,
                    _preload_content=False,
                ),
                f"read PodSchedulingContext {namespace}/{name}",
            )
        except KubeNotFound:
            return None

    async def _patch_context(self, namespace: str, name: str, body: JsonDict) -> JsonDict:
        return await call_json(
            self._custom.patch_namespaced_custom_object(
                GROUP,
                VERSION.value,
                namespace,
                "podschedulingcontexts",
                name,
                body,
                _content_type=MERGE_PATCH,
                _preload_content=False,
            ),
            f"patch PodSchedulingContext {namespace}/{name}",
        )

    async def _delete_context(self, namespace: str, name: str) -> None:
        with contextlib.suppress(KubeNotFound):
            await call_json(
                self._custom.delete_namespaced_custom_object(
                    GROUP,
                    VERSION.value,
                    namespace,
                    "podschedulingcontexts",
                    name,
                    _preload_content=False,
                ),
                f"delete PodSchedulingContext {namespace}/{name}",
            )


__all__ = ["ClassicScheduler", "ClassicSchedulerSettings"]
