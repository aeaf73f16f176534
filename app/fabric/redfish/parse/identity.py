"""Device identity: what makes two listed devices one physical device.

The listing keys devices by URI, or, when configured (``fabric.device_identity``), by
``SerialNumber`` or ``UUID`` (compared without case), so that one physical device reachable
through two blocks under two URIs is listed once. Placeholder values (blank, all zeros,
``N/A``, ``Not Specified``, ...) are no identity.
"""

from __future__ import annotations

from typing import Literal

from app.fabric.types import FabricDevice

IdentityMode = Literal["uri", "serial", "uuid"]
"""How the listing keys devices: ``uri``, ``serial`` or ``uuid`` (setting
``fabric.device_identity``)."""

IDENTITY_MODES: tuple[IdentityMode, ...] = ("uri", "serial", "uuid")

_PLACEHOLDERS = frozenset(
    {
        "n/a",
        "na",
        "none",
        "null",
        "unknown",
        "not specified",
        "not available",
        "not applicable",
        "to be filled by o.e.m.",
        "default string",
        "system serial number",
        "123456789",
    }
)


def device_identity(device: FabricDevice, mode: IdentityMode) -> str | None:
    """The key that says two listed devices are one physical device, or None (use the URI).

    Args:
        device: a parsed device.
        mode: ``uri`` (always None), ``serial`` (Redfish ``SerialNumber``) or ``uuid``
            (``UUID``, compared without case).

    Returns:
        ``"serial:<value>"`` / ``"uuid:<value>"``, or None when the value is missing or a
        placeholder (blank, all zeros, ``N/A``, ``Not Specified``, ...): services fill those
        in for every device alike, and they must not merge distinct devices.

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in IDENTITY_MODES:
        raise ValueError(f"device identity {mode!r} is not one of {', '.join(IDENTITY_MODES)}")
    if mode == "uri":
        return None
    value = device.serial if mode == "serial" else device.uuid
    if value is None:
        return None
    folded = value.strip().lower()
    if not folded or folded in _PLACEHOLDERS or not folded.strip("0-: "):
        return None
    return f"{mode}:{folded if mode == 'uuid' else value.strip()}"
