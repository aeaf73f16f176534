"""Fabric operations on journalled reservations, shared by both allocation modes.

The structured reconciler (:mod:`app.claims.reconciler`) and the control-plane controller
(:mod:`app.controlplane.controller`) attach, detach, release and recover reservations the same
way, and the admin API's force-release releases through the same :meth:`FabricOps.release_once`
(DESIGN.md invariants 1-3):

* attach: ``attaching`` is written (compare-and-set, attempt counted) before the call is sent;
  success moves to ``attached`` and records an ``Attached`` Event; a permanent failure, or a
  retryable one past ``maxAttachAttempts``, moves to ``failed`` with a Warning ``AttachFailed``
  Event;
* release: a ``pending`` reservation is released at once (nothing was sent); any other goes
  through ``detaching`` before the detach call; a device or host gone from the fabric, or held
  by another host, counts as detached; a permanent refusal, or too many transient failures in
  a row, ends in the terminal ``detach-failed`` (Event, metric, admin status) that only an
  operator's *forget* clears;
* every operation the fabric runs as a task has its monitor journalled before it is polled,
  and is followed (not sent again) after a restart; the backend verifies each attach and
  detach against the fabric before it reports success;
* drift: :meth:`FabricOps.lost` and :meth:`FabricOps.moved` act on attached devices that the
  fabric no longer shows on their host (see :mod:`app.claims.drift`);
* recovery after a restart: ``attaching`` becomes ``attached`` when the fabric shows the device
  on the host, else ``pending``; ``detaching`` becomes ``released`` when it is no longer there.
  Recovery is limited to the reservations of the given modes, so that one mode's recovery
  never moves a reservation the other mode is driving at that moment.

Events go through :class:`EventRecorder` (core/v1 Events on the claim; losing one is logged,
never raised).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from app.aio import cancel_and_wait
from app.claims.model import (
    MOVED_MARK,
    REASON_ATTACH_FAILED,
    REASON_ATTACHED,
    REASON_DETACH_FAILED,
    REASON_DEVICE_LOST,
    REASON_DEVICE_MOVED,
    DeviceReport,
    EffectiveConfig,
    WantedDevice,
    device_identity_data,
    rfc3339,
)
from app.clock import utcnow
from app.fabric.backend import FabricBackend
from app.fabric.errors import FabricConflict, FabricError, FabricNotFound
from app.fabric.fleet import member
from app.fabric.types import FabricDevice
from app.journal import (
    ATTACHED,
    ATTACHING,
    DETACH_FAILED,
    DETACHING,
    FAILED,
    PENDING,
    RELEASED,
    Journal,
    ReservationView,
    UnknownDevice,
)
from app.kube.client import call_json
from app.kube.errors import KubeError
from app.metrics import ClaimMetrics

log = logging.getLogger(__name__)

EVENT_FLUSH_S = 5.0
"""How long a stopping controller sends the Events still queued (seconds); the rest are
dropped and counted."""
REASON_DETACHED = "Detached"
DEFAULT_ATTACH_TRIES_WITH_LOSSES = 10
"""Attach tries over a reservation's life, re-attaches after losses included, after which a
device lost again is given up."""
DEFAULT_DETACH_ATTEMPTS = 15
"""Transient detach failures in a row before ``detach-failed``: with the work queue's default
backoff (5 ms doubling) about 160 s of trying, on top of the backend's own retries per call."""


