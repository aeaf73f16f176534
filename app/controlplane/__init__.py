"""The control-plane (classic DRA) mode: ``plan`` holds the pure decisions of the protocol,
``controller`` the I/O (informers, allocation, journal, fabric, status writes)."""

from app.controlplane.controller import (
    ControlPlaneController,
    ControlPlaneError,
    ControlPlaneSettings,
)

__all__ = ["ControlPlaneController", "ControlPlaneError", "ControlPlaneSettings"]
