"""The request pipeline of the admin app: what happens around every route's handler.

* errors are JSON ``{"error": {"code", "message"}}`` (:class:`ApiError`,
  :func:`error_middleware`); an unexpected exception is logged with a request id and answered
  500 with that id and nothing else;
* the bearer token is checked with :func:`hmac.compare_digest` for actions (always) and for
  reads when ``require_token_for_reads``; health, readiness, metrics and the OpenAPI document
  stay open for probes and scrapers;
* query parameters are validated from their declarations (unknown ones are refused, so a typo
  is not silently ignored); POST bodies must be JSON and at most ``max_request_bytes``;
* every answer carries ``X-Content-Type-Options: nosniff``, a Content-Security-Policy (the
  dashboard's allows only its own nonce-tagged inline style) and ``Cache-Control: no-store``
  (:func:`security_headers`).

:func:`endpoint` wraps a declared :class:`~app.admin.openapi.Route` into an aiohttp handler that
authorizes, validates and hands its handler a :class:`Call`; the application keys below are
where :func:`app.admin.app.make_app` puts what the handlers read.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import jinja2
from aiohttp import web

from app.admin.context import AdminContext
from app.admin.openapi import ACTION, OPEN, READ, Param, Route
from app.pools import PoolConfig

log = logging.getLogger(__name__)

TEXT = r"^[^\u0000-\u001f\u007f]+$"
"""Free text in parameters: no control characters (PostgreSQL refuses NUL in strings)."""
_CONTROL = re.compile(r"[\u0000-\u001f\u007f]")
MAX_BODY_DEPTH = 64
"""How deep a JSON body may nest (a claim spec needs fewer than ten levels)."""
BODY_READ_TIMEOUT_S = 30.0
"""The longest a request body may take to arrive once its headers have, seconds."""
JSON_TYPES = ("application/json",)
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

CONTEXT = web.AppKey("admin_context", AdminContext)
POOL_CONFIG = web.AppKey("admin_pool_config", PoolConfig)
TEMPLATE_ENV = web.AppKey("admin_templates", jinja2.Environment)
OPENAPI = web.AppKey("admin_openapi", dict)


class ClientGone(Exception):
    """The client closed the connection before its body was read: nothing can be answered."""


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
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    request_id = uuid.uuid4().hex[:16]
    try:
        response = await handler(request)
    except ApiError as err:
        response = error_answer(err.status, err.message, headers=err.headers)
    except ClientGone as gone:
        log.info(
            "admin request %s %r: the client went away before its body was read (%s)",
            request.method,
            request.path,
            gone,
        )
        response = error_answer(400, "the request body was cut short", request_id)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "WWW-Authenticate")}
        limit = request.app[CONTEXT].max_request_bytes
        response = error_answer(exc.status, _http_message(request, exc, limit), headers=headers)
    except Exception:
        log.exception(
            "admin request %s %r failed (request id %s)", request.method, request.path, request_id
        )
        response = error_answer(
            500,
            f"internal error (request id {request_id}); the service log has the details",
            request_id,
        )
    response.headers["X-Request-Id"] = request_id
    return response


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    headers = response.headers
    headers["X-Content-Type-Options"] = "nosniff"
    headers["X-Frame-Options"] = "DENY"
    headers["Referrer-Policy"] = "no-referrer"
    headers.setdefault("Content-Security-Policy", API_CSP)
    headers["Cache-Control"] = "no-store"
    headers["Server"] = "fabric-dra"  # not aiohttp's name and version with Python's


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
    # aiohttp decodes header bytes that are not UTF-8 as surrogates: encode them back as they
    # came, so that such a token is compared (and refused) like any other.
    if not hmac.compare_digest(presented.strip().encode("utf-8", "surrogateescape"), expected):
        log.warning("admin request %s %r refused: wrong token", request.method, request.path)
        raise ApiError(403, "the bearer token is not valid")


def _parse_param(param: Param, raw: str) -> Any:
    where = f"parameter {param.name!r}"
    if param.kind == "integer":
        if re.fullmatch(r"[+-]?\d{13,}", raw):
            raise ApiError(400, f"{where}: too large, got {raw[:40]!r}")
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
    if param.pattern == TEXT:
        check_text(where, raw)
    if param.pattern is not None and not re.fullmatch(param.pattern, raw):
        raise ApiError(400, f"{where}: {raw[:80]!r} does not match {param.pattern}")
    return raw


def check_text(where: str, value: str) -> None:
    """Refuse free text with control characters (a newline would forge log lines; PostgreSQL
    refuses NUL): 400 naming ``where``, e.g. ``'reason'``."""
    if _CONTROL.search(value):
        raise ApiError(400, f"{where}: control characters are not allowed")


def _too_deep(value: Any, limit: int) -> bool:
    # Iterative, so that the check itself cannot exhaust the stack.
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children)
    return False


def _not_unicode(value: Any) -> bool:
    """True when a string of ``value`` (a key or a value) holds a lone surrogate: JSON's
    ``"\\ud800"`` escape decodes to one, which is not Unicode text and cannot be stored,
    logged as UTF-8 or sent on (RFC 8259 section 8.2: such a string's behaviour is
    unpredictable)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


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
    try:
        # Bounded by client_max_size (413 past it) and in time: a client that sends part of
        # the body it announced and stops would hold the request open for ever.
        async with asyncio.timeout(BODY_READ_TIMEOUT_S):
            raw = await request.read()
    except TimeoutError as err:
        raise ApiError(
            408,
            f"the body did not arrive within {BODY_READ_TIMEOUT_S:g} s",
            {"Connection": "close"},
        ) from err
    except web.RequestPayloadError as err:
        # The body arrived but cannot be decoded: a Content-Encoding (gzip, deflate, br)
        # that does not match the bytes, or broken chunked framing.
        cause = err.__cause__
        reason = getattr(cause, "message", None) or str(cause or err).strip().splitlines()[-1]
        raise ApiError(400, f"the body cannot be read: {reason}") from err
    except (OSError, aiohttp.ClientPayloadError) as err:  # ConnectionResetError: the client left
        raise ClientGone(str(err) or type(err).__name__) from err
    if not raw:
        if route.body is not None and route.body_required:
            raise ApiError(400, "a JSON body is required")
        return None
    too_deep = f"the body is nested more than {MAX_BODY_DEPTH} levels deep"
    try:
        value = json.loads(raw, parse_constant=_not_json_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ApiError(400, f"the body is not valid JSON: {err}") from err
    except RecursionError as err:
        raise ApiError(400, too_deep) from err
    if _too_deep(value, MAX_BODY_DEPTH):
        raise ApiError(400, too_deep)
    if _not_unicode(value):
        raise ApiError(400, "the body holds a lone surrogate (such as \\ud800): not Unicode text")
    return value


def _not_json_constant(name: str) -> Any:
    # Python's json reads NaN, Infinity and -Infinity; RFC 8259 JSON has no such numbers.
    raise json.JSONDecodeError(f"{name} is not a JSON number", name, 0)


def endpoint(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
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
