"""A fabric backend for NEC CDIM (project-cdim): configuration-manager for the inventory,
layout-apply for attach (``connect``) and detach (``disconnect``).

The contract, from the services' sources (configuration-manager ``controller/*.go``,
layout-apply ``src/layoutapply/server.py``, ``db.py``, ``main.py``, ``schema.py``) and from a
layout-apply run on loopback:

* Hosts are CPUs: ``GET /nodes`` lists nodes whose id is their CPU's ``deviceID``.
* Devices come from ``GET /resources?detail=true``. Left out: devices with ``detected: false``
  (gone from the hardware, kept by the cache), CPUs, anything named in a
  ``constraints.nonRemovableDevices`` list (a CPU's own parts, never to be touched), and
  devices whose ``annotation.available`` is false. A device's host is the CPU in its
  ``links``. CDIM exposes no GPU UUID or PCI address: the node plugin finds the device by
  its serial number where it can.
* The inventory is a cache, refreshed about every ten minutes: a read of one device
  (``GET /resources/{id}``) is the freshest view there is, and may still be old. So the
  backend reads its own writes: for ``cache_lag_s`` after one of its connects or disconnects
  completed, its listings and reads show that device where the apply put it, not where the
  cache still has it (else the next inventory sync would see our fresh attach as lost).
  That memory ends with the process: before its first inventory read, a new backend reads
  the applies that ended within ``cache_lag_s`` from layout-apply's list (anyone's) and
  fills it with their completed steps (:meth:`CdimBackend._read_history`).
* ``POST /layout-apply`` runs procedures asynchronously (202 ``{"applyID"}``), one apply at a
  time in the whole installation. Its hazards, and what this backend does about each:

  - **Busy** (409 ``E40010``: another apply runs): transient; the POST is tried again with
    backoff for ``busy_timeout_s``, then the attach fails as retryable.
  - **Suspended** (a hardware 409, a device held by another CPU, turns the apply SUSPENDED,
    and every later POST gets 409 ``E40027``): the attach is pre-checked against a fresh read
    so that a device held elsewhere is a conflict with no POST at all. A SUSPENDED apply of
    ours is cancelled at once (without rollback: its completed steps stand) and its failed
    step reported as a conflict. Someone else's suspended apply blocks us: reported, left
    for its owner.
  - **Dropped connection to the hardware** (the apply ends FAILED, step code ``E40007``):
    the outcome is unknown; reported as retryable, and the retry reads the device again.
  - **No idempotency key**: the apply id is handed to ``on_operation`` (journalled) before it
    is polled, and after a crash :meth:`resume` follows it. Without a journalled id, an
    IN_PROGRESS apply with the same (operation, CPU, device) is found by listing
    (``GET /layout-apply?status=IN_PROGRESS&fields=procedures``) and followed instead of
    sending a second one. A retry only ever names the same device.
  - **Throughput** (an apply takes about a second even without hardware delay): attaches and
    detaches that wait at the same time are coalesced into one apply of independent
    procedures, and each caller gets its own step's result by ``operationID``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import aiohttp
from yarl import URL

from app.aio import cancel_and_wait
from app.fabric.errors import (
    FabricAuthError,
    FabricConflict,
    FabricError,
    FabricInvalidData,
    FabricNotFound,
    FabricTimeout,
    FabricUnavailable,
)
from app.fabric.types import (
    DeviceType,
    FabricDevice,
    FabricHost,
    Health,
    Listing,
    Operation,
    OperationState,
    Rejected,
)

log = logging.getLogger(__name__)

BASE = "/cdim/api/v1"
# The recent applies read at start: pages of HISTORY_PAGE, at most HISTORY_LIMIT applies.
HISTORY_PAGE = 100
HISTORY_LIMIT = 2000
# Each list of steps with the procedures its operationIDs refer to (schema.py ``fields``).
_HISTORY_PAIRS = (
    ("procedures", "applyResult"),
    ("resumeProcedures", "resumeResult"),
    ("rollbackProcedures", "rollbackResult"),
)
_HISTORY_FIELDS = tuple(name for pair in _HISTORY_PAIRS for name in pair)
ProcedureFields = Literal["oss", "product"]
FIELDS: Mapping[str, tuple[str, str]] = {
    # layout-apply schema.py (OSS) and the product's names for the CPU and the device.
    "oss": ("targetCPUID", "targetDeviceID"),
    "product": ("sourceDeviceID", "destinationDeviceID"),
}
_TYPES: Mapping[str, DeviceType] = {
    "gpu": DeviceType.GPU,
    "fpga": DeviceType.FPGA,
    "accelerator": DeviceType.ACCELERATOR,
    "dsp": DeviceType.ACCELERATOR,
    "memory": DeviceType.CXL_MEMORY,
    "storage": DeviceType.NVME,
    "networkinterface": DeviceType.NIC,
}
_HEALTH = {"OK": Health.OK, "Warning": Health.WARNING, "Critical": Health.CRITICAL}
_RUNNING = ("IN_PROGRESS", "CANCELING")
_DROPPED = ("E40003", "E40007", "E40008")  # timeout, connection error, request error


@dataclass
class _Request:
    """An attach or detach waiting to go out in the next apply."""

    operation: str  # connect or disconnect
    cpu: str
    device: str
    on_operation: Callable[[str], Awaitable[None]] | None
    done: asyncio.Future[Operation] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class CdimBackend:
    """NEC CDIM as a :class:`app.fabric.backend.FabricBackend`.

    Args:
        base_url: the installation's origin (``https://cdim.example:443``), no path.
        name: the fabric manager's name (setting ``fabric.name``).
        prefix: a gateway path before ``/cdim/api/v1`` (e.g. ``/gw``), or "".
        token: a bearer token for the gateway (Kong with Keycloak), or None.
        procedure_fields: ``oss`` (``targetCPUID``/``targetDeviceID``) or ``product``
            (``sourceDeviceID``/``destinationDeviceID``).
        verify_tls, ca_file: TLS verification, as for Redfish.
        timeout_s: seconds per HTTP call.
        poll_s: seconds between reads of a running apply.
        apply_timeout_s: seconds an apply may run before the attach fails (retryable).
        busy_timeout_s: seconds to keep trying a POST the installation refuses as busy.
        batch_window_s: seconds an attach waits for others to join its apply (0: one apply
            per attach, still never two at once).
        session: an aiohttp session to use (tests); closed by the caller.
        cache_lag_s: seconds the inventory cache may lag behind an apply: for that long a
            device this backend connected or disconnected is shown where the apply put it.

    Raises:
        ValueError: a malformed base URL, an unknown procedure field set, a non-positive
            timeout, or an unusable CA bundle.
    """

    kind = "cdim"

    def __init__(
        self,
        base_url: str,
        *,
        name: str = "cdim",
        prefix: str = "",
        token: str | None = None,
        procedure_fields: ProcedureFields = "oss",
        verify_tls: bool = True,
        ca_file: str | Path | None = None,
        timeout_s: float = 30.0,
        poll_s: float = 0.5,
        apply_timeout_s: float = 300.0,
        busy_timeout_s: float = 120.0,
        batch_window_s: float = 0.05,
        session: aiohttp.ClientSession | None = None,
        cache_lag_s: float = 900.0,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base URL {base_url!r} is not an http:// or https:// origin")
        if procedure_fields not in FIELDS:
            raise ValueError(f"procedure fields {procedure_fields!r} are not oss or product")
        if min(timeout_s, poll_s, apply_timeout_s, busy_timeout_s) <= 0 or batch_window_s < 0:
            raise ValueError("timeouts and the poll interval must be positive")
        self.name = name
        gateway = prefix.strip("/")
        self._root = base_url.rstrip("/") + (f"/{gateway}" if gateway else "") + BASE
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._cpu_field, self._device_field = FIELDS[procedure_fields]
        self._ssl: ssl.SSLContext | bool = False
        if base_url.startswith("https://") and verify_tls:
            try:
                self._ssl = ssl.create_default_context(
                    cafile=None if ca_file is None else str(ca_file)
                )
            except (OSError, ssl.SSLError) as err:
                raise ValueError(f"CA bundle {ca_file} cannot be used: {err}") from err
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._poll_s = poll_s
        self._apply_timeout_s = apply_timeout_s
        self._busy_timeout_s = busy_timeout_s
        self._batch_window_s = batch_window_s
        self._session = session
        self._owns_session = session is None
        self._closed = False
        self._queue: list[_Request] = []
        self._sender: asyncio.Task[None] | None = None
        self._ours: set[str] = set()  # apply ids this process posted
        self._cache_lag_s = cache_lag_s
        # device -> (the CPU the last completed apply left it on, or None; when: monotonic)
        self._written: dict[str, tuple[str | None, float]] = {}
        # layout-apply's recent history, read once before the first inventory read.
        self._history_lock = asyncio.Lock()
        self._history_read = False
        self.applies = 0  # applies posted (for the benchmark)
        self.busy_retries = 0

    def __repr__(self) -> str:
        return f"CdimBackend({self._root!r})"

    # ------------------------------------------------------------------ HTTP

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise FabricError(f"cdim backend for {self._root} is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | list[tuple[str, str]] | None = None,
        body: Any = None,
    ) -> tuple[int, Any]:
        """One HTTP call; (status, decoded JSON body or None).

        Raises:
            FabricUnavailable: no answer (connection, timeout), or a 5xx.
            FabricAuthError: 401 or 403.
        """
        url = self._root + path
        try:
            async with self._http().request(
                method,
                url,
                params=params,
                json=body,
                headers=self._headers,
                ssl=self._ssl,
                timeout=self._timeout,
            ) as response:
                text = await response.text()
                status = response.status
        except TimeoutError as err:
            raise FabricTimeout(f"{method} {path}: no answer in time") from err
        except aiohttp.ClientError as err:
            raise FabricUnavailable(f"{method} {path}: {err}") from err
        try:
            decoded = _json(text)
        except ValueError:
            decoded = None
        if status in (401, 403):
            raise FabricAuthError(f"{method} {path}: HTTP {status} (check fabric.token_file)")
        if status >= 500:
            raise FabricUnavailable(
                f"{method} {path}: HTTP {status}: {_message(decoded)}",
                status=status,
                vendor_code=_code(decoded),
            )
        return status, decoded

    def _not_a_listing(
        self, path: str, status: int, what: str, service: str = "configuration-manager"
    ) -> FabricInvalidData:
        """The error for a read that did not answer a listing. A 404 there means nothing
        serves ``service`` at this URL: most often a gateway's path missing from, or wrong
        in, ``fabric.path_prefix``; the message names the URL."""
        if status == 404:
            url = URL(self._root + path).with_user(None)  # no credentials in a message
            return FabricInvalidData(
                f"GET {url}: HTTP 404: no CDIM {service} answers at "
                f"this URL; check fabric.url and fabric.path_prefix (a gateway's path "
                f"before {BASE}, e.g. /gw)",
                status=404,
            )
        return FabricInvalidData(f"GET {path}: HTTP {status}, not a {what}", status=status)

    # ------------------------------------------------------------------ inventory

    async def _resources(self) -> list[Any]:
        status, body = await self._call("GET", "/resources", params={"detail": "true"})
        if (
            status != 200
            or not isinstance(body, dict)
            or not isinstance(body.get("resources"), list)
        ):
            raise self._not_a_listing("/resources", status, "resource list")
        return list(body["resources"])

    async def list_hosts(self) -> Listing[FabricHost]:
        """Every CPU node as a :class:`FabricHost` (host id: the CPU's deviceID).

        Raises:
            FabricUnavailable: the nodes could not be read.
            FabricAuthError: the token was refused.
        """
        await self._read_history()
        status, body = await self._call("GET", "/nodes")
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("nodes"), list):
            raise self._not_a_listing("/nodes", status, "node list")
        hosts: list[FabricHost] = []
        rejected: list[Rejected] = []
        for node in body["nodes"]:
            node_id = node.get("id") if isinstance(node, dict) else None
            if not isinstance(node_id, str) or not node_id:
                rejected.append(Rejected(str(node)[:200], "node without an id", "missing-field"))
                continue
            members = [
                r.get("device") or {}
                for r in _list(node.get("resources"))
                if isinstance(r, dict) and isinstance(r.get("device"), dict)
            ]
            cpu = next((d for d in members if d.get("deviceID") == node_id), {})
            held = {
                str(d["deviceID"])
                for d in members
                if d.get("deviceID") != node_id and isinstance(d.get("deviceID"), str)
            }
            for device_id in list(self._written):
                written = self._fresh_write(device_id)
                if written is not None:
                    if written[0] == node_id:
                        held.add(device_id)
                    else:
                        held.discard(device_id)
            units = tuple(sorted(held))
            hosts.append(
                FabricHost(
                    host_id=node_id,
                    name=_text(cpu.get("model")),
                    serial=_text(cpu.get("serialNumber")),
                    health=_health(cpu),
                    attached_units=units,
                )
            )
        return Listing(tuple(hosts), tuple(rejected))

    async def list_devices(self) -> Listing[FabricDevice]:
        """Every composable device (see the module docstring for what is left out).

        Raises:
            FabricUnavailable: the resources could not be read.
            FabricAuthError: the token was refused.
        """
        await self._read_history()
        resources = await self._resources()
        built_in: set[str] = set()
        for entry in resources:
            device = entry.get("device") if isinstance(entry, dict) else None
            if isinstance(device, dict):
                constraints = device.get("constraints") or {}
                parts = (
                    constraints.get("nonRemovableDevices")
                    if isinstance(constraints, dict)
                    else None
                )
                if isinstance(parts, list) and parts:
                    built_in.add(str(device.get("deviceID")))
                    built_in.update(str(p.get("deviceID")) for p in parts if isinstance(p, dict))
        devices: list[FabricDevice] = []
        rejected: list[Rejected] = []
        local: list[str] = []
        for entry in resources:
            made = self._device(entry, built_in)
            if isinstance(made, Rejected):
                rejected.append(made)
            elif isinstance(made, str):
                local.append(made)
            elif made is not None:
                written = self._fresh_write(made.vendor_id)
                if written is not None and written[0] != made.host_id:
                    made = dataclasses.replace(made, host_id=written[0])
                devices.append(made)
        return Listing(tuple(devices), tuple(rejected), tuple(local))

    async def _read_history(self) -> None:
        """Once, before the first inventory read: what the applies that ended within
        ``cache_lag_s`` did, into the same memory as this process's own applies.

        configuration-manager's inventory is a cache that lags behind the hardware, and the
        memory of our own applies ends with the process: without this, every device connected
        or disconnected shortly before a restart shows where it was before, and the drift
        check takes it for lost. layout-apply keeps every apply with its steps: the completed
        connect and disconnect steps (of the apply, of a resume and of a rollback) are
        replayed in the order they ended, whoever posted them. Read with server.py's list
        options (``endedAtSince``, ``sortBy=endedAt``, ``limit``, ``offset``); times are
        layout-apply's clock, so a skew between the two clocks moves the window by as much.
        A failed read is logged and not retried: the cache is then taken as it is.
        """
        if self._history_read:
            return
        async with self._history_lock:
            if self._history_read:
                return
            try:
                steps = await self._recent_steps()
            except FabricError as err:
                log.warning(
                    "%s: could not read layout-apply's recent applies (%s); devices connected "
                    "or disconnected in the %.0f s before this start may show where they "
                    "were until configuration-manager's cache catches up",
                    self.name,
                    err,
                    self._cache_lag_s,
                )
                steps = []
            now_wall, now_mono = datetime.now(UTC), time.monotonic()
            for ended, operation, cpu, device in sorted(steps):
                when = now_mono - max(0.0, (now_wall - ended).total_seconds())
                known = self._written.get(device)
                if known is None or known[1] <= when:
                    self._written[device] = (cpu if operation == "connect" else None, when)
            if steps:
                log.info(
                    "%s: %d connect and disconnect steps of recent applies shown over the "
                    "inventory cache",
                    self.name,
                    len(steps),
                )
            self._history_read = True

    async def _recent_steps(self) -> list[tuple[datetime, str, str, str]]:
        """(ended, operation, CPU, device) of every completed connect or disconnect step of
        the applies that ended within ``cache_lag_s``, newest applies first, at most
        :data:`HISTORY_LIMIT` applies.

        Raises:
            FabricError: layout-apply could not be read, or answered no list.
        """
        since = datetime.now(UTC) - timedelta(seconds=self._cache_lag_s)
        found: list[tuple[datetime, str, str, str]] = []
        offset = 0
        while offset < HISTORY_LIMIT:
            params = [
                ("endedAtSince", since.strftime("%Y-%m-%dT%H:%M:%SZ")),
                ("sortBy", "endedAt"),
                ("orderBy", "desc"),
                ("limit", str(HISTORY_PAGE)),
                ("offset", str(offset)),
                *(("fields", name) for name in _HISTORY_FIELDS),
            ]
            status, body = await self._call("GET", "/layout-apply", params=params)
            if status == 404:
                raise self._not_a_listing("/layout-apply", status, "apply list", "layout-apply")
            if status != 200 or not isinstance(body, dict):
                raise FabricInvalidData(
                    f"GET /layout-apply: HTTP {status}: {_message(body)}", status=status
                )
            page = [a for a in _list(body.get("applyResults")) if isinstance(a, dict)]
            for apply in page:
                found.extend(self._completed_steps(apply))
            offset += len(page)
            total = body.get("totalCount")
            if not page or not isinstance(total, int) or offset >= total:
                break
        return found

    def _completed_steps(self, apply: Mapping[str, Any]) -> list[tuple[datetime, str, str, str]]:
        """The completed connect and disconnect steps of one apply from the list."""
        out: list[tuple[datetime, str, str, str]] = []
        apply_ended = _when(apply.get("endedAt"))
        for procedures_key, results_key in _HISTORY_PAIRS:
            by_id = {
                p.get("operationID"): p
                for p in _list(apply.get(procedures_key))
                if isinstance(p, dict)
            }
            for result in _list(apply.get(results_key)):
                if not isinstance(result, dict) or result.get("status") != "COMPLETED":
                    continue
                procedure = by_id.get(result.get("operationID"))
                if not isinstance(procedure, dict):
                    continue
                operation = procedure.get("operation")
                cpu = procedure.get(self._cpu_field)
                device = procedure.get(self._device_field)
                ended = _when(result.get("endedAt")) or apply_ended
                if (
                    operation in ("connect", "disconnect")
                    and isinstance(cpu, str)
                    and isinstance(device, str)
                    and ended is not None
                ):
                    out.append((ended, operation, cpu, device))
        return out

    def _fresh_write(self, device_id: str) -> tuple[str | None] | None:
        """Where our own recent apply left ``device_id`` (a 1-tuple), or None when we have
        not changed it within ``cache_lag_s``."""
        found = self._written.get(device_id)
        if found is None:
            return None
        if time.monotonic() - found[1] > self._cache_lag_s:
            del self._written[device_id]
            return None
        return (found[0],)

    def _device(self, entry: Any, built_in: set[str]) -> FabricDevice | Rejected | str | None:
        """One resource as a device; a Rejected for bad data; the id of a built-in part (a
        local unit); None for what is not offered (gone, unavailable, a CPU)."""
        if not isinstance(entry, dict) or not isinstance(entry.get("device"), dict):
            return Rejected(str(entry)[:200], "resource without a device object", "missing-field")
        device = entry["device"]
        device_id = device.get("deviceID")
        kind = device.get("type")
        if not isinstance(device_id, str) or not device_id:
            return Rejected(str(device)[:200], "device without a deviceID", "missing-field")
        if not isinstance(kind, str) or not kind:
            return Rejected(device_id, "device without a type", "missing-field")
        if entry.get("detected") is False or kind.upper() == "CPU":
            return None
        if device_id in built_in:
            return device_id
        annotation = entry.get("annotation")
        if isinstance(annotation, dict) and annotation.get("available") is False:
            return None
        return FabricDevice(
            vendor_id=device_id,
            attach_unit=device_id,
            device_type=_TYPES.get(kind.lower(), DeviceType.OTHER),
            vendor=_text(device.get("manufacturer")),
            model=_text(device.get("model")),
            serial=_text(device.get("serialNumber")),
            health=_health(device),
            state=_text((device.get("status") or {}).get("state"))
            if isinstance(device.get("status"), dict)
            else None,
            host_id=_holder(device, entry),
            name=_text(device.get("deviceName")) or device_id,
        )

    async def _holder_now(self, device_id: str) -> str | None:
        """The CPU holding ``device_id`` as the freshest read says.

        Raises:
            FabricNotFound: the device is unknown or gone from the hardware.
        """
        status, body = await self._call("GET", f"/resources/{device_id}")
        if status == 404:
            raise FabricNotFound(f"device {device_id} is not in the CDIM inventory", status=404)
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("device"), dict):
            raise FabricInvalidData(f"GET /resources/{device_id}: HTTP {status}")
        if body.get("detected") is False:
            raise FabricNotFound(f"device {device_id} is no longer detected by the hardware")
        written = self._fresh_write(device_id)
        return written[0] if written is not None else _holder(body["device"], body)

    # ------------------------------------------------------------------ attach / detach

    async def attach(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        on_operation: Callable[[str], Awaitable[None]] | None = None,
    ) -> Operation:
        """Connect ``device`` to CPU ``host_id`` (see :class:`FabricBackend.attach`).

        Raises:
            FabricConflict: another CPU holds it (no POST is sent), or the hardware refused
                (the apply was suspended; it is cancelled).
            FabricNotFound: the device is unknown or gone.
            FabricUnavailable: the installation stayed busy, an apply of someone else is
                suspended, the connection to the hardware dropped (outcome unknown), or the
                apply did not end in time (FabricTimeout).
        """
        holder = await self._holder_now(device.vendor_id)
        if holder == host_id:
            return Operation(None, OperationState.COMPLETED, "already connected")
        if holder is not None:
            raise FabricConflict(
                f"device {device.vendor_id} is connected to CPU {holder}; not sent (a hardware "
                f"conflict would suspend every apply of the installation)",
                status=409,
            )
        return await self._change("connect", device.vendor_id, host_id, on_operation)

    async def detach(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        on_operation: Callable[[str], Awaitable[None]] | None = None,
    ) -> Operation:
        """Disconnect ``device`` from CPU ``host_id`` (see :class:`FabricBackend.detach`).

        A device another CPU holds is left alone (a success: not ours to detach). A device
        the cache shows free is disconnected anyway: the cache may be older than our
        connect, and the hardware answers a disconnect of a free device with success.

        Raises: as :meth:`attach`.
        """
        try:
            holder = await self._holder_now(device.vendor_id)
        except FabricNotFound:
            return Operation(None, OperationState.COMPLETED, "device gone")
        if holder is not None and holder != host_id:
            return Operation(None, OperationState.COMPLETED, f"held by CPU {holder}, not {host_id}")
        return await self._change("disconnect", device.vendor_id, host_id, on_operation)

    async def _change(
        self,
        operation: str,
        device_id: str,
        cpu: str,
        on_operation: Callable[[str], Awaitable[None]] | None,
    ) -> Operation:
        running = await self._find_running(operation, cpu, device_id)
        if running is not None:
            # A crash left our apply running (no id journalled): follow it, send nothing.
            apply_id, operation_id = running
            if on_operation is not None:
                await on_operation(apply_id)
            return await self._outcome(apply_id, operation_id, operation, cpu, device_id)
        request = _Request(operation, cpu, device_id, on_operation)
        self._queue.append(request)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_loop(), name="cdim-apply")
        return await asyncio.shield(request.done)

    async def _find_running(
        self, operation: str, cpu: str, device_id: str
    ) -> tuple[str, int] | None:
        """An IN_PROGRESS apply with a procedure (operation, CPU, device), if any."""
        status, body = await self._call(
            "GET", "/layout-apply", params=[("status", "IN_PROGRESS"), ("fields", "procedures")]
        )
        if status != 200 or not isinstance(body, dict):
            return None
        for apply in _list(body.get("applyResults")):
            if not isinstance(apply, dict):
                continue
            for procedure in _list(apply.get("procedures")):
                if self._is(procedure, operation, cpu, device_id):
                    return str(apply.get("applyID")), _number(procedure.get("operationID"))
        return None

    def _is(self, procedure: Any, operation: str, cpu: str, device_id: str) -> bool:
        return (
            isinstance(procedure, dict)
            and procedure.get("operation") == operation
            and procedure.get(self._cpu_field) == cpu
            and procedure.get(self._device_field) == device_id
        )

    async def _send_loop(self) -> None:
        """Send what waits as one apply at a time, until nothing waits."""
        while self._queue:
            if self._batch_window_s:
                await asyncio.sleep(self._batch_window_s)
                batch, self._queue = self._queue, []
            else:
                batch = [self._queue.pop(0)]
            try:
                await self._send(batch)
            except Exception as err:  # every waiter gets the failure, the loop goes on
                failure = err if isinstance(err, FabricError) else FabricUnavailable(str(err))
                for request in batch:
                    if not request.done.done():
                        request.done.set_exception(failure)

    async def _send(self, batch: list[_Request]) -> None:
        # One procedure per request; the same device twice in one apply is not sent twice.
        unique: dict[tuple[str, str, str], list[_Request]] = {}
        for request in batch:
            unique.setdefault((request.operation, request.cpu, request.device), []).append(request)
        procedures = [
            {
                "operationID": number,
                "operation": operation,
                self._cpu_field: cpu,
                self._device_field: device,
                "dependencies": [],
            }
            for number, (operation, cpu, device) in enumerate(unique, start=1)
        ]
        apply_id = await self._post(procedures)
        for request in batch:
            if request.on_operation is not None:
                await request.on_operation(apply_id)
        final = await self._follow(apply_id)
        for number, (key, requests) in enumerate(unique.items(), start=1):
            try:
                result: Operation | FabricError = self._step_outcome(final, number, *key)
            except FabricError as err:
                result = err
            for request in requests:
                if request.done.done():
                    continue
                if isinstance(result, FabricError):
                    request.done.set_exception(result)
                else:
                    request.done.set_result(result)

    async def _post(self, procedures: list[dict[str, Any]]) -> str:
        """POST the apply, waiting out a busy installation.

        Raises:
            FabricUnavailable: still busy after ``busy_timeout_s``, or a suspended apply of
                someone else blocks the installation.
            FabricInvalidData: the service refused the procedures (400).
        """
        deadline = time.monotonic() + self._busy_timeout_s
        wait = 0.2
        while True:
            status, body = await self._call(
                "POST", "/layout-apply", body={"procedures": procedures}
            )
            if status == 202 and isinstance(body, dict) and isinstance(body.get("applyID"), str):
                apply_id = str(body["applyID"])
                self._ours.add(apply_id)
                self.applies += 1
                return apply_id
            code = _code(body)
            if status == 409 and code == "E40010":
                if time.monotonic() + wait > deadline:
                    raise FabricUnavailable(
                        f"CDIM stayed busy (E40010: another apply runs) for "
                        f"{self._busy_timeout_s:g}s",
                        status=409,
                        vendor_code=code,
                    )
                self.busy_retries += 1
                await asyncio.sleep(wait)
                wait = min(wait * 2, 5.0)
                continue
            if status == 409 and code == "E40027":
                raise FabricUnavailable(
                    f"CDIM refuses every apply while one is suspended ({_message(body)}); its "
                    f"owner must cancel or resume it (PUT /layout-apply/<id>?action=cancel)",
                    status=409,
                    vendor_code=code,
                )
            raise FabricInvalidData(
                f"POST /layout-apply: HTTP {status}: {_message(body)}",
                status=status,
                vendor_code=code,
            )

    async def _read_apply(self, apply_id: str) -> dict[str, Any] | None:
        status, body = await self._call("GET", f"/layout-apply/{apply_id}")
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise FabricInvalidData(f"GET /layout-apply/{apply_id}: HTTP {status}")
        return body

    async def _follow(self, apply_id: str) -> dict[str, Any]:
        """Poll the apply until it ends; a SUSPENDED apply of ours is cancelled (no rollback).

        Raises:
            FabricNotFound: the apply is gone.
            FabricTimeout: it did not end within ``apply_timeout_s``.
        """
        deadline = time.monotonic() + self._apply_timeout_s
        while True:
            body = await self._read_apply(apply_id)
            if body is None:
                raise FabricNotFound(f"apply {apply_id} is gone")
            status = body.get("status")
            if status == "SUSPENDED":
                log.warning(
                    "CDIM apply %s was suspended (the hardware refused a step); cancelling it "
                    "so that the installation takes applies again",
                    apply_id,
                )
                with contextlib.suppress(FabricError):
                    await self._call(
                        "PUT", f"/layout-apply/{apply_id}", params={"action": "cancel"}
                    )
                return body
            if status not in _RUNNING:
                return body
            if time.monotonic() > deadline:
                raise FabricTimeout(
                    f"apply {apply_id} still {status} after {self._apply_timeout_s:g}s"
                )
            await asyncio.sleep(self._poll_s)

    def _step_outcome(
        self, final: Mapping[str, Any], number: int, operation: str, cpu: str, device: str
    ) -> Operation:
        """Our step's result in the ended apply ``final``.

        Raises:
            FabricConflict: the hardware refused it (409; the apply was suspended).
            FabricNotFound: the hardware does not know the device or CPU (404).
            FabricUnavailable: the connection to the hardware dropped (outcome unknown), or the
                step never ran (the apply failed or was cancelled before it).
        """
        apply_id = str(final.get("applyID"))
        results = [
            r
            for r in _list(final.get("applyResult"))
            if isinstance(r, dict) and r.get("operationID") == number
        ]
        result = results[-1] if results else None
        if result is not None and result.get("status") == "COMPLETED":
            self._written[device] = (cpu if operation == "connect" else None, time.monotonic())
            return Operation(apply_id, OperationState.COMPLETED)
        what = f"{operation} of {device} to CPU {cpu} (apply {apply_id}, {final.get('status')})"
        if result is None:
            raise FabricUnavailable(f"{what}: the step did not run")
        code = result.get("statusCode")
        body = result.get("responseBody")
        vendor = _code(body)
        if vendor in _DROPPED:
            raise FabricUnavailable(
                f"{what}: the connection to the hardware dropped ({vendor}); the outcome is "
                f"unknown",
                vendor_code=vendor,
            )
        if code == 409:
            raise FabricConflict(f"{what}: the hardware refused: {_message(body)}", status=409)
        if code == 404:
            raise FabricNotFound(f"{what}: {_message(body)}", status=404)
        raise FabricUnavailable(f"{what}: HTTP {code}: {_message(body)}", status=code)

    async def _outcome(
        self, apply_id: str, number: int, operation: str, cpu: str, device: str
    ) -> Operation:
        final = await self._follow(apply_id)
        return self._step_outcome(final, number, operation, cpu, device)

    async def resume(
        self, op_id: str, device: FabricDevice, host_id: str, *, attach: bool
    ) -> Operation:
        """Finish an attach or detach whose apply ``op_id`` was journalled.

        The apply is followed while it runs; our step is found by (operation, CPU, device).
        When the apply is gone or our step did not complete, the device's state decides: a
        change that holds is done, else it is made again.

        Raises: as :meth:`attach`.
        """
        operation = "connect" if attach else "disconnect"
        body = await self._read_apply(op_id)
        if body is not None:
            if body.get("status") in _RUNNING or body.get("status") == "SUSPENDED":
                body = await self._follow(op_id)
            number = next(
                (
                    _number(p.get("operationID"))
                    for p in _list(body.get("procedures"))
                    if self._is(p, operation, host_id, device.vendor_id)
                ),
                None,
            )
            if number is not None:
                with contextlib.suppress(FabricError):
                    return self._step_outcome(body, number, operation, host_id, device.vendor_id)
        if attach:
            return await self.attach(device, host_id)
        return await self.detach(device, host_id)

    async def operation_status(self, op_id: str) -> Operation:
        """The state of apply ``op_id``.

        Raises:
            FabricNotFound: no such apply.
        """
        body = await self._read_apply(op_id)
        if body is None:
            raise FabricNotFound(f"apply {op_id} not found")
        status = body.get("status")
        if status in _RUNNING:
            return Operation(op_id, OperationState.RUNNING, str(status))
        if status == "COMPLETED":
            return Operation(op_id, OperationState.COMPLETED)
        return Operation(op_id, OperationState.FAILED, str(status))

    async def close(self) -> None:
        """Fail what still waits, and close the HTTP session. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        # The sender's own failure is what the waiters are told below.
        with contextlib.suppress(Exception):
            await cancel_and_wait(self._sender)
        for request in self._queue:
            if not request.done.done():
                request.done.set_exception(FabricUnavailable("the cdim backend was closed"))
        self._queue = []
        if self._owns_session and self._session is not None:
            await self._session.close()


def _json(text: str) -> Any:
    import json

    return json.loads(text) if text else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _health(device: Mapping[str, Any]) -> Health:
    status = device.get("status")
    health = status.get("health") if isinstance(status, dict) else None
    return _HEALTH.get(str(health), Health.UNKNOWN)


def _holder(device: Mapping[str, Any], entry: Mapping[str, Any]) -> str | None:
    """The CPU a device is connected to: its CPU link, else its node."""
    for link in _list(device.get("links")):
        if isinstance(link, dict) and str(link.get("type", "")).upper() == "CPU":
            found = link.get("deviceID")
            if isinstance(found, str) and found:
                return found
    nodes = entry.get("nodeIDs")
    if isinstance(nodes, list) and nodes and isinstance(nodes[0], str):
        return nodes[0]
    return None


def _number(value: Any) -> int:
    """An operationID as an integer (0 for anything else: matches no step of ours)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _when(value: Any) -> datetime | None:
    """A layout-apply time (``2025-01-02T03:04:05Z``) as an aware datetime, None if not one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _list(value: Any) -> list[Any]:
    """``value`` when it is a list, else an empty one (vendor data of the wrong shape)."""
    return value if isinstance(value, list) else []


def _code(body: Any) -> str | None:
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


def _message(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("message") or body.get("details") or body)[:300]
    return str(body)[:300]
