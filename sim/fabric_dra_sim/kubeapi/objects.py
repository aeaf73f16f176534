"""Small pure helpers on object JSON: timestamps, generated names, dotted-path field removal
(conversion between served versions lives in :mod:`.conversion`).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from .resources import RESOURCE_GROUP, ResourceType

# k8s.io/apiserver pkg/storage/names: consonants and digits that cannot spell words.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def now_rfc3339() -> str:
    """The current UTC time as a Kubernetes ``metav1.Time`` string (second precision),
    formatted once per second and reused within it (every write stamps one or more)."""
    global _now_text
    second = int(time.time())
    if _now_text[0] != second:
        _now_text = (second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)))
    return _now_text[1]


_now_text: tuple[int, str] = (-1, "")


def random_suffix(length: int = 5) -> str:
    """A generateName suffix of ``length`` characters (k8s.io/apiserver SimpleNameGenerator)."""
    return "".join(secrets.choice(_NAME_ALPHABET) for _ in range(length))


def drop_path(obj: Any, path: str) -> None:
    """Remove the field at dotted ``path`` from ``obj`` in place; ``name[]`` walks every list
    element. Missing intermediate fields are ignored.
    """
    head, dot, rest = path.partition(".")
    is_list = head.endswith("[]")
    key = head[:-2] if is_list else head
    if not isinstance(obj, dict) or key not in obj:
        return
    if not dot:
        obj.pop(key, None)
        return
    children = obj[key] if is_list and isinstance(obj[key], list) else [obj[key]]
    for child in children:
        drop_path(child, rest)


def spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    """Everything but metadata and status: a change here bumps metadata.generation."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


# Kinds whose strategy sets metadata.generation to 1 on create and bumps it when the spec
# changes: k8s.io/kubernetes pkg/registry/resource/resourceslice/strategy.go and
# deviceclass/strategy.go (PrepareForCreate/PrepareForUpdate), pkg/registry/core/pod/strategy.go
# (PrepareForCreate, updatePodGeneration). The ResourceClaim, ResourceClaimTemplate and
# PodSchedulingContext strategies never touch it, nor do those of Nodes, Namespaces, Events and
# Leases, so their objects carry no generation.
_GENERATION_KINDS = {
    (RESOURCE_GROUP, "resourceslices"),
    (RESOURCE_GROUP, "deviceclasses"),
    ("", "pods"),
}


def uses_generation(rt: ResourceType) -> bool:
    """True for kinds whose strategy maintains ``metadata.generation`` (ResourceSlice,
    DeviceClass, Pod); False for every other served kind.
    """
    return rt.group_resource in _GENERATION_KINDS
