"""Validation of every write: the official JSON schema plus object metadata rules.

Schemas come from the ``kubernetes-validate`` package (strict variants: unknown fields are
errors), loaded on first use and cached per process. Each emulated cluster checks writes
against its own release's schemas (the cluster profile's ``schema_version``, see
:mod:`.cluster`); without one, resource.k8s.io v1alpha3 is checked against Kubernetes 1.31
(the last release that served the classic-DRA shape) and everything else against the newest
release the package ships.
Metadata rules port k8s.io/apimachinery pkg/api/validation ValidateObjectMeta.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import referencing
import referencing.jsonschema

from . import names
from .errors import Cause, StatusError, bad_request, invalid
from .fieldvalidation import DecodeTypeError, Shape, apply_unknown, compile_shape, drop_unknown
from .resources import ResourceType

_ALPHA_SCHEMA_VERSION = "1.31"


@cache
def _schema_root() -> Any:
    return resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")


@cache
def newest_schema_version() -> str:
    """The newest Kubernetes minor version ``kubernetes-validate`` ships, e.g. "1.37"."""
    found = []
    for entry in _schema_root().iterdir():
        m = re.match(r"^v(\d+)\.(\d+)\.\d+-local-strict$", entry.name)
        if m:
            found.append((int(m.group(1)), int(m.group(2))))
    major, minor = max(found)
    return f"{major}.{minor}"


def _schema_file(kind: str, api_version: str) -> str:
    group, _, version = api_version.rpartition("/")
    prefix = f"{group.split('.')[0]}-{version}" if group else version
    return f"{kind.lower()}-{prefix}.json"


@cache
def _registry(k8s_version: str) -> referencing.Registry[Any]:
    # Process-wide and filled on first use: the definitions file is large (about 2 MB) and
    # identical for every emulator instance.
    folder = _schema_root().joinpath(f"v{k8s_version}.0-local-strict")
    defs = json.loads(folder.joinpath("_definitions.json").read_text())
    resource = referencing.Resource.from_contents(
        defs, default_specification=referencing.jsonschema.DRAFT202012
    )
    return resource @ referencing.Registry()


@cache
def schema_validator(kind: str, api_version: str, k8s_version: str | None = None) -> Any:
    """The cached JSON-schema validator for ``kind`` in ``api_version`` as Kubernetes
    ``k8s_version`` ("1.34") publishes it; without one, v1alpha3 is checked as 1.31 and
    everything else as the newest release the package ships.

    Raises FileNotFoundError when ``kubernetes-validate`` has no schema for it.
    """
    if k8s_version is None:
        k8s_version = (
            _ALPHA_SCHEMA_VERSION if api_version.endswith("/v1alpha3") else newest_schema_version()
        )
    folder = _schema_root().joinpath(f"v{k8s_version}.0-local-strict")
    schema = json.loads(folder.joinpath(_schema_file(kind, api_version)).read_text())
    return jsonschema.Draft202012Validator(schema, registry=_registry(k8s_version))


class SchemaValidator:
    """Validates objects against the official JSON schemas (validators cached per process).

    ``k8s_version``: the release whose schemas apply ("1.34", the cluster profile's
    ``schema_version``); None picks per group version as :func:`schema_validator` does.
    """

    def __init__(self, k8s_version: str | None = None) -> None:
        self.k8s_version = k8s_version
        # id(validator) -> (validator, its Shape); validators are cached for the process, the
        # tuple keeps the id from being reused.
        self._shapes: dict[int, tuple[Any, Shape]] = {}

    def shape(self, rt: ResourceType) -> Shape:
        """The known fields of ``rt`` in the schema :meth:`check` uses (a free-form Shape when
        ``kubernetes-validate`` has no schema for it)."""
        try:
            validator = schema_validator(rt.kind, rt.api_version, self.k8s_version)
        except FileNotFoundError:
            return Shape()
        found = self._shapes.get(id(validator))
        if found is None:
            found = self._shapes[id(validator)] = (validator, compile_shape(validator))
        return found[1]

    def drop_unknown(
        self, rt: ResourceType, obj: dict[str, Any], duplicates: Sequence[str] = ()
    ) -> list[str]:
        """Remove the fields of ``obj`` the Go type of ``rt`` does not have, in place, and
        return the strict decoding errors (``unknown field "spec.foo"``, ``duplicate field
        "..."`` for ``duplicates`` paths), as fieldvalidation.drop_unknown does; nulls become
        Go's zero values there. Raises StatusError 400 for a value of the wrong JSON type, in
        the words of :meth:`check` (k8s.io/apiserver handlers/rest.go transformDecodeError).
        """
        try:
            return drop_unknown(self.shape(rt), obj, duplicates)
        except DecodeTypeError as err:
            raise bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                f"json: cannot unmarshal {_json_type(err.value)} into Go struct field "
                f"{rt.kind}.{_dotted(err.path)} of type {_schema_type(sorted(err.expected))}"
            ) from err

    def apply_unknown(self, rt: ResourceType, config: dict[str, Any]) -> list[str]:
        """Undeclared fields of an apply configuration, in structured-merge-diff's words
        (fieldvalidation.apply_unknown); ``config`` is not changed."""
        return apply_unknown(self.shape(rt), config)

    def check(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Raise StatusError for the first class of schema errors found in ``obj``.

        A wrong JSON type is 400 BadRequest in every fieldValidation mode, as the Go decoder
        refuses it (``<Kind> in version "<v>" cannot be handled as a <Kind>: json: cannot
        unmarshal ...``, k8s.io/apiserver pkg/endpoints/handlers/rest.go
        transformDecodeError); unknown fields still present (callers that did not run
        :meth:`drop_unknown`) 400 ``strict decoding error``; missing required fields 422
        Required; enum violations 422 NotSupported; other constraints 422 Invalid.
        """
        validator = schema_validator(rt.kind, rt.api_version, self.k8s_version)
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
        if not errors:
            return
        unknown: list[str] = []
        causes: list[Cause] = []
        for error in errors:
            for leaf in _leaves(error):
                path = _field_path(leaf.absolute_path)
                if leaf.validator == "additionalProperties":
                    extra = (
                        [k for k in leaf.instance if k not in leaf.schema.get("properties", {})]
                        if isinstance(leaf.instance, dict)
                        else []
                    )
                    unknown.extend(f"{path + '.' if path else ''}{k}" for k in extra)
                elif leaf.validator == "type":
                    # The Go decoder stops at the first value of the wrong type.
                    raise bad_request(
                        f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                        f"{rt.kind}: json: cannot unmarshal {_json_type(leaf.instance)} into Go "
                        f"struct field {rt.kind}.{_dotted(leaf.absolute_path)} of type "
                        f"{_schema_type(leaf.validator_value)}"
                    )
                elif leaf.validator == "required":
                    missing = leaf.message.split("'")[1] if "'" in leaf.message else ""
                    causes.append(
                        Cause(
                            "FieldValueRequired",
                            "Required value",
                            f"{path + '.' if path else ''}{missing}",
                        )
                    )
                elif leaf.validator == "enum":
                    allowed = ", ".join(f'"{v}"' for v in leaf.validator_value if v)
                    causes.append(
                        Cause(
                            "FieldValueNotSupported",
                            f"Unsupported value: {json.dumps(leaf.instance)}: "
                            f"supported values: {allowed}",
                            path,
                        )
                    )
                else:
                    causes.append(
                        Cause(
                            "FieldValueInvalid",
                            f"Invalid value: {json.dumps(leaf.instance)[:80]}: "
                            f"{leaf.message[:200]}",
                            path,
                        )
                    )
        if unknown:
            raise bad_request(
                "strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown)
            )
        raise invalid(rt.kind, rt.group, obj.get("metadata", {}).get("name", ""), causes)


