"""What an allocation attempt returns: the allocations, or why none exists.

A failure names the first thing a person has to change: the claim and request, the device class,
the expression that failed, the constraint that cannot hold, and the counts behind a shortage
(how many devices the node can reach, how many passed the selectors, how many are in use or
tainted), plus the pools that were skipped because they are incomplete or invalid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

INVALID_CLAIM = "InvalidClaim"
CLASS_NOT_FOUND = "DeviceClassNotFound"
SELECTOR_INVALID = "SelectorInvalid"
SELECTOR_FAILED = "SelectorFailed"
NOT_ENOUGH_DEVICES = "NotEnoughDevices"
POOLS_NOT_READY = "PoolsNotReady"
DEVICES_NOT_FREE = "DevicesNotFree"
DEVICES_TAINTED = "DevicesTainted"
CONSTRAINT_FAILED = "ConstraintFailed"
DEVICES_CONTENDED = "DevicesContended"
SEARCH_LIMIT = "SearchLimit"
TOO_MANY_DEVICES = "TooManyDevices"


@dataclass(frozen=True, slots=True)
class RequestReport:
    """How one request (or ``firstAvailable`` subrequest) fared on the node.

    Attributes:
        claim: ``namespace/name``.
        request: ``req`` or ``req/sub``.
        device_class: the class it names.
        allocation_mode: ``ExactCount`` or ``All``.
        needed: devices needed (``count``; for ``All`` the number matched, at least 1).
        considered: devices in complete, valid pools that reach the node.
        matched: of those, devices that pass the class and request selectors.
        in_use: of the matched, devices already allocated (0 with admin access).
        tainted: of the matched and free, devices with a taint the request does not tolerate
            (for ``All`` one of them blocks the request).
        available: matched devices that are free and untainted.
        pools: ``driver/pool`` of the pools holding available devices.
        blocked: for ``All``, why it cannot be satisfied whatever else happens, or None.
    """

    claim: str
    request: str
    device_class: str
    allocation_mode: str
    needed: int
    considered: int
    matched: int
    in_use: int
    tainted: int
    available: int
    pools: tuple[str, ...] = ()
    blocked: str | None = None

    def summary(self) -> str:
        """One line with the counts."""
        return (
            f"request {self.request!r} (class {self.device_class!r}, "
            f"{self.allocation_mode} {self.needed}): {self.considered} devices reachable, "
            f"{self.matched} matched the selectors, {self.in_use} in use, "
            f"{self.tainted} tainted, {self.available} available"
        )


@dataclass(frozen=True, slots=True)
class Failure:
    """Why no allocation exists.

    Attributes:
        reason: one of the constants of this module.
        message: a sentence for people (logs, events, the admin API).
        claim, request, device_class, expression, device, constraint: what it is about, when
            known (``constraint`` is the attribute name of a matchAttribute or
            distinctAttribute constraint).
        requests: the reports of the requests looked at.
        incomplete_pools, invalid_pools: ``driver/pool`` of pools reaching the node that were
            skipped (invalid ones followed by the reason in parentheses); a shortage's
            ``message`` names them too.
    """

    reason: str
    message: str
    claim: str | None = None
    request: str | None = None
    device_class: str | None = None
    expression: str | None = None
    device: str | None = None
    constraint: str | None = None
    requests: tuple[RequestReport, ...] = ()
    incomplete_pools: tuple[str, ...] = ()
    invalid_pools: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    """The answer for the claims of one pod on one node.

    Attributes:
        allocations: claim uid (or ``namespace/name`` when it has none) -> its
            ``status.allocation`` JSON; empty on failure.
        failure: None on success.
        reports: the request reports of the search (also on success).
    """

    allocations: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    failure: Failure | None = None
    reports: tuple[RequestReport, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every claim got an allocation."""
        return self.failure is None
