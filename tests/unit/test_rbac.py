"""The emulator's RBAC: request attributes, rule matching, bindings and the Forbidden answer, and
what deploy/base/rbac.yaml grants the controller's service account."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fabric_dra_sim.kubeapi.rbac import (
    PolicyRule,
    RbacPolicy,
    RequestAttributes,
    request_attributes,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SA = "system:serviceaccount:fabric-dra:fabric-dra"
RESOURCE = "resource.k8s.io"


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        (
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices",
            {},
            RequestAttributes("list", RESOURCE, "resourceslices"),
        ),
        (
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices",
            {"watch": "True"},
            RequestAttributes("watch", RESOURCE, "resourceslices"),
        ),
        (
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices/s1",
            {},
            RequestAttributes("get", RESOURCE, "resourceslices", name="s1"),
        ),
        (
            "POST",
            "/apis/resource.k8s.io/v1/resourceslices",
            {},
            RequestAttributes("create", RESOURCE, "resourceslices"),
        ),
        (
            "PUT",
            "/apis/resource.k8s.io/v1/resourceslices/s1",
            {},
            RequestAttributes("update", RESOURCE, "resourceslices", name="s1"),
        ),
        (
            "DELETE",
            "/apis/resource.k8s.io/v1/resourceslices/s1",
            {},
            RequestAttributes("delete", RESOURCE, "resourceslices", name="s1"),
        ),
        (
            "DELETE",
            "/apis/resource.k8s.io/v1/resourceslices",
            {},
            RequestAttributes("deletecollection", RESOURCE, "resourceslices"),
        ),
        (
            "PATCH",
            "/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims/c1/status",
            {},
            RequestAttributes("patch", RESOURCE, "resourceclaims", "status", "ns1", "c1"),
        ),
        (
            "GET",
            "/apis/resource.k8s.io/v1/resourceclaims",
            {},
            RequestAttributes("list", RESOURCE, "resourceclaims"),
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods",
            {"fieldSelector": "metadata.name=p1"},
            RequestAttributes("list", "", "pods", namespace="default", name="p1"),
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods",
            {"fieldSelector": "metadata.name==p1", "watch": "true"},
            RequestAttributes("watch", "", "pods", namespace="default", name="p1"),
        ),
        (
            "GET",
            "/api/v1/pods",
            {"fieldSelector": "spec.nodeName=n1"},
            RequestAttributes("list", "", "pods"),
        ),
        (
            "POST",
            "/api/v1/namespaces/default/pods/p1/binding",
            {},
            RequestAttributes("create", "", "pods", "binding", "default", "p1"),
        ),
        (
            "GET",
            "/api/v1/namespaces/kube-system",
            {},
            RequestAttributes("get", "", "namespaces", namespace="kube-system", name="kube-system"),
        ),
        (
            "PUT",
            "/api/v1/namespaces/ns1/status",
            {},
            RequestAttributes("update", "", "namespaces", "status", "ns1", "ns1"),
        ),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/fabric-dra/leases/l1",
            {},
            RequestAttributes(
                "update", "coordination.k8s.io", "leases", namespace="fabric-dra", name="l1"
            ),
        ),
    ],
)
def test_request_attributes_follow_the_api_servers_request_info(
    method: str,
    path: str,
    query: dict[str, str],
    expected: RequestAttributes,
) -> None:
    assert request_attributes(method, path, query) == expected


@pytest.mark.parametrize(
    "path",
    [
        "/api",
        "/api/v1",
        "/apis",
        "/apis/resource.k8s.io",
        "/apis/resource.k8s.io/v1",
        "/version",
        "/healthz",
    ],
)
def test_discovery_and_health_are_not_resource_requests(path: str) -> None:
    assert request_attributes("GET", path, {}) is None


def _rule(**fields: Any) -> PolicyRule:
    return PolicyRule.from_dict(fields)


@pytest.mark.parametrize(
    ("rule", "attributes", "allowed"),
    [
        (
            _rule(apiGroups=[""], resources=["pods"], verbs=["get"]),
            RequestAttributes("get", "", "pods", name="p"),
            True,
        ),
        (
            _rule(apiGroups=[""], resources=["pods"], verbs=["get"]),
            RequestAttributes("list", "", "pods"),
            False,
        ),
        (
            _rule(apiGroups=["*"], resources=["*"], verbs=["*"]),
            RequestAttributes("delete", RESOURCE, "resourceclaims", name="c"),
            True,
        ),
        (
            _rule(apiGroups=[RESOURCE], resources=["resourceclaims"], verbs=["update"]),
            RequestAttributes("update", RESOURCE, "resourceclaims", "status", name="c"),
            False,
        ),
        (
            _rule(apiGroups=[RESOURCE], resources=["resourceclaims/status"], verbs=["update"]),
            RequestAttributes("update", RESOURCE, "resourceclaims", name="c"),
            False,
        ),
        (
            _rule(apiGroups=[RESOURCE], resources=["*/status"], verbs=["update"]),
            RequestAttributes("update", RESOURCE, "resourceclaims", "status", name="c"),
            True,
        ),
        (
            _rule(apiGroups=[""], resources=["pods"], verbs=["get"]),
            RequestAttributes("get", "apps", "pods", name="p"),
            False,
        ),
        (
            _rule(apiGroups=[""], resources=["pods"], verbs=["get"], resourceNames=["p"]),
            RequestAttributes("get", "", "pods", name="p"),
            True,
        ),
        (
            _rule(apiGroups=[""], resources=["pods"], verbs=["get"], resourceNames=["p"]),
            RequestAttributes("get", "", "pods", name="q"),
            False,
        ),
        # A named rule never allows a request without a name (list, create).
        (
            _rule(apiGroups=[""], resources=["pods"], verbs=["list"], resourceNames=["p"]),
            RequestAttributes("list", "", "pods"),
            False,
        ),
    ],
)
def test_rules_match_verb_group_resource_and_name(
    rule: PolicyRule,
    attributes: RequestAttributes,
    allowed: bool,
) -> None:
    assert rule.matches(attributes) is allowed


def _binding(
    kind: str,
    name: str,
    role_kind: str,
    role: str,
    subjects: list[dict[str, str]],
    namespace: str = "",
) -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": subjects,
    }


def _cluster_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": rules,
    }


POD_READER = _cluster_role(
    "pod-reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
)
LIST_PODS_IN = RequestAttributes("list", "", "pods", namespace="team-a")


def test_a_role_binding_grants_a_cluster_role_only_in_its_namespace() -> None:
    policy = RbacPolicy.from_objects(
        [
            POD_READER,
            _binding(
                "RoleBinding",
                "b",
                "ClusterRole",
                "pod-reader",
                [{"kind": "User", "name": "alice"}],
                namespace="team-a",
            ),
        ]
    )
    assert policy.allows("alice", LIST_PODS_IN)
    assert not policy.allows("alice", RequestAttributes("list", "", "pods", namespace="team-b"))
    assert not policy.allows("alice", RequestAttributes("list", "", "pods"))
    assert not policy.allows("bob", LIST_PODS_IN)


def test_a_cluster_role_binding_grants_everywhere_and_groups_count() -> None:
    policy = RbacPolicy.from_objects(
        [
            POD_READER,
            _binding(
                "ClusterRoleBinding",
                "b",
                "ClusterRole",
                "pod-reader",
                [{"kind": "Group", "name": "system:serviceaccounts:team-a"}],
            ),
        ]
    )
    assert policy.allows("system:serviceaccount:team-a:app", LIST_PODS_IN)
    assert policy.allows("system:serviceaccount:team-a:app", RequestAttributes("list", "", "pods"))
    assert not policy.allows("system:serviceaccount:team-b:app", LIST_PODS_IN)
    assert not policy.allows("alice", LIST_PODS_IN)


def test_a_service_account_subject_without_namespace_takes_the_bindings() -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "r", "namespace": "team-a"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
    }
    policy = RbacPolicy.from_objects(
        [
            role,
            _binding(
                "RoleBinding",
                "b",
                "Role",
                "r",
                [{"kind": "ServiceAccount", "name": "app"}],
                namespace="team-a",
            ),
        ]
    )
    assert policy.allows("system:serviceaccount:team-a:app", LIST_PODS_IN)
    assert policy.namespaces == ["team-a"]


def test_other_kinds_are_ignored_and_a_role_without_namespace_is_refused() -> None:
    policy = RbacPolicy.from_objects(
        [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}]
    )
    assert policy.cluster_role_names == []
    with pytest.raises(ValueError, match=r"Role 'r' has no metadata\.namespace"):
        RbacPolicy.from_objects(
            [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "r"},
                }
            ]
        )


def test_from_manifests_names_the_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [unclosed\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: not valid YAML"):
        RbacPolicy.from_manifests([tmp_path])
    with pytest.raises(FileNotFoundError, match="missing"):
        RbacPolicy.from_manifests([tmp_path / "missing"])


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        (
            RequestAttributes("create", RESOURCE, "resourceslices"),
            'resourceslices.resource.k8s.io is forbidden: User "u" cannot create resource '
            '"resourceslices" in API group "resource.k8s.io" at the cluster scope',
        ),
        (
            RequestAttributes("delete", RESOURCE, "resourceclaims", namespace="ns", name="c"),
            'resourceclaims.resource.k8s.io "c" is forbidden: User "u" cannot delete resource '
            '"resourceclaims" in API group "resource.k8s.io" in the namespace "ns"',
        ),
        (
            RequestAttributes("update", "", "pods", "status", "ns", "p"),
            'pods "p" is forbidden: User "u" cannot update resource "pods/status" in API group '
            '"" in the namespace "ns"',
        ),
    ],
)
def test_forbidden_reads_like_the_api_server(attributes: RequestAttributes, message: str) -> None:
    err = attributes.forbidden("u")
    body = err.body()
    assert (err.code, body["reason"], body["status"]) == (403, "Forbidden", "Failure")
    assert body["message"] == message
    assert body["details"]["kind"] == attributes.resource
    assert body["details"]["name"] == attributes.name


# -- what deploy/ grants the controller ---------------------------------------------------------


@pytest.fixture(scope="module")
def deployed() -> RbacPolicy:
    return RbacPolicy.from_manifests([DEPLOY / "base" / "rbac.yaml"])


@pytest.fixture(scope="module")
def deployed_with_controlplane() -> RbacPolicy:
    return RbacPolicy.from_manifests([DEPLOY / "base" / "rbac.yaml", DEPLOY / "controlplane"])


STRUCTURED_ALLOWED = [
    *(
        RequestAttributes(v, RESOURCE, "resourceslices", name=n)
        for v, n in [
            ("get", "s"),
            ("list", ""),
            ("watch", ""),
            ("create", ""),
            ("update", "s"),
            ("delete", "s"),
        ]
    ),
    *(
        RequestAttributes(v, RESOURCE, "resourceclaims", namespace=ns, name=n)
        for v, ns, n in [("get", "a", "c"), ("list", "", ""), ("watch", "", ""), ("list", "a", "")]
    ),
    RequestAttributes("update", RESOURCE, "resourceclaims", "status", "a", "c"),
    RequestAttributes("patch", RESOURCE, "resourceclaims", "status", "a", "c"),
    RequestAttributes(
        "arbitrary-node:update", RESOURCE, "resourceclaims", "driver", "a", "fabric.example.com"
    ),
    RequestAttributes(
        "arbitrary-node:patch", RESOURCE, "resourceclaims", "driver", "a", "fabric.example.com"
    ),
    *(
        RequestAttributes(v, RESOURCE, "deviceclasses", name=n)
        for v, n in [("get", "gpu"), ("list", ""), ("watch", "")]
    ),
    *(
        RequestAttributes(v, "", "nodes", name=n)
        for v, n in [("get", "n1"), ("list", ""), ("watch", "")]
    ),
    *(
        RequestAttributes(v, "", "pods", namespace=ns, name=n)
        for v, ns, n in [("get", "a", "p"), ("list", "", ""), ("watch", "", "")]
    ),
    *(
        RequestAttributes(v, g, "events", namespace="a", name=n)
        for g in ("", "events.k8s.io")
        for v, n in [("create", ""), ("patch", "e")]
    ),
    *(
        RequestAttributes(v, "", "events", namespace=ns)
        for v in ("list", "watch")
        for ns in ("", "a")
    ),
    *(
        RequestAttributes(v, "coordination.k8s.io", "leases", namespace="fabric-dra", name=n)
        for v, n in [("get", "l"), ("create", ""), ("update", "l")]
    ),
]

STRUCTURED_DENIED = [
    RequestAttributes("patch", RESOURCE, "resourceslices", name="s"),
    RequestAttributes("deletecollection", RESOURCE, "resourceslices"),
    RequestAttributes("create", RESOURCE, "resourceclaims", namespace="a"),
    RequestAttributes("delete", RESOURCE, "resourceclaims", namespace="a", name="c"),
    RequestAttributes(
        "arbitrary-node:update", RESOURCE, "resourceclaims", "driver", "a", "other.example.com"
    ),
    RequestAttributes(
        "associated-node:update", RESOURCE, "resourceclaims", "driver", "a", "fabric.example.com"
    ),
    RequestAttributes("update", RESOURCE, "resourceclaims", "binding", "a", "c"),
    RequestAttributes("create", RESOURCE, "deviceclasses"),
    RequestAttributes("create", "", "nodes"),
    RequestAttributes("update", "", "nodes", name="n1"),
    RequestAttributes("update", "", "pods", namespace="a", name="p"),
    RequestAttributes("get", "", "secrets", namespace="fabric-dra", name="fabric-dra"),
    RequestAttributes("get", "", "events", namespace="a", name="e"),
    RequestAttributes("list", "events.k8s.io", "events"),
    RequestAttributes("delete", "", "events", namespace="a", name="e"),
    RequestAttributes("delete", "coordination.k8s.io", "leases", namespace="fabric-dra", name="l"),
    RequestAttributes("get", "coordination.k8s.io", "leases", namespace="kube-system", name="l"),
    RequestAttributes("create", RESOURCE, "podschedulingcontexts", namespace="a"),
    RequestAttributes("delete", RESOURCE, "podschedulingcontexts", namespace="a", name="p"),
]

CONTROLPLANE_ONLY = [
    RequestAttributes("get", RESOURCE, "podschedulingcontexts", namespace="a", name="p"),
    RequestAttributes("list", RESOURCE, "podschedulingcontexts"),
    RequestAttributes("watch", RESOURCE, "podschedulingcontexts"),
    RequestAttributes("update", RESOURCE, "podschedulingcontexts", "status", "a", "p"),
    RequestAttributes("patch", RESOURCE, "podschedulingcontexts", "status", "a", "p"),
    RequestAttributes("update", RESOURCE, "resourceclaims", namespace="a", name="c"),
    RequestAttributes("patch", RESOURCE, "resourceclaims", namespace="a", name="c"),
]


def _id(attributes: RequestAttributes) -> str:
    resource = attributes.resource + (
        f"/{attributes.subresource}" if attributes.subresource else ""
    )
    return (
        f"{attributes.verb} {attributes.api_group or 'core'} {resource} "
        f"{attributes.namespace or '-'} {attributes.name or '-'}"
    )


@pytest.mark.parametrize("attributes", STRUCTURED_ALLOWED, ids=_id)
def test_the_controller_may_do_what_structured_mode_needs(
    deployed: RbacPolicy,
    attributes: RequestAttributes,
) -> None:
    assert deployed.allows(SA, attributes)


@pytest.mark.parametrize("attributes", STRUCTURED_DENIED, ids=_id)
def test_the_controller_may_do_nothing_more_even_with_the_control_plane_role(
    deployed_with_controlplane: RbacPolicy,
    attributes: RequestAttributes,
) -> None:
    assert not deployed_with_controlplane.allows(SA, attributes)


@pytest.mark.parametrize("attributes", CONTROLPLANE_ONLY, ids=_id)
def test_control_plane_extras_come_only_with_the_control_plane_role(
    deployed: RbacPolicy,
    deployed_with_controlplane: RbacPolicy,
    attributes: RequestAttributes,
) -> None:
    assert not deployed.allows(SA, attributes)
    assert deployed_with_controlplane.allows(SA, attributes)


def test_other_service_accounts_get_nothing(deployed_with_controlplane: RbacPolicy) -> None:
    for attributes in STRUCTURED_ALLOWED + CONTROLPLANE_ONLY:
        assert not deployed_with_controlplane.allows(
            "system:serviceaccount:default:default", attributes
        )
