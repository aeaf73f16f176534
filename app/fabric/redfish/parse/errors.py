"""Redfish error answers as typed fabric errors: MessageIds, vendor text and HTTP status.

Error bodies follow DSP0266 "Error responses" (``error.@Message.ExtendedInfo[]``); the
MessageIds that decide a class are from the Base message registry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.fabric.errors import (
    FabricAuthError,
    FabricConflict,
    FabricError,
    FabricNotFound,
    FabricPreconditionFailed,
    FabricTimeout,
    FabricUnavailable,
)


def message_ids(body: Any) -> list[str]:
    """MessageIds of a Redfish error body (``error.@Message.ExtendedInfo[]``) or of a Task's
    ``Messages[]``, in order; ``error.code`` last. Malformed parts are skipped."""
    found: list[str] = []
    if not isinstance(body, Mapping):
        return found
    error = body.get("error")
    containers: list[Any] = []
    if isinstance(error, Mapping):
        containers.append(error.get("@Message.ExtendedInfo"))
    containers.append(body.get("@Message.ExtendedInfo"))
    containers.append(body.get("Messages"))
    for container in containers:
        if isinstance(container, list):
            for info in container:
                if isinstance(info, Mapping) and isinstance(info.get("MessageId"), str):
                    found.append(info["MessageId"])
    if isinstance(error, Mapping) and isinstance(error.get("code"), str):
        found.append(error["code"])
    return found


MAX_MESSAGE_CHARS = 300
"""Longest vendor message carried into an error, after folding it onto one line."""

_TAG = re.compile(r"<[^>]*>")


def _one_line(value: str) -> str | None:
    joined = " ".join(value.split())
    if not joined:
        return None
    return joined if len(joined) <= MAX_MESSAGE_CHARS else joined[: MAX_MESSAGE_CHARS - 3] + "..."


def message_text(body: Any) -> str | None:
    """The human text of an error or Task body, on one line, at most
    :data:`MAX_MESSAGE_CHARS`: the Redfish error's ``@Message.ExtendedInfo[].Message`` (else
    ``error.message``) and a Task's ``Messages[].Message``; else, for services without a
    Redfish error object, a top-level ``message`` / ``Message`` / ``detail`` string or an
    ``error`` string; else a plain-text (non-JSON) body itself, HTML tags dropped."""
    if isinstance(body, str):
        return _one_line(_TAG.sub(" ", body) if body.lstrip().startswith("<") else body)
    if not isinstance(body, Mapping):
        return None
    error = body.get("error")
    parts: list[str] = []
    if isinstance(error, str):
        parts.append(error)
    if isinstance(error, Mapping):
        infos = error.get("@Message.ExtendedInfo")
        if isinstance(infos, list):
            parts.extend(
                info["Message"]
                for info in infos
                if isinstance(info, Mapping) and isinstance(info.get("Message"), str)
            )
        if not parts and isinstance(error.get("message"), str):
            parts.append(error["message"])
    messages = body.get("Messages")
    if isinstance(messages, list):
        parts.extend(
            info["Message"]
            for info in messages
            if isinstance(info, Mapping) and isinstance(info.get("Message"), str)
        )
    if not parts:
        for key in ("message", "Message", "detail"):
            if isinstance(body.get(key), str):
                parts.append(body[key])
                break
    if not parts:
        return None
    return _one_line(" ".join(parts))


_MESSAGE_CLASSES: tuple[tuple[str, type[FabricError]], ...] = (
    ("ResourceInUse", FabricConflict),
    ("ResourceAlreadyExists", FabricConflict),
    ("PreconditionFailed", FabricPreconditionFailed),
    ("PreconditionRequired", FabricPreconditionFailed),
    ("ResourceNotFound", FabricNotFound),
    ("ResourceMissingAtURI", FabricNotFound),
    ("ServiceTemporarilyUnavailable", FabricUnavailable),
    ("ServiceShuttingDown", FabricUnavailable),
)
"""Base registry MessageIds (``Base.<version>.<Name>``) that decide the error class of a 4xx
answer, whatever its status (services answer ResourceInUse with 400 or 409)."""


def classify_message_ids(ids: Sequence[str]) -> tuple[type[FabricError], str] | None:
    """The error class named by the first recognised MessageId, and that id."""
    for message_id in ids:
        name = message_id.rsplit(".", 1)[-1]
        for known, error_class in _MESSAGE_CLASSES:
            if name == known:
                return error_class, message_id
    return None


PERMANENT_STATUSES = frozenset({400, 403, 405, 406, 501})
"""Statuses that repeating the same request cannot change (RFC 9110 section 15: bad request,
forbidden, method not allowed, not acceptable, not implemented): never retryable, whatever
MessageId the body carries."""


def _class_for_status(status: int) -> type[FabricError]:
    if status in (401, 403):
        return FabricAuthError
    if status in (404, 410):
        return FabricNotFound
    if status == 409:
        return FabricConflict
    if status in (412, 428):
        return FabricPreconditionFailed
    if status == 408 or status == 504:
        return FabricTimeout
    if status in PERMANENT_STATUSES:
        return FabricError
    if status == 429 or status >= 500:
        return FabricUnavailable
    return FabricError


def error_from_response(status: int, body: Any, *, context: str) -> FabricError:
    """Map an HTTP error answer to a typed error.

    Args:
        status: the HTTP status (>= 400).
        body: the decoded JSON body; or the body's text when it was not JSON (plain text or
            HTML from a service or a proxy); or None when there was none.
        context: what was being done, e.g. ``"GET /redfish/v1/Systems/1"``; starts the message.

    Returns:
        401/403 -> FabricAuthError; 404/410 -> FabricNotFound; 409 -> FabricConflict;
        412/428 -> FabricPreconditionFailed; 408/504 -> FabricTimeout; 400/405/406/501 and
        other 4xx -> FabricError (permanent); 429 and other 5xx -> FabricUnavailable. A
        recognised Base MessageId (ResourceInUse, PreconditionFailed, ResourceNotFound, ...)
        decides the class of a 4xx other than 401/403, except that it never makes one of
        :data:`PERMANENT_STATUSES` retryable. ``vendor_code`` is the deciding MessageId, else
        the first one, else ``error.code``. The message is ``<context>: HTTP <status>
        [<vendor_code>][: <vendor text>]``, the text on one line and capped (see
        :func:`message_text`).
    """
    error_class = _class_for_status(status)
    ids = message_ids(body)
    vendor_code = ids[0] if ids else None
    if 400 <= status < 500 and status not in (401, 403):
        known = classify_message_ids(ids)
        if known is not None and not (status in PERMANENT_STATUSES and known[0].retryable):
            error_class, vendor_code = known
    detail = message_text(body)
    message = f"{context}: HTTP {status}"
    if vendor_code:
        message += f" {vendor_code}"
    if detail:
        message += f": {detail}"
    return error_class(message, status=status, vendor_code=vendor_code)
