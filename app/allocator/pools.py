"""Published ResourceSlices -> the pools a consumer may allocate from, and node reach.

Rules (k8s.io/dynamic-resource-allocation structured/internal pools.go ``GatherPools``, and
DRA-REFERENCE.md "How consumers read a pool"):

* A pool is keyed by (driver, pool name). Only slices at its highest ``pool.generation`` count.
* It is complete when the number of those slices equals their ``resourceSliceCount``;
  incomplete pools are not allocated from, and ``All`` requests fail while one reaches the node.
* Slices of the newest generation that disagree on ``resourceSliceCount`` make the pool invalid
  (the reason names each count and its slices). Upstream takes the count of whichever slice it
  sees first and leaves this check as a TODO (``checkSlicesInPool`` in
  structured/internal/experimental/pools_experimental.go); with two counts neither can be
  trusted, so the pool is neither complete nor incomplete, only invalid.
* A device name seen twice in the pool, or a device the API server would have refused (an
  attribute without a value, a version that is not semver, a capacity that is not a quantity),
  makes the pool invalid: it is skipped like an incomplete one.
* Pools are ordered by pool name then driver, devices by name; a pool with any device that
  has binding conditions (KEP-5007) comes after all pools without.
* A device reaches a node through its slice's ``nodeName`` (equal to the node's name),
  ``nodeSelector`` (core NodeSelector semantics: terms ORed, expressions ANDed; operators In,
  NotIn, Exists, DoesNotExist, Gt, Lt; ``matchFields`` on ``metadata.name``) or ``allNodes``;
  with ``perDeviceNodeSelection`` the device's own fields decide.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.allocator.model import Device, Node, Reach, SpecError, device_from_json


@dataclass(frozen=True, slots=True)
class Pool:
    """One pool at its newest generation.

    Attributes:
        driver, name: the pool's key.
        generation: the newest ``pool.generation`` seen.
        resource_slice_count: ``pool.resourceSliceCount`` of the newest slices (the largest
            when they disagree).
        slices_seen: how many slices exist at that generation.
        devices: devices of those slices, by name (empty when invalid).
        reaches: the distinct node reaches of those slices and, with per-device node
            selection, of their devices.
        uniform_reach: every device has the one reach in ``reaches`` (no per-device
            selection): the pool reaches a node entirely or not at all.
        invalid_reason: why the pool is invalid, or None.
        fingerprint: SHA-256 over its devices' names and fingerprints.
        consistent: every slice of the newest generation gives the same
            ``resourceSliceCount`` (when not, ``invalid_reason`` says so).
        reach_key: a canonical text of ``reaches`` (pools with equal keys reach the same
            nodes), so that one allocation checks each distinct reach once, not once per
            pool; empty when unknown (then the pool's reach is checked on its own).
    """

    driver: str
    name: str
    generation: int
    resource_slice_count: int
    slices_seen: int
    devices: tuple[Device, ...]
    reaches: tuple[Reach, ...]
    invalid_reason: str | None = None
    uniform_reach: bool = False
    fingerprint: str = ""
    consistent: bool = True
    reach_key: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        """(driver, name, fingerprint): the pool's content identity, independent of its
        generation (the selector cache key)."""
        return (self.driver, self.name, self.fingerprint)

    @property
    def complete(self) -> bool:
        """All slices of the newest generation are published (never, when the slices
        disagree on how many there are)."""
        return self.consistent and self.slices_seen == self.resource_slice_count

    @property
    def usable(self) -> bool:
        """Complete and valid: devices may be allocated from it."""
        return self.complete and self.invalid_reason is None

    @property
    def has_binding_conditions(self) -> bool:
        """Some device needs binding conditions; such pools are tried last."""
        return any(d.binding_conditions for d in self.devices)

    def reaches_node(self, node: Node) -> bool:
        """True when some slice of the pool (or, with per-device selection, a device) can be
        used from ``node``."""
        return any(reach_matches(r, node) for r in self.reaches)

    def describe(self) -> str:
        """``driver/pool`` for messages."""
        return f"{self.driver}/{self.name}"


def _reach(fields: Mapping[str, Any]) -> Reach | None:
    if fields.get("nodeName"):
        return Reach(node_name=str(fields["nodeName"]))
    if fields.get("nodeSelector") is not None:
        return Reach(node_selector=fields["nodeSelector"])
    if fields.get("allNodes") is True:
        return Reach(all_nodes=True)
    return None


def gather_pools(resource_slices: Iterable[Mapping[str, Any]]) -> tuple[Pool, ...]:
    """The pools of ``resource_slices`` (v1 ResourceSlice objects or bare specs), in
    allocation order (see the module docstring).

    Slices that name no driver or pool are ignored. Never raises for bad slice content: such a
    pool is returned with ``invalid_reason`` set.
    """
    newest: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    generations: dict[tuple[str, str], int] = {}
    for obj in resource_slices:
        spec = obj.get("spec", obj)
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver") or ""), str(pool.get("name") or ""))
        if not key[0] or not key[1]:
            continue
        generation = int(pool.get("generation") or 0)
        if generation > generations.get(key, -1):
            generations[key] = generation
            newest[key] = []
        if generation == generations[key]:
            newest[key].append(obj)
    pools = [
        _pool(driver, name, generations[(driver, name)], objs)
        for (driver, name), objs in newest.items()
    ]
    pools.sort(key=lambda p: (p.has_binding_conditions, p.name, p.driver))
    return tuple(pools)


def _slice_counts(objs: list[Mapping[str, Any]]) -> dict[int, list[str]]:
    # resourceSliceCount -> the slices giving it: by name, else by position (bare specs).
    counts: dict[int, list[str]] = {}
    for index, obj in enumerate(objs):
        spec = obj.get("spec", obj)
        count = int((spec.get("pool") or {}).get("resourceSliceCount") or 1)
        label = str((obj.get("metadata") or {}).get("name") or f"#{index}")
        counts.setdefault(count, []).append(label)
    return counts


def _count_disagreement(generation: int, counts: Mapping[int, list[str]]) -> str:
    parts = []
    for count in sorted(counts):
        labels = counts[count]
        shown = ", ".join(repr(n) for n in labels[:3]) + (
            f" and {len(labels) - 3} more" if len(labels) > 3 else ""
        )
        parts.append(f"{count} (slice{'s' if len(labels) > 1 else ''} {shown})")
    return f"the slices of generation {generation} disagree on resourceSliceCount: " + "; ".join(
        parts
    )


def _pool(driver: str, name: str, generation: int, objs: list[Mapping[str, Any]]) -> Pool:
    specs = [obj.get("spec", obj) for obj in objs]
    counts = _slice_counts(objs)
    count = max(counts)
    consistent = len(counts) == 1
    devices: list[Device] = []
    reaches: dict[str, Reach] = {}
    seen: set[str] = set()
    invalid: str | None = None if consistent else _count_disagreement(generation, counts)
    per_device_seen = False

    def distinct(reach: Reach) -> Reach:
        # Devices sharing a reach share one object, so reach checks can be memoised by id.
        marker = json.dumps([reach.node_name, reach.node_selector, reach.all_nodes], sort_keys=True)
        return reaches.setdefault(marker, reach)

    for spec in specs:
        per_device = spec.get("perDeviceNodeSelection") is True
        per_device_seen = per_device_seen or per_device
        slice_reach = None if per_device else _reach(spec)
        if slice_reach is not None:
            slice_reach = distinct(slice_reach)
        for raw in spec.get("devices") or ():
            device_name = str(raw.get("name") or "")
            if device_name in seen:
                invalid = invalid or f"duplicate device name {device_name!r}"
                continue
            seen.add(device_name)
            reach = slice_reach or distinct(_reach(raw) or Reach())
            try:
                devices.append(device_from_json(driver, name, raw, reach))
            except SpecError as err:
                invalid = invalid or str(err)
    devices.sort(key=lambda d: d.name)
    digest = hashlib.sha256()
    for device in devices:
        digest.update(f"{device.name}\x00{device.fingerprint}\x00".encode())
    return Pool(
        driver=driver,
        name=name,
        generation=generation,
        resource_slice_count=count,
        slices_seen=len(specs),
        devices=() if invalid else tuple(devices),
        reaches=tuple(reaches.values()),
        invalid_reason=invalid,
        uniform_reach=len(reaches) == 1 and not per_device_seen,
        fingerprint=digest.hexdigest(),
        consistent=consistent,
        reach_key="\n".join(sorted(reaches)),
    )


def _requirement_matches(requirement: Mapping[str, Any], value: str | None) -> bool:
    operator = requirement.get("operator")
    wanted = [str(v) for v in requirement.get("values") or ()]
    if operator == "In":
        return value is not None and value in wanted
    if operator == "NotIn":
        return value is None or value not in wanted
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        # core/v1: exactly one value; both sides must parse as integers, else no match.
        if value is None or len(wanted) != 1:
            return False
        try:
            have, limit = int(value), int(wanted[0])
        except ValueError:
            return False
        return have > limit if operator == "Gt" else have < limit
    return False


def term_matches(term: Mapping[str, Any], node: Node) -> bool:
    """A NodeSelectorTerm: every matchExpression (labels) and matchField (``metadata.name``
    only) holds. An empty term matches nothing (k8s.io/component-helpers nodeaffinity)."""
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False
    for requirement in expressions:
        if not _requirement_matches(requirement, node.labels.get(str(requirement.get("key")))):
            return False
    for requirement in fields:
        value = node.name if requirement.get("key") == "metadata.name" else None
        if not _requirement_matches(requirement, value):
            return False
    return True


def selector_matches(selector: Mapping[str, Any], node: Node) -> bool:
    """A core NodeSelector: any of its terms matches."""
    return any(term_matches(t, node) for t in selector.get("nodeSelectorTerms") or ())


def reach_matches(reach: Reach, node: Node) -> bool:
    """True when a device with ``reach`` can be used from ``node``."""
    if reach.all_nodes:
        return True
    if reach.node_name is not None:
        return reach.node_name == node.name
    if reach.node_selector is not None:
        return selector_matches(reach.node_selector, node)
    return False
