"""Pure device allocation for the control-plane (classic DRA) mode and the what-if query.

Modules: ``model`` (value types from API JSON), ``pools`` (slices -> pools, node reach),
``values`` and ``cel`` (the DRA CEL environment and caches), ``search`` (the backtracking
allocator), ``results`` (allocation results, config, node selector), ``outcome`` (answers and
failure reasons), ``whatif`` (per-node feasibility). No I/O, no globals.
"""

from app.allocator.model import (
    Claim,
    DeviceClass,
    Node,
    SpecError,
    claim_from_json,
    claim_from_object,
    device_class_from_json,
    node_from_json,
)
from app.allocator.outcome import Failure, Outcome, RequestReport
from app.allocator.pools import Pool, gather_pools
from app.allocator.search import Allocator
from app.allocator.whatif import NodeAnswer, what_if

__all__ = [
    "Allocator",
    "Claim",
    "DeviceClass",
    "Failure",
    "Node",
    "NodeAnswer",
    "Outcome",
    "Pool",
    "RequestReport",
    "SpecError",
    "claim_from_json",
    "claim_from_object",
    "device_class_from_json",
    "gather_pools",
    "node_from_json",
    "what_if",
]
