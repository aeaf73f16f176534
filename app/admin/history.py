"""The dashboard's recent past: utilisation per pool, attach latency and claims waiting, kept
in this process's memory (no external store) for a window of an hour by default.

:class:`History` is a bounded ring of :class:`Sample` values; :func:`chart` and
:func:`sparkline` turn a series into SVG polyline points for the server-rendered dashboard
(pure, no I/O). :func:`take_sample` reads one sample from the admin context (the database, the
live status and the metrics registry) and is the only part with I/O.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.admin.context import AdminContext
    from app.pools import PoolConfig

#: Reservation states that mean a claim still waits for its device.
WAITING_STATES = ("pending", "attaching")


@dataclass(frozen=True, slots=True)
class Sample:
    """What the dashboard charts, at one moment.

    Attributes:
        at: Unix time in seconds.
        utilisation: pool name -> reserved / published devices, 0.0 to 1.0.
        claims_waiting: claims the claim reconciler reports waiting, plus reservations not
            attached yet (pending, attaching).
        attach_seconds: mean time of the attaches that completed since the previous sample,
            in seconds; None when none did.
        attaches: attaches completed since the previous sample.
    """

    at: float
    utilisation: Mapping[str, float] = field(default_factory=dict)
    claims_waiting: int = 0
    attach_seconds: float | None = None
    attaches: int = 0


class History:
    """The samples of the last ``window_s`` seconds, at most one per ``interval_s``.

    Memory is bounded: at most ``window_s / interval_s + 1`` samples (121 by default), each
    with one float per pool.

    Raises:
        ValueError: ``interval_s`` or ``window_s`` is not positive, or the window is shorter
            than one interval.
    """

    def __init__(self, window_s: float = 3600.0, interval_s: float = 30.0) -> None:
        if not (interval_s > 0 and window_s >= interval_s):
            raise ValueError(
                f"history window {window_s!r} s and interval {interval_s!r} s: both must be "
                "positive and the window at least one interval"
            )
        self.window_s = float(window_s)
        self.interval_s = float(interval_s)
        self._samples: collections.deque[Sample] = collections.deque(
            maxlen=int(window_s // interval_s) + 1
        )
        #: The attach histogram's (sum, count) at the last sample, for the next delta.
        self.attach_totals: tuple[float, float] | None = None

    def add(self, sample: Sample) -> None:
        """Keep ``sample``; drop samples older than the window (and any from the future of a
        clock stepped back, so that the series stays ordered)."""
        while self._samples and self._samples[-1].at > sample.at:
            self._samples.pop()
        self._samples.append(sample)
        while self._samples and self._samples[0].at < sample.at - self.window_s:
            self._samples.popleft()

    def samples(self) -> list[Sample]:
        """The kept samples, oldest first."""
        return list(self._samples)

    def __len__(self) -> int:
        return len(self._samples)


@dataclass(frozen=True, slots=True)
class Chart:
    """One series ready for an SVG ``<polyline points="...">``.

    Attributes:
        points: ``"x,y x,y ..."`` in a ``width`` x ``height`` box (y grows downwards); empty
            when there is nothing to draw.
        latest: the newest value (None when there is none).
        peak: the largest value in the window (None when there is none).
        width / height: the box, in SVG user units.
    """

    points: str
    latest: float | None
    peak: float | None
    width: int
    height: int


def chart(
    series: Sequence[tuple[float, float | None]],
    *,
    now: float,
    window_s: float,
    width: int = 240,
    height: int = 48,
    ceiling: float | None = None,
) -> Chart:
    """Scale ``(unix time, value)`` pairs into a ``width`` x ``height`` box: x from
    ``now - window_s`` (left) to ``now`` (right), y from 0 (bottom) to ``ceiling`` (top; the
    series' peak when None, at least 1). Points outside the window, None values and values
    that are not finite are left out; negative values are drawn at 0.

    Returns:
        A :class:`Chart`; its ``points`` all lie within the box.
    """
    start = now - window_s
    kept = [
        (t, v)
        for t, v in series
        if v is not None and math.isfinite(v) and math.isfinite(t) and start <= t <= now
    ]
    values = [max(0.0, v) for _, v in kept]
    peak = max(values) if values else None
    top = ceiling if ceiling is not None and ceiling > 0 else max(peak or 0.0, 1.0)
    points = []
    for (t, _), value in zip(kept, values, strict=True):
        x = (t - start) / window_s * width if window_s > 0 else width
        y = height - min(value, top) / top * height
        points.append(f"{x:.1f},{y:.1f}")
    return Chart(
        points=" ".join(points),
        latest=values[-1] if values else None,
        peak=peak,
        width=width,
        height=height,
    )


def charts(history: History, now: float, pools: Iterable[str]) -> dict[str, Any]:
    """The dashboard's charts from ``history``: ``utilisation`` (pool -> :class:`Chart` of
    percent, 0 to 100), ``attach`` (seconds), ``waiting`` (claims), ``samples`` (how many
    samples the window holds) and ``span`` (the time the charts cover, in words).

    The charts cover the window, or only the time since the oldest sample when the process
    has not been up that long, so that a young history fills the width instead of a sliver
    at its right end.
    """
    samples = history.samples()
    window = history.window_s
    if samples:
        window = min(window, max(now - samples[0].at, history.interval_s))
    return {
        "samples": len(samples),
        "span": _span(window),
        "utilisation": {
            pool: chart(
                [(s.at, _percent(s.utilisation.get(pool))) for s in samples],
                now=now,
                window_s=window,
                width=120,
                height=16,
                ceiling=100.0,
            )
            for pool in pools
        },
        "attach": chart([(s.at, s.attach_seconds) for s in samples], now=now, window_s=window),
        "waiting": chart(
            [(s.at, float(s.claims_waiting)) for s in samples], now=now, window_s=window
        ),
    }


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{round(seconds)} s"
    if seconds < 2 * 3600:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def _percent(value: float | None) -> float | None:
    return None if value is None else value * 100.0


def attach_delta(
    before: tuple[float, float] | None, after: tuple[float, float]
) -> tuple[float | None, int]:
    """The mean attach time and count between two readings of the attach histogram's
    ``(sum seconds, count)``. No earlier reading, or a counter that went back (a restarted
    registry): no figure."""
    if before is None:
        return None, 0
    seconds, count = after[0] - before[0], int(after[1] - before[1])
    if count <= 0 or seconds < 0:
        return None, 0
    return seconds / count, count


def utilisation(pools: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Pool name -> reserved / published, from the admin API's pool summaries (0 when a
    pool publishes nothing)."""
    result = {}
    for pool in pools:
        published = int(pool.get("published") or 0)
        reserved = int(pool.get("reserved") or 0)
        result[str(pool.get("name"))] = min(1.0, reserved / published) if published else 0.0
    return result


