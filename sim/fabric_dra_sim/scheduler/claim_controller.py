"""The resourceclaim controller of kube-controller-manager, as a stand-in for tests, the demo
and ``fabric-dra sim claim-controller``.

Ported from k8s.io/kubernetes pkg/controller/resourceclaim/controller.go (1.34+ for v1,
v1beta2 and v1beta1; release-1.31 for v1alpha3, where claims with ``spec.controller`` are
deallocated by their control-plane driver):

* ``syncPod``: a pod that is not being deleted gets one claim per
  ``spec.resourceClaims[].resourceClaimTemplateName`` (``handleClaim``): the generated name
  ``<pod>-<claim>-`` cut to 57 characters in proportion, the template's labels and
  annotations plus ``resource.kubernetes.io/pod-claim-name``, the pod as controlling owner.
  A claim made earlier whose name never reached the pod (found by owner and annotation,
  also among the claims created a moment ago: the controller's mutation cache) is reused;
  a recorded claim that is gone or no longer owned by the pod is made again. The names go
  to ``status.resourceClaimStatuses`` in one write, merged with those recorded and sorted by
  name. For a pod already bound (``spec.nodeName``), an allocated claim not reserved for it
  gets it in ``reservedFor`` (while fewer than 256 consumers: ``CanBeReserved``); on 1.31 an
  unallocated classic claim of such a pod gets a PodSchedulingContext with the pod's node as
  ``selectedNode`` (``ensurePodSchedulingContext``).
* ``syncClaim``: ``reservedFor`` pods that are gone (deleted, or replaced by a pod with
  another uid; a pod missing from the cache is looked up on the server first) or done
  (``Succeeded``/``Failed``, or deleted before it was scheduled: ``isPodDone``) are removed in
  one status update. When that leaves no consumer, a claim with the
  ``resource.kubernetes.io/delete-protection`` finalizer (allocated by the scheduler) loses
  its allocation in the same write, then the finalizer (an update); on 1.31 a claim without
  it (a control-plane driver's) gets ``deallocationRequested`` instead. A claim being deleted
  with that finalizer and no consumer is deallocated and loses the finalizer. A claim no
  one reserves whose owning pod is done or replaced is deleted.
* Entries of ``reservedFor`` that are not pods are kept.

One difference on purpose: a pod that is done gets no pod work (no claim made again after
its claim was deleted, no reservation); upstream does both and then undoes them, over and
over (kubernetes/kubernetes issue 141274).

No garbage collector runs beside the emulator, so this stand-in also does its part for pods
(k8s.io/kubernetes pkg/controller/garbagecollector ``attemptToDeleteItem``): a claim, and on
1.31 a PodSchedulingContext, whose controlling pod owner is confirmed gone on the server is
deleted with a uid precondition.

The pod status is written with a JSON merge patch of ``status.resourceClaimStatuses``; the
real controller sends the same list as a forced server-side apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

from app.jsontypes import JsonDict, json_copy
from app.kube.client import KubeClient, call_json
from app.kube.errors import KubeError, KubeNotFound
from app.kube.informer import Informer, InformerSettings
from app.kube.versions import (
    GROUP,
    ResourceApiVersion,
    claim_from_wire,
    claim_template_from_wire,
    claim_to_wire,
)
from app.kube.workqueue import ShutDown, WorkQueue, WorkQueueSettings
from fabric_dra_sim.scheduler.common import (
    DELETE_PROTECTION,
    POD_CLAIM_NAME_ANNOTATION,
    PodClaim,
    owner_pod_uid,
    pod_claims,
    pod_key,
    pod_uid,
    reserved_for_pod,
)

log = logging.getLogger(__name__)
Key = tuple[str, str, str]  # ("pod" | "claim" | "context", namespace, name)

# resourceclaim controller: room for "-" and 5 random characters in a 63-character name.
_MAX_PREFIX = 57
# k8s.io/api resource/v1 ResourceClaimReservedForMaxSize (resourceclaim.CanBeReserved).
MAX_RESERVED_FOR = 256
MERGE_PATCH = "application/merge-patch+json"


# --------------------------------------------------------------------------- pure parts
def template_claim_prefix(pod_name: str, claim_name: str) -> str:
    """``generateName`` of a claim made from a template: ``<pod>-<claim>-``, both parts cut in
    proportion to their length when longer than 57 characters (controller.go
    ``handleClaim``)."""
    prefix = f"{pod_name}-{claim_name}-"
    if len(prefix) <= _MAX_PREFIX:
        return prefix
    total = len(prefix)
    return (
        f"{pod_name[: len(pod_name) * _MAX_PREFIX // total]}-"
        f"{claim_name[: len(claim_name) * _MAX_PREFIX // total]}"
    )


def template_claim(
    template: Mapping[str, Any], pod: Mapping[str, Any], pod_claim: PodClaim
) -> JsonDict:
    """The ResourceClaim (v1 shape) to create for ``pod_claim`` from ``template`` (v1 shape):
    labels and annotations of the template's metadata, its claim spec, the pod as controlling
    owner and the pod-claim-name annotation; the server generates the name."""
    namespace, name = pod_key(pod)
    inner = template.get("spec") or {}
    meta = inner.get("metadata") or {}
    annotations = dict(meta.get("annotations") or {})
    annotations[POD_CLAIM_NAME_ANNOTATION] = pod_claim.name
    metadata: JsonDict = {
        "generateName": template_claim_prefix(name, pod_claim.name),
        "namespace": namespace,
        "annotations": annotations,
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": name,
                "uid": pod_uid(pod),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if meta.get("labels"):
        metadata["labels"] = dict(meta["labels"])
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": json_copy(dict(inner.get("spec") or {})),
    }


def owning_pod(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the controlling owner reference with apiVersion v1 and kind Pod
    (controller.go ``owningPod``), or None."""
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if (
            isinstance(owner, Mapping)
            and owner.get("controller") is True
            and owner.get("apiVersion") == "v1"
            and owner.get("kind") == "Pod"
        ):
            return str(owner.get("name") or ""), str(owner.get("uid") or "")
    return None


