"""The copy of object JSON (the controller's and the emulator's): the same as
``copy.deepcopy``, sharing nothing; and the JSON text of the API traffic (``dumps_json``,
``loads_json``): the same values as the ``json`` module's."""

from __future__ import annotations

import copy
import enum
import json
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.jsontypes import dumps_json, json_copy, loads_json

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)


def _containers(value: Any) -> list[int]:
    """The ids of every dict and list inside ``value``."""
    if isinstance(value, dict):
        return [id(value), *(i for v in value.values() for i in _containers(v))]
    if isinstance(value, list):
        return [id(value), *(i for v in value for i in _containers(v))]
    return []


@given(_json)
def test_equal_to_deepcopy_and_sharing_no_container(value: Any) -> None:
    copied = json_copy(value)
    assert copied == copy.deepcopy(value)
    assert not set(_containers(copied)) & set(_containers(value))


class _Text(str):
    pass


class _Count(int):
    pass


_mixed = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too
    | st.floats()  # NaN, infinities and -0.0 too
    | st.text()  # lone surrogates too
    | st.builds(_Text, st.text(max_size=3))
    | st.builds(_Count, st.integers(0, 3)),
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=8), children, max_size=4)
        | st.dictionaries(st.text(max_size=3), children, max_size=2).map(OrderedDict)
    ),
    max_leaves=30,
)


def _shape(value: Any) -> Any:
    """``value`` with every type spelled out (``==`` alone takes 1 for True, a NaN for no
    NaN, and a tuple's items for a list's only when the types match)."""
    if isinstance(value, dict):
        return (type(value), [(type(k), k, _shape(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value), [_shape(v) for v in value])
    if isinstance(value, float) and value != value:
        return (float, "nan")
    return (type(value), repr(value))


@given(_mixed)
def test_any_value_copies_as_deepcopy_does(value: Any) -> None:
    copied = json_copy(value)
    assert _shape(copied) == _shape(copy.deepcopy(value))
    assert not set(_containers(copied)) & set(_containers(value))


def test_an_int_or_str_enum_member_comes_back_as_its_value() -> None:
    """The one departure from ``copy.deepcopy``: orjson writes an enum member as its value,
    and an ``IntEnum`` or ``StrEnum`` member equals it."""

    class Phase(enum.StrEnum):
        READY = "ready"

    class Plain(enum.Enum):
        A = "a"

    copied = json_copy({"phase": Phase.READY})
    assert copied == {"phase": "ready"}
    assert type(copied["phase"]) is str
    # A plain enum member does not equal its value: the whole value goes the slow way.
    copied = json_copy({"phase": Phase.READY, "plain": Plain.A})
    assert copied["phase"] is Phase.READY
    assert copied["plain"] is Plain.A


def test_other_types_go_to_deepcopy() -> None:
    inner = [1, {"a": 2}]
    value = {"t": (inner,), "o": OrderedDict(k=[3])}
    copied = json_copy(value)
    assert copied == value
    assert copied["t"][0] is not inner
    assert type(copied["o"]) is OrderedDict
    assert copied["o"]["k"] is not value["o"]["k"]


_text = st.text(st.characters(blacklist_categories=("Cs",)))
_wire = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=4),
    max_leaves=30,
)


@given(_wire)
def test_dumps_and_loads_agree_with_the_json_module(value: Any) -> None:
    text = dumps_json(value)
    assert isinstance(text, bytes)
    assert json.loads(text) == value
    assert loads_json(text) == value
    assert loads_json(json.dumps(value)) == value


def test_dumps_is_compact_utf8_and_falls_back_for_what_orjson_refuses() -> None:
    assert dumps_json({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()
    assert dumps_json({"n": 2**70}) == b'{"n":1180591620717411303424}'
    assert dumps_json({1: True}) == b'{"1":true}'
    # The API server's integers are int64 (Go); a larger one is read as a float.
    assert loads_json(b"18446744073709551616") == 2.0**64


@pytest.mark.parametrize("text", [b"NaN", b'{"a": Infinity}', b"{", b"\xff", b""])
def test_loads_refuses_what_go_refuses(text: bytes) -> None:
    with pytest.raises(ValueError, match=r"."):
        loads_json(text)