def waiting_count(service: Mapping[str, Any] | None, counts: Mapping[str, Any]) -> int:
    """Claims the live claim reconciler says wait, plus reservations in
    :data:`WAITING_STATES` (from the database's counts)."""
    claims = (service or {}).get("claims")
    waiting = claims.get("waiting") if isinstance(claims, Mapping) else None
    by_state = ((counts.get("reservations") or {}).get("by_state")) or {}
    return (len(waiting) if isinstance(waiting, list) else 0) + sum(
        int(by_state.get(state) or 0) for state in WAITING_STATES
    )


async def take_sample(context: AdminContext, history: History, now: float) -> Sample:
    """Read one sample (pool utilisation and reservation counts from the database, waiting
    claims from the live status, attach time from the registry's ``fabric_dra_attach_seconds``
    histogram) and add it to ``history``.

    Raises:
        Whatever the database raises (the caller's loop logs it and tries again later); a
        failing live status only leaves its part out.
    """
    from app.admin import queries

    try:
        service: dict[str, Any] | None = await context.status()
    except Exception:
        service = None
    counts = await queries.counts(context.db)
    pools = await queries.pools(context.db, context.pool_config or _default_config(context))
    registry = context.registry
    totals = (
        registry.get_sample_value("fabric_dra_attach_seconds_sum") or 0.0,
        registry.get_sample_value("fabric_dra_attach_seconds_count") or 0.0,
    )
    seconds, attaches = attach_delta(history.attach_totals, totals)
    history.attach_totals = totals
    sample = Sample(
        at=now,
        utilisation=utilisation(pools),
        claims_waiting=waiting_count(service, counts),
        attach_seconds=seconds,
        attaches=attaches,
    )
    history.add(sample)
    return sample


def _default_config(context: AdminContext) -> PoolConfig:
    from app.pools import PoolConfig

    return PoolConfig(driver_name=context.driver_name)
