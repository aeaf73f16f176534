"""PATCH mechanisms: JSON merge patch, JSON patch, strategic merge patch.

All functions are pure: they take plain JSON values and return new ones, raising
:class:`StatusError` the way kube-apiserver reports a bad patch
(k8s.io/apiserver pkg/endpoints/handlers/patch.go).

Strategic merge (k8s.io/apimachinery pkg/util/strategicpatch) needs per-field list strategies
that Go reads from struct tags; :func:`list_strategy` holds the ones this project's objects use.
"""

from __future__ import annotations

from typing import Any

from app.jsontypes import json_copy

from .errors import bad_request, unprocessable_patch

JSON = Any

# How lists merge, by field path (field names only, list elements left out). The served kinds
# never give one path two meanings, so the path alone decides. A list not named here is
# replaced whole by a strategic merge patch and is atomic for server-side apply.
#
# Strategic merge patch follows the Go struct tags ``patchStrategy``/``patchMergeKey`` only
# (k8s.io/apimachinery pkg/util/strategicpatch reads them, never ``+listType``): ObjectMeta
# (k8s.io/apimachinery pkg/apis/meta/v1 types.go), Pod and Node (k8s.io/api core/v1
# types.go), ResourceClaimStatus.reservedFor and PodSchedulingContextStatus.resourceClaims
# (k8s.io/api resource/<version> types.go). ResourceClaimStatus.devices and its conditions are
# ``+listType=map`` without patch tags, so a strategic merge patch replaces them.
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
_SMP: dict[tuple[str, ...], str | tuple[str, ...]] = {
    ("metadata", "finalizers"): "set",
    ("metadata", "ownerReferences"): ("uid",),
    ("spec", "volumes"): ("name",),
    ("spec", "imagePullSecrets"): ("name",),
    ("spec", "hostAliases"): ("ip",),
    ("spec", "topologySpreadConstraints"): ("topologyKey",),
    ("spec", "resourceClaims"): ("name",),
    ("spec", "schedulingGates"): ("name",),
    ("spec", "podCIDRs"): "set",
    ("status", "conditions"): ("type",),
    ("status", "podIPs"): ("ip",),
    ("status", "hostIPs"): ("ip",),
    ("status", "resourceClaimStatuses"): ("name",),
    ("status", "addresses"): ("type",),
    ("status", "reservedFor"): ("uid",),
    ("status", "resourceClaims"): ("name",),
}
# Server-side apply follows the OpenAPI ``x-kubernetes-list-type``/``-list-map-keys`` (the
# ``+listType``/``+listMapKey`` markers of the same types.go files), read by
# sigs.k8s.io/structured-merge-diff.
_SSA: dict[tuple[str, ...], str | tuple[str, ...]] = {
    ("metadata", "finalizers"): "set",
    ("metadata", "ownerReferences"): ("uid",),
    ("spec", "volumes"): ("name",),
    ("spec", "imagePullSecrets"): ("name",),
    ("spec", "hostAliases"): ("ip",),
    ("spec", "topologySpreadConstraints"): ("topologyKey", "whenUnsatisfiable"),
    ("spec", "resourceClaims"): ("name",),
    ("spec", "schedulingGates"): ("name",),
    ("spec", "podCIDRs"): "set",
    ("status", "conditions"): ("type",),
    ("status", "podIPs"): ("ip",),
    ("status", "resourceClaimStatuses"): ("name",),
    ("status", "addresses"): ("type",),
    ("status", "reservedFor"): ("uid",),
    ("status", "devices"): ("driver", "device", "pool", "shareID"),
    ("status", "devices", "conditions"): ("type",),
    ("status", "resourceClaims"): ("name",),
}
for _name in _CONTAINER_LISTS:
    for _table in (_SMP, _SSA):
        _table[("spec", _name)] = ("name",)
        _table[("spec", _name, "env")] = ("name",)
        _table[("spec", _name, "volumeMounts")] = ("mountPath",)
        _table[("spec", _name, "volumeDevices")] = ("devicePath",)
    _SMP[("spec", _name, "ports")] = ("containerPort",)
    _SSA[("spec", _name, "ports")] = ("containerPort", "protocol")


def list_strategy(path: tuple[str, ...]) -> str | tuple[str, ...]:
    """How a strategic merge patch treats the list at ``path`` (field names, list indices
    left out): "set" (primitives merged as a set), "replace", or the merge-key fields.

    E.g. ``metadata.finalizers`` is a set, ``status.reservedFor`` merges by uid, pod
    containers by name, and a claim's ``status.devices`` is replaced.
    """
    return _SMP.get(path, "replace")


def list_type(path: tuple[str, ...]) -> str | tuple[str, ...]:
    """The server-side apply list type at ``path``: "set", "atomic", or the list-map keys
    (``status.devices`` of a claim: driver, device, pool, shareID).
    """
    return _SSA.get(path, "atomic")


