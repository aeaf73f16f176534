"""The Redfish fabric backend: inventory and attach/detach through a Redfish CompositionService.

:class:`RedfishBackend` is the :class:`~app.fabric.backend.FabricBackend` the rest of the
program sees; it wires the parts of :mod:`app.fabric.redfish` together and hands each call to
the one that owns it: listings to :class:`~app.fabric.redfish.listing.RedfishInventory`,
attach, detach and resume to :class:`~app.fabric.redfish.composition.Composer`, task monitors
to :class:`~app.fabric.redfish.task_monitor.TaskMonitor`, and HTTP to
:class:`~app.fabric.redfish.transport.RedfishTransport`.

Errors beyond :mod:`app.fabric.errors`:
:class:`~app.fabric.redfish.task_monitor.FabricTaskTimeout` (a FabricTimeout carrying the task
monitor URI as ``op_id``). Listings also raise FabricInvalidData when the service root or a
collection page is malformed.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp

from app.fabric.events import FabricEvent
from app.fabric.redfish.composition import Composer
from app.fabric.redfish.event_stream import read_events
from app.fabric.redfish.listing import RedfishInventory
from app.fabric.redfish.parse.identity import IdentityMode
from app.fabric.redfish.reader import ResourceReader
from app.fabric.redfish.server_owned import ServerOwnedBlocks
from app.fabric.redfish.task_monitor import OnOperation, TaskMonitor
from app.fabric.redfish.transport import AuthMode, RedfishTransport, RetrySettings
from app.fabric.types import FabricDevice, FabricHost, Listing, Operation, UnitRead


class RedfishBackend:
    """A :class:`~app.fabric.backend.FabricBackend` speaking Redfish over aiohttp.

    Args:
        base_url, username, password, auth, verify_tls, ca_file, timeout_s, max_concurrency,
            session, retry: the HTTP side, as
            :class:`~app.fabric.redfish.transport.RedfishTransport` takes them (``base_url``
            an origin ``https://host[:port]``; credentials never logged; ``auth`` ``session``
            by default, its login session deleted on :meth:`close`; an injected ``session``
            is not closed).
        task_poll_interval_s: seconds between task monitor polls when the service gives no
            ``Retry-After``.
        task_timeout_s: seconds to wait for a 202 task before
            :class:`~app.fabric.redfish.task_monitor.FabricTaskTimeout`.
        server_owned_blocks: fnmatch patterns of ResourceBlock ``Id``s or URIs that belong to
            a server (setting ``fabric.server_owned_blocks``); such blocks are never devices.
        verify_poll_s: seconds between reads while a reported success is not yet visible.
        verify_timeout_s: seconds a reported success may take to become visible before
            :class:`~app.fabric.errors.FabricNotEffective`.
        device_identity: ``uri``, ``serial`` or ``uuid``: what makes two listed devices one
            (setting ``fabric.device_identity``).
        name: the fabric manager's name (setting ``fabric.name``), stored with its devices.

    Attributes:
        retries: retries by reason (``transient``, ``precondition``, ``unknown-outcome``).
        verifications: verification reads and outcomes (``read``: GETs made to verify a
            write, ``poll``: waits because it was not visible yet, ``not-effective``).

    Raises:
        ValueError: a malformed base URL, an unknown auth mode, missing credentials, an
            unreadable CA bundle, a non-positive timeout, or an unknown device identity.
    """

    kind = "redfish"

    def __init__(
        self,
        base_url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        auth: AuthMode = "session",
        verify_tls: bool = True,
        ca_file: str | Path | None = None,
        timeout_s: float = 30.0,
        max_concurrency: int = 16,
        session: aiohttp.ClientSession | None = None,
        retry: RetrySettings | None = None,
        task_poll_interval_s: float = 1.0,
        task_timeout_s: float = 300.0,
        server_owned_blocks: Sequence[str] = (),
        verify_poll_s: float = 0.2,
        verify_timeout_s: float = 10.0,
        device_identity: IdentityMode = "uri",
        name: str = "redfish",
    ) -> None:
        self.name = name
        self._transport = RedfishTransport(
            base_url,
            username=username,
            password=password,
            auth=auth,
            verify_tls=verify_tls,
            ca_file=ca_file,
            timeout_s=timeout_s,
            max_concurrency=max_concurrency,
            session=session,
            retry=retry,
        )
        if task_timeout_s <= 0:
            raise ValueError("task_timeout_s must be positive")
        if verify_poll_s <= 0 or verify_timeout_s < 0:
            raise ValueError("verify_poll_s must be positive and verify_timeout_s not negative")
        if device_identity not in ("uri", "serial", "uuid"):
            raise ValueError(f"device identity {device_identity!r} is not one of uri, serial, uuid")
        reader = self._reader = ResourceReader(self._transport)
        server_owned = ServerOwnedBlocks(server_owned_blocks)
        self._tasks = TaskMonitor(
            self._transport, poll_interval_s=task_poll_interval_s, timeout_s=task_timeout_s
        )
        self._inventory = RedfishInventory(reader, server_owned, device_identity)
        self._composer = Composer(
            self._transport,
            reader,
            server_owned,
            self._tasks,
            verify_poll_s=verify_poll_s,
            verify_timeout_s=verify_timeout_s,
        )
        self.retries: collections.Counter[str] = self._transport.retries
        self.verifications: collections.Counter[str] = self._composer.verifications

    def __repr__(self) -> str:
        return f"RedfishBackend({str(self._transport.origin)!r}, auth={self._transport.auth!r})"

    async def list_hosts(self) -> Listing[FabricHost]:
        """Every ComputerSystem as a :class:`FabricHost`.

        Location comes from the System's first ``Links.Chassis`` (rules in
        :mod:`app.fabric.redfish.parse.chassis`). A System that cannot be read or parsed is a
        Rejected entry.

        Raises:
            FabricUnavailable: the listing could not be read completely.
            FabricAuthError: credentials were refused.
            FabricInvalidData: the service root or a collection page is malformed.
        """
        return await self._inventory.list_hosts()

    async def list_devices(self) -> Listing[FabricDevice]:
        """Every composable device, with location, health, holder and shareability.

        A block, device, storage or chassis that cannot be read (404, 500 twice, malformed
        JSON) or parsed becomes a Rejected entry for the devices it concerns; the rest still
        lists. Server-owned blocks give no devices and are listed in ``local_units`` (their
        count is logged at debug). Systems are read too, to find holders that only the
        System records; a System that cannot be parsed is reported by :meth:`list_hosts`,
        not here.

        Raises:
            FabricUnavailable: any collection page, a System, or a needed resource could not
                be read after retries (never a partial listing).
            FabricAuthError: credentials were refused.
            FabricInvalidData: the service root or a collection page is malformed.
        """
        return await self._inventory.list_devices()

    async def read_unit(self, unit: str) -> UnitRead | None:
        """Read one ResourceBlock and its devices again, on their own (after an event about
        it), with the same parsing, validation and rejections as :meth:`list_devices`.

        Returns:
            A :class:`UnitRead` (``gone`` when the service answers 404), or None when
            ``unit`` is not a ResourceBlock, or the block does not say who holds it
            (``Links.ComputerSystems``): then only a full listing can tell.

        Raises:
            FabricError: the block could not be read (other than 404).
        """
        return await self._inventory.read_unit(unit)

    async def read_host_units(self, host: str) -> tuple[str, tuple[str, ...]] | None:
        """Read one ComputerSystem again (after an event about it): its host id and the
        attach units (ResourceBlocks) it holds now, or None when ``host`` is not a System.

        Raises:
            FabricError: the System could not be read.
        """
        return await self._inventory.read_host_units(host)

    def events(
        self, *, last_event_id: str | None, idle_timeout_s: float
    ) -> AsyncIterator[FabricEvent | ValueError]:
        """The service's changes as they happen, from its server-sent event stream (see
        :mod:`app.fabric.redfish.event_stream`); a ``ValueError`` item stands for a message
        that could not be read. Ends when the service ends the stream.

        Raises:
            FabricEventsUnsupported: the service offers no event stream.
            FabricError: the stream could not be opened, or broke.
        """
        return read_events(self._reader, last_event_id=last_event_id, idle_timeout_s=idle_timeout_s)

    async def attach(
        self, device: FabricDevice, host_id: str, *, on_operation: OnOperation | None = None
    ) -> Operation:
        """Attach ``device.attach_unit`` (a ResourceBlock URI) to System ``host_id``.

        Already held by ``host_id``: success with no write. Held by another System and not
        shareable: FabricConflict. A 202 answer (or a 200 carrying a running Task) is
        followed to completion; its task monitor URI is first awaited in
        ``on_operation(monitor)``, before the first poll, so that the caller can journal it
        and :meth:`resume` after a restart. A write that reports success is verified by
        reading the System back (one GET; more only while the change is not visible yet).

        Returns:
            COMPLETED, with the task monitor as ``op_id`` when the service ran a task.

        Raises:
            FabricServerOwned: the block is a server's own (nothing is sent).
            FabricNotFound: unknown block or host (HTTP 404 / ResourceNotFound).
            FabricConflict: held by another host, or HTTP 409 / ResourceInUse.
            FabricPreconditionFailed: the System's ETag changed twice in a row (HTTP 412).
            FabricNotEffective: the service reported success, but the System does not hold
                the block after ``verify_timeout_s`` (retryable).
            FabricTaskTimeout: the task did not finish in time or its monitor stopped
                answering (``op_id`` is the monitor).
            FabricTimeout: the outcome stayed unknown after repeated re-reads.
            FabricUnavailable: the service could not be reached.
            FabricError: the service refused (400/405/406/501 are permanent), or the task
                failed (its TaskState in the message). Whatever ``on_operation`` raises
                propagates (the task may then still run: :meth:`resume` it).
        """
        return await self._composer.attach(device, host_id, on_operation=on_operation)

    async def detach(
        self, device: FabricDevice, host_id: str, *, on_operation: OnOperation | None = None
    ) -> Operation:
        """Detach ``device.attach_unit`` from System ``host_id``.

        Not held by ``host_id`` (free, or held by another System only): success with no
        write. A PATCH keeps every other block the System holds. Otherwise as
        :meth:`attach` (FabricNotEffective when the System still holds the block after
        ``verify_timeout_s``).
        """
        return await self._composer.detach(device, host_id, on_operation=on_operation)

    async def resume(
        self,
        op_id: str,
        device: FabricDevice,
        host_id: str,
        *,
        attach: bool,
        on_operation: OnOperation | None = None,
    ) -> Operation:
        """Finish an attach (``attach=True``) or detach whose task monitor ``op_id`` was
        handed to ``on_operation`` before, e.g. by a process that has since restarted.

        * The monitor says the task runs (202, or a Task body in a running TaskState, with
          200 or 202): it is polled until it ends; nothing is sent meanwhile.
        * The task completed: the change is verified as :meth:`attach` does.
        * The monitor is gone (404/410), or the task ended in failure (TaskState Exception,
          Killed, Cancelled; an error status): the state is read. If the wanted state holds,
          COMPLETED; if not, the task ended without effect, so the change is made as
          :meth:`attach` / :meth:`detach` would (a new task monitor goes to
          ``on_operation``).

        Returns:
            COMPLETED, with ``op_id`` (or the new monitor when the change was sent again).

        Raises:
            FabricInvalidData: ``op_id`` is not on this service.
            FabricTaskTimeout: the task still runs after the task timeout, or its monitor
                cannot be read (``op_id`` is the monitor).
            Otherwise as :meth:`attach`.
        """
        return await self._composer.resume(
            op_id, device, host_id, attach=attach, on_operation=on_operation
        )

    async def operation_status(self, op_id: str) -> Operation:
        """The state of a task monitor or Task URI returned earlier.

        Returns:
            RUNNING while the monitor answers 202 (or the Task runs), COMPLETED when done,
            FAILED with the service's message when the operation ended in an error.

        Raises:
            FabricNotFound: the monitor or task does not exist (any more).
            FabricUnavailable, FabricAuthError: the service could not be asked.
            FabricInvalidData: ``op_id`` is not on this service, or the answer is malformed.
        """
        return await self._tasks.status(op_id)

    async def close(self) -> None:
        """Delete the login session (best effort) and close the owned HTTP session.

        Safe to call twice.
        """
        await self._transport.close()
