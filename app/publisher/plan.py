"""Classify a pool's existing ResourceSlices against its desired slices, and plan the writes.

Pure functions on plain values; no I/O. The rules follow the upstream slice controller
(k8s.io/dynamic-resource-allocation/resourceslice, v1.36) and the consumer rules of
k8s.io/dynamic-resource-allocation/structured (DRA-REFERENCE.md, "How consumers read a pool"):

* A slice is named by the API server from ``generateName: <index>-<driver>-``; the index is
  :attr:`app.pools.SliceContent.index`. Existing slices are matched to desired ones by the index
  parsed from their name, and only among slices of the same ``spec.pool.name``. A name that does
  not parse, an index the pool no longer has, or a second slice with the same index makes the
  slice obsolete (of duplicates, the one already in sync and at the newest generation is kept).
* Classification: obsolete / matched and in sync / matched and changed / missing. A matched slice
  is changed when its content (everything in the spec but driver and pool), its
  ``resourceSliceCount`` or its ``generation`` (against the highest generation among the pool's
  existing slices) differs.
* Generation: kept (the highest existing one) when no slice is missing and at most one matched
  slice changed; otherwise bumped to the highest existing generation + 1 (1 for a new pool) and
  every slice of the pool is rewritten, so consumers never combine slices of two layouts. The
  caller may pass the highest generation it has seen for the pool (``floor_generation``): a bump
  then also goes past it.
* Writes, in order: deletes of obsolete slices (with uid and resourceVersion preconditions),
  updates of changed slices (PUT carrying the resourceVersion), creates of missing slices.
* A pool that is no longer desired loses all its slices.

Content is compared semantically (:func:`content_key`): quantities are parsed, empty fields are
treated as absent (Go's ``omitempty``), and server-set fields (a taint's ``timeAdded``) are
ignored. Fields the API server drops (a feature gate off) are handled by the caller passing the
dropped paths (stripped from the desired content before comparing) and the returned forms it has
seen for a desired content (``accepted``): that returned form then counts as in sync.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from app.jsontypes import json_copy
from app.pools import DesiredPool, SliceContent, resource_slice_spec

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
# The spec fields that are not slice content: identity of the pool and its header.
_HEADER_FIELDS = frozenset({"driver", "pool"})
# Metadata an update keeps from the existing object (someone else's labels or owners).
_KEPT_METADATA = ("labels", "annotations", "ownerReferences", "finalizers")
# Fields the API server sets on its own; never a difference (DeviceTaint.timeAdded is set on
# create and update when missing, k8s.io/kubernetes pkg/registry/resource/resourceslice).
_SERVER_SET = {"taints": frozenset({"timeAdded"})}
# Where a slim spec (the publisher's informer cache) keeps :func:`taint_times`.
TAINT_TIMES = "fabric-dra.io/taintTimes"

_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|m|n|u|k|M|G|T|P|E|"
    r"[eE][+-]?\d+)?$"
)
_SUFFIX = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}

Verb = Literal["delete", "update", "create"]


# --------------------------------------------------------------------------- naming
def generate_name(driver_name: str, index: int) -> str:
    """``metadata.generateName`` of the slice at ``index``: ``<index>-<driver>-``."""
    return f"{index}-{driver_name}-"


def slice_index(name: str, driver_name: str) -> int | None:
    """The slice index encoded in a ResourceSlice name made from :func:`generate_name`, or
    None when the name does not have that form (``07-...`` with a leading zero does not)."""
    head, dash, rest = name.partition("-")
    if not dash or not head.isdigit() or (len(head) > 1 and head[0] == "0"):
        return None
    if not rest.startswith(f"{driver_name}-") or len(rest) == len(driver_name) + 1:
        return None
    return int(head)


# --------------------------------------------------------------------------- comparison
def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity string (``80Gi``, ``1.5k``, ``500m``, ``1e3``).

    Source: k8s.io/apimachinery pkg/api/resource (ParseQuantity) for the suffixes.

    Raises:
        ValueError: not a quantity.
    """
    match = _QUANTITY.match(text.strip())
    if not match:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = match.group(1), match.group(2) or ""
    value = Fraction(number)
    if suffix[:1] in ("e", "E"):
        return value * Fraction(10) ** int(suffix[1:])
    return value * _SUFFIX[suffix]


