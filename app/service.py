"""The composition root: builds every part from the settings, wires them, runs them, stops them.

Every replica serves the admin endpoint and campaigns for the Lease. Only the leader writes
(DESIGN.md invariant 7): while leading it runs the inventory loop, the publisher, the claim
reconciler (structured mode) and the control-plane controller (classic mode); when leadership
is lost they are stopped before anything else happens. Loops are supervised: a crash is logged,
shown in readiness, and the loop restarts with backoff.

Shutdown (SIGTERM): stop taking work, let in-flight reconciles finish within the deadline,
release the Lease, close the fabric backend, the Kubernetes client and the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio.client import CoreV1Api
from sqlalchemy.exc import SQLAlchemyError

from app import aio
from app.admin.actions import DatabaseActions
from app.admin.context import AdminContext, Check
from app.admin.history import History, take_sample
from app.admin.whatif import what_if_answer
from app.allocator import Allocator
from app.claims.drift import Drift, DriftTarget, DriftWatch
from app.claims.fabric_ops import FabricOps
from app.claims.nodereports import NodeReportWatch
from app.claims.reconciler import ClaimReconciler, ClaimSettings
from app.clock import utcnow
from app.config import Settings, read_secret
from app.db import migrate
from app.db.engine import Database, check_usable
from app.fabric.backend import FabricBackend
from app.fabric.factory import fleet_from_settings
from app.fabric.fleet import FabricFleet
from app.heap import HeapSettler, settle_heap
from app.inventory import InventorySync
from app.inventory.events import EventApplier, EventWatcher
from app.inventory.queries import (
    PoolDeviceCache,
    list_status,
    located_in,
    pool_devices,
    unconfigured_managers,
    unit_locations,
)
from app.journal import ClaimRef, Journal
from app.kube.client import KubeClient, call_json, connect
from app.kube.factory import kube_client_settings
from app.kube.leader import LeaderElectionSettings, LeaderElector
from app.kube.versions import (
    ResourceApiVersion,
    device_class_from_wire,
    discover_served_versions,
    resource_api,
)
from app.metrics import FabricRetryCollector, InformerCollector, LeaderCollector, Metrics
from app.pools import DesiredPool, PoolCache, PoolConfig, PoolDevice, desired_pools, pool_name
from app.publisher import Publisher, PublisherMetrics, PublisherSettings
from app.supervisor import Supervisor

if TYPE_CHECKING:  # imported only when the mode is served (see Service._lead)
    from app.controlplane.controller import ControlPlaneController

log = logging.getLogger(__name__)
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
STEP_DOWN_DRAIN_S = 10.0
"""How long in-flight reconciles may take to finish when this replica stops leading, seconds."""
EVENTS_FLUSH_S = 5.0
"""The longest a stopping controller waits to send its queued Events, seconds."""
FIRST_OPEN_WAIT_S = 3.0
"""The longest the first inventory sync of a term waits for the event stream's first open,
seconds."""


def publisher_versions(
    structured: ResourceApiVersion | None, control_plane: bool
) -> list[ResourceApiVersion]:
    """The resource.k8s.io versions to publish ResourceSlices in: ``[structured]`` for the
    structured mode, ``[v1alpha3]`` for the control-plane mode (Kubernetes 1.31).

    Raises:
        ValueError: both modes, or neither (:func:`app.modes.choose_modes` never returns
            those: no Kubernetes release serves a structured version and v1alpha3 with
            PodSchedulingContexts together).
    """
    if structured is not None and control_plane:
        raise ValueError(
            f"structured ({structured.value}) and control-plane (v1alpha3) "
            f"together: no Kubernetes release serves both"
        )
    if structured is not None:
        return [structured]
    if control_plane:
        return [ResourceApiVersion.V1ALPHA3]
    raise ValueError("no mode to publish for")


def publishing_config(
    settings: Settings, version: ResourceApiVersion, *, taints_supported: bool
) -> PoolConfig:
    """How devices become the pools published in ``version``'s ResourceSlices.

    ``taints_supported`` is what the publisher learned from the API server (False once it
    dropped device taints, ``Publisher.taints_dropped``: unhealthy, cordoned and failed
    devices are then withheld instead of tainted). v1alpha3 (Kubernetes 1.31) has neither
    binding conditions nor device taints.
    """
    config = PoolConfig.from_settings(settings, taints_supported=taints_supported)
    if version is ResourceApiVersion.V1ALPHA3:
        config = dataclasses.replace(config, binds_to_node=False, taints_supported=False)
    return config


def default_identity() -> str:
    """This replica's name: the pod's hostname plus a short random suffix."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


def default_namespace(environ: Mapping[str, str]) -> str:
    """The Lease namespace when none is set: ``POD_NAMESPACE``, the service account's
    namespace file, else ``default``."""
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    with contextlib.suppress(OSError), open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as handle:
        namespace = handle.read().strip()
        if namespace:
            return namespace
    return "default"


@dataclass
class ManagerInventory:
    """One fabric manager's inventory loop while this replica leads: its sync, and its event
    stream with what applies its events."""

    name: str
    backend: FabricBackend
    inventory: InventorySync
    events: EventWatcher | None = None
    applier: EventApplier | None = None
    last_result: Any = None


