"""The copy of object JSON (the controller's and the emulator's): the same as
``copy.deepcopy``, sharing nothing."""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.jsontypes import json_copy

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


def test_other_types_go_to_deepcopy() -> None:
    inner = [1, {"a": 2}]
    value = {"t": (inner,), "o": OrderedDict(k=[3])}
    copied = json_copy(value)
    assert copied == value
    assert copied["t"][0] is not inner
    assert type(copied["o"]) is OrderedDict
    assert copied["o"]["k"] is not value["o"]["k"]
