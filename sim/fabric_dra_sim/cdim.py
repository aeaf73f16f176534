"""A simulator of NEC CDIM (project-cdim): its configuration-manager's inventory and its
layout-apply service, behind one base path (``/cdim/api/v1``), as a gateway serves them.

The rules are ported from the sources, not guessed:

* **Inventory** (configuration-manager ``controller/get_resource_list.go``,
  ``get_node_list.go``, ``model/resource/resource_model.go``): ``GET /resources?detail=true``
  answers ``{count, resources: [{device, annotation: {available}, resourceGroupIDs, nodeIDs,
  detected}]}``, ``GET /resources/{id}`` one of them, ``GET /nodes`` ``{count, nodes: [{id,
  resources}]}`` where a node's id is its CPU's deviceID. The inventory is a cache of the
  hardware, refreshed on a sync tick (about every 10 minutes in a real installation):
  between ticks it answers the last sync's view; a device gone from the hardware stays with
  ``detected: false``. A CPU's built-in parts are in its ``constraints.nonRemovableDevices``.
* **Layout apply** (layout-apply ``src/layoutapply/server.py``, ``db.py``, ``main.py``,
  ``apiclient.py``, ``schema.py``, ``custom_exceptions.py``):

  - ``POST /layout-apply {"procedures": [...]}`` is validated by the procedure schema
    (``operationID`` integer, ``operation`` one of boot, shutdown, connect, disconnect,
    start, stop, ``dependencies`` integers; connect and disconnect need the CPU and the
    device), then registered: while any apply is IN_PROGRESS or CANCELING, or a rollback is
    IN_PROGRESS, it is 409 ``E40010``; while any apply or rollback is SUSPENDED, 409
    ``E40027`` (``DbAccess._is_running_data``). Otherwise 202 ``{"applyID": <10 hex>}``; an
    empty list is COMPLETED at once.
  - A worker runs the steps in dependency order, independent ones at once. Each step is a
    hardware call (``PUT <hw>/cpu/{cpu}/aggregations``); its result is appended to
    ``applyResult`` as it ends, so a GET while running shows the steps done so far. A
    hardware 503 with code ER005BAS001/ER005BAS002 is retried (2 times), any other non-200
    answer too (2 times); still failing, the apply ends SUSPENDED (``SuspendProcessException``):
    a device held by another CPU does that. A dropped connection to the hardware ends the step
    FAILED (``E40007``) without retry: the apply ends FAILED, and whether the change happened
    is unknown.
  - ``PUT /layout-apply/{id}?action=cancel[&rollbackOnCancel=true]`` and ``action=resume``,
    and ``DELETE``, answer per the tables of ``_cancel_layoutapply``,
    ``_resume_layoutapply`` and ``delete_layoutapply``. A cancel of an IN_PROGRESS apply whose
    worker is gone ends it FAILED with 409 ``E40028``.
  - ``GET /layout-apply/{id}`` (404 ``E40020`` when unknown, 400 ``E40001`` for an id that is
    not 10 hex digits) and ``GET /layout-apply`` (``{totalCount, count, applyResults}``) with
    server.py's ``GetAllLayoutApplyOptions``: ``status``, ``startedAtSince``,
    ``startedAtUntil``, ``endedAtSince``, ``endedAtUntil`` (schema.py ``time_format``,
    compared in UTC, since inclusive ``>=``, until ``<=``; an apply with no end matches no
    ``endedAt`` bound, as SQL NULL does not), ``sortBy`` (``startedAt``/``endedAt``, default
    ``startedAt``), ``orderBy`` (``asc``/``desc``, default ``desc``; PostgreSQL puts applies
    with no end first in ``desc``, last in ``asc``), ``limit`` (at least 1, default 20),
    ``offset`` (at least 0), ``fields``; other parameters are ignored (db.py
    ``get_apply_status_list``, ``_create_where_query_of_get``). Errors are
    ``{"code": "E4xxxx", "message": ...}``.
  - An apply takes about a second even without hardware delay (``apply_overhead_s``): the
    real service starts a process per apply.

Fault knobs (``CdimFaults``) model what the real service does wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import click
from aiohttp import web

from app import aio
from app.commands.params import MAX_SECONDS, FiniteFloatRange

BASE = "/cdim/api/v1"
IN_PROGRESS = "IN_PROGRESS"
CANCELING = "CANCELING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
SUSPENDED = "SUSPENDED"
CANCELED = "CANCELED"
STATUSES = (IN_PROGRESS, COMPLETED, FAILED, CANCELING, CANCELED, SUSPENDED)
OPERATIONS = ("boot", "shutdown", "connect", "disconnect", "start", "stop")
# schema.py ``fields``: what ``?fields=`` may name (unique, at least one).
FIELD_NAMES = (
    "procedures",
    "applyResult",
    "rollbackProcedures",
    "rollbackResult",
    "resumeProcedures",
    "resumeResult",
)
RETRY_CODES = ("ER005BAS001", "ER005BAS002")
_APPLY_ID = re.compile(r"^[0-9a-f]{10}$")
FieldNames = Literal["oss", "product"]
# The procedure's CPU and device fields: the OSS names, and the product's.
FIELDS: Mapping[str, tuple[str, str]] = {
    "oss": ("targetCPUID", "targetDeviceID"),
    "product": ("sourceDeviceID", "destinationDeviceID"),
}


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fields(request: web.Request) -> list[str] | web.Response | None:
    """The ``fields`` query values (None when absent), or the 400 the service answers."""
    fields = request.query.getall("fields", None)
    if fields is None:
        return None
    for value in fields:
        if value not in FIELD_NAMES:
            return _error(400, "E40001", f"'{value}' is not one of {list(FIELD_NAMES)}")
    if len(set(fields)) != len(fields):
        return _error(400, "E40001", f"{fields} has non-unique elements")
    return list(fields)


# schema.py ``time_format``: a date and time to the second, with ``Z`` or an offset.
_TIME_FORMAT = re.compile(
    r"(\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):([0-5]\d):([0-5]\d)"
    r"(Z|[+-]([01]\d|2[0-3]):([0-5]\d))"
)


def _moment(value: str) -> datetime | web.Response:
    """A list bound as a UTC datetime, or the 400 the service answers (the schema's pattern,
    then iso8601.parse_date, which refuses a day the month does not have)."""
    if not _TIME_FORMAT.fullmatch(value):
        return _error(400, "E40001", f"'{value}' does not match the time format")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        return _error(400, "E40001", f"'{value}': {err}")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        # server.py converts to UTC outside its try: a moment beyond year 1-9999 in UTC
        # escapes as an exception, which Starlette answers with a plain-text 500.
        return web.Response(status=500, text="Internal Server Error")


def _parse_now(value: str) -> datetime:
    """A timestamp this simulator wrote (``_now``) as a UTC datetime."""
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _whole(value: str, name: str, *, minimum: int) -> int | web.Response:
    """A ``limit`` or ``offset`` query value, or the 400 the service answers (pydantic's int
    parsing, then schema.py's minimum)."""
    digits = value.strip()
    # pydantic reads ASCII digits only, and no more than Python's int() takes from text.
    if not re.fullmatch(r"[+-]?[0-9]+", digits) or len(digits) > 4300:
        return _error(400, "E40001", f"{name}: Input should be a valid integer")
    number = int(digits)
    if number < minimum:
        return _error(400, "E40001", f"{number} is less than the minimum of {minimum}")
    return number


def _error(http_status: int, code: str, message: str, **extra: Any) -> web.Response:
    return web.json_response({"code": code, "message": message, **extra}, status=http_status)


@dataclass
class CdimFaults:
    """Fault knobs, all off by default; change them at run time through ``sim.faults``.

    Attributes:
        latency_s: seconds added before every answer.
        hw_503: the next this many hardware calls answer 503 ER005BAS001 (retried by the
            service per step).
        hw_drop: the next this many hardware calls lose their connection (the step ends FAILED,
            E40007); ``hw_drop_takes_effect`` says whether the change happened anyway.
        hw_drop_takes_effect: see ``hw_drop``.
        orphan_next: the next this many applies are registered but no worker runs them: they
            stay IN_PROGRESS, blocking every other apply, until cancelled (a killed worker).
        api_error_rate: probability (0..1) that a request is answered ``api_error_status``
            (an error body of the service) before being served.
        api_error_status: the HTTP status of those errors (500 by default: a database error,
            E40019).
        drop_rate: probability that a request's connection is closed without an answer.
        flap_health_rate: probability that each composable device's hardware health flips
            (OK becomes Critical, anything else OK) at each inventory sync.
    """

    latency_s: float = 0.0
    hw_503: int = 0
    hw_drop: int = 0
    hw_drop_takes_effect: bool = True
    orphan_next: int = 0
    api_error_rate: float = 0.0
    api_error_status: int = 500
    drop_rate: float = 0.0
    flap_health_rate: float = 0.0


@dataclass
class _Device:
    device_id: str
    type: str
    model: str
    manufacturer: str
    serial: str
    health: str = "OK"
    state: str = "Enabled"
    power_state: str = "On"
    power_capability: bool = False
    holder: str | None = None  # the CPU it is connected to (the hardware's truth)
    built_in: tuple[str, ...] = ()  # nonRemovableDevices (a CPU's own parts, and their CPU)
    available: bool = True
    present: bool = True

    def body(self) -> dict[str, Any]:
        links = [{"deviceID": self.holder, "type": "CPU"}] if self.holder else []
        if self.type == "CPU":
            links = []
        body: dict[str, Any] = {
            "deviceID": self.device_id,
            "type": self.type,
            "model": self.model,
            "manufacturer": self.manufacturer,
            "serialNumber": self.serial,
            "status": {"state": self.state, "health": self.health},
            "powerState": self.power_state,
            "powerCapability": self.power_capability,
            "links": links,
        }
        if self.built_in:
            body["constraints"] = {"nonRemovableDevices": [{"deviceID": d} for d in self.built_in]}
        return body


@dataclass
class _Apply:
    apply_id: str
    procedures: list[dict[str, Any]]
    status: str = IN_PROGRESS
    started_at: str = field(default_factory=_now)
    ended_at: str | None = None
    apply_result: list[dict[str, Any]] = field(default_factory=list)
    canceled_at: str | None = None
    execute_rollback: bool | None = None
    rollback_status: str | None = None
    rollback_procedures: list[dict[str, Any]] | None = None
    rollback_result: list[dict[str, Any]] | None = None
    resume_procedures: list[dict[str, Any]] | None = None
    resume_result: list[dict[str, Any]] | None = None
    resumed_at: str | None = None
    cancel_asked: bool = False
    worker: asyncio.Task[None] | None = None

    def body(self, fields: list[str] | None = None) -> dict[str, Any]:
        """The answer of ``GET /layout-apply/{id}`` (util.create_applystatus_response)."""
        out: dict[str, Any] = {"applyID": self.apply_id, "status": self.status}
        out["startedAt"] = self.started_at
        if self.status not in (IN_PROGRESS, CANCELING) and self.ended_at:
            out["endedAt"] = self.ended_at
        if self.apply_result:
            out["applyResult"] = self.apply_result
        if self.status == CANCELING or self.canceled_at:
            out["canceledAt"] = self.canceled_at
            out["executeRollback"] = bool(self.execute_rollback)
        if self.rollback_status is not None:
            out["rollbackStatus"] = self.rollback_status
        if self.rollback_procedures:
            out["rollbackProcedures"] = self.rollback_procedures
        if self.rollback_result:
            out["rollbackResult"] = self.rollback_result
        if self.resume_procedures:
            out["resumeProcedures"] = self.resume_procedures
        if self.resume_result:
            out["resumeResult"] = self.resume_result
        if self.resumed_at:
            out["resumedAt"] = self.resumed_at
        if fields is None or "procedures" in fields:
            out["procedures"] = self.procedures
        if fields is not None:
            keep = {"applyID", "status", "startedAt", "endedAt", *fields}
            out = {k: v for k, v in out.items() if k in keep}
        return out


class CdimSimulator:
    """The CDIM simulator; ``await start()``, then ``await stop()``.

    Args:
        cpus: CPUs (hosts); each gets ``built_in`` non-removable parts (a memory and a NIC).
        gpus, fpgas, nvme, cxl: composable devices of each kind, all free at first.
        token: when set, every request needs ``Authorization: Bearer <token>`` (the Kong and
            Keycloak front of an installation), else 401.
        prefix: a gateway prefix before ``/cdim/api/v1`` (e.g. ``/gw``).
        field_names: ``oss`` (targetCPUID/targetDeviceID) or ``product``
            (sourceDeviceID/destinationDeviceID): what procedures must use.
        apply_overhead_s: seconds every non-empty apply takes besides its steps (about 1 s
            in a real installation: a process is started per apply).
        step_s: seconds each hardware call takes.
        retry_interval_s: seconds between the per-step retries of a failed hardware call.
        sync_interval_s: seconds between inventory cache syncs (None: only on ``sync()``).
    """

    def __init__(
        self,
        *,
        cpus: int = 2,
        gpus: int = 4,
        fpgas: int = 0,
        nvme: int = 0,
        cxl: int = 0,
        token: str | None = None,
        prefix: str = "",
        field_names: FieldNames = "oss",
        apply_overhead_s: float = 1.0,
        step_s: float = 0.05,
        retry_interval_s: float = 0.2,
        sync_interval_s: float | None = 600.0,
        seed: int = 0,
    ) -> None:
        if field_names not in FIELDS:
            raise ValueError(f"field_names must be oss or product, got {field_names!r}")
        self.token = token
        gateway = prefix.strip().strip("/")
        if gateway and not re.fullmatch(r"[A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*", gateway):
            raise ValueError(f"prefix {prefix!r} is not a path of letters, digits and . _ ~ -")
        self.prefix = f"/{gateway}" if gateway else ""
        self.field_names: FieldNames = field_names
        self.apply_overhead_s = apply_overhead_s
        self.step_s = step_s
        self.retry_interval_s = retry_interval_s
        self.sync_interval_s = sync_interval_s
        self.faults = CdimFaults()
        self.devices: dict[str, _Device] = {}
        self.applies: dict[str, _Apply] = {}
        self.hardware_calls: list[tuple[str, str, str]] = []  # (action, cpu, device)
        self.posts = 0
        self._rng = __import__("random").Random(seed)
        self._serial = 0
        for c in range(cpus):
            cpu = self._add("CPU", f"cpu{c:02d}", "Xeon 6", "Intel")
            memory = self._add("memory", f"cpu{c:02d}-mem", "DDR5 64GiB", "Samsung")
            nic = self._add("networkInterface", f"cpu{c:02d}-nic", "E810", "Intel")
            cpu.built_in = (memory.device_id, nic.device_id)
            memory.built_in = nic.built_in = (cpu.device_id,)
            memory.holder = nic.holder = cpu.device_id
        for kind, count, model, maker in (
            ("GPU", gpus, "A100", "NVIDIA"),
            ("FPGA", fpgas, "Alveo U55C", "AMD"),
            ("storage", nvme, "PM1733", "Samsung"),
            ("memory", cxl, "CXL 256GiB", "Samsung"),
        ):
            for i in range(count):
                self._add(kind, f"{kind.lower()}{i:02d}", model, maker)
        self._cache: dict[str, dict[str, Any]] = {}
        self.syncs = 0
        self.sync()
        self._runner: web.AppRunner | None = None
        self._sync_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def _add(self, kind: str, stem: str, model: str, maker: str) -> _Device:
        self._serial += 1
        device_id = f"{stem}-{self._rng.getrandbits(32):08x}"
        device = _Device(device_id, kind, model, maker, f"SN{self._serial:06d}")
        self.devices[device_id] = device
        return device

    # ----- the hardware, seen from tests ----------------------------------------------------

    def cpu_ids(self) -> list[str]:
        """The CPUs' deviceIDs (the node ids), in creation order."""
        return [d.device_id for d in self.devices.values() if d.type == "CPU"]

    def composable_ids(self) -> list[str]:
        """The deviceIDs of the composable devices (no CPU, no built-in part)."""
        return [d.device_id for d in self.devices.values() if d.type != "CPU" and not d.built_in]

    def holder(self, device_id: str) -> str | None:
        """The CPU ``device_id`` is connected to now (the hardware, not the cache)."""
        return self.devices[device_id].holder

    def connect_out_of_band(self, device_id: str, cpu: str) -> None:
        """Another client connects ``device_id`` to ``cpu`` (the cache learns at the next sync)."""
        self.devices[device_id].holder = cpu

    def remove(self, device_id: str) -> None:
        """The device leaves the hardware; the cache keeps it with ``detected: false``."""
        self.devices[device_id].present = False

    def set_health(self, device_id: str, health: str) -> None:
        """Set a device's ``status.health`` on the hardware."""
        self.devices[device_id].health = health

    def sync(self) -> None:
        """Refresh the inventory cache from the hardware now (the sync tick)."""
        rate = self.faults.flap_health_rate
        if rate:
            for device in self.devices.values():
                if device.type != "CPU" and not device.built_in and self._rng.random() < rate:
                    device.health = "Critical" if device.health == "OK" else "OK"
        cache = {}
        for device in self.devices.values():
            cache[device.device_id] = {
                "device": device.body(),
                "annotation": {"available": device.available},
                "resourceGroupIDs": ["00000000-0000-7000-8000-000000000000"],
                "nodeIDs": [device.holder]
                if device.holder
                else ([device.device_id] if device.type == "CPU" else []),
                "detected": device.present,
            }
        self._cache = cache
        self.syncs += 1

    # ----- server -----------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        """The aiohttp application (for tests that run it themselves)."""
        app = web.Application(middlewares=[self._middleware])
        base = self.prefix + BASE
        app.router.add_get(base + "/resources", self._resources)
        app.router.add_get(base + "/resources/{id}", self._resource)
        app.router.add_get(base + "/nodes", self._nodes)
        app.router.add_post(base + "/layout-apply", self._post_apply)
        app.router.add_get(base + "/layout-apply", self._list_applies)
        app.router.add_get(base + "/layout-apply/{id}", self._get_apply)
        app.router.add_put(base + "/layout-apply/{id}", self._put_apply)
        app.router.add_delete(base + "/layout-apply/{id}", self._delete_apply)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0: any free port); returns the origin, e.g.
        ``http://127.0.0.1:PORT``.

        Raises:
            RuntimeError: already started.
            OSError: the address cannot be bound.
        """
        if self._runner is not None:
            raise RuntimeError("the simulator is already running")
        runner = web.AppRunner(self.make_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        if self.sync_interval_s is not None:
            self._sync_task = asyncio.create_task(self._sync_loop())
        bound_host, bound_port = runner.addresses[0][:2]
        host_part = f"[{bound_host}]" if ":" in bound_host else bound_host
        return f"http://{host_part}:{bound_port}"

    async def stop(self) -> None:
        """Stop serving, and every worker. Safe to call twice."""
        for task in [self._sync_task, *self._tasks]:
            if task is not None:
                task.cancel()
        for task in [self._sync_task, *self._tasks]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._sync_task = None
        self._tasks.clear()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _sync_loop(self) -> None:
        assert self.sync_interval_s is not None
        while True:
            await asyncio.sleep(self.sync_interval_s)
            self.sync()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        faults = self.faults
        if faults.latency_s > 0:
            await asyncio.sleep(faults.latency_s)
        if faults.drop_rate and self._rng.random() < faults.drop_rate:
            if request.transport is not None:
                request.transport.close()
            raise web.HTTPInternalServerError()
        if faults.api_error_rate and self._rng.random() < faults.api_error_rate:
            return _error(faults.api_error_status, "E40019", "Query execution failed (simulated)")
        if self.token is not None and request.headers.get("Authorization") != (
            f"Bearer {self.token}"
        ):
            # The gateway (Kong with Keycloak) refuses before the service sees it.
            return web.json_response({"message": "Unauthorized"}, status=401)
        try:
            return await handler(request)  # type: ignore[no-any-return]
        except web.HTTPNotFound:
            return web.json_response({"message": "no Route matched with those values"}, status=404)
        except web.HTTPMethodNotAllowed:
            return web.json_response({"detail": "Method Not Allowed"}, status=405)

    # ----- configuration-manager ------------------------------------------------------------

    def _detail(self, request: web.Request) -> bool | web.Response:
        raw = request.query.get("detail", "false")
        if raw not in ("true", "false"):
            # getBoolQueryParam: strconv.ParseBool fails -> 400 with the status's body.
            return web.json_response(
                {"code": "E40001", "message": "Bad Request", "details": "getBoolQueryParam error"},
                status=400,
            )
        return raw == "true"

    def _resource_body(self, entry: Mapping[str, Any], detail: bool) -> dict[str, Any]:
        if detail:
            return dict(entry)
        device = entry["device"]
        short = {k: device[k] for k in ("deviceID", "type", "status") if k in device}
        return {**entry, "device": short}

    async def _resources(self, request: web.Request) -> web.Response:
        detail = self._detail(request)
        if isinstance(detail, web.Response):
            return detail
        items = [self._resource_body(e, detail) for e in self._cache.values()]
        return web.json_response({"count": len(items), "resources": items})

    async def _resource(self, request: web.Request) -> web.Response:
        entry = self._cache.get(request.match_info["id"])
        if entry is None:
            return web.json_response(
                {"code": "E40400", "message": "Not Found", "details": "resource not found"},
                status=404,
            )
        return web.json_response(entry)

    async def _nodes(self, request: web.Request) -> web.Response:
        nodes = []
        for device_id, entry in self._cache.items():
            if entry["device"]["type"] != "CPU":
                continue
            members = [
                {k: v for k, v in e.items() if k != "nodeIDs"}
                for e in self._cache.values()
                if device_id in e["nodeIDs"]
            ]
            nodes.append({"id": device_id, "resources": members})
        return web.json_response({"count": len(nodes), "nodes": nodes})

    # ----- layout-apply -----------------------------------------------------------------------

    def _blocking(self) -> web.Response | None:
        """DbAccess._is_running_data: one apply at a time in the whole installation."""
        for apply in self.applies.values():
            if apply.status in (IN_PROGRESS, CANCELING) or apply.rollback_status == IN_PROGRESS:
                return _error(409, "E40010", "Already running. Cannot start multiple instances.")
        for apply in self.applies.values():
            if SUSPENDED in (apply.status, apply.rollback_status):
                return _error(
                    409,
                    "E40027",
                    f"Suspended data exist. Please resume layoutapply. applyID: {apply.apply_id}",
                )
        return None

    def _schema_problem(self, body: Any) -> str | None:
        """The layout-apply procedure schema (schema.py ``procedure``)."""
        # server.ProcedureList, a pydantic model: other keys are ignored, as pydantic does.
        if not isinstance(body, dict) or "procedures" not in body:
            return "'procedures' is a required property"
        procedures = body["procedures"]
        if not isinstance(procedures, list):
            return f"{json.dumps(procedures)} is not of type 'array'"
        cpu_field, device_field = FIELDS[self.field_names]
        for item in procedures:
            if not isinstance(item, dict):
                return f"{json.dumps(item)} is not of type 'object'"
            for key in ("operationID", "operation", "dependencies"):
                if key not in item:
                    return f"'{key}' is a required property"
            if not isinstance(item["operationID"], int) or isinstance(item["operationID"], bool):
                return f"{json.dumps(item['operationID'])} is not of type 'integer'"
            if item["operation"] not in OPERATIONS:
                return f"{json.dumps(item['operation'])} is not one of {list(OPERATIONS)}"
            deps = item["dependencies"]
            if not isinstance(deps, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in deps
            ):
                return f"{json.dumps(deps)} is not of type 'array' of 'integer'"
            if item["operation"] in ("connect", "disconnect"):
                for key in (cpu_field, device_field):
                    value = item.get(key)
                    if key not in item:
                        return f"'{key}' is a required property"
                    if not isinstance(value, str) or not value:
                        return f"{json.dumps(value)} is too short"
        return None

    async def _post_apply(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, RecursionError):  # bad JSON, bad UTF-8, too deep, too long a number
            return _error(400, "E40001", "Expecting value: request body is not JSON")
        problem = self._schema_problem(body)
        if problem is not None:
            return _error(400, "E40001", f"Unexpected strings {problem}")
        blocked = self._blocking()
        if blocked is not None:
            return blocked
        self.posts += 1
        apply_id = secrets.token_hex(5)
        while apply_id in self.applies:
            apply_id = secrets.token_hex(5)
        procedures = body["procedures"]
        apply = self.applies[apply_id] = _Apply(apply_id, procedures)
        if not procedures:
            apply.status, apply.ended_at = COMPLETED, apply.started_at
        elif self.faults.orphan_next > 0:
            self.faults.orphan_next -= 1  # registered; its worker was killed
        else:
            self._spawn(apply, self._run(apply, procedures, rollback=False))
        return web.json_response({"applyID": apply_id}, status=202)

    def _spawn(self, apply: _Apply, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work)
        apply.worker = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self, apply: _Apply, procedures: list[dict[str, Any]], *, rollback: bool
    ) -> None:
        """Run ``procedures`` in dependency order (main.py): independent steps at once, a
        step only after every step it depends on completed; stop at a failure, a suspension or
        a cancel, and record the outcome."""
        await asyncio.sleep(self.apply_overhead_s)
        results = apply.rollback_result if rollback else apply.apply_result
        assert results is not None
        done: set[int] = set()
        failed = suspended = False
        pending = list(procedures)
        while pending and not failed and not suspended and not apply.cancel_asked:
            ready = [p for p in pending if set(p["dependencies"]) <= done]
            if not ready:
                break  # dependencies that never complete: the rest is not run
            outcomes = await asyncio.gather(*(self._step(p) for p in ready))
            for procedure, (detail, suspend) in zip(ready, outcomes, strict=True):
                pending.remove(procedure)
                results.append(detail)
                if detail["status"] == COMPLETED:
                    done.add(procedure["operationID"])
                else:
                    failed = failed or not suspend
                    suspended = suspended or suspend
        ended = _now()
        if rollback:
            apply.rollback_status = SUSPENDED if suspended else FAILED if failed else COMPLETED
            return
        if apply.cancel_asked:
            apply.status, apply.ended_at = CANCELED, ended
            executed = [r["operationID"] for r in results if r["status"] == COMPLETED]
            if apply.execute_rollback:
                apply.rollback_procedures = self._inverse(procedures, executed)
                apply.rollback_status, apply.rollback_result = IN_PROGRESS, []
                await self._run(apply, apply.rollback_procedures, rollback=True)
            return
        if suspended:
            apply.status = SUSPENDED
            finished = {r["operationID"] for r in results if r["status"] == COMPLETED}
            apply.resume_procedures = [p for p in procedures if p["operationID"] not in finished]
        else:
            apply.status = FAILED if failed else COMPLETED
        apply.ended_at = ended

    def _inverse(
        self, procedures: list[dict[str, Any]], executed: list[int]
    ) -> list[dict[str, Any]]:
        """main._create_rollback_proc: the executed connects and disconnects, undone."""
        flip = {"connect": "disconnect", "disconnect": "connect"}
        out = []
        for i, procedure in enumerate(p for p in procedures if p["operationID"] in executed):
            if procedure["operation"] in flip:
                out.append(
                    {**procedure, "operationID": i + 1, "operation": flip[procedure["operation"]]}
                )
                out[-1]["dependencies"] = []
        return out

    async def _step(self, procedure: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """One procedure as the hardware control call of apiclient.py, with its retries.

        Returns:
            (the step's applyResult entry, True when the apply must be suspended).
        """
        started = _now()
        operation = procedure["operation"]
        cpu_field, device_field = FIELDS[self.field_names]
        cpu = str(procedure.get(cpu_field, ""))
        device = str(procedure.get(device_field, ""))
        detail: dict[str, Any] = {
            "operationID": procedure["operationID"],
            "startedAt": started,
        }
        if operation not in ("connect", "disconnect"):
            await asyncio.sleep(self.step_s)
            detail.update(status=COMPLETED, statusCode=200, responseBody={}, endedAt=_now())
            return detail, False
        detail.update(
            uri=f"http://hw-control:48889/cdim/api/v1/cpu/{cpu}/aggregations",
            method="PUT",
            requestBody={"action": operation, "deviceID": device},
        )
        retries = 2
        while True:
            await asyncio.sleep(self.step_s)
            code, body, dropped = self._hardware(operation, cpu, device)
            if code == 200:
                detail.update(status=COMPLETED, statusCode=code, responseBody=body, endedAt=_now())
                return detail, False
            if dropped:
                # apiclient: a connection error is not retried; the step fails (E40007).
                detail.update(status=FAILED, statusCode=500, responseBody=body, endedAt=_now())
                return detail, False
            if retries == 0:
                detail.update(status=FAILED, statusCode=code, responseBody=body, endedAt=_now())
                return detail, True  # SuspendProcessException
            retries -= 1
            await asyncio.sleep(self.retry_interval_s)

    def _hardware(self, operation: str, cpu: str, device_id: str) -> tuple[int, Any, bool]:
        """The hardware control API's answer to one connect or disconnect."""
        self.hardware_calls.append((operation, cpu, device_id))
        faults = self.faults
        if faults.hw_503 > 0:
            faults.hw_503 -= 1
            return 503, {"code": RETRY_CODES[0], "message": "Service Unavailable"}, False
        device = self.devices.get(device_id)
        cpu_device = self.devices.get(cpu)
        if faults.hw_drop > 0:
            faults.hw_drop -= 1
            if faults.hw_drop_takes_effect and device is not None and cpu_device is not None:
                device.holder = cpu if operation == "connect" else None
            return (
                500,
                {
                    "code": "E40007",
                    "message": "Connection error occurred. Please check if the URL is correct.",
                },
                True,
            )
        if device is None or not device.present or cpu_device is None or cpu_device.type != "CPU":
            return 404, {"code": "ER005BAS404", "message": "device not found"}, False
        if device.built_in:
            return 400, {"code": "ER005BAS400", "message": "device is not removable"}, False
        if operation == "connect":
            if device.holder not in (None, cpu):
                return 409, {"code": "ER005BAS409", "message": "device is in use"}, False
            device.holder = cpu
        elif device.holder == cpu:
            device.holder = None
        elif device.holder is not None:
            return 409, {"code": "ER005BAS409", "message": "device is in use by another CPU"}, False
        return 200, {"deviceID": device_id}, False

    async def _get_apply(self, request: web.Request) -> web.Response:
        apply_id = request.match_info["id"]
        if not _APPLY_ID.match(apply_id):
            return _error(400, "E40001", f"'{apply_id}' does not match '^[0-9a-f]+$'")
        fields = _fields(request)
        if isinstance(fields, web.Response):
            return fields
        apply = self.applies.get(apply_id)
        if apply is None:
            return _error(404, "E40020", f"Specified {apply_id} is not found.")
        return web.json_response(apply.body(fields))

    async def _list_applies(self, request: web.Request) -> web.Response:
        # A repeated option: FastAPI reads a scalar query parameter as its last value
        # (starlette's QueryParams, a dict of the last value of each name).
        query = {name: request.query.getall(name)[-1] for name in request.query}
        status = query.get("status")
        if status is not None and status not in STATUSES:
            return _error(400, "E40001", f"'{status}' is not one of {list(STATUSES)}")
        fields = _fields(request)
        if isinstance(fields, web.Response):
            return fields
        sort_by = query.get("sortBy", "startedAt")
        if sort_by not in ("startedAt", "endedAt"):
            return _error(400, "E40001", f"'{sort_by}' is not one of ['startedAt', 'endedAt']")
        order_by = query.get("orderBy", "desc")
        if order_by not in ("asc", "desc"):
            return _error(400, "E40001", f"'{order_by}' is not one of ['asc', 'desc']")
        limit = _whole(query.get("limit", "20"), "limit", minimum=1)
        if isinstance(limit, web.Response):
            return limit
        offset = _whole(query.get("offset", "0"), "offset", minimum=0)
        if isinstance(offset, web.Response):
            return offset
        bounds: list[tuple[str, bool, datetime]] = []  # (attribute, since, moment)
        for name, attribute in (("startedAt", "started_at"), ("endedAt", "ended_at")):
            for suffix in ("Since", "Until"):
                value = query.get(name + suffix)
                if value is None:
                    continue
                moment = _moment(value)
                if isinstance(moment, web.Response):
                    return moment
                bounds.append((attribute, suffix == "Since", moment))

        def matches(apply: _Apply) -> bool:
            if status is not None and apply.status != status:
                return False
            for attribute, since, moment in bounds:
                value = getattr(apply, attribute)
                if value is None:
                    return False
                when = _parse_now(value)
                if (when < moment) if since else (when > moment):
                    return False
            return True

        found = [a for a in self.applies.values() if matches(a)]
        column = "started_at" if sort_by == "startedAt" else "ended_at"
        known = sorted(
            (a for a in found if getattr(a, column) is not None),
            key=lambda a: _parse_now(getattr(a, column)),
            reverse=order_by == "desc",
        )
        unknown = [a for a in found if getattr(a, column) is None]
        ordered = unknown + known if order_by == "desc" else known + unknown
        items = [a.body(fields) for a in ordered[offset : offset + limit]]
        return web.json_response(
            {"totalCount": len(found), "count": len(items), "applyResults": items}
        )

    async def _put_apply(self, request: web.Request) -> web.Response:
        apply_id = request.match_info["id"]
        if not _APPLY_ID.match(apply_id):
            return _error(400, "E40001", f"'{apply_id}' does not match '^[0-9a-f]+$'")
        action = request.query.get("action")
        if action not in ("cancel", "resume"):
            return _error(400, "E40001", f"'{action}' is not one of ['cancel', 'resume']")
        apply = self.applies.get(apply_id)
        if apply is None:
            return _error(404, "E40020", f"Specified {apply_id} is not found.")
        if action == "cancel":
            return self._cancel(apply, request.query.get("rollbackOnCancel") == "true")
        return self._resume(apply)

    def _cancel(self, apply: _Apply, rollback: bool) -> web.Response:
        """server._cancel_layoutapply and DbAccess.proc_cancel."""
        status = apply.status
        if status == IN_PROGRESS and (apply.worker is None or apply.worker.done()):
            apply.status, apply.ended_at = FAILED, _now()
            return _error(
                409,
                "E40028",
                "Since the process does not exist, the status has been changed to FAILED.",
                status=FAILED,
            )
        if status == IN_PROGRESS:
            apply.status, apply.cancel_asked = CANCELING, True
            apply.canceled_at, apply.execute_rollback = _now(), rollback
            return web.json_response({"status": CANCELING}, status=202)
        if status == SUSPENDED:
            apply.status, apply.canceled_at, apply.ended_at = CANCELED, _now(), _now()
            apply.execute_rollback = rollback
            if rollback:
                executed = [
                    r["operationID"] for r in apply.apply_result if r["status"] == COMPLETED
                ]
                apply.rollback_procedures = self._inverse(apply.procedures, executed)
                apply.rollback_status, apply.rollback_result = IN_PROGRESS, []
                self._spawn(apply, self._run(apply, apply.rollback_procedures, rollback=True))
            return web.json_response({"status": CANCELED}, status=202)
        if status in (CANCELING, CANCELED) and apply.rollback_status is None:
            return web.json_response({"status": status}, status=200)
        if apply.rollback_status in (COMPLETED, FAILED):
            return web.json_response(
                {"status": status, "rollbackStatus": apply.rollback_status}, status=200
            )
        return _error(409, "E40022", "This layoutapply has already executed.")

    def _resume(self, apply: _Apply) -> web.Response:
        """server._resume_layoutapply."""
        if apply.status == SUSPENDED:
            remaining = apply.resume_procedures or []
            apply.status, apply.resumed_at, apply.resume_result = IN_PROGRESS, _now(), []
            self._spawn(apply, self._resume_run(apply, remaining))
            return web.json_response({"status": IN_PROGRESS}, status=202)
        if apply.status == CANCELED and apply.rollback_status in (COMPLETED, FAILED):
            return web.json_response(
                {"status": apply.status, "rollbackStatus": apply.rollback_status}, status=200
            )
        if apply.status in (COMPLETED, FAILED) or (
            apply.status == CANCELED and apply.rollback_status is None
        ):
            return web.json_response({"status": apply.status}, status=200)
        return _error(409, "E40022", "This layoutapply has already executed.")

    async def _resume_run(self, apply: _Apply, procedures: list[dict[str, Any]]) -> None:
        before = list(apply.apply_result)
        apply.apply_result = []
        await self._run(apply, procedures, rollback=False)
        apply.resume_result, apply.apply_result = apply.apply_result, before + apply.apply_result

    async def _delete_apply(self, request: web.Request) -> web.Response:
        apply_id = request.match_info["id"]
        if not _APPLY_ID.match(apply_id):
            return _error(400, "E40001", f"'{apply_id}' does not match '^[0-9a-f]+$'")
        apply = self.applies.get(apply_id)
        if apply is None:
            return _error(404, "E40020", f"Specified {apply_id} is not found.")
        if apply.status in (IN_PROGRESS, CANCELING, SUSPENDED) or apply.rollback_status in (
            IN_PROGRESS,
            SUSPENDED,
        ):
            return _error(
                409,
                "E40024",
                "Apply ID cannot be deleted because it is currently being running. "
                "Try later again.",
            )
        del self.applies[apply_id]
        return web.Response(status=204)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8100, show_default=True, type=click.IntRange(0, 65535))