def owned_claim(
    claims: Iterable[Mapping[str, Any]], pod: Mapping[str, Any], pod_claim_name: str
) -> Mapping[str, Any] | None:
    """The first claim controlled by ``pod`` (by uid) and annotated with ``pod_claim_name``
    (controller.go ``findPodResourceClaim``), or None."""
    uid = pod_uid(pod)
    for claim in claims:
        meta = claim.get("metadata") or {}
        if (meta.get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION) != pod_claim_name:
            continue
        owner = owning_pod(claim)
        if owner is not None and owner[1] == uid:
            return claim
    return None


def is_pod_done(pod: Mapping[str, Any]) -> bool:
    """The pod will never run (again): phase Succeeded or Failed, or deleted before it was
    scheduled (controller.go ``isPodDone``)."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or bool(
        (pod.get("metadata") or {}).get("deletionTimestamp")
        and not (pod.get("spec") or {}).get("nodeName")
    )


def needs_claims(pod: Mapping[str, Any], deleted: bool) -> bool:
    """The pod may still use its claims (controller.go ``podNeedsClaims``): False once it is
    deleted or done."""
    return not deleted and not is_pod_done(pod)


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The names of the pod's claims known so far (``resourceclaim.Name``): the
    ``resourceClaimName`` entries and the template claims recorded in the pod status."""
    return [c.claim_name for c in pod_claims(pod) if c.claim_name]


def can_be_reserved(claim: Mapping[str, Any]) -> bool:
    """Room for one more consumer (``resourceclaim.CanBeReserved``)."""
    return len((claim.get("status") or {}).get("reservedFor") or ()) < MAX_RESERVED_FOR


