"""Label and field selectors, parsed from query strings and matched against objects.

Grammar from k8s.io/apimachinery pkg/labels/selector.go (Parse) and pkg/fields/selector.go
(ParseSelector): ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``
for labels; ``path=v``, ``path==v``, ``path!=v`` for fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import bad_request
from .names import label_value, qualified_name


@dataclass(frozen=True)
class Requirement:
    """One label requirement: ``key``, ``op`` (=, !=, in, notin, exists, !exists), ``values``."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when ``labels`` satisfy this requirement (missing key fails =, in; passes !=)."""
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        if self.op in (">", "<"):
            # Gt/Lt: the label must hold an integer (labels.Requirement.Matches).
            if not present:
                return False
            try:
                have = int(labels[self.key])
            except ValueError:
                return False
            want = int(next(iter(self.values)))
            return have > want if self.op == ">" else have < want
        # != and notin match objects without the label, as in labels.Requirement.Matches.
        return not present or labels[self.key] not in self.values


_SET_RE = re.compile(r"^\s*([^\s!=(),<>]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*([^\s!=(),<>]+)\s*(==|=|!=|>|<)\s*([^\s!=(),<>]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([^\s!=(),<>]+)\s*$")
_GO_INT_RE = re.compile(r"[+-]?[0-9]+")


def _requirement_errors(key: str, op: str, values: list[str]) -> list[str]:
    # k8s.io/apimachinery pkg/labels/selector.go NewRequirement: the key is a qualified name
    # (validateLabelKey), Gt/Lt take one integer, every value is a label value
    # (validateLabelValue); the errors are aggregated ([a, b] for more than one).
    errors: list[str] = []
    key_errors = qualified_name(key)
    if key_errors:
        errors.append(f"key: Invalid value: {json.dumps(key)}: {'; '.join(key_errors)}")
    if op in (">", "<"):
        for index, value in enumerate(values):
            if not (
                value.isascii() and _GO_INT_RE.fullmatch(value) and -(2**63) <= int(value) < 2**63
            ):
                errors.append(
                    f"values[{index}]: Invalid value: {json.dumps(value)}: for "
                    "'Gt', 'Lt' operators, the value must be an integer"
                )
    for index, value in enumerate(values):
        value_errors = label_value(value)
        if value_errors:
            errors.append(
                f"values[{index}][{key}]: Invalid value: {json.dumps(value)}: "
                f"{'; '.join(value_errors)}"
            )
    return errors


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def parse_label_selector(text: str) -> list[Requirement]:
    """Parse a ``labelSelector`` query value into requirements (all must match).

    Raises StatusError 400 BadRequest on a syntax error, like kube-apiserver
    ("unable to parse requirement").
    """
    if not text.strip():
        return []
    out: list[Requirement] = []
    for part in _split_top_level(text):
        if m := _SET_RE.match(part):
            listed = [v.strip() for v in m.group(3).split(",") if v.strip()]
            requirement = Requirement(m.group(1), m.group(2), frozenset(listed))
        elif m := _EQ_RE.match(part):
            op = "=" if m.group(2) in ("=", "==") else m.group(2)
            listed = [m.group(3)]
            requirement = Requirement(m.group(1), op, frozenset(listed))
        elif m := _EXISTS_RE.match(part):
            listed = []
            requirement = Requirement(m.group(2), "!exists" if m.group(1) else "exists")
        else:
            raise bad_request(f"unable to parse requirement: invalid label selector: {part!r}")
        errors = _requirement_errors(requirement.key, requirement.op, listed)
        if errors:
            joined = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
            raise bad_request(f"unable to parse requirement: {joined}")
        out.append(requirement)
    return out


def labels_match(requirements: Iterable[Requirement], labels: Mapping[str, str] | None) -> bool:
    """True when every requirement matches ``labels`` (None means no labels)."""
    present = labels or {}
    return all(r.matches(present) for r in requirements)


@dataclass(frozen=True)
class FieldRequirement:
    """One field requirement: dotted ``path``, ``op`` (= or !=), ``value``."""

    path: str
    op: str
    value: str


_FIELD_RE = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$")


def parse_field_selector(text: str, supported: Iterable[str]) -> list[FieldRequirement]:
    """Parse a ``fieldSelector`` value, allowing ``metadata.name``, ``metadata.namespace`` and
    the resource's ``supported`` paths.

    Raises StatusError 400 ``field label not supported: <path>`` for any other path
    (k8s.io/apiserver pkg/registry/generic: the field label conversion).
    """
    if not text.strip():
        return []
    allowed = {"metadata.name", "metadata.namespace", *supported}
    out: list[FieldRequirement] = []
    for part in text.split(","):
        m = _FIELD_RE.match(part)
        if not m:
            raise bad_request(f"invalid field selector: {part!r}")
        path = m.group(1)
        if path not in allowed:
            raise bad_request(f"field label not supported: {path}")
        out.append(FieldRequirement(path, "=" if m.group(2) in ("=", "==") else "!=", m.group(3)))
    return out


