"""Core NodeSelector rules, as the resource.k8s.io rules use them (ResourceSlice
``spec.nodeSelector``, a device's ``nodeSelector``, a claim's ``allocation.nodeSelector``).

Ports of k8s.io/kubernetes pkg/apis/core/validation/validation.go: ValidateNodeSelector,
ValidateNodeSelectorTerm, ValidateNodeSelectorRequirement, ValidateNodeFieldSelectorRequirement.
Each function takes plain JSON and returns causes with the field paths the Go code reports.
"""

from __future__ import annotations

import json
from typing import Any

from . import dra, names
from .errors import Cause

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
# nodeFieldSelectorValidators: the only field a matchFields requirement may name.
_FIELD_KEYS = ("metadata.name",)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def requirement_causes(requirement: Any, field: str, *, label_values: bool) -> list[Cause]:
    """One ``matchExpressions[]`` entry (ValidateNodeSelectorRequirement): In/NotIn need values,
    Exists/DoesNotExist forbid them, Gt/Lt take exactly one; the key is a qualified name; with
    ``label_values`` (the 1.34+ rules) every value must be a valid label value.
    """
    if not isinstance(requirement, dict):
        return [dra.cause_invalid(field, requirement, "must be an object")]
    operator = requirement.get("operator")
    values = _as_list(requirement.get("values"))
    out: list[Cause] = []
    if operator in ("In", "NotIn"):
        if not values:
            out.append(
                dra.cause_required(
                    f"{field}.values", "must be specified when `operator` is 'In' or 'NotIn'"
                )
            )
    elif operator in ("Exists", "DoesNotExist"):
        if values:
            out.append(
                dra.cause_forbidden(
                    f"{field}.values",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
    elif operator in ("Gt", "Lt"):
        if len(values) != 1:
            out.append(
                dra.cause_required(
                    f"{field}.values",
                    "must be specified single value when `operator` is 'Lt' or 'Gt'",
                )
            )
    else:
        out.append(
            dra.cause_invalid(f"{field}.operator", operator, "not a valid selector operator")
        )
    key = requirement.get("key") or ""
    out.extend(dra.cause_invalid(f"{field}.key", key, e) for e in names.qualified_name(str(key)))
    if label_values:
        for i, value in enumerate(values):
            out.extend(
                dra.cause_invalid(f"{field}.values[{i}]", value, e)
                for e in names.label_value(str(value))
            )
    return out


def field_requirement_causes(requirement: Any, field: str) -> list[Cause]:
    """One ``matchFields[]`` entry (ValidateNodeFieldSelectorRequirement): In or NotIn with
    exactly one value, key ``metadata.name``, values valid node names (DNS subdomains).
    """
    if not isinstance(requirement, dict):
        return [dra.cause_invalid(field, requirement, "must be an object")]
    operator = requirement.get("operator")
    values = _as_list(requirement.get("values"))
    out: list[Cause] = []
    if operator in ("In", "NotIn"):
        if len(values) != 1:
            out.append(
                dra.cause_required(
                    f"{field}.values",
                    "must be only one value when "
                    "`operator` is 'In' or 'NotIn' for node field selector",
                )
            )
    else:
        out.append(
            dra.cause_invalid(f"{field}.operator", operator, "not a valid selector operator")
        )
    key = requirement.get("key")
    if key not in _FIELD_KEYS:
        out.append(dra.cause_invalid(f"{field}.key", key, "not a valid field selector key"))
    else:
        for i, value in enumerate(values):
            out.extend(
                dra.cause_invalid(f"{field}.values[{i}]", value, e)
                for e in names.dns_subdomain(str(value))
            )
    return out


def term_causes(term: Any, field: str, *, label_values: bool) -> list[Cause]:
    """One ``nodeSelectorTerms[]`` entry (ValidateNodeSelectorTerm); an empty term is valid."""
    if not isinstance(term, dict):
        return [dra.cause_invalid(field, term, "must be an object")]
    out: list[Cause] = []
    for j, requirement in enumerate(_as_list(term.get("matchExpressions"))):
        out.extend(
            requirement_causes(
                requirement, f"{field}.matchExpressions[{j}]", label_values=label_values
            )
        )
    for j, requirement in enumerate(_as_list(term.get("matchFields"))):
        out.extend(field_requirement_causes(requirement, f"{field}.matchFields[{j}]"))
    return out


def node_selector_causes(selector: Any, field: str, *, label_values: bool = True) -> list[Cause]:
    """A core NodeSelector at ``field`` (ValidateNodeSelector): at least one term, each term
    valid. ``label_values``: check requirement values as label values, as the 1.34+
    resource.k8s.io rules do (they pass ``allowInvalidLabelValueInRequiredNodeAffinity=false``);
    the 1.31 ValidateNodeSelector had no value check.
    """
    if not isinstance(selector, dict):
        return [dra.cause_invalid(field, json.dumps(selector)[:80], "must be an object")]
    terms = _as_list(selector.get("nodeSelectorTerms"))
    if not terms:
        return [
            dra.cause_required(
                f"{field}.nodeSelectorTerms", "must have at least one node selector term"
            )
        ]
    out: list[Cause] = []
    for i, term in enumerate(terms):
        out.extend(term_causes(term, f"{field}.nodeSelectorTerms[{i}]", label_values=label_values))
    return out
