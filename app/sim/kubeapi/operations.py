"""The verbs: create, get, list, update, patch and delete over the store.

Mirrors k8s.io/apiserver pkg/registry/generic/registry (Store.Create/Update/Delete) with the
per-kind strategies of k8s.io/kubernetes pkg/registry (status split, generation, status reset
on create) and the validation of :mod:`.validation` and :mod:`.dra`.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Sequence
from typing import Any

import yaml

from . import dra, dra_claims
from .apply import managed_fields_json, record_update, server_side_apply
from .context import Cluster, RuleContext
from .errors import (
    STALE_OBJECT,
    Cause,
    StatusError,
    already_exists,
    bad_request,
    conflict,
    expired,
    invalid,
    not_found,
    unsupported_media_type,
)
from .listing import ListResult, WatchFilter, decode_continue, encode_continue
from .objects import (
    drop_path,
    now_rfc3339,
    random_suffix,
    spec_part,
    uses_generation,
    visible_as,
)
from .patch import json_patch, merge_patch, strategic_merge
from .resources import RESOURCE_GROUP, ResourceType
from .selectors import FieldRequirement, Requirement
from .store import Store
from .validation import SchemaValidator, metadata_causes, raise_if

APPLY_PATCH = "application/apply-patch+yaml"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_SYSTEM_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                "generation", "selfLink")


class Api:
    """The verbs over a :class:`Store`, for the HTTP handlers and the Python API alike.

    ``types``: served resource types; ``validate``: run schema and Go-rule validation;
    ``dropped``: plural -> dotted paths silently removed on write (a disabled feature gate).
    """

    def __init__(self, store: Store, types: Sequence[ResourceType], *, validate: bool,
                 cluster: Cluster) -> None:
        self.store = store
        self.types = list(types)
        self.validate = validate
        self.cluster = cluster
        self.schemas = SchemaValidator()
        self.dropped: dict[str, list[str]] = {}
        # Warnings of the call in progress: the verbs are synchronous, so the HTTP layer
        # empties this before a call and sends what it holds as Warning headers after it.
        self.warnings: list[str] = []

    # -- lookup ---------------------------------------------------------------------------
    def find(self, group: str, version: str, plural: str) -> ResourceType | None:
        """The served type for a URL's group/version/plural, or None."""
        for rt in self.types:
            if (rt.group, rt.version, rt.plural) == (group, version, plural):
                return rt
        return None

    def type_of(self, api_version: str, kind: str) -> ResourceType:
        """The served type for an object's apiVersion and kind; StatusError 404 otherwise."""
        for rt in self.types:
            if (rt.api_version, rt.kind) == (api_version, kind):
                return rt
        raise StatusError(404, "NotFound",
                          f'the server could not find the requested resource ({kind} '
                          f'{api_version} is not served)')

    def _get_visible(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        obj = visible_as(rt, self.store.get(rt.group_resource, (namespace, name)))
        if obj is None:
            raise not_found(rt.group, rt.plural, name)
        return obj

    def get(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        """A copy of one object; StatusError 404 when absent or not visible in rt's version."""
        return copy.deepcopy(self._get_visible(rt, namespace, name))

    # -- list -----------------------------------------------------------------------------
    def list_objects(
        self, rt: ResourceType, namespace: str, labels: Sequence[Requirement],
        fields: Sequence[FieldRequirement], limit: int = 0, continue_token: str = "",
    ) -> ListResult:
        """Objects sorted by (namespace, name), filtered, paged by ``limit``/``continue``.

        A continue token older than the history window is 410 Expired, as with etcd
        compaction. Pages after the first show the objects as they are now (the real server
        serves a snapshot at the token's version); the list version stays the token's.
        """
        list_rv = self.store.rv
        start: tuple[str, str] | None = None
        if continue_token:
            list_rv, start = decode_continue(continue_token)
            if list_rv < self.store.compacted_rv:
                raise expired("The provided continue parameter is too old to display a "
                              "consistent list result. You can start a new list without the "
                              "continue parameter.")
        flt = WatchFilter(rt, namespace, labels, fields)
        matched: list[tuple[tuple[str, str], dict[str, Any]]] = []
        for key, obj in self.store.items(rt.group_resource):
            if start is not None and key <= start:
                continue
            shown = flt.matches(obj)
            if shown is not None:
                matched.append((key, shown))
        page = matched[:limit] if limit > 0 else matched
        token = ""
        remaining: int | None = None
        if limit > 0 and len(matched) > limit:
            last_key = page[-1][0]
            token = encode_continue(list_rv, last_key[0], last_key[1])
            remaining = len(matched) - limit
        return ListResult([copy.deepcopy(o) for _, o in page], str(list_rv), token, remaining)

    # -- helpers --------------------------------------------------------------------------
    def _normalise_body(self, rt: ResourceType, namespace: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        obj = copy.deepcopy(body)
        api_version = obj.setdefault("apiVersion", rt.api_version)
        kind = obj.setdefault("kind", rt.kind)
        if api_version != rt.api_version or kind != rt.kind:
            raise bad_request(f"the API version in the data ({api_version}) does not match the "
                              f"expected API version ({rt.api_version})" if kind == rt.kind else
                              f"the kind in the data ({kind}) does not match the expected kind "
                              f"({rt.kind})")
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise bad_request("the namespace of the provided object does not match the "
                                  "namespace sent on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        return obj

    def _drop(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        for path in self.dropped.get(rt.plural, []):
            drop_path(obj, path)

    def context(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None,
                status_write: bool = False) -> RuleContext:
        """The :class:`RuleContext` of a write of ``obj`` (``old``: stored state or None);
        its warnings go to :attr:`warnings`.
        """
        labels: dict[str, str] = {}
        if rt.namespaced:
            namespace = (obj.get("metadata") or {}).get("namespace") or ""
            ns = self.store.get(("", "namespaces"), ("", namespace))
            labels = dict(((ns or {}).get("metadata") or {}).get("labels") or {})
        return RuleContext(self.cluster, rt.version if rt.group == RESOURCE_GROUP else "",
                           old, status_write, labels, self.warnings)

    def _kind_causes(self, rt: ResourceType, obj: dict[str, Any],
                     ctx: RuleContext) -> list[Cause]:
        if rt.group != RESOURCE_GROUP:
            return []
        old, status_write = ctx.old, ctx.status_write
        if rt.plural == "resourceslices":
            return dra.resource_slice_causes(obj, old, rt.version)
        if rt.plural == "resourceclaims":
            return dra_claims.resource_claim_causes(obj, old, rt.version, status_write)
        if rt.plural == "deviceclasses":
            return dra_claims.device_class_causes(obj)
        if rt.plural == "resourceclaimtemplates":
            return dra_claims.resource_claim_template_causes(obj, old, rt.version)
        if rt.plural == "podschedulingcontexts":
            return dra_claims.pod_scheduling_context_causes(obj)
        return []

    def _validate(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None,
                  status_write: bool = False) -> None:
        if not self.validate:
            return
        ctx = self.context(rt, obj, old, status_write)
        self.schemas.check(rt, obj)
        raise_if(rt, obj, metadata_causes(rt, obj) + self._kind_causes(rt, obj, ctx))

    def _namespace_exists(self, rt: ResourceType, namespace: str) -> None:
        if rt.namespaced and self.store.get(("", "namespaces"), ("", namespace)) is None:
            raise not_found("", "namespaces", namespace)

    # -- create ---------------------------------------------------------------------------
    def create(self, rt: ResourceType, namespace: str, body: Any, *, manager: str,
               dry_run: bool = False, managers: list[Any] | None = None) -> dict[str, Any]:
        """POST: name or generateName, server fields, status reset where the strategy does it,
        validation, store, ADDED event. Raises StatusError 400/404/409/422.
        """
        obj = self._normalise_body(rt, namespace, body)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            # Retry on the (unlikely) clash instead of returning 409 for a generated name.
            for _ in range(8):
                candidate = meta["generateName"] + random_suffix()
                if self.store.get(rt.group_resource, (namespace if rt.namespaced else "",
                                                      candidate)) is None:
                    break
            meta["name"] = candidate
        if meta.get("resourceVersion"):
            # The storage layer refuses this and the handler reports it as an internal error
            # (k8s.io/apiserver pkg/storage/etcd3 store.Create).
            raise StatusError(500, "InternalError", "Internal error occurred: resourceVersion "
                              "should not be set on objects to be created")
        for field_name in (*_SYSTEM_META, "managedFields"):
            meta.pop(field_name, None)
        if not meta.get("name"):
            raise invalid(rt.kind, rt.group, "", [Cause(
                "FieldValueRequired", "Required value: name or generateName is required",
                "metadata.name")])
        key = (namespace if rt.namespaced else "", meta["name"])
        if self.store.get(rt.group_resource, key) is not None:
            raise already_exists(rt.group, rt.plural, meta["name"])
        self._namespace_exists(rt, namespace)
        if rt.reset_status_on_create:
            obj.pop("status", None)
            if rt.plural == "pods":
                obj["status"] = {"phase": "Pending"}
        if rt.plural == "namespaces":
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        self._drop(rt, obj)
        self._validate(rt, obj, None)
        now = now_rfc3339()
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now
        if uses_generation(rt):
            meta["generation"] = 1
        if managers is None:
            managers = record_update(None, obj, manager)
        meta["managedFields"] = managed_fields_json(managers, rt.api_version, now)
        if dry_run:
            meta["resourceVersion"] = str(self.store.rv)
            return obj
        meta["resourceVersion"] = str(self.store.next_rv())
        self.store.put(rt.group_resource, key, obj, "ADDED", None)
        return copy.deepcopy(obj)

    # -- update ---------------------------------------------------------------------------
    def update(self, rt: ResourceType, namespace: str, name: str, body: Any, *,
               subresource: str = "", manager: str, dry_run: bool = False,
               managers: list[Any] | None = None) -> dict[str, Any]:
        """PUT (also the last step of PATCH): preconditions, status split, finalizer rule,
        generation, validation; a no-op writes nothing. Raises StatusError 400/404/409/422.
        """
        old = self._get_visible(rt, namespace, name)
        obj = self._normalise_body(rt, namespace, body)
        meta = obj["metadata"]
        if meta.get("name", name) != name:
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the "
                              f"name on the URL ({name})")
        old_meta = old["metadata"]
        if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta["resourceVersion"]:
            raise conflict(rt.group, rt.plural, name, STALE_OBJECT)
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise conflict(rt.group, rt.plural, name,
                           f"Precondition failed: UID in precondition: {meta['uid']}, "
                           f"UID in object meta: {old_meta['uid']}")
        if subresource == "status":
            # ResetObjectMetaForStatus: a status write changes status and nothing else.
            new = copy.deepcopy(old)
            if obj.get("status") is None:
                new.pop("status", None)
            else:
                new["status"] = obj["status"]
            if rt.plural == "resourceclaims" and not (new.get("status") or {}).get("allocation"):
                # dropDeallocatedStatusDevices: device status goes with the allocation.
                (new.get("status") or {}).pop("devices", None)
        else:
            new = obj
            if rt.has_status:
                if old.get("status") is None:
                    new.pop("status", None)
                else:
                    new["status"] = copy.deepcopy(old["status"])
            for field_name in (*_SYSTEM_META, "name", "namespace"):
                if field_name in old_meta:
                    meta[field_name] = old_meta[field_name]
                else:
                    meta.pop(field_name, None)
            if rt.plural == "namespaces":
                new["spec"] = copy.deepcopy(old.get("spec"))
        new_meta = new["metadata"]
        if old_meta.get("deletionTimestamp"):
            added = [f for f in new_meta.get("finalizers") or []
                     if f not in (old_meta.get("finalizers") or [])]
            if added:
                raise invalid(rt.kind, rt.group, name, [Cause(
                    "FieldValueForbidden", "Forbidden: no new finalizers can be added if the "
                    "object is being deleted, found new finalizers []string{"
                    + ", ".join(json.dumps(f) for f in sorted(added)) + "}",
                    "metadata.finalizers")])
        self._drop(rt, new)
        if uses_generation(rt) and spec_part(new) != spec_part(old):
            new_meta["generation"] = int(old_meta.get("generation", 1)) + 1
        new_meta["resourceVersion"] = old_meta["resourceVersion"]
        if managers is None:
            managers = record_update(old, new, manager, subresource)
        now = now_rfc3339()
        new_meta["managedFields"] = managed_fields_json(
            managers, rt.api_version, now, old_meta.get("managedFields"))
        self._validate(rt, new, old, status_write=subresource == "status")
        if new == old:
            return copy.deepcopy(old)
        if dry_run:
            return new
        key = (namespace if rt.namespaced else "", name)
        new_meta["resourceVersion"] = str(self.store.next_rv())
        if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            self.store.remove(rt.group_resource, key, new)
        else:
            self.store.put(rt.group_resource, key, new, "MODIFIED", old)
        return copy.deepcopy(new)

    # -- patch ----------------------------------------------------------------------------
    def patch(self, rt: ResourceType, namespace: str, name: str, content_type: str,
              raw: bytes, *, subresource: str = "", manager: str, field_manager: str = "",
              force: bool = False, dry_run: bool = False) -> tuple[dict[str, Any], bool]:
        """PATCH of any kind; returns (object, created). Apply creates a missing object.

        Raises StatusError 400 (undecodable patch), 404, 409, 415 (unknown type), 422.
        """
        if content_type == APPLY_PATCH:
            return self._apply(rt, namespace, name, raw, subresource=subresource,
                               field_manager=field_manager, force=force, dry_run=dry_run)
        if content_type not in (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH):
            raise unsupported_media_type(content_type)
        try:
            document = json.loads(raw or b"null")
        except ValueError as err:
            raise bad_request(f"error decoding patch: {err}") from err
        old = self._get_visible(rt, namespace, name)
        if content_type == JSON_PATCH:
            patched = json_patch(old, document)
        else:
            if not isinstance(document, dict):
                raise bad_request("error decoding patch: the patch must be a JSON object")
            patched = (merge_patch(old, document) if content_type == MERGE_PATCH
                       else strategic_merge(old, document))
        if not isinstance(patched, dict):
            raise bad_request("the patched object is not a JSON object")
        return self.update(rt, namespace, name, patched, subresource=subresource,
                           manager=field_manager or manager, dry_run=dry_run), False

    def _apply(self, rt: ResourceType, namespace: str, name: str, raw: bytes, *,
               subresource: str, field_manager: str, force: bool,
               dry_run: bool) -> tuple[dict[str, Any], bool]:
        if not field_manager:
            raise invalid("PatchOptions", "meta.k8s.io", "", [Cause(
                "FieldValueRequired", "Required value: is required for apply patch",
                "fieldManager")])
        try:
            config = yaml.safe_load(raw or b"")
        except yaml.YAMLError as err:
            raise bad_request(f"error decoding YAML: {err}") from err
        if not isinstance(config, dict):
            raise bad_request("error decoding YAML: the apply configuration must be an object")
        config_meta = config.get("metadata") or {}
        if config_meta.get("name", name) != name:
            raise bad_request(f"the name of the object ({config_meta.get('name')}) does not "
                              f"match the name on the URL ({name})")
        existing = visible_as(rt, self.store.get(
            rt.group_resource, (namespace if rt.namespaced else "", name)))
        if existing is None:
            if subresource:
                raise not_found(rt.group, rt.plural, name)
            if self.store.get(rt.group_resource,
                              (namespace if rt.namespaced else "", name)) is not None:
                raise already_exists(rt.group, rt.plural, name)
            merged, managers = server_side_apply({}, config, field_manager, force=force)
            merged.setdefault("metadata", {})["name"] = name
            return self.create(rt, namespace, merged, manager=field_manager, dry_run=dry_run,
                               managers=managers), True
        merged, managers = server_side_apply(existing, config, field_manager, force=force,
                                             subresource=subresource)
        merged_meta = merged.setdefault("metadata", {})
        # Only a resourceVersion in the applied configuration is a precondition.
        if config_meta.get("resourceVersion"):
            merged_meta["resourceVersion"] = config_meta["resourceVersion"]
        else:
            merged_meta["resourceVersion"] = existing["metadata"]["resourceVersion"]
        return self.update(rt, namespace, name, merged, subresource=subresource,
                           manager=field_manager, dry_run=dry_run, managers=managers), False

    # -- delete ---------------------------------------------------------------------------
    def delete(self, rt: ResourceType, namespace: str, name: str,
               options: dict[str, Any] | None = None,
               dry_run: bool = False) -> tuple[dict[str, Any], bool]:
        """DELETE: preconditions, then either mark for deletion (finalizers present: returns
        (object, False)) or remove (returns (last state, True)). Deleting a Namespace removes
        the objects in it. Raises StatusError 404, 409.
        """
        old = self._get_visible(rt, namespace, name)
        old_meta = old["metadata"]
        preconditions = (options or {}).get("preconditions") or {}
        if preconditions.get("uid") and preconditions["uid"] != old_meta["uid"]:
            raise conflict(rt.group, rt.plural, name,
                           f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                           f"UID in object meta: {old_meta['uid']}")
        if preconditions.get("resourceVersion") and \
                preconditions["resourceVersion"] != old_meta["resourceVersion"]:
            raise conflict(rt.group, rt.plural, name,
                           "Precondition failed: ResourceVersion in precondition: "
                           f"{preconditions['resourceVersion']}, ResourceVersion in object "
                           f"meta: {old_meta['resourceVersion']}")
        key = (namespace if rt.namespaced else "", name)
        if dry_run:
            return copy.deepcopy(old), not old_meta.get("finalizers")
        if old_meta.get("finalizers"):
            if old_meta.get("deletionTimestamp"):
                return copy.deepcopy(old), False
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = now_rfc3339()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["metadata"]["resourceVersion"] = str(self.store.next_rv())
            self.store.put(rt.group_resource, key, new, "MODIFIED", old)
            return copy.deepcopy(new), False
        last = copy.deepcopy(old)
        last["metadata"]["resourceVersion"] = str(self.store.next_rv())
        self.store.remove(rt.group_resource, key, last)
        if rt.plural == "namespaces":
            self._delete_namespace_contents(name)
        return last, True

    def _delete_namespace_contents(self, namespace: str) -> None:
        # The namespace controller's job, done at once: objects with finalizers are only
        # marked for deletion, as the controller would leave them.
        for rt in self.types:
            if not rt.namespaced:
                continue
            for key, obj in list(self.store.items(rt.group_resource)):
                if key[0] == namespace and visible_as(rt, obj) is obj:
                    self.delete(rt, namespace, key[1])

    def ensure_default_namespaces(self) -> None:
        """Create the namespaces every cluster starts with (default, kube-system, ...)."""
        ns_type = self.find("", "v1", "namespaces")
        assert ns_type is not None
        for name in DEFAULT_NAMESPACES:
            if self.store.get(ns_type.group_resource, ("", name)) is None:
                self.create(ns_type, "", {"metadata": {"name": name}}, manager="kube-apiserver")
