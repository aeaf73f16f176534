"""The control-plane (classic DRA) mode: ``plan`` holds the pure decisions of the protocol,
``controller`` the I/O (informers, allocation, journal, fabric, status writes)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.controlplane.controller import (
        ControlPlaneController,
        ControlPlaneError,
        ControlPlaneSettings,
    )

# Loaded on first use, so that importing a pure submodule (``plan``) loads no I/O library.
_EXPORTS = {
    "ControlPlaneController": "app.controlplane.controller",
    "ControlPlaneError": "app.controlplane.controller",
    "ControlPlaneSettings": "app.controlplane.controller",
}


def __getattr__(name: str) -> Any:
    """The exported class ``name``, imported from its module on first use.

    Raises:
        AttributeError: ``name`` is not exported.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["ControlPlaneController", "ControlPlaneError", "ControlPlaneSettings"]
