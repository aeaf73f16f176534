"""The admin HTTP app: health, readiness, metrics, the JSON API, operator actions, a dashboard.

:func:`make_app` builds the aiohttp application from an :class:`AdminContext`; nothing happens
at import time. Every route is declared once in :func:`routes` and both the router and the
OpenAPI document (``/api/v1/openapi.json``) are made from that table.

Around every handler:

* errors are JSON ``{"error": {"code", "message"}}``; an unexpected exception is logged with a
  request id and answered 500 with that id and nothing else;
* the bearer token is checked with :func:`hmac.compare_digest` for actions (always) and for
  reads when ``require_token_for_reads``; health, readiness, metrics and the OpenAPI document
  stay open for probes and scrapers;
* query parameters are validated from their declarations (unknown ones are refused, so a typo
  is not silently ignored); POST bodies must be JSON and at most ``max_request_bytes``;
* every answer carries ``X-Content-Type-Options: nosniff``, a Content-Security-Policy (the
  dashboard's allows only its own nonce-tagged inline style) and ``Cache-Control: no-store``.
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import logging
import re
import secrets
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.admin import queries
from app.admin.context import AdminContext, Check
from app.admin.dashboard import dashboard_model
from app.admin.openapi import ACTION, OPEN, READ, Param, Route, document
from app.fabric.types import DeviceType, Health
from app.journal import STATES
from app.pools import PoolConfig

log = logging.getLogger(__name__)

API = "/api/v1"
TEMPLATES = Path(__file__).parent / "templates"
REFRESH_SECONDS = 10
MAX_REASON = 255
MAX_OFFSET = 2**31 - 1
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
TEXT = r"^[^\u0000-\u001f\u007f]+$"
"""Free text in parameters: no control characters (PostgreSQL refuses NUL in strings)."""
CLAIM = r"^[^/\u0000-\u001f\u007f]+/[^/\u0000-\u001f\u007f]+$"
JSON_TYPES = ("application/json",)
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
HANDLER_ARGS: dict[str, Any] = {"max_line_size": 65536}
"""Arguments of the app's request handlers, whichever runner serves it. The longest request
line the API documents as valid (every string filter at its maximum length, percent-encoded
UTF-8) is about 20 KiB; aiohttp's default of 8 KiB would answer such a request with a plain-text
400 of its own, before this app sees it."""

CONTEXT = web.AppKey("admin_context", AdminContext)
POOL_CONFIG = web.AppKey("admin_pool_config", PoolConfig)
TEMPLATE_ENV = web.AppKey("admin_templates", jinja2.Environment)
OPENAPI = web.AppKey("admin_openapi", dict)


class ApiError(Exception):
    """An error answer: HTTP status, a message for people, optional extra headers."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass(frozen=True, slots=True)
class Call:
    """What a handler gets: the request, the context, validated query values and JSON body."""

    request: web.Request
    context: AdminContext
    pool_config: PoolConfig
    query: Mapping[str, Any]
    body: Any = None


def json_answer(data: Any, status: int = 200) -> web.Response:
    """A JSON answer (values that are not JSON types are written as strings)."""
    return web.Response(
        text=json.dumps(data, default=str), status=status, content_type="application/json"
    )


def error_answer(
    status: int,
    message: str,
    request_id: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """The JSON error answer every failure gets."""
    error: dict[str, Any] = {"code": status, "message": message}
    if request_id:
        error["request_id"] = request_id
    response = json_answer({"error": error}, status)
    response.headers.update(headers or {})
    return response


# --------------------------------------------------------------------------- middleware
def _http_message(request: web.Request, exc: web.HTTPException, limit: int) -> str:
    if isinstance(exc, web.HTTPNotFound):
        return f"no route {request.method} {request.path}"
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return (
            f"method {request.method} is not allowed on {request.path}; allowed: "
            f"{', '.join(sorted(exc.allowed_methods))}"
        )
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return f"request body larger than {limit} bytes"
    return exc.reason


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    request_id = uuid.uuid4().hex[:16]
    try:
        response = await handler(request)
    except ApiError as err:
        response = error_answer(err.status, err.message, headers=err.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "WWW-Authenticate")}
        limit = request.app[CONTEXT].max_request_bytes
        response = error_answer(exc.status, _http_message(request, exc, limit), headers=headers)
    except Exception:
        log.exception(
            "admin request %s %s failed (request id %s)", request.method, request.path, request_id
        )
        response = error_answer(
            500,
            f"internal error (request id {request_id}); the service log has the details",
            request_id,
        )
    response.headers["X-Request-Id"] = request_id
    return response


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    headers = response.headers
    headers["X-Content-Type-Options"] = "nosniff"
    headers["X-Frame-Options"] = "DENY"
    headers["Referrer-Policy"] = "no-referrer"
    headers.setdefault("Content-Security-Policy", API_CSP)
    headers["Cache-Control"] = "no-store"