@dataclass
class Leadership:
    """The parts that run only while this replica leads."""

    managers: dict[str, ManagerInventory]
    publishers: dict[ResourceApiVersion, Publisher] = field(default_factory=dict)
    claims: ClaimReconciler | None = None
    control_plane: ControlPlaneController | None = None
    node_reports: NodeReportWatch | None = None
    # Attach units the events changed: their pools alone are laid out again and published
    # (publish_wanted, set by everything else, lays out every pool).
    publish_units: set[str] = field(default_factory=set)
    publish_partial: asyncio.Event = field(default_factory=asyncio.Event)
    publish_wanted: asyncio.Event = field(default_factory=asyncio.Event)
    # A sync succeeded in this term: until then an empty database is no inventory at all.
    inventory_synced: bool = False
    # Every part of the term has started (set at the end of Service._lead).
    started: bool = False

    def sync_all(self) -> None:
        """Ask every fabric manager's inventory to sync now."""
        for manager in self.managers.values():
            manager.inventory.trigger()


def _publisher_waits_for(leading: Leadership) -> str:
    """What a publisher that has not synced waits for: the first inventory sync of the term
    (with each fabric manager's last failure), or its own first pass."""
    if leading.inventory_synced:
        return "syncing"
    failures = [
        f"{manager.name}: {manager.last_result.error}"
        for manager in leading.managers.values()
        if manager.last_result is not None and not manager.last_result.ok
    ]
    waiting = "waiting for the first inventory sync"
    return f"{waiting}; it failed: {'; '.join(failures)}" if failures else waiting


def _one_line(err: BaseException) -> str:
    """An error's first line (a database driver's message carries the statement and a link
    on further lines), or its type when it has no text."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


async def _first_of(*events: asyncio.Event, timeout_s: float) -> None:
    """Wait until any of ``events`` is set, or ``timeout_s`` seconds."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


