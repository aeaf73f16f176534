"""What the Redfish backend reads from ``$expand`` answers: the levels a service offers, the
resources expanded inside a payload, and the holders index of a listing."""

from __future__ import annotations

from typing import Any

import pytest

from app.fabric.redfish.parse.blocks import systems_by_block
from app.fabric.redfish.parse.collection import (
    MAX_EXPAND_LEVELS,
    expand_levels,
    inline_resources,
    offers_top_skip,
)


def root(expand: Any) -> dict[str, Any]:
    return {"ProtocolFeaturesSupported": {"ExpandQuery": expand}}


@pytest.mark.parametrize(
    ("service_root", "levels"),
    [
        pytest.param({}, 0, id="no-protocol-features"),
        pytest.param("not an object", 0, id="malformed-root"),
        pytest.param(root(None), 0, id="no-expand-query"),
        pytest.param(
            root({"NoLinks": False, "Levels": True, "MaxLevels": 3}), 0, id="dot-not-offered"
        ),
        pytest.param(root({"NoLinks": "true"}), 0, id="string-flag-is-not-true"),
        pytest.param(root({"NoLinks": True}), 1, id="dot-without-levels"),
        pytest.param(root({"NoLinks": True, "Levels": True}), 1, id="levels-without-max"),
        pytest.param(
            root({"NoLinks": True, "Levels": True, "MaxLevels": True}), 1, id="boolean-max-levels"
        ),
        pytest.param(root({"NoLinks": True, "Levels": True, "MaxLevels": 2}), 2, id="two"),
        pytest.param(
            root({"NoLinks": True, "Levels": True, "MaxLevels": 6}), MAX_EXPAND_LEVELS, id="capped"
        ),
    ],
)
def test_expand_levels_follow_the_service_roots_protocol_features(
    service_root: Any, levels: int
) -> None:
    assert expand_levels(service_root) == levels


@pytest.mark.parametrize(
    ("service_root", "offered"),
    [
        ({"ProtocolFeaturesSupported": {"TopSkipQuery": True}}, True),
        ({"ProtocolFeaturesSupported": {"TopSkipQuery": False}}, False),
        ({"ProtocolFeaturesSupported": {"TopSkipQuery": "true"}}, False),
        ({"ProtocolFeaturesSupported": {}}, False),
        ({"ProtocolFeaturesSupported": ["TopSkipQuery"]}, False),
        ({}, False),
        ("not an object", False),
    ],
)
def test_top_and_skip_are_used_only_when_the_service_root_says_true(
    service_root: Any, offered: bool
) -> None:
    assert offers_top_skip(service_root) is offered


def test_inline_resources_are_expanded_references_outside_links() -> None:
    block = {
        "@odata.id": "/b/1",
        "Id": "1",
        "Processors": [
            {
                "@odata.id": "/b/1/Processors/GPU0",
                "Id": "GPU0",
                "Links": {"Chassis": {"@odata.id": "/c/1", "Id": "1"}},
            }
        ],
        "Storage": [
            {
                "@odata.id": "/b/1/Storage/1/",
                "Id": "1",
                "Drives": [{"@odata.id": "/b/1/Drives/0", "Id": "0"}],
            }
        ],
        "Memory": [{"@odata.id": "/b/1/Memory/0"}],  # a plain link: read on its own
        "Links": {"Chassis": [{"@odata.id": "/c/1", "Id": "1"}]},
    }
    found = inline_resources(block)
    assert sorted(found) == ["/b/1/Drives/0", "/b/1/Processors/GPU0", "/b/1/Storage/1"]
    assert found["/b/1/Processors/GPU0"]["Id"] == "GPU0"
    assert inline_resources(None) == {}
    assert inline_resources({"@odata.id": "/b/2", "Id": "2"}) == {}


def test_systems_by_block_turns_the_systems_links_around_in_uri_order() -> None:
    index = systems_by_block(
        {
            "/s/2/": ["/b/1", "/b/2/"],
            "/s/1": ["/b/1"],
            "/s/3": [],
        }
    )
    assert index == {"/b/1": ("/s/1", "/s/2"), "/b/2": ("/s/2",)}
