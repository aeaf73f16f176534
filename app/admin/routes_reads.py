"""The handlers of the admin app's read-only routes: probes (health, readiness), Prometheus
metrics, the state API (status, pools, devices, reservations, claims), what-if, the OpenAPI
document and the HTML dashboard. None of them changes anything; the data comes from
:mod:`app.admin.queries` and the :class:`~app.admin.context.AdminContext`.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.admin import queries
from app.admin.context import AdminContext, Check
from app.admin.dashboard import dashboard_model
from app.admin.history import charts
from app.admin.pipeline import OPENAPI, TEMPLATE_ENV, ApiError, Call, json_answer
from app.allocator import SpecError, claim_from_json

log = logging.getLogger(__name__)

REFRESH_SECONDS = 10


def _paging(call: Call) -> tuple[int, int, str | None]:
    offset = call.query["offset"]
    token = call.query["continue"]
    if token is not None and offset:
        raise ApiError(400, "give either 'offset' or 'continue', not both")
    return call.query["limit"], offset or 0, token


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


async def get_claim_devices(call: Call) -> web.Response:
    """The devices the journal reserved for one claim, by its UID (what the node plugin asks
    for a claim without ``status.devices``); 200 with an empty list when there are none."""
    uid = call.query["uid"]
    return json_answer(await queries.claim_devices(call.context.db, uid, call.pool_config))


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
    try:
        claim_from_json(spec, namespace="what-if", name="claim")
    except SpecError as err:
        raise ApiError(400, f"the claim spec cannot be read: {err}") from err
    return json_answer(await call.context.what_if(spec))


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
    now = dt.datetime.now(dt.UTC)
    pools = await queries.pools(context.db, call.pool_config, _publisher(context))
    model = dashboard_model(
        service=service,
        counts=await queries.counts(context.db),
        pools=pools,
        attention=await queries.attention(context.db, call.pool_config),
        driver=context.driver_name,
        now=now,
    )
    if context.history is not None:
        model["history"] = charts(context.history, now.timestamp(), [p["name"] for p in pools])
    nonce = secrets.token_urlsafe(16)
    template = call.request.app[TEMPLATE_ENV].get_template("dashboard.html.j2")
    html = await template.render_async(model=model, nonce=nonce, refresh=REFRESH_SECONDS)
    response = web.Response(text=html, content_type="text/html")
    response.headers["Content-Security-Policy"] = (
        f"default-src 'none'; style-src 'nonce-{nonce}'; img-src data:; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    )
    return response
