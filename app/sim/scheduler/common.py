"""Pieces both scheduler stand-ins use: a pod's claims, template claims, candidate nodes and
binding a pod. Pure functions on JSON dicts, plus three small async API helpers.

API (keep it small; the classic stand-in imports it too):

* :class:`PodClaim`, :func:`pod_claims`: ``spec.resourceClaims`` resolved to claim names.
* :func:`is_pending`, :func:`is_finished`, :func:`is_ours`: which pods a scheduler looks at.
* :func:`candidate_nodes`: schedulable nodes, by name.
* :func:`template_claim_prefix`, :func:`template_claim`, :func:`owned_claim`: the claim the
  resourceclaim controller makes from a ResourceClaimTemplate.
* :func:`consumer_entry`, :func:`reserved_for_pod`: ``status.reservedFor`` entries.
* :func:`ensure_template_claims` (async): create missing template claims and record them in
  the pod's ``status.resourceClaimStatuses``.
* :func:`bind_pod` (async): the ``pods/binding`` subresource.

Sources: k8s.io/kubernetes pkg/controller/resourceclaim (controller.go ``handleClaim``: the
generated name, the owner reference, the ``resource.kubernetes.io/pod-claim-name`` annotation,
the pod status entry), k8s.io/dynamic-resource-allocation/resourceclaim (``Name``,
``IsReservedForPod``), kube-scheduler's binder (``pods/binding``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from app.kube.client import call_json
from app.kube.errors import KubeConflict, KubeNotFound
from app.kube.versions import (
    ResourceApiVersion,
    claim_from_wire,
    claim_template_from_wire,
    claim_to_wire,
)

log = logging.getLogger(__name__)
JsonDict = dict[str, Any]

DEFAULT_SCHEDULER = "default-scheduler"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
# resourceclaim controller: room for "-" and 5 random characters in a 63-character name.
_MAX_PREFIX = 57
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One ``spec.resourceClaims[]`` entry of a pod.

    Attributes:
        name: the pod-level name (unique in the pod).
        claim_name: the ResourceClaim to use: ``resourceClaimName``, or for a template the
            name recorded in ``status.resourceClaimStatuses``; None while a template claim
            has not been created yet.
        template_name: ``resourceClaimTemplateName``, or None.
    """

    name: str
    claim_name: str | None
    template_name: str | None = None


def pod_claims(pod: Mapping[str, Any]) -> list[PodClaim]:
    """The pod's claims, in ``spec.resourceClaims`` order; entries without a name or with
    neither source are skipped (the API server refuses them)."""
    statuses = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        if isinstance(s, Mapping) and s.get("name")
    }
    out: list[PodClaim] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if not isinstance(entry, Mapping) or not entry.get("name"):
            continue
        name = str(entry["name"])
        if entry.get("resourceClaimName"):
            out.append(PodClaim(name, str(entry["resourceClaimName"])))
        elif entry.get("resourceClaimTemplateName"):
            recorded = statuses.get(name)
            out.append(PodClaim(name, str(recorded) if recorded else None,
                                str(entry["resourceClaimTemplateName"])))
    return out