def _json_type(value: Any) -> str:
    # encoding/json UnmarshalTypeError.Value: the JSON kind, numbers with their text.
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {json.dumps(value)}"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _dotted(path: Any) -> str:
    # UnmarshalTypeError.Field: the JSON field names from the root, list indexes left out.
    return ".".join(str(p) for p in path if not isinstance(p, int))


def _schema_type(expected: Any) -> str:
    names = [t for t in ([expected] if isinstance(expected, str) else expected) if t != "null"]
    go = {
        "string": "string",
        "boolean": "bool",
        "integer": "int64",
        "number": "float64",
        "object": "struct",
        "array": "slice",
    }
    return go.get(names[0], names[0]) if names else "interface {}"


def _leaves(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    # oneOf/anyOf failures (nullable quantities) hide the real cause in their context: keep the
    # deepest errors so that the reported field is the innermost one.
    if error.context:
        deepest = max(len(e.absolute_path) for e in error.context)
        if deepest > len(error.absolute_path):
            return [e for e in error.context if len(e.absolute_path) == deepest][:1]
    return [error]


def _field_path(path: Any) -> str:
    out = ""
    for element in path:
        if isinstance(element, int):
            out += f"[{element}]"
        else:
            out += ("." if out else "") + str(element)
    return out


def metadata_causes(rt: ResourceType, obj: dict[str, Any]) -> list[Cause]:
    """ObjectMeta rules: name format per resource, labels, annotations (<= 256 KiB total),
    finalizers (qualified names, no duplicates).

    Source: k8s.io/apimachinery pkg/api/validation ValidateObjectMeta; Namespace names are DNS
    labels (ValidateNamespaceName), Event names path segments, all others DNS subdomains.
    """
    meta = obj.get("metadata") or {}
    causes: list[Cause] = []
    name = meta.get("name") or ""
    if not name:
        causes.append(
            Cause(
                "FieldValueRequired",
                "Required value: name or generateName is required",
                "metadata.name",
            )
        )
    else:
        if rt.plural == "namespaces":
            errs = names.dns_label(name)
        elif rt.plural == "events":
            errs = names.path_segment_name(name)
        else:
            errs = names.dns_subdomain(name)
        causes.extend(
            Cause("FieldValueInvalid", f'Invalid value: "{name}": {e}', "metadata.name")
            for e in errs
        )
    for key, value in (meta.get("labels") or {}).items():
        for e in names.qualified_name(key):
            causes.append(
                Cause("FieldValueInvalid", f'Invalid value: "{key}": {e}', "metadata.labels")
            )
        for e in names.label_value(str(value)):
            causes.append(
                Cause(
                    "FieldValueInvalid", f'Invalid value: "{value}": {e}', f"metadata.labels[{key}]"
                )
            )
    annotations = meta.get("annotations") or {}
    for key in annotations:
        for e in names.qualified_name(key.lower()):
            causes.append(
                Cause("FieldValueInvalid", f'Invalid value: "{key}": {e}', "metadata.annotations")
            )
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > 256 * 1024:
        causes.append(
            Cause(
                "FieldValueTooLong",
                "Too long: must have at most 262144 bytes",
                "metadata.annotations",
            )
        )
    seen: set[str] = set()
    for i, item in enumerate(meta.get("finalizers") or []):
        finalizer = item if isinstance(item, str) else ""  # JSON null decodes as ""
        for e in names.qualified_name(finalizer):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{finalizer}": {e}',
                    f"metadata.finalizers[{i}]",
                )
            )
        if finalizer in seen:
            causes.append(
                Cause(
                    "FieldValueDuplicate",
                    f'Duplicate value: "{finalizer}"',
                    f"metadata.finalizers[{i}]",
                )
            )
        seen.add(finalizer)
    return causes


def raise_if(rt: ResourceType, obj: dict[str, Any], causes: list[Cause]) -> None:
    """Raise a 422 Invalid StatusError for ``causes`` when there are any."""
    if causes:
        raise invalid(rt.kind, rt.group, (obj.get("metadata") or {}).get("name", ""), causes)


__all__ = ["SchemaValidator", "StatusError", "metadata_causes", "newest_schema_version", "raise_if"]
