"""The scheduler stand-in for structured parameters: what kube-scheduler's DRA plugin does with
ResourceClaims, for tests and the demo (with the claim controller stand-in beside it).

Scheduling one pod (k8s.io/kubernetes pkg/scheduler/framework/plugins/dynamicresources, with
KEP-5007 binding conditions; DRA-REFERENCE.md "Who writes what", "Binding conditions"):

1. A claim made from a template is waited for until the claim controller
   (:mod:`fabric_dra_sim.scheduler.claim_controller`) has recorded it in the pod status.
2. Filter: candidate nodes (not unschedulable, by name) are tried in order; a node must
   satisfy the node selector of every claim that is already allocated, and
   :class:`app.allocator.Allocator` must find devices for the others from complete pools,
   leaving out devices allocated to other claims and devices that failed here a moment ago.
3. PreBind: for each claim, the finalizer ``resource.kubernetes.io/delete-protection`` is
   added (an update of the claim), then ONE status update writes ``allocation`` (results
   with the devices' binding conditions, config, node selector, ``allocationTimestamp``)
   and the pod in ``reservedFor``. The stand-in then polls every ``poll_interval_s`` until
   every binding condition of every result is True on the matching ``status.devices[]``
   entry, and binds the pod (``pods/binding``).
4. A True binding-failure condition, or ``allocationTimestamp + binding_timeout_s`` passing,
   fails the bind: each claim loses the pod from ``reservedFor`` and, with no consumer left,
   its allocation (one status update each); the pod is tried again after
   ``retry_interval_s`` and the failed devices are avoided for ``failed_device_memory_s``.

The allocation is what the release of the API server's ``/version`` writes: before 1.35 the
allocator did not copy a request's tolerations into its results (k8s.io/dynamic-resource-
allocation structured/internal/*/allocator_*.go ``Allocate``, 1.35), so the stand-in of an
older release leaves them out (:func:`for_release`).

Unless ``claim_controller`` is off in the settings, the stand-in starts a
:class:`fabric_dra_sim.scheduler.claim_controller.ClaimController` with it: template claims,
releasing consumers that are gone, deallocation and deleting unused template claims are its
work.

Like kube-scheduler's assume cache, claims this stand-in wrote are used in their written
form until the informer has caught up (resourceVersions compared as integers, as the assume
cache does). Conflicts re-read and retry, a 404 ends the write quietly, and an object the
stand-in cannot make sense of is logged and skipped.

Differences from kube-scheduler, on purpose: one pod is scheduled at a time and only DRA is
considered (no resources, affinity, taints of nodes); a pod that fits nowhere is retried
every ``retry_interval_s`` and on changes of slices, classes, nodes or its claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kubernetes_asyncio.client import CoreV1Api, VersionApi

from app.allocator import (
    Allocator,
    SpecError,
    claim_from_object,
    device_class_from_json,
    node_from_json,
)
from app.allocator.model import DeviceId
from app.allocator.pools import gather_pools, selector_matches
from app.clock import utcnow
from app.jsontypes import JsonDict, json_copy
from app.kube.client import KubeClient, call_json
from app.kube.errors import KubeConflict, KubeError, KubeNotFound
from app.kube.informer import Informer, InformerSettings
from app.kube.versions import (
    ResourceApiVersion,
    claim_from_wire,
    claim_to_wire,
    device_class_from_wire,
    resource_api,
    slice_from_wire,
)
from app.kube.workqueue import ShutDown, WorkQueue, WorkQueueSettings
from fabric_dra_sim.scheduler.claim_controller import ClaimController, ClaimControllerSettings
from fabric_dra_sim.scheduler.common import (
    DEFAULT_SCHEDULER,
    DELETE_PROTECTION,
    bind_pod,
    candidate_nodes,
    consumer_entry,
    is_pending,
    owner_pod_uid,
    pod_claims,
    pod_key,
    pod_uid,
    reserved_for_pod,
)

log = logging.getLogger(__name__)
Key = tuple[str, str]
QueueKey = tuple[str, str, str]  # ("pod", namespace, name)

STATUS_WRITE_ATTEMPTS = 4
MAX_DELETED_REMEMBERED = 1000


def rfc3339(moment: dt.datetime) -> str:
    """``moment`` in UTC as RFC 3339 with whole seconds (metav1.Time)."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> dt.datetime | None:
    """An RFC 3339 time as an aware datetime, or None when missing or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


# --------------------------------------------------------------------------- pure parts
@dataclass(frozen=True)
class StructuredSettings:
    """Settings of :class:`StructuredScheduler`.

    Attributes:
        namespace: watch pods and claims of this namespace only; None for all. With a
            namespace, devices allocated to claims of other namespaces are not seen: use it
            only where no other namespace allocates from the same pools.
        scheduler_name: pods whose ``spec.schedulerName`` is this (or empty) are scheduled.
        poll_interval_s: PreBind polls the binding conditions this often, seconds (> 0;
            kube-scheduler: 5).
        binding_timeout_s: a bind fails when the conditions are not all True this long after
            ``allocationTimestamp``, seconds (> 0; kube-scheduler: 600).
        retry_interval_s: a pod that fits nowhere, or whose bind failed, is tried again after
            this, seconds (> 0), or earlier when something it depends on changes.
        failed_device_memory_s: devices of a failed bind are not chosen again for this long,
            seconds (>= 0), so that the stand-in does not take the same device back before
            the driver has tainted or withdrawn it.
        informer: base settings of the informers (name and namespace are replaced).
        queue: rate limits of the work queue (backoff after errors).
        claim_controller: also run the claim controller stand-in (for the same namespace);
            off where one runs already.
    """

    namespace: str | None = None
    scheduler_name: str = DEFAULT_SCHEDULER
    poll_interval_s: float = 5.0
    binding_timeout_s: float = 600.0
    retry_interval_s: float = 5.0
    failed_device_memory_s: float = 60.0
    informer: InformerSettings = field(default_factory=lambda: InformerSettings(name="scheduler"))
    queue: WorkQueueSettings = field(
        default_factory=lambda: WorkQueueSettings(name="scheduler", max_delay_s=30.0)
    )
    claim_controller: bool = True

    def __post_init__(self) -> None:
        for name in ("poll_interval_s", "binding_timeout_s", "retry_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"scheduler: {name} must be > 0, got {getattr(self, name)}")
        if self.failed_device_memory_s < 0:
            raise ValueError("scheduler: failed_device_memory_s must be >= 0")


@dataclass
class SchedulerCounters:
    """What the stand-in has done (for tests and the demo).

    Attributes:
        allocations: claims it allocated.
        binds: pods it bound.
        failures: binds that failed (a failure condition or the binding timeout).
        unschedulable: scheduling attempts that found no node.
    """

    allocations: int = 0
    binds: int = 0
    failures: int = 0
    unschedulable: int = 0


@dataclass(frozen=True, slots=True)
class BindingVerdict:
    """Where a claim's binding conditions stand.

    Attributes:
        state: ``ready`` (every condition True, or none asked for), ``waiting`` or
            ``failed``.
        reason: for logs, when failed or waiting.
        devices: the devices behind a failure (a True failure condition, or still not ready
            at the timeout), or those still waiting.
    """

    state: Literal["ready", "waiting", "failed"]
    reason: str = ""
    devices: tuple[DeviceId, ...] = ()


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        r for r in (allocation.get("devices") or {}).get("results") or () if isinstance(r, Mapping)
    ]


def _device_id(entry: Mapping[str, Any]) -> DeviceId:
    return (
        str(entry.get("driver") or ""),
        str(entry.get("pool") or ""),
        str(entry.get("device") or ""),
    )


def binding_verdict(claim: Mapping[str, Any], now: dt.datetime, timeout_s: float) -> BindingVerdict:
    """Judge an allocated claim's binding conditions (KEP-5007, kube-scheduler PreBind).

    Every result with ``bindingConditions`` needs each of them True on the
    ``status.devices[]`` entry of the same (driver, pool, device); any of its
    ``bindingFailureConditions`` True fails it; so does ``now`` passing
    ``allocationTimestamp + timeout_s`` while a condition is not True (no timestamp, no
    timeout).
    """
    conditions: dict[DeviceId, dict[str, str]] = {}
    for entry in (claim.get("status") or {}).get("devices") or ():
        if isinstance(entry, Mapping):
            conditions[_device_id(entry)] = {
                str(c.get("type")): str(c.get("status"))
                for c in entry.get("conditions") or ()
                if isinstance(c, Mapping)
            }
    failed: list[DeviceId] = []
    failed_types: list[str] = []
    waiting: list[DeviceId] = []
    for result in _results(claim):
        device = _device_id(result)
        found = conditions.get(device, {})
        true_failures = [
            str(t)
            for t in result.get("bindingFailureConditions") or ()
            if found.get(str(t)) == "True"
        ]
        if true_failures:
            failed.append(device)
            failed_types.extend(true_failures)
        elif any(found.get(str(t)) != "True" for t in result.get("bindingConditions") or ()):
            waiting.append(device)
    if failed:
        names = ", ".join("/".join(d[1:]) for d in failed)
        return BindingVerdict(
            "failed",
            f"binding failure condition {', '.join(failed_types)} is True for device {names}",
            tuple(failed),
        )
    if not waiting:
        return BindingVerdict("ready")
    names = ", ".join("/".join(d[1:]) for d in waiting)
    allocated_at = parse_time(
        ((claim.get("status") or {}).get("allocation") or {}).get("allocationTimestamp")
    )
    if allocated_at is not None and now >= allocated_at + dt.timedelta(seconds=timeout_s):
        return BindingVerdict(
            "failed",
            f"binding conditions of device {names} not met within {timeout_s:g}s of the allocation",
            tuple(waiting),
        )
    return BindingVerdict(
        "waiting", f"waiting for the binding conditions of device {names}", tuple(waiting)
    )


def allocated_status(
    status: Mapping[str, Any],
    allocation: Mapping[str, Any] | None,
    pod: Mapping[str, Any],
    now: dt.datetime,
) -> JsonDict:
    """The claim status after the scheduler's one write: ``allocation`` (when given) with
    ``allocationTimestamp`` ``now``, and the pod added to ``reservedFor``."""
    new = json_copy(dict(status))
    if allocation is not None:
        new["allocation"] = {**json_copy(dict(allocation)), "allocationTimestamp": rfc3339(now)}
    reserved = [r for r in new.get("reservedFor") or () if isinstance(r, Mapping)]
    if not any(r.get("uid") == pod_uid(pod) for r in reserved):
        reserved.append(consumer_entry(pod))
    new["reservedFor"] = reserved
    return new


TOLERATIONS_IN_RESULTS_SINCE = 35
"""The first 1.x minor whose allocator copies a request's tolerations into its results."""


