"""Kubernetes ``Status`` errors of the API emulator.

Every failure leaves the emulator as a ``meta/v1 Status`` body with the HTTP code, reason and
(for 422) ``details.causes`` that a real kube-apiserver would send
(k8s.io/apimachinery pkg/api/errors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Cause:
    """One ``details.causes[]`` entry: ``reason`` (e.g. FieldValueInvalid), ``message``, ``field``.

    Source: k8s.io/apimachinery pkg/apis/meta/v1 StatusCause; reasons from
    k8s.io/apimachinery pkg/util/validation/field ErrorType.
    """

    reason: str
    message: str
    field: str

    def to_dict(self) -> dict[str, str]:
        """Return the JSON shape ``{"reason", "message", "field"}``."""
        return {"reason": self.reason, "message": self.message, "field": self.field}


@dataclass
class StatusError(Exception):
    """An API error carried to the HTTP layer as a ``Status`` body.

    ``code`` is the HTTP status, ``reason`` the Kubernetes StatusReason (NotFound, Conflict, ...),
    ``details`` the ``StatusDetails`` dict (name, group, kind, causes), ``headers`` extra HTTP
    headers such as Retry-After.
    """

    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def body(self) -> dict[str, Any]:
        """Return the ``Status`` JSON body (apiVersion v1, status Failure)."""
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            out["details"] = self.details
        return out


def _details(group: str, plural: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        out["group"] = group
    return out


def qualified(group: str, plural: str) -> str:
    """Return ``plural.group`` (or ``plural`` for the core group) as used in messages."""
    return f"{plural}.{group}" if group else plural


def not_found(group: str, plural: str, name: str) -> StatusError:
    """404 NotFound: ``<resource> "<name>" not found`` (apimachinery errors.NewNotFound)."""
    return StatusError(
        404,
        "NotFound",
        f'{qualified(group, plural)} "{name}" not found',
        _details(group, plural, name),
    )


def already_exists(group: str, plural: str, name: str) -> StatusError:
    """409 AlreadyExists (apimachinery errors.NewAlreadyExists)."""
    return StatusError(
        409,
        "AlreadyExists",
        f'{qualified(group, plural)} "{name}" already exists',
        _details(group, plural, name),
    )


def conflict(group: str, plural: str, name: str, why: str) -> StatusError:
    """409 Conflict: ``Operation cannot be fulfilled on ...`` (apimachinery errors.NewConflict)."""
    return StatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(group, plural)} "{name}": {why}',
        _details(group, plural, name),
    )


STALE_OBJECT = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> StatusError:
    """422 Invalid with causes (apimachinery errors.NewInvalid).

    The message is ``<Kind>.<group> "<name>" is invalid: [<field>: <message>, ...]``.
    """
    parts = [f"{c.field}: {c.message}" if c.field else c.message for c in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    qualified_kind = f"{kind}.{group}" if group else kind
    details: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "causes": [c.to_dict() for c in causes],
    }
    if group:
        details["group"] = group
    return StatusError(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {joined}', details)


def bad_request(message: str) -> StatusError:
    """400 BadRequest (apimachinery errors.NewBadRequest)."""
    return StatusError(400, "BadRequest", message)


def method_not_allowed(message: str) -> StatusError:
    """405 MethodNotAllowed (apimachinery errors.NewMethodNotSupported)."""
    return StatusError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str) -> StatusError:
    """415 UnsupportedMediaType for an unknown patch or body content type."""
    return StatusError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - "
        f"accepted media types include: application/json-patch+json, "
        f"application/merge-patch+json, application/apply-patch+yaml, "
        f'application/strategic-merge-patch+json (got "{content_type}")',
    )


def expired(message: str) -> StatusError:
    """410 Expired: a resourceVersion or continue token older than the retained history."""
    return StatusError(410, "Expired", message)


def unprocessable_patch(message: str) -> StatusError:
    """422 from a JSON patch that does not apply (e.g. a failed ``test``).

    Source: k8s.io/apiserver pkg/endpoints/handlers/patch.go applyJSPatch ->
    errors.NewGenericServerResponse(422, ...): reason Invalid, the patch error as the cause.
    """
    return StatusError(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": message}]},
    )


def unauthorized() -> StatusError:
    """401 Unauthorized for a missing or wrong bearer token."""
    return StatusError(401, "Unauthorized", "Unauthorized")
