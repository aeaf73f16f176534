"""Logging set-up: plain or JSON lines on stderr, with credentials redacted.

Secrets are kept out of log calls by design (they live in :class:`pydantic.SecretStr` and
private attributes); :class:`RedactingFilter` is the second line of defence: it hides URL user
information and ``Authorization`` / ``X-Auth-Token`` / password values in every record.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

_PATTERNS = (
    (re.compile(r"://[^/@\s]*@"), "://***@"),
    (
        re.compile(
            r"(?i)(authorization|x-auth-token|password|passwd|secret|token)"
            r"([\"']?\s*[:=]\s*[\"']?)((?:basic|bearer)\s+)?[^\s\"',}]+"
        ),
        r"\1\2\3***",
    ),
)


def redact(text: str) -> str:
    """``text`` with URL user information and token or password values replaced by ``***``."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """Renders each record's message once, redacted, so no handler sees the raw text."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = redact(record.getMessage())
        record.msg, record.args = message, None
        return True


class BadRequestFilter(logging.Filter):
    """aiohttp's server logs a request it could not parse (a malformed or oversized header, a
    bad Content-Length) at ERROR with a traceback, and the exception's text quotes the raw
    bytes, a bearer token among them. For the ``aiohttp.server`` logger: such a record becomes
    one WARNING line naming the client and the reason only. Other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "bad HTTP request from %s: %s (answered %s)"
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.args = (remote, http_error_reason(exc.message), exc.code)
            record.exc_info, record.exc_text = None, None
        return True


def http_error_reason(message: str) -> str:
    """The reason of an HTTP parser error, without the bytes it quotes: its first line, cut
    before a quoted ``b'...'`` (``Invalid header value char``, ``Got more than 8190 bytes
    when reading``), redacted."""
    first = (message.strip().splitlines() or ["malformed request"])[0]
    reason = re.split(r":\s*(?:b['\"]|$)", first, maxsplit=1)[0].strip(" .:")
    return redact(reason) or "malformed request"


def install_bad_request_filter() -> logging.Filter:
    """Put :class:`BadRequestFilter` on aiohttp's server logger (once); returns it."""
    server = logging.getLogger("aiohttp.server")
    for existing in server.filters:
        if isinstance(existing, BadRequestFilter):
            return existing
    installed = BadRequestFilter()
    server.addFilter(installed)
    return installed


class RedactingPlainFormatter(logging.Formatter):
    """The plain line format, with tracebacks redacted as messages are."""

    def formatException(self, ei: Any) -> str:
        return redact(super().formatException(ei))


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, and exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            # UTC whatever the process's time zone (formatTime would give local time).
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(level: str = "INFO", json_format: bool = False) -> None:
    """Send log records of ``level`` and above to stderr, plain or as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactingFilter())
    if json_format:
        handler.setFormatter(JsonFormatter())
    else:
        formatter = RedactingPlainFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    install_bad_request_filter()
    # Library chatter below WARNING is noise for an operator.
    for noisy in ("aiohttp.access", "sqlalchemy.engine", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
