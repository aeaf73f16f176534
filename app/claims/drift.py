"""Drift: the journal says a device is attached, the fabric says otherwise (DESIGN.md invariant 8).

The fabric manager is the truth. Hardware changes behind the controller's back: a fabric manager
that restarts may forget every attachment, someone may detach a device by hand or attach it to
another server. After every complete inventory sync the controller compares its ``attached``
reservations with the holders the fabric reported:

* **lost**: the device is free on the fabric, or gone from it. The reservation goes back to
  ``pending`` and the claim is queued, so the device is attached again while the claim lives
  (a device that keeps getting lost is given up after a bounded number of attach tries).
  The claim's ready condition is False with reason ``DeviceLost`` until the device is back;
  a Warning Event and ``drift{kind="lost"}`` say so.
* **moved**: the device is on another host. It is not ours to use or to take back: the
  reservation ends ``failed`` (failure condition ``DeviceMoved``, the device is tainted), with
  a Warning Event and ``drift{kind="moved"}``.

A reservation written after the listing began is left out: the listing may predate our own
attach. Shareable devices (several holders, of which the inventory keeps one) are left out too.
:func:`find_drift` is pure; :class:`DriftWatch` reads the journal and the inventory and acts
through each mode's :class:`~app.claims.fabric_ops.FabricOps`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from app.reservations import ATTACHED, ReservationView

if TYPE_CHECKING:  # I/O modules: the pure part (find_drift) must load without them
    from app.claims.fabric_ops import FabricOps
    from app.db.engine import Database
    from app.journal import Journal

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FabricView:
    """What the inventory says of one device now.

    Attributes:
        host_id: the host the fabric shows it attached to, or None when free.
        removed: the fabric no longer lists the device.
    """

    host_id: str | None
    removed: bool = False


@dataclass(frozen=True, slots=True)
class Drift:
    """One attached reservation that the fabric contradicts.

    Attributes:
        reservation: the journal's ``attached`` reservation.
        kind: ``lost`` (free or gone) or ``moved`` (on another host).
        reason: one line for the Event and the journal.
        holder: the host the fabric shows now (``moved`` only).
    """

    reservation: ReservationView
    kind: Literal["lost", "moved"]
    reason: str
    holder: str | None = None


def find_drift(
    attached: Iterable[ReservationView],
    fabric: Mapping[int, FabricView],
    since: dt.datetime,
) -> list[Drift]:
    """Compare ``attached`` reservations with the fabric's view of their devices.

    Args:
        attached: reservations; only exclusive ones in state ``attached`` are looked at.
        fabric: device id -> :class:`FabricView`; a device missing here is gone.
        since: when the listing behind ``fabric`` began (aware UTC); reservations updated at
            or after it are skipped.

    Returns:
        One :class:`Drift` per contradicted reservation, in reservation id order.
    """
    found: list[Drift] = []
    for reservation in sorted(attached, key=lambda r: r.id):
        if (
            reservation.state != ATTACHED
            or not reservation.exclusive
            or reservation.host_id is None
            or reservation.updated_at >= since
        ):
            continue
        view = fabric.get(reservation.device_id)
        if view is None or view.removed:
            found.append(Drift(reservation, "lost", "the device is gone from the fabric"))
        elif view.host_id is None:
            found.append(Drift(reservation, "lost", "the fabric shows it attached to no host"))
        elif view.host_id != reservation.host_id:
            found.append(
                Drift(
                    reservation,
                    "moved",
                    f"the fabric shows it on host {view.host_id}",
                    view.host_id,
                )
            )
    return found


@dataclass(frozen=True)
class DriftTarget:
    """How one allocation mode takes drift: its FabricOps, its cached claims, its queue.

    Attributes:
        ops: the mode's FabricOps (journal moves, Events, metrics).
        claim_by_uid: the cached claim for Events, or None.
        requeue: queue the claim's next pass (it attaches a lost device again).
    """

    ops: FabricOps
    claim_by_uid: Callable[[str], Mapping[str, Any] | None]
    requeue: Callable[[str], None]


class DriftWatch:
    """Finds and acts on drift after each complete inventory sync.

    Args:
        journal: the reservation journal.
        db: the database (the inventory's view of each device).
        targets: mode (``structured``, ``control-plane``) -> :class:`DriftTarget`;
            reservations of a mode not listed are only counted in :attr:`last`.
    """

    def __init__(self, journal: Journal, db: Database, targets: Mapping[str, DriftTarget]) -> None:
        self.journal = journal
        self.db = db
        self.targets = dict(targets)
        self.last: list[Drift] = []

    async def check(self, since: dt.datetime, manager: str | None = None) -> list[Drift]:
        """Compare, then act on each drift (see the module docstring).

        Args:
            since: when the inventory sync's listing began (aware UTC).
            manager: the fabric manager that listing read (``devices.backend``): only its
                devices are judged, since the others were listed at other times. None
                judges every device.

        Returns:
            The drifts found (acted on when their mode has a target).

        Raises:
            SQLAlchemyError: the database could not be read or written.
        """
        attached = await self.journal.active([ATTACHED])
        if not attached:
            self.last = []
            return []
        fabric = await _fabric_views(self.db, {r.device_id for r in attached}, manager)
        if manager is not None:
            attached = [r for r in attached if r.device_id in fabric]
        drifts = find_drift(attached, fabric, since)
        self.last = drifts
        for drift in drifts:
            target = self.targets.get(drift.reservation.mode)
            if target is None:
                continue
            uid = drift.reservation.claim.uid
            claim = target.claim_by_uid(uid)
            if drift.kind == "lost":
                acted = await target.ops.lost(drift.reservation, drift.reason, claim)
            else:
                assert drift.holder is not None
                acted = await target.ops.moved(drift.reservation, drift.holder, claim)
            if acted:
                target.requeue(uid)
        return drifts


async def _fabric_views(
    db: Database, device_ids: Sequence[int] | set[int], manager: str | None = None
) -> dict[int, FabricView]:
    # Imported here so that importing this module (find_drift) loads no database library.
    from sqlalchemy import select

    from app.db.models import Device

    query = select(Device.id, Device.host_id, Device.removed_at).where(
        Device.id.in_(sorted(device_ids))
    )
    if manager is not None:
        query = query.where(Device.backend == manager)
    async with db.read() as session:
        rows = (await session.execute(query)).all()
    return {id_: FabricView(host_id, removed_at is not None) for id_, host_id, removed_at in rows}


__all__ = ["Drift", "DriftTarget", "DriftWatch", "FabricView", "find_drift"]
