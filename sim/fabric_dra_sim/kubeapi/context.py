"""What every write's rules may depend on besides the object: the emulated cluster (its
Kubernetes minor version and feature gates) and the request (the version it was written in,
the namespace's labels, where warnings go).

The gate names are kube-apiserver's (k8s.io/kubernetes pkg/features/kube_features.go). Which
gates a minor version enables by default lives in :mod:`.cluster`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Feature gates the resource.k8s.io rules and field dropping follow.
DRA_ADMIN_ACCESS = "DRAAdminAccess"
DRA_DEVICE_TAINTS = "DRADeviceTaints"
DRA_DEVICE_BINDING_CONDITIONS = "DRADeviceBindingConditions"
DRA_RESOURCE_CLAIM_DEVICE_STATUS = "DRAResourceClaimDeviceStatus"
DRA_PARTITIONABLE_DEVICES = "DRAPartitionableDevices"
DRA_CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
DRA_PRIORITIZED_LIST = "DRAPrioritizedList"
DRA_CONTROL_PLANE_CONTROLLER = "DRAControlPlaneController"


@dataclass(frozen=True)
class Cluster:
    """The emulated cluster: Kubernetes ``1.<minor>`` and the feature gates switched on."""

    minor: int
    gates: frozenset[str]

    def enabled(self, gate: str) -> bool:
        """True when feature gate ``gate`` is on."""
        return gate in self.gates

    @property
    def version(self) -> str:
        """``"1.<minor>"``."""
        return f"1.{self.minor}"


@dataclass
class RuleContext:
    """One write as the kind rules see it.

    ``cluster``: the emulated cluster; ``version``: the resource.k8s.io version the object was
    written in ('' for other groups); ``old``: the stored object before the write, shown in
    ``version`` (None on create); ``status_write``: the status subresource is written;
    ``namespace_labels``: labels of the object's namespace ({} for cluster-scoped objects);
    ``warnings``: messages for the response's ``Warning`` headers (append, never replace).
    """

    cluster: Cluster
    version: str = ""
    old: dict[str, Any] | None = None
    status_write: bool = False
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
