"""The admin HTTP app: health, readiness, metrics, the JSON API, operator actions, a dashboard.

:func:`make_app` builds the aiohttp application from an :class:`AdminContext`; nothing happens
at import time. Every route is declared once in :func:`routes` and both the router and the
OpenAPI document (``/api/v1/openapi.json``) are made from that table. The handlers are in
:mod:`app.admin.routes_reads` and :mod:`app.admin.routes_actions`; what happens around every
handler (JSON errors, the bearer token, parameter and body validation, security headers) is in
:mod:`app.admin.pipeline`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from app.admin import queries
from app.admin.context import AdminContext
from app.admin.openapi import ACTION, OPEN, Param, Route, document
from app.admin.pipeline import (
    CONTEXT,
    OPENAPI,
    POOL_CONFIG,
    TEMPLATE_ENV,
    TEXT,
    endpoint,
    error_middleware,
    security_headers,
)
from app.admin.routes_actions import cordon, forget, release, uncordon
from app.admin.routes_reads import (
    dashboard,
    get_claim,
    get_claim_devices,
    get_device,
    get_pool,
    health,
    list_devices,
    list_pools,
    list_reservations,
    metrics,
    openapi,
    ready,
    status,
    what_if,
)
from app.fabric.types import DeviceType, Health
from app.journal import STATES
from app.pools import PoolConfig

API = "/api/v1"
TEMPLATES = Path(__file__).parent / "templates"
MAX_OFFSET = 2**31 - 1
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CLAIM = r"^[^/\u0000-\u001f\u007f]+/[^/\u0000-\u001f\u007f]+$"
CLAIM_UID = r"^[A-Za-z0-9-]{1,64}$"
HANDLER_ARGS: dict[str, Any] = {"max_line_size": 65536}
"""Arguments of the app's request handlers, whichever runner serves it. The longest request
line the API documents as valid (every string filter at its maximum length, percent-encoded
UTF-8) is about 20 KiB; aiohttp's default of 8 KiB would answer such a request with a plain-text
400 of its own, before this app sees it."""


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
    reservation_id = Param(
        "id", "path", "the reservation id", kind="integer", minimum=1, maximum=MAX_OFFSET
    )
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
            params=(reservation_id,),
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
            params=(reservation_id,),
            body=_json("ForgetRequest"),
            answers={200: ("Released without a detach.", _json("ReleaseAnswer"))},
            errors=(400, 404, 409),
        ),
        # Its own prefix: under claims/ it would clash with claims/{namespace}/{name}.
        Route(
            "GET",
            f"{API}/claim-devices/{{uid}}",
            get_claim_devices,
            "get_claim_devices",
            "The devices the journal reserved for a claim, by its UID (empty when none).",
            "claims",
            params=(
                Param("uid", "path", "the claim's metadata.uid", max_length=64, pattern=CLAIM_UID),
            ),
            answers={200: ("The claim's reserved devices.", _json("ClaimDevices"))},
            errors=(400,),
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
        middlewares=[error_middleware],
        client_max_size=context.max_request_bytes,
        handler_args=HANDLER_ARGS,
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
        handler = endpoint(route)
        app.router.add_route(route.method, route.path, handler)
        if route.method == "GET":
            # RFC 9110 section 9.3.2: HEAD wherever GET is (aiohttp leaves the body out).
            app.router.add_route("HEAD", route.path, handler)
    app[OPENAPI] = document(table, title="fabric-dra admin API", version="1")
    app.on_response_prepare.append(security_headers)
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
