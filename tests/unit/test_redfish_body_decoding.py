"""A Redfish body is decoded with orjson, and with ``json.loads`` what orjson refuses but a
service may send (app/fabric/redfish/transport.py ``_loads``): the same values either way,
and ``json.loads``'s error for what is not JSON."""

from __future__ import annotations

import json
import math

import pytest

from app.fabric.redfish.transport import _decode, _loads

BODY = {"@odata.id": "/redfish/v1/Systems/1", "Name": "Système", "MemoryGiB": 512, "Links": {}}


@pytest.mark.parametrize(
    "raw",
    [
        json.dumps(BODY).encode(),
        json.dumps(BODY, ensure_ascii=False).encode(),
        b"\xef\xbb\xbf" + json.dumps(BODY).encode(),  # a UTF-8 byte order mark
        json.dumps(BODY).encode("utf-16"),
        json.dumps(BODY).encode("utf-32-le"),
    ],
)
def test_a_body_reads_as_json_loads_reads_it(raw: bytes) -> None:
    assert _loads(raw) == json.loads(raw) == BODY


def test_nan_is_read_as_json_loads_reads_it() -> None:
    assert math.isnan(_loads(b'{"Reading": NaN}')["Reading"])


@pytest.mark.parametrize("raw", [b'{"Members": [', b"\xff\xfe\xff", b"<html>"])
def test_what_is_not_json_fails_with_json_loads_error(raw: bytes) -> None:
    with pytest.raises((json.JSONDecodeError, UnicodeDecodeError)) as caught:
        _loads(raw)
    with pytest.raises(type(caught.value)) as expected:
        json.loads(raw)
    assert str(caught.value) == str(expected.value)
    assert _decode(raw) is None
