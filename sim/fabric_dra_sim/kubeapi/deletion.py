"""What a DELETE does to one object: preconditions, graceful deletion, finalizers.

Pure: takes the stored object, the DeleteOptions and the time, and returns a
:class:`DeletePlan` that :meth:`Api.delete <.operations.Api.delete>` carries out.

Rules from k8s.io/apiserver pkg/registry/rest/delete.go (BeforeDelete) and
pkg/registry/generic/registry/store.go (Delete, updateForGracefulDeletionAndFinalizers,
markAsDeleting, ShouldDeleteDuringUpdate), with the Pod strategy's grace period
(k8s.io/kubernetes pkg/registry/core/pod/strategy.go CheckGracefulDelete). Pods are the only
served kind with a graceful delete strategy.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from app.jsontypes import json_copy

from .errors import conflict

# k8s.io/kubernetes pkg/apis/core/v1 defaults.go: SetDefaults_PodSpec.
DEFAULT_TERMINATION_GRACE_PERIOD_S = 30
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class DeletePlan:
    """The outcome of a DELETE.

    ``obj``: the object the answer shows (marked for deletion when it stays); ``write``: the
    marked object is stored first (a MODIFIED event); ``remove``: the object leaves storage
    now; ``kubelet``: a pod was marked for graceful deletion, which its kubelet finishes.
    Nothing written and nothing removed means a deletion already pending, answered with
    the object as it is.
    """

    obj: dict[str, Any]
    write: bool
    remove: bool
    kubelet: bool = False


def _parse(value: str) -> datetime.datetime:
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return datetime.datetime.now(datetime.UTC)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def _format(moment: datetime.datetime) -> str:
    return moment.strftime(_TIME_FORMAT)


def check_preconditions(
    group: str, kind: str, obj: dict[str, Any], options: dict[str, Any]
) -> None:
    """Raise StatusError 409 when ``options.preconditions`` (uid, resourceVersion) do not match
    ``obj`` (rest.BeforeDelete; the conflict names the kind, not the resource).
    """
    found = options.get("preconditions")
    # The HTTP layer refuses a non-object (options.delete_options); direct callers' are ignored.
    preconditions: dict[str, Any] = found if isinstance(found, dict) else {}
    meta = obj["metadata"]
    uid = preconditions.get("uid")
    if uid is not None and uid != meta.get("uid"):
        raise conflict(
            group,
            kind,
            meta["name"],
            f"the UID in the precondition ({uid}) does not match the UID in record "
            f"({meta.get('uid')}). The object might have been deleted and then "
            "recreated",
        )
    version = preconditions.get("resourceVersion")
    if version is not None and version != meta.get("resourceVersion"):
        raise conflict(
            group,
            kind,
            meta["name"],
            f"the ResourceVersion in the precondition ({version}) does not match "
            f"the ResourceVersion in record ({meta.get('resourceVersion')}). The "
            "object might have been modified",
        )


def pod_grace_period(pod: dict[str, Any], requested: int | None) -> int:
    """The grace period of a pod's deletion: the request's, else
    spec.terminationGracePeriodSeconds (30 by default); 0 for a pod on no node or one that has
    terminated (CheckGracefulDelete).
    """
    spec = pod.get("spec") or {}
    if requested is not None:
        period = requested
    else:
        configured = spec.get("terminationGracePeriodSeconds")
        period = DEFAULT_TERMINATION_GRACE_PERIOD_S if configured is None else int(configured)
    if not spec.get("nodeName"):
        period = 0
    if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
        period = 0
    return max(period, 1) if period < 0 else period


def _bump_generation(meta: dict[str, Any]) -> None:
    if int(meta.get("generation") or 0) > 0:
        meta["generation"] = int(meta["generation"]) + 1


def plan_delete(
    old: dict[str, Any], options: dict[str, Any], *, graceful: bool, now: datetime.datetime
) -> DeletePlan:
    """Plan the DELETE of ``old`` with DeleteOptions ``options`` at ``now`` (aware UTC).

    ``graceful``: the kind has a graceful delete strategy (Pods). A kept object gets
    ``deletionTimestamp`` (now, or now + the grace period) and
    ``deletionGracePeriodSeconds``; the first mark bumps a set ``metadata.generation``.
    """
    if not graceful and not (old.get("metadata") or {}).get("finalizers"):
        # Removed at once, unchanged (the most common delete): one copy, for the answer.
        return DeletePlan(json_copy(old), write=False, remove=True)
    new = json_copy(old)
    meta = new["metadata"]
    requested = options.get("gracePeriodSeconds")
    if requested is not None and requested < 0:
        # Negative values mean one second on the delete path.
        requested = 1
    current = meta.get("deletionGracePeriodSeconds")
    if current is not None and current < 0:
        meta["deletionGracePeriodSeconds"] = current = 1
    is_graceful = False
    period = 0
    if graceful:
        stamp = meta.get("deletionTimestamp")
        if stamp:
            if current:
                if requested is None or requested >= current:
                    # Already terminating: only a shorter grace period changes anything.
                    return DeletePlan(json_copy(old), write=False, remove=False)
                shortened = _parse(stamp) - datetime.timedelta(seconds=current - requested)
                meta["deletionTimestamp"] = _format(shortened)
                meta["deletionGracePeriodSeconds"] = period = requested
                is_graceful = True
        else:
            period = pod_grace_period(old, requested)
            meta["deletionTimestamp"] = _format(now + datetime.timedelta(seconds=period))
            meta["deletionGracePeriodSeconds"] = period
            _bump_generation(meta)
            is_graceful = True
    finalizers = bool(meta.get("finalizers"))
    if not is_graceful:
        if not finalizers:
            return DeletePlan(json_copy(old), write=False, remove=True)
        # markAsDeleting: the finalizers' owners see the timestamp and finish the deletion.
        stamp = meta.get("deletionTimestamp")
        if not stamp:
            _bump_generation(meta)
        if not stamp or _parse(stamp) > now:
            meta["deletionTimestamp"] = _format(now)
        meta["deletionGracePeriodSeconds"] = 0
        return DeletePlan(new, write=new != old, remove=False)
    if finalizers or period > 0:
        return DeletePlan(new, write=True, remove=False, kubelet=period > 0)
    # A grace period of 0 without finalizers: the mark is stored, then the object goes.
    return DeletePlan(new, write=True, remove=True)


def should_delete_during_update(old_meta: dict[str, Any], new_meta: dict[str, Any]) -> bool:
    """True when an update removes the object: the last finalizer is gone from an object being
    deleted whose grace period is over (store.go ShouldDeleteDuringUpdate). A terminating pod
    with a grace period left stays until its kubelet deletes it.
    """
    if new_meta.get("finalizers") or not old_meta.get("deletionTimestamp"):
        return False
    return not old_meta.get("deletionGracePeriodSeconds")