class Service:
    """fabric-dra's service. ``await start()``, then ``await stop()``.

    Args:
        settings: the validated settings.
        environ: the environment (in-cluster discovery, POD_NAMESPACE).
        backend: a fabric backend, or a :class:`FabricFleet` of several, to use instead of
            building them from the settings (tests).
        kube: a Kubernetes client to use instead of building one (tests).
        freeze_heap: once leading has started, freeze the heap (:func:`settle_heap`); for a
            process that runs one service (``fabric-dra run``), not for tests that start many
            in one process.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        environ: Mapping[str, str] | None = None,
        backend: FabricBackend | None = None,
        kube: KubeClient | None = None,
        freeze_heap: bool = False,
    ) -> None:
        self.settings = settings
        self.freeze_heap = freeze_heap
        self.environ = os.environ if environ is None else environ
        self.metrics = Metrics.create()
        self.publisher_metrics = PublisherMetrics.create(self.metrics.registry)
        self.metrics.registry.register(InformerCollector(self._live_informers))
        self.metrics.registry.register(FabricRetryCollector(lambda: self.backend))
        self.metrics.registry.register(
            LeaderCollector(lambda: self.elector, lambda: self.leading is not None)
        )
        self.supervisor = Supervisor()
        # The dashboard's charts, sampled by the "history" loop on every replica.
        self.history = History(
            settings.admin.history_window_seconds, settings.admin.history_interval_seconds
        )
        self.identity = settings.leader.identity or default_identity()
        self.db = Database.connect(settings.database.url, pool_size=settings.database.pool_size)
        self.backend: FabricFleet | None = (
            None
            if backend is None
            else backend
            if isinstance(backend, FabricFleet)
            else FabricFleet({backend.name: backend})
        )
        self.kube = kube
        self._owns_backend = backend is None
        self._owns_kube = kube is None
        self.version: ResourceApiVersion | None = None
        self.control_plane_served = False
        self.elector: LeaderElector | None = None
        self.leading: Leadership | None = None
        self._lead_task: asyncio.Task[None] | None = None
        self._admin: Any = None
        self._admin_context: AdminContext | None = None
        self._allocator: Allocator | None = None
        self.admin_port: int | None = None
        self._started_at = time.monotonic()
        self.last_inventory: Any = None
        self._drift: dict[str | None, list[Drift]] = {}
        self.mode = settings.controller.mode
        self._stopping = False
        # How long a step-down lets in-flight claim work finish (stop() lowers it to fit
        # its deadline).
        self._drain_s = STEP_DOWN_DRAIN_S

    @property
    def last_drift(self) -> list[Drift]:
        """What the last drift check of each fabric manager found."""
        return [d for drifts in self._drift.values() for d in drifts]

    # ------------------------------------------------------------------ start / stop
    async def start(self) -> None:
        """Connect, migrate, choose the API version and mode, serve admin, campaign.

        Raises:
            ConfigError: bad credentials files or Kubernetes settings.
            DatabaseUnavailable: the database cannot be used (before migrating on start).
            KubeError: discovery failed (the API server is unreachable or refuses us).
            KubeVersionError: no resource.k8s.io version fits the configured mode.
        """
        log.info(
            "fabric-dra %s starting (driver %s, event loop %s)",
            self.identity,
            self.settings.driver_name,
            aio.running_loop_name(),
        )
        if self.settings.database.migrate_on_start:
            await check_usable(self.db.engine)
            await migrate.upgrade(self.db.engine)
        if self.backend is None:
            self.backend = fleet_from_settings(self.settings)
        if self.kube is None:
            self.kube = await connect(kube_client_settings(self.settings.kube, self.environ))
        await self._choose_modes()
        await self._start_admin()
        self.supervisor.spawn("history", self._history_loop)
        if self.settings.leader.enabled:
            leader = self.settings.leader
            self.elector = LeaderElector(
                self.kube.api,
                LeaderElectionSettings(
                    lease_name=leader.lease_name,
                    namespace=leader.namespace or default_namespace(self.environ),
                    identity=self.identity,
                    lease_duration_s=max(1, round(leader.lease_duration_seconds)),
                    renew_deadline_s=leader.renew_deadline_seconds,
                    retry_period_s=leader.retry_period_seconds,
                ),
                on_started_leading=self._on_started_leading,
                on_stopped_leading=self._on_stopped_leading,
            )
            self.elector.start()
        else:
            await self._on_started_leading()
        log.info(
            "fabric-dra %s started: driver %s, mode %s, resource.k8s.io %s",
            self.identity,
            self.settings.driver_name,
            self.mode,
            self.version.value if self.version else "-",
        )

    async def _choose_modes(self) -> None:
        from app.modes import ModeError, discover_modes

        assert self.kube is not None
        modes = await discover_modes(self.kube.api, self.mode)
        fixed = self.settings.kube.resource_api_version
        if modes.structured is not None and fixed != "auto":
            served = await discover_served_versions(self.kube.api)
            if fixed not in served:
                raise ModeError(
                    f"kube.resource_api_version is {fixed}, but the API server "
                    f"serves resource.k8s.io {', '.join(served) or 'nothing'}"
                )
            modes = dataclasses.replace(modes, structured=ResourceApiVersion(fixed))
        self.version = modes.structured
        self.control_plane_served = modes.control_plane
        log.info("modes: %s", modes.describe())

    async def stop(self, deadline_s: float = 20.0) -> None:
        """Stop everything within about ``deadline_s`` seconds.

        In-flight claim work may finish for up to half of ``deadline_s`` (at most
        ``STEP_DOWN_DRAIN_S``); what is still running when the deadline passes is cancelled
        (the journal makes that safe) and awaited, so no task outlives the stop nor holds a
        database connection past it.
        """
        self._stopping = True
        self._drain_s = min(STEP_DOWN_DRAIN_S, max(0.0, deadline_s) / 2)
        try:
            async with asyncio.timeout(deadline_s):
                if self.elector is not None:
                    # Stepping down runs _on_stopped_leading, which drains the leader's work.
                    await self.elector.stop()
                else:
                    await self._on_stopped_leading()
        except TimeoutError:
            log.warning(
                "stopping: the deadline of %.0fs passed; cancelling the work left", deadline_s
            )
        # Finishes a step-down the deadline cut short: whatever it had not stopped yet.
        await self._stop_leading(0)
        await self._stop_admin()
        await self.supervisor.stop()
        if self._owns_backend and self.backend is not None:
            await self.backend.close()
        if self._owns_kube and self.kube is not None:
            await self.kube.close()
        await self.db.dispose()
        log.info("fabric-dra %s stopped", self.identity)

    # ------------------------------------------------------------------ leadership
    async def _on_started_leading(self) -> None:
        # Called inside the elector's loop: only spawn, never wait here (renewals must go on).
        self._lead_task = asyncio.create_task(self._lead(), name="leading")

    async def _on_stopped_leading(self) -> None:
        await self._stop_leading(self._drain_s)

    async def _lead(self) -> None:
        assert self.backend is not None
        assert self.kube is not None
        settings = self.settings
        leading = Leadership(
            managers={
                name: ManagerInventory(
                    name,
                    backend,
                    InventorySync(
                        backend,
                        self.db,
                        stale_after_failures=settings.inventory.stale_after_failures,
                        metrics=self.metrics.inventory,
                        name_scope=name if len(self.backend.backends) > 1 else None,
                    ),
                )
                for name, backend in self.backend.backends.items()
            }
        )
        self.leading = leading
        await self._warn_unconfigured()
        for manager in leading.managers.values():
            # One loop per fabric manager: one being down or slow holds up none of the others.
            self.supervisor.spawn(
                self._loop_name("inventory", manager.name),
                lambda m=manager: self._inventory_loop(leading, m),  # type: ignore[misc]
            )
            if settings.inventory.events:
                self._follow_events(leading, manager)
        # One publisher, in the one version the mode speaks: the structured version
        # (Kubernetes 1.32+), or v1alpha3 for the control-plane mode (1.31). No release serves
        # both (app.modes.choose_modes refuses "both" and auto picks one).
        versions = publisher_versions(self.version, self.control_plane_served)
        for version in versions:
            publisher = Publisher(
                self.kube,
                version,
                settings.driver_name,
                PublisherSettings(
                    resync_period_s=settings.publisher.resync_period_seconds,
                    debounce_s=settings.publisher.debounce_seconds,
                ),
                self.publisher_metrics,
            )
            await publisher.start()
            leading.publishers[version] = publisher
        if leading.publishers:
            self.supervisor.spawn("publish", lambda: self._publish_loop(leading))
        if self.version is not None:
            leading.claims = ClaimReconciler(
                self.kube,
                self.version,
                self.db,
                self.backend,
                ClaimSettings(
                    driver_name=settings.driver_name,
                    binding_conditions=settings.pools.binding_conditions,
                    binding_failure_conditions=settings.pools.binding_failure_conditions,
                    host_match=settings.hosts.match,
                    host_key=settings.hosts.key,
                    workers=settings.controller.workers,
                    orphan_grace_s=settings.controller.orphan_grace_seconds,
                    detach_unmanaged=settings.controller.detach_unmanaged,
                    max_detach_attempts=settings.controller.detach_attempts,
                    identity=self.identity,
                ),
                metrics=self.metrics.claims,
                on_failed_device=leading.publish_wanted.set,
            )
            await leading.claims.start()
        if self.control_plane_served:
            from app.controlplane import ControlPlaneController, ControlPlaneSettings

            leading.control_plane = ControlPlaneController(
                self.kube,
                self.db,
                self.backend,
                ControlPlaneSettings(
                    driver_name=settings.driver_name,
                    host_match=settings.hosts.match,
                    host_key=settings.hosts.key,
                    workers=settings.controller.workers,
                    identity=self.identity,
                    max_detach_attempts=settings.controller.detach_attempts,
                ),
                metrics=self.metrics.claims,
                heap=HeapSettler() if self.freeze_heap else None,
                on_failed_device=leading.publish_wanted.set,
            )
            await leading.control_plane.start()
        if leading.claims is not None or leading.control_plane is not None:
            # The node plugin's "device gone from the host" Events: sync (and check drift) now.
            leading.node_reports = NodeReportWatch(
                self.kube, leading.sync_all, metrics=self.metrics.claims
            )
            await leading.node_reports.start()
        leading.started = True
        if self.freeze_heap:
            settle_heap()

    def _managers(self) -> tuple[str, ...]:
        """The configured fabric managers' names (``devices.backend`` values)."""
        assert self.backend is not None
        return self.backend.names

    async def _warn_unconfigured(self) -> None:
        """Say once, at the start of a term, which fabric managers no longer configured still
        have devices in the database: they are not offered any more."""
        try:
            left = await unconfigured_managers(self.db, self._managers())
        except SQLAlchemyError as err:
            log.warning("could not look for devices of unconfigured fabric managers: %s", err)
            return
        for name, count in sorted(left.items()):
            log.warning(
                "fabric manager %s is not configured but has %d devices in the database; "
                "they are not published (was it renamed?)",
                name,
                count,
            )

    def _loop_name(self, loop: str, manager: str) -> str:
        """A loop's name: ``inventory``, or ``inventory hall-a`` with several managers."""
        return loop if len(self.settings.managers) <= 1 else f"{loop} {manager}"

    def _follow_events(self, leading: Leadership, manager: ManagerInventory) -> None:
        """Start following ``manager``'s event stream, applying its events one resource at
        a time (inventory.events)."""

        async def inventory_changed(read_from: dt.datetime, units: frozenset[str]) -> None:
            leading.publish_units.update(units)
            leading.publish_partial.set()
            if leading.control_plane is not None:
                leading.control_plane.mark_inventory_changed()
            # Drift (a holder changed behind our back) is judged by the full sync the
            # applier asks for then: its listing time is what the journal's rule needs.

        manager.applier = EventApplier(
            manager.inventory,
            manager.backend,
            on_change=inventory_changed,
            full_sync=manager.inventory.trigger,
        )
        manager.events = EventWatcher(
            manager.backend,
            manager.inventory.trigger,
            kind=manager.name,
            idle_timeout_s=self.settings.inventory.events_idle_seconds,
            metrics=self.metrics.inventory,
            on_event=manager.applier.offer,
        )
        self.supervisor.spawn(self._loop_name("inventory-events", manager.name), manager.events.run)
        self.supervisor.spawn(self._loop_name("inventory-apply", manager.name), manager.applier.run)

    async def _stop_leading(self, drain_s: float) -> None:
        """Stop the leader's parts, letting in-flight claim work finish for up to ``drain_s``
        seconds (then it is cancelled).

        Cancellation-safe: a part is dropped from :class:`Leadership` only once it has stopped,
        and ``self.leading`` only once all have, so a stop cut short (the service's deadline)
        is finished by the next call.
        """
        task, self._lead_task = self._lead_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        leading = self.leading
        if leading is None:
            return
        if leading.node_reports is not None:
            await leading.node_reports.stop()
            leading.node_reports = None
        for manager in leading.managers.values():
            for loop in ("inventory", "inventory-events", "inventory-apply"):
                await self.supervisor.stop_one(self._loop_name(loop, manager.name))
        await self.supervisor.stop_one("publish")
        if leading.claims is not None:
            await leading.claims.stop(drain_s=drain_s)
            leading.claims = None
        if leading.control_plane is not None:
            await leading.control_plane.stop(events_timeout_s=min(EVENTS_FLUSH_S, drain_s))
            leading.control_plane = None
        while leading.publishers:
            version = next(iter(leading.publishers))
            await leading.publishers[version].stop()
            del leading.publishers[version]
        self.leading = None

    async def _inventory_loop(self, leading: Leadership, manager: ManagerInventory) -> None:
        settings = self.settings.inventory
        first = True
        if manager.events is not None:
            # The stream asks for a sync once it opens (events before it are lost): the first
            # sync, if it begins listing after that, is that sync; without the wait, a second
            # full listing would follow the first at once.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(manager.events.tried.wait(), FIRST_OPEN_WAIT_S)
        while True:
            listed_from = utcnow()
            result = await manager.inventory.sync_once()
            manager.last_result = self.last_inventory = result
            if result.ok:
                leading.inventory_synced = True
            if result.ok and (first or result.row_writes):
                leading.publish_wanted.set()
                if leading.control_plane is not None:
                    leading.control_plane.mark_inventory_changed()
                if leading.claims is not None and result.hosts_written:
                    leading.claims.hosts_changed()
                first = False
            if result.ok:
                await self._check_drift(leading, listed_from, manager.name)
            # Polling is the safety net: less often while the event stream is healthy and the
            # sync succeeded (a failing fabric manager is retried at the short interval, so
            # that it is marked stale as soon as without events).
            streaming = manager.events is not None and manager.events.healthy
            interval = (
                settings.events_poll_interval_seconds
                if streaming and result.ok
                else settings.poll_interval_seconds
            )
            await manager.inventory.wait_trigger(interval)

    async def _check_drift(
        self, leading: Leadership, listed_from: dt.datetime, manager: str | None = None
    ) -> None:
        """Compare the journal with what the sync of ``manager`` just read (DESIGN.md
        invariant 8); only that manager's devices are judged, by that listing's time."""
        targets: dict[str, DriftTarget] = {}
        if leading.claims is not None:
            targets["structured"] = leading.claims.drift_target()
        if leading.control_plane is not None:
            targets["control-plane"] = leading.control_plane.drift_target()
        if not targets:
            return
        watch = DriftWatch(Journal(self.db), self.db, targets)
        try:
            drifts = await watch.check(listed_from, manager)
        except SQLAlchemyError as err:
            log.warning("drift check failed (tried again after the next sync): %s", err)
            return
        self._drift[manager] = drifts
        if drifts:
            leading.publish_wanted.set()

    async def _publish_loop(self, leading: Leadership) -> None:
        published_with: dict[ResourceApiVersion, bool] = {}  # taints_supported last used
        waiting_logged = False
        # One per version: after a change, only the pools that changed are laid out again.
        caches: dict[ResourceApiVersion, PoolCache] = {}
        rows = PoolDeviceCache()
        # What the last pass handed each publisher, and each device's pool then: a pass for
        # a few units reads and lays out only the pools they are (or were) in.
        last: dict[ResourceApiVersion, dict[str, DesiredPool]] = {}
        pool_of: dict[str, str] = {}
        keys = self.settings.grouping_keys()
        while True:
            await _first_of(leading.publish_wanted, leading.publish_partial, timeout_s=5.0)
            supported = _taints_supported(leading)
            full = leading.publish_wanted.is_set() or supported != published_with
            if not full and leading.publish_partial.is_set() and last:
                leading.publish_partial.clear()
                units, leading.publish_units = leading.publish_units, set()
                await self._publish_units(leading, units, supported, last, pool_of)
                continue
            if not full and not leading.publish_partial.is_set():
                continue
            leading.publish_wanted.clear()
            leading.publish_partial.clear()
            leading.publish_units.clear()
            devices = await pool_devices(self.db, cache=rows, managers=self._managers())
            if not devices and not leading.inventory_synced:
                # An empty database before any successful sync is not an empty fabric:
                # publishing it would delete every slice the driver has in the cluster.
                if not waiting_logged:
                    log.warning(
                        "no inventory yet (the fabric manager has not been listed "
                        "successfully): ResourceSlices are left as they are until "
                        "the first sync succeeds"
                    )
                    waiting_logged = True
                continue
            for version, ok in supported.items():
                if not ok and published_with.get(version) is not False:
                    log.warning(
                        "the API server drops device taints on %s (DRADeviceTaints "
                        "is off): unhealthy, cordoned and failed devices are withheld "
                        "instead",
                        version.value,
                    )
            published_with = supported
            for version, publisher in leading.publishers.items():
                cache = caches.setdefault(version, PoolCache())
                last[version] = self._pools_for(devices, version, supported[version], cache)
                publisher.set_desired(last[version])
            pool_of.clear()
            for device in devices:
                pool_of[device.name] = pool_name(device.location, keys)

    async def _publish_units(
        self,
        leading: Leadership,
        units: set[str],
        supported: dict[ResourceApiVersion, bool],
        last: dict[ResourceApiVersion, dict[str, DesiredPool]],
        pool_of: dict[str, str],
    ) -> None:
        """Lay out again only the pools the devices of ``units`` are in now or were in at
        the last pass, and hand each publisher the last desired state with those pools
        replaced (or removed when they have no device left). The result equals a full pass
        when nothing but those units changed since the last one."""
        keys = self.settings.grouping_keys()
        changed = await unit_locations(self.db, units)
        affected: dict[str, dict[str, str | None]] = {}
        for name, location, removed in changed:
            old = pool_of.get(name)
            if old is not None:
                for pools in last.values():
                    if old in pools:
                        affected[old] = dict(pools[old].location)
                        break
            if not removed:
                affected[pool_name(location, keys)] = {k: getattr(location, k) for k in keys}
        if not affected:
            return
        devices = await pool_devices(
            self.db, where=located_in(affected.values()), managers=self._managers()
        )
        for version, publisher in leading.publishers.items():
            fresh = self._pools_for(devices, version, supported[version])
            pools = dict(last.get(version) or {})
            for name in affected:
                if name in fresh:
                    pools[name] = fresh[name]
                else:
                    pools.pop(name, None)
            last[version] = pools
            publisher.set_desired(pools)
        for name, location, removed in changed:
            if removed:
                pool_of.pop(name, None)
            else:
                pool_of[name] = pool_name(location, keys)

    def _pools_for(
        self,
        devices: list[PoolDevice],
        version: ResourceApiVersion,
        taints_supported: bool,
        cache: PoolCache | None = None,
    ) -> dict[str, DesiredPool]:
        """The pools published in ``version`` (the publish loop and the what-if both use
        this, so that the what-if sees exactly what the scheduler is offered); ``cache``
        reuses the pools that did not change since the last call with it."""
        return desired_pools(
            devices,
            publishing_config(self.settings, version, taints_supported=taints_supported),
            cache,
        )

    async def published_pools(self) -> dict[str, DesiredPool]:
        """The pools as this service publishes them now, in the version it publishes: with
        device taints only where the leading publisher has not seen the API server drop them
        (a replica that does not lead assumes they are kept).

        Raises:
            ValueError: no mode to publish for (see :func:`publisher_versions`).
        """
        version = publisher_versions(self.version, self.control_plane_served)[0]
        supported = _taints_supported(self.leading).get(version, True)
        return self._pools_for(
            await pool_devices(self.db, managers=self._managers()), version, supported
        )

    def _live_informers(self) -> list[Any]:
        leading = self.leading
        if leading is None:
            return []
        found: list[Any] = []
        for publisher in leading.publishers.values():
            found.extend(publisher.informers())
        for component in (leading.claims, leading.control_plane, leading.node_reports):
            if component is not None:
                found.extend(component.informers())
        return found

    def work_on_claim(self, claim: ClaimRef) -> None:
        """Queue ``claim`` in the leader's claim controllers (after an admin action released
        one of its reservations); nothing when this replica does not lead."""
        leading = self.leading
        if leading is None:
            return
        if leading.claims is not None:
            leading.claims.queue.add(claim.uid)
        if leading.control_plane is not None:
            leading.control_plane.queue.add(("claim", claim.uid, ""))

    def request_publish(self) -> None:
        """Recompute the desired pools soon (after an admin action, say)."""
        if self.leading is not None:
            self.leading.publish_wanted.set()

    # ------------------------------------------------------------------ health
    def health_checks(self) -> list[tuple[str, bool, str]]:
        """Liveness: no loop in a crash loop."""
        looping = self.supervisor.crash_looping()
        return [
            (
                "loops",
                not looping,
                "; ".join(f"{s.name}: {s.last_error}" for s in looping) or "running",
            )
        ]

    async def readiness_checks(self) -> list[tuple[str, bool, str]]:
        """Readiness: database reachable, leader state known, the leader's parts started and
        their caches synced, loops running (a standby replica is ready without them).

        A stale inventory is listed but does not fail readiness, deliberately: the fault is
        the fabric manager's, which no restart or traffic shift of ours fixes, and an unready
        pod would hide the dashboard and the status API when an operator needs them. It is
        an alert instead (``fabric_dra_inventory_stale``, the dashboard's banner).
        """
        checks: list[tuple[str, bool, str]] = []
        try:
            await self.db.ping()
        except Exception as err:
            checks.append(("database", False, _one_line(err)))
        else:
            checks.append(("database", True, "reachable"))
            checks.extend(await self._inventory_checks())
        if self.elector is not None:
            known = self.elector.is_leader.is_set() or self.elector.leader_identity is not None
            checks.append(("leader", known, f"leader is {self.elector.leader_identity or '?'}"))
        leading = self.leading
        if (leading is None or not leading.started) and (
            self.elector is None or self.elector.is_leader.is_set()
        ):
            # Leading (always, without leader election) but its publishers and controllers
            # are not all started: until they are, nothing below would say "not synced".
            checks.append(("leading", False, "starting the leader's loops"))
        if leading is not None:
            for version, publisher in leading.publishers.items():
                synced = publisher.status().synced
                checks.append(
                    (
                        f"publisher {version.value}",
                        synced,
                        "synced" if synced else _publisher_waits_for(leading),
                    )
                )
            if leading.claims is not None:
                healthy = leading.claims.is_healthy()
                checks.append(("claims", healthy, "watching" if healthy else "not synced"))
            if leading.control_plane is not None:
                healthy = leading.control_plane.is_healthy()
                checks.append(("control-plane", healthy, "watching" if healthy else "not synced"))
        down = self.supervisor.down()
        checks.append(
            (
                "loops",
                not down,
                "; ".join(f"{s.name} down: {s.last_error}" for s in down) or "running",
            )
        )
        return checks

    def _managers_status(
        self, leading: Leadership | None, inventory: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Each configured fabric manager: its URL, its inventory's state (stale, counts,
        last error) and its event stream's, in configuration order."""
        by_backend = {status.get("backend"): status for status in inventory}
        out = []
        for manager in self.settings.managers:
            name = manager.manager
            loop = leading.managers.get(name) if leading is not None else None
            events: dict[str, Any]
            if loop is not None and loop.events is not None:
                events = {
                    **loop.events.status(),
                    "applied": loop.applier.applied if loop.applier else 0,
                    "full_syncs_asked": loop.applier.fallbacks if loop.applier else 0,
                    "unknown": loop.applier.unknown if loop.applier else 0,
                }
            else:
                events = {"state": "off" if not self.settings.inventory.events else "standby"}
            status = by_backend.get(name)
            out.append(
                {
                    "name": name,
                    "kind": manager.kind,
                    "url": manager.url,
                    "state": (
                        "unknown"
                        if status is None
                        else "stale"
                        if status.get("stale")
                        else "failing"
                        if status.get("consecutive_failures")
                        else "ok"
                    ),
                    "inventory": status,
                    "events": events,
                }
            )
        return out

    async def _inventory_checks(self) -> list[tuple[str, bool, str]]:
        """A passing check per stale inventory (see :meth:`readiness_checks`), or one failing
        check when the inventory status cannot be read (the schema missing or behind)."""
        checks: list[tuple[str, bool, str]] = []
        try:
            statuses = await list_status(self.db)
        except Exception as err:
            return [("inventory status", False, f"{_one_line(err)} (is the schema at head?)")]
        for status in statuses:
            if status.stale:
                since = status.last_success_at.isoformat() if status.last_success_at else "never"
                checks.append(
                    (
                        f"inventory {status.backend}",
                        True,
                        f"stale (last complete sync {since}); not a readiness failure: "
                        "alert on fabric_dra_inventory_stale",
                    )
                )
        return checks

    async def status(self) -> dict[str, Any]:
        """A JSON-ready summary of the live parts."""
        leading = self.leading
        inventory = [s.to_json() for s in await list_status(self.db)]
        managers = self._managers_status(leading, inventory)
        result: dict[str, Any] = {
            "identity": self.identity,
            "driver": self.settings.driver_name,
            "mode": self.mode,
            "resource_api_version": self.version.value if self.version else None,
            "uptime_seconds": round(time.monotonic() - self._started_at, 1),
            "leader": {
                "enabled": self.elector is not None,
                "is_leader": leading is not None,
                "holder": self.elector.leader_identity if self.elector else self.identity,
                "transitions": self.elector.transitions_seen if self.elector else 0,
                "lost_count": self.elector.lost_count if self.elector else 0,
                "lost_at": (
                    self.elector.lost_at.isoformat()
                    if self.elector and self.elector.lost_at
                    else None
                ),
            },
            "inventory": inventory,
            # The first (or only) manager's event stream; "managers" has every one's.
            "inventory_events": managers[0]["events"],
            "managers": managers,
            "loops": [dataclasses.asdict(s) for s in self.supervisor.states()],
            # What the last drift check found (each acted on: attached again, or failed).
            "drift": [
                {
                    "kind": d.kind,
                    "claim": str(d.reservation.claim),
                    "device": d.reservation.device_name,
                    "host": d.reservation.host_id,
                    "reason": d.reason,
                }
                for d in self.last_drift
            ],
        }
        if leading is not None and leading.publishers:
            main = leading.publishers.get(self.version) if self.version else None
            result["publisher"] = (
                (main or next(iter(leading.publishers.values()))).status().to_json()
            )
            if len(leading.publishers) > 1:
                result["publishers"] = {
                    v.value: p.status().to_json() for v, p in leading.publishers.items()
                }
        if leading is not None and leading.claims is not None:
            result["claims"] = leading.claims.status()
        if leading is not None and leading.control_plane is not None:
            result["control_plane"] = leading.control_plane.status()
        return result

    # ------------------------------------------------------------------ admin
    async def _start_admin(self) -> None:
        """Serve the admin endpoint on ``admin.host``:``admin.port``; the bound port is stored
        in :attr:`admin_port` (useful with port 0).

        Raises:
            ConfigError: the admin token file cannot be read.
            OSError: the address is in use or cannot be bound (the message names admin.host
                and admin.port).
        """
        from app.admin.app import serve

        admin = self.settings.admin
        context = self._admin_context = self.admin_context()
        try:
            self._admin = await serve(context, admin.host, admin.port)
        except OSError as err:
            raise OSError(
                f"admin endpoint on admin.host {admin.host!r}, admin.port {admin.port}: "
                f"{err.strerror or err}"
            ) from err
        address = self._admin.addresses[0] if self._admin.addresses else None
        self.admin_port = address[1] if isinstance(address, tuple) else admin.port
        host = f"[{admin.host}]" if ":" in admin.host else admin.host
        log.info("admin endpoint listening on http://%s:%s", host, self.admin_port)
        if not admin.require_token_for_reads and admin.host not in (
            "127.0.0.1",
            "::1",
            "localhost",
        ):
            # The default: reads (state, metrics, dashboard) answer anyone who can reach the
            # port; actions always need the token.
            log.warning(
                "admin endpoint: reads need no token (admin.require_token_for_reads is false) "
                "and it listens on %s, reachable from other hosts; actions need the token",
                admin.host,
            )

    async def _history_loop(self) -> None:
        """Sample the dashboard's charts every ``admin.history_interval_seconds``; a failed
        sample (the database away, say) is logged and the next one tried on time."""
        context = self._admin_context
        assert context is not None
        interval = self.settings.admin.history_interval_seconds
        while True:
            try:
                await take_sample(context, self.history, time.time())
            except Exception as err:
                log.warning("dashboard history: sample failed: %s", err)
            await asyncio.sleep(interval)

    def admin_context(self) -> AdminContext:
        """Everything the admin endpoint reads and calls, wired to this service's parts (the
        admin package knows nothing of :class:`Service`).

        Raises:
            ConfigError: the admin token file cannot be read.
        """
        settings = self.settings
        assert self.backend is not None
        token = (
            read_secret(settings.admin.token_file, "admin.token_file")
            if settings.admin.token_file
            else None
        )
        pool_config = PoolConfig.from_settings(settings)
        journal = Journal(self.db)
        # A force-release goes through the controllers' own release routine.
        ops = FabricOps(
            journal,
            self.backend,
            None,
            metrics=self.metrics.claims,
            on_failed_device=self.request_publish,
            max_detach_attempts=settings.controller.detach_attempts,
        )
        actions = DatabaseActions(
            self.db,
            journal,
            self.backend,
            pool_config,
            on_change=self.request_publish,
            ops=ops,
            on_release=self.work_on_claim,
        )

        async def readiness() -> list[Check]:
            return [Check(n, ok, m) for n, ok, m in await self.readiness_checks()]

        return AdminContext(
            db=self.db,
            registry=self.metrics.registry,
            health=lambda: [Check(n, ok, m) for n, ok, m in self.health_checks()],
            readiness=readiness,
            status=self.status,
            actions=actions,
            driver_name=settings.driver_name,
            claim_view=self.claim_view,
            publisher_status=self.publisher_pools_status,
            what_if=self.what_if if self.kube is not None else None,
            token=token,
            require_token_for_reads=settings.admin.require_token_for_reads,
            max_request_bytes=settings.admin.max_request_bytes,
            pool_config=pool_config,
            history=self.history,
        )

    async def claim_view(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The live claim reconciler's view of one claim: ``{"claim": <cached claim or None>,
        "errors": [{"at", "message"}, ...]}``, or None when it is not running here."""
        leading = self.leading
        if leading is None or leading.claims is None:
            return None
        reconciler = leading.claims
        errors = [
            {"at": e.at.isoformat(), "message": e.message}
            for e in reconciler.recent_errors
            if e.subject == f"{namespace}/{name}"
        ]
        return {"claim": reconciler.claims.get(name, namespace), "errors": errors}

    def publisher_pools_status(self) -> dict[str, Any]:
        """The main publisher's status per pool, ``{pool: {...}}`` (empty when not leading)."""
        leading = self.leading
        if leading is None or not leading.publishers:
            return {}
        publisher = (leading.publishers.get(self.version) if self.version else None) or next(
            iter(leading.publishers.values())
        )
        pools = publisher.status().to_json().get("pools") or {}
        return (
            dict(pools)
            if isinstance(pools, dict)
            else {str(p.get("name")): p for p in pools if isinstance(p, dict)}
        )

    async def what_if(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Which nodes and pools could satisfy the claim ``spec`` (v1 JSON) now: the
        allocator over exactly the pools this service publishes (:meth:`published_pools`),
        the API server's DeviceClasses and Nodes, and the devices reserved now.

        Returns:
            :func:`app.admin.whatif.what_if_answer`'s ``{"nodes": [...]}``.

        Raises:
            KubeError: DeviceClasses or Nodes could not be listed.
        """
        assert self.kube is not None
        classes: list[dict[str, Any]] = []
        if self.version is not None:
            body = await call_json(
                resource_api(self.kube.api, self.version).list_device_class(_preload_content=False),
                "list DeviceClasses",
            )
            classes = [
                device_class_from_wire(item, self.version) for item in body.get("items") or []
            ]
        nodes = await self.list_nodes()
        pools = await self.published_pools()
        driver = self.settings.driver_name
        in_use = {(driver, r.pool, r.device_name) for r in await Journal(self.db).active()}
        if self._allocator is None:
            self._allocator = Allocator()
        return what_if_answer(
            spec,
            driver_name=driver,
            device_classes=classes,
            nodes=nodes,
            pools=pools.values(),
            in_use=in_use,
            allocator=self._allocator,
        )

    async def _stop_admin(self) -> None:
        if self._admin is not None:
            await self._admin.cleanup()
            self._admin = None

    async def list_nodes(self) -> list[dict[str, Any]]:
        """Every Node from the API server (JSON)."""
        assert self.kube is not None
        body = await call_json(
            CoreV1Api(self.kube.api).list_node(_preload_content=False), "list Nodes"
        )
        return list(body.get("items") or [])


def _taints_supported(leading: Leadership | None) -> dict[ResourceApiVersion, bool]:
    """Per published version: the API server keeps device taints (its publisher has not seen
    them dropped)."""
    if leading is None:
        return {}
    return {v: not p.taints_dropped for v, p in leading.publishers.items()}
