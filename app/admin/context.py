"""What the admin HTTP app needs from the running service, as one injected object.

The service (``app.service``) builds an :class:`AdminContext` from its live components; tests
build one from fakes and a real database. The admin app never reaches into globals.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from app.admin.history import History
from app.db.engine import Database
from app.pools import PoolConfig


@dataclass(frozen=True, slots=True)
class Check:
    """One readiness or health check: a name, whether it passes, and a one-line message."""

    name: str
    ok: bool
    message: str = ""


class AdminActions(Protocol):
    """Writes an operator may ask for. Each raises ``LookupError`` for an unknown device or
    reservation and ``ValueError`` for a request that cannot be done (e.g. releasing a released
    reservation); messages are meant for the HTTP error body."""

    async def cordon(self, device: str, reason: str) -> Mapping[str, Any]:
        """Take a device out of the slices (it stays in the inventory). Returns the device."""
        ...

    async def uncordon(self, device: str) -> Mapping[str, Any]:
        """Offer a cordoned device again. Returns the device."""
        ...

    async def force_release(self, reservation_id: int) -> Mapping[str, Any]:
        """Detach (best effort) and release a reservation, as the controllers release
        (``detach-failed`` when the fabric refuses). Returns the reservation."""
        ...

    async def forget(self, reservation_id: int, reason: str) -> Mapping[str, Any]:
        """Release a reservation WITHOUT a detach (the hardware was fixed by hand); the
        reason is journalled. Returns the reservation."""
        ...


@dataclass
class AdminContext:
    """Everything the admin app reads or calls.

    Attributes:
        db: the database (inventory, pools, reservations are read from it).
        registry: the Prometheus registry served at ``/metrics``.
        health: liveness checks (``/healthz`` fails when one fails: a dead task, say).
        readiness: readiness checks (``/readyz``): database reachable, caches synced, leader
            state known.
        status: a JSON-ready summary of the live components: ``{"leader": {...},
            "inventory": {...}, "publisher": {...}, "claims": {...}, "mode": "..."}``.
        claim_view: ``(namespace, name) -> {"claim": <cached claim or None>, "errors": [...]}``
            from the live claim reconciler, or None when it is not running.
        publisher_status: per-pool publishing status ``{pool: {...}}``, or None.
        what_if: ``claim spec (v1 JSON) -> answer`` from the allocator, or None.
        actions: see :class:`AdminActions`.
        token: the bearer token for admin actions (None: actions answer 403 to everyone).
        require_token_for_reads: the read-only API needs the token too.
        max_request_bytes: the largest accepted request body.
        driver_name: our DRA driver.
        pool_config: how devices are grouped into pools (default: the defaults for the driver).
        history: the recent past the dashboard charts (see :mod:`app.admin.history`), or None
            for no charts.
    """

    db: Database
    registry: CollectorRegistry
    health: Callable[[], list[Check]]
    readiness: Callable[[], Awaitable[list[Check]]]
    status: Callable[[], Awaitable[dict[str, Any]]]
    actions: AdminActions
    driver_name: str
    claim_view: Callable[[str, str], Awaitable[dict[str, Any] | None]] | None = None
    publisher_status: Callable[[], dict[str, Any]] | None = None
    what_if: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None
    token: SecretStr | None = None
    require_token_for_reads: bool = False
    max_request_bytes: int = 64 * 1024
    pool_config: PoolConfig | None = None
    history: History | None = None
    extra: dict[str, Any] = field(default_factory=dict)
