"""Redfish payload parsing for what real composability services send (REDFISH-REFERENCE.md,
"What a real composability service did"): empty block types, server-owned blocks, bare error
bodies, misquoted ETags, missing health, devices without their own slot, placeholder serials."""

from __future__ import annotations

import json
from typing import Any

import pytest
from builders import REDFISH_DATA
from hypothesis import given
from hypothesis import strategies as st

from app.fabric.errors import FabricError, FabricUnavailable
from app.fabric.redfish.parse.blocks import (
    BlockInfo,
    DeviceSource,
    is_cpu,
    parse_block,
    server_owned_reason,
)
from app.fabric.redfish.parse.common import parse_health
from app.fabric.redfish.parse.devices import DeviceContext, parse_device
from app.fabric.redfish.parse.errors import error_from_response
from app.fabric.redfish.parse.headers import normalise_etag, preferred_etag
from app.fabric.redfish.parse.identity import device_identity
from app.fabric.redfish.parse.tasks import parse_task
from app.fabric.types import DeviceType, FabricDevice, Health, Location, OperationState

DATA = REDFISH_DATA
COMPOSABILITY = DATA / "dmtf-public-composability"
BLOCKS = "/redfish/v1/CompositionService/ResourceBlocks"


def mockup_block(name: str, **changes: Any) -> BlockInfo:
    uri = f"{BLOCKS}/{name}"
    payload = json.loads((COMPOSABILITY / uri.strip("/") / "index.json").read_text())
    payload.update(changes)
    return parse_block(payload, uri)


def gpu(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "@odata.id": "/b/Processors/GPU0",
        "ProcessorType": "GPU",
        "Status": {"State": "Enabled", "Health": "OK"},
    }
    payload.update(changes)
    return payload


def parse_gpu(
    payload: dict[str, Any], block: BlockInfo | None = None, location: Location | None = None
) -> FabricDevice:
    context = DeviceContext(block or BlockInfo(uri="/b"), location or Location())
    device = parse_device(payload, "/b/Processors/GPU0", DeviceSource.PROCESSOR, context)
    assert device is not None
    return device


# --- server-owned blocks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "changes", "patterns", "says"),
    [
        pytest.param("ComputeBlock1", {}, (), "ResourceBlockType Compute", id="compute-type"),
        pytest.param(
            "SystemBlock11", {}, (), "ResourceBlockType ComputerSystem", id="computer-system-type"
        ),
        pytest.param(
            "SystemBlock12",
            {"ResourceBlockType": []},
            (),
            "/redfish/v1/Systems/SystemAfterAddResourceAction",
            id="top-level-computer-systems",
        ),
        pytest.param(
            "OffloadBlock9",
            {"ResourceBlockType": []},
            ("Offload*",),
            "'Offload*'",
            id="pattern-on-id",
        ),
        pytest.param(
            "OffloadBlock9", {}, (f"{BLOCKS}/Offload?lock9",), "pattern", id="pattern-on-uri"
        ),
    ],
)
def test_blocks_that_are_a_servers_own_say_why(
    name: str, changes: dict[str, Any], patterns: tuple[str, ...], says: str
) -> None:
    reason = server_owned_reason(mockup_block(name, **changes), patterns)
    assert reason is not None and says in reason


@pytest.mark.parametrize(
    ("name", "patterns"),
    [
        pytest.param("OffloadBlock9", (), id="gpu-block"),
        pytest.param("ComputeBlock1", (), id="compute-block-with-empty-types"),
        pytest.param("DriveBlock3", ("Offload*", "offloadblock9"), id="other-patterns"),
    ],
)
def test_blocks_with_empty_types_and_no_server_sign_are_not_server_owned_by_the_block_alone(
    name: str, patterns: tuple[str, ...]
) -> None:
    # ComputeBlock1 with ResourceBlockType [] (as real services send) is found by its CPUs.
    assert server_owned_reason(mockup_block(name, ResourceBlockType=[]), patterns) is None


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"ProcessorType": "CPU"}, True),
        ({"ProcessorType": " cpu "}, True),
        ({"ProcessorType": "GPU"}, False),
        ({"ProcessorType": None}, False),
        ({}, False),
        (None, False),
        ("CPU", False),
        ({"ProcessorType": 1}, False),
    ],
)
def test_a_cpu_is_a_processor_of_type_cpu(payload: Any, expected: bool) -> None:
    assert is_cpu(payload) is expected


