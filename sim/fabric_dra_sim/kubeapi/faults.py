"""Fault injection and the request log of the emulator.

Tests make the next matching requests fail with real ``Status`` bodies (500, 429 with
Retry-After, 409, ...), slow every request down, hold back the responses of matching requests
after they took effect (so that their watch events arrive first), and read back which requests
were made. The watch faults (old events replayed, ERROR 410 in live watches) act on the store's
watchers; see :class:`.emulator.KubeEmulator`.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

from .errors import StatusError

_REASONS = {
    400: ("BadRequest", "the server rejected our request for an unknown reason"),
    401: ("Unauthorized", "Unauthorized"),
    403: ("Forbidden", "forbidden: injected fault"),
    404: ("NotFound", "the server could not find the requested resource"),
    409: (
        "Conflict",
        "Operation cannot be fulfilled: the object has been modified; please "
        "apply your changes to the latest version and try again",
    ),
    410: ("Expired", "too old resource version"),
    422: ("Invalid", "the server rejected our request due to an error in our request"),
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: injected fault"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "the server was unable to return a response in the time allotted"),
}


@dataclass(frozen=True)
class RequestRecord:
    """One request as served: HTTP ``method``, URL ``path`` (no query), response ``status``,
    request ``content_type`` ('' when none), ``query`` string ('' when none, not decoded).
    """

    method: str
    path: str
    status: int
    content_type: str
    query: str = ""

    @property
    def url(self) -> str:
        """``path?query`` (just the path without a query)."""
        return f"{self.path}?{self.query}" if self.query else self.path


@dataclass
class FailRule:
    """Fail the next ``remaining`` requests matching ``method`` ('*' = any) and ``pattern``."""

    remaining: int
    method: str
    pattern: re.Pattern[str]
    status: int
    retry_after: int | None


@dataclass
class DelayRule:
    """Hold back the responses of matching requests by ``seconds`` after they were handled;
    ``remaining`` uses left (None: until cleared)."""

    remaining: int | None
    method: str
    pattern: re.Pattern[str]
    seconds: float


@dataclass
class ResponseHold:
    """The answer of one matching request, held after the request took effect until
    :meth:`release`. ``reached`` is set once a request is being held (its watch events are
    out), so a test can order things without timing: wait for ``reached``, act, release.
    """

    method: str
    pattern: re.Pattern[str]
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        """Let the held answer go (also before it was reached: it is then not held)."""
        self.released.set()


def injected_error(status: int, retry_after: int | None) -> StatusError:
    """The Status error for an injected failure; 429 and 5xx carry Retry-After when given
    (as kube-apiserver's max-in-flight filter does for 429).
    """
    reason, message = _REASONS.get(status, ("InternalError", f"injected HTTP {status}"))
    details: dict[str, object] | None = None
    headers: dict[str, str] = {}
    if retry_after is not None:
        details = {"retryAfterSeconds": retry_after}
        headers["Retry-After"] = str(retry_after)
    return StatusError(status, reason, message, details, headers)


class Faults:
    """Pending failure rules, added latency and the log of requests served."""

    def __init__(self) -> None:
        self.rules: list[FailRule] = []
        self.delays: list[DelayRule] = []
        self.holds: list[ResponseHold] = []
        self.latency_s = 0.0
        # How long a list or watch for a resourceVersion the store has not reached waits
        # before 504 (k8s.io/apiserver pkg/storage/cacher/watch_cache.go blockTimeout).
        self.fresh_wait_s = 3.0
        self.requests: list[RequestRecord] = []

    def delay_responses(
        self, seconds: float, *, method: str = "*", path_regex: str = ".*", n: int | None = None
    ) -> None:
        """Hold back the response of the next ``n`` (None: every) requests whose method and
        path (``re.search``) match by ``seconds``, after they took effect. ``seconds`` 0
        removes every delay rule. Raises ValueError for negative seconds or n < 1.
        """
        if seconds < 0:
            raise ValueError("seconds must not be negative")
        if n is not None and n < 1:
            raise ValueError("n must be at least 1")
        if seconds == 0:
            self.delays.clear()
            return
        self.delays.append(DelayRule(n, method.upper(), re.compile(path_regex), seconds))

    def take_delay(self, method: str, path: str) -> float:
        """Seconds to hold back this response (0 for none), consuming one use of the first
        matching rule."""
        for rule in self.delays:
            if rule.method in ("*", method) and rule.pattern.search(path):
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self.delays.remove(rule)
                return rule.seconds
        return 0.0

    def hold_response(self, *, method: str = "*", path_regex: str = ".*") -> ResponseHold:
        """Hold the answer of the next request whose method and path (``re.search``) match,
        after it took effect, until the returned hold is released. Raises re.error for a
        bad pattern.
        """
        hold = ResponseHold(method.upper(), re.compile(path_regex))
        self.holds.append(hold)
        return hold

    def take_hold(self, method: str, path: str) -> ResponseHold | None:
        """The first pending hold matching this request (consumed), or None."""
        for hold in self.holds:
            if hold.method in ("*", method) and hold.pattern.search(path):
                self.holds.remove(hold)
                return hold
        return None

    def fail_next(
        self,
        n: int,
        *,
        method: str = "*",
        path_regex: str = ".*",
        status: int = 500,
        retry_after: int | None = None,
    ) -> None:
        """Make the next ``n`` requests whose method and path (``re.search``) match fail."""
        if n < 1:
            raise ValueError("n must be at least 1")
        self.rules.append(FailRule(n, method.upper(), re.compile(path_regex), status, retry_after))

    def take(self, method: str, path: str) -> StatusError | None:
        """The injected error for this request, consuming one use of the first match."""
        for rule in self.rules:
            if rule.method in ("*", method) and rule.pattern.search(path):
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self.rules.remove(rule)
                return injected_error(rule.status, rule.retry_after)
        return None