# --------------------------------------------------------------------------- checks
def _authorize(request: web.Request, context: AdminContext, access: str) -> None:
    if access == OPEN or (access == READ and not context.require_token_for_reads):
        return
    if context.token is None:
        what = "admin actions are" if access == ACTION else "the admin API is"
        raise ApiError(403, f"{what} disabled: no token is configured (admin.token_file)")
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise ApiError(
            401,
            "a bearer token is required (Authorization: Bearer <token>)",
            {"WWW-Authenticate": 'Bearer realm="fabric-dra"'},
        )
    expected = context.token.get_secret_value().encode()
    if not hmac.compare_digest(presented.strip().encode(), expected):
        log.warning("admin request %s %s refused: wrong token", request.method, request.path)
        raise ApiError(403, "the bearer token is not valid")


def _parse_param(param: Param, raw: str) -> Any:
    where = f"parameter {param.name!r}"
    if param.kind == "integer":
        if not re.fullmatch(r"[+-]?\d{1,12}", raw):
            raise ApiError(400, f"{where}: an integer is expected, got {raw[:40]!r}")
        value = int(raw)
        if param.minimum is not None and value < param.minimum:
            raise ApiError(400, f"{where}: at least {param.minimum}, got {value}")
        if param.maximum is not None and value > param.maximum:
            raise ApiError(400, f"{where}: at most {param.maximum}, got {value}")
        return value
    if param.enum and raw not in param.enum:
        raise ApiError(400, f"{where}: one of {', '.join(param.enum)}; got {raw[:40]!r}")
    if param.max_length is not None and len(raw) > param.max_length:
        raise ApiError(400, f"{where}: at most {param.max_length} characters")
    if not raw:
        raise ApiError(400, f"{where}: empty")
    if param.pattern is not None and not re.fullmatch(param.pattern, raw):
        if param.pattern == TEXT:
            raise ApiError(400, f"{where}: control characters are not allowed")
        raise ApiError(400, f"{where}: {raw[:80]!r} does not match {param.pattern}")
    return raw


def _query(request: web.Request, route: Route) -> dict[str, Any]:
    declared = {p.name: p for p in route.params}
    values: dict[str, Any] = {}
    for name in request.query:
        param = declared.get(name)
        if param is None or param.where != "query":
            known = ", ".join(p.name for p in route.params if p.where == "query") or "none"
            raise ApiError(400, f"unknown parameter {name!r}; known: {known}")
        if len(request.query.getall(name)) > 1:
            raise ApiError(400, f"parameter {name!r} is given more than once")
    for param in route.params:
        if param.where == "path":
            values[param.name] = _parse_param(param, request.match_info[param.name])
        elif param.name in request.query:
            values[param.name] = _parse_param(param, request.query[param.name])
        else:
            values[param.name] = param.default
    return values


async def _body(request: web.Request, context: AdminContext, route: Route) -> Any:
    limit = context.max_request_bytes
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"request body larger than {limit} bytes")
    if not request.body_exists:
        if route.body is not None and route.body_required:
            raise ApiError(400, "a JSON body is required")
        return None
    if request.content_type not in JSON_TYPES:
        raise ApiError(
            415, f"the body must be application/json, not {request.content_type or 'unspecified'}"
        )
    raw = await request.read()  # bounded by client_max_size: 413 past it
    if not raw:
        if route.body is not None and route.body_required:
            raise ApiError(400, "a JSON body is required")
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ApiError(400, f"the body is not valid JSON: {err}") from err