def merge_patch(target: JSON, patch: JSON) -> JSON:
    """RFC 7386 JSON merge patch: objects merge, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return json_copy(patch)
    out = json_copy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: JSON, tokens: list[str], path: str) -> JSON:
    current = doc
    for tok in tokens:
        if isinstance(current, dict) and tok in current:
            current = current[tok]
        elif isinstance(current, list) and tok.isdigit() and int(tok) < len(current):
            current = current[int(tok)]
        else:
            raise unprocessable_patch(f"doc is missing path: {path!r}: missing value")
    return current


def _container(doc: JSON, tokens: list[str], path: str) -> tuple[JSON, str]:
    if not tokens:
        raise unprocessable_patch(f"cannot operate on the document root: {path!r}")
    return _resolve(doc, tokens[:-1], path), tokens[-1]


def _add(doc: JSON, path: str, value: JSON) -> JSON:
    tokens = _pointer(path)
    if not tokens:
        return json_copy(value)
    parent, last = _container(doc, tokens, path)
    if isinstance(parent, dict):
        parent[last] = json_copy(value)
    elif isinstance(parent, list):
        if last == "-":
            parent.append(json_copy(value))
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), json_copy(value))
        else:
            raise unprocessable_patch(f"add operation does not apply: index out of range: {path}")
    else:
        raise unprocessable_patch(f"add operation does not apply: doc is missing path: {path}")
    return doc


def _remove(doc: JSON, path: str) -> tuple[JSON, JSON]:
    tokens = _pointer(path)
    parent, last = _container(doc, tokens, path)
    if isinstance(parent, dict) and last in parent:
        return doc, parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return doc, parent.pop(int(last))
    raise unprocessable_patch(
        f"remove operation does not apply: doc is missing path: {path!r}: missing value"
    )


def json_patch(target: JSON, operations: JSON) -> JSON:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test) on a copy of ``target``.

    Raises StatusError 400 for a malformed patch document and 422 when an operation does not
    apply, including a failed ``test`` (k8s.io/apiserver handlers/patch.go applyJSPatch).
    """
    if not isinstance(operations, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = json_copy(target)
    for op in operations:
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise bad_request(f"invalid JSON patch operation: {op!r}")
        kind = op["op"]
        path = op.get("path")
        if not isinstance(path, str):
            raise bad_request(f"JSON patch operation {kind!r} has no path")
        if kind == "add":
            doc = _add(doc, path, op.get("value"))
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            _resolve(doc, _pointer(path), path)
            doc, _ = _remove(doc, path) if _pointer(path) else (doc, None)
            doc = _add(doc, path, op.get("value"))
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise bad_request(f"JSON patch operation {kind!r} has no from")
            if kind == "move":
                doc, value = _remove(doc, source)
            else:
                value = json_copy(_resolve(doc, _pointer(source), source))
            doc = _add(doc, path, value)
        elif kind == "test":
            actual = _resolve(doc, _pointer(path), path)
            if actual != op.get("value"):
                raise unprocessable_patch(f"testing value {path} failed: test failed")
        else:
            raise bad_request(f"Unexpected kind: {kind}")
    return doc


def _key_of(item: JSON, keys: tuple[str, ...]) -> tuple[JSON, ...] | None:
    if not isinstance(item, dict) or not all(k in item for k in keys):
        return None
    return tuple(item[k] for k in keys)


def _merge_keyed_list(
    original: list[JSON], patch: list[JSON], keys: tuple[str, ...], path: tuple[str, ...]
) -> list[JSON]:
    out = json_copy(original)
    for item in patch:
        if isinstance(item, dict) and item.get("$patch") == "replace":
            return [
                json_copy({k: v for k, v in i.items() if k != "$patch"})
                for i in patch
                if not (isinstance(i, dict) and i.get("$patch"))
            ]
        key = _key_of(item, keys)
        if key is None:
            raise bad_request(
                f"map: {item!r} does not contain declared merge key: {','.join(keys)}"
            )
        index = next((i for i, cur in enumerate(out) if _key_of(cur, keys) == key), None)
        if isinstance(item, dict) and item.get("$patch") == "delete":
            if index is not None:
                out.pop(index)
            continue
        if index is None:
            out.append(strategic_merge({}, item, path))
        else:
            out[index] = strategic_merge(out[index], item, path)
    return out


def strategic_merge(original: JSON, patch: JSON, path: tuple[str, ...] = ()) -> JSON:
    """Strategic merge patch of ``patch`` into ``original`` (both JSON values).

    Maps merge key by key, ``null`` deletes, ``$patch: delete|replace`` on maps and keyed list
    elements, ``$deleteFromPrimitiveList/<field>`` removes values from a set list, and
    ``$setElementOrder``/``$retainKeys`` directives are accepted and ignored. Lists follow
    :func:`list_strategy`. Raises StatusError 400 on a malformed directive.
    """
    if not isinstance(patch, dict):
        return json_copy(patch)
    if patch.get("$patch") == "delete":
        return None
    if patch.get("$patch") == "replace":
        return {k: json_copy(v) for k, v in patch.items() if k != "$patch"}
    out = json_copy(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if not isinstance(value, list):
                raise bad_request(f"{key}: expected a list")
            primitives = out.get(name)
            if isinstance(primitives, list):
                out[name] = [v for v in primitives if v not in value]
            continue
        if key.startswith("$"):
            raise bad_request(f"unknown patch directive {key!r}")
        child = (*path, key)
        if value is None:
            out.pop(key, None)
        elif isinstance(value, list):
            strategy = list_strategy(child)
            existing = out.get(key)
            current: list[JSON] = existing if isinstance(existing, list) else []
            if strategy == "set":
                merged = list(current)
                merged.extend(v for v in value if v not in merged)
                out[key] = merged
            elif isinstance(strategy, tuple):
                out[key] = _merge_keyed_list(current, value, strategy, child)
            else:
                out[key] = json_copy(value)
        elif isinstance(value, dict):
            merged_child = strategic_merge(out.get(key), value, child)
            if merged_child is None:
                out.pop(key, None)
            else:
                out[key] = merged_child
        else:
            out[key] = value
    return out
