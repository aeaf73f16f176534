"""What to do for one claim: reserve, attach, report, release. Pure and deterministic.

Given what the claim wants now (its allocation results of our driver, the node and host) and
the journal's active reservations of the claim, :func:`plan_claim` says which reservations to
release (detach first), which devices to reserve and attach, and which to report. Releases
come first in the apply order so that a device moving within one claim is freed before it is
taken again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from app.claims.model import MOVED_MARK, REPAIR_RETRY_S, WantedDevice
from app.reservations import (
    ATTACHED,
    ATTACHING,
    DETACH_FAILED,
    DETACHING,
    FAILED,
    PENDING,
    ReservationView,
)


@dataclass(frozen=True, slots=True)
class ClaimWants:
    """What the claim wants of us now.

    Attributes:
        wanted: our allocation results (empty when the claim is gone, deallocated, or holds
            none of our devices).
        node: the node the devices must go to, None while unknown.
        host_id: the fabric host of ``node``, None while unknown or unmapped.
        config_error: why the claim's config for our driver is invalid, if it is.
        manager: the fabric manager of ``host_id`` (``hosts.backend``), None when unknown;
            only devices of that manager can be attached to it.
    """

    wanted: tuple[WantedDevice, ...] = ()
    node: str | None = None
    host_id: str | None = None
    config_error: str | None = None
    manager: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """The actions for one claim, in apply order: release, then reserve, attach, report.

    Attributes:
        release: reservations to detach and release.
        reserve: results with no reservation yet, to reserve on ``host_id``.
        attach: reservations to (re)attach: pending, or attaching after a crash.
        ready: reservations already attached (reported ready).
        failed: reservations that failed (reported as failed until reallocated, or until a
            failed repair is tried again: see ``retry``).
        retry: ``failed`` reservations of a lost attachment, due to be attached again
            (:func:`repair_due`).
        refuse: results refused without a reservation (bad config), with the reason.
        waiting: results that wait (no node or host known yet), with the reason.
        stuck: ``detach-failed`` reservations: terminal, never released or retried by a pass
            (an operator forgets them); a wanted one is reported failed.
        requeue: True when the plan leaves work for a later pass (a detach in flight, waiting).
    """

    release: tuple[ReservationView, ...] = ()
    reserve: tuple[WantedDevice, ...] = ()
    attach: tuple[ReservationView, ...] = ()
    ready: tuple[ReservationView, ...] = ()
    failed: tuple[ReservationView, ...] = ()
    refuse: tuple[tuple[WantedDevice, str], ...] = ()
    waiting: tuple[tuple[WantedDevice, str], ...] = ()
    stuck: tuple[ReservationView, ...] = ()
    requeue: bool = False
    retry: tuple[ReservationView, ...] = ()

    @property
    def idle(self) -> bool:
        """True when the plan writes nothing to the fabric or the journal."""
        return not (self.release or self.reserve or self.attach or self.retry)


def reservation_key(reservation: ReservationView) -> WantedDevice:
    """The allocation result a reservation stands for (request, pool, device)."""
    return WantedDevice(reservation.request, reservation.pool, reservation.device_name)


def is_repair(reservation: ReservationView) -> bool:
    """True for a ``failed`` reservation whose device had been attached: a lost attachment
    that could not be attached again (not one found on another host, which is not ours to
    take back, and not a first attach, which the scheduler answers by placing the pod
    elsewhere)."""
    return (
        reservation.state == FAILED
        and reservation.attached_at is not None
        and MOVED_MARK not in (reservation.last_error or "")
    )


def repair_due(
    reservation: ReservationView, now: dt.datetime, after_s: float = REPAIR_RETRY_S
) -> bool:
    """True when :func:`is_repair` and ``after_s`` seconds have passed since it failed: its
    pod is bound and runs, so giving up for good would leave it without its device once the
    fabric works again (a fabric manager that restarted, a flaky link)."""
    return is_repair(reservation) and (now - reservation.updated_at).total_seconds() >= after_s


def plan_claim(
    wants: ClaimWants,
    reservations: Sequence[ReservationView],
    now: dt.datetime | None = None,
    repair_after_s: float = REPAIR_RETRY_S,
) -> ClaimPlan:
    """Plan one claim.

    Args:
        wants: see :class:`ClaimWants`.
        reservations: the claim's active reservations (not released).
        now: the current time, for failed repairs (:func:`repair_due`); None never retries
            them.
        repair_after_s: see :func:`repair_due`.

    Returns:
        The :class:`ClaimPlan`. Every wanted result ends in exactly one of reserve, attach,
        ready, failed, refuse or waiting, or waits for its old reservation's release (then
        ``requeue`` is set); every reservation that is no longer wanted, or is for another
        host than the claim's now, is released, except ``detach-failed`` ones, which are
        ``stuck`` (a wanted result held by one is reported failed).
    """
    wanted = set(wants.wanted)
    release: list[ReservationView] = []
    stuck: list[ReservationView] = []
    current: dict[WantedDevice, ReservationView] = {}
    requeue = False
    for reservation in sorted(reservations, key=lambda r: r.id):
        key = reservation_key(reservation)
        if reservation.state == DETACH_FAILED:
            stuck.append(reservation)
            continue
        moved = (
            wants.host_id is not None
            and reservation.host_id is not None
            and reservation.host_id != wants.host_id
        )
        if key not in wanted or moved or key in current:
            release.append(reservation)
            continue
        if reservation.state == DETACHING:
            # A release is under way; finish it, then take the device again.
            release.append(reservation)
            requeue = True
            continue
        current[key] = reservation

    reserve: list[WantedDevice] = []
    attach: list[ReservationView] = []
    ready: list[ReservationView] = []
    failed: list[ReservationView] = []
    retry: list[ReservationView] = []
    refuse: list[tuple[WantedDevice, str]] = []
    waiting: list[tuple[WantedDevice, str]] = []
    for item in sorted(wanted):
        held = current.get(item)
        if held is None:
            if any(reservation_key(r) == item for r in stuck):
                failed.extend(r for r in stuck if reservation_key(r) == item)
            elif any(reservation_key(r) == item for r in release):
                requeue = True
            elif wants.config_error is not None:
                refuse.append((item, wants.config_error))
            elif wants.node is None:
                waiting.append((item, "waiting for the node the claim is allocated for"))
                requeue = True
            elif wants.host_id is None:
                waiting.append((item, f"node {wants.node} maps to no fabric host"))
                requeue = True
            else:
                reserve.append(item)
        elif held.state in (PENDING, ATTACHING):
            if wants.host_id is None:
                waiting.append((item, "waiting for the fabric host"))
                requeue = True
            else:
                attach.append(held)
        elif held.state == ATTACHED:
            ready.append(held)
        elif held.state == FAILED:
            if now is not None and wants.host_id == held.host_id and is_repair(held):
                # Looked at again later (the queue's backoff), and tried again once due.
                requeue = True
                if repair_due(held, now, repair_after_s):
                    retry.append(held)
                    continue
            failed.append(held)
    return ClaimPlan(
        release=tuple(release),
        reserve=tuple(reserve),
        attach=tuple(attach),
        ready=tuple(ready),
        failed=tuple(failed),
        refuse=tuple(refuse),
        waiting=tuple(waiting),
        stuck=tuple(stuck),
        requeue=requeue,
        retry=tuple(retry),
    )


@dataclass(frozen=True, slots=True)
class HeldWait:
    """What to do about a device allocated to a claim while another reservation holds it.

    Attributes:
        wait: True: report the device not ready yet (binding condition False, no failure
            condition) and try again when the holder is released; False: report it failed
            (nothing releases the holder on its own).
        live: the holder is a live claim that keeps the device in its allocation (the device
            is allocated twice), not a release in progress.
        message: for the condition and the Event: the device, the holder claim (and its mode
            when it is not ours), the holder reservation's id and state.
    """

    wait: bool
    live: bool
    message: str


def wait_for_holder(
    device: str, holder: ReservationView | None, *, holder_keeps: bool, mode: str
) -> HeldWait:
    """Decide whether a claim waits for ``device``, held by the ``holder`` reservation.

    The scheduler may allocate a device whose previous claim let go of it before that claim's
    release has run (the detach takes time, or has not started). Such a claim waits: its
    binding conditions stay False and no failure condition is set, so the scheduler keeps the
    pod waiting up to its binding timeout (kube-scheduler's dynamicresources plugin,
    k8s.io/kubernetes pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go
    PreBind; DRA-REFERENCE.md "Binding conditions": ``allocationTimestamp + bindingTimeout``,
    600 s by default), and it is attached once the release completes.

    Args:
        device: the device name.
        holder: the reservation holding it, or None when it is not known (released since).
        holder_keeps: the holder's claim exists, is not being deleted, and its allocation
            still has the device: a live claim keeps it (a real double allocation), not a
            release in progress. Judged by the caller from the claim cache.
        mode: the waiting claim's mode (the holder's mode is named when it differs).

    Returns:
        A :class:`HeldWait`. A ``detach-failed`` holder is the one case that does not wait:
        only an operator's forget ends it, so the device is reported failed and the scheduler
        picks another.
    """
    if holder is None:
        return HeldWait(
            True,
            False,
            f"waiting for device {device}: another reservation held it a moment ago; trying again",
        )
    who = f"claim {holder.claim}"
    if holder.mode != mode:
        who += f" ({holder.mode} mode)"
    what = f"reservation {holder.id}, state {holder.state}"
    if holder.host_id:
        what += f", host {holder.host_id}"
    if holder.state == DETACH_FAILED:
        return HeldWait(
            False,
            False,
            (
                f"device {device} cannot be reserved: {who} still holds it ({what}): its detach "
                "failed for good and only an operator's forget releases it"
            ),
        )
    if holder.state == DETACHING:
        return HeldWait(
            True,
            False,
            (
                f"waiting for device {device}: {who} holds it ({what}) and is detaching it; it is "
                "attached here once that detach completes"
            ),
        )
    if holder_keeps:
        return HeldWait(
            True,
            True,
            (
                f"waiting for device {device}: {who} holds it ({what}) and still has it in its "
                "allocation, so the device is allocated twice; waiting until that claim lets go "
                "of it or the scheduler's binding timeout gives this allocation back"
            ),
        )
    return HeldWait(
        True,
        False,
        (
            f"waiting for device {device}: {who} holds it ({what}) but no longer has it in its "
            "allocation; it is attached here once that release completes"
        ),
    )