@pytest.mark.parametrize(
    ("source", "payload"),
    [
        pytest.param(DeviceSource.PROCESSOR, gpu(), id="gpu"),
        pytest.param(DeviceSource.MEMORY, {"@odata.id": "/m", "CapacityMiB": 1024}, id="dram"),
        pytest.param(DeviceSource.ETHERNET_INTERFACE, {"@odata.id": "/n"}, id="nic"),
    ],
)
def test_nothing_in_a_compute_block_is_a_device(
    source: DeviceSource, payload: dict[str, Any]
) -> None:
    block = BlockInfo(uri="/b", block_types=("Compute", "Network"))
    assert parse_device(payload, "/x", source, DeviceContext(block)) is None


# --- health and state -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "status",
    [
        {},
        {"Health": None},
        {"Health": ""},
        {"Health": "   "},
        {"Health": "Degraded"},
        {"Health": 3},
        {"Health": ["OK"]},
        {"Health": {"Value": "OK"}},
    ],
    ids=["missing", "null", "empty", "blank", "unrecognised", "number", "array", "object"],
)
def test_health_that_is_missing_null_empty_or_unrecognised_is_unknown(
    status: dict[str, Any],
) -> None:
    assert parse_health(status) is Health.UNKNOWN
    assert parse_gpu(gpu(Status=status)).health is Health.UNKNOWN


@given(
    st.sampled_from(list(Health)),
    st.sampled_from([str.lower, str.upper, str.title]),
    st.sampled_from(["", " ", "\t"]),
)
def test_health_is_read_without_case_or_padding(
    health: Health, spelling: Any, padding: str
) -> None:
    value = padding + spelling(health.value) + padding
    assert parse_health({"Health": value}) is health


@pytest.mark.parametrize("state", [None, "", "  "], ids=["null", "empty", "blank"])
def test_a_missing_null_or_empty_state_is_none(state: str | None) -> None:
    assert parse_gpu(gpu(Status={"Health": "OK", "State": state})).state is None
    assert parse_gpu(gpu(Status={"Health": "OK"})).state is None


@pytest.mark.parametrize(
    ("device", "block", "expected"),
    [
        pytest.param(None, "OK", Health.UNKNOWN, id="unknown-device-in-a-healthy-block"),
        pytest.param(None, None, Health.UNKNOWN, id="neither-knows"),
        pytest.param(None, "Warning", Health.WARNING, id="unknown-device-in-a-warning-block"),
        pytest.param(None, "Critical", Health.CRITICAL, id="unknown-device-in-a-failed-block"),
        pytest.param("OK", None, Health.OK, id="unknown-block-does-not-degrade"),
        pytest.param("Warning", "OK", Health.WARNING, id="device-worse"),
        pytest.param("OK", "Critical", Health.CRITICAL, id="block-worse"),
    ],
)
def test_device_health_combines_with_the_block_by_the_documented_rule(
    device: str | None, block: str | None, expected: Health
) -> None:
    block_info = parse_block({"@odata.id": "/b", "Status": {"Health": block}}, "/b")
    assert parse_gpu(gpu(Status={"Health": device}), block_info).health is expected


# --- location -------------------------------------------------------------------------------


def test_a_device_without_its_own_part_location_has_no_slot() -> None:
    enclosure = Location(chassis="encl-1", rack="r7", slot="bay-3")
    device = parse_gpu(gpu(), location=enclosure)
    assert device.location == Location(chassis="encl-1", rack="r7", slot=None)
    own = parse_gpu(gpu(Location={"PartLocation": {"LocationOrdinalValue": 2}}), location=enclosure)
    assert own.location.slot == "2"


