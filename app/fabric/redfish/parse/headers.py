"""HTTP header values Redfish services send: entity tags and ``Retry-After`` (RFC 9110)."""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime


def normalise_etag(value: str | None) -> str | None:
    """An entity tag spelt as RFC 9110 section 8.8.3 says (``"opaque"`` or ``W/"opaque"``),
    or None for a missing or blank one.

    Services get the quoting wrong: ``""abc""`` (quoted twice), ``abc`` (not quoted). Extra
    quotes are stripped and one pair is put back. A weak prefix ``W/`` is kept and the tag is
    sent back as the service gave it: RFC 9110 section 13.1.1 compares ``If-Match`` strongly,
    but Redfish services hand out weak tags in ``@odata.etag`` and expect them back in
    ``If-Match`` (DSP0266 "ETags": the client sends the ETag it read), and turning a weak tag
    into a strong one would send a tag the service never issued. Never raises.
    """
    if value is None:
        return None
    tag = value.strip()
    weak = tag[:2] in ("W/", "w/")
    if weak:
        tag = tag[2:].strip()
    opaque = tag.strip('"').strip()
    if not opaque:
        return None
    return f'{"W/" if weak else ""}"{opaque}"'


def preferred_etag(header: str | None, body_etag: str | None) -> str | None:
    """The ETag to send in ``If-Match``: the body's ``@odata.etag`` when present (DSP0266:
    it is the resource's own version, and services whose header is quoted differently or
    stale still compare against it), else the ``ETag`` header; both normalised by
    :func:`normalise_etag`."""
    return normalise_etag(body_etag) or normalise_etag(header)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date, RFC 9110).

    Returns None for a missing or unparsable value; never negative.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value))
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)
