"""Node -> fabric host mapping, and identities shared by several hosts."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.hostmap import (
    Ambiguity,
    AmbiguityLog,
    HostIndex,
    HostRef,
    ambiguities,
    ambiguity_for_node,
    host_for_node,
    host_ref_for_node,
    node_identity,
    same_node_identity,
)

INDEX = HostIndex.build(
    [
        HostRef("sys-1", "node-a.dc1.example.com"),
        HostRef("sys-2", "NODE-B"),
        HostRef("sys-3", "dup.one.example"),
        HostRef("sys-4", "dup.two.example"),
        HostRef("sys-5", None),
    ],
    report=None,
)


def node(
    name: str,
    *,
    labels: dict | None = None,
    annotations: dict | None = None,
    provider_id: str | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"providerID": provider_id} if provider_id else {},
    }


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
    assert host_for_node(node("n", annotations={key: "sys-2"}), INDEX, "annotation", key) == "sys-2"
    assert host_for_node(node("n"), INDEX, "annotation", key) is None


@pytest.mark.parametrize(
    ("provider_id", "expected"),
    [
        ("redfish://fm/Systems/sys-4", "sys-4"),
        ("sys-3", "sys-3"),
        ("aws:///us-east-1a/i-1", None),
        ("", None),
    ],
)
def test_provider_id_rule(provider_id: str, expected: str | None) -> None:
    assert host_for_node(node("n", provider_id=provider_id), INDEX, "provider_id", "") == expected


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown host match rule"):
        host_for_node(node("n"), INDEX, "magic", "")


# --------------------------------------------------------------------------- shared identities
PLACEHOLDERS = [
    HostRef("sys-1", "localhost"),
    HostRef("sys-2", "LocalHost"),
    HostRef("sys-3", "localhost"),
    HostRef("sys-4", "real-node.example.com"),
]


@pytest.mark.parametrize("name", ["localhost", "LOCALHOST", "localhost.cluster.local"])
def test_a_hostname_shared_by_several_hosts_maps_no_node(name: str) -> None:
    index = HostIndex.build(PLACEHOLDERS, report=None)
    assert host_for_node(node(name), index, "hostname", "") is None
    assert (
        host_for_node(node("x", labels={"kubernetes.io/hostname": name}), index, "hostname", "")
        is None
    )
    assert host_for_node(node("real-node"), index, "hostname", "") == "sys-4"


def test_the_index_records_shared_hostnames_with_their_hosts() -> None:
    index = HostIndex.build(PLACEHOLDERS, report=None)
    assert index.ambiguous == {"localhost": ("sys-1", "sys-2", "sys-3")}
    assert "localhost" not in index.by_hostname and "localhost" not in index.by_short
    assert set(index.by_hostname) == {"real-node.example.com"}


def test_the_report_lists_each_shared_value_once() -> None:
    index = HostIndex.build(
        [
            *PLACEHOLDERS,
            HostRef("sys-5", "placeholder.localdomain"),
            HostRef("sys-6", "placeholder.localdomain"),
            HostRef("sys-7", "web.a.example"),
            HostRef("sys-8", "web.b.example"),
        ],
        report=None,
    )
    assert ambiguities(index) == (
        Ambiguity("hostname", "localhost", ("sys-1", "sys-2", "sys-3")),
        Ambiguity("hostname", "placeholder.localdomain", ("sys-5", "sys-6")),
        # "placeholder" is shared by exactly sys-5 and sys-6: the line above says it already.
        Ambiguity("short hostname", "web", ("sys-7", "sys-8")),
    )
    assert (
        ambiguities(index)[0].message
        == "hostname 'localhost' is shared by hosts sys-1, sys-2, sys-3"
    )
    assert ambiguities(index)[0].to_json() == {
        "key": "hostname",
        "value": "localhost",
        "hosts": ["sys-1", "sys-2", "sys-3"],
    }
    assert ambiguities(HostIndex.build([HostRef("a", "a"), HostRef("b", None)], report=None)) == ()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (node("localhost"), Ambiguity("hostname", "localhost", ("sys-1", "sys-2", "sys-3"))),
        (
            node("n", labels={"kubernetes.io/hostname": "LocalHost"}),
            Ambiguity("hostname", "localhost", ("sys-1", "sys-2", "sys-3")),
        ),
        (
            node("localhost.cluster.local"),
            Ambiguity("short hostname", "localhost", ("sys-1", "sys-2", "sys-3")),
        ),
        (node("web"), Ambiguity("short hostname", "web", ("sys-7", "sys-8"))),
        (node("web.a.example"), None),  # maps to sys-7 by its full name
        (node("stranger"), None),  # unmapped, but no shared identity is involved
    ],
)
def test_an_unmapped_node_is_told_which_hosts_share_its_name(
    value: dict[str, Any], expected: Ambiguity | None
) -> None:
    index = HostIndex.build(
        [*PLACEHOLDERS, HostRef("sys-7", "web.a.example"), HostRef("sys-8", "web.b.example")],
        report=None,
    )
    assert ambiguity_for_node(value, index, "hostname", "") == expected


def test_a_host_id_reported_by_two_backends_maps_no_node() -> None:
    key = "fabric-dra.io/host-id"
    index = HostIndex.build(
        [HostRef("sys-1", "a"), HostRef("sys-1", "b"), HostRef("sys-2", "c")], report=None
    )
    shared = Ambiguity("host id", "sys-1", ("sys-1", "sys-1"))
    assert ambiguities(index) == (shared,)
    assert shared.message == "host id 'sys-1' is reported by 2 hosts"
    assert host_for_node(node("n", labels={key: "sys-1"}), index, "label", key) is None
    assert ambiguity_for_node(node("n", labels={key: "sys-1"}), index, "label", key) == shared
    assert (
        host_for_node(node("n", provider_id="fm://Systems/sys-1"), index, "provider_id", "") is None
    )
    assert host_for_node(node("a"), index, "hostname", "") is None
    assert ambiguity_for_node(node("a"), index, "hostname", "") == shared
    assert host_for_node(node("n", labels={key: "sys-2"}), index, "label", key) == "sys-2"
    assert ambiguity_for_node(node("n", labels={key: "sys-9"}), index, "label", key) is None


def test_shared_identities_are_logged_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    report = AmbiguityLog(logging.getLogger("test.hostmap"))
    caplog.set_level(logging.INFO, logger="test.hostmap")
    for _ in range(3):
        HostIndex.build(PLACEHOLDERS, report=report)
    assert [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records] == [
        ("WARNING", "hostname 'localhost' is shared by hosts sys-1, sys-2, sys-3")
    ]

    caplog.clear()
    more = [
        *PLACEHOLDERS,
        HostRef("sys-9", "localhost"),
        HostRef("sys-10", "x"),
        HostRef("sys-11", "X"),
    ]
    HostIndex.build(more, report=report)
    HostIndex.build(more, report=report)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "hostname 'localhost' is shared by hosts sys-1, sys-2, sys-3, sys-9",
        "hostname 'x' is shared by hosts sys-10, sys-11",
    ]
    assert all(r.levelname == "WARNING" for r in caplog.records)

    caplog.clear()
    HostIndex.build(PLACEHOLDERS[3:], report=report)
    HostIndex.build(PLACEHOLDERS[3:], report=report)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "hostname 'localhost' is no longer shared by several hosts"),
        ("INFO", "hostname 'x' is no longer shared by several hosts"),
    ]


def test_build_logs_through_the_hostmap_logger_by_default(caplog: pytest.LogCaptureFixture) -> None:
    # A value no other test uses, so the process-wide "last reported" set surely changes.
    name = f"placeholder-{uuid.uuid4().hex[:8]}"
    hosts = [HostRef("sys-1", name), HostRef("sys-2", name)]
    caplog.set_level(logging.WARNING, logger="app.hostmap")
    HostIndex.build(hosts)
    HostIndex.build(hosts)
    HostIndex.build(hosts, report=None)
    assert [(r.name, r.getMessage().split(":")[0]) for r in caplog.records] == [
        ("app.hostmap", f"hostname {name!r} is shared by hosts sys-1, sys-2")
    ]


HOSTNAMES = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "A", "B"]), st.booleans()), max_size=8
)


@given(HOSTNAMES, st.sampled_from(["a", "b", "c", "d"]))
def test_a_node_maps_to_the_one_host_with_its_name_or_to_none(
    names: list[tuple[str, bool]], wanted: str
) -> None:
    hosts = [HostRef(f"sys-{i}", name if named else None) for i, (name, named) in enumerate(names)]
    holders = [h.host_id for h in hosts if h.hostname and h.hostname.lower() == wanted]
    index = HostIndex.build(hosts, report=None)
    found = host_for_node(node(wanted), index, "hostname", "")
    assert found == (holders[0] if len(holders) == 1 else None)
    reason = ambiguity_for_node(node(wanted), index, "hostname", "")
    assert (reason is not None) == (len(holders) > 1)
    if reason is not None:
        assert reason.hosts == tuple(sorted(holders))


# ---------------------------------------------------------------- node_identity

_TEXT = st.sampled_from(["", "a", "A", "sys-1", "sys-2", "node-a", "NODE-B", "x/y", "serial-7"])
_KEYS = st.sampled_from(["kubernetes.io/hostname", "fabric.example.com/host", "other"])
_STATUS = st.fixed_dictionaries(
    {
        "conditions": st.lists(
            st.fixed_dictionaries({"type": _TEXT, "lastHeartbeatTime": _TEXT}), max_size=2
        ),
        "images": st.lists(st.fixed_dictionaries({"names": st.lists(_TEXT, max_size=2)})),
    }
)
NODES = st.builds(
    lambda name, uid, rv, labels, annotations, provider, status, extra: {
        "metadata": {
            "name": name,
            "uid": uid,
            "resourceVersion": rv,
            "labels": labels,
            "annotations": annotations,
            "managedFields": [{"manager": "kubelet"}],
            **extra,
        },
        "spec": {"podCIDR": "10.0.0.0/24", **({"providerID": provider} if provider else {})},
        "status": status,
    },
    _TEXT,
    st.sampled_from(["u1", "u2"]),
    st.sampled_from(["1", "2"]),
    st.dictionaries(_KEYS, _TEXT, max_size=3),
    st.dictionaries(_KEYS, _TEXT, max_size=3),
    st.one_of(st.none(), st.sampled_from(["aws:///zone/sys-1", "sys-2", "x/sys-3/"])),
    _STATUS,
    st.sampled_from([{}, {"deletionTimestamp": "2026-12-06T00:00:00Z"}, {"generation": 3}]),
)
RULES = st.sampled_from(["hostname", "label", "annotation", "provider_id", "serial"])
INDEX_BY_ID = HostIndex.build(
    [HostRef("sys-1", "node-a", serial="serial-7"), HostRef("sys-2", "NODE-B")], report=None
)


@given(NODES, RULES, _KEYS)
def test_a_node_cut_down_maps_to_the_same_host_under_every_rule(
    value: dict[str, Any], rule: str, key: str
) -> None:
    for index in (INDEX, INDEX_BY_ID):
        assert host_ref_for_node(node_identity(value), index, rule, key) == host_ref_for_node(
            value, index, rule, key
        )
        assert ambiguity_for_node(node_identity(value), index, rule, key) == ambiguity_for_node(
            value, index, rule, key
        )


@given(NODES)
def test_a_node_cut_down_keeps_what_an_informer_orders_it_by_and_leaves_the_node_alone(
    value: dict[str, Any],
) -> None:
    before = repr(value)
    slim = node_identity(value)
    assert repr(value) == before
    assert "status" not in slim
    assert "managedFields" not in slim["metadata"]
    for field_name in ("name", "uid", "resourceVersion", "deletionTimestamp"):
        assert slim["metadata"].get(field_name) == value["metadata"].get(field_name)
    assert (slim.get("spec") or {}).get("providerID") == value["spec"].get("providerID")


@given(NODES, NODES)
def test_two_nodes_are_the_same_identity_exactly_when_only_status_and_version_differ(
    a: dict[str, Any], b: dict[str, Any]
) -> None:
    def read(n: dict[str, Any]) -> tuple[Any, ...]:
        m = n["metadata"]
        return (
            m["name"],
            m["uid"],
            m["labels"],
            m["annotations"],
            m.get("deletionTimestamp"),
            n["spec"].get("providerID"),
        )

    assert same_node_identity(node_identity(a), node_identity(b)) == (read(a) == read(b))
    # A status update, a new resourceVersion and managedFields: the same identity.
    heartbeat = {
        **a,
        "metadata": {**a["metadata"], "resourceVersion": "99", "managedFields": []},
        "status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": "later"}]},
    }
    assert same_node_identity(node_identity(a), node_identity(heartbeat))


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"metadata": None, "spec": None},
        {"metadata": "x", "spec": []},
        {"metadata": {"name": 5, "labels": "x"}, "spec": {"providerID": 7}},
    ],
)
def test_a_malformed_node_is_cut_down_without_error(value: dict[str, Any]) -> None:
    slim = node_identity(value)
    assert "status" not in slim
    assert same_node_identity(slim, node_identity(value))
