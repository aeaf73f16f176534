"""Go-side rules for coordination.k8s.io/v1 Leases.

Port of k8s.io/kubernetes pkg/apis/coordination/validation/validation.go ValidateLeaseSpec
and ValidateCoordinatedLeaseStrategy (run on create and on every update). ``holderIdentity``,
``acquireTime`` and ``renewTime`` have no rules there.
"""

from __future__ import annotations

import json
from typing import Any

from . import names
from .context import RuleContext
from .dra import cause_forbidden, cause_invalid
from .errors import Cause

# The gate behind spec.strategy and spec.preferredHolder (k8s.io/kubernetes
# pkg/features/kube_features.go); with it off the registry drops both fields before validation.
COORDINATED_LEADER_ELECTION = "CoordinatedLeaderElection"
# validLeaseStrategies: the Kubernetes-defined strategy names (names with a '/' are free).
LEASE_STRATEGIES = ("OldestEmulationVersion",)
# The fields appeared in Kubernetes 1.31.
_STRATEGY_MINOR = 31


def _strategy_causes(strategy: str, field: str) -> list[Cause]:
    # ValidateCoordinatedLeaseStrategy appends ".strategy" to the path it is handed, which is
    # already spec.strategy: the real server reports spec.strategy.strategy.
    path = f"{field}.strategy"
    if "/" not in strategy:
        if strategy not in LEASE_STRATEGIES:
            return [
                Cause(
                    "FieldValueNotSupported",
                    f"Unsupported value: {json.dumps(strategy)}: supported values: "
                    + ", ".join(f'"{s}"' for s in LEASE_STRATEGIES),
                    path,
                )
            ]
        return []
    return [cause_invalid(path, strategy, e) for e in names.qualified_name(strategy)]


def lease_causes(obj: dict[str, Any], ctx: RuleContext) -> list[Cause]:
    """Lease spec rules: ``leaseDurationSeconds`` > 0, ``leaseTransitions`` >= 0; where the
    emulated cluster has them (1.31+, CoordinatedLeaderElection on) ``strategy`` a known or
    domain-qualified name and ``preferredHolder`` only together with ``strategy``.
    """
    spec = obj.get("spec") or {}
    out: list[Cause] = []
    duration = spec.get("leaseDurationSeconds")
    if isinstance(duration, int) and duration <= 0:
        out.append(cause_invalid("spec.leaseDurationSeconds", duration, "must be greater than 0"))
    transitions = spec.get("leaseTransitions")
    if isinstance(transitions, int) and transitions < 0:
        out.append(
            cause_invalid(
                "spec.leaseTransitions", transitions, "must be greater than or equal to 0"
            )
        )
    if ctx.cluster.minor < _STRATEGY_MINOR or not ctx.cluster.enabled(COORDINATED_LEADER_ELECTION):
        return out
    strategy = spec.get("strategy")
    if isinstance(strategy, str):
        out.extend(_strategy_causes(strategy, "spec.strategy"))
    if spec.get("preferredHolder") and not strategy:
        out.append(
            cause_forbidden(
                "spec.preferredHolder", "may only be specified if `strategy` is defined"
            )
        )
    return out
