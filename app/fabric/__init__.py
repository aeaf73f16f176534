"""The fabric side: the backend interface, its value types and typed errors, and backends.

Nothing here imports Kubernetes code. Backends translate a vendor's fabric manager (Redfish
CompositionService first) into the plain value types of :mod:`app.fabric.types`.
"""

from app.fabric.backend import FabricBackend
from app.fabric.errors import (
    FabricAuthError,
    FabricConflict,
    FabricError,
    FabricInvalidData,
    FabricNotEffective,
    FabricNotFound,
    FabricPreconditionFailed,
    FabricServerOwned,
    FabricTimeout,
    FabricUnavailable,
)
from app.fabric.types import (
    DeviceType,
    FabricDevice,
    FabricHost,
    Health,
    Listing,
    Location,
    Operation,
    OperationState,
    Rejected,
)

__all__ = [
    "DeviceType",
    "FabricAuthError",
    "FabricBackend",
    "FabricConflict",
    "FabricDevice",
    "FabricError",
    "FabricHost",
    "FabricInvalidData",
    "FabricNotEffective",
    "FabricNotFound",
    "FabricPreconditionFailed",
    "FabricServerOwned",
    "FabricTimeout",
    "FabricUnavailable",
    "Health",
    "Listing",
    "Location",
    "Operation",
    "OperationState",
    "Rejected",
]
