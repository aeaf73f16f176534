"""The node plugin's work: prepare and unprepare claims, keep the checkpoint, check health.

:class:`NodePlugin` is what the gRPC servers (:mod:`app.node.server`) call. Per claim of a
NodePrepareResources call it

1. answers a claim it already prepared from the checkpoint (a repeat gets the same answer);
2. reads the claim from the API server and refuses one that is not the UID asked for, not
   allocated, or allocated to another node (:func:`app.node.plan.check_claim`); results of
   other drivers are ignored;
3. waits, within the kubelet's deadline and ``node.device_wait_seconds``, until each of our
   devices is attached to this node's server and verified: our ``status.devices`` entry with
   every binding condition True and ``data.node`` this node, or, for a claim without
   ``status.devices`` (Kubernetes 1.31), the controller's journal over its admin API;
4. finds each device on the host (:func:`app.node.finder.locate`), runs the vendor hook;
5. records the claim as ``preparing`` in the checkpoint, writes its CDI specs atomically, then
   records it as ``prepared`` and answers.

A claim that cannot be prepared gets a per-claim error and the others are still prepared.
Calls are serialised, like upstream's kubeletplugin helper with ``Serialize(true)``
(k8s.io/dynamic-resource-allocation/kubeletplugin/draplugin.go); the claims of one call are
prepared side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.config import NodePluginSettings
from app.jsontypes import JsonDict
from app.node import cdi
from app.node.checkpoint import (
    PREPARED,
    PREPARING,
    Checkpoint,
    CheckpointError,
    ClaimRecord,
    PreparedDevice,
)
from app.node.finder import DeviceNotFound, HookFailed, locate, run_hook
from app.node.identity import DeviceIdentity, HostDevice
from app.node.metrics import NodeMetrics
from app.node.plan import (
    ClaimNotPreparable,
    ClaimReadFailed,
    ClaimRef,
    DeviceState,
    Verdict,
    check_claim,
    claim_config,
    claim_specs,
    device_states,
    our_devices,
    states_from_journal,
)

log = logging.getLogger(__name__)

# Left of the kubelet's deadline for writing specs and answering.
DEADLINE_MARGIN_S = 1.0
# The longest error told to the kubelet (it lands in the pod's events).
MAX_ERROR_CHARS = 2048


def claim_message(ref: ClaimRef, err: BaseException) -> str:
    """One line for the kubelet: starts with ``claim <namespace>/<name>``, at most
    :data:`MAX_ERROR_CHARS` characters."""
    text = " ".join(str(err).split()) or type(err).__name__
    if not text.startswith(f"claim {ref}"):
        text = f"claim {ref}: {text}"
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return text


_SPEC_UID = re.compile(r"_([A-Za-z0-9-]+)\.json$")

ReadClaim = Callable[[str, str], Awaitable[JsonDict]]
"""``(namespace, name) -> claim`` in the v1 shape; raises :class:`ClaimNotPreparable`."""
ReadJournal = Callable[[str], Awaitable[list[JsonDict]]]
"""``claim uid -> reservations`` (the controller's ``/api/v1/claim-devices/{uid}``)."""
PostEvent = Callable[[ClaimRef, str, str, str], Awaitable[None]]
"""``(claim, type, reason, message)``: an Event on the claim; must not raise."""
WriteSpec = Callable[[Path, str, Mapping[str, object]], Path]


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """One claim's answer: its devices, or an error (then the devices are ignored)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One prepared device's presence on the host at the last check."""

    claim: ClaimRef
    pool: str
    device: str
    present: bool
    message: str
    checked_at: float


class NodePlugin:
    """Prepares and unprepares claims of our driver on this node.

    Args:
        driver: our DRA driver name.
        node: this node's name.
        settings: the ``node`` settings section.
        read_claim: reads a claim (see :data:`ReadClaim`).
        ready_types, failed_types: the binding and binding-failure condition types the
            controller sets (``pools.binding_conditions``, ``pools.binding_failure_conditions``).
        checkpoint: the on-disk record of prepared claims.
        read_journal: the controller's journal, for claims without ``status.devices``.
        post_event: where health transitions are told (an Event on the claim).
        metrics: optional.
        write_spec: writes one CDI spec (default :func:`app.node.cdi.write_spec`).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        *,
        driver: str,
        node: str,
        settings: NodePluginSettings,
        read_claim: ReadClaim,
        ready_types: Sequence[str],
        failed_types: Sequence[str],
        checkpoint: Checkpoint,
        read_journal: ReadJournal | None = None,
        post_event: PostEvent | None = None,
        metrics: NodeMetrics | None = None,
        write_spec: WriteSpec = cdi.write_spec,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.driver = driver
        self.node = node
        self.settings = settings
        self.read_claim = read_claim
        self.ready_types = tuple(ready_types)
        self.failed_types = tuple(failed_types)
        self.checkpoint = checkpoint
        self.read_journal = read_journal
        self.post_event = post_event
        self.metrics = metrics
        self.write_spec = write_spec
        self.clock = clock
        self.vendor = driver
        self.health: dict[tuple[str, str, str], DeviceHealth] = {}
        self.health_changed = asyncio.Event()
        self._claim_locks: dict[str, asyncio.Lock] = {}

    # ------------------------------------------------------------------ start
    def start(self) -> list[str]:
        """Load the checkpoint (rebuilding it from the CDI specs when it is unusable) and remove
        our CDI specs that no claim in it owns. Returns what was noticed, one line each.

        Raises:
            CheckpointError: a rebuilt checkpoint could not be written.
        """
        notes = []
        problem = self.checkpoint.load()
        cdi_dir = self.settings.cdi_dir
        try:
            ours = cdi.list_spec_files(cdi_dir, self.vendor)
        except cdi.CdiWriteError as err:
            notes.append(str(err))
            ours = []
        if problem is not None:
            notes.append(problem)
            rebuilt: dict[str, list[str]] = {}
            for name in ours:
                match = _SPEC_UID.search(name)
                if match:
                    rebuilt.setdefault(match.group(1), []).append(name)
            for uid, files in rebuilt.items():
                # The claim's name is unknown: the kubelet's unprepare names it again.
                self.checkpoint.put(ClaimRecord(uid, "", "", PREPARING, tuple(files)))
            notes.append(
                f"checkpoint rebuilt from {len(ours)} CDI spec(s) of {len(rebuilt)} claim(s)"
            )
        owned = {name for record in self.checkpoint.records.values() for name in record.specs}
        for name in ours:
            if name not in owned:
                with contextlib.suppress(cdi.CdiWriteError):
                    cdi.remove_spec(cdi_dir, name)
                    notes.append(f"removed CDI spec {name}: no prepared claim owns it")
        self._count()
        return notes

    def _count(self) -> None:
        if self.metrics is not None:
            prepared = sum(1 for r in self.checkpoint.records.values() if r.state == PREPARED)
            self.metrics.prepared_claims.set(prepared)

    # ------------------------------------------------------------------ prepare
    async def prepare(
        self, claims: Sequence[ClaimRef], time_remaining_s: float | None = None
    ) -> dict[str, PrepareResult]:
        """Prepare ``claims``; returns claim UID -> result for every claim asked for.

        Args:
            claims: the kubelet's claims.
            time_remaining_s: seconds left of the kubelet's deadline (None: no deadline).
        """
        start = self.clock()
        budget = self.settings.device_wait_seconds
        if time_remaining_s is not None:
            budget = max(0.0, min(budget, time_remaining_s - DEADLINE_MARGIN_S))
        deadline = start + budget
        results = await asyncio.gather(*(self._prepare_one(ref, deadline) for ref in claims))
        answer = {ref.uid: result for ref, result in zip(claims, results, strict=True)}
        self._count()
        self._count_call("prepare", answer.values())
        return answer

    def _claim_lock(self, uid: str) -> asyncio.Lock:
        """The lock of one claim: calls for the same claim run one after the other (like
        upstream's serialised calls), calls for different claims do not wait for each other
        (a claim waiting for its attach does not hold up the node)."""
        lock = self._claim_locks.get(uid)
        if lock is None:
            lock = self._claim_locks[uid] = asyncio.Lock()
        return lock

    def _release_lock(self, uid: str) -> None:
        lock = self._claim_locks.get(uid)
        if lock is not None and not lock.locked():
            del self._claim_locks[uid]

    def _count_call(self, method: str, results: Any) -> None:
        if self.metrics is None:
            return
        errors = 0
        for result in results:
            failed = bool(result.error if isinstance(result, PrepareResult) else result)
            errors += failed
            self.metrics.claims.labels(method, "error" if failed else "ok").inc()
        self.metrics.calls.labels(method, "error" if errors else "ok").inc()

    async def _prepare_one(self, ref: ClaimRef, deadline: float) -> PrepareResult:
        started = self.clock()
        try:
            async with self._claim_lock(ref.uid):
                devices = await self._prepare(ref, deadline)
        except (ClaimNotPreparable, DeviceNotFound, HookFailed) as err:
            message = claim_message(ref, err)
            log.warning("prepare of claim %s (%s) failed: %s", ref, ref.uid, message)
            return PrepareResult(error=message)
        except (cdi.CdiWriteError, CheckpointError) as err:
            message = claim_message(ref, err)
            log.error("prepare of claim %s (%s) failed: %s", ref, ref.uid, message)
            return PrepareResult(error=message)
        finally:
            self._release_lock(ref.uid)
        if self.metrics is not None:
            self.metrics.prepare_seconds.observe(self.clock() - started)
        return PrepareResult(devices=devices)

    def _already(self, ref: ClaimRef) -> tuple[PreparedDevice, ...] | None:
        record = self.checkpoint.records.get(ref.uid)
        if record is None or record.state != PREPARED:
            return None
        cdi_dir = self.settings.cdi_dir
        if all((cdi_dir / name).is_file() for name in record.specs):
            return record.devices
        return None

    async def _prepare(self, ref: ClaimRef, deadline: float) -> tuple[PreparedDevice, ...]:
        already = self._already(ref)
        if already is not None:
            return already
        claim = await self._read(ref, deadline)
        check_claim(claim, ref, self.driver, self.node)
        if not our_devices(claim, self.driver):
            return ()
        configs = claim_config(claim, self.driver, self.settings.allowed_host_paths)
        identities = await self._wait_ready(ref, claim, deadline)
        found = await self._find_all(identities, deadline)
        for host_device in found:
            await self._hook(host_device)
        specs, answer = claim_specs(self.driver, ref.uid, found, configs)
        names = tuple(s.file_name for s in specs)
        previous = self.checkpoint.records.get(ref.uid)
        stale = [n for n in (previous.specs if previous else ()) if n not in names]
        # The intent first: a plugin killed after a spec write knows the file is its own.
        self.checkpoint.put(
            ClaimRecord(
                ref.uid, ref.namespace, ref.name, PREPARING, tuple(sorted({*names, *stale}))
            )
        )
        for spec in specs:
            await asyncio.to_thread(
                self.write_spec, self.settings.cdi_dir, spec.file_name, spec.spec
            )
        for name in stale:
            await asyncio.to_thread(cdi.remove_spec, self.settings.cdi_dir, name)
        devices = tuple(
            PreparedDevice(a.requests, a.pool, a.device, a.cdi_device_ids, a.identity)
            for a in answer
        )
        self.checkpoint.put(ClaimRecord(ref.uid, ref.namespace, ref.name, PREPARED, names, devices))
        log.info(
            "prepared claim %s (%s): %s",
            ref,
            ref.uid,
            ", ".join(
                f"{h.identity.pool}/{h.identity.device} at {h.sysfs_path} ({h.matched_by})"
                for h in found
            ),
        )
        return devices

    async def _states(self, ref: ClaimRef, claim: JsonDict) -> list[DeviceState]:
        ours = [
            e
            for e in (claim.get("status") or {}).get("devices") or []
            if isinstance(e, Mapping) and e.get("driver") == self.driver
        ]
        if not ours and self.read_journal is not None:
            try:
                reservations = await self.read_journal(ref.uid)
            except ClaimReadFailed as err:
                log.info("claim %s: %s; trying again", ref, err)
                return [
                    DeviceState(w, Verdict.WAITING, why=str(err))
                    for w in our_devices(claim, self.driver)
                ]
            return states_from_journal(claim, self.driver, self.node, reservations)
        return device_states(claim, self.driver, self.node, self.ready_types, self.failed_types)

    async def _wait_ready(
        self, ref: ClaimRef, claim: JsonDict, deadline: float
    ) -> list[DeviceIdentity]:
        waited_from = self.clock()
        while True:
            states = await self._states(ref, claim)
            failed = [s for s in states if s.verdict is Verdict.FAILED]
            if failed:
                raise ClaimNotPreparable(
                    f"claim {ref}: device {failed[0].wanted.pool}/{failed[0].wanted.device} "
                    f"cannot be used: {failed[0].why}"
                )
            waiting = [s for s in states if s.verdict is Verdict.WAITING]
            if not waiting:
                return [s.identity for s in states if s.identity is not None]
            if self.clock() >= deadline:
                first = waiting[0]
                raise ClaimNotPreparable(
                    f"claim {ref}: device {first.wanted.pool}/{first.wanted.device} is not "
                    f"attached to this node {self.node} and verified after "
                    f"{self.clock() - waited_from:.0f} s: {first.why}"
                )
            await asyncio.sleep(min(self.settings.device_poll_seconds, deadline - self.clock()))
            claim = await self._read(ref, deadline)
            check_claim(claim, ref, self.driver, self.node)

    async def _read(self, ref: ClaimRef, deadline: float) -> JsonDict:
        """Read the claim; a failed read that may pass (:class:`ClaimReadFailed`: the API
        server or the controller unreachable, an error answer) is tried again until the
        deadline, then raised."""
        while True:
            try:
                return await self.read_claim(ref.namespace, ref.name)
            except ClaimReadFailed as err:
                if self.clock() >= deadline:
                    raise
                log.info("claim %s: %s; trying again", ref, err)
                await asyncio.sleep(min(self.settings.device_poll_seconds, deadline - self.clock()))

    async def _find_all(
        self, identities: Sequence[DeviceIdentity], deadline: float
    ) -> list[HostDevice]:
        """Every device of ``identities`` on this host, looked for at once. The first that
        cannot be found is raised as itself, once the other searches are cancelled and ended
        (a plain gather would leave them running after the claim's answer)."""
        searches = [asyncio.ensure_future(self._find(i, deadline)) for i in identities]
        try:
            return list(await asyncio.gather(*searches))
        except BaseException:
            for search in searches:
                search.cancel()
            await asyncio.gather(*searches, return_exceptions=True)
            raise

    async def _find(self, identity: DeviceIdentity, deadline: float) -> HostDevice:
        return await locate(
            identity,
            host_root=self.settings.host_root,
            timeout_s=max(0.0, deadline - self.clock()),
            poll_s=self.settings.device_poll_seconds,
            rescan=self.settings.pci_rescan,
        )

    async def _hook(self, device: HostDevice) -> None:
        if self.settings.hook:
            await run_hook(
                self.settings.hook, {}, self.settings.hook_timeout_seconds, device=device
            )

    # ------------------------------------------------------------------ unprepare
    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Unprepare ``claims``: remove their CDI specs and forget them. Idempotent: a claim
        not prepared here is answered without error. Returns claim UID -> error ("" for done).
        """
        answer = {}
        for ref in claims:
            try:
                async with self._claim_lock(ref.uid):
                    self._unprepare(ref)
                answer[ref.uid] = ""
            except (cdi.CdiWriteError, CheckpointError) as err:
                answer[ref.uid] = claim_message(ref, err)
                log.error("unprepare of claim %s (%s) failed: %s", ref, ref.uid, answer[ref.uid])
            finally:
                self._release_lock(ref.uid)
        self._count()
        self._count_call("unprepare", answer.values())
        return answer

    def _unprepare(self, ref: ClaimRef) -> None:
        record = self.checkpoint.records.get(ref.uid)
        names = set(record.specs if record else ())
        # Also specs of this claim the checkpoint does not know (written by an older plugin).
        names.update(
            n
            for n in cdi.list_spec_files(self.settings.cdi_dir, self.vendor)
            if n.endswith(f"_{ref.uid}.json")
        )
        for name in sorted(names):
            cdi.remove_spec(self.settings.cdi_dir, name)
        self.checkpoint.drop(ref.uid)
        for key in [k for k in self.health if k[0] == ref.uid]:
            del self.health[key]
            if self.metrics is not None:
                with contextlib.suppress(KeyError):
                    self.metrics.device_present.remove(key[1], key[2])
        if record is not None:
            log.info("unprepared claim %s (%s)", ref, ref.uid)

    # ------------------------------------------------------------------ health
    async def check_health(self) -> list[DeviceHealth]:
        """Look once for every prepared device on the host; log, count and tell (an Event on
        the claim) each device that vanished or came back. Returns the current health."""
        records = [r for r in self.checkpoint.records.values() if r.state == PREPARED]
        changed = False
        for record in records:
            ref = ClaimRef(record.namespace, record.name, record.uid)
            for device in record.devices:
                if device.identity is None:
                    continue
                key = (record.uid, device.pool, device.device)
                try:
                    await locate(
                        device.identity,
                        host_root=self.settings.host_root,
                        timeout_s=0.0,
                        poll_s=1.0,
                        rescan=False,
                    )
                    present, message = True, "present on the host"
                except DeviceNotFound as err:
                    present, message = False, str(err)
                before = self.health.get(key)
                now = DeviceHealth(ref, device.pool, device.device, present, message, time.time())
                self.health[key] = now
                if self.metrics is not None:
                    self.metrics.device_present.labels(device.pool, device.device).set(present)
                if before is not None and before.present == present:
                    continue
                changed = True
                if before is None and present:
                    continue
                await self._tell(now)
        if changed:
            self.health_changed.set()
        return list(self.health.values())

    async def _tell(self, health: DeviceHealth) -> None:
        if health.present:
            log.info(
                "device %s/%s of claim %s is back on the host",
                health.pool,
                health.device,
                health.claim,
            )
            reason, type_ = "DevicePresentOnNode", "Normal"
            message = f"device {health.pool}/{health.device} is present on node {self.node} again"
        else:
            log.warning(
                "device %s/%s of claim %s vanished from the host: %s",
                health.pool,
                health.device,
                health.claim,
                health.message,
            )
            reason, type_ = "DeviceNotPresentOnNode", "Warning"
            message = (
                f"device {health.pool}/{health.device} vanished from node {self.node}: "
                f"{health.message}"
            )
        if self.post_event is not None and health.claim.name:
            await self.post_event(health.claim, type_, reason, message[:1024])