def pod_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) of a pod."""
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def pod_uid(pod: Mapping[str, Any]) -> str:
    """``metadata.uid`` of a pod ('' when missing)."""
    return str((pod.get("metadata") or {}).get("uid") or "")


def is_finished(pod: Mapping[str, Any]) -> bool:
    """Phase Succeeded or Failed: the pod will never run again."""
    return (pod.get("status") or {}).get("phase") in FINISHED_PHASES


def is_ours(pod: Mapping[str, Any], scheduler_name: str = DEFAULT_SCHEDULER) -> bool:
    """The pod names ``scheduler_name`` (an empty ``spec.schedulerName`` means the default
    scheduler, as the API server's defaulting does)."""
    return str((pod.get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER) == (
        scheduler_name)


def is_pending(pod: Mapping[str, Any], scheduler_name: str = DEFAULT_SCHEDULER) -> bool:
    """A pod this scheduler must place: not bound (``spec.nodeName`` unset), not being
    deleted, not finished, for ``scheduler_name``, and with ``spec.resourceClaims``."""
    return (
        not (pod.get("spec") or {}).get("nodeName")
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
        and not is_finished(pod)
        and is_ours(pod, scheduler_name)
        and bool((pod.get("spec") or {}).get("resourceClaims"))
    )


def candidate_nodes(nodes: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Nodes a pod may go to: not ``spec.unschedulable`` and not being deleted, sorted by
    name."""
    usable = [
        n for n in nodes
        if not (n.get("spec") or {}).get("unschedulable")
        and not (n.get("metadata") or {}).get("deletionTimestamp")
        and (n.get("metadata") or {}).get("name")
    ]
    return sorted(usable, key=lambda n: str(n["metadata"]["name"]))


def consumer_entry(pod: Mapping[str, Any]) -> JsonDict:
    """The pod as a ``status.reservedFor`` entry."""
    return {"resource": "pods", "name": pod_key(pod)[1], "uid": pod_uid(pod)}


def reserved_for_pod(claim: Mapping[str, Any], uid: str) -> bool:
    """The claim's ``status.reservedFor`` holds the pod with ``uid``
    (resourceclaim.IsReservedForPod)."""
    return any(
        isinstance(r, Mapping) and r.get("resource") == "pods" and r.get("uid") == uid
        for r in (claim.get("status") or {}).get("reservedFor") or ()
    )


def template_claim_prefix(pod_name: str, claim_name: str) -> str:
    """``generateName`` of a claim made from a template: ``<pod>-<claim>-``, both parts cut in
    proportion to their length when longer than 57 characters (resourceclaim controller)."""
    prefix = f"{pod_name}-{claim_name}-"
    if len(prefix) <= _MAX_PREFIX:
        return prefix
    total = len(prefix)
    return (f"{pod_name[: len(pod_name) * _MAX_PREFIX // total]}-"
            f"{claim_name[: len(claim_name) * _MAX_PREFIX // total]}")


def owned_claim(
    claims: Iterable[Mapping[str, Any]], pod: Mapping[str, Any], pod_claim_name: str
) -> Mapping[str, Any] | None:
    """A claim controlled by ``pod`` (owner reference with ``controller: true`` and the pod's
    uid) and annotated with ``pod_claim_name``: one made earlier whose name never reached the
    pod status (a crash between the two writes), or None."""
    uid = pod_uid(pod)
    for claim in claims:
        meta = claim.get("metadata") or {}
        if (meta.get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION) != pod_claim_name:
            continue
        if any(isinstance(o, Mapping) and o.get("uid") == uid and o.get("controller") is True
               for o in meta.get("ownerReferences") or ()):
            return claim
    return None


def template_claim(
    template: Mapping[str, Any], pod: Mapping[str, Any], pod_claim: PodClaim
) -> JsonDict:
    """The v1 ResourceClaim to create for ``pod_claim`` from ``template`` (v1 shape): labels
    and annotations of the template's metadata, its claim spec, the pod as controlling owner
    and the pod-claim-name annotation; the name is generated by the API server."""
    namespace, name = pod_key(pod)
    inner = (template.get("spec") or {})
    meta = inner.get("metadata") or {}
    annotations = dict(meta.get("annotations") or {})
    annotations[POD_CLAIM_NAME_ANNOTATION] = pod_claim.name
    metadata: JsonDict = {
        "generateName": template_claim_prefix(name, pod_claim.name),
        "namespace": namespace,
        "annotations": annotations,
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name,
                             "uid": pod_uid(pod), "controller": True,
                             "blockOwnerDeletion": True}],
    }
    if meta.get("labels"):
        metadata["labels"] = dict(meta["labels"])
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata,
            "spec": dict(inner.get("spec") or {})}


def owner_pod_uid(claim: Mapping[str, Any]) -> str | None:
    """The uid of the pod that controls ``claim`` (a template claim), or None."""
    for owner in (claim.get("metadata") or {}).get("ownerReferences") or ():
        if (isinstance(owner, Mapping) and owner.get("kind") == "Pod"
                and owner.get("controller") is True and owner.get("uid")):
            return str(owner["uid"])
    return None


async def ensure_template_claims(
    resources: Any, core: CoreV1Api, version: ResourceApiVersion, pod: Mapping[str, Any],
    existing: Iterable[Mapping[str, Any]],
    on_created: Callable[[JsonDict], None] | None = None,
) -> JsonDict | None:
    """Create the claims of ``pod``'s templates that have none yet, and record them in the
    pod's ``status.resourceClaimStatuses`` (one pod status update).

    Args:
        resources: the typed resource.k8s.io API object (``versions.resource_api``).
        core: the core API.
        version: the resource.k8s.io version ``resources`` speaks.
        pod: the pod as cached (its resourceVersion is the precondition of the status write).
        existing: the claims of the pod's namespace in v1 shape, to find one made before.
        on_created: called with each claim created (v1 shape) as soon as it exists, so that
            a caller can find it again before its informer has seen it.

    Returns:
        The pod as updated (JSON), or None when nothing was missing.

    Raises:
        KubeNotFound: a template, or the pod, does not exist.
        KubeConflict: the pod changed meanwhile (re-read it and call again).
        KubeError: any other API failure.
    """
    missing = [c for c in pod_claims(pod) if c.claim_name is None and c.template_name]
    if not missing:
        return None
    namespace, name = pod_key(pod)
    existing = list(existing)
    recorded: list[JsonDict] = []
    for pod_claim in missing:
        assert pod_claim.template_name is not None
        found = owned_claim(existing, pod, pod_claim.name)
        if found is None:
            template = claim_template_from_wire(await call_json(
                resources.read_namespaced_resource_claim_template(
                    pod_claim.template_name, namespace, _preload_content=False),
                f"read ResourceClaimTemplate {namespace}/{pod_claim.template_name}"), version)
            claim_body = claim_to_wire(template_claim(template, pod, pod_claim), version)
            created = claim_from_wire(await call_json(
                resources.create_namespaced_resource_claim(namespace, claim_body,
                                                           _preload_content=False),
                f"create ResourceClaim for pod {namespace}/{name} claim {pod_claim.name}"),
                version)
            log.info("pod %s/%s: created ResourceClaim %s from template %s", namespace, name,
                     created["metadata"]["name"], pod_claim.template_name)
            if on_created is not None:
                on_created(created)
            found = created
        recorded.append({"name": pod_claim.name,
                         "resourceClaimName": (found.get("metadata") or {}).get("name")})
    # A plain dict: the typed models would drop fields they do not know.
    body: Any = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": dict(pod.get("metadata") or {}), "spec": pod.get("spec") or {},
                 "status": dict(pod.get("status") or {})}
    statuses = [s for s in body["status"].get("resourceClaimStatuses") or ()
                if isinstance(s, Mapping) and s.get("name") not in {c.name for c in missing}]
    body["status"]["resourceClaimStatuses"] = [*statuses, *recorded]
    return await call_json(core.replace_namespaced_pod_status(name, namespace, body,
                                                              _preload_content=False),
                           f"update Pod {namespace}/{name} status (resourceClaimStatuses)")


async def bind_pod(core: CoreV1Api, pod: Mapping[str, Any], node: str) -> bool:
    """Bind ``pod`` to ``node`` through ``pods/binding`` (what kube-scheduler's binder does).

    Returns:
        True when bound now; False when the pod is gone, or was bound already (to any node:
        the caller re-reads it).

    Raises:
        KubeError: any other failure.
    """
    namespace, name = pod_key(pod)
    body: Any = {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": pod_uid(pod)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    try:
        # The server answers a Status the typed client cannot turn into a V1Binding.
        await call_json(core.create_namespaced_pod_binding(name, namespace, body,
                                                           _preload_content=False),
                        f"bind Pod {namespace}/{name} to node {node}")
    except (KubeNotFound, KubeConflict) as err:
        log.info("pod %s/%s: not bound to %s: %s", namespace, name, node, err)
        return False
    return True


__all__ = [
    "DEFAULT_SCHEDULER",
    "POD_CLAIM_NAME_ANNOTATION",
    "PodClaim",
    "bind_pod",
    "candidate_nodes",
    "consumer_entry",
    "ensure_template_claims",
    "is_finished",
    "is_ours",
    "is_pending",
    "owned_claim",
    "owner_pod_uid",
    "pod_claims",
    "pod_key",
    "pod_uid",
    "reserved_for_pod",
    "template_claim",
    "template_claim_prefix",
]
