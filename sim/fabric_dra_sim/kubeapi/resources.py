"""The resource types the emulator serves, and the discovery documents built from them.

One :class:`ResourceType` per (group, version, plural). Discovery follows kube-apiserver's
``/api``, ``/apis``, ``/apis/<group>`` and ``/apis/<group>/<version>`` documents
(k8s.io/apimachinery pkg/apis/meta/v1 types.go: APIVersions, APIGroupList, APIResourceList).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class ResourceType:
    """A served resource: ``group`` ('' for core), ``version``, ``plural``, ``kind``.

    ``namespaced``: namespace-scoped; ``subresources``: e.g. ("status",); ``has_spec``: spec
    changes bump ``metadata.generation``; ``reset_status_on_create``: the strategy clears
    status on create (true for claims, pods, scheduling contexts; false for nodes);
    ``selectable``: extra field-selector labels beyond metadata.name/namespace;
    ``returns_deleted_object``: DELETE answers with the object instead of a Success Status
    (the registry's ReturnDeletedObject, visible in the OpenAPI return types).
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: tuple[str, ...] = ()
    has_spec: bool = True
    reset_status_on_create: bool = False
    short_names: tuple[str, ...] = ()
    selectable: tuple[str, ...] = ()
    returns_deleted_object: bool = False

    @property
    def api_version(self) -> str:
        """``group/version`` or ``version`` for the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> tuple[str, str]:
        """The storage key: objects of all versions of a group-resource share one name space."""
        return (self.group, self.plural)

    @property
    def has_status(self) -> bool:
        """True when writes to the main endpoint ignore ``status`` (a status subresource)."""
        return "status" in self.subresources


def _resource_types(version: str) -> list[ResourceType]:
    g = RESOURCE_GROUP
    out = [
        ResourceType(
            g,
            version,
            "resourceslices",
            "ResourceSlice",
            False,
            selectable=("spec.driver", "spec.nodeName"),
            returns_deleted_object=True,
        ),
        ResourceType(
            g,
            version,
            "resourceclaims",
            "ResourceClaim",
            True,
            ("status",),
            reset_status_on_create=True,
            returns_deleted_object=True,
        ),
        ResourceType(
            g, version, "deviceclasses", "DeviceClass", False, returns_deleted_object=True
        ),
        ResourceType(
            g,
            version,
            "resourceclaimtemplates",
            "ResourceClaimTemplate",
            True,
            returns_deleted_object=True,
        ),
    ]
    if version == "v1alpha3":
        out.append(
            ResourceType(
                g,
                version,
                "podschedulingcontexts",
                "PodSchedulingContext",
                True,
                ("status",),
                reset_status_on_create=True,
                returns_deleted_object=True,
            )
        )
    return out


def served_types(resource_versions: Sequence[str]) -> list[ResourceType]:
    """Every served resource type for the given resource.k8s.io versions (in that order).

    Raises ValueError for an unknown version.
    """
    out = [
        # ReturnDeletedObject per kind: k8s.io/kubernetes pkg/registry/<group>/<kind>/storage
        # (namespaces, pods and every resource.k8s.io kind; not nodes, events, leases).
        ResourceType(
            "",
            "v1",
            "namespaces",
            "Namespace",
            False,
            ("status",),
            short_names=("ns",),
            selectable=("status.phase",),
            returns_deleted_object=True,
        ),
        ResourceType(
            "",
            "v1",
            "nodes",
            "Node",
            False,
            ("status",),
            short_names=("no",),
            selectable=("spec.unschedulable",),
        ),
        ResourceType(
            "",
            "v1",
            "pods",
            "Pod",
            True,
            ("status", "binding"),
            short_names=("po",),
            reset_status_on_create=True,
            returns_deleted_object=True,
            selectable=("spec.nodeName", "spec.schedulerName", "status.phase"),
        ),
        ResourceType(
            "",
            "v1",
            "events",
            "Event",
            True,
            has_spec=False,
            short_names=("ev",),
            selectable=(
                "involvedObject.kind",
                "involvedObject.name",
                "involvedObject.namespace",
                "involvedObject.uid",
                "reason",
                "type",
            ),
        ),
        ResourceType(
            "events.k8s.io", "v1", "events", "Event", True, has_spec=False, short_names=("ev",)
        ),
        ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True, has_spec=False),
    ]
    for version in resource_versions:
        if version not in RESOURCE_VERSIONS:
            raise ValueError(
                f"unknown resource.k8s.io version {version!r}; "
                f"valid: {', '.join(RESOURCE_VERSIONS)}"
            )
        out.extend(_resource_types(version))
    return out


def _group_versions(types: Sequence[ResourceType]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for rt in types:
        if rt.group:
            versions = groups.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
    return groups


def api_versions() -> dict[str, Any]:
    """``GET /api``: the core APIVersions document."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}
        ],
    }


def _group_doc(group: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(types: Sequence[ResourceType]) -> dict[str, Any]:
    """``GET /apis``: APIGroupList; preferredVersion is the first served version."""
    groups = _group_versions(types)
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_doc(g, vs) for g, vs in groups.items()],
    }


def api_group(types: Sequence[ResourceType], group: str) -> dict[str, Any] | None:
    """``GET /apis/<group>``: APIGroup, or None when the group is not served."""
    versions = _group_versions(types).get(group)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(group, versions)}


def api_resource_list(
    types: Sequence[ResourceType], group: str, version: str
) -> dict[str, Any] | None:
    """``GET /api/v1`` or ``/apis/<group>/<version>``: APIResourceList, None if not served.

    Subresources appear as ``<plural>/<sub>`` entries with get/patch/update verbs
    (``pods/binding`` has create only).
    """
    selected = [rt for rt in types if rt.group == group and rt.version == version]
    if not selected:
        return None
    resources: list[dict[str, Any]] = []
    for rt in selected:
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.kind.lower(),
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(VERBS),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        resources.append(entry)
        for sub in rt.subresources:
            sub_verbs = ["create"] if sub == "binding" else ["get", "patch", "update"]
            sub_kind = "Binding" if sub == "binding" else rt.kind
            resources.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": sub_kind,
                    "verbs": sub_verbs,
                }
            )
    gv = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }
