"""Allocation results: device results, config entries and the allocation's node selector.

Rules (k8s.io/dynamic-resource-allocation structured/internal allocator ``Allocate``, the part
that fills ``AllocationResult``; DRA-REFERENCE.md "Classic DRA"):

* ``devices.results``: one entry per chosen device, in claim request order and, within a
  request, in allocation order: ``request`` (``req`` or ``req/sub``), ``driver``, ``pool``,
  ``device``; ``adminAccess: true`` only for admin-access requests; the request's (or chosen
  subrequest's) ``tolerations`` when it has any, so that the eviction of pods using devices
  with a ``NoExecute`` taint spares those that tolerate it (Kubernetes 1.35 and later,
  structured/internal/*/allocator_*.go ``Allocate``; the field exists from 1.33 behind the
  DRADeviceTaints gate, and an API server with the gate off drops it); the device's
  ``bindingConditions`` and ``bindingFailureConditions`` when it has them (KEP-5007).
* ``devices.config``: first the class config, each class once, in the order the requests first
  used it, as ``FromClass`` entries whose ``requests`` list every request (or chosen subrequest)
  that used the class; then the claim's own config entries as ``FromClaim``, with their own
  ``requests`` (omitted when empty: they apply to every request). A claim entry naming
  requests is kept when it names a request of the claim or the chosen subrequest of one, so an
  entry for ``firstAvailable`` subrequests that were not chosen is left out (Kubernetes 1.33 and
  later, same function); a kept entry appears once and keeps its ``requests`` as written.
* ``nodeSelector``: a selector naming the node (``matchFields`` ``metadata.name`` In) when any
  chosen device binds to the node (``bindsToNode``) or comes from a node-local slice
  (``nodeName``); otherwise the chosen devices' slice selectors merged into one term (the union
  of their ``matchExpressions`` and ``matchFields``, each once, in first-seen order); no
  selector at all when every chosen device is available on all nodes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from app.allocator.model import Claim, Device, DeviceClass, DeviceRequest, Node
from app.allocator.pools import term_matches

Pick = tuple[DeviceRequest, Device]


def result_entry(request: DeviceRequest, device: Device) -> dict[str, Any]:
    """One ``devices.results[]`` entry (v1 DeviceRequestAllocationResult)."""
    entry: dict[str, Any] = {
        "request": request.name,
        "driver": device.driver,
        "pool": device.pool,
        "device": device.name,
    }
    if request.admin_access:
        entry["adminAccess"] = True
    if request.tolerations:
        entry["tolerations"] = [t.to_json() for t in request.tolerations]
    if device.binding_conditions:
        entry["bindingConditions"] = list(device.binding_conditions)
        entry["bindingFailureConditions"] = list(device.binding_failure_conditions)
    return entry


def config_entries(
    claim: Claim, used: Sequence[DeviceRequest], classes: Mapping[str, DeviceClass]
) -> list[dict[str, Any]]:
    """``devices.config``: class config (``FromClass``) then claim config (``FromClaim``).

    ``used`` holds the alternative chosen for each request of the claim, in request order.
    Claim entries that name only subrequests not in ``used`` are left out.
    """
    by_class: dict[str, list[str]] = {}
    for request in used:
        names = by_class.setdefault(request.device_class_name, [])
        if request.name not in names:
            names.append(request.name)
    out: list[dict[str, Any]] = []
    for class_name, request_names in by_class.items():
        device_class = classes.get(class_name)
        for entry in device_class.config if device_class else ():
            out.append(
                {"source": "FromClass", "requests": list(request_names), "opaque": entry["opaque"]}
            )
    chosen = {r.name for r in used} | {r.parent for r in used}
    for entry in claim.config:
        item: dict[str, Any] = {"source": "FromClaim"}
        if entry.get("requests"):
            if not chosen.intersection(str(r) for r in entry["requests"]):
                continue
            item["requests"] = list(entry["requests"])
        item["opaque"] = entry["opaque"]
        out.append(item)
    return out


def node_selector(devices: Sequence[Device], node: Node) -> dict[str, Any] | None:
    """The allocation's ``nodeSelector`` for the chosen ``devices`` on ``node`` (see the
    module docstring), or None."""
    if any(d.binds_to_node or d.reach.node_name is not None for d in devices):
        return {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}]}
            ]
        }
    expressions: list[Any] = []
    fields: list[Any] = []
    seen: set[str] = set()
    for device in devices:
        selector = device.reach.node_selector
        if selector is None:
            continue
        # A v1 slice selector has exactly one term; should one have several, the term that
        # matches the node is the one that made the device usable there.
        terms = selector.get("nodeSelectorTerms") or [{}]
        term = next((t for t in terms if term_matches(t, node)), terms[0])
        for target, items in (
            (expressions, term.get("matchExpressions") or ()),
            (fields, term.get("matchFields") or ()),
        ):
            for item in items:
                marker = json.dumps([target is fields, item], sort_keys=True)
                if marker not in seen:
                    seen.add(marker)
                    target.append(dict(item))
    if not expressions and not fields:
        return None
    merged: dict[str, Any] = {}
    if expressions:
        merged["matchExpressions"] = expressions
    if fields:
        merged["matchFields"] = fields
    return {"nodeSelectorTerms": [merged]}


def allocation(
    claim: Claim,
    used: Sequence[DeviceRequest],
    picks: Sequence[Pick],
    classes: Mapping[str, DeviceClass],
    node: Node,
) -> dict[str, Any]:
    """The claim's ``status.allocation`` (v1 AllocationResult JSON, without the timestamp).

    ``picks`` are (request alternative, device) pairs in allocation order.
    """
    result: dict[str, Any] = {
        "devices": {
            "results": [result_entry(request, device) for request, device in picks],
            "config": config_entries(claim, used, classes),
        }
    }
    selector = node_selector([device for _, device in picks], node)
    if selector is not None:
        result["nodeSelector"] = selector
    return result
