"""The admin API's route table types and its OpenAPI 3.1 document, built from that table.

:mod:`app.admin.app` declares every route once as a :class:`Route` (method, path, handler,
parameters, body, answers); the router is filled from that table and :func:`document` writes
the OpenAPI document from the same table, so the two cannot drift apart. Query parameters are
also validated from their :class:`Param` declarations.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from app.reservations import RELEASED, STATES

Handler = Callable[[Any], Awaitable[web.StreamResponse]]
"""A route's handler; :mod:`app.admin.pipeline` passes it a validated call object."""

OPEN = "open"
READ = "read"
ACTION = "action"

_AIOHTTP_VARIABLE = re.compile(r"\{(\w+)(?::[^{}]*)?\}")

ERROR_CODES = {
    400: "Bad parameters, JSON or body shape.",
    401: "No bearer token (or another scheme).",
    403: "Wrong token, or actions are disabled (no token configured).",
    404: "Unknown object.",
    409: "The action cannot be done in the object's current state.",
    413: "The body is larger than the configured maximum.",
    415: "The body is not JSON.",
    503: "The service part that answers this is not running.",
}


@dataclass(frozen=True, slots=True)
class Param:
    """A path or query parameter.

    Attributes:
        kind: ``string`` or ``integer``.
        enum: allowed values of a string.
        minimum, maximum: bounds of an integer.
        max_length: longest string.
        pattern: a regular expression the whole string must match (written with ``^...$``,
            read the same by JSON Schema and Python).
        default: the value when absent (documented).
    """

    name: str
    where: str = "query"
    description: str = ""
    kind: str = "string"
    enum: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    default: int | str | None = None

    def schema(self) -> dict[str, Any]:
        """The parameter's JSON schema."""
        schema: dict[str, Any] = {"type": self.kind}
        if self.enum:
            schema["enum"] = list(self.enum)
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.max_length is not None:
            schema["maxLength"] = self.max_length
        if self.pattern is not None:
            schema["pattern"] = self.pattern
        if self.kind == "string" and self.where == "path":
            schema["minLength"] = 1
        if self.default is not None:
            schema["default"] = self.default
        return schema


@dataclass(frozen=True, slots=True)
class Route:
    """One route of the admin app.

    Attributes:
        path: the aiohttp path (``/api/v1/pools/{pool:.+}``).
        access: ``open`` (no token ever), ``read`` (the token when reads require it) or
            ``action`` (always the token).
        body: the JSON schema of the request body, None when it takes none.
        body_required: False when the body may be left out.
        answers: status -> (description, JSON schema); schema None for non-JSON answers.
        media_type: the content type of the successful answer.
        errors: error statuses this route can answer (documented with the Error schema).
    """

    method: str
    path: str
    handler: Handler
    operation_id: str
    summary: str
    tag: str
    access: str = READ
    params: tuple[Param, ...] = ()
    body: Mapping[str, Any] | None = None
    body_required: bool = True
    answers: Mapping[int, tuple[str, Mapping[str, Any] | None]] = field(default_factory=dict)
    media_type: str = "application/json"
    errors: tuple[int, ...] = ()

    @property
    def openapi_path(self) -> str:
        """The path in OpenAPI form (``/api/v1/pools/{pool}``)."""
        return _AIOHTTP_VARIABLE.sub(r"{\1}", self.path)


# --------------------------------------------------------------------------- schemas
def _nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


_COUNTS = {"type": "object", "additionalProperties": {"type": "integer"}}
_NO_CONTROL = "^[^\\u0000-\\u001f\\u007f]*$"  # free text: no control characters

