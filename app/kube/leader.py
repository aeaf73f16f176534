"""Leader election on a coordination.k8s.io/v1 Lease.

The protocol is client-go's ``tools/leaderelection`` with the ``LeaseLock``:

* a candidate reads the Lease; if it does not exist it creates it holding it;
* a Lease held by another identity counts as expired once ``leaseDurationSeconds`` have passed
  since this candidate last saw the record change (local monotonic time, so clock skew between
  replicas does not matter); an empty ``holderIdentity`` means released: free at once;
* taking the Lease over sets ``acquireTime`` and increments ``leaseTransitions``; renewing only
  moves ``renewTime``;
* every write is a PUT carrying the read ``resourceVersion``: a 409 means someone else wrote
  first, and the next round re-reads;
* the leader renews every ``retry_period_s``; when no renewal has succeeded for
  ``renew_deadline_s`` (or the Lease is seen held by someone else) it steps down: ``is_leader``
  is cleared and ``on_stopped_leading`` runs, then it becomes a candidate again;
* on shutdown with ``release_on_cancel`` the leader clears ``holderIdentity`` and sets
  ``leaseDurationSeconds`` to 1 (client-go ``ReleaseOnCancel``), so a standby takes over at once.

Timestamps are written as MicroTime: UTC, RFC 3339 with exactly six fraction digits and ``Z``
(``k8s.io/apimachinery/pkg/apis/meta/v1/micro_time.go``, ``RFC3339Micro``).

``kubernetes_asyncio.leaderelection`` is not used (docs/PITFALLS.md: it returns silently on loss,
stamps local time as UTC, mis-writes whole-second times and never releases).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, CoordinationV1Api

from app.aio import cancel_and_wait
from app.jsontypes import JsonDict
from app.kube.client import call_json
from app.kube.errors import KubeAlreadyExists, KubeConflict, KubeError, KubeNotFound

logger = logging.getLogger(__name__)

Callback = Callable[[], Awaitable[None]]

# client-go's JitterFactor: candidates retry every retry_period * [1, 1.2).
_JITTER_FACTOR = 1.2


def format_micro_time(moment: datetime) -> str:
    """Format an aware datetime as a Kubernetes MicroTime: ``2026-01-02T03:04:05.000000Z``.

    Raises:
        ValueError: ``moment`` is naive (its zone would be a guess).
    """
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("MicroTime needs an aware datetime")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str) -> datetime:
    """Parse an RFC 3339 time (MicroTime or Time) into an aware UTC datetime.

    Raises:
        ValueError: not an RFC 3339 time with a zone.
    """
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError(f"time without a zone: {text!r}")
    return parsed.astimezone(UTC)


@dataclass(frozen=True)
class LeaseRecord:
    """The election-relevant part of a Lease's spec (client-go ``LeaderElectionRecord``).

    Attributes:
        holder_identity: who holds it; None or "" means nobody (released).
        lease_duration_s: ``leaseDurationSeconds`` the holder promised to renew within.
        acquire_time / renew_time: MicroTime strings as stored.
        lease_transitions: how many times the holder changed.
    """

    holder_identity: str | None
    lease_duration_s: int | None
    acquire_time: str | None
    renew_time: str | None
    lease_transitions: int

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        """Read the record from a Lease JSON dict."""
        spec = lease.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        transitions = spec.get("leaseTransitions")
        return cls(
            holder_identity=spec.get("holderIdentity") or None,
            lease_duration_s=int(duration) if isinstance(duration, int) else None,
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            lease_transitions=int(transitions) if isinstance(transitions, int) else 0,
        )

    def to_spec(self, base: Mapping[str, Any] | None = None) -> JsonDict:
        """The Lease spec for this record, keeping any other fields of ``base`` (e.g.
        ``strategy``, ``preferredHolder``)."""
        spec: JsonDict = dict(base or {})
        values = {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_s,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.lease_transitions,
        }
        for key, value in values.items():
            if value is None:
                spec.pop(key, None)
            else:
                spec[key] = value
        return spec


def plan_acquire(
    current: LeaseRecord | None,
    *,
    identity: str,
    now: str,
    lease_duration_s: int,
    held_and_valid: bool,
) -> LeaseRecord | None:
    """Decide what to write to acquire or renew the Lease (client-go ``tryAcquireOrRenew``).

    Args:
        current: the record read, or None when the Lease does not exist.
        identity: this candidate.
        now: the current time as MicroTime.
        lease_duration_s: our lease duration.
        held_and_valid: the record names another holder and has not expired by our observation.

    Returns the record to write, or None when another holder still owns the Lease.
    """
    if current is None:
        return LeaseRecord(identity, lease_duration_s, now, now, 0)
    if held_and_valid and current.holder_identity not in (None, identity):
        return None
    if current.holder_identity == identity:
        return replace(current, lease_duration_s=lease_duration_s, renew_time=now)
    return LeaseRecord(identity, lease_duration_s, now, now, current.lease_transitions + 1)


def plan_release(current: LeaseRecord, *, now: str) -> LeaseRecord:
    """The record written on release (client-go ``release()``): no holder, duration 1 s."""
    return LeaseRecord(None, 1, now, now, current.lease_transitions)


@dataclass(frozen=True)
class LeaderElectionSettings:
    """Settings of a :class:`LeaderElector` (defaults: client-go's usual 15 s / 10 s / 2 s).

    Attributes:
        lease_name / namespace: the Lease object.
        identity: this replica's unique name (pod name, or hostname plus a random suffix).
        lease_duration_s: how long a standby waits after the last change it saw before taking
            over, whole seconds (``leaseDurationSeconds``).
        renew_deadline_s: the leader steps down when no renewal succeeded for this long; must be
            below ``lease_duration_s`` so it stops before anyone else may start.
        retry_period_s: time between attempts (renewals and acquisition tries).
        release_on_cancel: release the Lease on shutdown so a standby takes over at once.
        request_timeout_s: timeout of each API call.
    """

    lease_name: str
    namespace: str
    identity: str
    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    release_on_cancel: bool = True
    request_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election: identity must not be empty")
        if self.lease_duration_s < 1:
            raise ValueError("leader election: lease_duration_s must be >= 1")
        # The same rule as client-go's NewLeaderElector.
        if self.lease_duration_s <= self.renew_deadline_s:
            raise ValueError("leader election: lease_duration_s must be > renew_deadline_s")
        if self.renew_deadline_s <= _JITTER_FACTOR * self.retry_period_s:
            raise ValueError("leader election: renew_deadline_s must be > 1.2 * retry_period_s")
        if self.retry_period_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("leader election: retry_period_s and request_timeout_s must be > 0")


class LeaderElector:
    """Campaigns for a Lease and keeps it; see the module docstring for the protocol.

    Args:
        api_client: the kubernetes-asyncio ``ApiClient`` (``KubeClient.api``).
        settings: see :class:`LeaderElectionSettings`.
        on_started_leading / on_stopped_leading: awaited when leadership is gained / lost
            (also on shutdown while leading); exceptions are logged.
        on_new_leader: awaited with the identity when the observed holder changes.
        now: monotonic seconds; utc_now: the wall clock (aware); sleep: async sleep;
        rng: jitter source. All injectable for tests.

    ``is_leader`` is an ``asyncio.Event`` set exactly while this replica may act as leader.
    """

    def __init__(
        self,
        api_client: ApiClient,
        settings: LeaderElectionSettings,
        *,
        on_started_leading: Callback | None = None,
        on_stopped_leading: Callback | None = None,
        on_new_leader: Callable[[str], Awaitable[None]] | None = None,
        now: Callable[[], float] = time.monotonic,
        utc_now: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self._api = CoordinationV1Api(api_client)
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._now = now
        self._utc_now = utc_now
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.is_leader = asyncio.Event()
        self._lease: JsonDict | None = None
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self.last_error: BaseException | None = None
        self.transitions_seen = 0
        #: Times this replica lost leadership while running (not counting a shutdown), and
        #: the wall-clock time of the last loss (aware UTC), for the dashboard and metrics.
        self.lost_count = 0
        self.lost_at: datetime | None = None

    @property
    def leader_identity(self) -> str | None:
        """The holder this replica last observed (None when unknown or released)."""
        return self._observed.holder_identity if self._observed else None

    @property
    def _what(self) -> str:
        return f"Lease {self.settings.namespace}/{self.settings.lease_name}"

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start campaigning in a background task (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=f"leader-{self.settings.identity}")

    async def stop(self) -> None:
        """Stop campaigning; when leading, step down (and release if configured)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def run(self) -> None:
        """Campaign, lead, step down, campaign again, until cancelled.

        On cancellation while leading: release the Lease (when configured), clear
        ``is_leader`` and await ``on_stopped_leading``.
        """
        try:
            while True:
                await self._acquire()
                self.is_leader.set()
                logger.info("%s: %s became leader", self._what, self.settings.identity)
                await self._call(self._on_started, "on_started_leading")
                await self._renew()
                self.is_leader.clear()
                self.lost_count += 1
                self.lost_at = self._utc_now()
                logger.warning("%s: %s lost leadership", self._what, self.settings.identity)
                await self._call(self._on_stopped, "on_stopped_leading")
        except asyncio.CancelledError:
            if self.is_leader.is_set():
                # Stop acting first: nothing may write as leader once release begins.
                self.is_leader.clear()
                if self.settings.release_on_cancel:
                    await self._release()
                await self._call(self._on_stopped, "on_stopped_leading")
            raise

    # ----------------------------------------------------------------- phases
    async def _acquire(self) -> None:
        while True:
            if await self._attempt():
                return
            await self._sleep(self.settings.retry_period_s * self._rng.uniform(1.0, _JITTER_FACTOR))

    async def _renew(self) -> None:
        """Renew until a renewal deadline passes without success, or another holder shows."""
        last_renew = self._now()
        while True:
            await self._sleep(self.settings.retry_period_s)
            remaining = self.settings.renew_deadline_s - (self._now() - last_renew)
            ok = False
            if remaining > 0:
                try:
                    ok = await asyncio.wait_for(self._attempt(), remaining)
                except TimeoutError:
                    self.last_error = TimeoutError(f"{self._what}: renewal timed out")
            if ok:
                last_renew = self._now()
                continue
            holder = self.leader_identity
            if holder is not None and holder != self.settings.identity:
                logger.warning("%s: now held by %s", self._what, holder)
                return
            if self._now() - last_renew >= self.settings.renew_deadline_s:
                logger.warning(
                    "%s: no renewal for %.1f s (deadline %.1f s): %s",
                    self._what,
                    self._now() - last_renew,
                    self.settings.renew_deadline_s,
                    self.last_error,
                )
                return

    async def _attempt(self) -> bool:
        """One try to acquire or renew. True when this replica holds the Lease now."""
        try:
            return await self._try_acquire_or_renew()
        except KubeError as err:
            self.last_error = err
            logger.info("%s: %s", self._what, err)
            return False

    async def _observe(self, record: LeaseRecord) -> None:
        if record == self._observed:
            return
        old_holder = self.leader_identity
        self._observed = record
        self._observed_at = self._now()
        if record.holder_identity and record.holder_identity != old_holder:
            self.transitions_seen += 1
            if self._on_new_leader is not None:
                try:
                    await self._on_new_leader(record.holder_identity)
                except Exception:
                    logger.exception("%s: on_new_leader failed", self._what)

    async def _try_acquire_or_renew(self) -> bool:
        now_text = format_micro_time(self._utc_now())
        lease = await self._read()
        if lease is None:
            record = plan_acquire(
                None,
                identity=self.settings.identity,
                now=now_text,
                lease_duration_s=self.settings.lease_duration_s,
                held_and_valid=False,
            )
            assert record is not None
            try:
                created = await self._write(None, record)
            except KubeAlreadyExists:
                return False
            await self._store(created, record)
            return True
        current = LeaseRecord.from_lease(lease)
        await self._observe(current)
        duration = current.lease_duration_s or self.settings.lease_duration_s
        held_and_valid = (
            current.holder_identity is not None
            and current.holder_identity != self.settings.identity
            and self._observed_at + duration > self._now()
        )
        record = plan_acquire(
            current,
            identity=self.settings.identity,
            now=now_text,
            lease_duration_s=self.settings.lease_duration_s,
            held_and_valid=held_and_valid,
        )
        if record is None:
            return False
        try:
            written = await self._write(lease, record)
        except KubeConflict:
            return False
        await self._store(written, record)
        return True

    async def _store(self, lease: JsonDict, record: LeaseRecord) -> None:
        self._lease = lease
        await self._observe(LeaseRecord.from_lease(lease) if lease.get("spec") else record)

    async def _release(self) -> None:
        if self._lease is None or self._observed is None:
            return
        if self._observed.holder_identity != self.settings.identity:
            return
        lease = self._lease
        record = plan_release(self._observed, now=format_micro_time(self._utc_now()))
        try:
            try:
                written = await asyncio.wait_for(
                    self._write(lease, record), self.settings.request_timeout_s
                )
            except KubeConflict:
                # A renewal cancelled mid-flight may have landed after all: re-read, and release
                # only if the Lease is still ours.
                fresh = await asyncio.wait_for(self._read(), self.settings.request_timeout_s)
                if fresh is None:
                    return
                current = LeaseRecord.from_lease(fresh)
                if current.holder_identity != self.settings.identity:
                    return
                record = plan_release(current, now=format_micro_time(self._utc_now()))
                written = await asyncio.wait_for(
                    self._write(fresh, record), self.settings.request_timeout_s
                )
        except (KubeError, TimeoutError) as err:
            # The Lease then simply expires after leaseDurationSeconds.
            logger.warning("%s: release failed: %s", self._what, err)
            return
        await self._store(written, record)
        logger.info("%s: %s released the lease", self._what, self.settings.identity)

    # ----------------------------------------------------------------- API calls
    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.settings.request_timeout_s)

    async def _read(self) -> JsonDict | None:
        try:
            return await call_json(
                self._api.read_namespaced_lease(
                    self.settings.lease_name,
                    self.settings.namespace,
                    _preload_content=False,
                    _request_timeout=self._timeout(),
                ),
                f"read {self._what}",
            )
        except KubeNotFound:
            return None

    async def _write(self, lease: JsonDict | None, record: LeaseRecord) -> JsonDict:
        """Create (``lease`` None) or replace the Lease with ``record``; raises KubeConflict
        when the resourceVersion is stale, KubeAlreadyExists when a create lost the race."""
        if lease is None:
            body: JsonDict = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.settings.lease_name,
                    "namespace": self.settings.namespace,
                },
                "spec": record.to_spec(),
            }
            return await call_json(
                self._api.create_namespaced_lease(
                    self.settings.namespace,
                    body,  # type: ignore[arg-type]
                    _preload_content=False,
                    _request_timeout=self._timeout(),
                ),
                f"create {self._what}",
            )
        # The read object is sent back whole: its metadata.resourceVersion makes the PUT an
        # optimistic-concurrency write (409 when someone wrote in between).
        body = dict(lease)
        body["spec"] = record.to_spec(lease.get("spec"))
        return await call_json(
            self._api.replace_namespaced_lease(
                self.settings.lease_name,
                self.settings.namespace,
                body,  # type: ignore[arg-type]
                _preload_content=False,
                _request_timeout=self._timeout(),
            ),
            f"update {self._what}",
        )

    async def _call(self, callback: Callback | None, name: str) -> None:
        if callback is None:
            return
        try:
            await callback()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("%s: %s failed", self._what, name)
