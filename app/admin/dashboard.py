"""What the dashboard shows, as plain values: pure functions over the live status and the
database's counts (no I/O), so the template only lays things out.

The live status is the service's summary (see :class:`app.admin.context.AdminContext`); parts
of it may be missing (a standby replica has no publisher or claim reconciler), so every read
here is tolerant of absent keys and odd shapes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MAX_ERRORS = 20
MAX_ROWS = 50


def parse_time(value: Any) -> dt.datetime | None:
    """An aware datetime from an ISO 8601 / RFC 3339 string, else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def age(now: dt.datetime, value: Any) -> str:
    """How long ago ``value`` (an ISO time) was, in words: ``12 s``, ``4 min``, ``3 h``."""
    when = parse_time(value)
    if when is None:
        return "never"
    seconds = max(0, int((now - when).total_seconds()))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min ago"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _section(service: Mapping[str, Any] | None, key: str) -> Mapping[str, Any]:
    value = (service or {}).get(key)
    return value if isinstance(value, Mapping) else {}


def recent_errors(service: Mapping[str, Any] | None, now: dt.datetime) -> list[dict[str, str]]:
    """Errors the live parts report, newest first: claim and control-plane errors, failed pool
    syncs, failed inventory syncs, crashed loops."""
    found: list[tuple[dt.datetime | None, str, str]] = []
    for key in ("claims", "control_plane"):
        for error in _dicts(_section(service, key).get("recent_errors")):
            source = f"{key.replace('_', ' ')} {error.get('claim') or ''}".strip()
            found.append((parse_time(error.get("at")), source, str(error.get("message", ""))))
    pools = _section(service, "publisher").get("pools")
    if isinstance(pools, Mapping):
        for name, pool in sorted(pools.items()):
            if isinstance(pool, Mapping) and pool.get("last_error"):
                found.append((None, f"pool {name}", str(pool["last_error"])))
    for status in _dicts((service or {}).get("inventory")):
        if status.get("last_error"):
            found.append(
                (
                    parse_time(status.get("last_attempt_at")),
                    f"inventory {status.get('backend', '')}".strip(),
                    str(status["last_error"]),
                )
            )
    for loop in _dicts((service or {}).get("loops")):
        if loop.get("last_error"):
            found.append((None, f"loop {loop.get('name', '?')}", str(loop["last_error"])))
    found.sort(key=lambda e: e[0] or dt.datetime.min.replace(tzinfo=dt.UTC), reverse=True)
    return [
        {"source": source, "message": message, "age": age(now, when.isoformat()) if when else ""}
        for when, source, message in found[:MAX_ERRORS]
    ]


