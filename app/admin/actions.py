"""The operator's writes behind the admin API: cordon, uncordon, force-release, forget.

:class:`DatabaseActions` implements :class:`app.admin.context.AdminActions` over the database,
the reservation journal and the fabric backend. After a change it calls ``on_change`` so the
service re-publishes the pools (cordoned devices are tainted or withheld by
:func:`app.pools.desired_pools`; a released ``failed`` reservation lifts an attach-failed taint).

A force-release is the controllers' own release routine (:meth:`app.claims.fabric_ops.FabricOps.
release_once`, DESIGN.md invariant 2), with "released by an administrator" journalled in each
step: ``detaching`` is written before the fabric is asked to detach, and a task the fabric runs
for it is journalled and followed. A fabric that no longer knows the device, or shows it held by
another host, counts as detached. A transient fabric error leaves the reservation ``detaching``
with the error recorded (the controller tries again, so the device is never released while it
may still be attached); a refusal, or a transient error past the detach attempts, ends it
``detach-failed``, as the controller's own release does. A ``detach-failed`` reservation may be
force-released again once the operator fixed what the fabric refused.

A *forget* is for the hardware an operator fixed by hand: the reservation (typically
``detach-failed``) is released without any fabric call, with the operator's reason journalled in
the reservation and as a ``forgotten`` device event.
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sqlalchemy import insert, select, update

from app.admin.queries import device_summary
from app.claims.fabric_ops import FabricOps
from app.clock import utcnow
from app.db.engine import Database
from app.db.models import Device, DeviceEvent
from app.fabric.backend import FabricBackend
from app.journal import FORGET_FROM, RELEASED, ClaimRef, Journal
from app.pools import PoolConfig

log = logging.getLogger(__name__)

MAX_REASON_LENGTH = 255
RELEASE_ATTEMPTS = 3
RELEASE_NOTE = "released by an administrator"
"""Journalled in each step of a force-release (``last_error``)."""


class DatabaseActions:
    """Cordon, uncordon and force-release, as :class:`app.admin.context.AdminActions` says.

    Args:
        db: the database.
        journal: the reservation journal on the same database.
        backend: the fabric backend (for the detach of a force-release).
        pool_config: to name a device's pool in the answers.
        on_change: called (and awaited when it returns an awaitable) after each change; its
            failure is logged, the change stands.
        clock: the current aware UTC time.
        ops: the release routine to force-release with (the service passes one with its
            metrics and ``controller.detach_attempts``); default: one over ``journal`` and
            ``backend`` that records no Events.
        on_release: called with the claim of a reservation a force-release or a forget
            moved, so that the controller works on that claim at once: its status says what
            happened, and a claim that still has the device allocated gets it attached again
            (the service queues it in the live controllers). Its failure is logged.
    """

    def __init__(
        self,
        db: Database,
        journal: Journal,
        backend: FabricBackend,
        pool_config: PoolConfig,
        on_change: Callable[[], Awaitable[None] | None] | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        ops: FabricOps | None = None,
        on_release: Callable[[ClaimRef], None] | None = None,
    ) -> None:
        self.db = db
        self.journal = journal
        self.backend = backend
        self.pool_config = pool_config
        self.on_change = on_change
        self.clock = clock
        self.ops = ops if ops is not None else FabricOps(journal, backend, None, clock=clock)
        self.on_release = on_release

    def _claim_changed(self, claim: ClaimRef) -> None:
        if self.on_release is None:
            return
        try:
            self.on_release(claim)
        except Exception:
            log.exception(
                "queueing claim %s after an admin action failed; its resync comes later", claim
            )

    async def _changed(self) -> None:
        if self.on_change is None:
            return
        try:
            result = self.on_change()
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("re-publishing after an admin action failed; the next sync retries")

    async def _device(self, name: str) -> Mapping[str, Any]:
        data = await device_summary(self.db, name, self.pool_config)
        if data is None:  # deleted between the write and the read: not expected in practice
            raise LookupError(f"device {name!r} is not in the inventory")
        return data

    async def _set_cordon(self, name: str, reason: str | None, cordon: bool) -> bool:
        """Write the cordon columns and an event; True when something changed."""
        now = self.clock()
        async with self.db.write() as session:
            row = (
                await session.execute(
                    select(
                        Device.id, Device.removed_at, Device.cordoned_at, Device.cordon_reason
                    ).where(Device.name == name)
                )
            ).one_or_none()
            if row is None:
                raise LookupError(f"device {name!r} is not in the inventory")
            if row.removed_at is not None:
                raise ValueError(
                    f"device {name!r} was removed from the fabric; "
                    "there is nothing to cordon or uncordon"
                )
            if cordon:
                if row.cordoned_at is not None and row.cordon_reason == reason:
                    return False
                values: dict[str, Any] = {
                    "cordoned_at": row.cordoned_at or now,
                    "cordon_reason": reason,
                }
                event = ("cordoned", row.cordon_reason, reason)
            else:
                if row.cordoned_at is None:
                    return False
                values = {"cordoned_at": None, "cordon_reason": None}
                event = ("uncordoned", row.cordon_reason, None)
            await session.execute(update(Device).where(Device.id == row.id).values(**values))
            await session.execute(
                insert(DeviceEvent).values(
                    device_id=row.id, at=now, kind=event[0], old=event[1], new=event[2]
                )
            )
        return True

    async def cordon(self, device: str, reason: str) -> Mapping[str, Any]:
        """Take ``device`` out of the slices (tainted or withheld); it stays in the inventory.

        Cordoning a cordoned device only replaces its reason.

        Raises:
            LookupError: no such device.
            ValueError: the device was removed, or the reason is longer than 255 characters.
        """
        if len(reason) > MAX_REASON_LENGTH:
            raise ValueError(f"reason: at most {MAX_REASON_LENGTH} characters")
        if await self._set_cordon(device, reason, cordon=True):
            why = repr(reason) if reason else "(no reason)"  # repr: no line breaks in the log
            log.info("device %s cordoned by an administrator: %s", device, why)
            await self._changed()
        return await self._device(device)

    async def uncordon(self, device: str) -> Mapping[str, Any]:
        """Offer a cordoned ``device`` again (a device that is not cordoned is left as it is).

        Raises:
            LookupError: no such device.
            ValueError: the device was removed.
        """
        if await self._set_cordon(device, None, cordon=False):
            log.info("device %s uncordoned by an administrator", device)
            await self._changed()
        return await self._device(device)

    async def force_release(self, reservation_id: int) -> Mapping[str, Any]:
        """Detach (best effort) and release reservation ``reservation_id``, through the
        controllers' release routine (:meth:`FabricOps.release_once`; a ``detach-failed``
        reservation is detached again).

        Returns:
            The reservation: ``released``; ``detaching`` with ``last_error`` set after a
            transient fabric error (the controller tries again); ``detach-failed`` when the
            fabric refused the detach, or failed too many times in a row.

        Raises:
            LookupError: no such reservation.
            ValueError: it is released already.
        """
        for _ in range(RELEASE_ATTEMPTS):
            current = await self.journal.get(reservation_id)
            if current is None:
                raise LookupError(f"reservation {reservation_id} does not exist")
            if current.state == RELEASED:
                raise ValueError(f"reservation {reservation_id} is released already")
            result = await self.ops.release_once(
                current, None, note=RELEASE_NOTE, retry_detach_failed=True
            )
            done = result.reservation
            if done is not None:
                log.info(
                    "reservation %d (device %s, claim %s) force-released by an administrator: %s",
                    done.id,
                    done.device_name,
                    done.claim,
                    done.state,
                )
                self._claim_changed(done.claim)
                await self._changed()
                return done.to_json()
            # Another worker moved it between our read and our write: read again.
        raise ValueError(f"reservation {reservation_id} keeps changing state; try again")

    async def forget(self, reservation_id: int, reason: str) -> Mapping[str, Any]:
        """Release ``reservation_id`` without a detach, journalling ``reason``.

        Returns:
            The released reservation.

        Raises:
            LookupError: no such reservation.
            ValueError: no reason, a reason over 255 characters, or the reservation is in
                none of :data:`app.journal.FORGET_FROM` (released already; ``pending``,
                ``attaching`` or ``attached``: release it instead, which detaches).
        """
        reason = reason.strip()
        if not reason:
            raise ValueError("a reason is required: say what was fixed on the fabric")
        if len(reason) > MAX_REASON_LENGTH:
            raise ValueError(f"reason: at most {MAX_REASON_LENGTH} characters")
        current = await self.journal.get(reservation_id)
        if current is None:
            raise LookupError(f"reservation {reservation_id} does not exist")
        if current.state == RELEASED:
            raise ValueError(
                f"reservation {reservation_id} is released: there is nothing to forget"
            )
        if current.state not in FORGET_FROM:
            raise ValueError(
                f"reservation {reservation_id} is {current.state}: only a detach-failed, failed "
                "or detaching reservation can be forgotten (a live claim may be using this "
                "device); release it instead, which detaches it"
            )
        done = await self.journal.forget(reservation_id, reason)
        if done is None:
            raise ValueError(f"reservation {reservation_id} changed state meanwhile; try again")
        async with self.db.write() as session:
            await session.execute(
                insert(DeviceEvent).values(
                    device_id=done.device_id,
                    at=self.clock(),
                    kind="forgotten",
                    old=current.state,
                    new=reason[:255],
                )
            )
        log.warning(
            "reservation %d (device %s, claim %s, was %s) forgotten by an "
            "administrator without a detach: %r",
            done.id,
            done.device_name,
            done.claim,
            current.state,
            reason,
        )
        self._claim_changed(done.claim)
        await self._changed()
        return done.to_json()
