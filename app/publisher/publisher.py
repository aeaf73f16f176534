"""The ResourceSlice publisher: keeps the API server's slices of our driver equal to the desired
pools, with the fewest writes.

Loop (modelled on the upstream slice controller, k8s.io/dynamic-resource-allocation/resourceslice):

* an :class:`~app.kube.informer.Informer` lists and watches the ResourceSlices of our driver
  (``fieldSelector spec.driver=<driver>``) into a local view;
* the caller hands over the whole desired state with :meth:`Publisher.set_desired`; pools whose
  desired content changed are queued (one key per pool in a :class:`~app.kube.workqueue.WorkQueue`)
  after a short debounce, and so are pools whose slices someone else changed (watch events);
* a worker syncs one pool at a time: gather (the pool's slices from the view) -> plan
  (:mod:`app.publisher.plan`, pure) -> apply (deletes, updates, creates, in that order) ->
  record (status, metrics, logs). Failures are retried with per-pool exponential backoff; a 409
  re-reads the slice (GET) and plans again; a 429 waits at least its Retry-After; a permanent
  error (400, 403, 422) is reported and not retried until the pool changes again.

Nothing is written before the first :meth:`Publisher.set_desired` and before the informer has
synced, so a restart never deletes slices it has not seen the desired state for.

The informer caches slim objects (see ``_slim``): the content of each slice is kept as its
content key only. Those and our own writes' answers make the local view
(:class:`~app.publisher.view.SliceView`: echoes of our writes, tombstones, deletions seen).
Every ``resync_period_s`` the slices are listed from the API server again (not from the cache),
the view is corrected where it differs (an event the watch lost), and every pool is synced; a
pool already in sync costs no write.

Fields the API server drops (a feature gate off) are detected by comparing each write with the
object that came back; see :meth:`Publisher.status` and the ``*_dropped`` properties.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter as CountMap
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from kubernetes_asyncio.client import ResourceV1Api, ResourceV1beta1Api, ResourceV1beta2Api

from app.aio import cancel_and_wait
from app.jsontypes import JsonDict
from app.kube.client import KubeClient, call_json
from app.kube.errors import KubeConflict, KubeError, KubeNotFound
from app.kube.informer import EventType, Informer
from app.kube.versions import (
    ResourceApiVersion,
    ResourceSliceV1alpha3Api,
    slice_from_wire,
    slice_to_wire,
)
from app.kube.workqueue import QueueClock, ShutDown, WorkQueue, WorkQueueSettings
from app.pools import DesiredPool
from app.publisher.metrics import PublisherMetrics
from app.publisher.plan import (
    TAINT_TIMES,
    PoolPlan,
    Verb,
    Write,
    canonical_content,
    canonical_key,
    content_key,
    content_of,
    dropped_paths,
    expected_key,
    plan_pool,
    taint_times,
)
from app.publisher.settings import PublisherSettings
from app.publisher.status import PoolStatus, PublisherStatus
from app.publisher.view import (
    CONTENT_KEY,
    SliceView,
    parse_resource_version,
    pool_of,
    resource_version_of,
    slice_name,
)

logger = logging.getLogger(__name__)


TAINT_PATHS = ("spec.devices[].taints",)
BINDING_PATHS = (
    "spec.devices[].bindingConditions",
    "spec.devices[].bindingFailureConditions",
    "spec.devices[].bindsToNode",
)


class _Conflicts(Exception):
    """Writes of one phase got 409: the named slices must be read again."""

    def __init__(self, names: list[str], first: KubeConflict) -> None:
        super().__init__(str(first))
        self.names = names
        self.first = first


@dataclass
class _PoolState:
    last_error: str | None = None
    dropped_paths: set[str] = field(default_factory=set)


_SAME_AS_V1 = frozenset({ResourceApiVersion.V1, ResourceApiVersion.V1BETA2})


def _signature(pool: DesiredPool) -> tuple[Any, ...]:
    # content_hash covers the node selector and devices of each slice.
    return tuple(content.content_hash for content in pool.slices)


class Publisher:
    """Publishes the desired pools as ResourceSlices of ``driver_name``.

    Args:
        client: the API client.
        version: the resource.k8s.io version to speak (v1beta1 gets the ``basic`` shape).
        driver_name: our DRA driver; only its slices are read or written.
        settings: see :class:`PublisherSettings`.
        metrics: where to count; None for no metrics.
        clock: time for debounce, backoff and latency (inject a fake in tests).

    Use: ``await start()``, ``set_desired(pools)`` whenever the desired state changes (the
    whole state each time), read ``status()``, ``await stop()``.

    v1alpha3 (Kubernetes 1.31, for the control-plane mode) gets the ``basic`` shape with plain
    capacities; it has no ``bindsToNode``, binding conditions or taints, so its pools must be
    built with ``PoolConfig(binds_to_node=False, taints_supported=False)``.

    Raises:
        ValueError: ``version`` is not a resource.k8s.io version with ResourceSlices.
    """

    def __init__(
        self,
        client: KubeClient,
        version: ResourceApiVersion,
        driver_name: str,
        settings: PublisherSettings,
        metrics: PublisherMetrics | None = None,
        clock: QueueClock | None = None,
    ) -> None:
        apis: dict[ResourceApiVersion, Any] = {
            ResourceApiVersion.V1: ResourceV1Api,
            ResourceApiVersion.V1BETA2: ResourceV1beta2Api,
            ResourceApiVersion.V1BETA1: ResourceV1beta1Api,
            ResourceApiVersion.V1ALPHA3: ResourceSliceV1alpha3Api,
        }
        if version not in apis:
            raise ValueError(f"publisher: resource.k8s.io {version} has no ResourceSlices")
        self.driver_name = driver_name
        self.version = version
        self.settings = settings
        self._metrics = metrics
        self._clock = clock or QueueClock()
        self._api: Any = apis[version](client.api)
        self._queue: WorkQueue[str] = WorkQueue(
            WorkQueueSettings(
                name="publisher",
                base_delay_s=settings.retry_base_s,
                max_delay_s=settings.retry_max_s,
                qps=1e9,
                burst=1_000_000,
            ),
            clock=self._clock,
        )
        self._informer = Informer(
            self._api.list_resource_slice,
            replace(settings.informer, field_selector=f"spec.driver={driver_name}"),
            converter=self._slim,
            now=self._clock.now,
        )
        self._informer.add_handler(self._on_event)
        # The local view: informer events plus our own writes' answers.
        self._view = SliceView(driver_name)
        self._resyncs = 0
        self._resync_corrections = 0
        self._resync_lock = asyncio.Lock()
        self._desired: dict[str, DesiredPool] | None = None
        self._keys_cache: dict[str, tuple[DesiredPool, frozenset[str], list[str]]] = {}
        self._accepted: dict[str, str] = {}
        self._dropped: set[str] = set()
        self._pools: dict[str, _PoolState] = {}
        self._dirty_since: dict[str, float] = {}
        self._writes: CountMap[str] = CountMap()
        self._synced = False
        self._tasks: list[asyncio.Task[None]] = []
        self._write_gate = asyncio.Semaphore(settings.write_concurrency)

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Start the informer and the workers. Idempotent."""
        if self._tasks:
            return
        self._informer.start()
        self._tasks.append(asyncio.create_task(self._kickoff(), name="publisher-kickoff"))
        self._tasks.append(asyncio.create_task(self._resync_loop(), name="publisher-resync"))
        for number in range(self.settings.workers):
            self._tasks.append(
                asyncio.create_task(self._worker(), name=f"publisher-worker-{number}")
            )

    async def stop(self) -> None:
        """Stop the workers (a write in flight is cancelled) and the informer. A stopped
        publisher cannot be started again: build a new one (it adopts the slices)."""
        self._queue.shutdown()
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(*tasks)
        await self._informer.stop()

    # ----------------------------------------------------------------- input
    def informers(self) -> tuple[Informer, ...]:
        """The informers this publisher runs (for metrics)."""
        return (self._informer,)

    def desired(self) -> Mapping[str, DesiredPool]:
        """The desired state last handed over (empty before the first), read-only."""
        return MappingProxyType(self._desired or {})

    def set_desired(self, pools: Mapping[str, DesiredPool]) -> None:
        """Hand over the whole desired state: pool name -> :class:`DesiredPool`.

        Pools whose slices changed, appeared or disappeared are queued (after the debounce);
        a pool missing from ``pools`` loses all its slices.

        Raises:
            ValueError: a key is not the name of its pool.
        """
        for name, pool in pools.items():
            if name != pool.name:
                raise ValueError(f"pool {name!r}: the desired pool is named {pool.name!r}")
        previous, self._desired = self._desired, dict(pools)
        for name in [n for n in self._keys_cache if n not in self._desired]:
            del self._keys_cache[name]
        if self._metrics is not None:
            self._metrics.pools.set(len(self._desired))
        if not self._synced:
            return  # _kickoff queues every pool once the informer has synced
        if previous is None:
            self._queue_all()
            return
        for name in set(previous) | set(self._desired):
            before, after = previous.get(name), self._desired.get(name)
            if before is None or after is None or _signature(before) != _signature(after):
                self._enqueue(name)

    def resync_all(self) -> None:
        """Queue every pool (desired or with slices) for a full comparison with the local
        view (no API read; :meth:`resync` also re-reads the slices)."""
        if self._synced and self._desired is not None:
            self._queue_all()

    async def resync(self) -> int:
        """Full resync: list our driver's slices from the API server (a LIST with the
        informer's selector and paging, not its cache), correct the local view where it
        differs, and queue every pool. A pool whose slices are right plans no write.

        Upstream's slice controller gets its informer to replay the cache every 10 minutes
        (``resyncPeriod``, k8s.io/dynamic-resource-allocation/resourceslice/
        resourceslicecontroller.go), which queues every pool but cannot notice an event the
        watch lost; it also re-checks a pool once its own writes expire from its mutation
        cache (``defaultMutationCacheTTL``), since a slice may be deleted without the informer
        hearing of it. Listing covers both here. Entries written or seen after the list was
        served (a newer resourceVersion) are kept as they are.

        Returns:
            how many slices the view had wrong: missing or outdated (stored from the list) or
            gone from the server (dropped, their pool's slices recreated by the sync). A write
            whose answer had not come back when the list was served counts too.

        Raises:
            RuntimeError: the informer has not synced yet.
            KubeError: the list failed; the view is unchanged (counted as a failed resync).
        """
        if not self._synced:
            raise RuntimeError("publisher: resync before the informer has synced")
        async with self._resync_lock:
            try:
                listed, list_version = await self._informer.list_fresh()
            except KubeError:
                self._count_resync("failed")
                raise
            wrong = self._view.correct(listed, parse_resource_version(list_version))
            self._resyncs += 1
            self._resync_corrections += wrong
            self._count_resync("ok", wrong)
            if wrong:
                logger.warning(
                    "publisher resync: %d ResourceSlices differed from the local "
                    "view (an event was lost?); every pool is synced",
                    wrong,
                )
            if self._desired is not None:
                self._queue_all()
            return wrong

    # ----------------------------------------------------------------- output
    @property
    def dropped_paths(self) -> frozenset[str]:
        """Every field path (``spec.devices[].taints``) the API server dropped from a write."""
        return frozenset(self._dropped)

    @property
    def taints_dropped(self) -> bool:
        """True once the API server dropped device taints (DRADeviceTaints off): recompute the
        pools with ``PoolConfig(taints_supported=False)`` to withhold unhealthy devices."""
        return any(p.startswith(TAINT_PATHS) for p in self._dropped)

    @property
    def binding_conditions_dropped(self) -> bool:
        """True once the API server dropped bindsToNode or binding conditions (KEP-5007 gates
        off): pods may start before their device is attached."""
        return any(p.startswith(BINDING_PATHS) for p in self._dropped)

    @property
    def queue_depth(self) -> int:
        """Pools queued, delayed or being synced."""
        return len(self._queue) + self._queue.delayed_count + self._queue.processing_count

    def status(self) -> PublisherStatus:
        """A :class:`PublisherStatus` snapshot."""
        desired = self._desired or {}
        pools: dict[str, PoolStatus] = {}
        for name in sorted(set(desired) | self._view.pools_with_slices()):
            existing = self._view.existing(name)
            names = [record.name for record in existing]
            generations = [record.generation for record in existing]
            state = self._pools.get(name, _PoolState())
            pool = desired.get(name)
            pools[name] = PoolStatus(
                name=name,
                desired=pool is not None,
                generation=max(generations) if generations else None,
                resource_slices=tuple(names),
                devices=pool.device_count if pool else 0,
                last_error=state.last_error,
                dropped_paths=tuple(sorted(state.dropped_paths)),
            )
        return PublisherStatus(
            synced=self._synced and self._desired is not None,
            queue_depth=self.queue_depth,
            writes=dict(self._writes),
            dropped_paths=tuple(sorted(self._dropped)),
            taints_dropped=self.taints_dropped,
            binding_conditions_dropped=self.binding_conditions_dropped,
            pools=pools,
            resyncs=self._resyncs,
            resync_corrections=self._resync_corrections,
        )

    def idle(self) -> bool:
        """True when synced and no pool is queued, delayed or being synced."""
        return self._synced and self._desired is not None and self.queue_depth == 0

    async def wait_idle(self, timeout_s: float) -> None:
        """Return once :meth:`idle` is True (for tests and the demo).

        Raises:
            TimeoutError: not idle within ``timeout_s`` seconds (wall time).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.idle():
            if loop.time() >= deadline:
                raise TimeoutError(
                    f"publisher not idle after {timeout_s} s: {self.queue_depth} pools queued"
                )
            await asyncio.sleep(0.005)

    # ----------------------------------------------------------------- wire shapes
    def _from_wire(self, obj: JsonDict) -> JsonDict:
        """A ResourceSlice as received, in the v1 shape. The object is ours (freshly parsed):
        for v1 and v1beta2 only ``apiVersion`` differs, so it is changed in place instead of
        deep-copying every device (a quarter of the CPU time at 10,000 devices)."""
        if self.version in _SAME_AS_V1:
            if "apiVersion" in obj:
                obj["apiVersion"] = ResourceApiVersion.V1.api_version
            return obj
        return slice_from_wire(obj, self.version)

    def _to_wire(self, body: JsonDict) -> JsonDict:
        """A ResourceSlice body (v1 shape) in the wire shape of the version spoken."""
        if self.version in _SAME_AS_V1:
            return {**body, "apiVersion": self.version.api_version}
        return slice_to_wire(body, self.version)

    def _slim(self, raw: JsonDict) -> JsonDict:
        """The informer's converter: the form it caches. Metadata without managedFields, and
        the spec's content (devices, node selection) replaced by its content key and the
        taints' ``timeAdded`` (:func:`~app.publisher.plan.taint_times`).

        The informer is private to the publisher, which needs no more; at 100,000 devices the
        full objects would be most of the process's memory (client-go informers use a transform
        the same way to drop managedFields).
        """
        obj = self._from_wire(raw)
        metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
        spec = obj.get("spec") or {}
        slim_spec = {k: spec[k] for k in ("driver", "pool") if k in spec}
        known = self._view.get(str(metadata.get("name") or ""))
        if known is not None and known.resource_version == str(metadata.get("resourceVersion")):
            slim_spec[CONTENT_KEY] = known.content_key  # the echo of our own write
        else:
            slim_spec[CONTENT_KEY] = content_key(content_of(spec))
        # The server's timeAdded per taint, sent back on update (a taint keeps its age).
        times = taint_times(spec)
        if times:
            slim_spec[TAINT_TIMES] = times
        return {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "metadata": metadata,
            "spec": slim_spec,
        }

    # ----------------------------------------------------------------- resync and events
    async def _resync_loop(self) -> None:
        await self._informer.has_synced.wait()
        while True:
            await self._clock.sleep(self.settings.resync_period_s)
            try:
                await self.resync()
            except KubeError as err:
                logger.warning(
                    "publisher resync: %s; next in %.0f s", err, self.settings.resync_period_s
                )
            except Exception:
                logger.exception(
                    "publisher resync crashed; next in %.0f s", self.settings.resync_period_s
                )

    def _count_resync(self, result: str, corrections: int = 0) -> None:
        if self._metrics is not None:
            self._metrics.resyncs.labels(result).inc()
            if corrections:
                self._metrics.resync_corrections.inc(corrections)

    async def _kickoff(self) -> None:
        await self._informer.has_synced.wait()
        self._synced = True
        if self._desired is not None:
            self._queue_all()

    def _queue_all(self) -> None:
        for name in set(self._desired or {}) | self._view.pools_with_slices():
            self._enqueue(name)

    def _enqueue(self, pool_name: str) -> None:
        self._dirty_since.setdefault(pool_name, self._clock.now())
        self._queue.add_after(pool_name, self.settings.debounce_s)
        self._update_depth()

    def _update_depth(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.set(self.queue_depth)

    async def _on_event(self, event_type: EventType, obj: JsonDict, old: JsonDict | None) -> None:
        del old
        for pool_name in self._view.on_event(event_type, obj):
            self._enqueue(pool_name)

    # ----------------------------------------------------------------- workers
    async def _worker(self) -> None:
        while True:
            try:
                pool_name = await self._queue.get()
            except ShutDown:
                return
            try:
                await self._process(pool_name)
            finally:
                self._queue.done(pool_name)
                self._update_depth()

    async def _process(self, pool_name: str) -> None:
        if not self._synced or self._desired is None:
            return
        state = self._pools.setdefault(pool_name, _PoolState())
        try:
            await self._sync(pool_name)
        except KubeError as err:
            state.last_error = str(err)
            if err.retryable or isinstance(err, KubeConflict):
                delay = self._queue.when(pool_name)
                if err.retry_after is not None:
                    delay = max(delay, err.retry_after)
                self._queue.add_after(pool_name, delay)
                self._count_sync("retry")
                logger.warning("pool %r: %s; retrying in %.2f s", pool_name, err, delay)
            else:
                self._count_sync("failed")
                logger.error("pool %r: %s; not retried until the pool changes", pool_name, err)
            return
        except Exception as err:
            # A bug must neither kill the worker nor spin: report it and back off.
            state.last_error = f"{type(err).__name__}: {err}"
            self._queue.add_after(pool_name, self._queue.when(pool_name))
            self._count_sync("retry")
            logger.exception("pool %r: sync crashed", pool_name)
            return
        state.last_error = None
        self._queue.forget(pool_name)
        self._count_sync("ok")
        since = self._dirty_since.pop(pool_name, None)
        if since is not None and self._metrics is not None:
            self._metrics.pool_sync_seconds.observe(max(0.0, self._clock.now() - since))
        if pool_name not in (self._desired or {}) and not self._view.has_slices(pool_name):
            self._view.discard_pool(pool_name)
            self._pools.pop(pool_name, None)

    def _count_sync(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.pool_syncs.labels(result).inc()

    # ----------------------------------------------------------------- gather + plan
    def _expected_keys(self, desired: DesiredPool) -> list[str]:
        dropped = frozenset(self._dropped)
        cached = self._keys_cache.get(desired.name)
        if cached is not None and cached[0] is desired and cached[1] == dropped:
            return cached[2]
        keys = [expected_key(desired, content, dropped) for content in desired.slices]
        self._keys_cache[desired.name] = (desired, dropped, keys)
        return keys

    def _plan(self, pool_name: str) -> tuple[PoolPlan, list[str]]:
        desired = (self._desired or {}).get(pool_name)
        keys = self._expected_keys(desired) if desired is not None else []
        plan = plan_pool(
            self.driver_name,
            pool_name,
            desired,
            self._view.existing(pool_name),
            expected_keys=keys,
            accepted=self._accepted,
            floor_generation=self._view.floor_generation(pool_name),
        )
        return plan, keys

    # ----------------------------------------------------------------- apply
    async def _sync(self, pool_name: str) -> None:
        """Plan and apply; after a 409, re-read the slices concerned and plan again."""
        attempts = self.settings.conflict_retries + 1
        for attempt in range(attempts):
            plan, keys = self._plan(pool_name)
            if not plan.writes:
                return
            try:
                await self._apply(plan, keys)
                return
            except _Conflicts as conflicts:
                logger.info(
                    "pool %r: %s; re-reading %d slices",
                    pool_name,
                    conflicts.first,
                    len(conflicts.names),
                )
                for name in conflicts.names:
                    await self._refresh(pool_name, name)
                if attempt == attempts - 1:
                    raise conflicts.first from conflicts
        return

    async def _apply(self, plan: PoolPlan, keys: list[str]) -> None:
        verbs: tuple[Verb, ...] = ("delete", "update", "create")
        for verb in verbs:
            writes = plan.of(verb)
            if not writes:
                continue
            results = await asyncio.gather(
                *(self._write(plan.pool_name, write, keys) for write in writes),
                return_exceptions=True,
            )
            conflicts: list[str] = []
            first_conflict: KubeConflict | None = None
            for write, result in zip(writes, results, strict=True):
                if isinstance(result, KubeConflict) and write.name is not None:
                    conflicts.append(write.name)
                    first_conflict = first_conflict or result
                elif isinstance(result, BaseException):
                    raise result
            if first_conflict is not None:
                raise _Conflicts(conflicts, first_conflict)

    def _what(self, pool_name: str, write: Write) -> str:
        where = f"slice {write.index}" if write.index is not None else f"slice {write.name}"
        target = f" {write.name}" if write.name else ""
        return f"pool {pool_name!r} {where}: {write.verb} ResourceSlice{target}"

    async def _write(self, pool_name: str, write: Write, keys: list[str]) -> None:
        what = self._what(pool_name, write)
        timeout = self.settings.request_timeout_s
        async with self._write_gate:
            try:
                if write.verb == "delete":
                    assert write.name is not None
                    options = {
                        "apiVersion": "v1",
                        "kind": "DeleteOptions",
                        "preconditions": {
                            "uid": write.uid,
                            "resourceVersion": write.resource_version,
                        },
                    }
                    try:
                        await call_json(
                            self._api.delete_resource_slice(
                                write.name,
                                body=options,
                                _preload_content=False,
                                _request_timeout=timeout,
                            ),
                            what,
                        )
                    except KubeNotFound:
                        self._count_write("delete", "not_found")
                    else:
                        self._count_write("delete", "ok")
                        self._writes["delete"] += 1
                    self._view.forget(
                        write.name, parse_resource_version(write.resource_version), tombstone=True
                    )
                    return
                assert write.body is not None
                wire = self._to_wire(write.body)
                if write.verb == "update":
                    assert write.name is not None
                    returned = await call_json(
                        self._api.replace_resource_slice(
                            write.name, wire, _preload_content=False, _request_timeout=timeout
                        ),
                        what,
                    )
                else:
                    returned = await call_json(
                        self._api.create_resource_slice(
                            wire, _preload_content=False, _request_timeout=timeout
                        ),
                        what,
                    )
            except KubeConflict:
                self._count_write(write.verb, "conflict")
                raise
            except KubeError:
                self._count_write(write.verb, "error")
                raise
        self._count_write(write.verb, "ok")
        self._writes[write.verb] += 1
        obj = self._from_wire(returned)
        returned_content = content_of(obj.get("spec") or {})
        returned_key = canonical_key(canonical_content(returned_content))
        self._remember(obj, returned_key)
        assert write.index is not None
        self._learn(pool_name, write.body, returned_content, returned_key, keys[write.index])

    def _count_write(self, verb: str, result: str) -> None:
        if self._metrics is not None:
            self._metrics.api_writes.labels(verb, result).inc()

    def _remember(self, obj: JsonDict, key: str) -> None:
        if not self._view.on_answer(obj, key):
            # The watch delivered this write and then a DELETED before its answer was handled:
            # storing the answer would hide the deletion and the slice would never be
            # recreated. Sync the pool again instead.
            logger.info(
                "ResourceSlice %s was deleted after our write (resourceVersion %s); "
                "pool %r is synced again",
                slice_name(obj),
                resource_version_of(obj),
                pool_of(obj),
            )
            self._enqueue(pool_of(obj))

    def _learn(
        self,
        pool_name: str,
        sent: JsonDict,
        returned_content: JsonDict,
        returned_key: str,
        key: str,
    ) -> None:
        """Compare a write with what came back: record dropped paths, and accept the returned
        form of this desired content (``key``) as in sync (no rewrite loop against the
        server)."""
        self._accepted.pop(key, None)
        self._accepted[key] = returned_key
        # Keep the newest entries only: enough for every desired slice, twice over.
        limit = 2 * sum(len(p.slices) for p in (self._desired or {}).values()) + 1024
        while len(self._accepted) > limit:
            del self._accepted[next(iter(self._accepted))]
        if returned_key == key:
            return  # exactly what was expected: nothing new was dropped
        lost = dropped_paths(content_of(sent["spec"]), returned_content, "spec")
        if not lost:
            return
        self._pools.setdefault(pool_name, _PoolState()).dropped_paths |= lost
        for path in sorted(lost - self._dropped):
            logger.warning(
                "pool %r: the API server dropped %s from a ResourceSlice (a feature gate is "
                "off?); it is reported, not rewritten",
                pool_name,
                path,
            )
            if self._metrics is not None:
                self._metrics.dropped_fields.labels(path).set(1)
        self._dropped |= lost

    async def _refresh(self, pool_name: str, name: str) -> None:
        """GET one slice after a conflict and put the fresh copy into the view."""
        what = f"pool {pool_name!r}: read ResourceSlice {name}"
        try:
            fresh = await call_json(
                self._api.read_resource_slice(
                    name, _preload_content=False, _request_timeout=self.settings.request_timeout_s
                ),
                what,
            )
        except KubeNotFound:
            self._view.forget(name, None, tombstone=True)
            return
        self._view.on_read(self._from_wire(fresh))
