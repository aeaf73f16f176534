"""The reservation journal: which device is held for which claim, and what was sent to the fabric.

Rules it keeps (DESIGN.md invariants 1 and 2):

* A device has at most one active exclusive reservation. The database enforces it with the
  partial unique index ``uq_reservations_active_device``; :meth:`Journal.reserve` turns the
  index's refusal into :class:`DeviceHeld`.
* Every state change is a compare-and-set (``UPDATE ... WHERE id = ? AND state IN (...)``), so
  two workers, or a worker and the recovery pass, cannot both move one reservation.
* ``attaching`` and ``detaching`` are written before the fabric call is sent; after a crash
  they say which calls may have been half done.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Connection,
    Integer,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from app.clock import utcnow
from app.db.engine import Database
from app.db.models import ACTIVE_RESERVATION_STATES, Device, Reservation, UtcDateTime
from app.fabric.types import DeviceType, FabricDevice, Location
from app.heldfeed import HeldFeed
from app.reservations import (  # the journal's value types, exposed here too
    ATTACHED,
    ATTACHING,
    DETACH_FAILED,
    DETACHING,
    FAILED,
    FORGET_FROM,
    PENDING,
    RELEASED,
    STATES,
    ClaimRef,
    HeldDevice,
    ReservationView,
)

MAX_ERROR_LENGTH = 2000


class DeviceHeld(Exception):
    """The device already has an active exclusive reservation for another claim.

    Attributes:
        device: the device name.
        holder: ``namespace/name`` of the claim holding it, if known.
        reservation: the holder's active reservation (its claim, mode, state, host), if known.
    """

    def __init__(
        self, device: str, holder: str | None, reservation: ReservationView | None = None
    ) -> None:
        super().__init__(
            f"device {device} is held by claim {holder}" if holder else f"device {device} is held"
        )
        self.device = device
        self.holder = holder
        self.reservation = reservation


class UnknownDevice(Exception):
    """No present device has that name."""


class WrongManager(UnknownDevice):
    """The device is on another fabric manager than the node's host: no attach can join them."""


_TABLE: Table = Reservation.__table__  # type: ignore[assignment]
_COLUMNS = tuple(_TABLE.c)
_DEVICES: Table = Device.__table__  # type: ignore[assignment]
_FABRIC_COLUMNS = (
    _DEVICES.c.vendor_id,
    _DEVICES.c.attach_unit,
    _DEVICES.c.device_type,
    _DEVICES.c.uuid,
    _DEVICES.c.host_id,
    _DEVICES.c.shareable,
    _DEVICES.c.vendor_name,
    # identity the node plugin looks for on the host (status.devices data)
    _DEVICES.c.serial,
    _DEVICES.c.slot,
    _DEVICES.c.attributes,
    # the fabric manager that owns it: attach and detach go there (app.fabric.fleet)
    _DEVICES.c.backend,
)
_ACTIVE = tuple(ACTIVE_RESERVATION_STATES)
_STATE_NAME = re.compile(r"[a-z][a-z-]*")


def _state_in(column: ColumnElement[str], states: Collection[str]) -> ColumnElement[bool]:
    """``column IN ('a', 'b')`` with the reservation states written into the SQL text.

    An IN of bound values is an "expanding" parameter: SQLAlchemy rewrites the statement's
    text on every execution, about 30 us of a 70 us query on SQLite. The states are a fixed
    set of names, so writing them in is safe; anything else is refused.

    Raises:
        ValueError: a state that is not a lower-case name.
    """
    for state in states:
        if not _STATE_NAME.fullmatch(state):
            raise ValueError(f"not a reservation state: {state!r}")
    return column.in_([literal_column(f"'{state}'") for state in states])


def _active(column: ColumnElement[str]) -> ColumnElement[bool]:
    """``column != 'released'`` with the state written into the SQL text: every active
    state, in the very term of the partial index ``ix_reservations_active_device_id``.

    A query is planned on a partial index only when its WHERE implies the index's. SQLite
    sees that only when the index's terms appear in the query as written
    (sqlite.org/partialindex.html, "Queries Using Partial Indexes"), not for a bound value,
    nor for ``state IN (...)`` of the states it leaves. Without the index, the check that a
    device is free walked every active reservation (PostgreSQL: 0.37 of 0.59 ms of a
    reserve with 2,000 of them).
    """
    return column != literal_column(f"'{RELEASED}'")


