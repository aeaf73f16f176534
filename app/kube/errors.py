"""Typed Kubernetes API errors. The kube layer translates library and transport errors into these.

Callers decide from the type alone: ``retryable`` errors (5xx, 429, connection trouble, timeouts)
are repeated with backoff, honouring ``retry_after`` when the server sent one; the others are
permanent for the call that raised them. A :class:`KubeConflict` means "re-read and re-plan", a
:class:`KubeNotFound` on delete means success, a :class:`KubeGone` on a watch means "re-list".
The original exception is always chained as ``__cause__``.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException


class KubeError(Exception):
    """Base of every Kubernetes API error raised by ``app.kube``.

    Attributes:
        retryable: True when the same call may succeed later.
        status: the HTTP status behind the error, if any.
        reason: the ``reason`` of the Kubernetes ``Status`` body (e.g. ``"Conflict"``), if any.
        retry_after: seconds the server asked us to wait (``Retry-After``), if any.
    """

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


class KubeBadRequest(KubeError):
    """The server refused the request as malformed or invalid (HTTP 400 or 422)."""


class KubeUnauthorized(KubeError):
    """The credentials were refused (HTTP 401). A rotated token may fix it on the next call."""


class KubeForbidden(KubeError):
    """RBAC does not allow the call (HTTP 403)."""


class KubeNotFound(KubeError):
    """The object or the resource does not exist (HTTP 404)."""


class KubeConflict(KubeError):
    """A write raced another one: stale resourceVersion or precondition (HTTP 409).

    Re-read the object and plan again.
    """


class KubeAlreadyExists(KubeConflict):
    """A create named an object that exists (HTTP 409, reason ``AlreadyExists``)."""


class KubeGone(KubeError):
    """The resourceVersion asked for is no longer in the server's history (HTTP 410, Expired).

    A watch must re-list; a paginated list must restart without its continue token.
    """


class KubeTemporaryError(KubeError):
    """Base of errors worth retrying with backoff."""

    retryable = True


class KubeTooManyRequests(KubeTemporaryError):
    """The server throttled us (HTTP 429); wait ``retry_after`` seconds when given."""


class KubeUnavailable(KubeTemporaryError):
    """The server failed (5xx) or could not be reached (connection refused, reset, cut reply)."""


class KubeTimeout(KubeUnavailable):
    """A call got no answer in time (client-side timeout, or HTTP 504)."""


class KubeVersionError(KubeError):
    """The server serves no API version this controller can use for the asked mode."""


class KubeInvalidResponse(KubeError):
    """The server answered with something that is not what the API promises."""


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Parse an HTTP ``Retry-After`` header into seconds from now.

    Accepts delay-seconds (what kube-apiserver sends) or an HTTP date (RFC 9110 section 10.2.3).
    Returns None when absent or unreadable; never negative.
    """
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def _status_fields(body: Any) -> tuple[str | None, str | None]:
    """Return (reason, message) from a Kubernetes ``Status`` body given as bytes, str or dict."""
    if isinstance(body, bytes | bytearray):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return None, body.strip()[:500] or None
    if isinstance(body, Mapping):
        reason = body.get("reason")
        message = body.get("message")
        return (
            reason if isinstance(reason, str) else None,
            message if isinstance(message, str) else None,
        )
    return None, None


def error_from_status(
    status: int,
    what: str,
    *,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
) -> KubeError:
    """Build the typed error for an HTTP error status.

    Args:
        status: the HTTP status (or the ``code`` of a watch ``ERROR`` event's Status).
        what: what was being done, for the message, e.g. ``"list ResourceSlices"``.
        body: the Kubernetes ``Status`` body (bytes, str or dict), if any.
        headers: response headers; ``Retry-After`` is read from them.

    Returns the error; the caller raises it (chaining the cause).
    """
    reason, message = _status_fields(body)
    retry_after = parse_retry_after((headers or {}).get("Retry-After"))
    text = f"{what}: HTTP {status}"
    if reason:
        text += f" {reason}"
    if message:
        text += f": {message}"
    kwargs: dict[str, Any] = {"status": status, "reason": reason, "retry_after": retry_after}
    if status == 409:
        if reason == "AlreadyExists":
            return KubeAlreadyExists(text, **kwargs)
        return KubeConflict(text, **kwargs)
    if status == 410 or reason in ("Expired", "Gone"):
        return KubeGone(text, **kwargs)
    if status == 429:
        return KubeTooManyRequests(text, **kwargs)
    if status == 504:
        return KubeTimeout(text, **kwargs)
    if status >= 500:
        return KubeUnavailable(text, **kwargs)
    if status == 404:
        return KubeNotFound(text, **kwargs)
    if status == 401:
        return KubeUnauthorized(text, **kwargs)
    if status == 403:
        return KubeForbidden(text, **kwargs)
    if status in (400, 422):
        return KubeBadRequest(text, **kwargs)
    return KubeError(text, **kwargs)


def translate_error(err: BaseException, what: str) -> KubeError:
    """Translate a kubernetes-asyncio, aiohttp or timeout error into a :class:`KubeError`.

    ``ApiException`` keeps its status, body and Retry-After; connection errors and cut replies
    (``ClientPayloadError``) become :class:`KubeUnavailable`; timeouts :class:`KubeTimeout`.
    A :class:`KubeError` is returned unchanged. Anything else becomes a permanent
    :class:`KubeError`. The caller raises the result ``from err``.
    """
    if isinstance(err, KubeError):
        return err
    if isinstance(err, ApiException):
        headers = err.headers if isinstance(err.headers, Mapping) else None
        if err.status in (None, 0):
            return KubeUnavailable(f"{what}: {err.reason}")
        return error_from_status(
            int(err.status), what, body=err.body or err.reason, headers=headers
        )
    if isinstance(err, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return KubeTimeout(f"{what}: timed out")
    if isinstance(err, aiohttp.ClientResponseError):
        return error_from_status(
            err.status, what, body=err.message, headers=dict(err.headers or {})
        )
    if isinstance(err, aiohttp.ClientError | ConnectionError):
        return KubeUnavailable(f"{what}: {type(err).__name__}: {err}")
    return KubeError(f"{what}: {type(err).__name__}: {err}")
