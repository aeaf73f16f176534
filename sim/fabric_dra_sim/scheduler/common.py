"""Pieces the scheduler stand-ins and the claim controller use: a pod's claims, candidate nodes
and binding a pod. Pure functions on JSON dicts, plus three small async API helpers.

API (keep it small; the classic stand-in imports it too):

* :class:`PodClaim`, :func:`pod_claims`: ``spec.resourceClaims`` resolved to claim names.
* :func:`is_pending`, :func:`is_finished`, :func:`is_ours`: which pods a scheduler looks at.
* :func:`candidate_nodes`: schedulable nodes, by name.
* :func:`owner_pod_uid`: the pod that controls a claim made from a template.
* :func:`consumer_entry`, :func:`reserved_for_pod`: ``status.reservedFor`` entries.
* :func:`bind_pod` (async): the ``pods/binding`` subresource.

Claims made from templates are the claim controller's
(:mod:`fabric_dra_sim.scheduler.claim_controller`).

Sources: k8s.io/dynamic-resource-allocation/resourceclaim (``Name``, ``IsReservedForPod``),
kube-scheduler's binder (``pods/binding``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from app.jsontypes import JsonDict
from app.kube.client import call_json
from app.kube.errors import KubeConflict, KubeNotFound

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER = "default-scheduler"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
# k8s.io/api resource/v1 Finalizer: the scheduler adds it when it allocates, the claim
# controller removes it once the claim is deallocated.
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
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
            out.append(
                PodClaim(
                    name,
                    str(recorded) if recorded else None,
                    str(entry["resourceClaimTemplateName"]),
                )
            )
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
        scheduler_name
    )


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
        n
        for n in nodes
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


def owner_pod_uid(claim: Mapping[str, Any]) -> str | None:
    """The uid of the pod that controls ``claim`` (a template claim), or None."""
    for owner in (claim.get("metadata") or {}).get("ownerReferences") or ():
        if (
            isinstance(owner, Mapping)
            and owner.get("kind") == "Pod"
            and owner.get("controller") is True
            and owner.get("uid")
        ):
            return str(owner["uid"])
    return None


async def bind_pod(core: CoreV1Api, pod: Mapping[str, Any], node: str) -> bool:
    """Bind ``pod`` to ``node`` through ``pods/binding`` (what kube-scheduler's binder does).

    Returns:
        True when bound now; False when the pod is gone, or was bound already (to any node:
        the caller re-reads it).

    Raises:
        KubeError: any other failure.
    """
    namespace, name = pod_key(pod)
    body: Any = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace, "uid": pod_uid(pod)},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    try:
        # The server answers a Status the typed client cannot turn into a V1Binding.
        await call_json(
            core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False),
            f"bind Pod {namespace}/{name} to node {node}",
        )
    except (KubeNotFound, KubeConflict) as err:
        log.info("pod %s/%s: not bound to %s: %s", namespace, name, node, err)
        return False
    return True


__all__ = [
    "DEFAULT_SCHEDULER",
    "DELETE_PROTECTION",
    "POD_CLAIM_NAME_ANNOTATION",
    "PodClaim",
    "bind_pod",
    "candidate_nodes",
    "consumer_entry",
    "is_finished",
    "is_ours",
    "is_pending",
    "owner_pod_uid",
    "pod_claims",
    "pod_key",
    "pod_uid",
    "reserved_for_pod",
]
