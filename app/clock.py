"""Time: every timestamp fabric-dra stores or writes is an aware datetime in UTC."""

from __future__ import annotations

import datetime as dt


def utcnow() -> dt.datetime:
    """The current time, aware, in UTC."""
    return dt.datetime.now(dt.UTC)
