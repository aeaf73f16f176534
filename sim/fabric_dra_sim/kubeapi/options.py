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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import Cause, StatusError, bad_request, invalid
from .values import ValueDecodeError, check_int, json_kind

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
    return [
        Cause(
            "FieldValueNotSupported",
            f'Unsupported value: {_go_strings(values)}: supported values: "All"',
            "dryRun",
        )
    ]


def field_manager_causes(manager: str) -> list[Cause]:
    """Causes for a ``fieldManager`` longer than 128 characters or with unprintable ones
    (ValidateFieldManager).
    """
    causes: list[Cause] = []
    if len(manager) > FIELD_MANAGER_MAX_LENGTH:
        causes.append(
            Cause(
                "FieldValueTooLong",
                f"Too long: may not be more than {FIELD_MANAGER_MAX_LENGTH} bytes",
                "fieldManager",
            )
        )
    for index, char in enumerate(manager):
        # Go's unicode.IsPrint: the ASCII space is the only printable space.
        if not char.isprintable():
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {json.dumps(manager)}: "
                    f"invalid character U+{ord(char):04X} (at position {index})",
                    "fieldManager",
                )
            )
    return causes


def check_write_options(
    verb: str,
    *,
    dry_run: Sequence[str],
    field_manager: str = "",
    force_given: bool = False,
    apply: bool = False,
) -> None:
    """Validate the options of a create, update or patch (``verb``: "Create", "Update",
    "Patch"). ``force_given``: the ``force`` parameter was sent; ``apply``: the patch is
    server-side apply.

    Raises StatusError 422 Invalid on ``<verb>Options.meta.k8s.io ""``: an unknown dryRun
    value, a bad fieldManager, ``force`` on a non-apply patch (``Forbidden: may not be
    specified for non-apply patch``).
    """
    causes: list[Cause] = []
    if verb == "Patch" and force_given and not apply:
        causes.append(
            Cause(
                "FieldValueForbidden",
                "Forbidden: may not be specified for non-apply patch",
                "force",
            )
        )
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


# The scheme that decodes DeleteOptions bodies (k8s.io/apimachinery
# pkg/apis/meta/internalversion/scheme/register.go), named in its not-registered errors.
META_SCHEME = "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme/register.go:27"
DEFAULT_DELETE_GROUP_VERSION = "meta.k8s.io/v1"

# The DeleteOptions fields and their Go types (k8s.io/apimachinery pkg/apis/meta/v1/types.go
# DeleteOptions, Preconditions).
_DELETE_FIELDS: dict[str, str] = {
    "gracePeriodSeconds": "int64",
    "preconditions": "v1.Preconditions",
    "orphanDependents": "bool",
    "propagationPolicy": "v1.DeletionPropagation",
    "dryRun": "[]string",
    "ignoreStoreReadErrorWithClusterBreakingPotential": "bool",
    "kind": "string",
    "apiVersion": "string",
}
_PRECONDITION_FIELDS = {"uid": "types.UID", "resourceVersion": "string"}


def _type_error(value: Any, path: str, go_type: str) -> StatusError:
    return bad_request(
        f"json: cannot unmarshal {json_kind(value)} into Go struct field "
        f"DeleteOptions.{path} of type {go_type}"
    )


def _decode_int64(value: Any, key: str, go_type: str) -> Any:
    """An int64 field: a JSON number that fits in 64 bits, kept as sent."""
    try:
        check_int(value, 64, "DeleteOptions", key)
    except ValueDecodeError as err:
        raise bad_request(str(err)) from err
    return value


def _decode_bool(value: Any, key: str, go_type: str) -> Any:
    """A bool field: only a JSON true or false."""
    if not isinstance(value, bool):
        raise _type_error(value, key, go_type)
    return value


def _decode_string_list(value: Any, key: str, go_type: str) -> list[str]:
    """A []string field: a JSON array of strings, a null item decoding as ``""``."""
    if not isinstance(value, list):
        raise _type_error(value, key, go_type)
    for item in value:
        if item is not None and not isinstance(item, str):
            raise _type_error(item, key, "string")
    return ["" if item is None else item for item in value]


def _decode_preconditions(value: Any, key: str, go_type: str) -> dict[str, Any]:
    """The Preconditions object: its known string fields, unknown and null ones dropped."""
    if not isinstance(value, dict):
        raise _type_error(value, key, go_type)
    kept: dict[str, Any] = {}
    for name, item in value.items():
        item_type = _PRECONDITION_FIELDS.get(name)
        if item_type is None or item is None:
            continue
        if not isinstance(item, str):
            raise _type_error(item, f"preconditions.{name}", item_type)
        kept[name] = item
    return kept


def _decode_string(value: Any, key: str, go_type: str) -> Any:
    """A field of a string type (string, v1.DeletionPropagation): only a JSON string."""
    if not isinstance(value, str):
        raise _type_error(value, key, go_type)
    return value