def _endpoint(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        context = request.app[CONTEXT]
        _authorize(request, context, route.access)
        query = _query(request, route)
        body = await _body(request, context, route) if route.method == "POST" else None
        call = Call(request, context, request.app[POOL_CONFIG], query, body)
        response: web.StreamResponse = await route.handler(call)
        return response

    handle.__name__ = route.operation_id
    return handle


def _paging(call: Call) -> tuple[int, int, str | None]:
    offset = call.query["offset"]
    token = call.query["continue"]
    if token is not None and offset:
        raise ApiError(400, "give either 'offset' or 'continue', not both")
    return call.query["limit"], offset or 0, token


# --------------------------------------------------------------------------- handlers
def _checks_json(checks: list[Check]) -> list[dict[str, Any]]:
    return [{"name": c.name, "ok": c.ok, "message": c.message} for c in checks]


async def health(call: Call) -> web.Response:
    """Liveness: 200 while every check passes, else 503 with the failing ones."""
    try:
        checks = call.context.health()
    except Exception as err:
        log.exception("health checks failed")
        checks = [Check("health", False, f"checks could not run: {type(err).__name__}")]
    failing = [c for c in checks if not c.ok]
    if failing:
        return json_answer({"status": "failing", "checks": _checks_json(failing)}, 503)
    return json_answer({"status": "ok"})


async def ready(call: Call) -> web.Response:
    """Readiness: every check listed; 503 when one fails."""
    try:
        checks = await call.context.readiness()
    except Exception as err:
        log.exception("readiness checks failed")
        checks = [Check("readiness", False, f"checks could not run: {type(err).__name__}")]
    ok = all(c.ok for c in checks)
    return json_answer(
        {"status": "ready" if ok else "not ready", "checks": _checks_json(checks)},
        200 if ok else 503,
    )


async def metrics(call: Call) -> web.Response:
    """Prometheus text exposition of the context's registry."""
    response = web.Response(body=generate_latest(call.context.registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def status(call: Call) -> web.Response:
    """The live summary and the database's counts."""
    service = await call.context.status()
    return json_answer(
        {
            "service": service,
            "database": await queries.counts(call.context.db),
            "attention": await queries.attention(call.context.db, call.pool_config),
        }
    )


def _publisher(context: AdminContext) -> Mapping[str, Any] | None:
    if context.publisher_status is None:
        return None
    try:
        return context.publisher_status()
    except Exception:
        log.exception("publisher status could not be read")
        return None


async def list_pools(call: Call) -> web.Response:
    """Every pool with counts, utilisation and publishing status."""
    items = await queries.pools(call.context.db, call.pool_config, _publisher(call.context))
    return json_answer({"items": items})


async def get_pool(call: Call) -> web.Response:
    """One pool with its devices and slices."""
    name = call.query["pool"]
    data = await queries.pool_detail(
        call.context.db, name, call.pool_config, _publisher(call.context)
    )
    if data is None:
        raise ApiError(404, f"pool {name!r} has no device in the inventory")
    return json_answer(data)


async def list_devices(call: Call) -> web.Response:
    """Devices, filtered and paged by name."""
    limit, offset, token = _paging(call)
    q = call.query
    filters = queries.DeviceFilter(
        pool=q["pool"],
        region=q["region"],
        rack=q["rack"],
        device_type=q["type"],
        health=q["health"],
        state=q["state"],
        q=q["q"],
    )
    try:
        page = await queries.list_devices(
            call.context.db, filters, call.pool_config, limit=limit, offset=offset, token=token
        )
    except queries.BadToken as err:
        raise ApiError(400, str(err)) from err
    return json_answer(
        {
            "items": page.items,
            "total": page.total,
            "limit": limit,
            "offset": offset,
            "continue": page.next_token,
        }
    )


async def get_device(call: Call) -> web.Response:
    """One device with its events and reservations."""
    name = call.query["name"]
    data = await queries.device_detail(call.context.db, name, call.pool_config)
    if data is None:
        raise ApiError(404, f"device {name!r} is not in the inventory")
    return json_answer(data)


async def list_reservations(call: Call) -> web.Response:
    """Reservations, newest first, filtered and paged."""
    limit, offset, token = _paging(call)
    namespace = name = None
    if call.query["claim"] is not None:
        namespace, _, name = call.query["claim"].partition("/")
    filters = queries.ReservationFilter(call.query["state"], namespace, name)
    try:
        page = await queries.list_reservations(
            call.context.db, filters, limit=limit, offset=offset, token=token
        )
    except queries.BadToken as err:
        raise ApiError(400, str(err)) from err
    return json_answer(
        {
            "items": page.items,
            "total": page.total,
            "limit": limit,
            "offset": offset,
            "continue": page.next_token,
        }
    )


async def get_claim(call: Call) -> web.Response:
    """One claim: the reconciler's view, its reservations, the fabric state, its errors."""
    namespace, name = call.query["namespace"], call.query["name"]
    view = None
    if call.context.claim_view is not None:
        view = await call.context.claim_view(namespace, name)
    stored = await queries.claim_reservations(call.context.db, namespace, name)
    claim = view.get("claim") if view else None
    if claim is None and not stored["reservations"]:
        raise ApiError(
            404,
            f"claim {namespace}/{name} is neither known to the controller nor "
            "in the reservation journal",
        )
    live_errors = [
        e if isinstance(e, dict) else {"message": str(e)}
        for e in (view.get("errors") or [] if view else [])
    ]
    return json_answer(
        {
            "namespace": namespace,
            "name": name,
            "claim": claim,
            "live": call.context.claim_view is not None,
            "reservations": stored["reservations"],
            "fabric": stored["fabric"],
            "errors": [*live_errors, *stored["errors"]],
        }
    )


async def what_if(call: Call) -> web.Response:
    """Could this claim spec be satisfied now, and where (the allocator, nothing reserved)."""
    if call.context.what_if is None:
        raise ApiError(503, "what-if needs the allocator, which is not running here")
    spec = call.body
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), dict):
        raise ApiError(
            400, "the body must be a ResourceClaim spec: an object with a 'devices' object"
        )
    for key in ("requests", "constraints", "config"):
        items = spec["devices"].get(key, [])
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ApiError(400, f"devices.{key} must be a list of objects")
    return json_answer(await call.context.what_if(spec))


async def cordon(call: Call) -> web.Response:
    """Cordon a device (optional JSON body ``{"reason": "..."}``)."""
    body = call.body if call.body is not None else {}
    if not isinstance(body, dict) or set(body) - {"reason"}:
        raise ApiError(400, "the body must be an object with at most a 'reason'")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise ApiError(400, f"'reason' must be a string of at most {MAX_REASON} characters")
    return await _act(call.context.actions.cordon(call.query["name"], reason))


async def uncordon(call: Call) -> web.Response:
    """Uncordon a device."""
    return await _act(call.context.actions.uncordon(call.query["name"]))


async def release(call: Call) -> web.Response:
    """Force-release a reservation: detach (best effort), then release."""
    reservation = await _act_value(call.context.actions.force_release(call.query["id"]))
    if reservation.get("state") == "released":
        return json_answer({"reservation": reservation, "message": "released"})
    if reservation.get("state") == "detach-failed":
        return json_answer(
            {
                "reservation": reservation,
                "message": "the detach failed for good; the reservation is "
                "detach-failed: fix it on the fabric, then forget it",
            },
            202,
        )
    return json_answer(
        {
            "reservation": reservation,
            "message": "the detach failed; the reservation stays "
            f"{reservation.get('state')} and the controller retries it",
        },
        202,
    )


async def forget(call: Call) -> web.Response:
    """Release a reservation without a detach (the hardware was fixed by hand): JSON body
    ``{"reason": "..."}``, required."""
    body = call.body
    if not isinstance(body, dict) or set(body) != {"reason"}:
        raise ApiError(
            400,
            "the body must be an object with exactly a 'reason': say what was fixed on the fabric",
        )
    reason = body["reason"]
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
        raise ApiError(
            400, f"'reason' must be a non-empty string of at most {MAX_REASON} characters"
        )
    reservation = await _act_value(call.context.actions.forget(call.query["id"], reason))
    return json_answer(
        {
            "reservation": reservation,
            "message": "released without a detach; the next inventory sync "
            "reads the device's holder from the fabric",
        }
    )


async def _act_value(action: Awaitable[Mapping[str, Any]]) -> Mapping[str, Any]:
    try:
        return await action
    except LookupError as err:
        raise ApiError(404, str(err).strip("'\"")) from err
    except ValueError as err:
        raise ApiError(409, str(err)) from err


async def _act(action: Awaitable[Mapping[str, Any]]) -> web.Response:
    return json_answer(dict(await _act_value(action)))


async def openapi(call: Call) -> web.Response:
    """This API's OpenAPI 3.1 document."""
    return json_answer(call.request.app[OPENAPI])


async def dashboard(call: Call) -> web.Response:
    """The HTML dashboard (server-rendered, refreshing itself)."""
    context = call.context
    try:
        service: dict[str, Any] | None = await context.status()
    except Exception:
        log.exception("service status could not be read for the dashboard")
        service = None
    model = dashboard_model(
        service=service,
        counts=await queries.counts(context.db),
        pools=await queries.pools(context.db, call.pool_config, _publisher(context)),
        attention=await queries.attention(context.db, call.pool_config),
        driver=context.driver_name,
        now=dt.datetime.now(dt.UTC),
    )
    nonce = secrets.token_urlsafe(16)
    template = call.request.app[TEMPLATE_ENV].get_template("dashboard.html.j2")
    html = await template.render_async(model=model, nonce=nonce, refresh=REFRESH_SECONDS)
    response = web.Response(text=html, content_type="text/html")
    response.headers["Content-Security-Policy"] = (
        f"default-src 'none'; style-src 'nonce-{nonce}'; img-src data:; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    )
    return response


# --------------------------------------------------------------------------- route table
def _paging_params() -> tuple[Param, ...]:
    return (
        Param(
            "limit",
            kind="integer",
            minimum=1,
            maximum=500,
            default=100,
            description="rows per page, 1 to 500",
        ),
        Param(
            "offset",
            kind="integer",
            minimum=0,
            maximum=MAX_OFFSET,
            description="rows to skip (not with 'continue')",
        ),
        Param(
            "continue",
            description="the token of the next page from the previous answer",
            max_length=512,
            pattern=TEXT,
        ),
    )


def _json(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def routes() -> tuple[Route, ...]:
    """Every route of the admin app (the router and the OpenAPI document are built from it)."""
    device_name = Param("name", "path", "the device name", pattern=DNS_LABEL)
    return (
        Route(
            "GET",
            "/",
            dashboard,
            "dashboard",
            "The HTML dashboard.",
            "dashboard",
            answers={200: ("The dashboard page.", None)},
            media_type="text/html",
        ),
        Route(
            "GET",
            "/healthz",
            health,
            "health",
            "Liveness checks.",
            "probes",
            OPEN,
            answers={200: ("Alive.", _json("Health")), 503: ("A check fails.", _json("Health"))},
        ),
        Route(
            "GET",
            "/readyz",
            ready,
            "readiness",
            "Readiness checks.",
            "probes",
            OPEN,
            answers={200: ("Ready.", _json("Readiness")), 503: ("Not ready.", _json("Readiness"))},
        ),
        Route(
            "GET",
            "/metrics",
            metrics,
            "metrics",
            "Prometheus metrics.",
            "probes",
            OPEN,
            answers={200: ("Prometheus text format.", None)},
            media_type=CONTENT_TYPE_LATEST,
        ),
        Route(
            "GET",
            f"{API}/openapi.json",
            openapi,
            "openapi",
            "This document.",
            "meta",
            OPEN,
            answers={200: ("The OpenAPI 3.1 document.", {"type": "object"})},
        ),
        Route(
            "GET",
            f"{API}/status",
            status,
            "get_status",
            "Live summary and inventory/reservation counts.",
            "status",
            answers={200: ("The summary.", _json("Status"))},
        ),
        Route(
            "GET",
            f"{API}/pools",
            list_pools,
            "list_pools",
            "Pools with counts, utilisation and publishing status.",
            "pools",
            answers={200: ("The pools.", _json("PoolList"))},
        ),
        Route(
            "GET",
            f"{API}/pools/{{pool:.+}}",
            get_pool,
            "get_pool",
            "One pool with its devices and slices.",
            "pools",
            params=(
                Param(
                    "pool",
                    "path",
                    "the pool name, e.g. us-east/rack-01",
                    max_length=253,
                    pattern=TEXT,
                ),
            ),
            answers={200: ("The pool.", _json("PoolDetail"))},
            errors=(400, 404),
        ),
        Route(
            "GET",
            f"{API}/devices",
            list_devices,
            "list_devices",
            "Devices, filtered and paged by name.",
            "devices",
            params=(
                Param("pool", description="pool name", max_length=253, pattern=TEXT),
                Param("region", description="region", max_length=255, pattern=TEXT),
                Param("rack", description="rack", max_length=255, pattern=TEXT),
                Param("type", description="device type", enum=tuple(t.value for t in DeviceType)),
                Param("health", description="device health", enum=tuple(h.value for h in Health)),
                Param("state", description="admin state", enum=queries.DEVICE_STATES),
                Param(
                    "q", description="substring of the name or model", max_length=255, pattern=TEXT
                ),
                *_paging_params(),
            ),
            answers={200: ("One page of devices.", _json("DeviceList"))},
            errors=(400,),
        ),
        Route(
            "GET",
            f"{API}/devices/{{name}}",
            get_device,
            "get_device",
            "One device with its events and reservations.",
            "devices",
            params=(device_name,),
            answers={200: ("The device.", _json("DeviceDetail"))},
            errors=(400, 404),
        ),
        Route(
            "POST",
            f"{API}/devices/{{name}}/cordon",
            cordon,
            "cordon_device",
            "Take a device out of the published slices.",
            "actions",
            ACTION,
            params=(device_name,),
            body=_json("CordonRequest"),
            body_required=False,
            answers={200: ("The device.", _json("Device"))},
            errors=(400, 404, 409),
        ),
        Route(
            "POST",
            f"{API}/devices/{{name}}/uncordon",
            uncordon,
            "uncordon_device",
            "Offer a cordoned device again.",
            "actions",
            ACTION,
            params=(device_name,),
            answers={200: ("The device.", _json("Device"))},
            errors=(400, 404, 409),
        ),
        Route(
            "GET",
            f"{API}/reservations",
            list_reservations,
            "list_reservations",
            "Reservations, newest first, filtered and paged.",
            "reservations",
            params=(
                Param(
                    "state", description="a reservation state, or active", enum=(*STATES, "active")
                ),
                Param(
                    "claim", description="namespace/name of a claim", pattern=CLAIM, max_length=317
                ),
                *_paging_params(),
            ),
            answers={200: ("One page of reservations.", _json("ReservationList"))},
            errors=(400,),
        ),
        Route(
            "POST",
            f"{API}/reservations/{{id}}/release",
            release,
            "release_reservation",
            "Detach (best effort) and release a reservation.",
            "actions",
            ACTION,
            params=(
                Param(
                    "id",
                    "path",
                    "the reservation id",
                    kind="integer",
                    minimum=1,
                    maximum=MAX_OFFSET,
                ),
            ),
            answers={
                200: ("Released.", _json("ReleaseAnswer")),
                202: (
                    "The detach failed; the reservation stays detaching (the "
                    "controller retries it) or is detach-failed.",
                    _json("ReleaseAnswer"),
                ),
            },
            errors=(400, 404, 409),
        ),
        Route(
            "POST",
            f"{API}/reservations/{{id}}/forget",
            forget,
            "forget_reservation",
            "Release a reservation without a detach (hardware fixed by hand); a reason "
            "is required and journalled.",
            "actions",
            ACTION,
            params=(
                Param(
                    "id",
                    "path",
                    "the reservation id",
                    kind="integer",
                    minimum=1,
                    maximum=MAX_OFFSET,
                ),
            ),
            body=_json("ForgetRequest"),
            answers={200: ("Released without a detach.", _json("ReleaseAnswer"))},
            errors=(400, 404, 409),
        ),
        Route(
            "GET",
            f"{API}/claims/{{namespace}}/{{name}}",
            get_claim,
            "get_claim",
            "One claim: live view, reservations, fabric state, errors.",
            "claims",
            params=(
                Param("namespace", "path", "the claim's namespace", pattern=DNS_LABEL),
                Param("name", "path", "the claim's name", pattern=DNS_SUBDOMAIN, max_length=253),
            ),
            answers={200: ("The claim.", _json("ClaimView"))},
            errors=(400, 404),
        ),
        Route(
            "POST",
            f"{API}/allocations/what-if",
            what_if,
            "what_if",
            "Could this claim spec be allocated now, and where.",
            "claims",
            body=_json("ClaimSpec"),
            answers={200: ("The allocator's answer.", _json("WhatIf"))},
            errors=(400, 503),
        ),
    )


def make_app(context: AdminContext) -> web.Application:
    """The admin application for ``context`` (run it with an aiohttp runner)."""
    app = web.Application(
        middlewares=[_errors], client_max_size=context.max_request_bytes, handler_args=HANDLER_ARGS
    )
    app[CONTEXT] = context
    app[POOL_CONFIG] = context.pool_config or PoolConfig(driver_name=context.driver_name)
    app[TEMPLATE_ENV] = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        enable_async=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    table = routes()
    for route in table:
        app.router.add_route(route.method, route.path, _endpoint(route))
    app[OPENAPI] = document(table, title="fabric-dra admin API", version="1")
    app.on_response_prepare.append(_security_headers)
    return app


async def serve(context: AdminContext, host: str, port: int) -> web.AppRunner:
    """Serve :func:`make_app` on ``host``:``port`` (0: any free port); call ``cleanup()`` on
    the runner to stop. The bound addresses are in ``runner.addresses``."""
    runner = web.AppRunner(make_app(context), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
