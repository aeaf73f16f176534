"""Server-sent events as the WHATWG event stream interpretation reads them, and DSP0266
Event payloads as fabric events."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.fabric.events import SseMessage, redfish_events, sse_messages


def test_messages_dispatch_on_a_blank_line_with_the_last_id() -> None:
    lines = [
        ": a comment",
        "id: 7",
        'data: {"a":',
        "data: 1}",
        "",
        "event: ping",
        "data:x",
        "",
        "data: no id change",
        "",
        "id: 9",
        "data: cut off",
    ]
    assert list(sse_messages(lines, last_id="3")) == [
        SseMessage("7", "message", '{"a":\n1}'),
        SseMessage("7", "ping", "x"),
        SseMessage("7", "message", "no id change"),
    ]


def test_an_id_with_nul_and_a_message_without_data_are_ignored() -> None:
    lines = ["id: 1", "data: a", "", "id: bad\0id", "retry: 10", "", "data: b", ""]
    assert list(sse_messages(lines)) == [
        SseMessage("1", "message", "a"),
        SseMessage("1", "message", "b"),
    ]


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)))
def test_any_lines_parse_without_error_and_data_never_gains_lines(lines: list[str]) -> None:
    lines = [line.replace("\n", "").replace("\r", "") for line in lines]
    for message in sse_messages(lines):
        data_lines = sum(1 for line in lines if line.startswith("data"))
        assert message.data.count("\n") < max(data_lines, 1)


def _message(*records: object, event_id: str = "5") -> SseMessage:
    return SseMessage(event_id, "message", json.dumps({"Events": list(records)}))


def test_events_name_their_message_origin_and_relevance() -> None:
    found = redfish_events(
        _message(
            {
                "MessageId": "ResourceEvent.1.0.ResourceStatusChangedCritical",
                "OriginOfCondition": {
                    "@odata.id": "/redfish/v1/CompositionService/ResourceBlocks/B1/"
                },
            },
            {
                "MessageId": "ResourceEvent.1.3.ResourceChanged",
                "OriginOfCondition": {"@odata.id": "/redfish/v1/Systems/S1"},
            },
            {
                "MessageId": "ResourceEvent.1.0.ResourceChanged",
                "OriginOfCondition": {"@odata.id": "/redfish/v1/Managers/BMC"},
            },
            {"MessageId": "Base.1.8.Success"},
            {"MessageId": "ResourceEvent.1.0.ResourceRemoved"},
        )
    )
    assert [(e.message, e.origin, e.relevant) for e in found] == [
        ("ResourceStatusChangedCritical", "/redfish/v1/CompositionService/ResourceBlocks/B1", True),
        ("ResourceChanged", "/redfish/v1/Systems/S1", True),
        ("ResourceChanged", "/redfish/v1/Managers/BMC", False),
        ("Success", None, False),
        ("ResourceRemoved", None, True),  # no origin: it may be anything, sync
    ]
    assert {e.event_id for e in found} == {"5"}


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"Events": "x"}', "no Events array"),
        ('{"Id": "1"}', "no Events array"),
        ('{"Events": [{"MessageId": 3}]}', "Events[0] has no string MessageId"),
        ('{"Events": [7]}', "Events[0] has no string MessageId"),
    ],
)
def test_a_malformed_event_is_a_value_error_naming_the_problem(data: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        redfish_events(SseMessage("1", "message", data))
