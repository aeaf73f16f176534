"""Cluster profiles: served versions, default feature gates and schema folders per release."""

from __future__ import annotations

from importlib import resources

import pytest

from fabric_dra_sim.kubeapi import cluster
from fabric_dra_sim.kubeapi.cluster import (
    DRA_EXTENDED_RESOURCE,
    DYNAMIC_RESOURCE_ALLOCATION,
    PROFILES,
    all_gates_on,
    build_cluster,
    git_version,
    parse_feature_gates,
    parse_version,
    profile,
    resolve_gates,
    resolve_served,
)
from fabric_dra_sim.kubeapi.context import (
    DRA_ADMIN_ACCESS,
    DRA_CONSUMABLE_CAPACITY,
    DRA_CONTROL_PLANE_CONTROLLER,
    DRA_DEVICE_BINDING_CONDITIONS,
    DRA_DEVICE_TAINTS,
    DRA_PARTITIONABLE_DEVICES,
    DRA_PRIORITIZED_LIST,
    DRA_RESOURCE_CLAIM_DEVICE_STATUS,
)

ON_1_34 = {
    DRA_ADMIN_ACCESS,
    DRA_PRIORITIZED_LIST,
    DRA_RESOURCE_CLAIM_DEVICE_STATUS,
    DYNAMIC_RESOURCE_ALLOCATION,
}
ON_1_36 = ON_1_34 | {
    DRA_CONSUMABLE_CAPACITY,
    DRA_DEVICE_BINDING_CONDITIONS,
    DRA_DEVICE_TAINTS,
    DRA_PARTITIONABLE_DEVICES,
    DRA_EXTENDED_RESOURCE,
}


@pytest.mark.parametrize(
    ("version", "servable", "default", "storage", "gates_on"),
    [
        (
            "1.31",
            ("v1alpha3",),
            ("v1alpha3",),
            "v1alpha3",
            {DRA_CONTROL_PLANE_CONTROLLER, DYNAMIC_RESOURCE_ALLOCATION},
        ),
        ("1.34", ("v1", "v1beta2", "v1beta1"), ("v1",), "v1", ON_1_34),
        ("1.35", ("v1", "v1beta2", "v1beta1"), ("v1",), "v1", ON_1_34),
        ("1.36", ("v1", "v1beta2", "v1beta1"), ("v1",), "v1", ON_1_36),
        ("1.37", ("v1", "v1beta2", "v1beta1"), ("v1",), "v1", ON_1_36),
    ],
)
def test_each_release_serves_stores_and_switches_on_what_upstream_does(
    version: str,
    servable: tuple[str, ...],
    default: tuple[str, ...],
    storage: str,
    gates_on: set[str],
) -> None:
    prof = PROFILES[version]
    assert (prof.servable, prof.default_served, prof.storage_version) == (
        servable,
        default,
        storage,
    )
    assert {g for g, on in prof.gate_defaults.items() if on} == gates_on
    assert build_cluster(version).gates == frozenset(gates_on)


def test_every_profile_has_its_own_schema_folder_in_kubernetes_validate() -> None:
    root = resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")
    for prof in PROFILES.values():
        folder = root.joinpath(f"v{prof.schema_version}.0-local-strict")
        assert folder.joinpath("_definitions.json").is_file(), prof.version


def test_gates_a_release_does_not_know_are_refused_like_kube_apiserver() -> None:
    # DRAControlPlaneController was removed in 1.32; DRAAdminAccess came in 1.32.
    with pytest.raises(ValueError, match="unrecognized feature gate: DRAControlPlaneController"):
        build_cluster("1.34", {DRA_CONTROL_PLANE_CONTROLLER: True})
    with pytest.raises(ValueError, match="unrecognized feature gate: DRAAdminAccess"):
        build_cluster("1.31", {DRA_ADMIN_ACCESS: True})
    with pytest.raises(ValueError, match="unrecognized feature gate: NoSuchGate"):
        build_cluster("1.36", {"NoSuchGate": False})


