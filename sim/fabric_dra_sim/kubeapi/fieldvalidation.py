"""Strict decoding of written objects: the ``fieldValidation`` directive and what it does with
unknown and duplicate fields.

kube-apiserver decodes every create, update and patch body into the Go type of the resource.
Fields the type does not have cannot be stored: they are dropped. With ``fieldValidation``
``Strict`` the request fails instead, with ``Warn`` (the default since 1.27) each one becomes a
``Warning`` header, with ``Ignore`` they go silently. Duplicate JSON keys are reported the same
way. Wrong JSON types are decode errors in every mode.

Sources:
- k8s.io/apiserver pkg/endpoints/handlers/rest.go (``fieldValidation``: "" is Warn;
  ``addStrictDecodingWarnings``: one warning per strict error, YAML errors split per line),
  create.go and update.go (strict errors: 400 under Strict, warnings under Warn),
  patch.go (JSON and merge patches: duplicate keys of the patch, then unknown fields of the
  patched object, 422 ``patch: Invalid value`` under Strict; apply: the configuration's
  unknown fields fail its typed conversion in every mode, duplicate YAML keys follow the
  directive).
- k8s.io/apimachinery pkg/apis/meta/v1/validation/validation.go ValidateFieldValidation.
- sigs.k8s.io/json internal/golang/encoding/json/kubernetes_patch.go: the messages
  (``unknown field "spec.foo"``, ``duplicate field "spec.foo"``), the path notation
  (``spec.devices[0].name``) and the limit of 100 strict errors per decode.
- sigs.k8s.io/structured-merge-diff typed/validate.go: ``field not declared in schema``, the
  first unknown field of each map, list items named by their keys (``[name="gpu-0"]``).

The known fields come from the official JSON schema the write is validated against (the
``kubernetes-validate`` strict variants: every Go struct is an object with
``additionalProperties: false``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from .errors import Cause, StatusError, bad_request, invalid

IGNORE = "Ignore"
WARN = "Warn"
STRICT = "Strict"
DIRECTIVES = ("", IGNORE, STRICT, WARN)  # sorted, as ValidateFieldValidation lists them
MAX_STRICT_ERRORS = 100  # sigs.k8s.io/json saveStrictError


def directive(value: str | None, verb: str = "Create") -> str:
    """The effective directive of a ``fieldValidation`` query value: absent or "" is Warn.

    ``verb``: "Create", "Update" or "Patch", naming the options kind of the error. Raises
    StatusError 422 Invalid on ``<verb>Options.meta.k8s.io ""`` for any other value
    (ValidateFieldValidation: NotSupported).
    """
    value = value or ""
    if value not in DIRECTIVES:
        allowed = ", ".join(json.dumps(v) for v in DIRECTIVES)
        raise invalid(
            f"{verb}Options",
            "meta.k8s.io",
            "",
            [
                Cause(
                    "FieldValueNotSupported",
                    f"Unsupported value: {json.dumps(value)}: supported values: {allowed}",
                    "fieldValidation",
                )
            ],
        )
    return value or WARN


# -- reading JSON with duplicate keys ----------------------------------------------------------


def _not_json(literal: str) -> Any:
    # json.loads takes NaN, Infinity and -Infinity; Go's encoding/json, which decodes every
    # request body in kube-apiserver, refuses them: "invalid character 'N' looking for
    # beginning of value" (encoding/json/scanner.go stateBeginValue).
    raise ValueError(f"invalid character {literal[0]!r} looking for beginning of value")


def parse_json(raw: bytes | str) -> tuple[Any, list[str]]:
    """``json.loads`` that also reports duplicate object keys.

    Returns (value, paths): the last value of a duplicated key wins, as in Go's decoder;
    ``paths`` are the duplicated keys' field paths (``spec.devices[0].name``) in document
    order, each once. Raises ValueError for text that is not JSON (also the ``NaN`` and
    ``Infinity`` literals, as Go's decoder does).
    """
    repeated: list[tuple[dict[str, Any], str]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                repeated.append((out, key))
            out[key] = value
        return out

    value = json.loads(raw, object_pairs_hook=pairs, parse_constant=_not_json)
    if not repeated:
        return value, []
    # Only a document with duplicates pays for the walk that names them.
    wanted: dict[int, list[str]] = {}
    for owner, key in repeated:
        keys = wanted.setdefault(id(owner), [])
        if key not in keys:
            keys.append(key)
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            found.extend(_join(path, k) for k in wanted.get(id(node), ()))
            for key, child in node.items():
                walk(child, _join(path, key))
        elif isinstance(node, list):
            for index, child in enumerate(node):
                walk(child, f"{path}[{index}]")

    walk(value, "")
    return value, found


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _DuplicateKeyLoader(yaml.SafeLoader):
    """A SafeLoader that records duplicate mapping keys the way go-yaml v2 reports them."""

    duplicates: list[tuple[int, str]]

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue
            if duplicate:
                # gopkg.in/yaml.v2 decode.go setMapIndex: the line of the value, the key %#v.
                shown = json.dumps(key) if isinstance(key, str) else str(key)
                line = value_node.start_mark.line + 1
                self.duplicates.append((line, f"line {line}: key {shown} already set in map"))
        return super().construct_mapping(node, deep=deep)


def load_yaml(raw: bytes) -> tuple[Any, list[str]]:
    """Parse an apply configuration; returns (value, duplicate-key messages).

    Messages read ``line 3: key "foo" already set in map`` (sigs.k8s.io/yaml UnmarshalStrict).
    Raises yaml.YAMLError for text that is not YAML.
    """
    loader = _DuplicateKeyLoader(raw)
    loader.duplicates = []
    try:
        value = loader.get_single_data()
    finally:
        loader.dispose()
    # go-yaml decodes depth first: a nested map's duplicates come before a later key's.
    return value, [message for _, message in sorted(loader.duplicates, key=lambda d: d[0])]


# -- the known fields of a schema -------------------------------------------------------------


class Shape:
    """What a JSON schema node allows: known ``fields`` (a Go struct), ``values`` (a map's
    value shape), ``items`` (a list's element shape) with its ``list_keys`` (associative
    lists). A node with neither fields nor values (RawExtension, FieldsV1) is free-form.
    """

    __slots__ = ("fields", "items", "list_keys", "types", "values")

    def __init__(self) -> None:
        self.fields: dict[str, Shape] | None = None
        self.values: Shape | None = None
        self.items: Shape | None = None
        self.list_keys: tuple[str, ...] = ()
        # The JSON types the schema allows besides null (empty: any, e.g. int-or-string).
        self.types: frozenset[str] = frozenset()


def compile_shape(validator: Any) -> Shape:
    """The :class:`Shape` of a ``jsonschema`` validator's schema, its ``$ref`` s resolved
    through the validator's own registry (so it follows the schema version chosen for it).
    """
    memo: dict[str, Shape] = {}
    return _compile(validator.schema, validator._resolver, memo)


def _compile(schema: Any, resolver: Any, memo: dict[str, Shape]) -> Shape:
    if not isinstance(schema, dict):
        return Shape()
    ref = schema.get("$ref")
    if isinstance(ref, str):
        key = ref.split("#", 1)[-1]
        if key in memo:
            return memo[key]
        resolved = resolver.lookup(ref)
        shape = memo[key] = Shape()
        _fill(shape, resolved.contents, resolved.resolver, memo)
        return shape
    shape = Shape()
    _fill(shape, schema, resolver, memo)
    return shape


def _fill(shape: Shape, schema: dict[str, Any], resolver: Any, memo: dict[str, Shape]) -> None:
    if isinstance(schema.get("$ref"), str):
        other = _compile(schema, resolver, memo)
        shape.fields, shape.values = other.fields, other.values
        shape.items, shape.list_keys = other.items, other.list_keys
        shape.types = other.types
        return
    for part in schema.get("allOf") or ():
        _fill(shape, part, resolver, memo)
    declared = schema.get("type")
    if isinstance(declared, str | list):
        named = {declared} if isinstance(declared, str) else set(declared)
        shape.types = frozenset(t for t in named if isinstance(t, str) and t != "null")
    extra = schema.get("additionalProperties")
    if extra is False:
        fields = shape.fields if shape.fields is not None else {}
        for name, sub in (schema.get("properties") or {}).items():
            fields[name] = _compile(sub, resolver, memo)
        shape.fields = fields
    elif isinstance(extra, dict):
        shape.values = _compile(extra, resolver, memo)
    # Anything else (properties without additionalProperties: false, or no properties at
    # all) is free-form: the decoder keeps whatever it holds.
    items = schema.get("items")
    if isinstance(items, dict):
        shape.items = _compile(items, resolver, memo)
        if schema.get("x-kubernetes-list-type") == "map":
            shape.list_keys = tuple(sorted(schema.get("x-kubernetes-list-map-keys") or ()))


# -- strict decoding --------------------------------------------------------------------------


class DecodeTypeError(Exception):
    """A value of the wrong JSON type for its Go field, as encoding/json refuses it.

    ``path``: the field path as keys and indexes; ``value``: the value; ``expected``: the
    schema's JSON types.
    """

    def __init__(self, path: list[str | int], value: Any, expected: frozenset[str]) -> None:
        super().__init__(path, value, expected)
        self.path = path
        self.value = value
        self.expected = expected


def _json_types_of(value: Any) -> tuple[str, ...]:
    if isinstance(value, bool):
        return ("boolean",)
    if isinstance(value, int):
        return ("integer", "number")
    if isinstance(value, float):
        # As the JSON schema check counts it; the Go rules refuse 2.0 for ints later.
        return ("integer", "number") if value.is_integer() else ("number",)
    if isinstance(value, str):
        return ("string",)
    if isinstance(value, list):
        return ("array",)
    return ("object",)


def _check_type(shape: Shape, value: Any, path: list[str | int]) -> None:
    if shape.types and not any(t in shape.types for t in _json_types_of(value)):
        raise DecodeTypeError(path, value, shape.types)


def _zero(shape: Shape) -> Any:
    # encoding/json decodes null into a zero value: a struct's is {} (its fields then
    # validated as absent), a string's "", a number's 0, a bool's false. A nil slice or map
    # is encoded as null again, so those (and values of unknown type) stay null.
    if shape.fields is not None:
        return {}
    if shape.types == {"string"}:
        return ""
    if shape.types and shape.types <= {"integer", "number"}:
        return 0
    if shape.types == {"boolean"}:
        return False
    return None


def drop_unknown(shape: Shape, obj: Any, duplicates: Iterable[str] = ()) -> list[str]:
    """Decode ``obj`` in place as the Go decoder would: remove the fields its shape does not
    know, turn nulls into what Go decodes them to, and check the JSON types; return the
    strict decoding errors in document order (``duplicate field "p"`` for ``duplicates``
    paths the typed decoder visits, ``unknown field "p"``), at most 100 as the Go decoder
    keeps.

    Nulls (encoding/json: null leaves a pointer nil and a value at its zero): a null struct
    field is removed (a nil pointer or omitempty field is not written back); a null map
    value or list item of a struct becomes ``{}``, of a string ``""``, of a number ``0``, of
    a bool ``false``. Type checks come first, so fields that later rules drop (disabled
    gates, managedFields) still fail to decode.

    Raises :class:`DecodeTypeError` for the first value of a wrong JSON type. Duplicates
    inside unknown or free-form fields are not reported: the decoder skips those values
    without looking into them.
    """
    errors: list[str] = []
    _walk(shape, obj, "", [], set(duplicates), errors)
    return errors[:MAX_STRICT_ERRORS]


def _walk(
    shape: Shape,
    node: Any,
    path: str,
    keys: list[str | int],
    duplicates: set[str],
    errors: list[str],
) -> None:
    if isinstance(node, dict):
        if shape.fields is None and shape.values is None:
            return
        unknown: list[str] = []
        nulls: list[str] = []
        for key, child in node.items():
            child_path = _join(path, key)
            if duplicates and child_path in duplicates:
                errors.append(f'duplicate field "{child_path}"')
            if shape.fields is not None:
                sub = shape.fields.get(key)
                if sub is None:
                    unknown.append(key)
                    errors.append(f'unknown field "{child_path}"')
                    continue
                if child is None:
                    nulls.append(key)
                    continue
            else:
                assert shape.values is not None
                sub = shape.values
                if child is None:
                    node[key] = child = _zero(sub)
                    if child is None:
                        continue
            child_keys = [*keys, key]
            _check_type(sub, child, child_keys)
            if isinstance(child, dict | list):
                _walk(sub, child, child_path, child_keys, duplicates, errors)
        for key in unknown:
            del node[key]
        for key in nulls:
            del node[key]
    elif isinstance(node, list) and shape.items is not None:
        item = shape.items
        for index, child in enumerate(node):
            if child is None:
                node[index] = child = _zero(item)
                if child is None:
                    continue
            child_keys = [*keys, index]
            _check_type(item, child, child_keys)
            if isinstance(child, dict | list):
                _walk(item, child, f"{path}[{index}]", child_keys, duplicates, errors)


def apply_unknown(shape: Shape, config: Any) -> list[str]:
    """The typed-conversion errors of an apply configuration: the first undeclared field of
    each map, as ``.spec.devices[name="gpu-0"].foo: field not declared in schema``
    (structured-merge-diff validatingObjectWalker). ``config`` is not changed.
    """
    errors: list[str] = []
    _walk_apply(shape, config, "", errors)
    return errors


def _walk_apply(shape: Shape, node: Any, path: str, errors: list[str]) -> None:
    if isinstance(node, dict):
        if shape.fields is None and shape.values is None:
            return
        for key, child in node.items():
            child_path = f"{path}.{key}"
            sub = shape.values if shape.fields is None else shape.fields.get(key)
            if sub is None:
                errors.append(f"{child_path}: field not declared in schema")
                return
            _walk_apply(sub, child, child_path, errors)
    elif isinstance(node, list) and shape.items is not None:
        for index, child in enumerate(node):
            element = f"[{index}]"
            if shape.list_keys and isinstance(child, dict):
                element = (
                    "["
                    + ",".join(
                        f"{k}={json.dumps(child.get(k))}" for k in shape.list_keys if k in child
                    )
                    + "]"
                )
            _walk_apply(shape.items, child, path + element, errors)


def typed_patch_error(
    kind: str, api_version: str, config: dict[str, Any], errors: Sequence[str]
) -> StatusError:
    """The 500 an apply configuration with undeclared fields gets, in every fieldValidation
    mode (k8s.io/apimachinery pkg/util/managedfields/internal/structuredmerge.go Apply:
    ``failed to create typed patch object (<ns>/<name>; <group>/<version>, Kind=<Kind>)``,
    a plain error the handler turns into an InternalError status without a reason).
    """
    found = config.get("metadata")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    group_version = api_version if "/" in api_version else f"/{api_version}"
    joined = errors[0] if len(errors) == 1 else "errors:\n" + "\n".join(f"  {e}" for e in errors)
    where = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
    return StatusError(
        500,
        "",
        f"failed to create typed patch object ({where}; {group_version}, Kind={kind}): {joined}",
    )


_JSON_PATCH_FIELDS = frozenset({"op", "path", "from", "value"})


def json_patch_errors(document: Any, duplicates: Sequence[str]) -> list[str]:
    """Strict errors of a JSON patch as decoded into a list of operations: fields other than
    op, path, from and value, and repeated keys, each prefixed ``json patch`` (patch.go
    applyJSPatch: ``json patch unknown field "[0].foo"``).
    """
    errors = [f'json patch duplicate field "{d}"' for d in duplicates]
    if isinstance(document, list):
        for index, operation in enumerate(document):
            if isinstance(operation, dict):
                errors.extend(
                    f'json patch unknown field "[{index}].{key}"'
                    for key in operation
                    if key not in _JSON_PATCH_FIELDS
                )
    return errors


def settle(errors: Sequence[str], field_validation: str, warnings: list[str]) -> None:
    """What a create or update does with its strict decoding errors: Strict raises 400
    ``strict decoding error: <e1>, <e2>``, Warn appends each to ``warnings``, Ignore drops
    them (create.go, update.go).
    """
    if not errors or field_validation == IGNORE:
        return
    if field_validation == STRICT:
        raise bad_request("strict decoding error: " + ", ".join(errors))
    warnings.extend(errors)


def settle_patch(
    errors: Sequence[str], field_validation: str, warnings: list[str], shown: str
) -> None:
    """The same for a JSON, merge or strategic merge patch: Strict is 422 Invalid on field
    ``patch`` with ``shown`` (the patched object, or the patch) as the value (patch.go
    jsonPatcher.applyPatchToCurrentObject, applyPatchToObject).
    """
    if not errors or field_validation == IGNORE:
        return
    if field_validation == STRICT:
        raise invalid(
            "",
            "",
            "",
            [
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {json.dumps(shown)}: strict decoding error: "
                    + ", ".join(errors),
                    "patch",
                )
            ],
        )
    warnings.extend(errors)


def settle_apply(duplicates: Sequence[str], field_validation: str, warnings: list[str]) -> None:
    """Duplicate keys of an apply configuration: Strict is 400 ``error strict decoding
    patch: ...`` with go-yaml's message, Warn one warning per line (patch.go applyPatcher,
    rest.go parseYAMLWarnings).
    """
    if not duplicates or field_validation == IGNORE:
        return
    if field_validation == STRICT:
        raise bad_request(
            "error strict decoding patch: error converting YAML to JSON: yaml: "
            "unmarshal errors:\n" + "\n".join(f"  {d}" for d in duplicates)
        )
    warnings.extend(duplicates)


def go_value(value: Any) -> str:
    """``fmt.Sprintf("%+v", v)`` of decoded JSON: ``map[a:1 b:[x y]]``, keys sorted."""
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_value(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_value(v) for v in value) + "]"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return str(value)


__all__ = [
    "DIRECTIVES",
    "IGNORE",
    "STRICT",
    "WARN",
    "DecodeTypeError",
    "Shape",
    "apply_unknown",
    "compile_shape",
    "directive",
    "drop_unknown",
    "go_value",
    "json_patch_errors",
    "load_yaml",
    "parse_json",
    "settle",
    "settle_apply",
    "settle_patch",
    "typed_patch_error",
]
