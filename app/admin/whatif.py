"""The admin API's what-if answer: which nodes and pools could satisfy a claim spec now.

:func:`what_if_answer` runs :func:`app.allocator.what_if` over what the caller gathered (the
service: the API server's DeviceClasses and Nodes, the pools exactly as it publishes them, the
devices reserved now) and shapes the JSON the ``POST /api/v1/allocations/what-if`` route
answers. Nothing is reserved and nothing is fetched here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from app.allocator import Allocator, device_class_from_json, gather_pools, node_from_json, what_if
from app.allocator.model import DeviceId
from app.allocator.whatif import NodeAnswer
from app.pools import DesiredPool, resource_slice_spec


def what_if_answer(
    spec: Mapping[str, Any],
    *,
    driver_name: str,
    device_classes: Iterable[Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]],
    pools: Iterable[DesiredPool],
    in_use: Collection[DeviceId],
    allocator: Allocator | None = None,
) -> dict[str, Any]:
    """The what-if answer for the claim ``spec`` (resource.k8s.io/v1 JSON).

    Args:
        driver_name: our DRA driver (the pools' driver).
        device_classes: DeviceClass objects in v1 JSON.
        nodes: Node objects (JSON).
        pools: the desired pools, as published (their slices are read at generation 0).
        in_use: (driver, pool, device) of the devices reserved now.
        allocator: one to reuse (its caches).

    Returns:
        ``{"nodes": [{"node", "satisfiable", "pools", "allocation", "failure"?}, ...]}``,
        one entry per node in the order given; ``failure`` is the allocator's
        :class:`app.allocator.outcome.Failure` as JSON, its requests summarised.

    Never raises for a spec the allocator cannot read (each node gets an ``InvalidClaim``
    failure); a DeviceClass or Node that cannot be read raises as
    :func:`app.allocator.device_class_from_json` / :func:`app.allocator.node_from_json` do.
    """
    classes = {}
    for item in device_classes:
        parsed = device_class_from_json(item)
        classes[parsed.name] = parsed
    slices = [
        {"spec": resource_slice_spec(driver_name, pool, content, 0)}
        for pool in pools
        for content in pool.slices
    ]
    answers = what_if(
        spec, classes, gather_pools(slices), in_use, [node_from_json(n) for n in nodes], allocator
    )
    return {"nodes": [_answer_json(a) for a in answers]}


def _answer_json(answer: NodeAnswer) -> dict[str, Any]:
    data: dict[str, Any] = {
        "node": answer.node,
        "satisfiable": answer.satisfiable,
        "pools": list(answer.pools),
        "allocation": answer.allocation,
    }
    if answer.failure is not None:
        failure = dataclasses.asdict(answer.failure)
        failure["requests"] = [r.summary() for r in answer.failure.requests]
        data["failure"] = failure
    return data
