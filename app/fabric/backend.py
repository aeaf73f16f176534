"""The interface every fabric backend implements."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from app.fabric.types import FabricDevice, FabricHost, Listing, Operation


@runtime_checkable
class FabricBackend(Protocol):
    """A fabric manager, seen as hosts, devices and attach/detach operations.

    Contract:
        * ``list_hosts`` and ``list_devices`` return a complete :class:`Listing` or raise;
          they never return a partial view.
        * ``attach`` and ``detach`` are idempotent: repeating one that already holds (the
          device is already attached to that host, or already free of it) succeeds. A
          success is only returned once the fabric shows the change.
        * A long-running operation's id reaches the caller (``on_operation``) before the
          backend waits on it; ``resume`` finishes it later without sending it twice.
        * Errors are :class:`app.fabric.errors.FabricError` subclasses.
    """

    kind: str
    """Short backend kind (``redfish``)."""

    name: str
    """The fabric manager's name (setting ``fabric.name``, the kind by default), stored with
    every device as ``devices.backend``: the same vendor id on two managers is two devices."""

    async def list_hosts(self) -> Listing[FabricHost]:
        """Every host the fabric can attach devices to.

        Raises:
            FabricUnavailable: the listing could not be read completely.
            FabricAuthError: credentials were refused.
        """
        ...

    async def list_devices(self) -> Listing[FabricDevice]:
        """Every composable device, with location, health and current host.

        Raises:
            FabricUnavailable: the listing could not be read completely.
            FabricAuthError: credentials were refused.
        """
        ...

    async def attach(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        on_operation: Callable[[str], Awaitable[None]] | None = None,
    ) -> Operation:
        """Attach ``device`` (its attach unit) to host ``host_id``; wait for completion and
        check that it took effect.

        Args:
            device: the device; its ``attach_unit`` is what is attached.
            host_id: the host's ``FabricHost.host_id``.
            on_operation: awaited with the operation id (Redfish: the task monitor URI) when
                the fabric runs the change as a long-running operation, before it is first
                polled, so that the caller can journal it and :meth:`resume` after a
                restart. Not called for a synchronous change.

        Raises:
            FabricServerOwned: the unit belongs to a server and is never attached.
            FabricNotFound: the device or host is unknown.
            FabricConflict: the device is attached to another host.
            FabricPreconditionFailed: the state changed between read and write.
            FabricNotEffective: the fabric reported success but the host does not hold the
                unit (retryable).
            FabricTimeout: the operation did not finish in time (ask ``operation_status``).
        """
        ...

    async def detach(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        on_operation: Callable[[str], Awaitable[None]] | None = None,
    ) -> Operation:
        """Detach ``device`` (its attach unit) from ``host_id``; wait for completion and check
        that it took effect.

        Detaching a device that is not attached to ``host_id`` is a success.

        Raises: as :meth:`attach` (FabricNotEffective: the host still holds the unit).
        """
        ...

    async def resume(
        self, op_id: str, device: FabricDevice, host_id: str, *, attach: bool
    ) -> Operation:
        """Finish an attach (``attach=True``) or detach whose operation ``op_id`` was handed
        to ``on_operation`` earlier (by this process or one before a restart).

        While the operation runs, it is followed and nothing new is sent. When it completed,
        the change is checked as :meth:`attach` does. When it is gone or ended without
        effect, the state decides: COMPLETED if the wanted state holds, else the change is
        made as :meth:`attach` / :meth:`detach` would.

        Raises: as :meth:`attach`.
        """
        ...

    async def operation_status(self, op_id: str) -> Operation:
        """The current state of a long-running operation returned earlier.

        Raises:
            FabricNotFound: the operation is unknown (finished and forgotten, or never was).
        """
        ...

    async def close(self) -> None:
        """Release connections and log out. Safe to call twice."""
        ...