@click.option("--cpus", default=4, show_default=True, type=click.IntRange(0, 10_000))
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(0, 100_000))
@click.option("--fpgas", default=0, show_default=True, type=click.IntRange(0, 100_000))
@click.option("--nvme", default=0, show_default=True, type=click.IntRange(0, 100_000))
@click.option("--cxl", default=0, show_default=True, type=click.IntRange(0, 100_000))
@click.option("--token-file", type=click.Path(dir_okay=False, exists=True), help="Bearer token.")
@click.option("--prefix", default="", help="A gateway prefix before /cdim/api/v1.")
@click.option(
    "--field-names",
    type=click.Choice(["oss", "product"]),
    default="oss",
    show_default=True,
    help="Procedure fields: targetCPUID/targetDeviceID (oss) or "
    "sourceDeviceID/destinationDeviceID (product).",
)
@click.option(
    "--apply-seconds",
    default=1.0,
    show_default=True,
    type=FiniteFloatRange(0, 600),
    help="Seconds every apply takes besides its steps.",
)
@click.option(
    "--step-seconds",
    default=0.05,
    show_default=True,
    type=FiniteFloatRange(0, 600),
    help="Seconds each hardware call takes.",
)
@click.option(
    "--sync-seconds",
    default=600.0,
    show_default=True,
    type=FiniteFloatRange(0.1, MAX_SECONDS),
    help="Seconds between inventory cache syncs.",
)
def cli(
    host: str,
    port: int,
    cpus: int,
    gpus: int,
    fpgas: int,
    nvme: int,
    cxl: int,
    token_file: str | None,
    prefix: str,
    field_names: FieldNames,
    apply_seconds: float,
    step_seconds: float,
    sync_seconds: float,
) -> None:
    """Serve a NEC CDIM simulator: configuration-manager's inventory and layout-apply."""
    from pathlib import Path

    from fabric_dra_sim.listen import listen

    token = Path(token_file).read_text().strip() if token_file else None
    if token_file and not token:
        raise click.BadParameter(f"{token_file!r} is empty", param_hint="--token-file")
    if not math.isfinite(apply_seconds) or not math.isfinite(step_seconds):
        raise click.BadParameter("must be a finite number of seconds", param_hint="--apply-seconds")
    try:
        sim = CdimSimulator(
            cpus=cpus,
            gpus=gpus,
            fpgas=fpgas,
            nvme=nvme,
            cxl=cxl,
            token=token,
            prefix=prefix,
            field_names=field_names,
            apply_overhead_s=apply_seconds,
            step_s=step_seconds,
            sync_interval_s=sync_seconds,
        )
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--prefix") from None

    async def serve() -> None:
        url = await listen(sim.start(host, port), host, port)
        click.echo(f"CDIM simulator at {url}{sim.prefix}{BASE} (CPUs: {', '.join(sim.cpu_ids())})")
        try:
            await asyncio.Event().wait()
        finally:
            await sim.stop()

    with contextlib.suppress(KeyboardInterrupt):
        aio.run(serve())
