"""``fabric-dra forget``: release a reservation without a detach, through a running controller.

For the case the controller cannot settle by itself: the fabric manager refused a detach for
good (the reservation is ``detach-failed``) and an operator fixed the hardware by hand. The
command calls the admin API's ``POST /api/v1/reservations/{id}/forget`` with the operator's
reason, which is journalled. Every error is one line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import click

from app.commands.common import run

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"
MAX_REASON = 255


def _token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as err:
        raise click.ClickException(f"--token-file {path}: {err.strerror or err}") from None
    if not token:
        raise click.ClickException(f"--token-file {path}: the file is empty")
    return token


async def _forget(
    admin_url: str, reservation_id: int, reason: str, token: str | None, timeout_s: float
) -> dict[str, Any]:
    url = f"{admin_url.rstrip('/')}/api/v1/reservations/{reservation_id}/forget"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.post(url, json={"reason": reason}, headers=headers) as response,
        ):
            text = await response.text()
            try:
                body = json.loads(text) if text else {}
            except ValueError:
                body = {}
            if response.status >= 400:
                error = body.get("error") if isinstance(body, dict) else None
                message = error.get("message") if isinstance(error, dict) else None
                raise click.ClickException(
                    f"the controller refused: HTTP {response.status}: "
                    f"{message or text.strip()[:200] or response.reason}"
                )
            return body if isinstance(body, dict) else {}
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


@click.command()
@click.argument("reservation_id", type=click.IntRange(min=1))
@click.option(
    "--reason",
    required=True,
    help="What was fixed on the fabric (required, journalled, at most 255 characters).",
)
@click.option(
    "--admin-url",
    default=DEFAULT_ADMIN_URL,
    show_default=True,
    envvar="FABRIC_DRA_ADMIN_URL",
    help="The controller's admin endpoint.",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    envvar="FABRIC_DRA_TOKEN_FILE",
    help="File holding the admin bearer token (admin.token_file of the controller).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the answer.",
)
def forget(
    reservation_id: int, reason: str, admin_url: str, token_file: Path | None, timeout_s: float
) -> None:
    """Release RESERVATION_ID without a detach, after fixing the hardware by hand.

    Use it for a reservation that ended detach-failed (see the dashboard or
    GET /api/v1/reservations?state=detach-failed): the device stays held and is not offered
    until then.
    """
    if not reason.strip():
        raise click.BadParameter("say what was fixed on the fabric", param_hint="--reason")
    if len(reason) > MAX_REASON:
        raise click.BadParameter(
            f"at most {MAX_REASON} characters, got {len(reason)}", param_hint="--reason"
        )
    if not admin_url.startswith(("http://", "https://")):
        raise click.BadParameter(
            f"{admin_url!r} is not an http:// or https:// URL", param_hint="--admin-url"
        )
    answer = run(_forget(admin_url, reservation_id, reason, _token(token_file), timeout_s))
    reservation = answer.get("reservation") or {}
    click.echo(
        f"reservation {reservation_id} (device {reservation.get('device_name')}, "
        f"claim {(reservation.get('claim') or {}).get('namespace')}/"
        f"{(reservation.get('claim') or {}).get('name')}) released without a detach"
    )
