"""The control-plane (classic DRA) mode: ``plan`` holds the pure decisions of the protocol,
``controller`` the I/O (informers, allocation, journal, fabric, status writes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.lazy import lazy_exports

if TYPE_CHECKING:
    from app.controlplane.controller import ControlPlaneController, ControlPlaneSettings

# Loaded on first use, so that importing a pure submodule (``plan``) loads no I/O library.
_EXPORTS = {
    "ControlPlaneController": "app.controlplane.controller",
    "ControlPlaneSettings": "app.controlplane.controller",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["ControlPlaneController", "ControlPlaneSettings"]