def released_status(
    claim: Mapping[str, Any], remaining: list[JsonDict], version: ResourceApiVersion
) -> JsonDict:
    """The claim status once ``reservedFor`` is cut to ``remaining`` (controller.go
    ``syncClaim``): with no consumer left, a claim with the delete-protection finalizer loses
    its allocation; on v1alpha3 an allocated claim without it gets ``deallocationRequested``
    (its control-plane driver deallocates)."""
    status = json_copy(dict(claim.get("status") or {}))
    if remaining:
        status["reservedFor"] = remaining
        return status
    status.pop("reservedFor", None)
    if DELETE_PROTECTION in ((claim.get("metadata") or {}).get("finalizers") or ()):
        status.pop("allocation", None)
    elif version is ResourceApiVersion.V1ALPHA3 and status.get("allocation"):
        status["deallocationRequested"] = True
    return status


class _UidCache:
    """Uids of pods seen deleted, the newest ``size`` (uid_cache.go)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._uids: OrderedDict[str, None] = OrderedDict()

    def add(self, uid: str) -> None:
        self._uids[uid] = None
        self._uids.move_to_end(uid)
        while len(self._uids) > self.size:
            self._uids.popitem(last=False)

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids


# --------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class ClaimControllerSettings:
    """Settings of :class:`ClaimController`.

    Attributes:
        namespace: pods and claims of this namespace only; None for all.
        deleted_pods_remembered: uids of deleted pods kept to skip a lookup (> 0;
            kube-controller-manager: 500).
        informer: base informer settings (the name is replaced).
        queue: rate limits of the work queue (backoff after errors).
    """

    namespace: str | None = None
    deleted_pods_remembered: int = 500
    informer: InformerSettings = field(
        default_factory=lambda: InformerSettings(name="claim-controller")
    )
    queue: WorkQueueSettings = field(
        default_factory=lambda: WorkQueueSettings(name="claim-controller", max_delay_s=30.0)
    )

    def __post_init__(self) -> None:
        if self.deleted_pods_remembered < 1:
            raise ValueError("claim controller: deleted_pods_remembered must be >= 1")


@dataclass
class ClaimControllerCounters:
    """What the stand-in has written (for tests and the demo).

    Attributes:
        created: claims made from templates.
        reserved: claims reserved for a pod bound without the scheduler's reservation.
        released: status writes that removed consumers.
        deallocations: allocations cleared (claims with the delete-protection finalizer).
        deallocation_requests: ``deallocationRequested`` set (v1alpha3 classic claims).
        deleted: claims deleted (made for a pod that is done, replaced or gone).
    """

    created: int = 0
    reserved: int = 0
    released: int = 0
    deallocations: int = 0
    deallocation_requests: int = 0
    deleted: int = 0


# --------------------------------------------------------------------------- the stand-in
class ClaimController:
    """The resourceclaim controller's work on one API server.

    Args:
        client: the Kubernetes client.
        version: the resource.k8s.io version to speak (v1, v1beta2, v1beta1 or v1alpha3).
        settings: see :class:`ClaimControllerSettings`.
        pods, claims: informers of the same process to share (the pods and the claims of
            ``settings.namespace``, claims converted by ``claim_from_wire``), started and
            stopped by their owner before and after this controller; None: its own.

    ``await start()`` returns once the informers have listed and the worker runs; ``await
    stop()`` ends it. :attr:`counters` counts the writes. API errors of one key are logged and
    the key is retried with backoff.
    """

    def __init__(
        self,
        client: KubeClient,
        version: ResourceApiVersion,
        settings: ClaimControllerSettings | None = None,
        *,
        pods: Informer | None = None,
        claims: Informer | None = None,
    ) -> None:
        self.settings = settings or ClaimControllerSettings()
        self.version = version
        self.core = CoreV1Api(client.api)
        self.custom: Any = CustomObjectsApi(client.api)
        namespace = self.settings.namespace
        base = self.settings.informer
        # Informers handed in are shared with the process's other controllers, as client-go's
        # SharedInformerFactory shares them within kube-controller-manager
        # (k8s.io/client-go/informers/factory.go): one list and watch each, started and
        # stopped by their owner. Their objects must be the wire objects of ``version``
        # (claims through claim_from_wire).
        self._own_informers: list[Informer] = []
        if pods is None:
            pods = Informer(
                self.core.list_namespaced_pod
                if namespace
                else self.core.list_pod_for_all_namespaces,
                dataclasses.replace(base, name="claim-controller-pods", namespace=namespace),
            )
            self._own_informers.append(pods)
        if claims is None:
            if namespace:
                list_claims: Any = self._bind(self.custom.list_namespaced_custom_object, namespace)
            else:
                list_claims = self._bind(self.custom.list_cluster_custom_object)
            claims = Informer(
                list_claims,
                dataclasses.replace(base, name="claim-controller-resourceclaims", namespace=None),
                converter=lambda obj: claim_from_wire(obj, version, owned=True),
            )
            self._own_informers.append(claims)
        self.pods = pods
        self.claims = claims
        self.pods.add_handler(self._on_pod)
        self.claims.add_handler(self._on_claim)
        self.queue: WorkQueue[Key] = WorkQueue(self.settings.queue)
        self.counters = ClaimControllerCounters()
        self._deleted_pods = _UidCache(self.settings.deleted_pods_remembered)
        # Claims deleted here: a sync that still sees one in the cache leaves it alone.
        self._deleted_claims = _UidCache(self.settings.deleted_pods_remembered)
        self._created: dict[tuple[str, str], JsonDict] = {}
        # controller.go's podResourceClaimIndex: (namespace, claim name) -> the pods naming
        # the claim, kept with each pod's names so an update can take the old ones out.
        self._pods_of_claim: dict[tuple[str, str], set[str]] = {}
        self._claims_of_pod: dict[tuple[str, str], tuple[str, ...]] = {}
        self._task: asyncio.Task[None] | None = None

    def _bind(self, function: Any, *first: str) -> Any:
        group, version = GROUP, self.version.value

        def call(*args: Any, **kwargs: Any) -> Any:
            return function(group, version, *first, "resourceclaims", *args, **kwargs)

        return call

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start its own informers, wait until both informers have listed (shared ones are
        started by their owner), then start the worker."""
        for informer in self._own_informers:
            informer.start()
        for informer in (self.pods, self.claims):
            await informer.has_synced.wait()
        self._task = asyncio.create_task(self._worker(), name="claim-controller")

    async def stop(self) -> None:
        """Stop the worker and the informers. Idempotent."""
        self.queue.shutdown()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for informer in self._own_informers:
            await informer.stop()

    # ------------------------------------------------------------------ events
    def _index_pod(self, event: str, obj: JsonDict) -> None:
        key = pod_key(obj)
        for claim_name in self._claims_of_pod.pop(key, ()):
            pods = self._pods_of_claim.get((key[0], claim_name))
            if pods is not None:
                pods.discard(key[1])
                if not pods:
                    del self._pods_of_claim[(key[0], claim_name)]
        if event == "DELETED":
            return
        names = tuple(claim_names(obj))
        if names:
            self._claims_of_pod[key] = names
            for claim_name in names:
                self._pods_of_claim.setdefault((key[0], claim_name), set()).add(key[1])

    async def _on_pod(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        # controller.go enqueuePod
        self._index_pod(event, obj)
        if not (obj.get("spec") or {}).get("resourceClaims"):
            return
        namespace, name = pod_key(obj)
        deleted = event == "DELETED"
        if deleted:
            self._deleted_pods.add(pod_uid(obj))
        if not needs_claims(obj, deleted):
            for claim_name in claim_names(obj):
                self.queue.add(("claim", namespace, claim_name))
        if deleted:
            # The garbage collector's part: claims owned by the pod, recorded or not.
            uid = pod_uid(obj)
            for claim in self.claims.objects():
                if owner_pod_uid(claim) == uid:
                    self.queue.add(("claim", *pod_key(claim)))
            if self.version is ResourceApiVersion.V1ALPHA3:
                self.queue.add(("context", namespace, name))
        elif needs_claims(obj, deleted):
            # A done pod is cleanup-only: upstream would make its deleted claim again, or
            # reserve a claim for it again (kubernetes/kubernetes issue 141274).
            self.queue.add(("pod", namespace, name))

    async def _on_claim(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        # controller.go enqueueResourceClaim
        namespace, name = pod_key(obj)
        if event == "DELETED":
            self._created.pop((namespace, name), None)
        else:
            self.queue.add(("claim", namespace, name))
        # controller.go: podIndexer.ByIndex(podResourceClaimIndex, namespace/name)
        for pod_name in sorted(self._pods_of_claim.get((namespace, name), ())):
            pod = self.pods.get(pod_name, namespace)
            if pod is not None:
                await self._on_pod("MODIFIED", pod, None)

    # ------------------------------------------------------------------ worker
    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            kind, namespace, name = key
            try:
                if kind == "pod":
                    await self.sync_pod(namespace, name)
                elif kind == "claim":
                    await self.sync_claim(namespace, name)
                else:
                    await self.sync_context(namespace, name)
            except Exception as err:
                # An odd object or a failing server must not stop the stand-in.
                log.warning(
                    "%s %s/%s: %s: %s",
                    kind,
                    namespace,
                    name,
                    type(err).__name__,
                    err,
                    exc_info=not isinstance(err, KubeError),
                )
                self.queue.add_rate_limited(key)
            else:
                self.queue.forget(key)
            finally:
                self.queue.done(key)

    def _claim(self, namespace: str, name: str) -> JsonDict | None:
        cached = self.claims.get(name, namespace)
        if cached is not None:
            self._created.pop((namespace, name), None)
            return cached
        return self._created.get((namespace, name))

    # ------------------------------------------------------------------ pods
    async def sync_pod(self, namespace: str, name: str) -> None:
        """Create the pod's template claims, record them, reserve claims of a bound pod.

        Raises:
            KubeError: a template is missing, a claim of that name belongs to someone else,
                or an API call failed (the key is retried).
        """
        pod = self.pods.get(name, namespace)
        if (
            pod is None
            or (pod.get("metadata") or {}).get("deletionTimestamp")
            or (is_pod_done(pod))
        ):
            return
        recorded = {
            str(s.get("name")): s
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
            if isinstance(s, Mapping)
        }
        new: dict[str, str] = {}
        for pod_claim in pod_claims(pod):
            if pod_claim.template_name is None:
                continue
            if pod_claim.name in recorded and not recorded[pod_claim.name].get("resourceClaimName"):
                continue  # recorded as not needed
            if pod_claim.claim_name:
                claim = self._claim(namespace, pod_claim.claim_name)
                if claim is not None and owner_pod_uid(claim) == pod_uid(pod):
                    continue
                log.info(
                    "pod %s/%s claim %s: ResourceClaim %s is gone or not the pod's; "
                    "making a new one",
                    namespace,
                    name,
                    pod_claim.name,
                    pod_claim.claim_name,
                )
            found = owned_claim(
                [*self.claims.objects(), *self._created.values()], pod, pod_claim.name
            )
            if found is None:
                found = await self._create_from_template(pod, pod_claim)
            new[pod_claim.name] = str((found.get("metadata") or {}).get("name"))
        if new:
            await self._record(pod, new)
        if (pod.get("spec") or {}).get("nodeName"):
            await self._reserve_for_bound_pod(pod)

    async def _create_from_template(self, pod: JsonDict, pod_claim: PodClaim) -> JsonDict:
        namespace, name = pod_key(pod)
        template_name = str(pod_claim.template_name)
        template = claim_template_from_wire(
            await call_json(
                self.custom.get_namespaced_custom_object(
                    GROUP,
                    self.version.value,
                    namespace,
                    "resourceclaimtemplates",
                    template_name,
                    _preload_content=False,
                ),
                f"pod {namespace}/{name} claim {pod_claim.name}: read ResourceClaimTemplate "
                f"{template_name}",
            ),
            self.version,
        )
        body = claim_to_wire(template_claim(template, pod, pod_claim), self.version)
        created = claim_from_wire(
            await call_json(
                self.custom.create_namespaced_custom_object(
                    GROUP,
                    self.version.value,
                    namespace,
                    "resourceclaims",
                    body,
                    _preload_content=False,
                ),
                f"pod {namespace}/{name} claim {pod_claim.name}: create ResourceClaim",
            ),
            self.version,
        )
        self._created[pod_key(created)] = created
        self.counters.created += 1
        log.info(
            "pod %s/%s: created ResourceClaim %s from template %s",
            namespace,
            name,
            created["metadata"]["name"],
            template_name,
        )
        return created

    async def _record(self, pod: JsonDict, new: Mapping[str, str]) -> None:
        namespace, name = pod_key(pod)
        merged = {
            str(s.get("name")): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
            if isinstance(s, Mapping) and s.get("resourceClaimName")
        }
        merged.update(new)
        statuses = [{"name": n, "resourceClaimName": merged[n]} for n in sorted(merged)]
        body: Any = {"status": {"resourceClaimStatuses": statuses}}
        # The generated signature does not list _content_type; the client honours it.
        patch: Any = self.core.patch_namespaced_pod_status
        await call_json(
            patch(name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False),
            f"update Pod {namespace}/{name} status (resourceClaimStatuses)",
        )

    async def _reserve_for_bound_pod(self, pod: JsonDict) -> None:
        namespace, name = pod_key(pod)
        for pod_claim in pod_claims(pod):
            if pod_claim.claim_name is None:
                continue
            claim = self._claim(namespace, pod_claim.claim_name)
            if claim is None:
                return
            if pod_claim.template_name and owner_pod_uid(claim) != pod_uid(pod):
                raise KubeError(
                    f"pod {namespace}/{name}: ResourceClaim {namespace}/"
                    f"{pod_claim.claim_name} was not created for this pod"
                )
            status = claim.get("status") or {}
            if (
                status.get("allocation")
                and not reserved_for_pod(claim, pod_uid(pod))
                and can_be_reserved(claim)
            ):
                body = json_copy(claim)
                body["status"] = {
                    **status,
                    "reservedFor": [
                        *(status.get("reservedFor") or ()),
                        {"resource": "pods", "name": name, "uid": pod_uid(pod)},
                    ],
                }
                await self._write_status(body, f"reserve ResourceClaim for pod {name}")
                self.counters.reserved += 1
            elif (
                self.version is ResourceApiVersion.V1ALPHA3
                and not status.get("allocation")
                and (claim.get("spec") or {}).get("controller")
            ):
                await self._ensure_context(pod)

    async def _ensure_context(self, pod: JsonDict) -> None:
        # release-1.31 controller.go ensurePodSchedulingContext: a pod bound without the
        # scheduler's DRA plugin still gets its node selected for the driver.
        namespace, name = pod_key(pod)
        node = str((pod.get("spec") or {}).get("nodeName"))
        what = f"PodSchedulingContext {namespace}/{name}"
        try:
            context = await call_json(
                self.custom.get_namespaced_custom_object(
                    GROUP,
                    self.version.value,
                    namespace,
                    "podschedulingcontexts",
                    name,
                    _preload_content=False,
                ),
                f"read {what}",
            )
        except KubeNotFound:
            body = {
                "apiVersion": self.version.api_version,
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
                "spec": {"selectedNode": node},
            }
            await call_json(
                self.custom.create_namespaced_custom_object(
                    GROUP,
                    self.version.value,
                    namespace,
                    "podschedulingcontexts",
                    body,
                    _preload_content=False,
                ),
                f"create {what}",
            )
            return
        if (context.get("spec") or {}).get("selectedNode") != node:
            context.setdefault("spec", {})["selectedNode"] = node
            await call_json(
                self.custom.replace_namespaced_custom_object(
                    GROUP,
                    self.version.value,
                    namespace,
                    "podschedulingcontexts",
                    name,
                    context,
                    _preload_content=False,
                ),
                f"update {what}",
            )

    # ------------------------------------------------------------------ claims
    async def sync_claim(self, namespace: str, name: str) -> None:
        """Release consumers that are gone or done, deallocate, drop the finalizer, delete a
        generated claim nobody will use.

        Raises:
            KubeError: an API call failed, a conflict included (the key is retried).
        """
        claim = self._claim(namespace, name)
        if claim is None:
            return
        reserved = [
            r
            for r in (claim.get("status") or {}).get("reservedFor") or ()
            if isinstance(r, Mapping)
        ]
        remaining = [dict(r) for r in reserved if not await self._gone(namespace, r)]
        finalizers = list((claim.get("metadata") or {}).get("finalizers") or ())
        deleting = bool((claim.get("metadata") or {}).get("deletionTimestamp"))
        if len(remaining) < len(reserved):
            body = json_copy(claim)
            body["status"] = released_status(claim, remaining, self.version)
            was_allocated = bool((claim.get("status") or {}).get("allocation"))
            claim = await self._write_status(body, "release ResourceClaim")
            self.counters.released += 1
            if was_allocated and not (claim.get("status") or {}).get("allocation"):
                self.counters.deallocations += 1
                log.info("claim %s/%s: no consumer left; deallocated", namespace, name)
            if (claim.get("status") or {}).get("deallocationRequested") and not remaining:
                self.counters.deallocation_requests += 1
            if DELETE_PROTECTION in (
                (claim.get("metadata") or {}).get("finalizers") or ()
            ) and not (claim.get("status") or {}).get("allocation"):
                claim = await self._drop_finalizer(claim)
        elif DELETE_PROTECTION in finalizers and deleting and not remaining:
            if (claim.get("status") or {}).get("allocation"):
                body = json_copy(claim)
                body["status"].pop("allocation", None)
                claim = await self._write_status(body, "deallocate ResourceClaim")
                self.counters.deallocations += 1
            claim = await self._drop_finalizer(claim)
        owner = owning_pod(claim)
        if owner is None or (claim.get("metadata") or {}).get("deletionTimestamp"):
            return
        pod = self.pods.get(owner[0], namespace)
        if pod is not None and pod_uid(pod) == owner[1] and not is_pod_done(pod):
            return
        if pod is not None:
            if not remaining:
                # controller.go syncClaim: the owning pod is done or was replaced.
                await self._delete_claim(claim, precondition=False)
        elif await self._confirmed_gone(namespace, owner):
            await self._delete_claim(claim, precondition=True)

    async def _gone(self, namespace: str, consumer: Mapping[str, Any]) -> bool:
        """A ``reservedFor`` pod that is deleted, replaced or done; other consumers stay."""
        if consumer.get("apiGroup") or consumer.get("resource") != "pods":
            return False
        uid = str(consumer.get("uid") or "")
        if uid in self._deleted_pods:
            return True
        pod = self.pods.get(str(consumer.get("name") or ""), namespace)
        if pod is None:
            # Not in the cache yet, perhaps: only the server can tell it is gone.
            return await self._confirmed_gone(namespace, (str(consumer.get("name")), uid))
        return pod_uid(pod) != uid or is_pod_done(pod)

    async def _confirmed_gone(self, namespace: str, pod_ref: tuple[str, str]) -> bool:
        name, uid = pod_ref
        try:
            pod = await call_json(
                self.core.read_namespaced_pod(name, namespace, _preload_content=False),
                f"read Pod {namespace}/{name}",
            )
        except KubeNotFound:
            return True
        return pod_uid(pod) != uid

    async def _write_status(self, body: JsonDict, what: str) -> JsonDict:
        # An update, not a patch: it must fail when the claim changed meanwhile.
        namespace, name = pod_key(body)
        written = claim_from_wire(
            await call_json(
                self.custom.replace_namespaced_custom_object_status(
                    GROUP,
                    self.version.value,
                    namespace,
                    "resourceclaims",
                    name,
                    claim_to_wire(body, self.version),
                    _preload_content=False,
                ),
                f"{what} {namespace}/{name}",
            ),
            self.version,
        )
        self._created.pop((namespace, name), None)
        return written

    async def _drop_finalizer(self, claim: JsonDict) -> JsonDict:
        namespace, name = pod_key(claim)
        body = json_copy(claim)
        finalizers = list(body["metadata"].get("finalizers") or ())
        finalizers.remove(DELETE_PROTECTION)
        body["metadata"]["finalizers"] = finalizers
        try:
            return claim_from_wire(
                await call_json(
                    self.custom.replace_namespaced_custom_object(
                        GROUP,
                        self.version.value,
                        namespace,
                        "resourceclaims",
                        name,
                        claim_to_wire(body, self.version),
                        _preload_content=False,
                    ),
                    f"remove finalizer of ResourceClaim {namespace}/{name}",
                ),
                self.version,
            )
        except KubeNotFound:
            return body  # the last finalizer went: the claim is gone

    async def _delete_claim(self, claim: JsonDict, *, precondition: bool) -> None:
        namespace, name = pod_key(claim)
        uid = str((claim.get("metadata") or {}).get("uid") or "")
        if uid in self._deleted_claims:
            return
        options: JsonDict = {}
        if precondition:
            options["preconditions"] = {"uid": (claim.get("metadata") or {}).get("uid")}
        try:
            await call_json(
                self.custom.delete_namespaced_custom_object(
                    GROUP,
                    self.version.value,
                    namespace,
                    "resourceclaims",
                    name,
                    body=options,
                    _preload_content=False,
                ),
                f"delete ResourceClaim {namespace}/{name}",
            )
        except KubeNotFound:
            return
        self._deleted_claims.add(uid)
        self.counters.deleted += 1
        log.info("claim %s/%s: deleted (made for a pod that will not use it)", namespace, name)

    # ------------------------------------------------------------------ 1.31 contexts
    async def sync_context(self, namespace: str, name: str) -> None:
        """Delete the PodSchedulingContext ``namespace/name`` when its controlling pod is
        gone (the garbage collector's part, v1alpha3 only)."""
        what = f"PodSchedulingContext {namespace}/{name}"
        try:
            context = await call_json(
                self.custom.get_namespaced_custom_object(
                    GROUP,
                    self.version.value,
                    namespace,
                    "podschedulingcontexts",
                    name,
                    _preload_content=False,
                ),
                f"read {what}",
            )
        except KubeNotFound:
            return
        owner = owning_pod(context)
        if owner is None or (context.get("metadata") or {}).get("deletionTimestamp"):
            return
        pod = self.pods.get(owner[0], namespace)
        if pod is not None and pod_uid(pod) == owner[1]:
            return
        if await self._confirmed_gone(namespace, owner):
            with contextlib.suppress(KubeNotFound):
                await call_json(
                    self.custom.delete_namespaced_custom_object(
                        GROUP,
                        self.version.value,
                        namespace,
                        "podschedulingcontexts",
                        name,
                        body={"preconditions": {"uid": (context.get("metadata") or {}).get("uid")}},
                        _preload_content=False,
                    ),
                    f"delete {what}",
                )


__all__ = [
    "MAX_RESERVED_FOR",
    "ClaimController",
    "ClaimControllerCounters",
    "ClaimControllerSettings",
    "can_be_reserved",
    "claim_names",
    "is_pod_done",
    "needs_claims",
    "owned_claim",
    "owning_pod",
    "released_status",
    "template_claim",
    "template_claim_prefix",
]
