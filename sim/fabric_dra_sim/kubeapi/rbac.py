"""RBAC for the API emulator: Roles, ClusterRoles and their bindings read from manifests, and
the authorization of each request made by a restricted user.

What is modelled (k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac and
k8s.io/component-helpers/auth/rbac/validation):

- ClusterRoleBindings grant a ClusterRole's rules everywhere; RoleBindings grant a Role's or a
  ClusterRole's rules in the binding's namespace only.
- Subjects: ``User`` by name, ``ServiceAccount`` (user ``system:serviceaccount:<ns>:<name>``)
  and ``Group``; a service account user is in the groups ``system:serviceaccounts``,
  ``system:serviceaccounts:<ns>`` and ``system:authenticated``.
- Rules match on verb, API group, resource (``plural`` or ``plural/subresource``; ``*`` and
  ``*/subresource``) and ``resourceNames`` (empty = every name; a named rule never matches a
  request without a name, such as list or create).
- Request attributes follow kube-apiserver's RequestInfoFactory: GET is get or list (watch with
  ``watch=true``), POST create, PUT update, PATCH patch, DELETE delete or deletecollection; a
  list or watch with the field selector ``metadata.name=<n>`` carries that name.
- Non-resource URLs (discovery, ``/version``, ``/healthz``) are allowed to every user, as the
  default ``system:discovery`` and ``system:public-info-viewer`` ClusterRoles allow them.

What is not: aggregated ClusterRoles (``aggregationRule``), ``nonResourceURLs`` rules, the
``bind``/``escalate``/``impersonate`` verbs, and the DRA "granular status" checks. Rules with
verbs the emulator never sees as a request (``arbitrary-node:update`` on
``resourceclaims/driver``) are kept and answer :meth:`RbacPolicy.allows`, like
``kubectl auth can-i``, but no request is refused for lacking them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import StatusError, qualified

RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"
RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
MANIFEST_SUFFIXES = (".yaml", ".yml")
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


@dataclass(frozen=True)
class PolicyRule:
    """One RBAC rule: verbs, API groups, resources and resource names (empty = all names)."""

    verbs: frozenset[str]
    api_groups: frozenset[str]
    resources: frozenset[str]
    resource_names: frozenset[str] = frozenset()

    @classmethod
    def from_dict(cls, rule: Mapping[str, Any]) -> PolicyRule:
        """Read a ``rules[]`` entry of a Role or ClusterRole."""
        return cls(
            frozenset(rule.get("verbs") or ()),
            frozenset(rule.get("apiGroups") or ()),
            frozenset(rule.get("resources") or ()),
            frozenset(rule.get("resourceNames") or ()),
        )

    def matches(self, attributes: RequestAttributes) -> bool:
        """True when this rule allows ``attributes`` (a resource request)."""
        if "*" not in self.verbs and attributes.verb not in self.verbs:
            return False
        if "*" not in self.api_groups and attributes.api_group not in self.api_groups:
            return False
        combined = attributes.resource + (
            f"/{attributes.subresource}" if attributes.subresource else ""
        )
        resource_ok = any(
            r in ("*", combined) or (attributes.subresource and r == f"*/{attributes.subresource}")
            for r in self.resources
        )
        if not resource_ok:
            return False
        return not self.resource_names or attributes.name in self.resource_names


@dataclass(frozen=True)
class RequestAttributes:
    """What a resource request asks to do, as the authorizer sees it."""

    verb: str
    api_group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    def forbidden(self, user: str) -> StatusError:
        """The 403 kube-apiserver answers when ``user`` may not do this.

        Source: k8s.io/apiserver pkg/endpoints/handlers/responsewriters/errors.go
        (forbiddenMessage) and apimachinery errors.NewForbidden.
        """
        shown = self.resource + (f"/{self.subresource}" if self.subresource else "")
        where = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        why = (
            f'User "{user}" cannot {self.verb} resource "{shown}" in API group '
            f'"{self.api_group}" {where}'
        )
        target = qualified(self.api_group, self.resource)
        message = (
            f'{target} "{self.name}" is forbidden: {why}'
            if self.name
            else f"{target} is forbidden: {why}"
        )
        details: dict[str, Any] = {"name": self.name, "kind": self.resource}
        if self.api_group:
            details["group"] = self.api_group
        return StatusError(403, "Forbidden", message, details)


def request_attributes(
    method: str, path: str, query: Mapping[str, str]
) -> RequestAttributes | None:
    """The attributes of a request to ``path``, or None for a non-resource URL.

    Paths: ``/api/v1/...`` and ``/apis/<group>/<version>/...``, then
    ``[namespaces/<ns>/]<resource>[/<name>[/<subresource>]]``.
    """
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        # /namespaces/<ns> and /namespaces/<ns>/status address the Namespace object itself.
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if method in ("GET", "HEAD"):
        if name:
            verb = "get"
        else:
            verb = "watch" if query.get("watch", "").lower() in ("true", "1") else "list"
            name = _name_from_field_selector(query.get("fieldSelector", ""))
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
    return RequestAttributes(verb, group, resource, subresource, namespace, name)


def _name_from_field_selector(selector: str) -> str:
    # kube-apiserver treats a list or watch of exactly one name as a request for that name, so
    # a rule with resourceNames can allow watching a single object.
    key, sep, value = selector.partition("=")
    value = value.removeprefix("=")
    if sep and key.strip() == "metadata.name" and "," not in value:
        return value.strip()
    return ""


@dataclass(frozen=True)
class _Grant:
    """The rules a binding gives its subjects, limited to ``namespace`` ('' = everywhere)."""

    namespace: str
    role_kind: str
    role_name: str
    users: frozenset[str]
    groups: frozenset[str]


class RbacPolicy:
    """Roles, ClusterRoles and bindings, and the decision for one user and request.

    Build it with :meth:`from_manifests` (files or folders of YAML) or :meth:`from_objects`.
    Objects of other kinds are ignored, so a whole deploy folder can be given.
    """

    def __init__(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self._cluster_roles: dict[str, tuple[PolicyRule, ...]] = {}
        self._roles: dict[tuple[str, str], tuple[PolicyRule, ...]] = {}
        self._grants: list[_Grant] = []
        for obj in objects:
            self._add(obj)

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]]) -> RbacPolicy:
        """A policy from parsed objects (other kinds than the RBAC ones are skipped)."""
        return cls(objects)

    @classmethod
    def from_manifests(cls, paths: Sequence[str | Path]) -> RbacPolicy:
        """A policy from YAML files, and from every ``*.yaml``/``*.yml`` file under folders.

        Raises ValueError naming the file when one is not valid YAML or an RBAC object in it
        lacks its name or namespace; FileNotFoundError for a missing path.
        """
        objects: list[Mapping[str, Any]] = []
        for path in map(Path, paths):
            if not path.exists():
                raise FileNotFoundError(f"RBAC manifests: no such file or folder: {path}")
            files = (
                sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES)
                if path.is_dir()
                else [path]
            )
            for file in files:
                try:
                    documents = list(yaml.safe_load_all(file.read_text(encoding="utf-8")))
                except yaml.YAMLError as err:
                    raise ValueError(f"RBAC manifests: {file}: not valid YAML: {err}") from err
                objects.extend(d for d in documents if isinstance(d, Mapping))
        try:
            return cls(objects)
        except ValueError as err:
            raise ValueError(f"RBAC manifests {[str(p) for p in paths]}: {err}") from err

    @property
    def cluster_role_names(self) -> list[str]:
        """The ClusterRoles loaded, sorted."""
        return sorted(self._cluster_roles)

    @property
    def namespaces(self) -> list[str]:
        """The namespaces that Roles and RoleBindings live in, sorted."""
        names = {namespace for namespace, _ in self._roles}
        names |= {grant.namespace for grant in self._grants if grant.namespace}
        return sorted(names)

    def _add(self, obj: Mapping[str, Any]) -> None:
        if obj.get("apiVersion") != RBAC_API_VERSION or obj.get("kind") not in RBAC_KINDS:
            return
        kind = obj["kind"]
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        namespace = meta.get("namespace") or ""
        if not name:
            raise ValueError(f"a {kind} has no metadata.name")
        if kind in ("Role", "RoleBinding") and not namespace:
            # kubectl would fill in the current namespace; here nothing is implied.
            raise ValueError(f"{kind} {name!r} has no metadata.namespace")
        if kind in ("Role", "ClusterRole"):
            rules = tuple(PolicyRule.from_dict(r) for r in obj.get("rules") or ())
            if kind == "Role":
                self._roles[(namespace, name)] = rules
            else:
                self._cluster_roles[name] = rules
            return
        ref = obj.get("roleRef") or {}
        users: set[str] = set()
        groups: set[str] = set()
        for subject in obj.get("subjects") or ():
            subject_kind = subject.get("kind")
            if subject_kind == "ServiceAccount":
                sa_namespace = subject.get("namespace") or namespace
                users.add(f"system:serviceaccount:{sa_namespace}:{subject.get('name')}")
            elif subject_kind == "User":
                users.add(str(subject.get("name")))
            elif subject_kind == "Group":
                groups.add(str(subject.get("name")))
        self._grants.append(
            _Grant(
                namespace if kind == "RoleBinding" else "",
                str(ref.get("kind")),
                str(ref.get("name")),
                frozenset(users),
                frozenset(groups),
            )
        )

    @staticmethod
    def groups_of(user: str) -> frozenset[str]:
        """The groups kube-apiserver puts an authenticated ``user`` in."""
        groups = {"system:authenticated"}
        prefix = "system:serviceaccount:"
        if user.startswith(prefix):
            namespace = user[len(prefix) :].partition(":")[0]
            groups |= {"system:serviceaccounts", f"system:serviceaccounts:{namespace}"}
        return frozenset(groups)

    def rules_for(self, user: str, namespace: str = "") -> list[PolicyRule]:
        """Every rule that applies to ``user`` in ``namespace`` ('' = cluster scope only)."""
        groups = self.groups_of(user)
        rules: list[PolicyRule] = []
        for grant in self._grants:
            if user not in grant.users and not groups & grant.groups:
                continue
            if grant.namespace and grant.namespace != namespace:
                continue
            if grant.role_kind == "ClusterRole":
                rules.extend(self._cluster_roles.get(grant.role_name, ()))
            elif grant.role_kind == "Role":
                rules.extend(self._roles.get((grant.namespace, grant.role_name), ()))
        return rules

    def allows(self, user: str, attributes: RequestAttributes) -> bool:
        """True when some rule bound to ``user`` allows ``attributes``."""
        return any(rule.matches(attributes) for rule in self.rules_for(user, attributes.namespace))

    def check(self, user: str, attributes: RequestAttributes) -> None:
        """Raise the 403 StatusError when ``user`` may not do ``attributes``."""
        if not self.allows(user, attributes):
            raise attributes.forbidden(user)