# --- errors and tasks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "says"),
    [
        pytest.param(
            {"message": "Block is in use\nby node-3"},
            "Block is in use by node-3",
            id="top-level-message",
        ),
        pytest.param({"Message": "Nope"}, "Nope", id="top-level-capital-message"),
        pytest.param({"error": "no such block"}, "no such block", id="error-string"),
        pytest.param("plain text\r\n  answer", "plain text answer", id="plain-text"),
        pytest.param(
            "<html><title>406</title><body>Not Acceptable</body></html>",
            "406 Not Acceptable",
            id="html",
        ),
    ],
)
def test_error_bodies_without_a_redfish_error_object_show_their_text(body: Any, says: str) -> None:
    error = error_from_response(406, body, context="PATCH /s")
    assert str(error) == f"PATCH /s: HTTP 406: {says}"


def test_long_plain_text_errors_are_capped_on_one_line() -> None:
    error = error_from_response(500, "line\n" * 500, context="GET /x")
    assert "\n" not in str(error)
    assert len(str(error)) < 340 and str(error).endswith("...")


@pytest.mark.parametrize("status", [400, 403, 405, 406, 501])
def test_permanent_statuses_are_never_retryable(status: int) -> None:
    for body in (
        None,
        {"message": "x"},
        {
            "error": {
                "@Message.ExtendedInfo": [{"MessageId": "Base.1.18.ServiceTemporarilyUnavailable"}]
            }
        },
    ):
        error = error_from_response(status, body, context="POST /a")
        assert not error.retryable, (status, body)
        assert not isinstance(error, FabricUnavailable)
        assert isinstance(error, FabricError)


def test_a_500_and_a_502_stay_retryable() -> None:
    assert error_from_response(500, None, context="GET /x").retryable
    assert error_from_response(502, "Bad Gateway", context="GET /x").retryable


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('"abc"', '"abc"'),
        ('""abc""', '"abc"'),
        ("abc", '"abc"'),
        (' "abc" ', '"abc"'),
        ('W/"abc"', 'W/"abc"'),
        ('W/""abc""', 'W/"abc"'),
        ("W/abc", 'W/"abc"'),
        ('""', None),
        ("", None),
        (None, None),
    ],
)
def test_etags_are_repaired_to_one_pair_of_quotes_keeping_a_weak_prefix(
    raw: str | None, expected: str | None
) -> None:
    assert normalise_etag(raw) == expected


def test_the_body_etag_is_preferred_to_the_header() -> None:
    assert preferred_etag('""header""', '"body"') == '"body"'
    assert preferred_etag('""header""', None) == '"header"'
    assert preferred_etag(None, None) is None


@pytest.mark.parametrize("state", ["Killed", "Exception", "Cancelled"])
def test_a_task_that_ends_badly_says_its_state(state: str) -> None:
    bare = parse_task({"TaskState": state}, "/m")
    assert (bare.state, bare.message) == (OperationState.FAILED, f"TaskState {state}")
    said = parse_task({"TaskState": state, "Messages": [{"Message": "why"}]}, "/m")
    assert said.message == f"TaskState {state}: why"


# --- device identity ------------------------------------------------------------------------


def device(serial: str | None = None, uuid: str | None = None) -> FabricDevice:
    return FabricDevice(
        vendor_id="/d", attach_unit="/b", device_type=DeviceType.GPU, serial=serial, uuid=uuid
    )


def test_identity_by_serial_or_uuid_ignores_the_uri_and_uuid_case() -> None:
    assert device_identity(device("S1"), "serial") == "serial:S1"
    assert device_identity(device(uuid="AB-cd"), "uuid") == device_identity(
        device(uuid="ab-CD"), "uuid"
    )
    assert device_identity(device("S1", "u"), "uri") is None
    assert device_identity(device(uuid="u"), "serial") is None
    with pytest.raises(ValueError, match="serial"):
        device_identity(device(), "name")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "placeholder",
    [
        "",
        "  ",
        "0",
        "0000000",
        "00000000-0000-0000-0000-000000000000",
        "N/A",
        "Not Specified",
        "To Be Filled By O.E.M.",
        "unknown",
    ],
)
def test_placeholder_serials_and_uuids_are_no_identity(placeholder: str) -> None:
    assert device_identity(device(placeholder, placeholder), "serial") is None
    assert device_identity(device(placeholder, placeholder), "uuid") is None