@pytest.mark.parametrize(
    ("version", "gate", "locked_to"),
    [
        ("1.36", DRA_ADMIN_ACCESS, "true"),
        ("1.37", DRA_PRIORITIZED_LIST, "true"),
        ("1.37", DRA_RESOURCE_CLAIM_DEVICE_STATUS, "true"),
    ],
)
def test_a_locked_gate_cannot_leave_its_default(version: str, gate: str, locked_to: str) -> None:
    with pytest.raises(
        ValueError,
        match=f"cannot set feature gate {gate} to false, feature is locked to {locked_to}",
    ):
        build_cluster(version, {gate: False})
    assert gate in build_cluster(version, {gate: True}).gates


def test_overrides_switch_gates_on_and_off() -> None:
    gates = build_cluster("1.34", {DRA_DEVICE_TAINTS: True, DRA_ADMIN_ACCESS: False}).gates
    assert DRA_DEVICE_TAINTS in gates
    assert DRA_ADMIN_ACCESS not in gates
    assert (
        DRA_CONTROL_PLANE_CONTROLLER
        not in build_cluster("1.31", {DRA_CONTROL_PLANE_CONTROLLER: False}).gates
    )


def test_all_gates_on_leaves_locked_gates_alone_and_is_accepted() -> None:
    for version in PROFILES:
        overrides = all_gates_on(version)
        assert not set(overrides) & PROFILES[version].locked
        assert resolve_gates(PROFILES[version], overrides) == frozenset(
            PROFILES[version].gate_defaults
        )


@pytest.mark.parametrize(
    ("text", "version", "git"),
    [
        ("1.34", "1.34", "v1.34.0"),
        ("v1.34", "1.34", "v1.34.0"),
        ("v1.34.2", "1.34", "v1.34.2"),
        (" 1.31.4 ", "1.31", "v1.31.4"),
    ],
)
def test_versions_are_accepted_with_or_without_v_and_patch(
    text: str, version: str, git: str
) -> None:
    assert parse_version(text) == version
    assert git_version(text) == git


@pytest.mark.parametrize("text", ["1.33", "2.34", "v1", "latest", "", "1.34.x"])
def test_an_unsupported_version_is_one_line_naming_the_supported_ones(text: str) -> None:
    with pytest.raises(ValueError, match="unsupported Kubernetes version") as caught:
        profile(text)
    message = str(caught.value)
    assert "\n" not in message
    assert "supported: 1.31, 1.34, 1.35, 1.36, 1.37" in message


@pytest.mark.parametrize(
    ("version", "served", "message"),
    [
        ("1.34", ("v1", "v1alpha3"), "Kubernetes 1.34 cannot serve resource.k8s.io v1alpha3"),
        ("1.31", ("v1",), "Kubernetes 1.31 cannot serve resource.k8s.io v1; it serves v1alpha3"),
        ("1.34", (), "serve at least one"),
        ("1.34", ("v1", "v1"), "listed twice"),
    ],
)
def test_served_versions_the_release_cannot_serve_are_refused(
    version: str,
    served: tuple[str, ...],
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_served(profile(version), served)


def test_served_versions_keep_their_order_and_default_to_the_profile() -> None:
    assert resolve_served(profile("1.35"), ("v1beta1", "v1")) == ("v1beta1", "v1")
    assert resolve_served(profile("1.34"), None) == ("v1",)


def test_feature_gate_flags_parse_like_kube_apiserver() -> None:
    assert parse_feature_gates("DRADeviceTaints=true, DRAAdminAccess=False,") == {
        DRA_DEVICE_TAINTS: True,
        DRA_ADMIN_ACCESS: False,
    }
    assert parse_feature_gates("") == {}
    with pytest.raises(ValueError, match="missing bool value"):
        parse_feature_gates("DRADeviceTaints")
    with pytest.raises(ValueError, match="invalid value of DRADeviceTaints=yes"):
        parse_feature_gates("DRADeviceTaints=yes")


def test_known_gates_follow_introduction_and_removal() -> None:
    assert DRA_CONTROL_PLANE_CONTROLLER in cluster.known_gates(31)
    assert DRA_CONTROL_PLANE_CONTROLLER not in cluster.known_gates(34)
    assert DRA_DEVICE_TAINTS not in cluster.known_gates(31)
    assert DRA_DEVICE_TAINTS in cluster.known_gates(34)
