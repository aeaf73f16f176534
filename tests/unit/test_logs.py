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


def test_setup_logging_filters_aiohttps_bad_request_records_once() -> None:
    from app.logs import BadRequestFilter, setup_logging

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    server = logging.getLogger("aiohttp.server")
    try:
        setup_logging("INFO")
        setup_logging("INFO")
        assert sum(isinstance(f, BadRequestFilter) for f in server.filters) == 1
    finally:
        for f in [f for f in server.filters if isinstance(f, BadRequestFilter)]:
            server.removeFilter(f)
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])


def test_a_bad_request_record_keeps_its_client_and_reason_only() -> None:
    from aiohttp.http_exceptions import LineTooLong

    from app.logs import BadRequestFilter

    record = _server_error(LineTooLong(b"Bearer abcdefghij...", "8190"))
    assert BadRequestFilter().filter(record)
    assert record.levelname == "WARNING" and record.exc_info is None
    assert record.getMessage() == (
        "bad HTTP request from 10.0.0.9: Got more than 8190 bytes when reading (answered 400)"
    )


def test_other_aiohttp_server_records_pass_unchanged() -> None:
    from app.logs import BadRequestFilter

    record = _server_error(RuntimeError("handler bug"))
    assert BadRequestFilter().filter(record)
    assert record.levelname == "ERROR" and record.exc_info is not None


def test_a_plain_traceback_is_redacted() -> None:
    from app.logs import RedactingPlainFormatter

    try:
        raise ValueError("Authorization: Bearer abc123secret")
    except ValueError as err:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), (type(err), err, err.__traceback__)
        )
    assert "abc123secret" not in RedactingPlainFormatter("%(message)s").format(record)


def _server_error(error: Exception) -> logging.LogRecord:
    """The record aiohttp's server logs for ``error`` raised while handling a request."""
    try:
        raise error
    except Exception as err:
        return logging.LogRecord(
            "aiohttp.server",
            logging.ERROR,
            __file__,
            1,
            "Error handling request from %s",
            ("10.0.0.9",),
            (type(err), err, err.__traceback__),
        )
