"""The JSON shapes shared by the Kubernetes and Redfish sides: one definition for every module.

``JsonDict`` is a decoded JSON object (``json.loads`` of an API server's or a fabric manager's
answer, or a body about to be sent): string keys, values of any JSON type.
"""

from __future__ import annotations

import copy
import json
from typing import Any, TypeAlias, TypeVar, cast

import orjson

JsonDict: TypeAlias = dict[str, Any]
"""A decoded JSON object."""

T = TypeVar("T")


def json_copy(value: T) -> T:
    """A deep copy of JSON-shaped ``value`` (dicts, lists and immutable scalars): what
    ``copy.deepcopy`` returns for it, about three times faster (no memo, no dispatch by type).
    Anything else inside (a tuple, a set, a dict subclass) is copied by ``copy.deepcopy``."""
    return cast(T, _copy(value))


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {key: _copy(item) for key, item in value.items()}
    if kind is list:
        return [_copy(item) for item in value]
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    return copy.deepcopy(value)


def loads_json(raw: bytes | str) -> Any:
    """Decode JSON text, about three times faster than ``json.loads`` (orjson).

    As strict as Go's ``encoding/json``, which writes what the API server sends: the
    ``NaN`` and ``Infinity`` literals ``json.loads`` accepts are refused, and so is text
    that is not UTF-8. An integer beyond 64 bits is read as a float, as Go reads it into an
    ``interface{}`` (the API server's own integers are int64).

    Raises:
        ValueError: not JSON (``orjson.JSONDecodeError`` is a ``json.JSONDecodeError``).
    """
    return orjson.loads(raw)


def dumps_json(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (no spaces, non-ASCII characters as themselves), about
    ten times faster than ``json.dumps`` (orjson). What orjson refuses (an integer beyond
    64 bits, a key that is not a string) is written by ``json.dumps`` instead. A float NaN
    or infinity becomes ``null`` (``json.dumps`` writes a ``NaN`` literal, which is not JSON).

    Raises:
        TypeError, ValueError: ``value`` is not JSON-shaped (``json.dumps``'s errors).
    """
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