# The statements of the claim path are built once: building a statement and its cache key
# costs as much as running it on SQLite.
_R, _D = _TABLE.c, _DEVICES.c
_FOR_CLAIM = select(*_COLUMNS).where(_R.claim_uid == bindparam("b_uid")).order_by(_R.id)
_FOR_CLAIM_ACTIVE = (
    select(*_COLUMNS)
    .where(_R.claim_uid == bindparam("b_uid"), _state_in(_R.state, _ACTIVE))
    .order_by(_R.id)
)
_FABRIC_DEVICE = select(*_FABRIC_COLUMNS).where(_D.id == bindparam("b_device_id"))
# The device and its active reservations in one statement (a row with NULL reservation
# columns when it has none): device id, the _FABRIC_COLUMNS, then every reservation column.
_DEVICE_AND_HOLDERS = (
    select(_D.id, *_FABRIC_COLUMNS, *_COLUMNS)
    .select_from(_DEVICES.outerjoin(_TABLE, and_(_R.device_id == _D.id, _active(_R.state))))
    .where(_D.name == bindparam("b_name"), _D.removed_at.is_(None))
    .order_by(_R.id)
)
_HELD = (
    select(_R.claim_uid, _R.pool, _R.device_name)
    .where(_state_in(_R.state, _ACTIVE), _R.exclusive.is_(True))
    .order_by(_R.id)
)
_INSERT = insert(_TABLE).returning(*_COLUMNS)


@functools.cache
def _move_statement(expected: tuple[str, ...], same_phase: tuple[str, ...]) -> Any:
    """The UPDATE of a journal move from one of ``expected`` (its attempts kept when the row
    is in one of ``same_phase``), built once per pair of state sets (a handful)."""
    return (
        update(_TABLE)
        .where(_R.id == bindparam("b_id"), _state_in(_R.state, expected))
        .values(
            state=bindparam("b_state"),
            last_error=bindparam("b_error", type_=Text()),
            # Attempts are counted per phase (attach, then detach): a move into another phase
            # starts the count again, so "N failures in a row" means N of this operation.
            attempts=case((_state_in(_R.state, same_phase), _R.attempts), else_=0)
            + bindparam("b_attempt", type_=Integer()),
            node=func.coalesce(bindparam("b_node", type_=String()), _R.node),
            host_id=func.coalesce(bindparam("b_host_id", type_=String()), _R.host_id),
            operation_id=case(
                (bindparam("b_clear_operation", type_=Boolean()), None),
                else_=func.coalesce(bindparam("b_operation_id", type_=String()), _R.operation_id),
            ),
            updated_at=bindparam("b_now", type_=UtcDateTime()),
            attached_at=func.coalesce(
                bindparam("b_attached_at", type_=UtcDateTime()), _R.attached_at
            ),
            released_at=func.coalesce(
                bindparam("b_released_at", type_=UtcDateTime()), _R.released_at
            ),
        )
        .returning(*_COLUMNS)
    )


_FABRIC_WIDTH = 1 + len(_FABRIC_COLUMNS)
# The device row follows what we verified on the fabric, in the same transaction as the
# journal move, so that the inventory never shows a device we just attached as held by
# nobody, or one we just detached as still held (until the next sync reads the fabric). The
# row's content hash is cleared with it: the hash stands for what the fabric last listed, so
# the next sync compares the row with the fabric again (and rewrites it once) instead of
# taking the old listing's hash for "no change" while the fabric has since drifted.
_DEVICE_NOW_ON = (
    update(_DEVICES)
    .where(_D.id == bindparam("b_device_id"))
    .values(host_id=bindparam("b_device_host", type_=String()), content_hash="")
)
_DEVICE_NOW_OFF = (
    update(_DEVICES)
    .where(
        _D.id == bindparam("b_device_id"), _D.host_id == bindparam("b_device_host", type_=String())
    )
    .values(host_id=None, content_hash="")
)
# A move to these states from those starts a new phase: its attempts are counted from zero.
# Attach tries are counted over the reservation's life: a lost attachment attached again adds
# to them, so that a device the fabric keeps losing is given up (FabricOps.lost). A failed
# repair tried again later (FabricOps.retry_repair: failed -> attaching) starts anew.
_NEW_PHASE_FROM = {
    DETACHING: (ATTACHING, ATTACHED, FAILED, DETACH_FAILED),
    ATTACHING: (FAILED,),
}
_SAME_PHASE = {
    state: tuple(s for s in STATES if s not in _NEW_PHASE_FROM.get(state, ())) for state in STATES
}

