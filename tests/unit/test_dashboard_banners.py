"""The dashboard's banners: what is broken right now, from the live status alone."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.admin.dashboard import LEADERSHIP_NEWS_SECONDS, banners, dashboard_model

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


def _at(seconds_ago: float) -> str:
    return (NOW - dt.timedelta(seconds=seconds_ago)).isoformat()


def _service(**parts: Any) -> dict[str, Any]:
    service: dict[str, Any] = {
        "leader": {"enabled": True, "is_leader": True, "holder": "r-0"},
        "inventory": [{"backend": "hall-a", "stale": False, "last_success_at": _at(30)}],
    }
    service.update(parts)
    return service


def _ids(found: list[dict[str, str]]) -> list[str]:
    return [b["id"] for b in found]


def test_a_healthy_service_has_no_banner() -> None:
    assert banners(_service(), NOW) == []
    assert banners(None, NOW) == []


def test_a_stale_inventory_names_the_manager_its_age_and_its_error() -> None:
    found = banners(
        _service(
            inventory=[
                {
                    "backend": "hall-a",
                    "stale": True,
                    "consecutive_failures": 5,
                    "last_success_at": _at(600),
                    "last_error": "connect refused",
                },
                {"backend": "hall-b", "stale": False},
            ]
        ),
        NOW,
    )
    assert _ids(found) == ["banner-stale-hall-a"]
    [banner] = found
    assert banner["level"] == "bad"
    assert "10 min ago" in banner["text"] and "5 failed in a row" in banner["text"]
    assert "connect refused" in banner["text"]


def test_no_leader_is_loud_but_a_standby_with_a_known_leader_is_not() -> None:
    standby = {"enabled": True, "is_leader": False, "holder": "r-1"}
    assert banners(_service(leader=standby), NOW) == []
    orphan = {"enabled": True, "is_leader": False, "holder": None}
    assert _ids(banners(_service(leader=orphan), NOW)) == ["banner-no-leader"]
    off = {"enabled": False, "is_leader": True, "holder": None}
    assert banners(_service(leader=off), NOW) == []


@given(st.floats(min_value=0, max_value=3 * LEADERSHIP_NEWS_SECONDS), st.booleans())
def test_leadership_lost_is_news_for_an_hour(seconds_ago: float, leads_again: bool) -> None:
    leader = {
        "enabled": True,
        "is_leader": leads_again,
        "holder": "r-0" if leads_again else "r-1",
        "lost_at": _at(seconds_ago),
        "lost_count": 2,
    }
    found = banners(_service(leader=leader), NOW)
    fresh = seconds_ago < LEADERSHIP_NEWS_SECONDS
    assert _ids(found) == (["banner-leadership-lost"] if fresh else [])
    if fresh:
        expected = "this replica again" if leads_again else "r-1"
        assert f"The leader is {expected}; 2 loss(es)" in found[0]["text"]


def test_dropped_fields_from_every_publisher_are_named_once() -> None:
    found = banners(
        _service(
            publisher={"dropped_paths": ["spec.devices[].taints"]},
            publishers={
                "v1": {"dropped_paths": ["spec.devices[].taints"]},
                "v1beta2": {"dropped_paths": ["spec.devices[].bindingConditions"]},
            },
        ),
        NOW,
    )
    assert _ids(found) == ["banner-dropped-fields"]
    title = found[0]["title"]
    assert title.count("spec.devices[].taints") == 1 and "bindingConditions" in title
    assert "withheld" in found[0]["text"]
    only_conditions = banners(
        _service(publisher={"dropped_paths": ["spec.devices[].bindingConditions"]}), NOW
    )
    assert "withheld" not in only_conditions[0]["text"]


def test_odd_shapes_give_no_banner_and_no_error() -> None:
    for service in (
        {"inventory": "nope", "leader": [], "publisher": 3},
        {"inventory": [None, 1, {"stale": True}], "leader": {"lost_at": "garbage"}},
        {"publishers": {"v1": None}},
    ):
        found = banners(service, NOW)
        assert all(b["level"] in ("bad", "warn") for b in found)
    assert _ids(banners({"inventory": [{"stale": True}]}, NOW)) == ["banner-stale-?"]


def _model(service: dict[str, Any]) -> dict[str, Any]:
    return dashboard_model(
        service=service,
        counts={"devices": {"present": 3, "by_state": {"free": 3}}},
        pools=[],
        attention={},
        driver="fabric.example.com",
        now=NOW,
    )


def test_the_cards_say_they_are_old_while_any_inventory_is_stale() -> None:
    assert _model(_service())["stale_since"] is None
    stale = [
        {"backend": "a", "stale": True, "last_success_at": _at(7200 + 60)},
        {"backend": "b", "stale": True, "last_success_at": _at(90)},
    ]
    assert _model(_service(inventory=stale))["stale_since"] == "2 h ago"
    never = [{"backend": "a", "stale": True, "last_success_at": None}]
    assert _model(_service(inventory=never))["stale_since"] == "never"


def test_every_configured_manager_has_a_freshness_line_with_its_url_and_events() -> None:
    from app.admin.dashboard import freshness

    managers = [
        {
            "name": "hall-a",
            "url": "https://a.example",
            "inventory": {"backend": "hall-a", "stale": True, "last_success_at": _at(120)},
            "events": {"state": "streaming"},
        },
        {"name": "hall-b", "url": "https://b.example", "inventory": None, "events": {}},
    ]
    lines = freshness(_service(managers=managers), {}, NOW)
    first, second = lines[0], lines[1]
    assert first["what"] == "inventory (hall-a)" and first["level"] == "bad"
    assert first["detail"].endswith("events streaming, https://a.example")
    assert second == {
        "what": "inventory (hall-b)",
        "age": "never",
        "detail": "no sync yet, https://b.example",
        "level": "warn",
    }
    # Without a managers list (an older controller), each synced manager still has its line.
    assert freshness(_service(), {}, NOW)[0]["what"] == "inventory (hall-a)"
