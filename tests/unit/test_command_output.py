"""The operator commands' output formats and the status report, without a controller."""

from __future__ import annotations

import json
import re
from typing import Any

import click
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from app.commands.actions import check_admin_url, status_lines
from app.commands.output import structured, table


def test_table_aligns_columns_and_shows_missing_values_as_a_dash() -> None:
    text = table(("NAME", "FREE", "NOTE"), [("gpu-0", True, None), ("nvme-long-name", False, "")])
    assert text.splitlines() == [
        "NAME            FREE  NOTE",
        "gpu-0           yes   -",
        "nvme-long-name  no    -",
    ]


def test_an_empty_table_says_so_under_its_header() -> None:
    assert table(("A", "B"), []) == "A  B\n(none)"
    assert table(("A",), [], empty="no reservations") == "A\nno reservations"


@given(
    st.lists(
        st.tuples(st.text(alphabet="abc -_", max_size=8), st.integers(-5, 10**6)),
        max_size=6,
    )
)
def test_every_row_has_its_cells_in_the_column_positions(rows: list[tuple[str, int]]) -> None:
    lines = table(("KEY", "VALUE"), rows).splitlines()
    start = lines[0].index("VALUE")
    for line, (_, value) in zip(lines[1:], rows, strict=False):
        assert line[start:] == str(value)


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_structured_output_round_trips_in_key_order(output: Any) -> None:
    document = {"zeta": 1, "alpha": [{"b": "ü", "a": None}], "mid": True}
    text = structured(document, output)
    loaded = json.loads(text) if output == "json" else yaml.safe_load(text)
    assert loaded == document and list(loaded) == ["zeta", "alpha", "mid"]
    assert "ü" in text


def test_structured_refuses_a_table_format() -> None:
    with pytest.raises(ValueError, match="not a structured format"):
        structured({}, "table")  # type: ignore[arg-type]


def _status(**service: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "identity": "r-1",
        "driver": "fabric.example.com",
        "mode": "structured",
        "leader": {"enabled": True, "is_leader": False, "holder": "r-0"},
        "inventory": [
            {"backend": "hall-a", "stale": True, "device_count": 4, "last_error": "timeout"},
            {"backend": "hall-b", "consecutive_failures": 2},
            {"backend": "hall-c", "last_success_at": "2026-12-03T10:00:00+00:00"},
        ],
    }
    base.update(service)
    return {
        "service": base,
        "database": {
            "devices": {"present": 4, "by_state": {"free": 3, "attached": 1, "gone": 0}},
            "reservations": {"active": 1},
        },
        "attention": {"detach_failed": [{"device_name": "gpu-0", "last_error": "busy"}]},
    }


def test_status_lines_name_the_leader_each_manager_and_what_needs_attention() -> None:
    lines = status_lines(_status())
    assert lines[1] == "leader: r-0 (this replica follows)"
    assert lines[2].startswith("fabric manager hall-a: STALE,")
    assert lines[2].endswith("last error: timeout")
    assert lines[3].startswith("fabric manager hall-b: failing,")
    assert lines[4].startswith("fabric manager hall-c: fresh, last complete sync 2026-12-03")
    assert "devices: 4 present; 3 free, 1 attached" in lines
    assert "reservations: 1 active" in lines and "claims waiting: 0" in lines
    assert lines[-2:] == [
        "attention: 1",
        "  detach failed: device_name gpu-0, last_error busy",
    ]


def test_status_lines_survive_a_document_with_parts_missing() -> None:
    lines = status_lines({})
    assert lines[0].startswith("controller ?: driver ?") and lines[-1] == "attention: nothing"
    assert "devices: 0 present" in lines, lines
    assert status_lines(_status(leader={"enabled": False, "is_leader": True}))[1] == (
        "leader: this replica (leader election off)"
    )


def test_status_lines_show_each_configured_manager_with_its_url_and_events() -> None:
    managers = [
        {
            "name": "hall-a",
            "url": "https://a.example",
            "state": "stale",
            "inventory": {"backend": "hall-a", "stale": True, "device_count": 4},
            "events": {"state": "polling"},
        },
        {"name": "hall-b", "url": "https://b.example", "inventory": None, "events": {}},
        "not a manager",
    ]
    lines = status_lines(_status(managers=managers))
    assert lines[2].startswith("fabric manager hall-a (https://a.example): STALE, events polling,")
    assert "4 devices" in lines[2]
    assert lines[3] == "fabric manager hall-b (https://b.example): never synced"
    assert lines[4].startswith("devices: ")


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://127.0.0.1:1", "not an http:// or https:// URL"),
        ("http://127.0.0.1:99999", "not a valid URL (Port out of range"),
        ("http://127.0.0.1:abc", "not a valid URL"),
        ("http://[::1", "not a valid URL"),
        ("http://:8080", "names no host"),
        ("http://127.0.0.1:0", "the port must be from 1 to 65535"),
        ("http://user:hunter2@127.0.0.1:1", "carries a user name or password"),
        ("http://user:hunter2@127.0.0.1:99999", "not a valid URL"),
        ("ftp://user:hunter2@127.0.0.1", "not an http:// or https:// URL"),
    ],
)
def test_a_bad_admin_url_is_a_usage_error(url: str, words: str) -> None:
    with pytest.raises(click.BadParameter, match=re.escape(words)) as caught:
        check_admin_url(url)
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8080/", "https://[::1]:8443", "http://controller.ns.svc"]
)
def test_a_good_admin_url_loses_its_trailing_slash_only(url: str) -> None:
    assert check_admin_url(url) == url.rstrip("/")


def test_reservations_refuses_an_unknown_state_before_connecting() -> None:
    from click.testing import CliRunner

    from app.commands.actions import reservations

    result = CliRunner().invoke(
        reservations, ["--state", "bogus", "--admin-url", "http://127.0.0.1:1"]
    )
    assert result.exit_code == 2
    assert "'bogus' is not one of 'pending'" in result.output
    assert "cannot reach" not in result.output
