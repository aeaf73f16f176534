"""Several fabric managers seen as one backend: every device goes to the manager that owns it.

One controller may inventory several fabric managers (one per hall, say). Each has a name
(setting ``fabrics[].name``, stored as ``devices.backend``), and a device's
``location.manager`` says which one reports it. :class:`FabricFleet` implements the
:class:`app.fabric.backend.FabricBackend` contract over them:

* ``attach``, ``detach`` and ``resume`` go to the device's manager. A device without a
  manager goes to the only manager when there is one, and is refused otherwise: guessing
  would send a change to a fabric that does not hold the device.
* ``list_devices`` and ``list_hosts`` read every manager, and raise when any of them fails
  (the contract: a complete listing or none). Devices come back with ``location.manager``
  set. The inventory reads each manager on its own (:class:`app.inventory.sync.InventorySync`),
  so that one manager being down marks only its devices stale.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from app.fabric.backend import FabricBackend
from app.fabric.errors import FabricError, FabricNotFound
from app.fabric.types import FabricDevice, FabricHost, Listing, Operation


class UnknownManager(FabricNotFound):
    """A device names a fabric manager that is not configured (or names none among several)."""


def with_manager(device: FabricDevice, manager: str) -> FabricDevice:
    """``device`` with ``location.manager`` set to ``manager``."""
    if device.location.manager == manager:
        return device
    return dataclasses.replace(
        device, location=dataclasses.replace(device.location, manager=manager)
    )


class FabricFleet:
    """Named fabric backends behind one :class:`FabricBackend`.

    Args:
        backends: manager name -> backend, at least one; each backend's ``name`` should be
            its key (the database stores it with every device).

    Raises:
        ValueError: ``backends`` is empty.
    """

    kind = "fleet"

    def __init__(self, backends: Mapping[str, FabricBackend]) -> None:
        if not backends:
            raise ValueError("a fleet needs at least one fabric backend")
        self.backends: dict[str, FabricBackend] = dict(backends)
        self.name = next(iter(self.backends)) if len(self.backends) == 1 else "fleet"

    def __repr__(self) -> str:
        return f"FabricFleet({', '.join(f'{k}={v!r}' for k, v in self.backends.items())})"

    @property
    def names(self) -> tuple[str, ...]:
        """The managers' names, in configuration order."""
        return tuple(self.backends)

    @property
    def retries(self) -> collections.Counter[str]:
        """Retries of every manager together, by reason."""
        total: collections.Counter[str] = collections.Counter()
        for backend in self.backends.values():
            total.update(getattr(backend, "retries", None) or {})
        return total

    def get(self, manager: str) -> FabricBackend:
        """The backend of ``manager``.

        Raises:
            UnknownManager: no manager of that name is configured.
        """
        found = self.backends.get(manager)
        if found is None:
            raise UnknownManager(
                f"fabric manager {manager!r} is not configured (configured: "
                f"{', '.join(self.backends)})"
            )
        return found

    def owner(self, device: FabricDevice) -> FabricBackend:
        """The backend that owns ``device`` (its ``location.manager``).

        Raises:
            UnknownManager: the device names an unknown manager, or none while several are
                configured.
        """
        manager = device.location.manager
        if manager is None:
            if len(self.backends) == 1:
                return next(iter(self.backends.values()))
            raise UnknownManager(
                f"device {device.vendor_id} names no fabric manager, and several are configured"
            )
        return self.get(manager)

    async def _every(self, read: Callable[[str, FabricBackend], Awaitable[Listing[Any]]]) -> Any:
        listings = await asyncio.gather(*(read(n, b) for n, b in self.backends.items()))
        items: list[Any] = []
        rejected: list[Any] = []
        for listing in listings:
            items.extend(listing.items)
            rejected.extend(listing.rejected)
        return Listing(tuple(items), tuple(rejected))

    async def list_hosts(self) -> Listing[FabricHost]:
        """Every manager's hosts, one listing. Raises as the first failing manager does."""
        return await self._every(lambda _name, backend: backend.list_hosts())  # type: ignore[no-any-return]

    async def list_devices(self) -> Listing[FabricDevice]:
        """Every manager's devices with ``location.manager`` set, one listing. Raises as the
        first failing manager does."""

        async def read(name: str, backend: FabricBackend) -> Listing[FabricDevice]:
            listing = await backend.list_devices()
            return Listing(
                tuple(with_manager(d, name) for d in listing.items), tuple(listing.rejected)
            )

        return await self._every(read)  # type: ignore[no-any-return]

    async def attach(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        on_operation: Callable[[str], Awaitable[None]] | None = None,
    ) -> Operation:
        """Attach through the device's manager (see :meth:`FabricBackend.attach`)."""
        return await self.owner(device).attach(device, host_id, on_operation=on_operation)

    async def detach(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        on_operation: Callable[[str], Awaitable[None]] | None = None,
    ) -> Operation:
        """Detach through the device's manager (see :meth:`FabricBackend.detach`)."""
        return await self.owner(device).detach(device, host_id, on_operation=on_operation)

    async def resume(
        self, op_id: str, device: FabricDevice, host_id: str, *, attach: bool
    ) -> Operation:
        """Finish an operation through the device's manager (:meth:`FabricBackend.resume`)."""
        return await self.owner(device).resume(op_id, device, host_id, attach=attach)

    async def operation_status(self, op_id: str) -> Operation:
        """Ask each manager in turn; the first that knows ``op_id`` answers.

        Raises:
            FabricNotFound: no manager knows it.
        """
        for backend in self.backends.values():
            try:
                return await backend.operation_status(op_id)
            except FabricNotFound:
                continue
        raise FabricNotFound(f"no fabric manager knows operation {op_id}")

    async def close(self) -> None:
        """Close every manager's backend, all at once (a slow logout holds up none of the
        others; each is safe to close twice).

        Raises:
            FabricError, OSError: the first of the closes that failed (the others are closed).
        """
        results = await asyncio.gather(
            *(backend.close() for backend in self.backends.values()), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        for error in errors:
            if not isinstance(error, (FabricError, OSError)):
                raise error
        if errors:
            raise errors[0]


def fleet_of(backends: Iterable[FabricBackend]) -> FabricFleet:
    """A fleet of ``backends``, keyed by each one's ``name``."""
    return FabricFleet({b.name: b for b in backends})


def member(backend: FabricBackend, manager: str | None) -> FabricBackend:
    """The backend of ``manager`` when ``backend`` is a fleet, else ``backend`` itself (one
    manager; ``manager`` is not checked).

    Raises:
        UnknownManager: a fleet has no such manager, or several and ``manager`` is None.
    """
    if not isinstance(backend, FabricFleet):
        return backend
    if manager is None:
        if len(backend.backends) == 1:
            return next(iter(backend.backends.values()))
        raise UnknownManager("no fabric manager named, and several are configured")
    return backend.get(manager)
