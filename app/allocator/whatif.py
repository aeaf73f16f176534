""" "Could this claim be satisfied now, and where?": the allocator run once per node.

Used by the admin API. Nothing is reserved: each node is answered as if the claim were the
only new one, against the same devices in use.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.allocator import outcome as oc
from app.allocator.model import DeviceClass, DeviceId, Node, SpecError, claim_from_json
from app.allocator.pools import Pool
from app.allocator.search import Allocator


@dataclass(frozen=True, slots=True)
class NodeAnswer:
    """The answer for one node.

    Attributes:
        node: the node's name.
        satisfiable: an allocation exists there now.
        pools: ``driver/pool`` of the pools holding devices any request of the claim could
            use on this node (whether or not the first solution uses them).
        allocation: the allocation the allocator would make (``status.allocation`` JSON), or
            None.
        failure: why not, or None.
    """

    node: str
    satisfiable: bool
    pools: tuple[str, ...] = ()
    allocation: Mapping[str, Any] | None = None
    failure: oc.Failure | None = None


def what_if(
    claim_spec: Mapping[str, Any],
    classes: Mapping[str, DeviceClass],
    pools: Sequence[Pool],
    in_use: Collection[DeviceId],
    nodes: Sequence[Node],
    allocator: Allocator | None = None,
) -> tuple[NodeAnswer, ...]:
    """For a ResourceClaim ``spec`` (v1 JSON), one answer per node, in the order given.

    Args:
        claim_spec: ``{"devices": {"requests": [...], ...}}``.
        classes: device classes by name.
        pools: from :func:`app.allocator.pools.gather_pools`.
        in_use: (driver, pool, device) of allocated devices.
        nodes: the nodes to ask about.
        allocator: one to reuse (its caches); a new one otherwise.

    Never raises: a claim spec that cannot be read gives every node an ``InvalidClaim``
    failure.
    """
    try:
        claim = claim_from_json(claim_spec, namespace="what-if", name="claim")
    except SpecError as err:
        failure = oc.Failure(oc.INVALID_CLAIM, f"claim spec: {err}")
        return tuple(NodeAnswer(n.name, False, failure=failure) for n in nodes)
    engine = allocator or Allocator()
    answers = []
    for node in nodes:
        result = engine.allocate([claim], classes, pools, in_use, node)
        usable: list[str] = []
        for report in result.reports or (result.failure.requests if result.failure else ()):
            usable.extend(p for p in report.pools if p not in usable)
        allocation = next(iter(result.allocations.values()), None)
        answers.append(NodeAnswer(node.name, result.ok, tuple(usable), allocation, result.failure))
    return tuple(answers)