def regions(pools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pools grouped by region (pools without one under ``no region``), racks in name order,
    each with a utilisation percentage for its bar."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for pool in pools:
        region = pool.get("region") or "no region"
        percent = min(100.0, round(float(pool.get("utilisation") or 0) * 100, 1))
        row = dict(pool)
        row["percent"] = percent
        row["label"] = pool.get("rack") or pool.get("name")
        row["level"] = "high" if percent >= 90 else "mid" if percent >= 60 else "low"
        grouped.setdefault(str(region), []).append(row)
    result = []
    for name in sorted(grouped):
        racks = sorted(grouped[name], key=lambda p: str(p["name"]))
        published = sum(int(p.get("published") or 0) for p in racks)
        reserved = sum(int(p.get("reserved") or 0) for p in racks)
        result.append(
            {
                "name": name,
                "pools": racks,
                "devices": sum(int(p["devices"]) for p in racks),
                "published": published,
                "reserved": reserved,
                "percent": round(100 * reserved / published, 1) if published else 0.0,
            }
        )
    return result


def freshness(
    service: Mapping[str, Any] | None, counts: Mapping[str, Any], now: dt.datetime
) -> list[dict[str, str]]:
    """One line per live part: how fresh its view is."""
    lines: list[dict[str, str]] = []
    statuses = _dicts((service or {}).get("inventory")) or _dicts(counts.get("inventory"))
    # Each configured fabric manager, with its URL and event stream, when the service says;
    # else each manager that has synced.
    managers = _dicts((service or {}).get("managers")) or [
        {"name": status.get("backend", "?"), "inventory": status} for status in statuses
    ]
    for manager in managers:
        status = manager.get("inventory") if isinstance(manager.get("inventory"), dict) else {}
        events = (manager.get("events") or {}).get("state")
        where = f", {manager['url']}" if manager.get("url") else ""
        if not status:
            lines.append(
                {
                    "what": f"inventory ({manager.get('name', '?')})",
                    "age": "never",
                    "detail": f"no sync yet{where}",
                    "level": "warn",
                }
            )
            continue
        stale = bool(status.get("stale"))
        failures = int(status.get("consecutive_failures") or 0)
        detail = f"{status.get('device_count', 0)} devices, {status.get('host_count', 0)} hosts"
        if failures:
            detail += f", {failures} failed in a row"
        if events:
            detail += f", events {events}"
        lines.append(
            {
                "what": f"inventory ({manager.get('name', '?')})",
                "age": age(now, status.get("last_success_at")),
                "detail": detail + where,
                "level": "bad" if stale else "warn" if failures else "ok",
            }
        )
    statuses = statuses or [m for m in managers if m.get("inventory")]
    if not statuses:
        lines.append(
            {"what": "inventory", "age": "never", "detail": "no sync yet", "level": "warn"}
        )
    publisher = _section(service, "publisher")
    if publisher:
        writes = publisher.get("writes") or {}
        written = ", ".join(f"{k} {v}" for k, v in sorted(dict(writes).items())) or "none"
        lines.append(
            {
                "what": "publisher",
                "age": age(now, publisher.get("last_sync_at"))
                if publisher.get("last_sync_at")
                else ("synced" if publisher.get("synced") else "syncing"),
                "detail": f"queue {publisher.get('queue_depth', 0)}, writes: {written}",
                "level": "ok" if publisher.get("synced") else "warn",
            }
        )
    elif service is not None:
        lines.append(
            {
                "what": "publisher",
                "age": "not running here",
                "detail": "only the leader publishes",
                "level": "idle",
            }
        )
    claims = _section(service, "claims")
    if claims:
        lines.append(
            {
                "what": "claims",
                "age": "synced" if claims.get("synced") else "syncing",
                "detail": f"queue {claims.get('queue_depth', 0)}, "
                f"{claims.get('claims_seen', 0)} claims seen",
                "level": "ok" if claims.get("healthy", claims.get("synced")) else "warn",
            }
        )
    return lines


def waiting_claims(
    service: Mapping[str, Any] | None, unsettled: Sequence[Mapping[str, Any]], now: dt.datetime
) -> list[dict[str, str]]:
    """Claims waiting for something: those the reconciler says wait, and reservations not yet
    attached (or stuck detaching or failed)."""
    rows = [
        {"claim": str(w.get("claim", "?")), "what": str(w.get("reason", "")), "since": ""}
        for w in _dicts(_section(service, "claims").get("waiting"))
    ]
    for reservation in unsettled:
        claim = reservation.get("claim") or {}
        rows.append(
            {
                "claim": f"{claim.get('namespace')}/{claim.get('name')}",
                "what": f"{reservation.get('device_name')}: {reservation.get('state')}"
                + (f" ({reservation['last_error']})" if reservation.get("last_error") else ""),
                "since": age(now, reservation.get("updated_at")),
            }
        )
    return rows[:MAX_ROWS]


#: How long after this replica lost leadership the dashboard keeps saying so.
LEADERSHIP_NEWS_SECONDS = 3600


def banners(service: Mapping[str, Any] | None, now: dt.datetime) -> list[dict[str, str]]:
    """What is broken right now, loudest first, as banners over the dashboard: a stale
    inventory, no leader or leadership lost, fields the API server dropped from our
    ResourceSlices. (Detach failures and devices held elsewhere have banners of their own,
    from the database.) Each is ``{"id", "level" (bad or warn), "title", "text"}``.
    """
    found: list[dict[str, str]] = []
    if service is None:
        return found
    for status in _dicts(service.get("inventory")):
        if not status.get("stale"):
            continue
        backend = str(status.get("backend") or "?")
        failures = int(status.get("consecutive_failures") or 0)
        error = f" Last error: {status['last_error']}." if status.get("last_error") else ""
        found.append(
            {
                "id": f"banner-stale-{backend}",
                "level": "bad",
                "title": f"The inventory of fabric manager {backend} is stale.",
                "text": f"No complete sync since {age(now, status.get('last_success_at'))} "
                f"({failures} failed in a row).{error} Everything below is as of then: "
                "devices may have failed, gone, or been attached by someone else since.",
            }
        )
    leader = _section(service, "leader")
    electing = leader and leader.get("enabled", True)
    if electing and not leader.get("is_leader") and not leader.get("holder"):
        found.append(
            {
                "id": "banner-no-leader",
                "level": "bad",
                "title": "No replica is known to lead.",
                "text": "Nothing publishes ResourceSlices or attaches devices until one "
                "holds the Lease; check the replicas' logs and their RBAC for Leases.",
            }
        )
    lost_at = parse_time(leader.get("lost_at")) if leader else None
    if lost_at is not None and (now - lost_at).total_seconds() < LEADERSHIP_NEWS_SECONDS:
        holder = "this replica again" if leader.get("is_leader") else leader.get("holder")
        found.append(
            {
                "id": "banner-leadership-lost",
                "level": "warn",
                "title": f"This replica lost leadership {age(now, leader.get('lost_at'))}.",
                "text": f"The leader is {holder or 'unknown'}"
                f"; {leader.get('lost_count', 1)} loss(es) since start. Losses that repeat "
                "mean the API server is slow or unreachable from this replica.",
            }
        )
    dropped: set[str] = set()
    for publisher in [_section(service, "publisher"), *_section(service, "publishers").values()]:
        if isinstance(publisher, Mapping):
            dropped.update(str(p) for p in publisher.get("dropped_paths") or [])
    if dropped:
        taints = any(p.endswith(".taints") for p in dropped)
        found.append(
            {
                "id": "banner-dropped-fields",
                "level": "warn",
                "title": "The API server dropped fields from our ResourceSlices: "
                + ", ".join(sorted(dropped))
                + ".",
                "text": "A feature gate is off on the API server (DRADeviceTaints, "
                "DRADeviceBindingConditions, ...), so those fields have no effect."
                + (
                    " Unhealthy devices are withheld from the slices instead of tainted."
                    if taints
                    else ""
                ),
            }
        )
    return found


def dashboard_model(
    *,
    service: Mapping[str, Any] | None,
    counts: Mapping[str, Any],
    pools: Sequence[Mapping[str, Any]],
    attention: Mapping[str, Any],
    driver: str,
    now: dt.datetime,
) -> dict[str, Any]:
    """Everything the dashboard template shows."""
    devices = counts.get("devices") or {}
    by_state = dict(devices.get("by_state") or {})
    by_health = dict(devices.get("by_health") or {})
    leader = _section(service, "leader")
    stale = [status for status in _dicts((service or {}).get("inventory")) if status.get("stale")]
    return {
        "driver": driver,
        # Filled in by the route from the sampled history (app.admin.history), when kept.
        "history": None,
        "banners": banners(service, now),
        # The cards show the database's view; with a stale inventory it is an old view.
        "stale_since": _oldest_success(stale, now) if stale else None,
        "now": now.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "service_ok": service is not None,
        "identity": (service or {}).get("identity"),
        "mode": (service or {}).get("mode"),
        "api_version": (service or {}).get("resource_api_version"),
        "leader": {
            "known": bool(leader),
            "is_leader": bool(leader.get("is_leader")),
            "holder": leader.get("holder"),
            "enabled": leader.get("enabled", True),
        },
        "cards": [
            {"label": "devices", "value": devices.get("present", 0), "level": ""},
            {"label": "free", "value": by_state.get("free", 0), "level": "ok"},
            {"label": "reserved", "value": by_state.get("reserved", 0), "level": ""},
            {"label": "attached", "value": by_state.get("attached", 0), "level": ""},
            {
                "label": "cordoned",
                "value": by_state.get("cordoned", 0),
                "level": "warn" if by_state.get("cordoned") else "",
            },
            {
                "label": "held elsewhere",
                "value": by_state.get("held-elsewhere", 0),
                "level": "warn" if by_state.get("held-elsewhere") else "",
            },
            {
                "label": "detach failed",
                "value": len(attention.get("detach_failed") or []),
                "level": "bad" if attention.get("detach_failed") else "",
            },
            {
                "label": "critical",
                "value": by_health.get("Critical", 0),
                "level": "bad" if by_health.get("Critical") else "",
            },
            {"label": "pools", "value": len(pools), "level": ""},
        ],
        "regions": regions(pools),
        "by_state": by_state,
        "by_type": dict(devices.get("by_type") or {}),
        "by_health": by_health,
        "reservations": dict((counts.get("reservations") or {}).get("by_state") or {}),
        "unhealthy": list(attention.get("unhealthy") or [])[:MAX_ROWS],
        "cordoned": list(attention.get("cordoned") or [])[:MAX_ROWS],
        "errors": recent_errors(service, now),
        "freshness": freshness(service, counts, now),
        "waiting": waiting_claims(service, attention.get("unsettled_reservations") or [], now),
        "detach_failed": [stuck_row(r, now) for r in _dicts(attention.get("detach_failed"))][
            :MAX_ROWS
        ],
        "held_elsewhere": list(attention.get("held_elsewhere") or [])[:MAX_ROWS],
    }


def _oldest_success(statuses: Sequence[Mapping[str, Any]], now: dt.datetime) -> str:
    times = [parse_time(s.get("last_success_at")) for s in statuses]
    known = [t for t in times if t is not None]
    if len(known) < len(times) or not known:
        return "never"
    return age(now, min(known).isoformat())


def stuck_row(reservation: Mapping[str, Any], now: dt.datetime) -> dict[str, Any]:
    """One ``detach-failed`` reservation as the dashboard shows it (id, claim, device, host,
    the fabric's refusal, age)."""
    claim = reservation.get("claim") or {}
    return {
        "id": reservation.get("id"),
        "claim": f"{claim.get('namespace')}/{claim.get('name')}",
        "device": reservation.get("device_name"),
        "host": reservation.get("host_id"),
        "error": reservation.get("last_error") or "",
        "since": age(now, reservation.get("updated_at")),
    }
