"""Request options of the write verbs: ``dryRun``, ``fieldManager``, ``force`` and the
DeleteOptions body, checked the way kube-apiserver checks them before touching storage.

Rules from k8s.io/apimachinery pkg/apis/meta/v1/validation/validation.go (ValidateDryRun,
ValidateFieldManager, ValidateCreateOptions, ValidateUpdateOptions, ValidatePatchOptions,
ValidateDeleteOptions); the handlers (k8s.io/apiserver pkg/endpoints/handlers create.go,
update.go, patch.go, delete.go) answer a failure with 422 Invalid on kind
``<Verb>Options`` of group ``meta.k8s.io`` and an empty name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import Cause, bad_request, invalid

META_GROUP = "meta.k8s.io"
DRY_RUN_ALL = "All"
FIELD_MANAGER_MAX_LENGTH = 128
_PROPAGATION = ("Foreground", "Background", "Orphan")


def _go_strings(values: Sequence[str]) -> str:
    # The %#v rendering of a []string in a field error: []string{"a", "b"}.
    return "[]string{" + ", ".join(json.dumps(v) for v in values) + "}"


def dry_run_causes(values: Sequence[str]) -> list[Cause]:
    """Causes for ``dryRun`` values other than ``All`` (ValidateDryRun: NotSupported)."""
    if all(v == DRY_RUN_ALL for v in values):
        return []
    return [Cause("FieldValueNotSupported",
                  f'Unsupported value: {_go_strings(values)}: supported values: "All"',
                  "dryRun")]


def field_manager_causes(manager: str) -> list[Cause]:
    """Causes for a ``fieldManager`` longer than 128 characters or with unprintable ones
    (ValidateFieldManager).
    """
    causes: list[Cause] = []
    if len(manager) > FIELD_MANAGER_MAX_LENGTH:
        causes.append(Cause("FieldValueTooLong", f"Too long: may not be more than "
                            f"{FIELD_MANAGER_MAX_LENGTH} bytes", "fieldManager"))
    for index, char in enumerate(manager):
        # Go's unicode.IsPrint: the ASCII space is the only printable space.
        if not char.isprintable():
            causes.append(Cause("FieldValueInvalid", f"Invalid value: {json.dumps(manager)}: "
                                f"invalid character U+{ord(char):04X} (at position {index})",
                                "fieldManager"))
    return causes


def check_write_options(verb: str, *, dry_run: Sequence[str], field_manager: str = "",
                        force_given: bool = False, apply: bool = False) -> None:
    """Validate the options of a create, update or patch (``verb``: "Create", "Update",
    "Patch"). ``force_given``: the ``force`` parameter was sent; ``apply``: the patch is
    server-side apply.

    Raises StatusError 422 Invalid on ``<verb>Options.meta.k8s.io ""``: an unknown dryRun
    value, a bad fieldManager, ``force`` on a non-apply patch (``Forbidden: may not be
    specified for non-apply patch``).
    """
    causes: list[Cause] = []
    if verb == "Patch" and force_given and not apply:
        causes.append(Cause("FieldValueForbidden",
                            "Forbidden: may not be specified for non-apply patch", "force"))
    causes += field_manager_causes(field_manager)
    causes += dry_run_causes(dry_run)
    if causes:
        raise invalid(f"{verb}Options", META_GROUP, "", causes)


def _query_options(query: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    # The DeleteOptions fields a client may send as query parameters.
    options: dict[str, Any] = {}
    if query.get("gracePeriodSeconds"):
        value = query["gracePeriodSeconds"][0]
        try:
            options["gracePeriodSeconds"] = int(value)
        except ValueError as err:
            raise bad_request(f'strconv.ParseInt: parsing "{value}": invalid syntax') from err
    if query.get("propagationPolicy"):
        options["propagationPolicy"] = query["propagationPolicy"][0]
    if query.get("orphanDependents"):
        options["orphanDependents"] = query["orphanDependents"][0].lower() == "true"
    return options


def delete_options(body: Any, query: Mapping[str, Sequence[str]]) -> tuple[dict[str, Any], bool]:
    """The DeleteOptions of a DELETE and whether it is a dry run. ``query``: the request's
    query parameters, each a list of values.

    A body wins over the query, as in k8s.io/apiserver handlers/delete.go (query parameters
    are decoded only without a body). Raises StatusError 400 for a body that is not an
    object or a bad gracePeriodSeconds, 422 Invalid on ``DeleteOptions.meta.k8s.io ""`` for
    both orphanDependents and propagationPolicy, an unknown propagationPolicy or dryRun value
    (ValidateDeleteOptions).
    """
    if body is None:
        options = _query_options(query)
        dry_run = list(query.get("dryRun") or [])
    elif isinstance(body, dict):
        options = body
        raw = body.get("dryRun") or []
        dry_run = [str(v) for v in raw] if isinstance(raw, list) else [str(raw)]
    else:
        raise bad_request("DeleteOptions must be a JSON object")
    causes: list[Cause] = []
    policy = options.get("propagationPolicy")
    if options.get("orphanDependents") is not None and policy is not None:
        causes.append(Cause("FieldValueInvalid", f"Invalid value: {json.dumps(policy)}: "
                            "orphanDependents and deletionPropagation cannot be both set",
                            "propagationPolicy"))
    if policy is not None and policy not in _PROPAGATION:
        causes.append(Cause("FieldValueNotSupported",
                            f"Unsupported value: {json.dumps(policy)}: supported values: "
                            '"Foreground", "Background", "Orphan", "nil"',
                            "propagationPolicy"))
    causes += dry_run_causes(dry_run)
    grace = options.get("gracePeriodSeconds")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)):
        raise bad_request(f"json: cannot unmarshal {type(grace).__name__} into Go struct "
                          "field DeleteOptions.gracePeriodSeconds of type int64")
    if causes:
        raise invalid("DeleteOptions", META_GROUP, "", causes)
    return options, bool(dry_run)


def accepted_status(deleted: bool, options: dict[str, Any]) -> int:
    """The HTTP status of a successful DELETE: 202 when the object is still there and the
    caller set ``orphanDependents: false``, 200 otherwise (handlers/delete.go DeleteResource;
    finalizers, a pending graceful deletion and namespace termination all answer 200).
    """
    return 202 if not deleted and options.get("orphanDependents") is False else 200
