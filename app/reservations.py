"""Reservations as plain values: the journal's states and the value types its rows become.

The reservation journal (:mod:`app.journal`) reads and writes them; the pure planners
(:mod:`app.claims.plan`, :mod:`app.controlplane.plan`, :mod:`app.claims.drift`) decide on them.
This module imports no I/O library (DESIGN.md, "Dependencies point one way"), so that a planner
can use the values without pulling in the database layer; :mod:`app.journal` exposes the same
names.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

PENDING = "pending"
ATTACHING = "attaching"
ATTACHED = "attached"
DETACHING = "detaching"
RELEASED = "released"
FAILED = "failed"
DETACH_FAILED = "detach-failed"
STATES = (PENDING, ATTACHING, ATTACHED, DETACHING, RELEASED, FAILED, DETACH_FAILED)
FORGET_FROM = (DETACHING, FAILED, DETACH_FAILED)
"""States an operator may *forget* (release without a detach, the hardware fixed by hand): a
detach that failed for good or keeps failing, and a failed attach. Never ``attaching`` or
``attached``: a live claim's pod may be using the device (release those instead)."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A ResourceClaim's identity."""

    uid: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class HeldDevice:
    """A device an active exclusive reservation holds: the claim's uid, pool and device."""

    claim_uid: str
    pool: str
    device_name: str


@dataclass(frozen=True, slots=True)
class ReservationView:
    """One journal row as a plain value (see :class:`app.db.models.Reservation`)."""

    id: int
    claim: ClaimRef
    request: str
    mode: str
    device_id: int
    device_name: str
    pool: str
    exclusive: bool
    node: str | None
    host_id: str | None
    state: str
    attempts: int
    last_error: str | None
    operation_id: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    attached_at: dt.datetime | None
    released_at: dt.datetime | None

    @property
    def active(self) -> bool:
        """True unless released."""
        return self.state != RELEASED

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601 in UTC)."""
        data: dict[str, Any] = {k: getattr(self, k) for k in self.__slots__ if k != "claim"}
        data["claim"] = {
            "uid": self.claim.uid,
            "namespace": self.claim.namespace,
            "name": self.claim.name,
        }
        for key in ("created_at", "updated_at", "attached_at", "released_at"):
            data[key] = data[key].isoformat() if data[key] else None
        return data


__all__ = [
    "ATTACHED",
    "ATTACHING",
    "DETACHING",
    "DETACH_FAILED",
    "FAILED",
    "FORGET_FROM",
    "PENDING",
    "RELEASED",
    "STATES",
    "ClaimRef",
    "HeldDevice",
    "ReservationView",
]
