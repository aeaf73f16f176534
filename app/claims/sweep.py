"""The claim reconciler's periodic sweep (:class:`app.claims.reconciler.ClaimReconciler`).

Every ``sweep_interval_s`` it:

* queues the claims waiting for a device that is no longer held (a release written by another
  process is not in this process's journal feed);
* queues the claims whose reservations have had no claim for the grace period (the controller
  may have been down when the claim went away), so that their pass releases them;
* keeps the reservation gauges;
* lists the devices the fabric shows attached with no reservation, and detaches those that
  stayed so for the grace period when configured to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from app.db.engine import Database
from app.fabric.backend import FabricBackend
from app.fabric.errors import FabricError
from app.fabric.types import DeviceType, FabricDevice, Location
from app.inventory.queries import still_unmanaged, unmanaged_attachments
from app.journal import RELEASED, STATES, Journal
from app.kube.informer import Informer
from app.metrics import ClaimMetrics

log = logging.getLogger(__name__)


class ClaimSweep:
    """The sweep of one reconciler.

    Args:
        journal, db, backend: the reconciler's.
        claims: the reconciler's claim informer (a claim missing from it counts as gone once
            it has synced).
        queue: queues a claim uid for a reconcile.
        release_waiters: the reconciler's device name -> uids of claims waiting for its
            release (read only).
        mode: the reservations' mode this sweep looks after.
        interval_s, orphan_grace_s, detach_unmanaged: see
            :class:`app.claims.reconciler.ClaimSettings`.
        metrics: optional.
    """

    def __init__(
        self,
        journal: Journal,
        db: Database,
        backend: FabricBackend,
        claims: Informer,
        queue: Callable[[str], None],
        release_waiters: Mapping[str, set[str]],
        *,
        mode: str,
        interval_s: float,
        orphan_grace_s: float,
        detach_unmanaged: bool,
        metrics: ClaimMetrics | None = None,
    ) -> None:
        self.journal = journal
        self.db = db
        self.backend = backend
        self.claims = claims
        self.queue = queue
        self.release_waiters = release_waiters
        self.mode = mode
        self.interval_s = interval_s
        self.orphan_grace_s = orphan_grace_s
        self.detach_unmanaged = detach_unmanaged
        self.metrics = metrics
        self.unmanaged: list[dict[str, str]] = []
        self._missing_since: dict[str, float] = {}
        self._unmanaged_since: dict[tuple[str | None, str], float] = {}

    async def loop(self) -> None:
        """Sweep every ``interval_s`` until cancelled; a failed sweep is logged."""
        while True:
            try:
                await self.sweep()
            except Exception as err:
                log.warning("claim sweep failed: %s", err, exc_info=True)
            await asyncio.sleep(self.interval_s)

    async def sweep(self) -> None:
        """Release reservations of claims missing for the grace period; report (and maybe
        detach) unmanaged attachments; update gauges."""
        now = time.monotonic()
        everything = await self.journal.active()
        active = [r for r in everything if r.mode == self.mode]
        # Releases written by another process are not in this process's journal feed: claims
        # waiting for a device no longer held are queued here.
        held = {r.device_name for r in everything if r.exclusive}
        for device, uids in list(self.release_waiters.items()):
            if device not in held:
                for uid in uids:
                    self.queue(uid)
        if self.claims.has_synced.is_set():
            missing = {r.claim.uid for r in active if self.claims.by_uid(r.claim.uid) is None}
            for uid in list(self._missing_since):
                if uid not in missing:
                    del self._missing_since[uid]
            for uid in missing:
                first = self._missing_since.setdefault(uid, now)
                if now - first >= self.orphan_grace_s:
                    self.queue(uid)
        if self.metrics:
            for state in STATES:
                if state != RELEASED:
                    self.metrics.reservations.labels(state).set(
                        sum(1 for r in active if r.state == state)
                    )
        self.unmanaged = await unmanaged_attachments(self.db)
        if self.metrics:
            self.metrics.unmanaged_attachments.set(len(self.unmanaged))
        # By manager and vendor id: the same vendor id on two managers is two devices.
        seen = {(u.get("backend"), u["vendor_id"]) for u in self.unmanaged}
        for key in list(self._unmanaged_since):
            if key not in seen:
                del self._unmanaged_since[key]
        for item in self.unmanaged:
            first = self._unmanaged_since.setdefault((item.get("backend"), item["vendor_id"]), now)
            if self.detach_unmanaged and now - first >= self.orphan_grace_s:
                await self.detach_unmanaged_device(item)

    async def detach_unmanaged_device(self, item: Mapping[str, str]) -> None:
        """Detach one unmanaged attachment (an item of :attr:`unmanaged`), unless it was
        reserved, or moved, since the sweep listed it."""
        device = FabricDevice(
            vendor_id=item["vendor_id"],
            attach_unit=item["attach_unit"],
            device_type=DeviceType(item["device_type"]),
            location=Location(manager=item.get("backend")),
        )
        if not await still_unmanaged(
            self.db, item["vendor_id"], item["host_id"], item.get("backend")
        ):
            return  # reserved, or moved, since the sweep listed it
        try:
            await self.backend.detach(device, item["host_id"])
        except FabricError as err:
            log.warning(
                "could not detach unmanaged device %s from host %s: %s",
                item["name"],
                item["host_id"],
                err,
            )
            return
        log.warning(
            "detached unmanaged device %s from host %s (no reservation held it)",
            item["name"],
            item["host_id"],
        )
        self._unmanaged_since.pop((item.get("backend"), item["vendor_id"]), None)


__all__ = ["ClaimSweep"]
