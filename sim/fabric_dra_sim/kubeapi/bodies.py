"""Reading and decoding request bodies: the size limit, the Content-Type negotiation and the
JSON or YAML decoding of create, update and delete bodies.

Sources:
- k8s.io/apiserver pkg/endpoints/handlers/rest.go limitedReadBody: a write body over
  ``MaxRequestBodyBytes`` (3 MiB by default, k8s.io/apiserver pkg/server/config.go
  NewConfig) is 413 ``Request entity too large: limit is 3145728``.
- k8s.io/apiserver pkg/endpoints/handlers/negotiation/negotiate.go
  NegotiateInputSerializerForMediaType: no Content-Type means the first supported type
  (JSON); an unknown one is 415 UnsupportedMediaType
  (negotiation/errors.go errUnsupportedMediaType).
- k8s.io/apimachinery pkg/runtime/serializer/json/json.go: YAML bodies are converted to JSON
  and decoded as JSON; a body nested deeper than encoding/json's 10000 levels
  (``maxNestingDepth``, scanner.go) fails with ``exceeded max depth``.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from .errors import StatusError, bad_request
from .fieldvalidation import parse_json

MAX_REQUEST_BODY_BYTES = 3 * 1024 * 1024
JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"
# What a built-in type's serializer lists (JSON, YAML, protobuf; CBOR only behind its gate).
BUILTIN_MEDIA_TYPES = (JSON, YAML, PROTOBUF)
# What a server without a protobuf serializer for the type lists (custom resources:
# k8s.io/apiextensions-apiserver pkg/apiserver/customresource_handler.go
# unstructuredNegotiatedSerializer). The emulator decodes no protobuf, so a protobuf body is
# answered as for such a type.
NO_PROTOBUF_MEDIA_TYPES = (JSON, YAML)
_PARSE_PREFIX = "couldn't get version/kind; json parse error: "


def unsupported_media_type(accepted: tuple[str, ...]) -> StatusError:
    """415 UnsupportedMediaType listing ``accepted`` (negotiation/errors.go)."""
    return StatusError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media "
        "types include: " + ", ".join(accepted),
    )


def too_large() -> StatusError:
    """413 RequestEntityTooLarge (k8s.io/apimachinery pkg/api/errors
    NewRequestEntityTooLargeError, raised by handlers/rest.go limitedReadBody)."""
    return StatusError(
        413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_REQUEST_BODY_BYTES}"
    )


class ClientGone(Exception):
    """The client closed the connection before its body was read; nothing can be answered."""


async def read_body(request: web.Request) -> bytes:
    """The raw body of ``request``, at most :data:`MAX_REQUEST_BODY_BYTES`.

    Raises StatusError 413 past the limit, :class:`ClientGone` when the client went away
    mid-body.
    """
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as err:
        raise too_large() from err
    except (
        ConnectionResetError,
        aiohttp.ClientConnectionResetError,
        aiohttp.ClientPayloadError,
    ) as err:
        raise ClientGone from err
    if len(raw) > MAX_REQUEST_BODY_BYTES:
        raise too_large()
    return raw


def media_type(request: web.Request) -> str:
    """The negotiated input media type of a create, update or delete body: JSON or YAML.

    Raises StatusError 415 for any other type (protobuf answered as for a type without a
    protobuf serializer).
    """
    header = request.headers.get("Content-Type", "")
    if not header.strip():
        return JSON
    # mime.ParseMediaType: the type before any parameters, case-insensitive.
    kind = header.split(";", 1)[0].strip().lower()
    if kind in (JSON, YAML):
        return kind
    if kind == PROTOBUF:
        raise unsupported_media_type(NO_PROTOBUF_MEDIA_TYPES)
    raise unsupported_media_type(BUILTIN_MEDIA_TYPES)


def _yaml_to_json(raw: bytes) -> Any:
    # sigs.k8s.io/yaml YAMLToJSON: keys become strings and timestamps stay text, so the
    # value is passed through a JSON round trip.
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise bad_request(f"error converting YAML to JSON: yaml: {err}") from err
    except RecursionError as err:
        raise bad_request(_PARSE_PREFIX + "exceeded max depth") from err
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError, RecursionError) as err:
        raise bad_request(f"error converting YAML to JSON: {err}") from err


def decode_object(raw: bytes, kind: str = JSON) -> tuple[Any, list[str]]:
    """A create or update body as (value, duplicate-key paths); None for an empty body.

    ``kind``: the :func:`media_type`. Duplicate keys are reported for JSON bodies only.
    Raises StatusError 400 for text that does not parse (``exceeded max depth`` for one
    nested too deep).
    """
    if not raw:
        return None, []
    if kind == YAML:
        return _yaml_to_json(raw), []
    try:
        return parse_json(raw)
    except RecursionError as err:
        # Python's decoder stops before Go's 10000 levels; no API object nests that deep.
        raise bad_request(_PARSE_PREFIX + "exceeded max depth") from err
    except ValueError as err:
        raise bad_request(f"{_PARSE_PREFIX}{err}") from err


def decode_value(raw: bytes, kind: str = JSON) -> Any:
    """A DELETE or binding body (duplicates not reported); None for an empty body.
    Raises StatusError 400 as :func:`decode_object`."""
    return decode_object(raw, kind)[0]


__all__ = [
    "BUILTIN_MEDIA_TYPES",
    "MAX_REQUEST_BODY_BYTES",
    "NO_PROTOBUF_MEDIA_TYPES",
    "ClientGone",
    "decode_object",
    "decode_value",
    "media_type",
    "read_body",
    "too_large",
    "unsupported_media_type",
]