# How a DeleteOptions field of each Go type decodes; a type not listed is a string type.
_DECODERS: dict[str, Callable[[Any, str, str], Any]] = {
    "int64": _decode_int64,
    "bool": _decode_bool,
    "[]string": _decode_string_list,
    "v1.Preconditions": _decode_preconditions,
}


def _check_delete_kind(body: dict[str, Any]) -> None:
    """Raise unless ``body``'s apiVersion and kind name DeleteOptions (missing ones do)."""
    for key in ("apiVersion", "kind"):
        value = body.get(key)
        if value is not None and not isinstance(value, str):
            raise _type_error(value, key, "string")
    api_version = body.get("apiVersion") or ""
    kind = body.get("kind") or "DeleteOptions"
    if kind != "DeleteOptions":
        shown = api_version or DEFAULT_DELETE_GROUP_VERSION
        raise bad_request(
            f'no kind "{kind}" is registered for version "{shown}" in scheme "{META_SCHEME}"'
        )


def _decode_delete_body(body: dict[str, Any]) -> dict[str, Any]:
    # k8s.io/apiserver pkg/endpoints/handlers/delete.go DeleteResource: the body is decoded
    # with the meta internal scheme, every error a 400 BadRequest. DeleteOptions is an
    # unversioned type there (k8s.io/apimachinery pkg/apis/meta/internalversion/register.go
    # AddUnversionedTypes), so any apiVersion decodes it; another kind is not registered
    # (k8s.io/apimachinery pkg/runtime/error.go notRegisteredErr), a missing apiVersion and
    # kind default to meta.k8s.io/v1 DeleteOptions (pkg/runtime/serializer/json/json.go
    # gvkWithDefaults). Field types follow encoding/json (sigs.k8s.io/json); a null leaves a
    # field at its zero value, so it is dropped here.
    _check_delete_kind(body)
    options: dict[str, Any] = {}
    for key, value in body.items():
        go_type = _DELETE_FIELDS.get(key)
        if go_type is None or value is None:
            continue  # unknown fields are dropped by the non-strict decoder
        options[key] = _DECODERS.get(go_type, _decode_string)(value, key, go_type)
    return options


def delete_options(body: Any, query: Mapping[str, Sequence[str]]) -> tuple[dict[str, Any], bool]:
    """The DeleteOptions of a DELETE and whether it is a dry run. ``query``: the request's
    query parameters, each a list of values.

    A body wins over the query, as in k8s.io/apiserver handlers/delete.go (query parameters
    are decoded only without a body). Raises StatusError 400 for a body that does not decode
    as DeleteOptions (not an object, another kind, a field of the wrong JSON type) or a bad
    gracePeriodSeconds, 422 Invalid on ``DeleteOptions.meta.k8s.io ""`` for
    both orphanDependents and propagationPolicy, an unknown propagationPolicy or dryRun value
    (ValidateDeleteOptions).
    """
    if body is None:
        options = _query_options(query)
        dry_run = list(query.get("dryRun") or [])
    elif isinstance(body, dict):
        options = _decode_delete_body(body)
        dry_run = list(options.get("dryRun") or [])
    else:
        # encoding/json into a struct: anything but an object is a type error.
        raise bad_request(
            f"couldn't get version/kind; json parse error: json: cannot "
            f"unmarshal {json_kind(body)} into Go value of type "
            'struct { APIVersion string "json:\\"apiVersion,omitempty\\""; '
            'Kind string "json:\\"kind,omitempty\\"" }'
        )
    causes: list[Cause] = []
    policy = options.get("propagationPolicy")
    if options.get("orphanDependents") is not None and policy is not None:
        causes.append(
            Cause(
                "FieldValueInvalid",
                f"Invalid value: {json.dumps(policy)}: "
                "orphanDependents and deletionPropagation cannot be both set",
                "propagationPolicy",
            )
        )
    if policy is not None and policy not in _PROPAGATION:
        causes.append(
            Cause(
                "FieldValueNotSupported",
                f"Unsupported value: {json.dumps(policy)}: supported values: "
                '"Foreground", "Background", "Orphan", "nil"',
                "propagationPolicy",
            )
        )
    causes += dry_run_causes(dry_run)
    grace = options.get("gracePeriodSeconds")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)):
        raise bad_request(
            f"json: cannot unmarshal {type(grace).__name__} into Go struct "
            "field DeleteOptions.gracePeriodSeconds of type int64"
        )
    if causes:
        raise invalid("DeleteOptions", META_GROUP, "", causes)
    return options, bool(dry_run)


def accepted_status(deleted: bool, options: dict[str, Any]) -> int:
    """The HTTP status of a successful DELETE: 202 when the object is still there and the
    caller set ``orphanDependents: false``, 200 otherwise (handlers/delete.go DeleteResource;
    finalizers, a pending graceful deletion and namespace termination all answer 200).
    """
    return 202 if not deleted and options.get("orphanDependents") is False else 200
