"""The interface every fabric backend implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from app.fabric.types import FabricDevice, FabricHost, Listing, Operation


@runtime_checkable
class FabricBackend(Protocol):
    """A fabric manager, seen as hosts, devices and attach/detach operations.

    Contract:
        * ``list_hosts`` and ``list_devices`` return a complete :class:`Listing` or raise;
          they never return a partial view.
        * ``attach`` and ``detach`` are idempotent: repeating one that already holds (the
          device is already attached to that host, or already free of it) succeeds.
        * Errors are :class:`app.fabric.errors.FabricError` subclasses.
    """

    kind: str
    """Short backend name (``redfish``), stored with every device."""

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

    async def attach(self, device: FabricDevice, host_id: str) -> Operation:
        """Attach ``device`` (its attach unit) to host ``host_id``; wait for completion.

        Raises:
            FabricNotFound: the device or host is unknown.
            FabricConflict: the device is attached to another host.
            FabricPreconditionFailed: the state changed between read and write.
            FabricTimeout: the operation did not finish in time (ask ``operation_status``).
        """
        ...

    async def detach(self, device: FabricDevice, host_id: str) -> Operation:
        """Detach ``device`` (its attach unit) from ``host_id``; wait for completion.

        Detaching a device that is not attached to ``host_id`` is a success.

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