@functools.lru_cache(maxsize=4096)
def _canonical_quantity(text: str) -> str:
    try:
        return str(parse_quantity(text))
    except ValueError:
        return text


_NO_FIELDS: frozenset[str] = frozenset()


def _canonical(value: Any, parent: str = "") -> Any:
    """A canonical JSON value: empty containers and nulls dropped, capacity quantities parsed,
    server-set fields removed. Returns None for "absent"."""
    # Exact type checks: this runs for every field of every device, and JSON gives plain
    # dicts and lists (an abstract-class check costs several times more).
    kind = type(value)
    if kind is dict:
        ignored = _SERVER_SET.get(parent, _NO_FIELDS)
        result: dict[str, Any] = {}
        # Counter values are quantities too, canonicalised by the server like capacities.
        in_capacity = parent == "capacity" or parent == "counters"
        in_entry = parent == "capacity-entry"
        for key, item in value.items():
            if key in ignored:
                continue
            if in_entry and key == "value" and type(item) is str:
                canonical: Any = _canonical_quantity(item)
            elif type(item) in (dict, list):
                canonical = _canonical(item, "capacity-entry" if in_capacity else key)
            else:
                canonical = item
            if canonical is not None:
                result[key] = canonical
        return result or None
    if kind is list:
        items = [_canonical(item, parent) for item in value]
        return items or None
    if isinstance(value, Mapping):
        return _canonical(dict(value), parent)
    return value


