"""The in-memory feed of held devices that this process's journal writes fill (pure, no I/O).

Readers (the control-plane snapshot, the claim reconciler's release waiters) keep their copy of
the held devices current from it instead of reading every reservation after each change; see
:class:`HeldFeed`. The journal (:mod:`app.journal`) writes to it after each commit.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from app.reservations import HeldDevice, ReservationView

log = logging.getLogger(__name__)


class HeldFeed:
    """What this process's journal writes changed in the set of held devices (active
    exclusive reservations), so that a reader can keep a copy current without reading every
    reservation again after each change.

    ``version`` grows by one per entry. :meth:`since` gives the entries after a version a
    reader saw, or None when some were dropped (at most ``max_entries`` are kept) or a write
    ended in an error that leaves the outcome unknown (:meth:`reset`): then the reader reads
    :meth:`app.journal.Journal.held` again. Other processes' writes are not in the feed:
    readers also read again after a while.

    Release listeners (:meth:`add_release_listener`) are called at once, after the commit,
    with the device of each release, or with None when a write's outcome is unknown (anything
    may have been released); whatever mode's journal wrote it.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self.version = 0
        self._entries: deque[tuple[int, bool, HeldDevice | None]] = deque(maxlen=max_entries)
        self._release_listeners: list[Callable[[HeldDevice | None], None]] = []

    def hold(self, reservation: ReservationView) -> None:
        """A new active exclusive reservation was committed."""
        self._add(True, _held(reservation))

    def release(self, reservation: ReservationView) -> None:
        """An exclusive reservation was committed as released."""
        device = _held(reservation)
        self._add(False, device)
        self._released(device)

    def reset(self) -> None:
        """A write's outcome is unknown: readers must read everything again."""
        self._add(False, None)
        self._released(None)

    def add_release_listener(self, listener: Callable[[HeldDevice | None], None]) -> None:
        """Call ``listener`` after each committed release (see the class); it must not block."""
        self._release_listeners.append(listener)

    def remove_release_listener(self, listener: Callable[[HeldDevice | None], None]) -> None:
        """Stop calling ``listener``; a no-op when it is not registered."""
        if listener in self._release_listeners:
            self._release_listeners.remove(listener)

    def _released(self, device: HeldDevice | None) -> None:
        for listener in list(self._release_listeners):
            try:
                listener(device)
            except Exception:  # a listener must never undo a committed write
                log.exception("held-device release listener %r failed", listener)

    def _add(self, held: bool, device: HeldDevice | None) -> None:
        self.version += 1
        self._entries.append((self.version, held, device))

    def since(self, version: int) -> list[tuple[bool, HeldDevice]] | None:
        """(held?, device) for each entry after ``version``, oldest first; None when the
        reader must read everything again."""
        if version == self.version:
            return []
        entries = self._entries
        if not entries or entries[0][0] > version + 1 or version > self.version:
            return None
        # Versions are consecutive, so the entries after ``version`` are the last
        # ``self.version - version``: only those are looked at (a full feed holds
        # ``max_entries``, and a reader asks after every change).
        out: list[tuple[bool, HeldDevice]] = []
        for index in range(len(entries) - (self.version - version), len(entries)):
            _, held, device = entries[index]
            if device is None:
                return None
            out.append((held, device))
        return out


def _held(reservation: ReservationView) -> HeldDevice:
    return HeldDevice(reservation.claim.uid, reservation.pool, reservation.device_name)