# PostgreSQL runs the claim path's writes as one statement each, in autocommit
# (Database.fetch, straight through asyncpg): a data-modifying WITH ("Data-Modifying
# Statements in WITH", in the PostgreSQL manual's "WITH Queries") does the move, the device
# row's holder and the device's read at once, where a transaction of two or three
# statements took BEGIN, each statement and COMMIT as round trips to the server. SQLite has
# no data-modifying WITH and keeps the transactions (which cost it no round trip). All the
# statements of a WITH see one snapshot, taken before any of them writes: a device row
# updated by the statement is not read back by it, so no move both updates and reads the
# device this way.
_RESERVATION_WIDTH = len(_COLUMNS)
DEVICE_ON, DEVICE_OFF = "on", "off"


@functools.cache
def _move_one_statement(
    expected: tuple[str, ...],
    same_phase: tuple[str, ...],
    device_change: str | None,
    with_device: bool,
    device_required: bool,
) -> Any:
    """PostgreSQL: a journal move as one statement.

    Its row: every reservation column, then (``with_device``) the device's id and
    ``_FABRIC_COLUMNS`` (NULL when the row is gone). No row: the reservation was in none of
    ``expected`` or, with ``device_required`` (which only a move ``with_device`` asks), its
    device row is gone (nothing was written).
    ``device_change`` is DEVICE_ON (the device row now held by the reservation's host),
    DEVICE_OFF (no longer held, when the reservation's host held it) or None.
    """
    move = _move_statement(expected, same_phase)
    if device_required:
        move = move.where(select(_D.id).where(_D.id == _R.device_id).exists())
    moved = move.cte("moved")
    # The device by the moved row's device id as a value (an InitPlan), not by a join with
    # the WITH's rows: the lookup is by primary key whatever the planner's statistics say
    # (a join planned on a never-analyzed devices table scanned every device row).
    moved_device = select(moved.c.device_id).scalar_subquery()
    moved_host = select(moved.c.host_id).scalar_subquery()
    query = select(*(moved.c[column.name] for column in _COLUMNS))
    if device_change == DEVICE_ON:
        query = query.add_cte(
            update(_DEVICES)
            .where(_D.id == moved_device, moved_host.is_not(None))
            .values(host_id=moved_host, content_hash="")
            .cte("device_on")
        )
    elif device_change == DEVICE_OFF:
        query = query.add_cte(
            update(_DEVICES)
            .where(_D.id == moved_device, _D.host_id == moved_host)
            .values(host_id=None, content_hash="")
            .cte("device_off")
        )
    if with_device:
        query = query.add_columns(_D.id, *_FABRIC_COLUMNS).select_from(
            moved.outerjoin(_DEVICES, _D.id == moved_device)
        )
    return query


# The columns a new reservation is written with, each a bound value but the device's id and
# whether it is exclusive, which come from the device row.
_RESERVE_VALUES = tuple(
    column.name for column in _COLUMNS if column.name not in ("id", "device_id", "exclusive")
)


@functools.cache
def _reserve_free_statement(with_manager: bool) -> Any:
    """PostgreSQL: reserve a device that nothing holds, as one statement (an INSERT from a
    SELECT of the device row, in a data-modifying WITH).

    Its row: every column of the new reservation, then the device's ``_FABRIC_COLUMNS``. No
    row when the device is not present, is held by any active reservation or (with
    ``with_manager``) is on another fabric manager than ``b_manager``: nothing was written,
    and the transaction of :meth:`Journal._reserve_once` tells which. Two such statements
    racing for one device: the partial unique index refuses the second (IntegrityError).
    """
    held = select(_R.id).where(_R.device_id == _D.id, _active(_R.state)).exists()
    source = select(
        _D.id,
        ~_D.shareable,
        *(bindparam(name, type_=_TABLE.c[name].type) for name in _RESERVE_VALUES),
    ).where(_D.name == bindparam("device_name"), _D.removed_at.is_(None), ~held)
    if with_manager:
        source = source.where(_D.backend == bindparam("b_manager", type_=String()))
    reserved = (
        insert(_TABLE)
        .from_select(["device_id", "exclusive", *_RESERVE_VALUES], source)
        .returning(*_COLUMNS)
        .cte("reserved")
    )
    return select(*(reserved.c[column.name] for column in _COLUMNS), *_FABRIC_COLUMNS).select_from(
        reserved.join(_DEVICES, _D.id == select(reserved.c.device_id).scalar_subquery())
    )


