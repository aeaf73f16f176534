"""Server-side apply: field ownership per manager, recorded in ``metadata.managedFields``.

A simplified structured-merge-diff (sigs.k8s.io/structured-merge-diff, used by
k8s.io/apiserver pkg/endpoints/handlers/fieldmanager): an applied configuration is merged into
the live object; the manager owns exactly the leaf fields it sent; fields it owned before and
no longer sends are removed unless another manager owns them. Every write records ownership:
an update (PUT or a non-apply PATCH) gives its manager an ``Update`` entry for the fields it
changed. An apply that changes a field another manager owns, through Apply or Update, is a
409 Conflict unless ``force``, which moves those fields to the applier
(sigs.k8s.io/structured-merge-diff merge/update.go Updater.Apply and Updater.Update). Lists
follow the OpenAPI list types of :func:`.patch.list_type`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.jsontypes import json_copy

from .errors import StatusError
from .patch import list_type

FieldPath = tuple[str, ...]

# Identity fields that belong to nobody (the real field manager strips them too).
_UNOWNED: set[FieldPath] = {
    ("f:apiVersion",),
    ("f:kind",),
    ("f:metadata", "f:name"),
    ("f:metadata", "f:namespace"),
    ("f:metadata", "f:resourceVersion"),
    ("f:metadata", "f:uid"),
    ("f:metadata", "f:generateName"),
    ("f:metadata", "f:managedFields"),
    ("f:metadata", "f:creationTimestamp"),
    ("f:metadata", "f:generation"),
}


@functools.lru_cache(maxsize=8192)
def _plain(path: FieldPath) -> tuple[str, ...]:
    # Remembered: objects of one kind repeat the same paths on every write.
    return tuple(p[2:] for p in path if p.startswith("f:"))


def field_set(obj: Any, prefix: FieldPath = ()) -> set[FieldPath]:
    """Leaf field paths of ``obj`` in fieldsV1 element notation (``f:``, ``k:``, ``v:``)."""
    out: set[FieldPath] = set()
    if not isinstance(obj, dict):
        return {prefix} if prefix else out
    for key, value in obj.items():
        path = (*prefix, f"f:{key}")
        if path in _UNOWNED:
            continue
        if isinstance(value, dict) and value:
            out |= field_set(value, path)
        elif isinstance(value, list):
            strategy = list_type(_plain(path))
            if strategy == "set":
                out |= {(*path, "v:" + _value_json(v)) for v in value}
            elif isinstance(strategy, tuple):
                for item in value:
                    key_json = _key_json(item, strategy)
                    if key_json:
                        out |= field_set(item, (*path, "k:" + key_json))
                    else:
                        out.add(path)
            else:
                out.add(path)
        else:
            out.add(path)
    return out


_MISSING: Any = object()


def fields_changed(
    old: dict[str, Any], new: dict[str, Any]
) -> tuple[set[FieldPath], set[FieldPath]]:
    """``(field_set(new), changed)``: the leaf paths of ``new``, and those among them that are
    not leaves of ``old`` or whose value differs there (as :func:`_get` finds it).

    One walk of both objects together, instead of both field sets and a look-up per path (an
    update's cost, which the emulator pays on every write). Keyed list items whose key is
    repeated, or whose first match in ``old`` has other key fields, take the definition's
    slow way.
    """
    walk = _ChangeWalk(old, new)
    walk.dict(old, new, ())
    return walk.fields, walk.changed


class _ChangeWalk:
    def __init__(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self.old = old
        self.new = new
        self.fields: set[FieldPath] = set()
        self.changed: set[FieldPath] = set()
        self._old_fields: set[FieldPath] | None = None

    def all_new(self, value: Any, path: FieldPath) -> None:
        below = field_set(value, path)
        self.fields |= below
        self.changed |= below

    def leaf(self, was: Any, value: Any, path: FieldPath) -> None:
        self.fields.add(path)
        if was is _MISSING or was != value:
            self.changed.add(path)

    def by_definition(self, item: Any, path: FieldPath) -> None:
        if self._old_fields is None:
            self._old_fields = field_set(self.old)
        below = field_set(item, path)
        self.fields |= below
        self.changed |= {
            p for p in below if p not in self._old_fields or _get(self.old, p) != _get(self.new, p)
        }

    def dict(self, before: Any, after: dict[str, Any], prefix: FieldPath) -> None:
        old = before if isinstance(before, dict) else None
        for key, value in after.items():
            path = (*prefix, f"f:{key}")
            if path in _UNOWNED:
                continue
            was = _MISSING if old is None else old.get(key, _MISSING)
            if isinstance(value, dict) and value:
                if isinstance(was, dict) and was:
                    self.dict(was, value, path)
                else:
                    self.all_new(value, path)
            elif isinstance(value, list):
                strategy = list_type(_plain(path))
                if strategy == "set":
                    old_set = {_value_json(v) for v in was} if isinstance(was, list) else set()
                    for v in value:
                        text = _value_json(v)
                        self.fields.add((*path, "v:" + text))
                        if text not in old_set:
                            self.changed.add((*path, "v:" + text))
                elif isinstance(strategy, tuple):
                    self.keyed(was if isinstance(was, list) else None, value, path, strategy)
                else:
                    self.leaf(was, value, path)
            else:
                self.leaf(was, value, path)

    def keyed(
        self, old: list[Any] | None, new: list[Any], path: FieldPath, strategy: tuple[str, ...]
    ) -> None:
        old_keys: dict[str, int] = {}
        for i in old or ():
            text = _key_json(i, strategy)
            if text:
                old_keys[text] = old_keys.get(text, 0) + 1
        for item in new:
            text = _key_json(item, strategy)
            if not text:
                # An item without its key fields makes the list path itself a leaf.
                self.leaf(_MISSING if old is None else old, new, path)
                continue
            item_path = (*path, "k:" + text)
            key = {k: item[k] for k in strategy if k in item}
            if _first(new, key) is not item:
                self.by_definition(item, item_path)
                continue
            match = _first(old, key) if old is not None else None
            if match is None:
                self.all_new(item, item_path)
            elif old_keys.get(text) == 1 and _key_json(match, strategy) == text:
                self.dict(match, item, item_path)
            else:
                self.by_definition(item, item_path)


def _key_json(item: Any, strategy: tuple[str, ...]) -> str:
    """The ``k:`` element's JSON of a keyed list's item, or "" for an item without key fields
    (optional key fields, such as a device status' shareID, are left out)."""
    if not isinstance(item, dict):
        return ""
    # Keyed by each value's type too: 1, 1.0 and True are equal keys of a dict but three
    # different JSON texts.
    typed = tuple((k, type(item[k]), item[k]) for k in strategy if k in item)
    if not typed:
        return ""
    try:
        return _typed_key_json(typed)
    except TypeError:  # a key field holding a list or an object: nothing to remember it by
        return _key_text({k: value for k, _, value in typed})


def _key_text(key: dict[str, Any]) -> str:
    return json.dumps(key, separators=(",", ":"), sort_keys=True)


@functools.lru_cache(maxsize=65536)
def _typed_key_json(typed: tuple[tuple[str, type, Any], ...]) -> str:
    # Remembered: every write of an object walks its keyed lists again, item by item.
    return _key_text({k: value for k, _, value in typed})


def _value_json(value: Any) -> str:
    """``json.dumps(value)``: the ``v:`` element of a set list's item."""
    try:
        return _typed_value_json((type(value), value))
    except TypeError:  # a list or an object: nothing to remember it by
        return json.dumps(value)


@functools.lru_cache(maxsize=65536)
def _typed_value_json(typed: tuple[type, Any]) -> str:
    return json.dumps(typed[1])


def _first(items: list[Any], key: dict[str, Any]) -> Any:
    """The first dict of ``items`` whose ``key`` fields equal ``key``'s (as :func:`_get`
    looks an item up), or None."""
    for i in items:
        if isinstance(i, dict) and all(i.get(k) == v for k, v in key.items()):
            return i
    return None


def to_fields_v1(paths: Iterable[FieldPath]) -> dict[str, Any]:
    """Nest leaf paths into the ``fieldsV1`` JSON shape (``{"f:spec": {"f:x": {}}}``)."""
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for element in path:
            node = node.setdefault(element, {})
    return root


def from_fields_v1(fields: dict[str, Any], prefix: FieldPath = ()) -> set[FieldPath]:
    """Flatten a ``fieldsV1`` document back into leaf paths (the ``.`` marker is skipped)."""
    out: set[FieldPath] = set()
    for key, value in fields.items():
        if key == ".":
            continue
        path = (*prefix, key)
        if isinstance(value, dict) and any(k != "." for k in value):
            out |= from_fields_v1(value, path)
        else:
            out.add(path)
    return out


def _get(obj: Any, path: FieldPath) -> tuple[bool, Any]:
    current = obj
    for element in path:
        kind, _, rest = element.partition(":")
        if kind == "f" and isinstance(current, dict) and rest in current:
            current = current[rest]
        elif kind == "k" and isinstance(current, list):
            key = json.loads(rest)
            match = [
                i
                for i in current
                if isinstance(i, dict) and all(i.get(k) == v for k, v in key.items())
            ]
            if not match:
                return False, None
            current = match[0]
        elif kind == "v" and isinstance(current, list):
            value = json.loads(rest)
            return (value in current), value
        else:
            return False, None
    return True, current


def _remove(obj: Any, path: FieldPath) -> None:
    parent_found, parent = _get(obj, path[:-1])
    if not parent_found:
        return
    kind, _, rest = path[-1].partition(":")
    if kind == "f" and isinstance(parent, dict):
        parent.pop(rest, None)
    elif kind == "v" and isinstance(parent, list):
        value = json.loads(rest)
        if value in parent:
            parent.remove(value)
    elif kind == "k" and isinstance(parent, list):
        key = json.loads(rest)
        parent[:] = [
            i
            for i in parent
            if not (isinstance(i, dict) and all(i.get(k) == v for k, v in key.items()))
        ]


def _merge(live: Any, config: Any, path: tuple[str, ...]) -> Any:
    if not isinstance(config, dict) or not isinstance(live, dict):
        return json_copy(config)
    out = json_copy(live)
    for key, value in config.items():
        child = (*path, key)
        if isinstance(value, dict):
            out[key] = _merge(out.get(key), value, child)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            strategy = list_type(child)
            if strategy == "set":
                out[key] = [*out[key], *[v for v in value if v not in out[key]]]
            elif isinstance(strategy, tuple):
                merged = list(out[key])
                for item in value:
                    index = next(
                        (
                            i
                            for i, cur in enumerate(merged)
                            if isinstance(cur, dict)
                            and isinstance(item, dict)
                            and all(cur.get(k) == item.get(k) for k in strategy)
                        ),
                        None,
                    )
                    # (a missing optional key field matches only a missing one)
                    if index is None:
                        merged.append(json_copy(item))
                    else:
                        merged[index] = _merge(merged[index], item, child)
                out[key] = merged
            else:
                out[key] = json_copy(value)
        else:
            out[key] = json_copy(value)
    return out


@dataclass(frozen=True)
class ManagerFields:
    """One ``managedFields`` entry reduced to what ownership needs."""

    manager: str
    operation: str
    subresource: str
    fields: frozenset[FieldPath]
    api_version: str = ""

    def describe(self) -> str:
        """The manager as conflict messages name it: ``"name"``, ``"name" with subresource
        "status"``, plus ``using <apiVersion>`` for an Update entry
        (k8s.io/apimachinery pkg/util/managedfields/internal/conflict.go printManager).
        """
        text = json.dumps(self.manager)
        if self.subresource:
            text += f" with subresource {json.dumps(self.subresource)}"
        if self.operation == "Update":
            text += f" using {self.api_version}"
        return text

    def identifier(self) -> str:
        """The manager's key (BuildManagerIdentifier: the entry as JSON without time and
        fields; apiVersion only for Update), which orders managers in conflict messages.
        """
        entry: dict[str, str] = {"manager": self.manager, "operation": self.operation}
        if self.operation == "Update":
            entry["apiVersion"] = self.api_version
        if self.subresource:
            entry["subresource"] = self.subresource
        return json.dumps(entry, separators=(",", ":"))


def read_managed_fields(obj: dict[str, Any]) -> list[ManagerFields]:
    """The managers recorded on ``obj`` (entries without fieldsV1 own nothing)."""
    out: list[ManagerFields] = []
    for entry in obj.get("metadata", {}).get("managedFields") or []:
        out.append(
            ManagerFields(
                entry.get("manager", ""),
                entry.get("operation", "Update"),
                entry.get("subresource", ""),
                frozenset(from_fields_v1(entry.get("fieldsV1") or {})),
                entry.get("apiVersion", ""),
            )
        )
    return out


def server_side_apply(
    live: dict[str, Any],
    config: dict[str, Any],
    manager: str,
    *,
    force: bool,
    subresource: str = "",
) -> tuple[dict[str, Any], list[ManagerFields]]:
    """Apply ``config`` (the manager's full intent) to ``live`` and return the new object and the
    new manager list (caller writes it to managedFields with timestamps).

    A field the apply changes (or adds) that another manager owns is a conflict, whether that
    manager applied or updated; the applier's own Update entry counts as another manager.
    Without ``force`` that raises StatusError 409 Conflict with kube-apiserver's message
    (``Apply failed with 1 conflict: conflict with "m" using v1: .spec.x``) and one
    FieldManagerConflict cause per field; with ``force`` the applier takes the conflicting
    fields from their owners (sigs.k8s.io/structured-merge-diff merge/update.go;
    k8s.io/apimachinery pkg/util/managedfields/internal/conflict.go NewConflictError).
    """
    managers = read_managed_fields(live)
    wanted = field_set(config)
    if subresource == "status":
        wanted = {p for p in wanted if p[:1] == ("f:status",)}
    else:
        wanted = {p for p in wanted if p[:1] != ("f:status",)}
    conflicts: dict[int, set[FieldPath]] = {}
    for index, other in enumerate(managers):
        if _is_applier(other, manager, subresource):
            continue
        for path in wanted & other.fields:
            found, current = _get(live, path)
            _, desired = _get(config, path)
            if not found or current != desired:
                conflicts.setdefault(index, set()).add(path)
    if conflicts and not force:
        raise _conflict_error([(managers[i], paths) for i, paths in conflicts.items()])
    previous = next(
        (m.fields for m in managers if _is_applier(m, manager, subresource)), frozenset()
    )
    merged = _merge(live, config, ())
    others: set[FieldPath] = set()
    new_managers: list[ManagerFields] = []
    for index, other in enumerate(managers):
        if _is_applier(other, manager, subresource):
            continue
        # With force the applier takes the conflicting fields over; fields both set to the
        # same value stay shared.
        kept = frozenset(other.fields - conflicts.get(index, set()))
        others |= kept
        if kept:
            new_managers.append(
                ManagerFields(
                    other.manager, other.operation, other.subresource, kept, other.api_version
                )
            )
    for path in sorted(previous - wanted - others, key=len, reverse=True):
        _remove(merged, path)
        # A map or list emptied by the removal goes too, so that dropping the last label
        # leaves no ``labels: {}`` behind.
        for depth in range(len(path) - 1, 1, -1):
            found, container = _get(merged, path[:depth])
            if found and container in ({}, []):
                _remove(merged, path[:depth])
    new_managers.append(ManagerFields(manager, "Apply", subresource, frozenset(wanted)))
    return merged, new_managers


def _is_applier(entry: ManagerFields, manager: str, subresource: str) -> bool:
    return (entry.manager, entry.operation, entry.subresource) == (manager, "Apply", subresource)


def path_string(path: FieldPath) -> str:
    """A field path as structured-merge-diff prints it (fieldpath.Path.String):
    ``.spec.x``, ``.status.conditions[type="Ready"].status``, ``.metadata.finalizers[="a"]``.
    """
    out: list[str] = []
    for element in path:
        kind, _, rest = element.partition(":")
        if kind == "f":
            out.append("." + rest)
        elif kind == "k":
            key = json.loads(rest)
            out.append("[" + ",".join(f"{k}={json.dumps(key[k])}" for k in sorted(key)) + "]")
        elif kind == "v":
            out.append(f"[={json.dumps(json.loads(rest))}]")
    return "".join(out)


def _conflict_error(found: list[tuple[ManagerFields, set[FieldPath]]]) -> StatusError:
    ordered = sorted(found, key=lambda item: item[0].identifier())
    pairs = [
        (entry, path_string(path))
        for entry, paths in ordered
        for path in sorted(paths, key=path_string)
    ]
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f"conflict with {e.describe()}",
            "field": text,
        }
        for e, text in pairs
    ]
    if len(pairs) == 1:
        entry, text = pairs[0]
        message = f"Apply failed with 1 conflict: conflict with {entry.describe()}: {text}"
    else:
        lines: list[str] = []
        for entry, paths in ordered:
            lines.append(f"conflicts with {entry.describe()}:")
            lines += [f"- {path_string(path)}" for path in sorted(paths, key=path_string)]
        message = f"Apply failed with {len(pairs)} conflicts: " + "\n".join(lines)
    return StatusError(409, "Conflict", message, {"causes": causes})


