"""Small pure helpers on object JSON: timestamps, generated names, dotted-path field removal,
version visibility between served versions.
"""

from __future__ import annotations

import copy
import datetime
import secrets
from typing import Any

from .resources import RESOURCE_GROUP, ResourceType

# k8s.io/apiserver pkg/storage/names: consonants and digits that cannot spell words.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# resource.k8s.io versions whose JSON is identical: an object written through one is shown
# through the other with only apiVersion changed.
_SAME_SHAPE = {"v1", "v1beta2"}


def now_rfc3339() -> str:
    """The current UTC time as a Kubernetes ``metav1.Time`` string (second precision)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def visible_as(rt: ResourceType, obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """``obj`` as seen through ``rt``'s version: itself when written in that version, a copy
    with apiVersion changed between v1 and v1beta2 of resource.k8s.io, otherwise None (an
    object written as v1beta1 or v1alpha3 is only visible through that version).
    """
    if obj is None:
        return None
    if obj.get("apiVersion") == rt.api_version:
        return obj
    written = str(obj.get("apiVersion", "")).rpartition("/")[2]
    if rt.group == RESOURCE_GROUP and written in _SAME_SHAPE and rt.version in _SAME_SHAPE:
        shown = copy.deepcopy(obj)
        shown["apiVersion"] = rt.api_version
        return shown
    return None


def spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    """Everything but metadata and status: a change here bumps metadata.generation."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion",
                                                        "kind")}


def uses_generation(rt: ResourceType) -> bool:
    """Kinds whose strategy maintains metadata.generation (resource.k8s.io kinds and Pods)."""
    return rt.has_spec and rt.plural not in ("nodes", "namespaces")
