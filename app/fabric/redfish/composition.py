"""Attach and detach: expanding an existing System with a ResourceBlock, and shrinking it.

Redfish "expandable system" composition (DSP2050): the ``ComputerSystem.AddResourceBlock`` /
``RemoveResourceBlock`` actions when the System advertises them, else ``PATCH`` of the System's
full ``Links.ResourceBlocks`` (every other block it holds kept, its own server block included)
with ``If-Match``. Both are idempotent: the current holders are read first and nothing is
written when the wanted state already holds. A server-owned block is refused
(:class:`~app.fabric.errors.FabricServerOwned`) before anything is sent. Every write that
reports success (200/204, or a task that completed) is verified: the System is read once and
must list the block (or no longer list it); if not yet, the block's ``Links.ComputerSystems``
is read too, and both are polled every ``verify_poll_s`` up to ``verify_timeout_s``, then
:class:`~app.fabric.errors.FabricNotEffective`. A 202 is followed by
:class:`~app.fabric.redfish.task_monitor.TaskMonitor`.

ETags: ``If-Match`` carries the System's ``@odata.etag``, else its ``ETag`` header, quoting
repaired (:func:`app.fabric.redfish.parse.headers.preferred_etag`). After a 412 the System is
read again; if its ETag did not change, the service refused its own tag (a spelling it compares
differently), and the write is sent once more without ``If-Match`` instead of looping.

A write whose outcome is unknown (timeout, dropped connection, another 5xx, a task monitor that
vanished) is never resent blindly: the state is read again and the write is made again only if
it has not taken effect, at most ``RetrySettings.attempts`` times.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from urllib.parse import quote

from app.fabric.errors import (
    FabricConflict,
    FabricInvalidData,
    FabricNotEffective,
    FabricNotFound,
    FabricPreconditionFailed,
    FabricServerOwned,
    FabricTimeout,
    FabricUnavailable,
)
from app.fabric.redfish.parse.blocks import BlockInfo, block_hosts, parse_block
from app.fabric.redfish.parse.common import BadItem, norm_uri
from app.fabric.redfish.parse.headers import parse_retry_after, preferred_etag
from app.fabric.redfish.parse.systems import SystemInfo, parse_system
from app.fabric.redfish.reader import ResourceReader
from app.fabric.redfish.server_owned import ServerOwnedBlocks
from app.fabric.redfish.task_monitor import (
    OnOperation,
    TaskMonitor,
    is_task_answer,
    task_error,
)
from app.fabric.redfish.transport import (
    RedfishTransport,
    RequestNotSent,
    Response,
    ServiceBusy,
)
from app.fabric.types import FabricDevice, Operation, OperationState

logger = logging.getLogger(__name__)


class Composer:
    """Attaches and detaches blocks on the Systems of one service.

    Args:
        transport: the service's transport (its retry settings bound the re-reads of a write
            whose outcome is unknown).
        reader: reads the service's resources.
        server_owned: what is known about server-owned blocks.
        tasks: follows task monitors.
        verify_poll_s: seconds between reads while a reported success is not yet visible.
        verify_timeout_s: seconds a reported success may take to become visible before
            :class:`~app.fabric.errors.FabricNotEffective`.

    Attributes:
        verifications: verification reads and outcomes (``read``: GETs made to verify a
            write, ``poll``: waits because it was not visible yet, ``not-effective``).
    """

    def __init__(
        self,
        transport: RedfishTransport,
        reader: ResourceReader,
        server_owned: ServerOwnedBlocks,
        tasks: TaskMonitor,
        *,
        verify_poll_s: float,
        verify_timeout_s: float,
    ) -> None:
        self._transport = transport
        self._reader = reader
        self._server_owned = server_owned
        self._tasks = tasks
        self._verify_poll_s = verify_poll_s
        self._verify_timeout_s = verify_timeout_s
        self.verifications: collections.Counter[str] = collections.Counter()

    async def _system_uri(self, host_id: str) -> str:
        systems_uri = await self._reader.root_link("Systems")
        return f"{norm_uri(systems_uri)}/{quote(host_id, safe='')}"

    async def _read_system(self, host_id: str, what: str) -> tuple[SystemInfo, str | None]:
        """The System and the ETag to send back (``@odata.etag``, else the header)."""
        uri = await self._system_uri(host_id)
        try:
            response = await self._transport.get(uri)
        except FabricNotFound as err:
            raise FabricNotFound(f"{what}: host not found: {err}", status=err.status) from err
        try:
            system = parse_system(response.body, uri)
        except BadItem as err:
            raise FabricInvalidData(f"{what}: system {uri}: {err.reason}") from err
        return system, preferred_etag(response.headers.get("ETag"), system.etag)

    async def _read_block(self, uri: str, what: str) -> BlockInfo:
        try:
            response = await self._transport.get(uri)
        except FabricNotFound as err:
            raise FabricNotFound(f"{what}: device not found: {err}", status=err.status) from err
        try:
            return parse_block(response.body, uri)
        except BadItem as err:
            raise FabricInvalidData(f"{what}: block {uri}: {err.reason}") from err

    async def _refuse_server_owned(self, block: BlockInfo, what: str) -> None:
        """Raise FabricServerOwned when ``block`` is a server's (rules in
        :mod:`app.fabric.redfish.parse.blocks`)."""
        reason = await self._server_owned.reason(block, self._reader)
        if reason is not None:
            raise FabricServerOwned(
                f"{what}: the block belongs to a server ({reason}); it is never attached or "
                "detached"
            )

    async def attach(
        self, device: FabricDevice, host_id: str, *, on_operation: OnOperation | None = None
    ) -> Operation:
        """As :meth:`app.fabric.redfish.backend.RedfishBackend.attach`."""
        return await self._change(device, host_id, attach=True, on_operation=on_operation)

    async def detach(
        self, device: FabricDevice, host_id: str, *, on_operation: OnOperation | None = None
    ) -> Operation:
        """As :meth:`app.fabric.redfish.backend.RedfishBackend.detach`."""
        return await self._change(device, host_id, attach=False, on_operation=on_operation)

    async def resume(
        self,
        op_id: str,
        device: FabricDevice,
        host_id: str,
        *,
        attach: bool,
        on_operation: OnOperation | None = None,
    ) -> Operation:
        """As :meth:`app.fabric.redfish.backend.RedfishBackend.resume`."""
        block_uri = norm_uri(self._transport.path(device.attach_unit))
        what = _what(block_uri, host_id, attach)
        monitor = self._transport.path(op_id)
        await self._refuse_server_owned(await self._read_block(block_uri, what), what)
        end = await self._tasks.follow(monitor, what, delay=None, immediately=True)
        if end is not None and end.operation.state is OperationState.COMPLETED:
            await self._verify(host_id, block_uri, attach=attach, what=what, via_block=True)
            return end.operation
        ended = "is gone" if end is None else f"ended: {end.operation.message or 'failed'}"
        system, _ = await self._read_system(host_id, what)
        block = await self._read_block(block_uri, what)
        holds = block_uri in system.resource_blocks or system.uri in block.linked_systems
        if holds == attach:
            return Operation(
                monitor, OperationState.COMPLETED, f"task {monitor} {ended}; the state holds"
            )
        logger.warning("%s: task %s %s, without effect; sending again", what, monitor, ended)
        return await self._change(device, host_id, attach=attach, on_operation=on_operation)

    async def _change(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        attach: bool,
        on_operation: OnOperation | None,
    ) -> Operation:
        block_uri = norm_uri(self._transport.path(device.attach_unit))
        what = _what(block_uri, host_id, attach)
        precondition_retries = 0
        unknown_outcomes = 0
        refused_etag: str | None = None
        while True:
            system, etag = await self._read_system(host_id, what)
            block = await self._read_block(block_uri, what)
            await self._refuse_server_owned(block, what)
            listed = block_uri in system.resource_blocks
            holds = listed or system.uri in block.linked_systems
            if attach and holds:
                return Operation(None, OperationState.COMPLETED, "already attached")
            if not attach and not holds:
                return Operation(None, OperationState.COMPLETED, "not attached")
            if attach and not block.shareable:
                others = [
                    h
                    for h in block_hosts(block, {}, {system.uri: system.host_id})
                    if h != system.host_id
                ]
                if others:
                    raise FabricConflict(f"{what}: block is attached to {', '.join(others)}")
            if refused_etag is not None and etag == refused_etag:
                # The service refused the very ETag it still reports: it compares another
                # spelling (quoted twice, header unlike @odata.etag). Nothing changed, so the
                # write goes once more without If-Match rather than into a 412 loop.
                logger.info(
                    "%s: the service refused its own ETag %s; sending without If-Match", what, etag
                )
                etag = None
            try:
                response = await self._write_change(system, etag, block_uri, attach)
            except FabricPreconditionFailed:
                if precondition_retries >= 1:
                    raise
                precondition_retries += 1
                refused_etag = etag
                self._transport.retries["precondition"] += 1
                continue
            except (RequestNotSent, ServiceBusy):
                raise
            except FabricUnavailable as err:
                # The write may or may not have happened: read the state again and decide.
                unknown_outcomes += 1
                self._transport.retries["unknown-outcome"] += 1
                if unknown_outcomes >= self._transport.retry.attempts:
                    raise FabricTimeout(
                        f"{what}: outcome unknown after {unknown_outcomes} tries: {err}"
                    ) from err
                logger.warning("%s: outcome unknown (%s); reading the state again", what, err)
                await asyncio.sleep(self._transport.backoff(unknown_outcomes))
                continue
            via_block = not attach and not listed
            if not is_task_answer(response):
                await self._verify(
                    host_id, block_uri, attach=attach, what=what, via_block=via_block
                )
                return Operation(None, OperationState.COMPLETED)
            monitor = self._tasks.monitor_of(response, what)
            if on_operation is not None:
                await on_operation(monitor)
            end = await self._tasks.follow(
                monitor, what, delay=parse_retry_after(response.headers.get("Retry-After"))
            )
            if end is not None:
                if end.operation.state is OperationState.FAILED:
                    raise end.error or task_error(end.body, what, end.operation)
                await self._verify(
                    host_id, block_uri, attach=attach, what=what, via_block=via_block
                )
                return end.operation
            unknown_outcomes += 1
            if unknown_outcomes >= self._transport.retry.attempts:
                raise FabricTimeout(f"{what}: task outcome unknown after {unknown_outcomes} tries")

    async def _write_change(
        self, system: SystemInfo, etag: str | None, block_uri: str, attach: bool
    ) -> Response:
        target = system.add_target if attach else system.remove_target
        if target is not None:
            action = {"ResourceBlock": {"@odata.id": block_uri}}
            return await self._transport.write("POST", target, action)
        # The full new list (DSP2050 "expand a system"): every other block stays, the
        # System's own server block included, which real services refuse to lose (406).
        if attach:
            wanted = [*system.resource_blocks, block_uri]
        else:
            wanted = [uri for uri in system.resource_blocks if uri != block_uri]
        headers = {"If-Match": etag} if etag else None
        body = {"Links": {"ResourceBlocks": [{"@odata.id": uri} for uri in wanted]}}
        return await self._transport.write("PATCH", system.uri, body, headers)

    async def _verify(
        self, host_id: str, block_uri: str, *, attach: bool, what: str, via_block: bool
    ) -> None:
        """Check that a write the service reported as done took effect.

        Reads the System (one GET): done when its ``Links.ResourceBlocks`` holds the block
        (attach) or no longer holds it (detach; with ``via_block``, meaning the System never
        listed it, the block's ``Links.ComputerSystems`` must no longer name the System
        either). Otherwise the block is read too (some services record the holder only
        there), and both are read again every ``verify_poll_s`` up to ``verify_timeout_s``.

        Raises:
            FabricNotEffective: the change did not show within ``verify_timeout_s``.
            FabricError: as the reads.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._verify_timeout_s
        while True:
            system, _ = await self._read_system(host_id, what)
            self.verifications["read"] += 1
            listed = block_uri in system.resource_blocks
            if listed == attach and (attach or not via_block):
                return
            if not (listed and not attach):
                block = await self._read_block(block_uri, what)
                self.verifications["read"] += 1
                linked = system.uri in block.linked_systems
                if attach and linked:
                    return
                if not attach and not listed and not linked:
                    return
            remaining = deadline - loop.time()
            if remaining <= 0:
                self.verifications["not-effective"] += 1
                held = "does not hold the block" if attach else "still holds the block"
                raise FabricNotEffective(
                    f"{what}: the service reported success but host {host_id!r} {held} "
                    f"after {self._verify_timeout_s:g} s"
                )
            self.verifications["poll"] += 1
            await asyncio.sleep(min(self._verify_poll_s, remaining))


def _what(block_uri: str, host_id: str, attach: bool) -> str:
    if attach:
        return f"attach {block_uri} to host {host_id!r}"
    return f"detach {block_uri} from host {host_id!r}"
