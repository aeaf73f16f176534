"""The handlers of the admin app's action routes: cordon and uncordon a device, force-release
and forget a reservation. Each checks its JSON body, calls the context's
:class:`~app.admin.context.AdminActions` and maps its errors (unknown: 404, refused: 409).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

from aiohttp import web

from app.admin.pipeline import ApiError, Call, check_text, json_answer

MAX_REASON = 255


async def cordon(call: Call) -> web.Response:
    """Cordon a device (optional JSON body ``{"reason": "..."}``)."""
    body = call.body if call.body is not None else {}
    if not isinstance(body, dict) or set(body) - {"reason"}:
        raise ApiError(400, "the body must be an object with at most a 'reason'")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise ApiError(400, f"'reason' must be a string of at most {MAX_REASON} characters")
    check_text("'reason'", reason)
    return await _act(call.context.actions.cordon(call.query["name"], reason))


async def uncordon(call: Call) -> web.Response:
    """Uncordon a device (no body, or ``{}``)."""
    _no_fields(call, "uncordon")
    return await _act(call.context.actions.uncordon(call.query["name"]))


async def release(call: Call) -> web.Response:
    """Force-release a reservation: detach (best effort), then release (no body, or
    ``{}``)."""
    _no_fields(call, "release")
    reservation = await _act_value(call.context.actions.force_release(call.query["id"]))
    if reservation.get("state") == "released":
        return json_answer({"reservation": reservation, "message": "released"})
    if reservation.get("state") == "detach-failed":
        return json_answer(
            {
                "reservation": reservation,
                "message": "the detach failed for good; the reservation is "
                "detach-failed: fix it on the fabric, then forget it",
            },
            202,
        )
    return json_answer(
        {
            "reservation": reservation,
            "message": "the detach failed; the reservation stays "
            f"{reservation.get('state')} and the controller retries it",
        },
        202,
    )


async def forget(call: Call) -> web.Response:
    """Release a reservation without a detach (the hardware was fixed by hand): JSON body
    ``{"reason": "..."}``, required."""
    body = call.body
    if not isinstance(body, dict) or set(body) != {"reason"}:
        raise ApiError(
            400,
            "the body must be an object with exactly a 'reason': say what was fixed on the fabric",
        )
    reason = body["reason"]
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
        raise ApiError(
            400, f"'reason' must be a non-empty string of at most {MAX_REASON} characters"
        )
    check_text("'reason'", reason)
    reservation = await _act_value(call.context.actions.forget(call.query["id"], reason))
    return json_answer(
        {
            "reservation": reservation,
            "message": "released without a detach; the next inventory sync "
            "reads the device's holder from the fabric",
        }
    )


def _no_fields(call: Call, action: str) -> None:
    """Refuse a body with fields (400), as cordon refuses fields it does not know: a field
    given here would be ignored without a word."""
    if call.body is not None and call.body != {}:
        raise ApiError(400, f"{action} takes no body (or an empty object)")


async def _act_value(action: Awaitable[Mapping[str, Any]]) -> Mapping[str, Any]:
    try:
        return await action
    except LookupError as err:
        raise ApiError(404, str(err).strip("'\"")) from err
    except ValueError as err:
        raise ApiError(409, str(err)) from err


async def _act(action: Awaitable[Mapping[str, Any]]) -> web.Response:
    return json_answer(dict(await _act_value(action)))