SCHEMAS: dict[str, dict[str, Any]] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "integer"},
                    "message": {"type": "string"},
                    "request_id": {"type": "string"},
                },
            }
        },
    },
    "Check": {
        "type": "object",
        "required": ["name", "ok", "message"],
        "properties": {
            "name": {"type": "string"},
            "ok": {"type": "boolean"},
            "message": {"type": "string"},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {
            "status": {"enum": ["ok", "failing"]},
            "checks": {"type": "array", "items": _ref("Check")},
        },
    },
    "Readiness": {
        "type": "object",
        "required": ["status", "checks"],
        "properties": {
            "status": {"enum": ["ready", "not ready"]},
            "checks": {"type": "array", "items": _ref("Check")},
        },
    },
    "Status": {
        "type": "object",
        "required": ["service", "database"],
        "properties": {
            "service": {"type": "object"},
            "database": {
                "type": "object",
                "required": ["devices", "reservations", "inventory"],
                "properties": {
                    "devices": {
                        "type": "object",
                        "required": ["present", "by_state", "by_type", "by_health"],
                        "properties": {
                            "present": {"type": "integer"},
                            "by_state": _COUNTS,
                            "by_type": _COUNTS,
                            "by_health": _COUNTS,
                        },
                    },
                    "reservations": {
                        "type": "object",
                        "required": ["by_state", "active"],
                        "properties": {"by_state": _COUNTS, "active": {"type": "integer"}},
                    },
                    "inventory": {"type": "array", "items": {"type": "object"}},
                },
            },
            "attention": {
                "type": "object",
                "description": "What needs a person: unhealthy and cordoned devices, "
                "unsettled and detach-failed reservations, devices held by "
                "another server with no reservation of ours.",
                "properties": {
                    key: {"type": "array", "items": {"type": "object"}}
                    for key in (
                        "unhealthy",
                        "cordoned",
                        "unsettled_reservations",
                        "detach_failed",
                        "held_elsewhere",
                    )
                },
            },
        },
    },
    "Pool": {
        "type": "object",
        "required": [
            "name",
            "location",
            "devices",
            "published",
            "healthy",
            "cordoned",
            "reserved",
            "attached",
            "utilisation",
            "resource_slice_count",
            "publisher",
        ],
        "properties": {
            "name": {"type": "string"},
            "location": {"type": "object"},
            "region": _nullable("string"),
            "rack": _nullable("string"),
            "devices": {"type": "integer"},
            "published": {"type": "integer"},
            "withheld": {"type": "integer"},
            "healthy": {"type": "integer"},
            "unhealthy": {"type": "integer"},
            "cordoned": {"type": "integer"},
            "attach_failed": {"type": "integer"},
            "reserved": {"type": "integer"},
            "attached": {"type": "integer"},
            "free": {"type": "integer"},
            "utilisation": {"type": "number", "minimum": 0},
            "by_type": _COUNTS,
            "resource_slice_count": {"type": "integer"},
            "publisher": {"type": ["object", "null"]},
        },
    },
    "PoolList": {
        "type": "object",
        "required": ["items"],
        "properties": {"items": {"type": "array", "items": _ref("Pool")}},
    },
    "PoolDetail": {
        "allOf": [
            _ref("Pool"),
            {
                "type": "object",
                "required": ["node_selector", "slices", "device_list"],
                "properties": {
                    "node_selector": {"type": "object"},
                    "slices": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["index", "device_count", "devices"],
                            "properties": {
                                "index": {"type": "integer"},
                                "device_count": {"type": "integer"},
                                "devices": {"type": "array", "items": {"type": "string"}},
                                "content_hash": {"type": "string"},
                            },
                        },
                    },
                    "withheld_devices": {"type": "array", "items": {"type": "string"}},
                    "dropped_attributes": {"type": "array", "items": {"type": "object"}},
                    "device_list": {"type": "array", "items": _ref("Device")},
                },
            },
        ],
    },
    "Device": {
        "type": "object",
        "required": [
            "name",
            "pool",
            "state",
            "type",
            "health",
            "host_id",
            "location",
            "cordoned_at",
            "cordon_reason",
        ],
        "properties": {
            "name": {"type": "string"},
            "pool": {"type": "string"},
            "state": {"enum": ["free", "reserved", "attached", "cordoned", "removed"]},
            "type": {"type": "string"},
            "health": {"type": "string"},
            "vendor_id": {"type": "string"},
            "vendor": _nullable("string"),
            "model": _nullable("string"),
            "serial": _nullable("string"),
            "firmware_version": _nullable("string"),
            "memory_mib": _nullable("integer"),
            "shareable": {"type": "boolean"},
            "fabric_state": _nullable("string"),
            "host_id": _nullable("string"),
            "location": {"type": "object"},
            "capacity": {"type": "object"},
            "attributes": {"type": "object"},
            "cordoned_at": _nullable("string"),
            "cordon_reason": _nullable("string"),
            "reservations": {"type": "array", "items": {"type": "string"}},
            "first_seen": _nullable("string"),
            "last_seen": _nullable("string"),
            "health_changed_at": _nullable("string"),
            "removed_at": _nullable("string"),
        },
    },
    "DeviceList": {
        "type": "object",
        "required": ["items", "total", "limit", "continue"],
        "properties": {
            "items": {"type": "array", "items": _ref("Device")},
            "total": {"type": "integer"},
            "limit": {"type": "integer"},
            "offset": {"type": "integer"},
            "continue": _nullable("string"),
        },
    },
    "DeviceDetail": {
        "allOf": [
            _ref("Device"),
            {
                "type": "object",
                "required": ["events", "reservation_history"],
                "properties": {
                    "events": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["at", "kind"],
                            "properties": {
                                "at": _nullable("string"),
                                "kind": {"type": "string"},
                                "old": _nullable("string"),
                                "new": _nullable("string"),
                            },
                        },
                    },
                    "reservation_history": {"type": "array", "items": _ref("Reservation")},
                },
            },
        ],
    },
    "Reservation": {
        "type": "object",
        "required": ["id", "claim", "device_name", "pool", "state", "created_at"],
        "properties": {
            "id": {"type": "integer"},
            "claim": {
                "type": "object",
                "required": ["uid", "namespace", "name"],
                "properties": {
                    "uid": {"type": "string"},
                    "namespace": {"type": "string"},
                    "name": {"type": "string"},
                },
            },
            "request": {"type": "string"},
            "mode": {"type": "string"},
            "device_id": {"type": "integer"},
            "device_name": {"type": "string"},
            "pool": {"type": "string"},
            "exclusive": {"type": "boolean"},
            "node": _nullable("string"),
            "host_id": _nullable("string"),
            "state": {"enum": list(STATES)},
            "attempts": {"type": "integer"},
            "last_error": _nullable("string"),
            "operation_id": _nullable("string"),
            "created_at": {"type": "string"},
            "updated_at": {"type": "string"},
            "attached_at": _nullable("string"),
            "released_at": _nullable("string"),
        },
    },
    "ReservationList": {
        "type": "object",
        "required": ["items", "total", "limit", "continue"],
        "properties": {
            "items": {"type": "array", "items": _ref("Reservation")},
            "total": {"type": "integer"},
            "limit": {"type": "integer"},
            "offset": {"type": "integer"},
            "continue": _nullable("string"),
        },
    },
    "ReleaseAnswer": {
        "type": "object",
        "required": ["reservation", "message"],
        "properties": {"reservation": _ref("Reservation"), "message": {"type": "string"}},
    },
    "ClaimView": {
        "type": "object",
        "required": ["namespace", "name", "claim", "live", "reservations", "fabric", "errors"],
        "properties": {
            "namespace": {"type": "string"},
            "name": {"type": "string"},
            "claim": {"type": ["object", "null"]},
            "live": {"type": "boolean"},
            "reservations": {"type": "array", "items": _ref("Reservation")},
            "fabric": {"type": "array", "items": {"type": "object"}},
            "errors": {"type": "array", "items": {"type": "object"}},
        },
    },
    "ClaimDevices": {
        "type": "object",
        "required": ["claim", "devices"],
        "properties": {
            "claim": {
                "type": "object",
                "required": ["uid", "namespace", "name"],
                "description": "namespace and name are null when no reservation is held.",
                "properties": {
                    "uid": {"type": "string"},
                    "namespace": _nullable("string"),
                    "name": _nullable("string"),
                },
            },
            "devices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["pool", "device", "request", "state", "node", "host", "data"],
                    "properties": {
                        "pool": {"type": "string"},
                        "device": {"type": "string"},
                        "request": {"type": "string"},
                        "state": {"enum": [s for s in STATES if s != RELEASED]},
                        "node": _nullable("string"),
                        "host": _nullable("string"),
                        "data": {
                            "type": ["object", "null"],
                            "description": "How the node finds the device (null: the device "
                            "row is gone).",
                            "required": ["deviceType"],
                            "properties": {
                                key: {"type": "string"}
                                for key in (
                                    "deviceType",
                                    "uuid",
                                    "serialNumber",
                                    "pciVendorId",
                                    "pciDeviceId",
                                    "slot",
                                )
                            },
                        },
                    },
                },
            },
        },
    },
    "ClaimSpec": {
        "type": "object",
        "required": ["devices"],
        "description": "A ResourceClaim spec in the resource.k8s.io/v1 JSON shape.",
        "properties": {
            "devices": {
                "type": "object",
                "properties": {
                    "requests": {"type": "array", "items": {"type": "object"}},
                    "constraints": {"type": "array", "items": {"type": "object"}},
                    "config": {"type": "array", "items": {"type": "object"}},
                },
            }
        },
    },
    "WhatIf": {"type": "object"},
    "CordonRequest": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"reason": {"type": "string", "maxLength": 255, "pattern": _NO_CONTROL}},
    },
    "ForgetRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["reason"],
        "properties": {
            "reason": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": _NO_CONTROL}
        },
    },
}