class EventRecorder:
    """Records core/v1 Events on ResourceClaims, in the background.

    :meth:`record` only queues the Event; a task of its own sends the queue in order, so that
    an Event never holds up the claim it is about (client-go's recorder works the same way:
    Events go through a buffered broadcaster). When ``max_queued`` Events wait (the API
    server is slow or away), new ones are dropped, counted in ``dropped`` and logged: an
    Event is a courtesy, the claim's status is the record. :meth:`close` sends what is queued
    (for a bounded time) and stops.

    Args:
        core: the CoreV1Api to create Events with.
        identity: this replica's name (``reportingInstance``).
        claim_api_version: ``involvedObject.apiVersion`` when the claim JSON has none.
        clock: aware UTC time.
        max_queued: how many Events may wait to be sent.
    """

    def __init__(
        self,
        core: CoreV1Api,
        identity: str,
        claim_api_version: str,
        clock: Callable[[], dt.datetime] = utcnow,
        *,
        max_queued: int = 1000,
    ) -> None:
        self.core = core
        self.identity = identity
        self.claim_api_version = claim_api_version
        self.clock = clock
        self.sent = 0
        self.dropped = 0
        self._queue: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue(max_queued)
        self._sender: asyncio.Task[None] | None = None
        self._closed = False

    async def record(self, claim: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Queue one Event (``type_`` Normal or Warning; ``reason`` CamelCase; the message is
        cut to 1,024 characters). Never raises and never waits for the API server."""
        metadata = claim.get("metadata") or {}
        namespace = str(metadata.get("namespace") or "default")
        now = rfc3339(self.clock())
        body: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{metadata.get('name')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": claim.get("apiVersion", self.claim_api_version),
                "kind": "ResourceClaim",
                "name": metadata.get("name"),
                "namespace": namespace,
                "uid": metadata.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": "fabric-dra"},
            "reportingComponent": "fabric-dra",
            "reportingInstance": self.identity,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        what = f"{reason} on ResourceClaim {namespace}/{metadata.get('name')}"
        if self._closed:
            await self._send(namespace, what, body)
            return
        try:
            self._queue.put_nowait((namespace, what, body))
        except asyncio.QueueFull:
            self.dropped += 1
            log.info(
                "dropped event %s: %d events are waiting to be sent", what, self._queue.qsize()
            )
            return
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_loop(), name="event-recorder")

    def open(self) -> None:
        """Queue Events again after :meth:`close` (a component started again)."""
        self._closed = False

    def pending(self) -> int:
        """How many Events wait to be sent."""
        return self._queue.qsize()

    async def flush(self) -> None:
        """Wait until every queued Event was sent (or given up)."""
        await self._queue.join()

    async def close(self, timeout_s: float = EVENT_FLUSH_S) -> None:
        """Send what is queued (up to ``timeout_s`` seconds; the rest is dropped) and stop.
        Events recorded after this are sent at once, in the caller's task."""
        self._closed = True
        if self._sender is None:
            return
        try:
            await asyncio.wait_for(self._queue.join(), timeout_s)
        except TimeoutError:
            left = 0
            while not self._queue.empty():
                self._queue.get_nowait()
                self._queue.task_done()
                left += 1
            self.dropped += left
            log.info("dropped %d events not sent within %.1f s of shutdown", left, timeout_s)
        await cancel_and_wait(self._sender)
        self._sender = None

    async def _send_loop(self) -> None:
        while True:
            namespace, what, body = await self._queue.get()
            try:
                await self._send(namespace, what, body)
            except asyncio.CancelledError:
                self.dropped += 1  # cut off by close(): lost
                raise
            except Exception as err:  # the sender must outlive any one bad Event
                log.warning("could not record event %s: %r", what, err)
            finally:
                self._queue.task_done()

    async def _send(self, namespace: str, what: str, body: Any) -> None:
        try:
            await call_json(
                self.core.create_namespaced_event(namespace, body, _preload_content=False),
                f"create Event {what}",
            )
            self.sent += 1
        except KubeError as err:
            # Losing an Event must not hold up the claim.
            log.info("could not record event %s: %s", what, err)


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    """What one pass of :meth:`FabricOps.release_once` did.

    Attributes:
        done: nothing more to do: released, or ended (or left) ``detach-failed``. False: a
            transient detach failure to try again, or another worker moved it first.
        reservation: the reservation as the pass left it in the journal, or None when
            another worker moved it first (the pass wrote nothing, or its last write lost).
    """

    done: bool
    reservation: ReservationView | None


class FabricOps:
    """Attach, release and recover journalled reservations through the fabric backend.

    Args:
        journal: the reservation journal.
        backend: the fabric backend.
        events: where Events go (None: no Events, e.g. for the admin API's force-release).
        metrics: optional (``fabric_operations``, ``attach_seconds``, ``drift``, ``terminal``).
        clock: aware UTC time.
        on_error: called with (claim uid, message) for each problem worth showing on the
            admin API; optional.
        on_failed_device: called when a device's attach or detach failed for good (so that
            the publisher stops offering it); optional.
        checkpoint: awaited at ``after-intent`` (attaching written, attach not sent) and
            ``after-attach`` (attach done, not yet recorded); crash tests stop there.
        max_detach_attempts: transient detach failures in a row before the reservation ends
            ``detach-failed`` (a permanent refusal ends it at once).
        max_attach_tries_with_losses: attach tries (over a reservation's life, losses
            included) after which a device that loses its attachment again is given up.
    """

    def __init__(
        self,
        journal: Journal,
        backend: FabricBackend,
        events: EventRecorder | None,
        *,
        metrics: ClaimMetrics | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        on_error: Callable[[str, str], None] | None = None,
        on_failed_device: Callable[[], None] | None = None,
        checkpoint: Callable[[str], Awaitable[None]] | None = None,
        max_detach_attempts: int = DEFAULT_DETACH_ATTEMPTS,
        max_attach_tries_with_losses: int = DEFAULT_ATTACH_TRIES_WITH_LOSSES,
    ) -> None:
        if max_detach_attempts < 1:
            raise ValueError(f"max_detach_attempts must be >= 1, got {max_detach_attempts}")
        self.journal = journal
        self.backend = backend
        self.events = events
        self.metrics = metrics
        self.clock = clock
        self.on_error = on_error
        self.on_failed_device = on_failed_device
        self.checkpoint = checkpoint
        self.max_detach_attempts = max_detach_attempts
        self.max_attach_tries_with_losses = max_attach_tries_with_losses

    async def _at(self, step: str) -> None:
        if self.checkpoint is not None:
            await self.checkpoint(step)

    async def _record(
        self, claim: Mapping[str, Any], type_: str, reason: str, message: str
    ) -> None:
        if self.events is not None:
            await self.events.record(claim, type_, reason, message)

    def _error(self, uid: str, message: str) -> None:
        if self.on_error is not None:
            self.on_error(uid, message)

    def _metric(self, operation: str, result: str) -> None:
        if self.metrics:
            self.metrics.fabric_operations.labels(operation, result).inc()

    def _terminal(self, state: str) -> None:
        if self.metrics:
            self.metrics.terminal.labels(state).inc()
        if self.on_failed_device:
            self.on_failed_device()

    def _journal_operation(
        self, reservation_id: int, state: str
    ) -> Callable[[str], Awaitable[None]]:
        """A backend ``on_operation`` callback: store the task monitor in the journal before
        the backend polls it, so that a restarted controller follows that monitor instead of
        sending the operation a second time (which could attach twice)."""

        async def record(op_id: str) -> None:
            await self.journal.transition(reservation_id, [state], state, operation_id=op_id)

        return record

    async def attach(
        self,
        reservation: ReservationView,
        claim: Mapping[str, Any] | None,
        config: EffectiveConfig,
        *,
        device: FabricDevice | None = None,
    ) -> tuple[DeviceReport, bool]:
        """Attach a ``pending`` (or, after a crash, ``attaching``) reservation.

        An ``attaching`` reservation with a stored ``operation_id`` (a task the fabric
        accepted before a restart) is finished by following that task, not by a new call.
        The backend verifies every attach against the fabric before it returns.

        Args:
            device: given when ``reservation`` was just written as ``attaching`` with its
                attempt counted (:meth:`app.journal.Journal.reserve_for_attach`): the intent
                is already journalled and the attach is sent at once.

        Returns:
            (the report for the device, True when it must be tried again later: another
            worker moved the reservation, or a retryable failure under the attempt limit).
            A device attached before (its attachment was lost) reports ``DeviceLost``
            (not ready, not failed) while it is attached again.

        Raises:
            SQLAlchemyError: the journal could not be written (retry the whole step).
            UnknownDevice: the device row is gone.
        """
        key = WantedDevice(reservation.request, reservation.pool, reservation.device_name)
        if device is None:
            begun = await self.journal.begin_attach(reservation.id)
            if begun is None:
                return DeviceReport(key, None, "", ""), True
            moving, device = begun
        else:
            moving = reservation
        assert moving.host_id is not None
        await self._at("after-intent")
        started = time.monotonic()
        try:
            call = (
                self.backend.resume(moving.operation_id, device, moving.host_id, attach=True)
                if moving.operation_id
                else self.backend.attach(
                    device,
                    moving.host_id,
                    on_operation=self._journal_operation(moving.id, ATTACHING),
                )
            )
            if config.attach_timeout_s is not None:
                async with asyncio.timeout(config.attach_timeout_s):
                    await call
            else:
                await call
        except (FabricError, TimeoutError) as err:
            reason = str(err) or f"no answer within {config.attach_timeout_s}s"
            message = f"attach {reservation.device_name} to host {moving.host_id}: {reason}"
            retryable = isinstance(err, TimeoutError) or (
                isinstance(err, FabricError) and err.retryable
            )
            again = retryable and moving.attempts < config.max_attach_attempts
            # A task that may still run keeps its monitor for the next try to follow.
            keep_operation = isinstance(getattr(err, "op_id", None), str)
            self._metric("attach", "retry" if again else "failed")
            if again:
                await self.journal.transition(
                    moving.id,
                    [ATTACHING],
                    ATTACHING,
                    error=message,
                    clear_operation=not keep_operation,
                )
                self._error(moving.claim.uid, message)
                log.warning(
                    "claim %s: %s (attempt %d of %d; tried again with backoff)",
                    moving.claim,
                    message,
                    moving.attempts,
                    config.max_attach_attempts,
                )
                if moving.attached_at is not None:
                    return DeviceReport(key, False, REASON_DEVICE_LOST, message, failed=False), True
                return DeviceReport(key, None, "", ""), True
            await self.journal.transition(
                moving.id, [ATTACHING], FAILED, error=message, clear_operation=True
            )
            self._error(moving.claim.uid, message)
            log.warning("claim %s: %s", moving.claim, message)
            if claim is not None:
                await self._record(claim, "Warning", REASON_ATTACH_FAILED, message)
            self._terminal(FAILED)
            return DeviceReport(key, False, REASON_ATTACH_FAILED, message), False
        await self._at("after-attach")
        done = await self.journal.transition(moving.id, [ATTACHING], ATTACHED, clear_operation=True)
        self._metric("attach", "ok")
        elapsed = time.monotonic() - started
        if self.metrics:
            self.metrics.attach_seconds.observe(elapsed)
        log.info(
            "claim %s: device %s attached%s to node %s (fabric host %s) in %.0f ms",
            moving.claim,
            reservation.device_name,
            " again" if moving.attached_at is not None else "",
            moving.node,
            moving.host_id,
            elapsed * 1e3,
        )
        if claim is not None:
            once_more = " again" if moving.attached_at is not None else ""
            await self._record(
                claim,
                "Normal",
                REASON_ATTACHED,
                f"device {reservation.device_name} attached{once_more} to "
                f"node {moving.node} (fabric host {moving.host_id})",
            )
        return self.ready_report(key, done or moving, device), False

    def ready_report(
        self, key: WantedDevice, reservation: ReservationView, device: FabricDevice | None = None
    ) -> DeviceReport:
        """The report of an attached device.

        ``data``: host, node, attachedAt, and what the node plugin needs to find the device
        on the host, as the fabric reports it (:func:`app.claims.model.device_identity_data`:
        deviceType, uuid, serialNumber, pciVendorId, pciDeviceId, slot, when known).
        """
        data: dict[str, Any] = {
            "host": reservation.host_id,
            "node": reservation.node,
            "attachedAt": rfc3339(reservation.attached_at or self.clock()),
        }
        if device is not None:
            data.update(device_identity_data(device))
        return DeviceReport(
            key,
            True,
            REASON_ATTACHED,
            f"attached to node {reservation.node} (fabric host {reservation.host_id})",
            data,
        )

    async def release(self, reservation: ReservationView, claim: Mapping[str, Any] | None) -> bool:
        """Detach (when anything may have been sent) and release.

        Returns:
            True when there is nothing more to do: released, or ended ``detach-failed``
            (permanent refusal, or :attr:`max_detach_attempts` transient failures in a row:
            the device stays held and tainted until an operator forgets the reservation).
            False when another worker moved it or a transient failure is to be tried again
            with backoff.

        Raises:
            SQLAlchemyError: the journal could not be written.
        """
        return (await self.release_once(reservation, claim)).done

    async def release_once(
        self,
        reservation: ReservationView,
        claim: Mapping[str, Any] | None,
        *,
        note: str | None = None,
        retry_detach_failed: bool = False,
    ) -> ReleaseResult:
        """One pass of :meth:`release`, the one release routine of both modes and of the
        admin API's force-release, telling what it left in the journal.

        Args:
            note: who asked, journalled in every step's ``last_error`` (``"released by an
                administrator"``: ``"<note>: detaching"`` before the detach call, ``"<note>;
                detached from host H"`` after it, ...); None journals the controller's own
                messages.
            retry_detach_failed: a ``detach-failed`` reservation is detached again (an
                operator fixed what the fabric refused) instead of being left as it is.

        Returns:
            :class:`ReleaseResult`: ``done`` as :meth:`release` answers, and the reservation
            as this pass wrote it (None when another worker moved it first).

        Raises:
            SQLAlchemyError: the journal could not be written.
        """
        if reservation.state == DETACH_FAILED and not retry_detach_failed:
            return ReleaseResult(True, reservation)  # terminal: only an operator's forget ends it
        if reservation.state == PENDING:
            # Nothing was sent to the fabric for a pending reservation.
            done = await self.journal.transition(reservation.id, [PENDING], RELEASED, error=note)
            return ReleaseResult(done is not None, done)
        begun = await self.journal.begin_detach(
            reservation.id,
            error=f"{note}: detaching" if note else None,
            from_detach_failed=retry_detach_failed,
        )
        if begun is None:
            return ReleaseResult(False, None)
        moving, device = begun
        if moving.host_id is None:
            done = await self.journal.transition(
                moving.id,
                [DETACHING],
                RELEASED,
                error=f"{note} (no host was attached)" if note else None,
            )
            return ReleaseResult(True, done)
        try:
            if device is None:
                raise UnknownDevice(f"device {moving.device_name} is not in the inventory")
            if moving.operation_id:
                await self.backend.resume(moving.operation_id, device, moving.host_id, attach=False)
            else:
                await self.backend.detach(
                    device,
                    moving.host_id,
                    on_operation=self._journal_operation(moving.id, DETACHING),
                )
        except (UnknownDevice, FabricNotFound) as err:
            # The device or host is gone from the fabric: nothing is attached any more.
            done = await self.journal.transition(
                moving.id,
                [DETACHING],
                RELEASED,
                error=f"{note or 'released'} without detach: {err}",
                clear_operation=True,
            )
            self._metric("detach", "gone")
            return ReleaseResult(True, done)
        except FabricConflict as err:
            # The device is held by another host now: it is not attached to ours.
            done = await self.journal.transition(
                moving.id,
                [DETACHING],
                RELEASED,
                clear_operation=True,
                error=f"{note}; the device is held elsewhere: {err}" if note else str(err),
            )
            self._metric("detach", "conflict")
            return ReleaseResult(True, done)
        except FabricError as err:
            return await self._detach_failed(moving, claim, err, note)
        done = await self.journal.transition(
            moving.id,
            [DETACHING],
            RELEASED,
            detached=True,
            clear_operation=True,
            error=f"{note}; detached from host {moving.host_id}" if note else None,
        )
        self._metric("detach", "ok")
        log.info(
            "claim %s: device %s detached from fabric host %s%s",
            moving.claim,
            moving.device_name,
            moving.host_id,
            f" ({note})" if note else "",
        )
        if claim is not None:
            await self._record(
                claim,
                "Normal",
                REASON_DETACHED,
                f"device {moving.device_name} detached from fabric host {moving.host_id}",
            )
        return ReleaseResult(True, done)

    async def _detach_failed(
        self,
        moving: ReservationView,
        claim: Mapping[str, Any] | None,
        err: FabricError,
        note: str | None,
    ) -> ReleaseResult:
        message = f"detach {moving.device_name} from host {moving.host_id}: {err}"
        keep_operation = isinstance(getattr(err, "op_id", None), str)
        if err.retryable and moving.attempts < self.max_detach_attempts:
            journalled = (
                f"{note}, but detach from host {moving.host_id} failed: {err}" if note else message
            )
            again = await self.journal.transition(
                moving.id,
                [DETACHING],
                DETACHING,
                error=journalled,
                clear_operation=not keep_operation,
            )
            self._error(moving.claim.uid, message)
            self._metric("detach", "retry")
            log.warning(
                "claim %s: %s (attempt %d of %d; tried again with backoff)",
                moving.claim,
                message,
                moving.attempts,
                self.max_detach_attempts,
            )
            return ReleaseResult(False, again)
        why = (
            "the fabric manager refused it"
            if not err.retryable
            else f"it failed {moving.attempts} times in a row"
        )
        final = (f"{note}, but " if note else "") + (
            f"{message}; {why}. The device stays held and is not offered; fix it on the "
            "fabric, then forget the reservation (fabric-dra forget)"
        )
        done = await self.journal.transition(
            moving.id, [DETACHING], DETACH_FAILED, error=final, clear_operation=True
        )
        if done is None:
            return ReleaseResult(False, None)
        self._error(moving.claim.uid, final)
        self._metric("detach", "failed")
        log.error("claim %s: %s", moving.claim, final)
        await self._record(claim or _claim_stub(moving), "Warning", REASON_DETACH_FAILED, final)
        self._terminal(DETACH_FAILED)
        return ReleaseResult(True, done)

    async def _move_and_warn(
        self,
        reservation: ReservationView,
        expected: str,
        state: str,
        message: str,
        reason: str,
        claim: Mapping[str, Any] | None,
    ) -> ReservationView | None:
        """Move ``reservation`` from ``expected`` to ``state`` with ``message`` as its error
        (its operation forgotten); once moved, log ``message`` and send a Warning Event
        ``reason`` on the claim. Returns the moved reservation, or None when someone else
        moved it first (nothing logged or sent)."""
        moved = await self.journal.transition(
            reservation.id, [expected], state, error=message, clear_operation=True
        )
        if moved is not None:
            log.warning("claim %s: %s", reservation.claim, message)
            await self._record(claim or _claim_stub(reservation), "Warning", reason, message)
        return moved

    async def retry_repair(
        self, reservation: ReservationView, claim: Mapping[str, Any] | None = None
    ) -> ReservationView | None:
        """Try again a ``failed`` repair (:func:`app.claims.plan.repair_due`): back to
        ``attaching``, its attach tries counted from zero, with a Warning ``DeviceLost``
        Event; the caller attaches it. The device's attach-failed taint is lifted at the
        next publish.

        Returns:
            The reservation, ``attaching``; None when someone else moved it first.
        """
        message = (
            f"device {reservation.device_name} lost its attachment to host "
            f"{reservation.host_id} and could not be attached again; trying again "
            f"({reservation.last_error or 'failed'})"
        )
        moved = await self._move_and_warn(
            reservation, FAILED, ATTACHING, message, REASON_DEVICE_LOST, claim
        )
        if moved is None:
            return None
        if self.on_failed_device:
            self.on_failed_device()  # the taint of a failed device goes at the next publish
        return moved

    async def lost(
        self, reservation: ReservationView, reason: str, claim: Mapping[str, Any] | None = None
    ) -> bool:
        """An ``attached`` device the fabric no longer shows on its host (a fabric manager
        that restarted and forgot it, a detach by hand, a device gone from the fabric).

        It goes back to ``attaching`` (not ``pending``: a listing may lag behind the hardware,
        so the device may still be on the host, and a release must detach it), so that the
        claim's next pass attaches it again (idempotent), with a
        Warning ``DeviceLost`` Event and the ``drift{kind="lost"}`` metric. Attach tries count
        over the reservation's life: once it has used :attr:`max_attach_tries_with_losses`,
        a device lost again is given up instead (``failed``, the claim's failure condition
        with reason ``DeviceLost``, the device tainted): a device the fabric keeps dropping
        is not attached again at once, only after ``REPAIR_RETRY_S`` with fresh tries
        (:meth:`retry_repair`).

        Returns:
            True when the journal was moved (False: someone else moved it first).
        """
        if reservation.attempts >= self.max_attach_tries_with_losses:
            message = (
                f"device {reservation.device_name} lost its attachment to host "
                f"{reservation.host_id} again ({reason}) after "
                f"{reservation.attempts} attach tries; it is given up"
            )
            target = FAILED
        else:
            message = (
                f"device {reservation.device_name} lost its attachment to host "
                f"{reservation.host_id}: {reason}; attaching it again"
            )
            target = ATTACHING
        moved = await self._move_and_warn(
            reservation, ATTACHED, target, message, REASON_DEVICE_LOST, claim
        )
        if moved is None:
            return False
        if self.metrics:
            self.metrics.drift.labels("lost").inc()
        self._error(reservation.claim.uid, message)
        if target == FAILED:
            self._terminal(FAILED)
        return True

    async def moved(
        self, reservation: ReservationView, holder: str, claim: Mapping[str, Any] | None = None
    ) -> bool:
        """An ``attached`` device the fabric shows on ANOTHER host: it is not ours to use
        or to take back. The reservation ends ``failed`` (the claim gets its failure
        condition and the device is tainted), with a Warning ``DeviceMoved`` Event and the
        ``drift{kind="moved"}`` metric.

        Returns:
            True when the journal was moved.
        """
        message = (
            f"device {reservation.device_name} was attached to host "
            f"{reservation.host_id} but {MOVED_MARK} {holder}"
        )
        moved = await self._move_and_warn(
            reservation, ATTACHED, FAILED, message, REASON_DEVICE_MOVED, claim
        )
        if moved is None:
            return False
        if self.metrics:
            self.metrics.drift.labels("moved").inc()
        self._error(reservation.claim.uid, message)
        self._terminal(FAILED)
        return True

    async def recover(self, modes: Collection[str] | None = None) -> dict[str, int]:
        """Settle unfinished journal entries of ``modes`` (None: every mode) against the
        fabric. Run once, before any worker of those modes starts.

        Only positive evidence settles an entry: an ``attaching`` reservation whose device the
        fabric lists on its host is ``attached``. Every other unfinished entry stays as it is,
        and the reconcile drives its attach or detach again (both are idempotent): a device
        the fabric does not list on the host may still be on its way there (an attach sent
        before the crash, without a task monitor, that the fabric manager has not finished),
        and a listing may lag behind the hardware (NEC CDIM's inventory is a cache refreshed
        about every ten minutes). Releasing a ``detaching`` entry, or taking an ``attaching``
        one back to ``pending`` (whose release sends no detach), on such a listing left
        devices attached to hosts with no claim.

        When the fabric cannot be listed, entries stay as they are too. An entry with a stored
        task monitor stays as it is unless the fabric lists the device on the host: the
        reconcile follows that monitor (:meth:`FabricBackend.resume`) instead of sending again.

        Returns:
            Counts of what was done: ``{"attached": n, "left": n}`` (left: for the reconcile).
        """
        unfinished = [
            r
            for r in await self.journal.active([ATTACHING, DETACHING])
            if modes is None or r.mode in modes
        ]
        counts = {"attached": 0, "left": 0}
        devices: list[tuple[ReservationView, FabricDevice]] = []
        for reservation in unfinished:
            if reservation.state != ATTACHING:
                counts["left"] += 1
                continue
            try:
                devices.append((reservation, await self.journal.fabric_device(reservation)))
            except UnknownDevice:
                counts["left"] += 1
        # Each fabric manager is listed once, and only for its own devices: the same vendor
        # id on two managers is two devices.
        holders: dict[str | None, dict[str, str | None]] = {}
        for manager in sorted({d.location.manager or "" for _, d in devices}):
            try:
                listing = await member(self.backend, manager or None).list_devices()
            except FabricError as err:
                log.warning(
                    "recovery: cannot list fabric manager %s (%s); its unfinished operations "
                    "will be driven again",
                    manager or "-",
                    err,
                )
                continue
            holders[manager or None] = {d.vendor_id: d.host_id for d in listing.items}
        for reservation, device in devices:
            holder = holders.get(device.location.manager)
            on_host = holder is not None and holder.get(device.vendor_id) == reservation.host_id
            if on_host and await self.journal.transition(
                reservation.id,
                [ATTACHING],
                ATTACHED,
                error="recovered after restart",
                clear_operation=True,
            ):
                counts["attached"] += 1
            else:
                counts["left"] += 1
        if unfinished:
            log.info("recovery: %s", ", ".join(f"{n} {k}" for k, n in counts.items()))
        return counts


def failed_report(key: WantedDevice, reservation: ReservationView) -> DeviceReport:
    """The report of a reservation that failed for good: its attach (``AttachFailed``), its
    device found on another host (``DeviceMoved``), an attach again after a lost attachment
    that failed (``DeviceLost``), or its detach (``DetachFailed``)."""
    message = reservation.last_error or "attach failed"
    if reservation.state == DETACH_FAILED:
        return DeviceReport(key, False, REASON_DETACH_FAILED, message)
    if reservation.attached_at is not None:
        reason = REASON_DEVICE_MOVED if MOVED_MARK in message else REASON_DEVICE_LOST
        return DeviceReport(key, False, reason, message)
    return DeviceReport(key, False, REASON_ATTACH_FAILED, message)


def _claim_stub(reservation: ReservationView) -> dict[str, Any]:
    """Enough of a claim for an Event about it when the claim object is not at hand."""
    return {
        "metadata": {
            "name": reservation.claim.name,
            "namespace": reservation.claim.namespace,
            "uid": reservation.claim.uid,
        }
    }


__all__ = [
    "DEFAULT_DETACH_ATTEMPTS",
    "EVENT_FLUSH_S",
    "MOVED_MARK",
    "REASON_DETACHED",
    "EventRecorder",
    "FabricOps",
    "ReleaseResult",
    "failed_report",
]