def _view(row: Any) -> ReservationView:
    """A ReservationView from a Core row of every reservation column (in table order)."""
    (
        id_,
        claim_uid,
        claim_namespace,
        claim_name,
        request,
        mode,
        device_id,
        device_name,
        pool,
        exclusive,
        node,
        host_id,
        state,
        attempts,
        last_error,
        operation_id,
        created_at,
        updated_at,
        attached_at,
        released_at,
    ) = row
    return ReservationView(
        id=id_,
        claim=ClaimRef(claim_uid, claim_namespace, claim_name),
        request=request,
        mode=mode,
        device_id=device_id,
        device_name=device_name,
        pool=pool,
        exclusive=bool(exclusive),
        node=node,
        host_id=host_id,
        state=state,
        attempts=attempts,
        last_error=last_error,
        operation_id=operation_id,
        created_at=created_at,
        updated_at=updated_at,
        attached_at=attached_at,
        released_at=released_at,
    )


@dataclass(frozen=True, slots=True)
class _Wanted:
    """What a reserve asks for (see :meth:`Journal.reserve`)."""

    claim: ClaimRef
    request: str
    device_name: str
    pool: str
    mode: str
    node: str | None
    host_id: str | None
    manager: str | None = None


def _new_reservation(wanted: _Wanted, attaching: bool, now: dt.datetime) -> dict[str, Any]:
    """The values of a new reservation for ``wanted`` but its device id and ``exclusive``:
    ``attaching`` with one attempt counted, or ``pending``."""
    return {
        "claim_uid": wanted.claim.uid,
        "claim_namespace": wanted.claim.namespace,
        "claim_name": wanted.claim.name,
        "request": wanted.request,
        "mode": wanted.mode,
        "device_name": wanted.device_name,
        "pool": wanted.pool,
        "node": wanted.node,
        "host_id": wanted.host_id,
        "state": ATTACHING if attaching else PENDING,
        "attempts": 1 if attaching else 0,
        "created_at": now,
        "updated_at": now,
    }


@dataclass(frozen=True, slots=True)
class _Change:
    """What a transition writes besides the state (see :meth:`Journal.transition`)."""

    error: str | None = None
    count_attempt: bool = False
    node: str | None = None
    host_id: str | None = None
    operation_id: str | None = None
    clear_operation: bool = False
    detached: bool = False