def _operation(route: Route) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "tags": [route.tag],
    }
    if route.params:
        operation["parameters"] = [
            {
                "name": p.name,
                "in": p.where,
                "required": p.where == "path",
                "description": p.description,
                "schema": p.schema(),
            }
            for p in route.params
        ]
    if route.body is not None:
        operation["requestBody"] = {
            "required": route.body_required,
            "content": {"application/json": {"schema": dict(route.body)}},
        }
    responses: dict[str, Any] = {}
    for status, (description, schema) in sorted(route.answers.items()):
        media = "application/json" if status >= 300 or schema is not None else route.media_type
        content: dict[str, Any] = {"schema": dict(schema)} if schema is not None else {}
        responses[str(status)] = {"description": description, "content": {media: content}}
    errors = set(route.errors)
    if route.access in (ACTION, READ):
        errors |= {401, 403}
    if route.method == "POST":
        errors |= {413, 415}
    for status in sorted(errors):
        responses.setdefault(
            str(status),
            {
                "description": ERROR_CODES.get(status, "Error."),
                "content": {"application/json": {"schema": _ref("Error")}},
            },
        )
    responses["500"] = {
        "description": "Unexpected failure (logged with the request id).",
        "content": {"application/json": {"schema": _ref("Error")}},
    }
    operation["responses"] = responses
    if route.access == ACTION:
        operation["security"] = [{"bearer": []}]
    elif route.access == READ:
        # Reads need the token only when admin.require_token_for_reads is set.
        operation["security"] = [{"bearer": []}, {}]
    return operation


def document(routes: Sequence[Route], *, title: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes``."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.openapi_path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": "Health, metrics, inventory, pools, reservations, claims and "
            "operator actions of fabric-dra. Errors are "
            '{"error": {"code", "message"}}.',
        },
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