def content_of(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The content part of a ResourceSlice spec: everything but ``driver`` and ``pool``."""
    return {k: v for k, v in spec.items() if k not in _HEADER_FIELDS}


def content_key(content: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical form of a slice's content (see :func:`content_of`).

    Two contents with the same key are the same to a consumer: quantities compare by value,
    empty and absent fields are equal, server-set fields are ignored.
    """
    return canonical_key(_canonical(dict(content)))


def canonical_content(content: Mapping[str, Any]) -> Any:
    """The canonical form :func:`content_key` hashes (None when empty)."""
    return _canonical(dict(content))


def canonical_key(canonical: Any) -> str:
    """SHA-256 (hex) of a canonical form from :func:`canonical_content`."""
    payload = json.dumps(canonical or {}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def strip_paths(obj: Mapping[str, Any], paths: frozenset[str] | set[str]) -> dict[str, Any]:
    """A deep copy of ``obj`` without the dotted ``paths`` (``name[]`` walks every list
    element), the notation of :func:`dropped_paths`."""
    result = json_copy(dict(obj))
    for path in sorted(paths):
        _remove(result, path.split("."))
    return result


def _remove(obj: Any, parts: list[str]) -> None:
    head = parts[0]
    is_list = head.endswith("[]")
    key = head[:-2] if is_list else head
    if not isinstance(obj, dict) or key not in obj:
        return
    if len(parts) == 1:
        del obj[key]
        return
    children = obj[key] if is_list and isinstance(obj[key], list) else [obj[key]]
    for child in children:
        _remove(child, parts[1:])


def dropped_paths(sent: Any, returned: Any, prefix: str = "") -> set[str]:
    """Dotted paths (``spec.devices[].taints``) present in ``sent`` and absent in ``returned``.

    Compared on the canonical forms, so an empty list the server omits is not a drop. List
    elements are compared position by position; a list element index is written ``[]``.
    """
    return _dropped(_canonical(sent), _canonical(returned), prefix)


def _dropped(sent: Any, returned: Any, prefix: str) -> set[str]:
    found: set[str] = set()
    if isinstance(sent, dict):
        other = returned if isinstance(returned, dict) else {}
        for key, value in sent.items():
            path = f"{prefix}.{key}" if prefix else key
            if key not in other:
                found.add(path)
            else:
                found |= _dropped(value, other[key], path)
    elif isinstance(sent, list) and isinstance(returned, list):
        path = f"{prefix}[]"
        for mine, theirs in zip(sent, returned, strict=False):
            found |= _dropped(mine, theirs, path)
    return found


def expected_content(
    pool: DesiredPool, content: SliceContent, dropped: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The content (see :func:`content_of`) of the slice ``content`` of ``pool``, without the
    ``spec.``-relative paths in ``dropped`` that the API server is known to drop."""
    spec = resource_slice_spec("", pool, content, 0)
    relative = frozenset(p[len("spec.") :] for p in dropped if p.startswith("spec."))
    return strip_paths(content_of(spec), relative) if relative else content_of(spec)


def expected_key(
    pool: DesiredPool, content: SliceContent, dropped: frozenset[str] = frozenset()
) -> str:
    """:func:`content_key` of :func:`expected_content`."""
    return content_key(expected_content(pool, content, dropped))


# --------------------------------------------------------------------------- existing slices
@dataclass(frozen=True, slots=True)
class ExistingSlice:
    """A ResourceSlice of our driver as it exists on the API server (v1 shape), as the plan
    needs it.

    Attributes:
        name, uid, resource_version: from metadata.
        pool_name, generation, resource_slice_count: ``spec.pool``.
        index: parsed from the name (:func:`slice_index`); None when the name has no index.
        content_key: :func:`content_key` of the spec's content.
        kept_metadata: labels, annotations, owner references and finalizers, kept on update.
        taint_times: :func:`taint_times` of the spec: the ``timeAdded`` the API server gave each
            taint, sent back on update so that an unchanged taint keeps its age.
    """

    name: str
    uid: str
    resource_version: str
    pool_name: str
    generation: int
    resource_slice_count: int
    index: int | None
    content_key: str
    kept_metadata: Mapping[str, Any] = field(default_factory=dict)
    taint_times: Mapping[str, str] = field(default_factory=dict)


def _taint_id(device: str, taint: Mapping[str, Any]) -> str:
    return "\x00".join(
        (
            device,
            str(taint.get("key") or ""),
            str(taint.get("value") or ""),
            str(taint.get("effect") or ""),
        )
    )


def taint_times(spec: Mapping[str, Any]) -> dict[str, str]:
    """The ``timeAdded`` of every taint of a ResourceSlice spec (v1 shape), by device name,
    key, value and effect; {} when no device has a timed taint.

    Defaulting on the API server stamps a taint written without ``timeAdded`` with the current
    time, on update too (k8s.io/kubernetes pkg/apis/resource/v1/defaults.go
    SetDefaults_DeviceTaint), so a writer that omits it resets the taint's age on every write.
    """
    found: dict[str, str] = {}
    devices = spec.get("devices")
    # A malformed slice (from an API server that stored it unchecked) reads as no taints.
    for device in devices if type(devices) is list else ():
        if type(device) is not dict or type(device.get("taints")) is not list:
            continue
        name = str(device.get("name") or "")
        for taint in device["taints"]:
            if type(taint) is dict and isinstance(taint.get("timeAdded"), str):
                found[_taint_id(name, taint)] = taint["timeAdded"]
    return found


def keep_taint_times(spec: dict[str, Any], times: Mapping[str, str]) -> None:
    """Give each taint of ``spec`` (v1 shape; its ``devices`` list is changed in place, the
    device dicts are replaced, not modified) that has no ``timeAdded``
    the time ``times`` (:func:`taint_times` of the stored slice) holds for the same device and
    taint. A new taint gets none: the API server stamps it with the current time."""
    devices = spec.get("devices")
    if not times or type(devices) is not list:
        return
    for index, device in enumerate(devices):
        if type(device) is not dict or not device.get("taints"):
            continue
        name = str(device.get("name") or "")
        kept, changed = [], False
        for taint in device["taints"]:
            when = times.get(_taint_id(name, taint)) if type(taint) is dict else None
            if when and "timeAdded" not in taint:
                kept.append({**taint, "timeAdded": when})
                changed = True
            else:
                kept.append(taint)
        if changed:
            # Copied, never changed in place: the desired pool shares its device dicts.
            devices[index] = {**device, "taints": kept}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _whole(value: Any) -> int:
    return value if type(value) is int else 0


def existing_slice(
    obj: Mapping[str, Any], driver_name: str, key: str | None = None
) -> ExistingSlice:
    """Read an :class:`ExistingSlice` from a ResourceSlice JSON object (v1 shape).

    ``key`` is the content key when already known (the spec's content is then not read). A
    spec reduced to its header may carry the taint times under :data:`TAINT_TIMES`.
    Missing fields read as empty / 0, so a malformed slice is still classified (and deleted).
    """
    metadata = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    pool = _mapping(spec.get("pool"))
    name = str(metadata.get("name") or "")
    return ExistingSlice(
        name=name,
        uid=str(metadata.get("uid") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        pool_name=str(pool.get("name") or ""),
        generation=_whole(pool.get("generation")),
        resource_slice_count=_whole(pool.get("resourceSliceCount")),
        index=slice_index(name, driver_name),
        content_key=key if key is not None else content_key(content_of(spec)),
        kept_metadata={k: json_copy(metadata[k]) for k in _KEPT_METADATA if metadata.get(k)},
        taint_times=(
            dict(spec[TAINT_TIMES])
            if isinstance(spec.get(TAINT_TIMES), dict)
            else taint_times(spec)
        ),
    )


# --------------------------------------------------------------------------- classify
@dataclass(frozen=True)
class Classification:
    """Existing slices of one pool sorted against the desired ones.

    Attributes:
        obsolete: slices to delete (no index, an index beyond the desired count, duplicates, or
            the whole pool when it is no longer desired).
        unchanged: (index, slice) matched and fully in sync (content, count, generation).
        changed: (index, slice) matched but differing in content, count or generation.
        missing: desired indexes with no existing slice.
        max_generation: highest ``generation`` among all existing slices; None when none.
    """

    obsolete: tuple[ExistingSlice, ...]
    unchanged: tuple[tuple[int, ExistingSlice], ...]
    changed: tuple[tuple[int, ExistingSlice], ...]
    missing: tuple[int, ...]
    max_generation: int | None


def _in_sync(key: str, wanted: str, accepted: Mapping[str, str]) -> bool:
    return key == wanted or accepted.get(wanted) == key


def classify(
    desired: DesiredPool | None,
    existing: Sequence[ExistingSlice],
    expected_keys: Sequence[str],
    accepted: Mapping[str, str] | None = None,
) -> Classification:
    """Sort the ``existing`` slices of one pool against ``desired``.

    Args:
        desired: the pool as it should be; None when it should not exist.
        existing: the pool's existing slices (all with the same ``pool_name``).
        expected_keys: :func:`expected_key` of each desired slice, by index.
        accepted: expected key -> content key of the form the API server returned for it.

    Returns:
        a :class:`Classification`; deterministic for a given input (order of ``existing`` does
        not matter).
    """
    accepted = accepted or {}
    ordered = sorted(existing, key=lambda s: s.name)
    max_generation = max((s.generation for s in ordered), default=None)
    if desired is None:
        return Classification(tuple(ordered), (), (), (), max_generation)
    count = len(desired.slices)
    candidates: dict[int, list[ExistingSlice]] = {}
    obsolete: list[ExistingSlice] = []
    for resource_slice in ordered:
        index = resource_slice.index
        if index is None or index >= count:
            obsolete.append(resource_slice)
        else:
            candidates.setdefault(index, []).append(resource_slice)
    unchanged: list[tuple[int, ExistingSlice]] = []
    changed: list[tuple[int, ExistingSlice]] = []
    missing: list[int] = []
    for index in range(count):
        found = candidates.get(index)
        if not found:
            missing.append(index)
            continue
        wanted = expected_keys[index]
        # Keep the duplicate that needs the least work: in sync, newest generation, then name.
        found.sort(
            key=lambda s: (not _in_sync(s.content_key, wanted, accepted), -s.generation, s.name)
        )
        keep, *rest = found
        obsolete.extend(rest)
        in_sync = (
            _in_sync(keep.content_key, wanted, accepted)
            and keep.resource_slice_count == count
            and keep.generation == max_generation
        )
        (unchanged if in_sync else changed).append((index, keep))
    obsolete.sort(key=lambda s: s.name)
    return Classification(
        tuple(obsolete), tuple(unchanged), tuple(changed), tuple(missing), max_generation
    )


# --------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Write:
    """One API write.

    Attributes:
        verb: delete, update or create.
        index: the slice index (None for a delete of a slice without one).
        name: the slice name (None for a create: the server generates it).
        uid, resource_version: preconditions of a delete; an update carries the version in
            its body.
        body: the full ResourceSlice (v1 shape) for update and create.
    """

    verb: Verb
    index: int | None
    name: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    body: dict[str, Any] | None = None


@dataclass(frozen=True)
class PoolPlan:
    """The writes that make one pool's slices equal to the desired ones.

    Attributes:
        pool_name: the pool.
        generation: the pool generation after the writes; None when the pool is removed.
        bumped: True when the generation was raised (every slice is rewritten).
        writes: deletes, then updates, then creates.
        classification: what the plan was made from.
    """

    pool_name: str
    generation: int | None
    bumped: bool
    writes: tuple[Write, ...]
    classification: Classification

    def of(self, verb: Verb) -> tuple[Write, ...]:
        """The writes with ``verb``, in plan order."""
        return tuple(w for w in self.writes if w.verb == verb)


def _body(
    driver_name: str,
    pool: DesiredPool,
    content: SliceContent,
    generation: int,
    metadata: dict[str, Any],
    times: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    spec = resource_slice_spec(driver_name, pool, content, generation)
    if times:
        keep_taint_times(spec, times)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


def plan_pool(
    driver_name: str,
    pool_name: str,
    desired: DesiredPool | None,
    existing: Sequence[ExistingSlice],
    *,
    expected_keys: Sequence[str] | None = None,
    accepted: Mapping[str, str] | None = None,
    floor_generation: int | None = None,
) -> PoolPlan:
    """Plan the writes for one pool (see the module docstring for the rules).

    Args:
        driver_name: our driver.
        pool_name: the pool (``desired.name`` when desired is given).
        desired: the pool as it should be, or None to remove it.
        existing: its existing slices of our driver.
        expected_keys: :func:`expected_key` per desired index (computed when None).
        accepted: see :func:`classify`.
        floor_generation: the highest generation this pool is known to have had (the caller
            remembers it); a bump goes past it, and a pool whose existing slices are all below
            it is bumped. After every slice of a pool was deleted, a consumer that has not seen
            the deletes yet must still not mix old slices with new ones at the same generation.

    Returns:
        a :class:`PoolPlan`; empty ``writes`` when everything is in sync.

    Raises:
        ValueError: ``desired.name`` is not ``pool_name``, or ``existing`` holds another pool.
    """
    if desired is not None and desired.name != pool_name:
        raise ValueError(f"pool {pool_name!r}: desired pool is named {desired.name!r}")
    for resource_slice in existing:
        if resource_slice.pool_name != pool_name:
            raise ValueError(
                f"pool {pool_name!r}: slice {resource_slice.name} belongs to "
                f"pool {resource_slice.pool_name!r}"
            )
    if desired is not None and expected_keys is None:
        expected_keys = [expected_key(desired, content) for content in desired.slices]
    found = classify(desired, existing, expected_keys or (), accepted)
    deletes = tuple(
        Write("delete", s.index, s.name, s.uid, s.resource_version) for s in found.obsolete
    )
    if desired is None:
        return PoolPlan(pool_name, None, False, deletes, found)
    highest = found.max_generation
    floor = floor_generation if floor_generation is not None else -1
    bumped = highest is None or highest < floor or bool(found.missing) or len(found.changed) > 1
    generation = max(highest or 0, floor) + 1 if bumped else (highest or 0)
    rewrite = [*found.changed, *found.unchanged] if bumped else list(found.changed)
    rewrite.sort(key=lambda pair: pair[0])
    updates = tuple(
        Write(
            "update",
            index,
            current.name,
            current.uid,
            current.resource_version,
            _body(
                driver_name,
                desired,
                desired.slices[index],
                generation,
                {
                    "name": current.name,
                    "resourceVersion": current.resource_version,
                    **json_copy(dict(current.kept_metadata)),
                },
                current.taint_times,
            ),
        )
        for index, current in rewrite
    )
    creates = tuple(
        Write(
            "create",
            index,
            body=_body(
                driver_name,
                desired,
                desired.slices[index],
                generation,
                {"generateName": generate_name(driver_name, index)},
            ),
        )
        for index in found.missing
    )
    return PoolPlan(pool_name, generation, bumped, deletes + updates + creates, found)