def server_minor(git_version: str) -> int | None:
    """The minor of a ``/version`` gitVersion (``"v1.34.2"`` -> 34), None when it has none."""
    match = re.match(r"v?1\.(\d+)", git_version.strip())
    return int(match.group(1)) if match else None


def for_release(allocation: Mapping[str, Any], minor: int | None) -> JsonDict:
    """``allocation`` as the scheduler of Kubernetes 1.``minor`` writes it: without the
    results' ``tolerations`` before 1.35 (an unknown minor is taken as current)."""
    out = json_copy(dict(allocation))
    if minor is None or minor >= TOLERATIONS_IN_RESULTS_SINCE:
        return out
    for result in (out.get("devices") or {}).get("results") or ():
        if isinstance(result, dict):
            result.pop("tolerations", None)
    return out


def without_consumers(status: Mapping[str, Any], uids: Iterable[str]) -> JsonDict | None:
    """The claim status with the consumers of ``uids`` removed from ``reservedFor``, and the
    allocation (with the drivers' ``devices``) cleared when no consumer is left; None when
    none of them is a consumer and the claim is not left allocated without one."""
    gone = set(uids)
    reserved = [r for r in status.get("reservedFor") or () if isinstance(r, Mapping)]
    kept = [r for r in reserved if r.get("uid") not in gone]
    if len(kept) == len(reserved) and (kept or not status.get("allocation")):
        return None
    new = json_copy(dict(status))
    if kept:
        new["reservedFor"] = kept
    else:
        for name in ("reservedFor", "allocation", "devices"):
            new.pop(name, None)
    return new


