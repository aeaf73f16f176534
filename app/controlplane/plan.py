"""Decisions of the classic DRA protocol (control-plane controller). Pure, on v1-shaped JSON.

Sources: DRA-REFERENCE.md "Classic DRA"; Kubernetes 1.31 ``k8s.io/api/resource/v1alpha3``
(ResourceClaimSpec.Controller, AllocationResult.Controller, ResourceClaimStatus.
DeallocationRequested, PodSchedulingContext, ResourceClaimSchedulingStatus: "Name matches the
pod.spec.resourceClaims[*].Name field"), ``k8s.io/dynamic-resource-allocation/controller``
v1.31 (``syncPodSchedulingContexts``: only unallocated claims are answered, entries of other
claims are kept, a list is capped at ``PodSchedulingNodeListMaxSize`` = 128; ``syncClaim``:
deallocate when the claim is being deleted or ``deallocationRequested`` is set and nothing is
in ``reservedFor``, then clear ``allocation`` and ``deallocationRequested`` together, then
remove the finalizer).

Claims come in the v1 shape (``app.kube.versions.claim_from_wire``), with ``spec.controller``
and ``status.deallocationRequested`` passed through untouched.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from app.allocator import Allocator, Claim, DeviceClass, Node, Pool
from app.allocator.model import DeviceId
from app.claims.model import WantedDevice, wanted_devices
from app.jsontypes import JsonDict, json_copy
from app.reservations import HeldDevice

MAX_NODES = 128  # resourceapi.PodSchedulingNodeListMaxSize
Phase = Literal["gone", "foreign", "deallocate", "allocated", "pending", "deleting"]


def finalizer_name(driver_name: str) -> str:
    """Our finalizer on claims we allocate: ``<driver>/deletion-protection``."""
    return f"{driver_name}/deletion-protection"


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One ``pod.spec.resourceClaims[]`` entry.

    Attributes:
        name: the entry's name (what ``status.resourceClaims[].name`` of the scheduling
            context refers to).
        claim_name: the ResourceClaim's name: ``resourceClaimName``, or for a template the
            name the claim controller recorded in ``pod.status.resourceClaimStatuses``; None
            while that is not known yet.
    """

    name: str
    claim_name: str | None


def pod_claims(pod: Mapping[str, Any]) -> list[PodClaim]:
    """The pod's claims, in ``spec.resourceClaims`` order (Kubernetes 1.31 core/v1
    PodResourceClaim and PodResourceClaimStatus)."""
    statuses = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    out = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if not isinstance(entry, Mapping) or not entry.get("name"):
            continue
        name = str(entry["name"])
        claim_name = entry.get("resourceClaimName") or (
            statuses.get(name) if entry.get("resourceClaimTemplateName") else None
        )
        out.append(PodClaim(name, str(claim_name) if claim_name else None))
    return out


_POD_METADATA = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")


def pod_view(pod: JsonDict) -> JsonDict:
    """``pod`` (a core/v1 Pod as a JSON dict) cut down to what the controller reads of it:
    its name, namespace, uid, resourceVersion and deletionTimestamp, ``spec.nodeName`` and
    ``spec.resourceClaims``, and ``status.resourceClaimStatuses`` (:func:`pod_claims`).

    The pod informer's converter: it holds every pod of the cluster, and a pod's containers,
    volumes and status are most of its size. Returns a new dict; ``pod`` is not changed.
    Never raises: a ``metadata``, ``spec`` or ``status`` that is not an object is left out.
    """
    view: JsonDict = {}
    metadata = pod.get("metadata")
    if isinstance(metadata, dict):
        view["metadata"] = {k: metadata[k] for k in _POD_METADATA if k in metadata}
    spec = pod.get("spec")
    if isinstance(spec, dict):
        view["spec"] = {k: spec[k] for k in ("nodeName", "resourceClaims") if k in spec}
    status = pod.get("status")
    if isinstance(status, dict) and "resourceClaimStatuses" in status:
        view["status"] = {"resourceClaimStatuses": status["resourceClaimStatuses"]}
    return view


