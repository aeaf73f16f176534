"""Node -> fabric host mapping."""

from __future__ import annotations

from typing import Any

import pytest

from app.hostmap import HostIndex, HostRef, host_for_node

INDEX = HostIndex.build([
    HostRef("sys-1", "node-a.dc1.example.com"),
    HostRef("sys-2", "NODE-B"),
    HostRef("sys-3", "dup.one.example"),
    HostRef("sys-4", "dup.two.example"),
    HostRef("sys-5", None),
])


def node(name: str, *, labels: dict | None = None, annotations: dict | None = None,
         provider_id: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"providerID": provider_id} if provider_id else {}}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (node("node-a.dc1.example.com"), "sys-1"),
        (node("node-a"), "sys-1"),
        (node("x", labels={"kubernetes.io/hostname": "node-b"}), "sys-2"),
        (node("NODE-A"), "sys-1"),
        (node("dup"), None),  # short name shared by two hosts: ambiguous
        (node("dup.one.example"), "sys-3"),
        (node("stranger"), None),
    ],
)
def test_hostname_rule(value: dict, expected: str | None) -> None:
    assert host_for_node(value, INDEX, "hostname", "") == expected


def test_label_and_annotation_rules() -> None:
    key = "fabric-dra.io/host-id"
    assert host_for_node(node("n", labels={key: "sys-5"}), INDEX, "label", key) == "sys-5"
    assert host_for_node(node("n", labels={key: "sys-9"}), INDEX, "label", key) is None
    assert host_for_node(node("n", annotations={key: "sys-2"}), INDEX, "annotation", key) == \
        "sys-2"
    assert host_for_node(node("n"), INDEX, "annotation", key) is None


@pytest.mark.parametrize(
    ("provider_id", "expected"),
    [("redfish://fm/Systems/sys-4", "sys-4"), ("sys-3", "sys-3"), ("aws:///us-east-1a/i-1", None),
     ("", None)],
)
def test_provider_id_rule(provider_id: str, expected: str | None) -> None:
    assert host_for_node(node("n", provider_id=provider_id), INDEX, "provider_id", "") == expected


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown host match rule"):
        host_for_node(node("n"), INDEX, "magic", "")
