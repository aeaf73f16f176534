"""Inventory validation and planning: pure functions."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import gpu, host
from hypothesis import given, settings
from hypothesis import strategies as st

from app.fabric.types import Health, Location
from app.inventory.plan import StoredItem, content_hash, plan_devices, plan_hosts
from app.inventory.validate import split_valid_devices, split_valid_hosts
from app.naming import is_dns_label


def stored(device, *, id_: int, removed: bool = False, name: str | None = None) -> StoredItem:
    return StoredItem(
        id_,
        device.vendor_id,
        content_hash(device),
        removed,
        str(device.health),
        device.host_id,
        name or f"dev-{id_}",
    )


def test_first_listing_inserts_everything_with_unique_names() -> None:
    devices = [gpu(i) for i in range(5)]
    plan = plan_devices([], devices, set(), set())
    assert len(plan.inserts) == 5 and not plan.updates and not plan.removals
    names = [n.name for n in plan.inserts]
    assert len(set(names)) == 5 and all(n and is_dns_label(n) for n in names)
    assert [e.kind for e in plan.events] == ["added"] * 5


def test_unchanged_listing_plans_no_write() -> None:
    devices = [gpu(i) for i in range(5)]
    plan = plan_devices([stored(d, id_=i) for i, d in enumerate(devices)], devices, set(), set())
    assert plan.row_writes == 0 and plan.events == ()


def test_health_change_is_one_update_with_a_health_event() -> None:
    devices = [gpu(i) for i in range(3)]
    rows = [stored(d, id_=i) for i, d in enumerate(devices)]
    listed = [devices[0], replace(devices[1], health=Health.CRITICAL), devices[2]]
    plan = plan_devices(rows, listed, set(), set())
    assert [u.stored.id for u in plan.updates] == [1]
    assert [(e.kind, e.old, e.new) for e in plan.events] == [("health", "OK", "Critical")]


def test_host_change_and_other_changes_are_recorded() -> None:
    d = gpu(1)
    plan = plan_devices([stored(d, id_=1)], [replace(d, host_id="h1")], set(), set())
    assert [(e.kind, e.old, e.new) for e in plan.events] == [("host", None, "h1")]
    plan = plan_devices([stored(d, id_=1)], [replace(d, model="X200")], set(), set())
    assert [e.kind for e in plan.events] == ["changed"]


def test_missing_device_is_removed_but_a_rejected_one_is_kept() -> None:
    a, b, c = gpu(1), gpu(2), gpu(3)
    rows = [stored(a, id_=1), stored(b, id_=2), stored(c, id_=3)]
    plan = plan_devices(rows, [a], {c.vendor_id}, set())
    assert [r.id for r in plan.removals] == [2]
    assert [(e.key, e.kind) for e in plan.events] == [(b.vendor_id, "removed")]


def test_a_rejected_attach_unit_keeps_its_devices() -> None:
    a, b = gpu(1), gpu(2)
    rows = [
        replace(stored(a, id_=1), unit=a.attach_unit),
        replace(stored(b, id_=2), unit=b.attach_unit),
    ]
    plan = plan_devices(rows, [], {a.attach_unit}, set())
    assert [r.id for r in plan.removals] == [2]


def test_removed_device_that_returns_is_updated_not_inserted() -> None:
    a = gpu(1)
    plan = plan_devices([stored(a, id_=7, removed=True)], [a], set(), set())
    assert not plan.inserts
    assert plan.updates[0].returned and plan.updates[0].stored.id == 7
    assert [e.kind for e in plan.events] == ["returned"]


def test_already_removed_device_is_not_removed_again() -> None:
    a = gpu(1)
    assert plan_devices([stored(a, id_=1, removed=True)], [], set(), set()).row_writes == 0


def test_new_names_avoid_taken_names() -> None:
    a = gpu(1)
    first = plan_devices([], [a], set(), set()).inserts[0].name
    assert first is not None
    again = plan_devices([], [a], set(), {first}).inserts[0].name
    assert again != first


def test_hosts_plan() -> None:
    h1, h2 = host(1), host(2)
    rows = [
        StoredItem(1, h1.host_id, content_hash(h1), False, "OK"),
        StoredItem(2, h2.host_id, content_hash(h2), False, "OK"),
    ]
    plan = plan_hosts(rows, [replace(h1, health=Health.WARNING), host(3)], set())
    assert [i.item.host_id for i in plan.inserts] == [host(3).host_id]
    assert [u.stored.id for u in plan.updates] == [1]
    assert [r.id for r in plan.removals] == [2]


BAD_DEVICES = [
    (replace(gpu(1), vendor_id=""), "vendor id is missing or empty", "missing-field"),
    (replace(gpu(1), vendor_id="x" * 1025), "vendor id is 1025 characters long", "bad-value"),
    (replace(gpu(1), attach_unit="  "), "attach unit is missing or empty", "missing-field"),
    (replace(gpu(1), model="m" * 256), "model is 256 characters long, at most 255", "bad-value"),
    (replace(gpu(1), serial="a\x00b"), "serial contains control characters", "bad-value"),
    (replace(gpu(1), memory_mib=-1), "memory_mib is -1, expected 0 to", "bad-value"),
    (replace(gpu(1), memory_mib=2**40), "memory_mib is 1099511627776", "bad-value"),
    (replace(gpu(1), memory_mib="80GB"), "memory_mib is str, expected an integer", "bad-type"),
    (replace(gpu(1), memory_mib=True), "memory_mib is bool, expected an integer", "bad-type"),
    (replace(gpu(1), capacity={"bytes": -5}), "capacity bytes is -5", "bad-value"),
    (
        replace(gpu(1), capacity={"bytes": 2**64}),
        "capacity bytes is 18446744073709551616",
        "bad-value",
    ),
    (
        replace(gpu(1), capacity={"bad key": 1}),
        "capacity key 'bad key' is not a C identifier",
        "bad-value",
    ),
    (replace(gpu(1), capacity=[1, 2]), "capacity is list, expected a mapping", "bad-type"),
    (replace(gpu(1), attributes={"x": 1.5}), "attribute x is float", "bad-type"),
    (replace(gpu(1), attributes={"x": "y" * 65}), "attribute x is 65 characters", "bad-value"),
    (replace(gpu(1), attributes={"n": 2**63}), "attribute n is 9223372036854775808", "bad-value"),
    (replace(gpu(1), attributes={"a" * 33: 1}), "is not a C identifier", "bad-value"),
    (
        replace(gpu(1), location=Location(rack="r" * 300)),
        "location.rack is 300 characters",
        "bad-value",
    ),
    (replace(gpu(1), uuid="u" * 65), "uuid is 65 characters long, at most 64", "bad-value"),
    (replace(gpu(1), host_id=""), "host id is missing or empty", "missing-field"),
    (replace(gpu(1), vendor_id=None), "vendor id is missing or empty", "missing-field"),
]


@pytest.mark.parametrize(("device", "reason", "kind"), BAD_DEVICES)
def test_bad_device_is_rejected_alone_with_a_reason(device, reason: str, kind: str) -> None:
    good = [gpu(10), gpu(11)]
    valid, rejected = split_valid_devices([good[0], device, good[1]])
    assert valid == good
    assert len(rejected) == 1
    assert reason in rejected[0].reason
    assert rejected[0].kind == kind


def test_unicode_text_is_accepted() -> None:
    device = replace(gpu(1), model="Ускоритель X 加速器 🚀", vendor="Ärger GmbH")
    valid, rejected = split_valid_devices([device])
    assert valid == [device] and rejected == []


def test_every_copy_of_a_duplicate_vendor_id_is_rejected() -> None:
    a = gpu(1)
    valid, rejected = split_valid_devices([a, gpu(2), replace(a, model="other")])
    assert valid == [gpu(2)]
    assert [(r.vendor_id, r.kind) for r in rejected] == [(a.vendor_id, "duplicate")] * 2
    assert "listed 2 times" in rejected[0].reason


def test_bad_and_duplicate_hosts_are_rejected_alone() -> None:
    valid, rejected = split_valid_hosts(
        [host(1), replace(host(2), host_id=""), host(3), host(3), replace(host(4), name="\x07")]
    )
    assert valid == [host(1)]
    assert sorted(r.kind for r in rejected) == [
        "bad-value",
        "duplicate",
        "duplicate",
        "missing-field",
    ]


# Property: applying a plan to the stored state gives exactly the listed state.
_indexes = st.lists(st.integers(0, 40), unique=True, max_size=25)


@settings(max_examples=150, deadline=None)
@given(
    before=_indexes,
    after=_indexes,
    sick=st.sets(st.integers(0, 40)),
    rejected=st.sets(st.integers(0, 40), max_size=5),
)
def test_plan_applied_to_stored_state_equals_listing(
    before: list[int], after: list[int], sick: set[int], rejected: set[int]
) -> None:
    old = {i: gpu(i) for i in before}
    rows = [stored(d, id_=i) for i, d in old.items()]
    listed = [
        replace(gpu(i), health=Health.CRITICAL) if i in sick else gpu(i)
        for i in after
        if i not in rejected
    ]
    rejected_keys = {gpu(i).vendor_id for i in rejected}
    plan = plan_devices(rows, listed, rejected_keys, set())

    state = {r.key: r.content_hash for r in rows}
    for new in plan.inserts:
        state[new.item.vendor_id] = new.content_hash
    for changed in plan.updates:
        state[changed.stored.key] = changed.content_hash
    for gone in plan.removals:
        del state[gone.key]

    expected = {d.vendor_id: content_hash(d) for d in listed}
    kept = {r.key: r.content_hash for r in rows if r.key in rejected_keys}
    assert state == {**kept, **expected}
    # Minimal: nothing unchanged is written.
    listed_hash = {d.vendor_id: content_hash(d) for d in listed}
    unchanged = {r.key for r in rows if listed_hash.get(r.key) == r.content_hash}
    assert not unchanged & {u.stored.key for u in plan.updates}