# Field labels per served kind, as the scheme's field label conversion functions accept them:
# k8s.io/kubernetes pkg/apis/core/v1 conversion.go (Pod, Node, Event, Namespace) and
# pkg/apis/resource/<version> conversion.go (ResourceSlice). A kind without a conversion
# function gets k8s.io/apimachinery pkg/runtime DefaultMetaV1FieldSelectorConversion
# (metadata.name and metadata.namespace). ``spec.host`` is the Pod alias of spec.nodeName.
_CORE_LABELS: dict[str, frozenset[str]] = {
    "Pod": frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
            "spec.host",
        }
    ),
    "Node": frozenset({"metadata.name", "spec.unschedulable"}),
    "Namespace": frozenset({"status.phase", "metadata.name"}),
    "Event": frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
            "metadata.namespace",
            "metadata.name",
        }
    ),
}
_SLICE_LABELS = frozenset({"metadata.name", "spec.nodeName", "spec.driver"})
_DEFAULT_LABELS = frozenset({"metadata.name", "metadata.namespace"})
# A label that reads another field. Event "source" is source.component, or reportingController
# when that is empty (pkg/registry/core/event/strategy.go ToSelectableFields); "a|b" is the
# first of a and b that is not empty.
_ALIASES = {
    ("", "Pod", "spec.host"): "spec.nodeName",
    ("", "Event", "source"): "source.component|reportingController",
}


def _label_rule(group: str, version: str, kind: str) -> tuple[frozenset[str], Callable[[str], str]]:
    if group == "" and kind in _CORE_LABELS:
        return _CORE_LABELS[kind], lambda label: f"field label not supported: {label}"
    if group == "resource.k8s.io" and kind == "ResourceSlice":
        gvk = f"resource.k8s.io/{version}, Kind=ResourceSlice"
        return _SLICE_LABELS, lambda label: f"field label not supported for {gvk}: {label}"
    return (
        _DEFAULT_LABELS,
        lambda label: (
            f'"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"'
        ),
    )


def parse_field_selector_for(
    text: str, group: str, version: str, kind: str
) -> list[FieldRequirement]:
    """Parse a ``fieldSelector`` for the served kind ``group/version, kind``: only the labels
    that kind's field label conversion accepts, with aliases resolved (``spec.host`` of a Pod
    is ``spec.nodeName``).

    Raises StatusError 400 with the conversion function's message, e.g. ``field label not
    supported: spec.foo`` for core kinds, ``field label not supported for resource.k8s.io/v1,
    Kind=ResourceSlice: spec.foo``, and ``"spec.foo" is not a known field selector: only
    "metadata.name", "metadata.namespace"`` for kinds without a conversion function (the list
    handler wraps the conversion error in a BadRequest: k8s.io/apiserver
    pkg/endpoints/handlers/get.go ListResource).
    """
    if not text.strip():
        return []
    allowed, message = _label_rule(group, version, kind)
    out: list[FieldRequirement] = []
    for part in text.split(","):
        m = _FIELD_RE.match(part)
        if not m:
            raise bad_request(f"invalid field selector: {part!r}")
        path = m.group(1)
        if path not in allowed:
            raise bad_request(message(path))
        path = _ALIASES.get((group, kind, path), path)
        out.append(FieldRequirement(path, "=" if m.group(2) in ("=", "==") else "!=", m.group(3)))
    return out


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a dotted field in ``obj``: '' when absent, 'true'/'false' for bools;
    ``a|b``: the first of the two that is not empty."""
    if "|" in path:
        return next((v for p in path.split("|") if (v := field_value(obj, p))), "")
    current: Any = obj
    for key in path.split("."):
        if not isinstance(current, Mapping) or key not in current:
            return ""
        current = current[key]
    if isinstance(current, bool):
        return "true" if current else "false"
    return "" if current is None else str(current)


def fields_match(requirements: Iterable[FieldRequirement], obj: Mapping[str, Any]) -> bool:
    """True when every field requirement holds for ``obj``."""
    for req in requirements:
        equal = field_value(obj, req.path) == req.value
        if equal != (req.op == "="):
            return False
    return True
