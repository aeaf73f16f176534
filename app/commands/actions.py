"""Operator commands against a running controller's admin API.

``status``, ``reservations`` (reads) and ``cordon``, ``uncordon``, ``release``, ``forget``
(actions, which need the admin bearer token from ``--token-file``, the controller's
``admin.token_file``). They call the endpoints documented in the README's "The dashboard and
the admin API" (``/api/v1/...``). Every error is one line on stderr and a non-zero exit
status: an unreachable controller, a timeout, a refused token, an unknown device or
reservation, a state that does not allow the action.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import aiohttp
import click

from app.commands.common import run
from app.commands.output import Format, output_option, structured, table
from app.commands.params import MAX_SECONDS, FiniteFloatRange, WholeNumberRange
from app.config import redact_url
from app.reservations import STATES

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"
# app.admin.routes_actions: the admin API's limit for a reason.
MAX_REASON = 255

F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------- the client
def read_token(path: Path | None) -> str | None:
    """The bearer token in ``path`` (stripped), or None without a path.

    Raises:
        click.BadParameter: the file cannot be read, is not UTF-8 text or is empty (a usage
            error, exit 2, before any request).
    """
    if path is None:
        return None
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as err:
        raise click.BadParameter(
            f"{path}: {err.strerror or err}", param_hint="--token-file"
        ) from None
    except UnicodeDecodeError:
        raise click.BadParameter(f"{path}: not UTF-8 text", param_hint="--token-file") from None
    if not token:
        raise click.BadParameter(f"{path}: the file is empty", param_hint="--token-file")
    return token


def check_admin_url(admin_url: str) -> str:
    """``admin_url`` without a trailing slash.

    Raises:
        click.BadParameter: it is not an http:// or https:// URL with a host, its port is
            not a number from 1 to 65535, or it carries credentials (never echoed).
    """
    shown = redact_url(admin_url)
    if not admin_url.startswith(("http://", "https://")):
        raise click.BadParameter(
            f"{shown!r} is not an http:// or https:// URL", param_hint="--admin-url"
        )
    try:
        parts = urlsplit(admin_url)
        port = parts.port
    except ValueError as err:
        raise click.BadParameter(
            f"{shown!r} is not a valid URL ({err})", param_hint="--admin-url"
        ) from None
    if "@" in parts.netloc:
        raise click.BadParameter(
            f"{shown!r} carries a user name or password: the admin API takes a bearer token "
            "(--token-file), not credentials in the URL",
            param_hint="--admin-url",
        )
    if not parts.hostname:
        raise click.BadParameter(f"{shown!r} names no host", param_hint="--admin-url")
    if port == 0:
        raise click.BadParameter(
            f"{shown!r}: the port must be from 1 to 65535", param_hint="--admin-url"
        )
    return admin_url.rstrip("/")


async def call_admin(
    admin_url: str,
    method: str,
    path: str,
    *,
    token: str | None,
    timeout_s: float,
    body: Mapping[str, Any] | None = None,
    query: Mapping[str, str] | None = None,
) -> Any:
    """One request to the admin API; the decoded JSON answer.

    Raises:
        click.ClickException: one line saying what went wrong: the URL is invalid, the
            controller cannot be reached or did not answer within ``timeout_s`` seconds, it
            refused (the HTTP status and the API's error message), or it answered something
            that is not JSON.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{admin_url}{path}"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.request(
                method, url, json=body, params=dict(query or {}), headers=headers
            ) as response,
        ):
            text = await response.text()
    except aiohttp.InvalidURL:
        raise click.ClickException(f"--admin-url {admin_url!r} is not a valid URL") from None
    except TimeoutError:
        raise click.ClickException(
            f"the controller's admin API at {admin_url} did not answer within {timeout_s:g} s"
        ) from None
    except aiohttp.ClientError as err:
        raise click.ClickException(
            f"cannot reach the controller's admin API at {admin_url}: {err or type(err).__name__}"
        ) from None
    try:
        answer = json.loads(text) if text else {}
    except ValueError:
        answer = None
    if response.status >= 400:
        error = answer.get("error") if isinstance(answer, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        # The admin API's errors are {"error": {"code": <the HTTP status>, "message": ...}}
        # (app.admin.pipeline); a Redfish service's have a text code, a proxy's are pages.
        ours = isinstance(error, dict) and error.get("code") == response.status
        if not ours:
            raise click.ClickException(
                f"{admin_url} answered HTTP {response.status} "
                f"({(message or text.strip()[:200] or response.reason or '').strip()}), "
                "not as the controller's admin API does: is --admin-url the controller's "
                "admin endpoint?"
            )
        hint = ""
        if response.status in (401, 403):
            hint = " (give the controller's admin token, admin.token_file, with --token-file)"
        raise click.ClickException(
            f"the controller refused: HTTP {response.status}: "
            f"{message or text.strip()[:200] or response.reason}{hint}"
        )
    if answer is None:
        raise click.ClickException(
            f"the admin API at {admin_url} answered {path} with something that is not JSON "
            "(is --admin-url the controller's admin endpoint?)"
        )
    return answer


def admin_options(function: F) -> F:
    """``--admin-url``, ``--token-file`` and ``--timeout``, given as ``admin_url``,
    ``token_file`` and ``timeout_s``."""
    for option in reversed(
        (
            click.option(
                "--admin-url",
                default=DEFAULT_ADMIN_URL,
                show_default=True,
                envvar="FABRIC_DRA_ADMIN_URL",
                help="The controller's admin endpoint (env FABRIC_DRA_ADMIN_URL).",
            ),
            click.option(
                "--token-file",
                type=click.Path(path_type=Path),
                envvar="FABRIC_DRA_TOKEN_FILE",
                help="File holding the admin bearer token, the controller's admin.token_file "
                "(env FABRIC_DRA_TOKEN_FILE); needed for actions, and for reads when "
                "admin.require_token_for_reads is on.",
            ),
            click.option(
                "--timeout",
                "timeout_s",
                type=FiniteFloatRange(0.1, MAX_SECONDS),
                default=10.0,
                show_default=True,
                help="Seconds to wait for the answer.",
            ),
        )
    ):
        function = option(function)
    return function


def _reason(reason: str, required: bool) -> str:
    if required and not reason.strip():
        raise click.BadParameter("say what was fixed on the fabric", param_hint="--reason")
    if len(reason) > MAX_REASON:
        raise click.BadParameter(
            f"at most {MAX_REASON} characters, got {len(reason)}", param_hint="--reason"
        )
    return reason


# --------------------------------------------------------------------------- rendering (pure)
def status_lines(document: Mapping[str, Any]) -> list[str]:
    """The admin API's ``/api/v1/status`` document as a short report for people: who leads,
    how fresh each fabric manager's inventory is, the counts, the claims waiting, and what
    needs attention (one line each)."""
    service = document.get("service") or {}
    database = document.get("database") or {}
    attention = document.get("attention") or {}
    leader = service.get("leader") or {}
    lines = [
        f"controller {service.get('identity', '?')}: driver {service.get('driver', '?')}, "
        f"mode {service.get('mode', '?')}, resource.k8s.io "
        f"{service.get('resource_api_version') or '-'}, up {service.get('uptime_seconds', 0)} s",
        "leader: "
        + (
            "this replica"
            if leader.get("is_leader")
            else f"{leader.get('holder') or 'unknown'} (this replica follows)"
        )
        + ("" if leader.get("enabled", True) else " (leader election off)"),
    ]
    managers = service.get("managers")
    if not isinstance(managers, list):
        # A controller without per-manager status: its inventory statuses alone.
        managers = [
            {"name": b.get("backend"), "inventory": b}
            for b in service.get("inventory") or database.get("inventory") or []
            if isinstance(b, Mapping)
        ]
    for manager in managers:
        if not isinstance(manager, Mapping):
            continue
        backend = manager.get("inventory") or {}
        state = (
            "never synced"
            if not backend
            else "STALE"
            if backend.get("stale")
            else ("failing" if backend.get("consecutive_failures") else "fresh")
        )
        url = f" ({manager['url']})" if manager.get("url") else ""
        events = (manager.get("events") or {}).get("state")
        lines.append(
            f"fabric manager {manager.get('name')}{url}: {state}"
            + (f", events {events}" if events else "")
            + (
                f", last complete sync {backend.get('last_success_at') or 'never'}, "
                f"{backend.get('device_count', 0)} devices, {backend.get('host_count', 0)} "
                f"hosts, {backend.get('rejected_count', 0)} rejected"
                if backend
                else ""
            )
            + (f", last error: {backend['last_error']}" if backend.get("last_error") else "")
        )
    devices = database.get("devices") or {}
    by_state = devices.get("by_state") or {}
    states = ", ".join(f"{n} {state}" for state, n in by_state.items() if n)
    lines.append(
        f"devices: {devices.get('present', 0)} present" + (f"; {states}" if states else "")
    )
    reservations = database.get("reservations") or {}
    lines.append(f"reservations: {reservations.get('active', 0)} active")
    claims = service.get("claims") or {}
    waiting = claims.get("waiting") or []
    lines.append(f"claims waiting: {len(waiting)}")
    for item in waiting[:20]:
        lines.append(f"  {_describe(item)}")
    items = [(kind, entry) for kind, entries in attention.items() for entry in entries or []]
    lines.append(f"attention: {len(items) or 'nothing'}")
    for kind, entry in items[:50]:
        lines.append(f"  {kind.replace('_', ' ')}: {_describe(entry)}")
    return lines


def _describe(entry: Any) -> str:
    if not isinstance(entry, Mapping):
        return str(entry)
    keys = ("claim", "name", "device", "device_name", "state", "reason", "last_error", "error")
    parts = []
    for key in keys:
        value = entry.get(key)
        if isinstance(value, Mapping):
            value = "/".join(str(v) for v in (value.get("namespace"), value.get("name")) if v)
        if value not in (None, "", [], {}):
            parts.append(f"{key} {value}")
    return ", ".join(parts) or json.dumps(entry, sort_keys=True)[:200]


RESERVATION_COLUMNS: tuple[tuple[str, Callable[[Mapping[str, Any]], Any]], ...] = (
    ("ID", lambda r: r.get("id")),
    ("STATE", lambda r: r.get("state")),
    (
        "CLAIM",
        lambda r: "/".join(str((r.get("claim") or {}).get(k) or "") for k in ("namespace", "name")),
    ),
    ("REQUEST", lambda r: r.get("request")),
    ("DEVICE", lambda r: r.get("device_name")),
    ("NODE", lambda r: r.get("node")),
)
RESERVATION_WIDE: tuple[tuple[str, Callable[[Mapping[str, Any]], Any]], ...] = (
    ("POOL", lambda r: r.get("pool")),
    ("HOST", lambda r: r.get("host_id")),
    ("MODE", lambda r: r.get("mode")),
    ("ATTEMPTS", lambda r: r.get("attempts")),
    ("UPDATED", lambda r: r.get("updated_at")),
    ("LAST ERROR", lambda r: (r.get("last_error") or "")[:80]),
)


def reservations_table(items: Sequence[Mapping[str, Any]], wide: bool) -> str:
    """Reservations (admin API items) as a table; ``wide`` adds pool, host, mode, attempts,
    last update and last error."""
    columns = RESERVATION_COLUMNS + (RESERVATION_WIDE if wide else ())
    return table(
        [title for title, _ in columns],
        [[get(item) for _, get in columns] for item in items],
        empty="(no reservations)",
    )


# --------------------------------------------------------------------------- commands
@click.command()
@output_option
@admin_options
def status(output: Format, admin_url: str, token_file: Path | None, timeout_s: float) -> None:
    """Show a running controller's state: leader, inventory freshness per fabric manager,
    device counts, claims waiting, and what needs attention."""
    url = check_admin_url(admin_url)
    document = run(
        call_admin(url, "GET", "/api/v1/status", token=read_token(token_file), timeout_s=timeout_s)
    )
    if output in ("json", "yaml"):
        click.echo(structured(document, output))
        return
    lines = status_lines(document)
    if output == "wide":
        loops = (document.get("service") or {}).get("loops") or []
        lines.append("loops:")
        lines += [
            f"  {loop.get('name')}: {'running' if loop.get('running') else 'STOPPED'}, "
            f"{loop.get('restarts', 0)} restarts"
            + (f", last error: {loop['last_error']}" if loop.get("last_error") else "")
            for loop in loops
        ]
    click.echo("\n".join(lines))


@click.command()
@click.option(
    "--state",
    type=click.Choice((*STATES, "active")),
    help="Only reservations in this state; active: every state that holds the device "
    "(as the admin API's state=active).",
)
@click.option("--limit", type=WholeNumberRange(1, 1000), default=200, show_default=True)
@output_option
@admin_options
def reservations(
    state: str | None,
    limit: int,
    output: Format,
    admin_url: str,
    token_file: Path | None,
    timeout_s: float,
) -> None:
    """List a running controller's reservations (newest first)."""
    url = check_admin_url(admin_url)
    query = {"limit": str(limit), **({"state": state} if state else {})}
    page = run(
        call_admin(
            url,
            "GET",
            "/api/v1/reservations",
            token=read_token(token_file),
            timeout_s=timeout_s,
            query=query,
        )
    )
    items = page.get("items") or [] if isinstance(page, dict) else []
    if output in ("json", "yaml"):
        click.echo(structured(page, output))
    else:
        click.echo(reservations_table(items, output == "wide"))


def _action(
    admin_url: str,
    path: str,
    token_file: Path | None,
    timeout_s: float,
    body: Mapping[str, Any] | None,
) -> Any:
    url = check_admin_url(admin_url)
    token = read_token(token_file)
    if token is None:
        raise click.UsageError(
            "actions need the admin token: give --token-file (the controller's admin.token_file)"
        )
    return run(call_admin(url, "POST", path, token=token, timeout_s=timeout_s, body=body))


@click.command()
@click.argument("device")
@click.option("--reason", default="", help="Why (journalled, at most 255 characters).")
@admin_options
def cordon(
    device: str, reason: str, admin_url: str, token_file: Path | None, timeout_s: float
) -> None:
    """Stop offering DEVICE (its name as published) to new claims; a claim holding it keeps
    it."""
    body = {"reason": _reason(reason, required=False)} if reason else {}
    _action(
        admin_url, f"/api/v1/devices/{quote(device, safe='')}/cordon", token_file, timeout_s, body
    )
    click.echo(f"device {device} cordoned")


@click.command()
@click.argument("device")
@admin_options
def uncordon(device: str, admin_url: str, token_file: Path | None, timeout_s: float) -> None:
    """Offer DEVICE again."""
    _action(
        admin_url, f"/api/v1/devices/{quote(device, safe='')}/uncordon", token_file, timeout_s, None
    )
    click.echo(f"device {device} uncordoned")


@click.command()
@click.argument("reservation_id", type=WholeNumberRange(min=1))
@admin_options
def release(reservation_id: int, admin_url: str, token_file: Path | None, timeout_s: float) -> None:
    """Detach and release RESERVATION_ID by force.

    The controller then works on the claim at once: a claim that still has the device
    allocated (its pod runs) gets it attached again. To free a device, delete the pod or the
    claim; use this for a reservation whose claim is gone or stuck.
    """
    answer = _action(
        admin_url, f"/api/v1/reservations/{reservation_id}/release", token_file, timeout_s, None
    )
    reservation = answer.get("reservation") or {} if isinstance(answer, dict) else {}
    click.echo(
        f"reservation {reservation_id} (device {reservation.get('device_name', '?')}): "
        f"{reservation.get('state', 'released')}"
    )


@click.command()
@click.argument("reservation_id", type=WholeNumberRange(min=1))
@click.option(
    "--reason",
    required=True,
    help="What was fixed on the fabric (required, journalled, at most 255 characters).",
)
@admin_options
def forget(
    reservation_id: int, reason: str, admin_url: str, token_file: Path | None, timeout_s: float
) -> None:
    """Release RESERVATION_ID without a detach, after fixing the hardware by hand.

    Use it for a reservation that ended detach-failed (see `fabric-dra status` or
    `fabric-dra reservations --state detach-failed`): the device stays held and is not
    offered until then.
    """
    _reason(reason, required=True)
    answer = _action(
        admin_url,
        f"/api/v1/reservations/{reservation_id}/forget",
        token_file,
        timeout_s,
        {"reason": reason},
    )
    reservation = answer.get("reservation") or {} if isinstance(answer, dict) else {}
    claim = reservation.get("claim") or {}
    click.echo(
        f"reservation {reservation_id} (device {reservation.get('device_name')}, "
        f"claim {claim.get('namespace')}/{claim.get('name')}) released without a detach"
    )