def same_pod_view(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when two versions of a pod (as :func:`pod_view` left them) differ in nothing the
    controller reads: only their resourceVersion (or nothing) changed."""
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    return (
        old.get("spec") == new.get("spec")
        and old.get("status") == new.get("status")
        and all(old_meta.get(k) == new_meta.get(k) for k in _POD_METADATA if k != "resourceVersion")
    )


def is_ours(claim: Mapping[str, Any], driver_name: str) -> bool:
    """True when ``spec.controller`` names our driver (we allocate it)."""
    return (claim.get("spec") or {}).get("controller") == driver_name


def allocation_of(claim: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``status.allocation``, or None."""
    allocation = (claim.get("status") or {}).get("allocation")
    return allocation if isinstance(allocation, Mapping) else None


def being_deleted(obj: Mapping[str, Any]) -> bool:
    """True when ``metadata.deletionTimestamp`` is set."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def reserved_for(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """``status.reservedFor`` entries."""
    return [
        r for r in (claim.get("status") or {}).get("reservedFor") or [] if isinstance(r, Mapping)
    ]


def claim_phase(claim: Mapping[str, Any] | None, driver_name: str) -> Phase:
    """Where a claim stands for us.

    * ``gone``: no claim (deleted, or never seen);
    * ``foreign``: another controller allocates it, or none does (structured parameters);
    * ``deallocate``: being deleted or ``deallocationRequested``, and ``reservedFor`` empty;
    * ``deleting``: being deleted while still reserved (wait for the consumers to go);
    * ``allocated``: allocated (by us), in use or about to be;
    * ``pending``: ours, not allocated: allocation happens when a pod's scheduling context
      selects a node.
    """
    if claim is None:
        return "gone"
    if not is_ours(claim, driver_name):
        return "foreign"
    status = claim.get("status") or {}
    if (being_deleted(claim) or status.get("deallocationRequested")) and not reserved_for(claim):
        return "deallocate"
    if being_deleted(claim):
        return "deleting"
    return "allocated" if allocation_of(claim) is not None else "pending"


def needs_status_clear(claim: Mapping[str, Any]) -> bool:
    """True when ``allocation`` or ``deallocationRequested`` is still set (deallocate step 2)."""
    status = claim.get("status") or {}
    return allocation_of(claim) is not None or bool(status.get("deallocationRequested"))


def cleared_status(claim: Mapping[str, Any]) -> JsonDict:
    """The claim with ``allocation`` and ``deallocationRequested`` cleared in one status
    (``reservedFor`` is empty by then; ``devices`` entries must name allocated devices, so
    they go too)."""
    result = json_copy(dict(claim))
    status = dict(result.get("status") or {})
    for key in ("allocation", "deallocationRequested", "devices", "reservedFor"):
        status.pop(key, None)
    result["status"] = status
    return result


def node_selector_for(node_name: str) -> JsonDict:
    """A NodeSelector naming one node (``matchFields`` ``metadata.name`` In)."""
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
        ]
    }


def allocated_status(
    claim: Mapping[str, Any],
    allocation: Mapping[str, Any],
    driver_name: str,
    consumer: Mapping[str, str],
    node_name: str,
) -> JsonDict:
    """The claim with ``status.allocation`` (``controller`` set to our driver) and the pod in
    ``reservedFor``, to be written in one status update (a new dict; ``claim`` is not
    changed).

    The allocation's ``nodeSelector`` names ``node_name``: the devices are attached to that
    node's fabric host, so they are usable there only, whatever the pool's selector says
    (the rule for node-local devices in DRA-REFERENCE.md "Classic DRA").

    Args:
        allocation: the allocator's ``status.allocation`` JSON.
        consumer: ``{"resource": "pods", "name": ..., "uid": ...}``.
        node_name: the selected node.
    """
    # A new top level and status; the rest is shared with ``claim`` (it is sent, not changed).
    result = dict(claim)
    status = dict(result.get("status") or {})
    status["allocation"] = {
        **json_copy(dict(allocation)),
        "nodeSelector": node_selector_for(node_name),
        "controller": driver_name,
    }
    consumers = [dict(r) for r in reserved_for(claim) if r.get("uid") != consumer.get("uid")]
    status["reservedFor"] = [*consumers, dict(consumer)]
    status.pop("deallocationRequested", None)
    result["status"] = status
    return result


def add_finalizer_patch(claim: Mapping[str, Any], finalizer: str) -> list[JsonDict] | None:
    """A JSON patch adding ``finalizer`` to ``claim``, guarded by a ``test`` of the current
    list (or of the resourceVersion when there is none); None when it is already there.

    Never used on a claim being deleted: the API server refuses new finalizers then.
    """
    metadata = claim.get("metadata") or {}
    current = list(metadata.get("finalizers") or [])
    if finalizer in current:
        return None
    if current:
        return [
            {"op": "test", "path": "/metadata/finalizers", "value": current},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ]
    return [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": metadata.get("resourceVersion"),
        },
        {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
    ]


def remove_finalizer_patch(claim: Mapping[str, Any], finalizer: str) -> list[JsonDict] | None:
    """A JSON patch removing ``finalizer``, guarded by a ``test`` of the whole list (a
    strategic merge would keep it); None when it is not there."""
    current = list((claim.get("metadata") or {}).get("finalizers") or [])
    if finalizer not in current:
        return None
    return [
        {"op": "test", "path": "/metadata/finalizers", "value": current},
        {"op": "remove", "path": f"/metadata/finalizers/{current.index(finalizer)}"},
    ]


def claim_devices(claim: Mapping[str, Any], driver_name: str) -> frozenset[DeviceId]:
    """(driver, pool, device) of our devices allocated to ``claim``, leaving out admin-access
    results (they do not make a device unavailable: KEP-4381 adminAccess)."""
    return allocation_devices(allocation_of(claim) or {}, driver_name)


def allocation_devices(allocation: Mapping[str, Any], driver_name: str) -> frozenset[DeviceId]:
    """(driver, pool, device) of our devices in an allocation result
    (``status.allocation``), leaving out admin-access results, as :func:`claim_devices`."""
    results = (allocation.get("devices") or {}).get("results") or []
    return frozenset(
        (driver_name, str(result.get("pool")), str(result.get("device")))
        for result in results
        if isinstance(result, Mapping)
        and result.get("driver") == driver_name
        and not result.get("adminAccess")
    )


def devices_in_use(
    claims: Iterable[Mapping[str, Any]],
    held: Iterable[HeldDevice],
    driver_name: str,
    exclude_uids: Collection[str] = (),
) -> set[DeviceId]:
    """(driver, pool, device) of our devices allocated to a claim (:func:`claim_devices`) or
    held in the journal by any mode (``held``: :meth:`app.journal.Journal.held`), leaving out
    what the claims in ``exclude_uids`` hold (they are being allocated now; their own
    leftovers are replaced). The rule :class:`InUse` keeps current incrementally."""
    used: set[DeviceId] = set()
    for claim in claims:
        if (claim.get("metadata") or {}).get("uid") not in exclude_uids:
            used.update(claim_devices(claim, driver_name))
    for device in held:
        if device.claim_uid not in exclude_uids:
            used.add((driver_name, device.pool, device.device_name))
    return used


class InUse:
    """Our devices in use, kept current as claims and the journal change, so that answering a
    scheduling context does not go over every allocation in the cluster again.

    A device is in use while an allocated claim holds it (:func:`claim_devices`; admin
    access does not count), an active exclusive reservation of the journal holds it, for any
    mode, or a decision of this process chose it and its reservation is being written
    (:meth:`hold_pending`). Each pool has a version that changes whenever one of its devices
    becomes held or stops being held by anyone (not when a held device only gains or loses a
    holder: the pending hold, the journal's and the allocation's follow one another on the
    same device). With the devices only the claims left out of a question hold, the version
    identifies the pool's in-use devices exactly (:meth:`pool_key`), for
    :class:`NodeAnswers`.
    """

    def __init__(self) -> None:
        self._claims: dict[str, frozenset[DeviceId]] = {}
        self._journal: dict[str, frozenset[DeviceId]] = {}
        # Devices decided but not yet in the journal's part (hold_pending): a part of their
        # own, which set_held, hold and release never touch.
        self._pending: dict[str, frozenset[DeviceId]] = {}
        self._holders: dict[DeviceId, dict[str, int]] = {}
        self._versions: dict[str, int] = {}
        # By pool name, the devices anyone holds (what _holders holds, grouped by pool).
        self._held_per_pool: dict[str, set[DeviceId]] = {}

    def set_claim(self, uid: str, devices: frozenset[DeviceId]) -> None:
        """What claim ``uid`` is allocated now (empty when nothing, or gone)."""
        self._replace(self._claims, uid, devices)

    def set_held(self, held: Iterable[HeldDevice], driver_name: str) -> None:
        """Replace the journal's part with ``held`` (all of it, as just read)."""
        grouped: dict[str, set[DeviceId]] = {}
        for device in held:
            grouped.setdefault(device.claim_uid, set()).add(
                (driver_name, device.pool, device.device_name)
            )
        for uid in [u for u in self._journal if u not in grouped]:
            self._replace(self._journal, uid, frozenset())
        for uid, devices in grouped.items():
            self._replace(self._journal, uid, frozenset(devices))

    def hold(self, device: HeldDevice, driver_name: str) -> None:
        """One more device held in the journal."""
        current = self._journal.get(device.claim_uid, frozenset())
        self._replace(
            self._journal,
            device.claim_uid,
            current | {(driver_name, device.pool, device.device_name)},
        )

    def release(self, device: HeldDevice, driver_name: str) -> None:
        """A device no longer held in the journal for that claim."""
        current = self._journal.get(device.claim_uid, frozenset())
        self._replace(
            self._journal,
            device.claim_uid,
            current - {(driver_name, device.pool, device.device_name)},
        )

    def hold_pending(self, uid: str, devices: Iterable[DeviceId]) -> frozenset[DeviceId]:
        """Hold ``devices`` for claim ``uid`` now, before the journal write that reserves them,
        so that a decision made meanwhile sees them in use. They are a part of their own,
        which the journal's feed and full reads never change (a full read made before the
        write commits does not drop them); :meth:`drop_pending` ends them, once the journal
        or the claim's allocation holds the devices, or the write failed.

        Returns:
            the devices this call added to the claim's pending part.
        """
        current = self._pending.get(uid, frozenset())
        added = frozenset(devices) - current
        if added:
            self._replace(self._pending, uid, current | added)
        return added

    def drop_pending(self, uid: str, devices: frozenset[DeviceId] | None = None) -> None:
        """End the pending holds of ``uid`` (:meth:`hold_pending`): ``devices``, or all."""
        current = self._pending.get(uid, frozenset())
        kept = frozenset() if devices is None else current - devices
        if kept != current:
            self._replace(self._pending, uid, kept)

    def _replace(
        self, part: dict[str, frozenset[DeviceId]], uid: str, devices: frozenset[DeviceId]
    ) -> None:
        old = part.get(uid, frozenset())
        if old == devices:
            return
        if devices:
            part[uid] = devices
        else:
            part.pop(uid, None)
        for device in old - devices:
            holders = self._holders[device]
            holders[uid] -= 1
            if not holders[uid]:
                del holders[uid]
            if not holders:
                del self._holders[device]
                held = self._held_per_pool[device[1]]
                held.discard(device)
                if not held:
                    del self._held_per_pool[device[1]]
                self._bump(device[1])
        for device in devices - old:
            if device not in self._holders:
                self._held_per_pool.setdefault(device[1], set()).add(device)
                self._bump(device[1])
            holders = self._holders.setdefault(device, {})
            holders[uid] = holders.get(uid, 0) + 1

    def _bump(self, pool: str) -> None:
        self._versions[pool] = self._versions.get(pool, 0) + 1

    def view(self, exclude_uids: Collection[str] = ()) -> InUseView:
        """The devices in use, leaving out what ``exclude_uids`` hold (the claims being
        allocated now). Reflects later changes too: take it, use it, drop it."""
        return InUseView(self, frozenset(exclude_uids))

    def pool_key(self, pool: str, exclude_uids: frozenset[str]) -> tuple[Any, ...]:
        """A value that is the same for two questions only when the in-use devices of
        ``pool`` (with ``exclude_uids`` left out) are the same: the pool's version (its
        holders) and the devices only the left-out claims hold."""
        return (self._versions.get(pool, 0), self.freed(exclude_uids).get(pool, _NONE))

    def freed(self, exclude_uids: frozenset[str]) -> dict[str, frozenset[DeviceId]]:
        """By pool name, the devices that only claims of ``exclude_uids`` hold (one walk over
        those claims' devices, for every pool at once)."""
        by_pool: dict[str, set[DeviceId]] = {}
        for uid in exclude_uids:
            for part in (self._claims, self._journal, self._pending):
                for d in part.get(uid, ()):
                    if all(h in exclude_uids for h in self._holders.get(d, ())):
                        by_pool.setdefault(d[1], set()).add(d)
        return {pool: frozenset(devices) for pool, devices in by_pool.items()}

    def pool_held(self, pool: str) -> bool:
        """Whether any claim holds a device of ``pool``."""
        return pool in self._held_per_pool

    def holders(self, device: DeviceId) -> frozenset[str]:
        """The uids of the claims holding ``device``."""
        return frozenset(self._holders.get(device, ()))


class InUseView(Collection[DeviceId]):
    """The devices of an :class:`InUse` in use by claims other than some (see
    :meth:`InUse.view`); what the allocator takes as ``in_use``."""

    def __init__(self, index: InUse, exclude_uids: frozenset[str]) -> None:
        self.index = index
        self.exclude_uids = exclude_uids

    def __contains__(self, device: object) -> bool:
        holders = self.index._holders.get(device)  # type: ignore[call-overload]
        if not holders:
            return False
        return not self.exclude_uids or not holders.keys() <= self.exclude_uids

    def __iter__(self) -> Iterator[DeviceId]:
        return (d for d in list(self.index._holders) if d in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def pool_key(self, pool: str) -> tuple[Any, ...]:
        """See :meth:`InUse.pool_key`."""
        return self.index.pool_key(pool, self.exclude_uids)

    def may_hold_pool(self, driver: str, pool: str) -> bool:
        """False when no device of ``pool`` is in use (for the allocator: its devices need
        no check one by one). True may still mean none, when only left-out claims hold
        some. Every device of an :class:`InUse` is of one driver, so ``driver`` is not
        looked at."""
        return self.index.pool_held(pool)

    def in_use_of_pool(self, driver: str, pool: str) -> Collection[DeviceId]:
        """The devices of ``pool`` in use (for the allocator: one set lookup per device
        instead of a method call). Without left-out claims it is the index's own set: read
        it at once, never keep or change it. ``driver`` is not looked at, as in
        :meth:`may_hold_pool`."""
        held = self.index._held_per_pool.get(pool, _NONE)
        if not self.exclude_uids or not held:
            return held
        # What the left-out claims alone hold is found from their own devices (few), not
        # by checking every held device of the pool.
        freed = self.index.freed(self.exclude_uids).get(pool)
        return held - freed if freed else held


class _PassView(InUseView):
    """An :class:`InUseView` for one synchronous pass (nothing changes what is in use
    meanwhile), with each pool's key worked out once (:meth:`pool_key`) and one cheap key per
    list of pools (:meth:`pools_key`) for :class:`NodeAnswers`."""

    def __init__(self, view: InUseView) -> None:
        super().__init__(view.index, view.exclude_uids)
        self._freed = view.index.freed(view.exclude_uids) if view.exclude_uids else {}
        self._lists: dict[int, tuple[Sequence[Pool], tuple[Any, ...]]] = {}

    def pool_key(self, pool: str) -> tuple[Any, ...]:
        return (self.index._versions.get(pool, 0), self._freed.get(pool, _NONE))

    def pools_key(self, usable: Sequence[Pool]) -> int | tuple[Any, ...]:
        """A value that is the same for two questions about the same list of pools (in one
        :class:`InUse`'s life) only when the devices in use in every one of them are the same.

        When the left-out claims hold no device alone (the usual question: a pod's claims
        before their allocation), it is the sum of the pools' versions, one C-level pass over
        the list: a pool's version only grows, by one on each change of its devices in use
        (:meth:`InUse._bump`), so over one list of pools the sum grows with every change of
        any of them, and two equal sums mean nothing changed in between. Otherwise it is the
        tuple of :meth:`pool_key` of each pool, in order (a tuple never equals an int)."""
        if not self._freed:
            return sum(map(self.index._versions.get, map(_POOL_NAME, usable), _ZEROS))
        known = self._lists.get(id(usable))
        if known is not None and known[0] is usable:
            return known[1]
        versions = self.index._versions
        freed = self._freed
        keys = tuple([(versions.get(p.name, 0), freed.get(p.name, _NONE)) for p in usable])
        self._lists[id(usable)] = (usable, keys)
        return keys


_POOL_NAME = operator.attrgetter("name")
_ZEROS = itertools.repeat(0)


@dataclass(frozen=True, slots=True)
class Pending:
    """One of the pod's claims we must allocate: its pod-level name and parsed claim."""

    pod_claim: str
    claim: Claim


class NodeAnswers:
    """Remembers whether a pod's claims fit on a node, for answering scheduling contexts.

    An answer depends only on the claims' requests and constraints, the node, the pools
    reaching it, the device classes, and which devices of those pools are in use. Open
    contexts are answered again after every allocation, for every potential node: with this
    memo only the nodes whose pools changed are worked out again (the pods of one workload
    share their claims' specs, so one pod's answers serve the next).

    The caller clears it when pools, classes or nodes change (:meth:`clear`); in-use devices
    are part of the key. At most ``max_entries`` answers are kept (all are dropped when full).
    """

    def __init__(self, max_entries: int = 50_000) -> None:
        self.max_entries = max_entries
        self._fits: dict[tuple[Any, ...], bool] = {}
        self._specs: dict[tuple[Any, ...], int] = {}
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        """Forget every answer (pools, classes or nodes changed)."""
        self._fits.clear()
        self._specs.clear()

    def __len__(self) -> int:
        return len(self._fits)

    def spec_key(self, claims: Sequence[Claim]) -> int:
        """A small number standing for the claims' requests and constraints (hashing those
        once per question instead of once per node)."""
        spec = tuple((c.requests, c.constraints) for c in claims)
        key = self._specs.get(spec)
        if key is None:
            if len(self._specs) >= self.max_entries:
                self.clear()
            key = self._specs[spec] = len(self._specs)
        return key

    def known(self, key: tuple[Any, ...]) -> bool | None:
        """The remembered answer for ``key`` (spec key, node name, pools key, as
        :meth:`fits` builds it), or None (nothing is counted then: :meth:`fits` follows)."""
        fits = self._fits.get(key)
        if fits is not None:
            self.hits += 1
        return fits

    def fits(
        self,
        allocator: Allocator,
        claims: Sequence[Claim],
        classes: Mapping[str, DeviceClass],
        usable: Sequence[Pool],
        in_use_by_pool: Mapping[str, frozenset[DeviceId]],
        in_use: Collection[DeviceId],
        node: Node,
        spec_key: int | None = None,
    ) -> bool:
        """True when ``claims`` can be allocated together on ``node`` (see
        :meth:`Allocator.allocate`), from memory when the same question was answered.
        ``spec_key``: :meth:`spec_key` of ``claims``, when the caller has it."""
        if isinstance(in_use, _PassView):
            pools_key: int | tuple[Any, ...] = in_use.pools_key(usable)
        elif isinstance(in_use, InUseView):
            pools_key = tuple(in_use.pool_key(p.name) for p in usable)
        else:
            pools_key = tuple(in_use_by_pool.get(p.name, _NONE) for p in usable)
        key = (self.spec_key(claims) if spec_key is None else spec_key, node.name, pools_key)
        known = self._fits.get(key)
        if known is not None:
            self.hits += 1
            return known
        self.misses += 1
        fits = allocator.allocate(claims, classes, usable, in_use, node).ok
        if len(self._fits) >= self.max_entries:
            self._fits.clear()
        self._fits[key] = fits
        return fits


_NONE: frozenset[DeviceId] = frozenset()


def in_use_by_pool(in_use: Iterable[DeviceId]) -> dict[str, frozenset[DeviceId]]:
    """``in_use`` grouped by pool name (a device id is (driver, pool, device))."""
    grouped: dict[str, set[DeviceId]] = {}
    for device_id in in_use:
        grouped.setdefault(device_id[1], set()).add(device_id)
    return {pool: frozenset(ids) for pool, ids in grouped.items()}


def answer_nodes(potential: Sequence[str], selected: str) -> list[str]:
    """The nodes a PodSchedulingContext's answer covers: ``potentialNodes``, and the
    ``selectedNode`` first when it is not among them, at most :data:`MAX_NODES`.

    The scheduler may select a node it did not list (it lists at most 128 of many). If that
    node cannot serve the claims and the answer never names it, the scheduler waits for an
    answer about it forever; naming it as unsuitable lets it choose again.
    """
    nodes = list(potential)
    if selected and selected not in nodes:
        nodes.insert(0, selected)
    return nodes[:MAX_NODES]


def unsuitable_nodes(
    allocator: Allocator,
    pending: Sequence[Pending],
    classes: Mapping[str, DeviceClass],
    pools: Sequence[Pool],
    in_use: Collection[DeviceId],
    potential: Sequence[str],
    nodes: Mapping[str, Node],
    hosts: Collection[str],
    reachable: Mapping[str, Sequence[Pool]] | None = None,
    answers: NodeAnswers | None = None,
) -> dict[str, list[str]]:
    """For each pending claim (by pod-level name), the potential nodes it cannot get devices
    on, in ``potential`` order, at most 128.

    A node is unsuitable for every pending claim when the node is unknown, maps to no fabric
    host (``hosts`` holds the nodes that do), or the claims cannot be allocated there together
    (all of the pod's claims of our driver on that node, against ``in_use``). Listing every
    claim is what the upstream helper does for a joint failure: the scheduler skips a node
    that any claim lists. ``reachable`` (node name -> the pools reaching it, in allocation
    order) saves the allocator from checking every pool's reach again on each call;
    ``answers`` remembers answers across calls (see :class:`NodeAnswers`).
    """
    claims = [p.claim for p in pending]
    if isinstance(in_use, InUseView):
        in_use = _PassView(in_use)  # no await below: what is in use cannot change meanwhile
    grouped = (
        in_use_by_pool(in_use) if answers is not None and not isinstance(in_use, InUseView) else {}
    )
    spec_key = answers.spec_key(claims) if answers is not None else None
    # One synchronous pass with a memo: look each node's answer up here, and call fits()
    # (which works the same key out again) only for what is not remembered.
    one_pass = in_use if answers is not None and isinstance(in_use, _PassView) else None
    failed: list[str] = []
    for node_name in potential[:MAX_NODES]:
        node = nodes.get(node_name)
        if node is None or node_name not in hosts:
            failed.append(node_name)
            continue
        usable = reachable.get(node_name, pools) if reachable is not None else pools
        if one_pass is not None and answers is not None:
            fits = answers.known((spec_key, node_name, one_pass.pools_key(usable)))
            if fits is not None:
                if not fits:
                    failed.append(node_name)
                continue
        if answers is not None:
            fits = answers.fits(allocator, claims, classes, usable, grouped, in_use, node, spec_key)
        else:
            fits = allocator.allocate(claims, classes, usable, in_use, node).ok
        if not fits:
            failed.append(node_name)
    return {p.pod_claim: list(failed) for p in pending}


def merged_claim_entries(
    existing: Sequence[Mapping[str, Any]],
    answers: Mapping[str, Sequence[str]],
) -> list[JsonDict]:
    """The new ``status.resourceClaims`` list: every existing entry kept (other drivers
    answer for their claims), ours replaced in place, new ones appended in ``answers`` order.
    Every answered claim gets an entry, also with no unsuitable node (the scheduler waits
    for one per claim). ``unsuitableNodes`` is left out when empty, as the API server
    serialises it."""
    out: list[JsonDict] = []
    seen: set[str] = set()
    for entry in existing:
        if not isinstance(entry, Mapping):
            continue
        name = str(entry.get("name"))
        if name in answers:
            out.append(_entry(name, answers[name]))
            seen.add(name)
        else:
            out.append(dict(entry))
    for name, nodes in answers.items():
        if name not in seen:
            out.append(_entry(name, nodes))
    return out


def _entry(name: str, nodes: Sequence[str]) -> JsonDict:
    entry: JsonDict = {"name": name}
    if nodes:
        entry["unsuitableNodes"] = list(nodes)[:MAX_NODES]
    return entry


def same_claim_entries(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """True when two ``status.resourceClaims`` lists say the same (an absent and an empty
    ``unsuitableNodes`` are equal)."""

    def norm(entries: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
        return [(str(e.get("name")), list(e.get("unsuitableNodes") or [])) for e in entries]

    return norm(a) == norm(b)


def wanted_results(claim: Mapping[str, Any], driver_name: str) -> tuple[WantedDevice, ...]:
    """Our driver's allocation results of an allocated claim."""
    return tuple(wanted_devices(claim, driver_name))


def consumer_ref(pod: Mapping[str, Any]) -> dict[str, str]:
    """The ``reservedFor`` entry of a pod."""
    metadata = pod.get("metadata") or {}
    return {"resource": "pods", "name": str(metadata.get("name")), "uid": str(metadata.get("uid"))}


def chosen_devices(allocation: Mapping[str, Any], driver_name: str) -> list[WantedDevice]:
    """Our (request, pool, device) results in an allocation, in result order."""
    results = (allocation.get("devices") or {}).get("results") or []
    return [
        WantedDevice(str(r.get("request")), str(r.get("pool")), str(r.get("device")))
        for r in results
        if isinstance(r, Mapping) and r.get("driver") == driver_name
    ]


__all__ = [
    "MAX_NODES",
    "InUse",
    "InUseView",
    "NodeAnswers",
    "Pending",
    "PodClaim",
    "add_finalizer_patch",
    "allocated_status",
    "allocation_devices",
    "allocation_of",
    "answer_nodes",
    "being_deleted",
    "chosen_devices",
    "claim_devices",
    "claim_phase",
    "cleared_status",
    "consumer_ref",
    "devices_in_use",
    "finalizer_name",
    "in_use_by_pool",
    "is_ours",
    "merged_claim_entries",
    "needs_status_clear",
    "node_selector_for",
    "pod_claims",
    "pod_view",
    "remove_finalizer_patch",
    "reserved_for",
    "same_claim_entries",
    "same_pod_view",
    "unsuitable_nodes",
    "wanted_results",
]