def devices_in_use(
    claims: Iterable[Mapping[str, Any]], exclude: Iterable[str] = ()
) -> set[DeviceId]:
    """(driver, pool, device) of every device allocated to a claim whose uid is not in
    ``exclude``; admin-access results do not hold a device."""
    skip = set(exclude)
    used: set[DeviceId] = set()
    for claim in claims:
        if str((claim.get("metadata") or {}).get("uid") or "") in skip:
            continue
        for result in _results(claim):
            if result.get("adminAccess") is not True:
                used.add(_device_id(result))
    return used


def node_fits(node: Mapping[str, Any], claims: Iterable[Mapping[str, Any]]) -> bool:
    """``node`` satisfies the allocation node selector of every allocated claim (a claim
    without one is available everywhere)."""
    value = node_from_json(node)
    for claim in claims:
        selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector")
        if selector and not selector_matches(selector, value):
            return False
    return True


def newer(cached: JsonDict | None, written: JsonDict | None) -> JsonDict | None:
    """The newer of an informer's object and one this process wrote, by resourceVersion
    compared as an integer (kube-scheduler's assume cache does the same); the cached one when
    either version is not an integer."""
    if written is None:
        return cached
    if cached is None:
        return written
    try:
        cached_rv = int((cached.get("metadata") or {}).get("resourceVersion") or "")
        written_rv = int((written.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:
        return cached
    return written if written_rv > cached_rv else cached


class FailedDevices:
    """Devices whose bind failed, remembered for ``memory_s`` seconds of ``now`` (monotonic)."""

    def __init__(self, memory_s: float, now: Callable[[], float] = time.monotonic) -> None:
        self.memory_s = memory_s
        self._now = now
        self._until: dict[DeviceId, float] = {}

    def remember(self, devices: Iterable[DeviceId]) -> None:
        """Avoid ``devices`` from now on for the memory span."""
        until = self._now() + self.memory_s
        for device in devices:
            self._until[device] = until

    def active(self) -> set[DeviceId]:
        """The devices still to avoid (forgotten ones are dropped)."""
        now = self._now()
        self._until = {d: t for d, t in self._until.items() if t > now}
        return set(self._until)


class _Retry(Exception):
    """Look at the key again after ``delay_s`` (a race or a missing object, not a bug)."""

    def __init__(self, message: str, delay_s: float) -> None:
        super().__init__(message)
        self.delay_s = delay_s


# --------------------------------------------------------------------------- the stand-in
class StructuredScheduler:
    """Schedules pods with structured ResourceClaims.

    Args:
        client: the Kubernetes client.
        version: the resource.k8s.io version to speak (v1, v1beta2 or v1beta1).
        settings: see :class:`StructuredSettings`.
        clock: aware UTC time (``allocationTimestamp``, the binding timeout).
        monotonic: seconds, for the failed-device memory.

    Use ``await start()`` (returns once the informers are synced and the worker runs) and
    ``await stop()``. Read :meth:`scheduled`, :attr:`counters`, :attr:`unschedulable` and
    :attr:`claim_controller` (None when the settings turn it off).
    """

    def __init__(
        self,
        client: KubeClient,
        version: ResourceApiVersion,
        settings: StructuredSettings | None = None,
        *,
        clock: Callable[[], dt.datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or StructuredSettings()
        self.version = version
        self.clock = clock
        self.resources = resource_api(client.api, version)
        self.core = CoreV1Api(client.api)
        self._version_api = VersionApi(client.api)
        self.kubernetes_minor: int | None = None
        namespace = self.settings.namespace

        def informer_settings(name: str, namespaced: bool) -> InformerSettings:
            return dataclasses.replace(
                self.settings.informer,
                name=f"scheduler-{name}",
                namespace=namespace if namespaced else None,
            )

        self.pods = Informer(
            self.core.list_namespaced_pod if namespace else self.core.list_pod_for_all_namespaces,
            informer_settings("pods", True),
        )
        self.claims = Informer(
            self.resources.list_namespaced_resource_claim
            if namespace
            else self.resources.list_resource_claim_for_all_namespaces,
            informer_settings("resourceclaims", True),
            converter=lambda obj: claim_from_wire(obj, version),
        )
        self.slices = Informer(
            self.resources.list_resource_slice,
            informer_settings("resourceslices", False),
            converter=lambda obj: slice_from_wire(obj, version),
        )
        self.classes = Informer(
            self.resources.list_device_class,
            informer_settings("deviceclasses", False),
            converter=lambda obj: device_class_from_wire(obj, version),
        )
        self.nodes = Informer(self.core.list_node, informer_settings("nodes", False))
        self.pods.add_handler(self._on_pod)
        self.claims.add_handler(self._on_claim)
        for informer in (self.slices, self.classes, self.nodes):
            informer.add_handler(self._on_cluster_change)
        self.queue: WorkQueue[QueueKey] = WorkQueue(self.settings.queue)
        self.allocator = Allocator()
        self.failed_devices = FailedDevices(self.settings.failed_device_memory_s, monotonic)
        self.counters = SchedulerCounters()
        self.unschedulable: dict[Key, str] = {}
        self._bound: dict[Key, str] = {}
        self._chosen: dict[Key, str] = {}
        self._pre_binding: set[Key] = set()
        self._written: dict[Key, JsonDict] = {}
        self._deleted_rv: dict[Key, int] = {}
        self._task: asyncio.Task[None] | None = None
        self.claim_controller = (
            ClaimController(
                client,
                version,
                ClaimControllerSettings(
                    namespace=namespace, informer=self.settings.informer, queue=self.settings.queue
                ),
                pods=self.pods,
                claims=self.claims,
            )
            if self.settings.claim_controller
            else None
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Read the server's release (``/version``), start the informers, wait until each has
        listed, then start the worker.

        Raises:
            KubeError: ``/version`` cannot be read.
        """
        info = await call_json(
            self._version_api.get_code(_preload_content=False), "read the API server's /version"
        )
        self.kubernetes_minor = server_minor(str(info.get("gitVersion") or ""))
        informers = (self.pods, self.claims, self.slices, self.classes, self.nodes)
        for informer in informers:
            informer.start()
        for informer in informers:
            await informer.has_synced.wait()
        if self.claim_controller is not None:
            await self.claim_controller.start()
        self._task = asyncio.create_task(self._worker(), name="scheduler-structured")

    async def stop(self) -> None:
        """Stop the worker and the informers. Idempotent."""
        self.queue.shutdown()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.claim_controller is not None:
            await self.claim_controller.stop()
        for informer in (self.pods, self.claims, self.slices, self.classes, self.nodes):
            await informer.stop()

    # ------------------------------------------------------------------ status API
    def scheduled(self, pod: str, namespace: str = "default") -> str | None:
        """The node this stand-in bound pod ``namespace/pod`` to, or None."""
        return self._bound.get((namespace, pod))

    # ------------------------------------------------------------------ events
    async def _on_pod(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        key = pod_key(obj)
        if event != "DELETED" and key not in self._pre_binding:
            self.queue.add(("pod", *key))

    async def _on_claim(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        key = pod_key(obj)
        rv = _rv(obj)
        written = self._written.get(key)
        if written is not None and (event == "DELETED" or _rv(written) <= rv):
            del self._written[key]
        if event == "DELETED":
            self._deleted_rv[key] = rv
            if len(self._deleted_rv) > MAX_DELETED_REMEMBERED:
                # Only needed until a write answer that crossed the deletion has come back.
                del self._deleted_rv[next(iter(self._deleted_rv))]
        else:
            self._deleted_rv.pop(key, None)
        # Pods waiting for this claim (to exist, or to be released by another pod) try again;
        # pods in PreBind only poll, as kube-scheduler's do.
        for pod in self.pods.objects():
            pkey = pod_key(pod)
            if (
                pkey[0] == key[0]
                and pkey not in self._pre_binding
                and is_pending(pod, self.settings.scheduler_name)
            ):
                self.queue.add(("pod", *pkey))

    async def _on_cluster_change(self, event: str, obj: JsonDict, old: JsonDict | None) -> None:
        for key in list(self.unschedulable):
            self.queue.add(("pod", *key))

    # ------------------------------------------------------------------ claims, assumed
    def _remember(self, claim: JsonDict) -> None:
        key = pod_key(claim)
        if self._deleted_rv.get(key, -1) >= _rv(claim):
            return
        self._written[key] = claim

    def _claim(self, namespace: str, name: str) -> JsonDict | None:
        key = (namespace, name)
        found = newer(self.claims.get(name, namespace), self._written.get(key))
        if found is not None and self._deleted_rv.get(key, -1) >= _rv(found):
            return None
        return found

    def _claims_in(self, namespace: str | None = None) -> list[JsonDict]:
        keys = {pod_key(c) for c in self.claims.objects()} | set(self._written)
        out = []
        for key in sorted(keys):
            if namespace is None or key[0] == namespace:
                claim = self._claim(*key)
                if claim is not None:
                    out.append(claim)
        return out

    async def _read_claim(self, namespace: str, name: str) -> JsonDict | None:
        try:
            claim = claim_from_wire(
                await call_json(
                    self.resources.read_namespaced_resource_claim(
                        name, namespace, _preload_content=False
                    ),
                    f"read ResourceClaim {namespace}/{name}",
                ),
                self.version,
            )
        except KubeNotFound:
            return None
        self._remember(claim)
        return claim

    # ------------------------------------------------------------------ worker
    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            try:
                delay = await self._sync_pod(key[1], key[2])
            except _Retry as retry:
                log.debug("%s %s/%s: %s", key[0], key[1], key[2], retry)
                self.queue.add_after(key, retry.delay_s)
            except Exception as err:
                # An odd object or a failing server must not stop the stand-in.
                log.warning(
                    "%s %s/%s: %s: %s",
                    key[0],
                    key[1],
                    key[2],
                    type(err).__name__,
                    err,
                    exc_info=not isinstance(err, KubeError),
                )
                self.queue.add_rate_limited(key)
            else:
                self.queue.forget(key)
                if delay is not None:
                    self.queue.add_after(key, delay)
            finally:
                self.queue.done(key)

    # ------------------------------------------------------------------ pods
    async def _sync_pod(self, namespace: str, name: str) -> float | None:
        """Schedule, pre-bind or bind one pod. Returns when to look again, or None."""
        key = (namespace, name)
        pod = self.pods.get(name, namespace)
        if pod is None or not is_pending(pod, self.settings.scheduler_name):
            self._forget_pod(key)
            return None
        claims = self._pod_claims(pod)
        uid = pod_uid(pod)
        if all(_allocation(c) and reserved_for_pod(c, uid) for c in claims):
            return await self._pre_bind(pod, claims)
        self._pre_binding.discard(key)
        return await self._schedule(pod, claims)

    def _forget_pod(self, key: Key) -> None:
        self._pre_binding.discard(key)
        self._chosen.pop(key, None)
        self.unschedulable.pop(key, None)

    def _pod_claims(self, pod: JsonDict) -> list[JsonDict]:
        namespace, _ = pod_key(pod)
        claims = []
        for pod_claim in pod_claims(pod):
            if pod_claim.claim_name is None:
                raise self._unschedulable(
                    pod, f"claim {pod_claim.name}: waiting for the claim from its template"
                )
            claim = self._claim(namespace, pod_claim.claim_name)
            if claim is None:
                raise self._unschedulable(
                    pod, f"waiting for ResourceClaim {namespace}/{pod_claim.claim_name}"
                )
            if (claim.get("metadata") or {}).get("deletionTimestamp"):
                raise self._unschedulable(
                    pod, f"ResourceClaim {namespace}/{pod_claim.claim_name} is being deleted"
                )
            if pod_claim.template_name and owner_pod_uid(claim) != pod_uid(pod):
                raise self._unschedulable(
                    pod,
                    f"ResourceClaim {namespace}/"
                    f"{pod_claim.claim_name} was not created for this pod",
                )
            claims.append(claim)
        return claims

    def _unschedulable(self, pod: Mapping[str, Any], reason: str) -> _Retry:
        key = pod_key(pod)
        if self.unschedulable.get(key) != reason:
            log.info("pod %s/%s: unschedulable: %s", *key, reason)
        self.unschedulable[key] = reason
        self.counters.unschedulable += 1
        return _Retry(reason, self.settings.retry_interval_s)

    async def _schedule(self, pod: JsonDict, claims: list[JsonDict]) -> float | None:
        """Filter nodes, allocate, and write each claim (finalizer, then status)."""
        key = pod_key(pod)
        allocated = [c for c in claims if _allocation(c)]
        pending = [c for c in claims if not _allocation(c)]
        try:
            wanted = [claim_from_object(c) for c in pending]
        except SpecError as err:
            raise self._unschedulable(pod, f"claim cannot be allocated: {err}") from err
        in_use = devices_in_use(self._claims_in(), exclude={_uid(c) for c in pending}) | (
            self.failed_devices.active()
        )
        pools = gather_pools(self.slices.objects())
        classes = {c.name: c for c in map(device_class_from_json, self.classes.objects())}
        chosen: tuple[str, Mapping[str, Mapping[str, Any]]] | None = None
        reasons: list[str] = []
        for node in candidate_nodes(self.nodes.objects()):
            node_name = str(node["metadata"]["name"])
            if not node_fits(node, allocated):
                reasons.append(f"{node_name}: an allocated claim does not reach it")
                continue
            if not wanted:
                chosen = (node_name, {})
                break
            outcome = self.allocator.allocate(wanted, classes, pools, in_use, node_from_json(node))
            if outcome.failure is None:
                chosen = (node_name, outcome.allocations)
                break
            reasons.append(f"{node_name}: {outcome.failure.message}")
        if chosen is None:
            raise self._unschedulable(
                pod, "no node fits: " + ("; ".join(reasons) or "no schedulable node")
            )
        node_name, allocations = chosen
        self.unschedulable.pop(key, None)
        written: list[JsonDict] = []
        try:
            for claim in claims:
                if reserved_for_pod(claim, pod_uid(pod)):
                    continue
                allocation = (
                    None
                    if _allocation(claim)
                    else allocations.get(_uid(claim) or "/".join(pod_key(claim)))
                )
                if allocation is not None:
                    allocation = for_release(allocation, self.kubernetes_minor)
                if allocation is None and not _allocation(claim):
                    raise _Retry(
                        f"the allocator gave no allocation for claim {'/'.join(pod_key(claim))}",
                        self.settings.retry_interval_s,
                    )
                written.append(await self._reserve(claim, pod, allocation))
                if allocation is not None:
                    self.counters.allocations += 1
        except (KubeError, _Retry) as err:
            # Another writer got there first (or the server failed): give back what this
            # attempt took, and retry.
            for claim in written:
                await self._unreserve(claim, pod_uid(pod))
            raise _Retry(
                f"claims changed while being allocated ({err}); retrying",
                self.settings.poll_interval_s,
            ) from err
        log.info("pod %s/%s: claims allocated and reserved on node %s", *key, node_name)
        self._chosen[key] = node_name
        self._pre_binding.add(key)
        return 0.0

    async def _reserve(
        self, claim: JsonDict, pod: JsonDict, allocation: Mapping[str, Any] | None
    ) -> JsonDict:
        """Add the finalizer (when allocating), then write allocation and reservedFor in one
        status update. Raises KubeConflict when the claim changed meanwhile (the caller rolls
        back and retries), KubeNotFound when it is gone."""
        namespace, name = pod_key(claim)
        finalizers = list((claim.get("metadata") or {}).get("finalizers") or ())
        if allocation is not None and DELETE_PROTECTION not in finalizers:
            body = json_copy(claim)
            body["metadata"]["finalizers"] = [*finalizers, DELETE_PROTECTION]
            claim = claim_from_wire(
                await call_json(
                    self.resources.replace_namespaced_resource_claim(
                        name, namespace, claim_to_wire(body, self.version), _preload_content=False
                    ),
                    f"add finalizer to ResourceClaim {namespace}/{name}",
                ),
                self.version,
            )
            self._remember(claim)
        body = json_copy(claim)
        body["status"] = allocated_status(claim.get("status") or {}, allocation, pod, self.clock())
        claim = claim_from_wire(
            await call_json(
                self.resources.replace_namespaced_resource_claim_status(
                    name, namespace, claim_to_wire(body, self.version), _preload_content=False
                ),
                f"allocate ResourceClaim {namespace}/{name}",
            ),
            self.version,
        )
        self._remember(claim)
        return claim

    async def _pre_bind(self, pod: JsonDict, claims: list[JsonDict]) -> float | None:
        """Poll the binding conditions; bind when all are met, give back on failure."""
        key = pod_key(pod)
        self._pre_binding.add(key)
        now = self.clock()
        verdicts = [binding_verdict(c, now, self.settings.binding_timeout_s) for c in claims]
        failed = [v for v in verdicts if v.state == "failed"]
        if failed:
            reason = "; ".join(v.reason for v in failed)
            log.warning("pod %s/%s: binding failed: %s; giving the claims back", *key, reason)
            self.counters.failures += 1
            self.failed_devices.remember(d for v in failed for d in v.devices)
            for claim in claims:
                await self._unreserve(claim, pod_uid(pod))
            self._pre_binding.discard(key)
            self._chosen.pop(key, None)
            self.unschedulable[key] = f"binding failed: {reason}"
            return self.settings.retry_interval_s
        if any(v.state == "waiting" for v in verdicts):
            return self.settings.poll_interval_s
        node = self._node_for(key, claims)
        if node is None:
            # Only after a restart: no remembered node, and none fits the allocations.
            raise self._unschedulable(pod, "no schedulable node fits the allocations")
        if await bind_pod(self.core, pod, node):
            self.counters.binds += 1
            self._bound[key] = node
            log.info("pod %s/%s: bound to node %s", *key, node)
        self._pre_binding.discard(key)
        self._chosen.pop(key, None)
        return None

    def _node_for(self, key: Key, claims: Sequence[JsonDict]) -> str | None:
        # The node chosen when the claims were allocated; after a restart, the first
        # candidate that fits the allocations.
        if key in self._chosen:
            return self._chosen[key]
        for node in candidate_nodes(self.nodes.objects()):
            if node_fits(node, claims):
                return str(node["metadata"]["name"])
        return None

    async def _unreserve(self, claim: JsonDict, uid: str) -> None:
        """Remove pod ``uid`` from the claim's ``reservedFor`` (and the allocation with the
        last consumer): one status update, re-read and retried on conflict."""
        await self._update_status(
            claim,
            lambda c: without_consumers(c.get("status") or {}, [uid]),
            "give back ResourceClaim",
        )

    async def _update_status(
        self,
        claim: JsonDict | None,
        change: Callable[[JsonDict], JsonDict | None],
        what: str,
    ) -> JsonDict | None:
        """Read-modify-write of a claim's status: ``change`` returns the new status or None
        (nothing to write). Returns the claim as written (or as it stands); None when gone.
        Raises _Retry when conflicts persist."""
        for _ in range(STATUS_WRITE_ATTEMPTS):
            if claim is None:
                return None
            namespace, name = pod_key(claim)
            status = change(claim)
            if status is None:
                return claim
            body = json_copy(claim)
            body["status"] = status
            try:
                written = claim_from_wire(
                    await call_json(
                        self.resources.replace_namespaced_resource_claim_status(
                            name,
                            namespace,
                            claim_to_wire(body, self.version),
                            _preload_content=False,
                        ),
                        f"{what} {namespace}/{name}",
                    ),
                    self.version,
                )
            except KubeNotFound:
                return None
            except KubeConflict:
                claim = await self._read_claim(namespace, name)
                continue
            self._remember(written)
            return written
        raise _Retry(f"{what}: the claim keeps changing", self.settings.poll_interval_s)


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or -1)
    except ValueError:
        return -1


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _allocation(claim: Mapping[str, Any]) -> Mapping[str, Any] | None:
    allocation = (claim.get("status") or {}).get("allocation")
    return allocation if isinstance(allocation, Mapping) and allocation else None