class Journal:
    """Reads and writes reservations. Each method is one short database transaction.

    Args:
        db: the database.
        clock: returns the current aware UTC time.
    """

    def __init__(self, db: Database, clock: Callable[[], dt.datetime] = utcnow) -> None:
        self.db = db
        self.clock = clock
        # PostgreSQL: the claim path's writes as one statement each (see _move_one_statement).
        self._one_statement = db.dialect == "postgresql"
        if db.held_feed is None:
            db.held_feed = HeldFeed()
        self.feed: HeldFeed = db.held_feed

    async def reserve(
        self,
        claim: ClaimRef,
        request: str,
        device_name: str,
        pool: str,
        mode: str,
        node: str | None,
        host_id: str | None,
        *,
        manager: str | None = None,
    ) -> ReservationView:
        """Hold ``device_name`` for ``claim``'s ``request`` (state ``pending``).

        Idempotent: when ``claim`` already holds the device for that request, the existing
        active reservation is returned.

        Args:
            manager: the fabric manager ``host_id`` belongs to; the device must be on it
                (None: not checked, one manager).

        Raises:
            UnknownDevice: no present device has that name.
            WrongManager: the device is on another fabric manager than ``manager``.
            DeviceHeld: another claim holds the device.
        """
        view, _ = await self._reserve(
            _Wanted(claim, request, device_name, pool, mode, node, host_id, manager),
            attaching=False,
        )
        return view

    async def reserve_for_attach(
        self,
        claim: ClaimRef,
        request: str,
        device_name: str,
        pool: str,
        mode: str,
        node: str,
        host_id: str,
        *,
        manager: str | None = None,
    ) -> tuple[ReservationView, FabricDevice | None]:
        """Hold ``device_name`` for ``claim``'s ``request`` and record the intent to attach it
        in the same transaction: the new reservation is written as ``attaching`` with one
        attempt counted (what :meth:`begin_attach` would write next, one transaction sooner).

        Returns:
            (the reservation, the fabric's view of the device) when a new reservation was
            written: the attach may be sent now. (the existing reservation, None) when
            ``claim`` already held the device for ``request``: drive it as usual.

        Raises:
            UnknownDevice: no present device has that name.
            WrongManager: the device is on another fabric manager than ``manager``.
            DeviceHeld: another claim holds the device.
        """
        return await self._reserve(
            _Wanted(claim, request, device_name, pool, mode, node, host_id, manager),
            attaching=True,
        )

    async def _reserve(
        self, wanted: _Wanted, *, attaching: bool
    ) -> tuple[ReservationView, FabricDevice | None]:
        try:
            view, device, inserted = await self._reserve_once(wanted, attaching=attaching)
        except (DeviceHeld, UnknownDevice):
            raise
        except BaseException:
            self.feed.reset()  # committed or not: readers read again
            raise
        if inserted and view.exclusive:
            self.feed.hold(view)
        return view, device

    async def _reserve_once(
        self, wanted: _Wanted, *, attaching: bool
    ) -> tuple[ReservationView, FabricDevice | None, bool]:
        claim, request, device_name = wanted.claim, wanted.request, wanted.device_name

        def work(conn: Connection) -> tuple[ReservationView, FabricDevice | None, bool]:
            # One transaction for the check and the insert (BEGIN IMMEDIATE on SQLite); the
            # time is taken inside it, so journal times follow commit order.
            now = self.clock()
            rows = conn.execute(_DEVICE_AND_HOLDERS, {"b_name": device_name}).all()
            if not rows:
                raise UnknownDevice(f"device {device_name} is not in the inventory")
            device = rows[0]
            existing = [_view(r[_FABRIC_WIDTH:]) for r in rows if r[_FABRIC_WIDTH] is not None]
            for held in existing:
                if held.claim.uid == claim.uid and held.request == request:
                    return held, None, False
            fabric = _fabric_device_from(device[1:_FABRIC_WIDTH])
            if wanted.manager is not None and fabric.location.manager != wanted.manager:
                raise WrongManager(
                    f"device {device_name} is on fabric manager {fabric.location.manager}, "
                    f"but host {wanted.host_id} of node {wanted.node} is on {wanted.manager}"
                )
            exclusive = not fabric.shareable
            if exclusive and existing:
                raise DeviceHeld(device_name, str(existing[0].claim), existing[0])
            inserted = conn.execute(
                _INSERT,
                {
                    **_new_reservation(wanted, attaching, now),
                    "device_id": device[0],
                    "exclusive": exclusive,
                },
            ).one()
            return _view(inserted), fabric if attaching else None, True

        try:
            if self._one_statement:
                reserved = await self._reserve_free(wanted, attaching=attaching)
                if reserved is not None:
                    return reserved
                # Not present, held (perhaps by this very claim) or on another fabric
                # manager: the transaction tells which.
            return await self.db.run_write(work, brief=True)
        except IntegrityError as err:
            # A concurrent reserve (another process, or PostgreSQL's weaker isolation) won
            # the race for the device; the index said no.
            holder = await self._holder_of(device_name)
            raise DeviceHeld(device_name, str(holder.claim) if holder else None, holder) from err

    async def _reserve_free(
        self, wanted: _Wanted, *, attaching: bool
    ) -> tuple[ReservationView, FabricDevice | None, bool] | None:
        """PostgreSQL: :meth:`_reserve_once`'s common case (a present device that nothing
        holds, on the wanted fabric manager) as one statement; None when the device is not
        in that case (nothing was written).

        Raises:
            IntegrityError: a concurrent reserve took the device first.
        """
        statement = _reserve_free_statement(wanted.manager is not None)

        rows = await self.db.fetch(
            statement,
            {
                **_new_reservation(wanted, attaching, self.clock()),
                # columns a new reservation starts without
                "operation_id": None,
                "last_error": None,
                "attached_at": None,
                "released_at": None,
                "b_manager": wanted.manager,
            },
            writes=True,
        )
        if not rows:
            return None
        row = rows[0]
        fabric = _fabric_device_from(row[_RESERVATION_WIDTH:])
        return _view(row[:_RESERVATION_WIDTH]), fabric if attaching else None, True

    async def _holder_of(self, device_name: str) -> ReservationView | None:
        row = await self.db.run_read(
            lambda conn: conn.execute(
                select(*_COLUMNS)
                .where(_TABLE.c.device_name == device_name, _TABLE.c.state.in_(_ACTIVE))
                .order_by(_TABLE.c.id)
            ).first(),
            brief=True,
        )
        return _view(row) if row else None

    async def transition(
        self,
        reservation_id: int,
        expected: Collection[str],
        state: str,
        *,
        error: str | None = None,
        count_attempt: bool = False,
        node: str | None = None,
        host_id: str | None = None,
        operation_id: str | None = None,
        clear_operation: bool = False,
        detached: bool = False,
    ) -> ReservationView | None:
        """Move a reservation to ``state`` if it is in one of ``expected`` states.

        Attempts are counted per phase: attach tries over the reservation's life (a lost
        attachment attached again adds to them), detach tries from the move into
        ``detaching``.
        A move to ``attached`` also records the reservation's host as the device's holder,
        and a move to ``released`` with ``detached`` clears the device's holder when it is
        still that host, in the same transaction.

        Args:
            error: stored as ``last_error`` (cut to 2,000 characters); None clears it.
            count_attempt: add one to ``attempts``.
            node, host_id, operation_id: stored when given.
            clear_operation: forget the stored ``operation_id`` (the operation ended).
            detached: the fabric showed the device detached from the reservation's host.

        Returns:
            The updated reservation, or None when it was not in an ``expected`` state (someone
            else moved it) or does not exist.

        Raises:
            ValueError: an unknown state.
        """
        change = _Change(
            error, count_attempt, node, host_id, operation_id, clear_operation, detached
        )
        moved = await self._transition(reservation_id, expected, state, change, with_device=False)
        return moved[0] if moved else None

    async def begin_attach(
        self, reservation_id: int
    ) -> tuple[ReservationView, FabricDevice] | None:
        """Record the intent to attach (``pending`` or ``attaching`` -> ``attaching``, one
        attempt counted) and read the device's fabric view, in one transaction.

        Returns:
            (the reservation, the device), or None when the reservation was in another state.

        Raises:
            UnknownDevice: the device row is gone (the transition is not kept).
        """
        moved = await self._transition(
            reservation_id,
            (PENDING, ATTACHING),
            ATTACHING,
            _Change(count_attempt=True),
            with_device=True,
        )
        if moved is None:
            return None
        view, device = moved
        assert device is not None
        return view, device

    async def begin_detach(
        self,
        reservation_id: int,
        *,
        error: str | None = None,
        from_detach_failed: bool = False,
    ) -> tuple[ReservationView, FabricDevice | None] | None:
        """Record the intent to detach (any state but ``pending``, ``released`` and, unless
        ``from_detach_failed``, ``detach-failed`` -> ``detaching``, one attempt counted) and
        read the device's fabric view, in one transaction.

        Args:
            error: stored as ``last_error`` (None clears it).
            from_detach_failed: a ``detach-failed`` reservation may be tried again too (an
                operator's force-release); its detach attempts count from zero again.

        Returns:
            (the reservation, the device or None when its row is gone), or None when the
            reservation was in another state.
        """
        expected = (ATTACHING, ATTACHED, FAILED, DETACHING) + (
            (DETACH_FAILED,) if from_detach_failed else ()
        )
        return await self._transition(
            reservation_id,
            expected,
            DETACHING,
            _Change(error=error, count_attempt=True),
            with_device=True,
            device_required=False,
        )

    async def forget(self, reservation_id: int, reason: str) -> ReservationView | None:
        """Release a reservation WITHOUT a detach: an operator fixed the hardware by hand.

        The reason is journalled as ``last_error`` (``forgotten by an administrator: ...``);
        the device's holder in the inventory is left as the fabric last showed it (the next
        sync reads it again).

        Returns:
            The released reservation, or None when it was in none of :data:`FORGET_FROM`.

        Raises:
            ValueError: an empty reason.
        """
        if not reason.strip():
            raise ValueError("a reason is required to forget a reservation")
        return await self.transition(
            reservation_id,
            FORGET_FROM,
            RELEASED,
            clear_operation=True,
            error=f"forgotten by an administrator (released without a detach): {reason}",
        )

    async def _transition(
        self,
        reservation_id: int,
        expected: Collection[str],
        state: str,
        change: _Change,
        *,
        with_device: bool,
        device_required: bool = True,
    ) -> tuple[ReservationView, FabricDevice | None] | None:
        if state not in STATES or not set(expected) <= set(STATES):
            raise ValueError(f"unknown reservation state in {state!r} / {sorted(expected)}")
        try:
            moved = await self._move(
                reservation_id,
                expected,
                state,
                change,
                with_device=with_device,
                device_required=device_required,
            )
        except UnknownDevice:
            raise  # rolled back
        except BaseException:
            self.feed.reset()
            raise
        if moved is not None and state == RELEASED and moved[0].exclusive:
            self.feed.release(moved[0])
        return moved

    async def _move(
        self,
        reservation_id: int,
        expected: Collection[str],
        state: str,
        change: _Change,
        *,
        with_device: bool,
        device_required: bool,
    ) -> tuple[ReservationView, FabricDevice | None] | None:
        error = change.error
        expected_key = tuple(sorted(expected))

        def values(now: dt.datetime) -> dict[str, Any]:
            return {
                "b_id": reservation_id,
                "b_state": state,
                "b_error": error[:MAX_ERROR_LENGTH] if error else None,
                "b_attempt": 1 if change.count_attempt else 0,
                "b_node": change.node,
                "b_host_id": change.host_id,
                "b_operation_id": change.operation_id,
                "b_now": now,
                "b_clear_operation": change.clear_operation,
                "b_attached_at": now if state == ATTACHED else None,
                "b_released_at": now if state == RELEASED else None,
            }

        device_change = (
            DEVICE_ON
            if state == ATTACHED
            else DEVICE_OFF
            if state == RELEASED and change.detached
            else None
        )
        if self._one_statement and not (with_device and device_change):
            statement = _move_one_statement(
                expected_key,
                _SAME_PHASE[state],
                device_change,
                with_device,
                with_device and device_required,
            )

            rows = await self.db.fetch(statement, values(self.clock()), writes=True)
            if rows:
                row = rows[0]
                view = _view(row[:_RESERVATION_WIDTH])
                device = row[_RESERVATION_WIDTH:]
                if not with_device or device[0] is None:
                    return view, None
                return view, _fabric_device_from(device[1:])
            if not (with_device and device_required):
                return None
            # Nothing moved: the reservation was in another state, or its device row is gone;
            # the transaction below tells which (UnknownDevice for the second).

        def work(conn: Connection) -> tuple[ReservationView, FabricDevice | None] | None:
            # Taken inside the transaction, so journal times follow commit order.
            row = conn.execute(
                _move_statement(expected_key, _SAME_PHASE[state]), values(self.clock())
            ).first()
            if row is None:
                return None
            view = _view(row)
            if view.host_id is not None and device_change is not None:
                conn.execute(
                    _DEVICE_NOW_ON if device_change == DEVICE_ON else _DEVICE_NOW_OFF,
                    {"b_device_id": view.device_id, "b_device_host": view.host_id},
                )
            if not with_device:
                return view, None
            device = conn.execute(_FABRIC_DEVICE, {"b_device_id": view.device_id}).first()
            if device is None and device_required:
                # Raising rolls the transition back.
                raise UnknownDevice(f"device {view.device_name} is not in the inventory")
            return view, _fabric_device_from(device) if device is not None else None

        return await self.db.run_write(work, brief=True)

    async def get(self, reservation_id: int) -> ReservationView | None:
        """One reservation by id."""
        row = await self.db.run_read(
            lambda conn: conn.execute(
                select(*_COLUMNS).where(_TABLE.c.id == reservation_id)
            ).first(),
            brief=True,
        )
        return _view(row) if row is not None else None

    async def for_claim(self, claim_uid: str, *, active_only: bool = True) -> list[ReservationView]:
        """The reservations of one claim, oldest first."""
        query = _FOR_CLAIM_ACTIVE if active_only else _FOR_CLAIM
        return [_view(row) for row in await self.db.fetch(query, {"b_uid": claim_uid})]

    async def active(
        self, states: Collection[str] = ACTIVE_RESERVATION_STATES
    ) -> list[ReservationView]:
        """Every reservation in one of ``states`` (default: every active one), by id."""
        query = select(*_COLUMNS).where(_TABLE.c.state.in_(tuple(states))).order_by(_TABLE.c.id)
        return await self.db.run_read(lambda conn: [_view(r) for r in conn.execute(query)])

    async def held(self) -> list[HeldDevice]:
        """The devices held by active exclusive reservations (any mode), by reservation id:
        what allocation must leave alone. Lighter than :meth:`active`."""
        return await self.db.run_read(
            lambda conn: [HeldDevice(*row) for row in conn.execute(_HELD)]
        )

    async def count_active(self) -> int:
        """How many reservations are active (not released)."""
        query = select(func.count()).select_from(_TABLE).where(_TABLE.c.state.in_(_ACTIVE))
        return int(await self.db.run_read(lambda conn: conn.execute(query).scalar_one()))

    async def recent(self, limit: int = 100, offset: int = 0) -> list[ReservationView]:
        """The newest reservations first (released ones included), for the admin API."""
        query = select(*_COLUMNS).order_by(_TABLE.c.id.desc()).limit(limit).offset(offset)
        return await self.db.run_read(lambda conn: [_view(r) for r in conn.execute(query)])

    async def fabric_device(self, reservation: ReservationView) -> FabricDevice:
        """The fabric's view of the reserved device, enough for attach and detach calls.

        Raises:
            UnknownDevice: the device row is gone.
        """
        row = await self.db.run_read(
            lambda conn: conn.execute(
                _FABRIC_DEVICE, {"b_device_id": reservation.device_id}
            ).first(),
            brief=True,
        )
        if row is None:
            raise UnknownDevice(f"device {reservation.device_name} is not in the inventory")
        return _fabric_device_from(row)

    async def fabric_device_by_name(self, name: str) -> FabricDevice:
        """The fabric's view of the device named ``name`` (present or removed).

        Raises:
            UnknownDevice: no device has that name.
        """
        query = select(*_FABRIC_COLUMNS).where(_DEVICES.c.name == name).limit(1)
        row = await self.db.run_read(lambda conn: conn.execute(query).first(), brief=True)
        if row is None:
            raise UnknownDevice(f"device {name} is not in the inventory")
        return _fabric_device_from(row)


def _fabric_device_from(row: Any) -> FabricDevice:
    """A FabricDevice from the ``_FABRIC_COLUMNS`` values, in that order."""
    (
        vendor_id,
        attach_unit,
        device_type,
        uuid,
        host_id,
        shareable,
        vendor_name,
        serial,
        slot,
        attributes,
        manager,
    ) = row
    return FabricDevice(
        vendor_id=vendor_id,
        attach_unit=attach_unit,
        device_type=DeviceType(device_type),
        uuid=uuid,
        serial=serial,
        attributes=attributes if isinstance(attributes, dict) else {},
        location=Location(slot=slot, manager=manager),
        host_id=host_id,
        shareable=bool(shareable),
        name=vendor_name,
    )


__all__ = [
    "ATTACHED",
    "ATTACHING",
    "DETACHING",
    "DETACH_FAILED",
    "FAILED",
    "FORGET_FROM",
    "MAX_ERROR_LENGTH",
    "PENDING",
    "RELEASED",
    "STATES",
    "ClaimRef",
    "DeviceHeld",
    "HeldDevice",
    "Journal",
    "ReservationView",
    "UnknownDevice",
    "WrongManager",
]
