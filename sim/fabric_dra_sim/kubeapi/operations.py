"""The verbs: create, get, list, update, patch and delete over the store.

Mirrors k8s.io/apiserver pkg/registry/generic/registry (Store.Create/Update/Delete) with the
per-kind strategies of k8s.io/kubernetes pkg/registry (status split, generation, status reset
on create) and the validation of :mod:`.validation` and :mod:`.dra`.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Sequence
from typing import Any

import yaml

from app.jsontypes import json_copy

from . import defaults, dra, dra_claims, leases
from .apply import managed_fields_json, record_update, server_side_apply
from .cluster import profile
from .context import Cluster, RuleContext
from .conversion import convert
from .deletion import check_preconditions, plan_delete, should_delete_during_update
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
from .field_gates import drop_disabled_fields
from .fieldvalidation import (
    STRICT,
    go_value,
    json_patch_errors,
    load_yaml,
    parse_json,
    settle,
    settle_apply,
    settle_patch,
    typed_patch_error,
)
from .listing import (
    EXACT,
    LIST_TOO_OLD,
    ListOptions,
    ListResult,
    WatchFilter,
    decode_continue,
    encode_continue,
    expired_continue,
    parse_list_resource_version,
    too_large_resource_version,
)
from .objects import (
    drop_path,
    now_rfc3339,
    random_suffix,
    spec_part,
    uses_generation,
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
_SYSTEM_META = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "selfLink",
)


def _check_name(rt: ResourceType, namespace: str, name: str, body: Any) -> None:
    # k8s.io/apiserver pkg/endpoints/handlers/rest.go checkName (run by the update handler).
    if not isinstance(body, dict):
        return  # refused by _normalise_body
    meta = body.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    if not meta.get("name"):
        raise bad_request(
            f"the name of the object ({name} based on URL) was undeterminable: "
            "name must be provided"
        )
    if meta["name"] != name:
        raise bad_request(
            f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
        )
    if rt.namespaced and meta.get("namespace") and meta["namespace"] != namespace:
        raise bad_request(
            f"the namespace of the object ({meta['namespace']}) does not match "
            f"the namespace on the request ({namespace})"
        )


class Api:
    """The verbs over a :class:`Store`, for the HTTP handlers and the Python API alike.

    ``types``: served resource types; ``validate``: run schema and Go-rule validation;
    ``dropped``: plural -> dotted paths silently removed on write (a disabled feature gate).
    """

    def __init__(
        self, store: Store, types: Sequence[ResourceType], *, validate: bool, cluster: Cluster
    ) -> None:
        self.store = store
        self.types = list(types)
        self.validate = validate
        self.cluster = cluster
        cluster_profile = profile(cluster.version)
        self.schemas = SchemaValidator(cluster_profile.schema_version)
        # resource.k8s.io objects are stored once, in this version, and converted on every
        # read and write (see conversion.py).
        self.storage_version = cluster_profile.storage_version
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
        raise StatusError(
            404,
            "NotFound",
            f"the server could not find the requested resource ({kind} "
            f"{api_version} is not served)",
        )

    def shown(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """Stored ``obj`` as ``rt``'s version shows it (the stored object itself when no
        conversion is needed: callers must not mutate it)."""
        return convert(obj, rt.version) if rt.group == RESOURCE_GROUP else obj

    def stored(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """``obj`` (written through ``rt``) in the storage version."""
        return convert(obj, self.storage_version) if rt.group == RESOURCE_GROUP else obj

    def _get_visible(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        obj = self.store.get(rt.group_resource, (namespace, name))
        if obj is None:
            raise not_found(rt.group, rt.plural, name)
        return self.shown(rt, obj)

    def get(
        self, rt: ResourceType, namespace: str, name: str, *, share_result: bool = False
    ) -> dict[str, Any]:
        """A copy of one object shown in rt's version; StatusError 404 when absent.
        ``share_result``: see :meth:`update`."""
        shown = self._get_visible(rt, namespace, name)
        return shown if share_result else json_copy(shown)

    # -- list -----------------------------------------------------------------------------
    def list_objects(
        self,
        rt: ResourceType,
        namespace: str,
        labels: Sequence[Requirement],
        fields: Sequence[FieldRequirement],
        limit: int = 0,
        continue_token: str = "",
        *,
        resource_version: str = "",
        resource_version_match: str = "",
    ) -> ListResult:
        """Objects sorted by (namespace, name), filtered, paged by ``limit``/``continue``.

        Which state is listed follows k8s.io/apiserver pkg/storage/interfaces.go
        ValidateListOptions and pkg/storage/etcd3/store.go GetList: a continue token reads at
        its version (-1: the latest), and so does ``resource_version`` with
        ``resource_version_match`` Exact, or with no match and a ``limit`` (the legacy
        paging case); otherwise the latest state is listed (NotOlderThan: the caller has
        waited until the store reached ``resource_version``). A state at an older version is
        rebuilt from the resource's event history, so every page of a paged list shows the
        same snapshot. ``remaining`` is only counted without selectors
        (k8s.io/apiserver pkg/storage/continue.go PrepareContinueToken).

        Raises StatusError 400 (bad token or version, a version with a continue token), 410
        Expired (the version left the history: for a continue token with a token that
        continues at the latest version), 504 (an exact version not reached yet).
        """
        opts = ListOptions(
            False, resource_version, resource_version_match, None, continue_token, limit
        )
        requested = parse_list_resource_version(opts)
        store = self.store
        gr = rt.group_resource
        start: tuple[str, str] | None = None
        exact: int | None = None
        if continue_token:
            token_rv, start = decode_continue(continue_token)
            if token_rv > 0:
                exact = token_rv
        elif requested > 0 and (
            resource_version_match == EXACT or (not resource_version_match and limit > 0)
        ):
            exact = requested
        list_rv = store.rv
        source = store.items(gr)
        if exact is not None:
            if exact > store.rv:
                raise too_large_resource_version(exact, store.rv)
            snapshot = store.snapshot(gr, exact)
            if snapshot is None:
                if start is not None:
                    raise expired_continue(start)
                raise expired(LIST_TOO_OLD)
            source, list_rv = snapshot, exact
        flt = WatchFilter(rt, namespace, labels, fields)
        matched: list[tuple[tuple[str, str], dict[str, Any]]] = []
        for key, obj in source:
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
            if not labels and not fields:
                remaining = len(matched) - limit
        return ListResult([json_copy(o) for _, o in page], str(list_rv), token, remaining)

    # -- helpers --------------------------------------------------------------------------
    def _normalise_body(
        self, rt: ResourceType, namespace: str, body: Any, owned: bool = False
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        obj = body if owned else json_copy(body)
        api_version = obj.setdefault("apiVersion", rt.api_version)
        kind = obj.setdefault("kind", rt.kind)
        if api_version != rt.api_version or kind != rt.kind:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the "
                f"expected API version ({rt.api_version})"
                if kind == rt.kind
                else f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the "
                    "namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        return obj

    def _drop(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        # PrepareForCreate/PrepareForUpdate of the resource.k8s.io strategies: fields of
        # disabled gates go silently (field_gates.py); then the explicit drop_fields fault.
        if rt.group == RESOURCE_GROUP:
            drop_disabled_fields(self.cluster, rt.plural, rt.version, obj, old)
        for path in self.dropped.get(rt.plural, []):
            drop_path(obj, path)

    def context(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        status_write: bool = False,
    ) -> RuleContext:
        """The :class:`RuleContext` of a write of ``obj`` (``old``: stored state or None);
        its warnings go to :attr:`warnings`.
        """
        labels: dict[str, str] = {}
        if rt.namespaced:
            namespace = (obj.get("metadata") or {}).get("namespace") or ""
            ns = self.store.get(("", "namespaces"), ("", namespace))
            labels = dict(((ns or {}).get("metadata") or {}).get("labels") or {})
        return RuleContext(
            self.cluster,
            rt.version if rt.group == RESOURCE_GROUP else "",
            old,
            status_write,
            labels,
            self.warnings,
        )

    def _kind_causes(self, rt: ResourceType, obj: dict[str, Any], ctx: RuleContext) -> list[Cause]:
        if (rt.group, rt.plural) == ("coordination.k8s.io", "leases"):
            return leases.lease_causes(obj, ctx)
        if rt.group != RESOURCE_GROUP:
            return []
        if rt.plural == "resourceslices":
            return dra.resource_slice_causes(obj, ctx)
        if rt.plural == "resourceclaims":
            return dra_claims.resource_claim_causes(obj, ctx)
        if rt.plural == "deviceclasses":
            return dra_claims.device_class_causes(obj, ctx)
        if rt.plural == "resourceclaimtemplates":
            return dra_claims.resource_claim_template_causes(obj, ctx)
        if rt.plural == "podschedulingcontexts":
            return dra_claims.pod_scheduling_context_causes(obj, ctx)
        return []

    def _validate(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        status_write: bool = False,
    ) -> None:
        if not self.validate:
            return
        ctx = self.context(rt, obj, old, status_write)
        self.schemas.check(rt, obj)
        raise_if(rt, obj, metadata_causes(rt, obj) + self._kind_causes(rt, obj, ctx))

    def _decode(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        field_validation: str | None,
        duplicates: Sequence[str],
    ) -> None:
        # k8s.io/apiserver pkg/endpoints/handlers create.go / update.go: the body is decoded
        # into the Go type, which has no room for unknown fields; fieldValidation says whether
        # that fails the request, warns or passes silently. None: already decoded (the last
        # step of a patch or apply).
        if field_validation is None or not self.validate:
            return
        settle(self.schemas.drop_unknown(rt, obj, duplicates), field_validation, self.warnings)

    def _namespace_exists(self, rt: ResourceType, namespace: str) -> None:
        if rt.namespaced and self.store.get(("", "namespaces"), ("", namespace)) is None:
            raise not_found("", "namespaces", namespace)

    # -- create ---------------------------------------------------------------------------
    def create(
        self,
        rt: ResourceType,
        namespace: str,
        body: Any,
        *,
        manager: str,
        dry_run: bool = False,
        managers: list[Any] | None = None,
        field_validation: str | None = STRICT,
        duplicates: Sequence[str] = (),
        body_owned: bool = False,
        share_result: bool = False,
    ) -> dict[str, Any]:
        """POST: name or generateName, server fields, status reset where the strategy does it,
        validation, store, ADDED event. Raises StatusError 400/404/409/422.

        ``field_validation``: Ignore, Warn or Strict for unknown fields and the
        ``duplicates`` (paths of repeated JSON keys) of the body; in-process callers default
        to Strict, the HTTP layer passes the request's (Warn when absent).
        ``body_owned``, ``share_result``: as for :meth:`update`.
        """
        obj = self._normalise_body(rt, namespace, body, body_owned)
        self._decode(rt, obj, field_validation, duplicates)
        # The decoder's work, done even without validation: canonical values and defaults.
        defaults.prepare(rt, obj)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            # Retry on the (unlikely) clash instead of returning 409 for a generated name.
            for _ in range(8):
                candidate = meta["generateName"] + random_suffix()
                if (
                    self.store.get(
                        rt.group_resource, (namespace if rt.namespaced else "", candidate)
                    )
                    is None
                ):
                    break
            meta["name"] = candidate
        if meta.get("resourceVersion"):
            # The storage layer refuses this and the handler reports it as an internal error
            # (k8s.io/apiserver pkg/storage/etcd3 store.Create).
            raise StatusError(
                500,
                "InternalError",
                "Internal error occurred: resourceVersion "
                "should not be set on objects to be created",
            )
        for field_name in (*_SYSTEM_META, "managedFields"):
            meta.pop(field_name, None)
        if not meta.get("name"):
            raise invalid(
                rt.kind,
                rt.group,
                "",
                [
                    Cause(
                        "FieldValueRequired",
                        "Required value: name or generateName is required",
                        "metadata.name",
                    )
                ],
            )
        key = (namespace if rt.namespaced else "", meta["name"])
        clash = self.store.get(rt.group_resource, key)
        if clash is not None:
            err = already_exists(rt.group, rt.plural, meta["name"])
            if (clash.get("metadata") or {}).get("deletionTimestamp"):
                # k8s.io/apiserver pkg/registry/generic/registry/store.go create: the name is
                # held by an object that finalizers keep while it is being deleted.
                err.message = f"object is being deleted: {err.message}"
            raise err
        self._namespace_exists(rt, namespace)
        if rt.reset_status_on_create:
            obj.pop("status", None)
            if rt.plural == "pods":
                obj["status"] = {"phase": "Pending"}
        if rt.plural == "namespaces":
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        self._drop(rt, obj, None)
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
        self.store.put(rt.group_resource, key, self.stored(rt, obj), "ADDED", None)
        return obj if share_result else json_copy(obj)

    # -- update ---------------------------------------------------------------------------
    def update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        *,
        subresource: str = "",
        manager: str,
        dry_run: bool = False,
        managers: list[Any] | None = None,
        field_validation: str | None = STRICT,
        duplicates: Sequence[str] = (),
        body_owned: bool = False,
        share_result: bool = False,
    ) -> dict[str, Any]:
        """PUT (also the last step of PATCH): preconditions, status split, finalizer rule,
        generation, validation; a no-op writes nothing. Raises StatusError 400/404/409/422.
        ``field_validation``, ``duplicates``: as for :meth:`create`.

        ``body_owned``: the caller hands ``body`` over (just decoded; it is not read again),
        so it is worked on without a copy. ``share_result``: the result may be the stored
        object itself, which the caller reads at once and never keeps or changes (the HTTP
        layer, which encodes it before anything else runs). Without them the body is copied
        and the result is a copy of its own.
        """
        old = self._get_visible(rt, namespace, name)
        _check_name(rt, namespace, name, body)
        obj = self._normalise_body(rt, namespace, body, body_owned)
        self._decode(rt, obj, field_validation, duplicates)
        defaults.prepare(rt, obj)
        meta = obj["metadata"]
        old_meta = old["metadata"]
        if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta["resourceVersion"]:
            raise conflict(rt.group, rt.plural, name, STALE_OBJECT)
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: UID in precondition: {meta['uid']}, "
                f"UID in object meta: {old_meta['uid']}",
            )
        if subresource == "status":
            # ResetObjectMetaForStatus: a status write changes status and nothing else.
            new = json_copy(old)
            if obj.get("status") is None:
                new.pop("status", None)
            else:
                new["status"] = obj["status"]
            if rt.plural == "resourceclaims":
                dra_claims.drop_deallocated_status_devices(new, old)
        else:
            new = obj
            if rt.has_status:
                if old.get("status") is None:
                    new.pop("status", None)
                else:
                    new["status"] = json_copy(old["status"])
            for field_name in (*_SYSTEM_META, "name", "namespace"):
                if field_name in old_meta:
                    meta[field_name] = old_meta[field_name]
                else:
                    meta.pop(field_name, None)
            if rt.plural == "namespaces":
                new["spec"] = json_copy(old.get("spec"))
        new_meta = new["metadata"]
        if old_meta.get("deletionTimestamp"):
            added = [
                f
                for f in new_meta.get("finalizers") or []
                if f not in (old_meta.get("finalizers") or [])
            ]
            if added:
                raise invalid(
                    rt.kind,
                    rt.group,
                    name,
                    [
                        Cause(
                            "FieldValueForbidden",
                            "Forbidden: no new finalizers can be added if the "
                            "object is being deleted, found new finalizers []string{"
                            + ", ".join(json.dumps(f) for f in sorted(added))
                            + "}",
                            "metadata.finalizers",
                        )
                    ],
                )
        self._drop(rt, new, old)
        if uses_generation(rt) and spec_part(new) != spec_part(old):
            new_meta["generation"] = int(old_meta.get("generation", 1)) + 1
        new_meta["resourceVersion"] = old_meta["resourceVersion"]
        if managers is None:
            managers = record_update(old, new, manager, subresource)
        now = now_rfc3339()
        new_meta["managedFields"] = managed_fields_json(
            managers, rt.api_version, now, old_meta.get("managedFields")
        )
        self._validate(rt, new, old, status_write=subresource == "status")
        if new == old:
            return old if share_result else json_copy(old)
        if dry_run:
            return new
        key = (namespace if rt.namespaced else "", name)
        new_meta["resourceVersion"] = str(self.store.next_rv())
        stored_old = self.store.get(rt.group_resource, key)
        if should_delete_during_update(old_meta, new_meta):
            self.store.remove(rt.group_resource, key, self.stored(rt, new))
        else:
            self.store.put(rt.group_resource, key, self.stored(rt, new), "MODIFIED", stored_old)
        return new if share_result else json_copy(new)

    # -- patch ----------------------------------------------------------------------------
    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        raw: bytes,
        *,
        subresource: str = "",
        manager: str,
        field_manager: str = "",
        force: bool = False,
        dry_run: bool = False,
        field_validation: str = STRICT,
        share_result: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """PATCH of any kind; returns (object, created). Apply creates a missing object.
        ``share_result``: as for :meth:`update` (server-side apply always answers a copy).

        ``field_validation`` (Ignore, Warn, Strict) rules duplicate keys of the patch and
        unknown fields of the patched object (a 422 on field ``patch`` under Strict); an
        apply configuration's unknown fields are a 500 in every mode, as structured-merge-diff
        refuses them. Raises StatusError 400 (undecodable patch), 404, 409, 415 (unknown
        type), 422, 500.
        """
        if content_type == APPLY_PATCH:
            return self._apply(
                rt,
                namespace,
                name,
                raw,
                subresource=subresource,
                field_manager=field_manager,
                force=force,
                dry_run=dry_run,
                field_validation=field_validation,
            )
        if content_type not in (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH):
            raise unsupported_media_type(content_type)
        try:
            document, duplicates = parse_json(raw or b"null")
        except ValueError as err:
            raise bad_request(f"error decoding patch: {err}") from err
        old = self._get_visible(rt, namespace, name)
        if content_type == JSON_PATCH:
            patched = json_patch(old, document)
        else:
            if not isinstance(document, dict):
                raise bad_request("error decoding patch: the patch must be a JSON object")
            patched = (
                merge_patch(old, document)
                if content_type == MERGE_PATCH
                else strategic_merge(old, document)
            )
        if not isinstance(patched, dict):
            raise bad_request("the patched object is not a JSON object")
        if self.validate:
            # patch.go: strict errors of the patch document itself (duplicate keys; for a JSON
            # patch also unknown operation fields), then those of the patched object.
            errors = (
                json_patch_errors(document, duplicates)
                if content_type == JSON_PATCH
                else [f'duplicate field "{d}"' for d in duplicates]
            )
            shown = ""
            if field_validation == STRICT:
                shown = (
                    go_value(document)
                    if content_type == STRATEGIC_PATCH
                    else json.dumps(patched, separators=(",", ":"))
                )
            errors += self.schemas.drop_unknown(rt, patched)
            settle_patch(errors, field_validation, self.warnings, shown)
        return self.update(
            rt,
            namespace,
            name,
            patched,
            subresource=subresource,
            manager=field_manager or manager,
            dry_run=dry_run,
            field_validation=None,
            body_owned=True,  # the patched object is this call's own
            share_result=share_result,
        ), False

    def _apply(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        raw: bytes,
        *,
        subresource: str,
        field_manager: str,
        force: bool,
        dry_run: bool,
        field_validation: str,
    ) -> tuple[dict[str, Any], bool]:
        if not field_manager:
            raise invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                [
                    Cause(
                        "FieldValueRequired",
                        "Required value: is required for apply patch",
                        "fieldManager",
                    )
                ],
            )
        try:
            config, duplicates = load_yaml(raw or b"")
        except yaml.YAMLError as err:
            raise bad_request(f"error decoding YAML: {err}") from err
        if not isinstance(config, dict):
            raise bad_request("error decoding YAML: the apply configuration must be an object")
        if self.validate:
            # patch.go applyPatcher: the typed conversion of the configuration refuses unknown
            # fields whatever fieldValidation says; duplicate keys follow the directive.
            undeclared = self.schemas.apply_unknown(rt, config)
            if undeclared:
                raise typed_patch_error(rt.kind, rt.api_version, config, undeclared)
            settle_apply(duplicates, field_validation, self.warnings)
        config_meta = config.get("metadata") or {}
        if config_meta.get("name", name) != name:
            raise bad_request(
                f"the name of the object ({config_meta.get('name')}) does not "
                f"match the name on the URL ({name})"
            )
        found = self.store.get(rt.group_resource, (namespace if rt.namespaced else "", name))
        existing = None if found is None else self.shown(rt, found)
        if existing is None:
            if subresource:
                raise not_found(rt.group, rt.plural, name)
            merged, managers = server_side_apply({}, config, field_manager, force=force)
            merged.setdefault("metadata", {})["name"] = name
            return self.create(
                rt,
                namespace,
                merged,
                manager=field_manager,
                dry_run=dry_run,
                managers=managers,
                field_validation=None,
            ), True
        merged, managers = server_side_apply(
            existing, config, field_manager, force=force, subresource=subresource
        )
        merged_meta = merged.setdefault("metadata", {})
        # Only a resourceVersion in the applied configuration is a precondition.
        if config_meta.get("resourceVersion"):
            merged_meta["resourceVersion"] = config_meta["resourceVersion"]
        else:
            merged_meta["resourceVersion"] = existing["metadata"]["resourceVersion"]
        return self.update(
            rt,
            namespace,
            name,
            merged,
            subresource=subresource,
            manager=field_manager,
            dry_run=dry_run,
            managers=managers,
            field_validation=None,
        ), False

    # -- delete ---------------------------------------------------------------------------
    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        options: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """DELETE, following k8s.io/apiserver pkg/registry/generic/registry/store.go Delete.

        Returns (object, deleted): the removed object and True, or the object kept and
        marked for deletion (``deletionTimestamp``) and False: while finalizers remain, for a
        pod's graceful deletion, or when a deletion is already pending. ``options``:
        DeleteOptions (preconditions, gracePeriodSeconds). A dry run plans and stores
        nothing. Deleting a Namespace removes the objects in it; a pod's graceful deletion
        is finished at once, as by a kubelet with no containers to stop. Raises StatusError
        404, 409 (preconditions).
        """
        opts = options or {}
        old = self._get_visible(rt, namespace, name)
        check_preconditions(rt.group, rt.kind, old, opts)
        plan = plan_delete(
            old,
            opts,
            graceful=rt.group_resource == ("", "pods"),
            now=datetime.datetime.now(datetime.UTC),
        )
        key = (namespace if rt.namespaced else "", name)
        shown = plan.obj
        if rt.plural == "namespaces" and plan.remove:
            # The namespace store answers the first DELETE with the namespace terminating
            # (pkg/registry/core/namespace/storage Delete); its controller's work is done at
            # once below.
            shown = json_copy(shown)
            shown["metadata"]["deletionTimestamp"] = now_rfc3339()
            shown.setdefault("status", {})["phase"] = "Terminating"
        if dry_run:
            return json_copy(shown), plan.remove
        if plan.write:
            plan.obj["metadata"]["resourceVersion"] = str(self.store.next_rv())
            self.store.put(
                rt.group_resource,
                key,
                self.stored(rt, plan.obj),
                "MODIFIED",
                self.store.get(rt.group_resource, key),
            )
        if plan.remove:
            last = json_copy(plan.obj)
            last["metadata"]["resourceVersion"] = str(self.store.next_rv())
            self.store.remove(rt.group_resource, key, self.stored(rt, last))
            if rt.plural == "namespaces":
                self._delete_namespace_contents(name)
                shown["metadata"]["resourceVersion"] = last["metadata"]["resourceVersion"]
                return shown, False
            return last, True
        if plan.kubelet:
            self.delete(
                rt,
                namespace,
                name,
                {"gracePeriodSeconds": 0, "preconditions": {"uid": old["metadata"]["uid"]}},
            )
        return json_copy(shown), False

    def _delete_namespace_contents(self, namespace: str) -> None:
        # The namespace controller's job, done at once: objects with finalizers are only
        # marked for deletion, as the controller would leave them.
        done: set[tuple[str, str]] = set()
        for rt in self.types:
            # One storage per group-resource: delete through its first served version only.
            if not rt.namespaced or rt.group_resource in done:
                continue
            done.add(rt.group_resource)
            for key, _obj in list(self.store.items(rt.group_resource)):
                if key[0] == namespace:
                    self.delete(rt, namespace, key[1])

    def ensure_default_namespaces(self) -> None:
        """Create the namespaces every cluster starts with (default, kube-system, ...)."""
        ns_type = self.find("", "v1", "namespaces")
        assert ns_type is not None
        for name in DEFAULT_NAMESPACES:
            if self.store.get(ns_type.group_resource, ("", name)) is None:
                self.create(ns_type, "", {"metadata": {"name": name}}, manager="kube-apiserver")
