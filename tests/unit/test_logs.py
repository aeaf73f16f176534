"""Logging: redaction of credentials, JSON lines."""

from __future__ import annotations

import json
import logging
import time

import pytest

from app.logs import JsonFormatter, RedactingFilter, redact


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("connecting to postgresql+asyncpg://app:hunter2@db:5432/x", "hunter2"),
        ("headers {'X-Auth-Token': 'abc123def'}", "abc123def"),
        ("Authorization: Basic YWRtaW46cGFzc3dvcmQ=", "YWRtaW46cGFzc3dvcmQ="),
        ('{"UserName": "admin", "Password": "s3cr3t"}', "s3cr3t"),
        ("token=eyJhbGciOi.payload.sig", "eyJhbGciOi.payload.sig"),
    ],
)
def test_redact_hides_credentials(text: str, secret: str) -> None:
    assert secret not in redact(text)
    assert "***" in redact(text)


def test_redact_leaves_ordinary_text_alone() -> None:
    text = "inventory sync of backend redfish: 128 devices in 0.5s from https://fm.example:443"
    assert redact(text) == text


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("app.x", logging.WARNING, __file__, 1, message, args, None)


def test_filter_redacts_arguments_too() -> None:
    item = record("login to %s failed", "https://admin:pw123@fm:443")
    assert RedactingFilter().filter(item)
    assert "pw123" not in item.getMessage()


def test_json_formatter_writes_one_object_a_line() -> None:
    try:
        raise ValueError("boom password=abc")
    except ValueError:
        import sys

        item = logging.LogRecord(
            "app.x", logging.ERROR, __file__, 1, "failed %d", (3,), sys.exc_info()
        )
    line = JsonFormatter().format(item)
    entry = json.loads(line)
    assert entry["message"] == "failed 3" and entry["level"] == "ERROR"
    assert entry["time"].endswith("Z")
    assert "abc" not in entry["exception"] and "ValueError" in entry["exception"]
    assert "\n" not in line


def test_json_time_is_utc_whatever_the_local_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    # A POSIX zone five and a half hours east of UTC (no tz database needed).
    monkeypatch.setenv("TZ", "XST-05:30")
    time.tzset()
    try:
        item = record("sync done")
        item.created, item.msecs = 1767323045.25, 250.0  # 2026-01-02T03:04:05.250Z
        assert time.localtime(item.created).tm_hour == 8  # the zone is in force
        entry = json.loads(JsonFormatter().format(item))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert entry["time"] == "2026-01-02T03:04:05.250Z"