def record_update(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    manager: str,
    subresource: str = "",
) -> list[ManagerFields]:
    """Managers after a non-apply write (POST, PUT, or a JSON, merge or strategic merge PATCH)
    by ``manager``: its ``Update`` entry (per subresource) takes every leaf it changed (all of
    them on create), and the others lose those fields without conflict
    (sigs.k8s.io/structured-merge-diff merge/update.go Updater.Update, which forces). Later
    applies by other managers conflict with the fields recorded here.
    """
    if old is None:
        new_fields = changed = field_set(new)
        managers: list[ManagerFields] = []
    else:
        new_fields, changed = fields_changed(old, new)
        managers = read_managed_fields(old)
    if subresource == "status":
        changed = {p for p in changed if p[:1] == ("f:status",)}
    out: list[ManagerFields] = []
    mine: set[FieldPath] = set(changed)
    for entry in managers:
        # Fields that vanished from the object are owned by nobody any more.
        kept = frozenset((entry.fields - changed) & new_fields)
        if (
            entry.manager == manager
            and entry.operation == "Update"
            and entry.subresource == subresource
        ):
            mine |= kept
            continue
        if kept:
            out.append(
                ManagerFields(
                    entry.manager, entry.operation, entry.subresource, kept, entry.api_version
                )
            )
    if mine:
        out.append(ManagerFields(manager, "Update", subresource, frozenset(mine)))
    return out


def managed_fields_json(
    managers: list[ManagerFields],
    api_version: str,
    now: str,
    previous: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The ``metadata.managedFields`` JSON for ``managers``; an entry whose fields did not change
    keeps its old ``time``, and one that names no apiVersion gets ``api_version`` (the
    version of the write in progress).
    """
    old_times = {
        (e.get("manager"), e.get("operation"), e.get("subresource", "")): (
            e.get("time"),
            e.get("fieldsV1"),
        )
        for e in previous or []
    }
    out: list[dict[str, Any]] = []
    for m in managers:
        fields_v1 = to_fields_v1(m.fields)
        old_time, old_fields = old_times.get((m.manager, m.operation, m.subresource), (None, None))
        entry: dict[str, Any] = {
            "manager": m.manager,
            "operation": m.operation,
            "apiVersion": m.api_version or api_version,
            "time": old_time if old_fields == fields_v1 and old_time else now,
            "fieldsType": "FieldsV1",
            "fieldsV1": fields_v1,
        }
        if m.subresource:
            entry["subresource"] = m.subresource
        out.append(entry)
    return out
