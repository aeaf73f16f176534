"""The pure publisher plan: slice names, semantic comparison, classification, the generation
rule and the write order; with hypothesis properties over a fake server that applies plans."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.fabric.types import Location
from app.pools import DesiredPool, PoolConfig, PoolDevice, desired_pools, resource_slice_spec
from app.publisher.plan import (
    ExistingSlice,
    PoolPlan,
    classify,
    content_key,
    content_of,
    dropped_paths,
    existing_slice,
    expected_key,
    generate_name,
    parse_quantity,
    plan_pool,
    slice_index,
    strip_paths,
)

DRIVER = "fabric.example.com"
CONFIG = PoolConfig(driver_name=DRIVER, binds_to_node=False)
POOL = "us-east/rack-1"


def devices(
    count: int, *, tainted: Sequence[int] = (), rack: str = "rack-1", health: str = "OK"
) -> list[PoolDevice]:
    return [
        PoolDevice(
            name=f"gpu-{rack}-{i:04d}",
            device_type="gpu",
            location=Location(region="us-east", rack=rack),
            memory_mib=81920,
            health="Critical" if i in tainted else health,
        )
        for i in range(count)
    ]


def pool_of(count: int, **kw: Any) -> DesiredPool:
    return desired_pools(devices(count, **kw), CONFIG)[POOL]


class FakeServer:
    """Holds ResourceSlice objects (v1 JSON) and applies plans the way the API server would,
    checking preconditions and resourceVersions."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self._rv = itertools.count(1)
        self._names = itertools.count()

    def put(self, name: str, spec: dict[str, Any], **metadata: Any) -> dict[str, Any]:
        obj = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "resourceVersion": str(next(self._rv)),
                **metadata,
            },
            "spec": copy.deepcopy(spec),
        }
        self.objects[name] = obj
        return obj

    def existing(self, pool_name: str = POOL) -> list[ExistingSlice]:
        return [
            existing_slice(o, DRIVER)
            for o in self.objects.values()
            if o["spec"]["pool"]["name"] == pool_name
        ]

    def apply(self, plan: PoolPlan) -> None:
        for write in plan.writes:
            if write.verb == "delete":
                current = self.objects[write.name or ""]
                assert current["metadata"]["uid"] == write.uid
                assert current["metadata"]["resourceVersion"] == write.resource_version
                del self.objects[write.name or ""]
            elif write.verb == "update":
                assert write.body is not None and write.name is not None
                current = self.objects[write.name]
                assert (
                    write.body["metadata"]["resourceVersion"]
                    == current["metadata"]["resourceVersion"]
                )
                meta = {
                    k: v
                    for k, v in write.body["metadata"].items()
                    if k not in ("name", "resourceVersion")
                }
                self.put(write.name, write.body["spec"], **meta)
            else:
                assert write.body is not None
                prefix = write.body["metadata"]["generateName"]
                self.put(f"{prefix}{next(self._names):05d}", write.body["spec"])


def sync(server: FakeServer, desired: DesiredPool | None, pool_name: str = POOL) -> PoolPlan:
    plan = plan_pool(DRIVER, pool_name, desired, server.existing(pool_name))
    server.apply(plan)
    return plan


def assert_published(server: FakeServer, desired: DesiredPool) -> int:
    """Exactly the desired slices exist, one per index, at one generation; returns it."""
    found = {
        slice_index(o["metadata"]["name"], DRIVER): o
        for o in server.objects.values()
        if o["spec"]["pool"]["name"] == desired.name
    }
    assert len(found) == len(server.existing(desired.name)) == len(desired.slices)
    generations = {o["spec"]["pool"]["generation"] for o in found.values()}
    assert len(generations) == 1
    generation = generations.pop()
    for content in desired.slices:
        assert found[content.index]["spec"] == resource_slice_spec(
            DRIVER, desired, content, generation
        )
    return int(generation)


# --------------------------------------------------------------------------- names
@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("0-fabric.example.com-abcde", 0),
        ("12-fabric.example.com-x2z9q", 12),
        ("012-fabric.example.com-abcde", None),  # leading zero: not our form
        ("x-fabric.example.com-abcde", None),
        ("3-other.example.com-abcde", None),  # another driver's prefix
        ("3-fabric.example.com-", None),  # no generated suffix
        ("fabric.example.com-abcde", None),
        ("", None),
    ],
)
def test_slice_index_parses_only_names_made_from_generate_name(
    name: str, index: int | None
) -> None:
    assert slice_index(name, DRIVER) == index


def test_generate_name_round_trips_through_slice_index() -> None:
    assert slice_index(generate_name(DRIVER, 7) + "q4z2x", DRIVER) == 7


# --------------------------------------------------------------------------- comparison
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", Fraction(80 * 2**30)),
        ("81920Mi", Fraction(80 * 2**30)),
        ("1k", Fraction(1000)),
        ("1000", Fraction(1000)),
        ("500m", Fraction(1, 2)),
        ("1e3", Fraction(1000)),
        ("1.5Ki", Fraction(1536)),
        ("+2", Fraction(2)),
    ],
)
def test_quantities_parse_to_their_exact_value(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1.2.3", "1 Gi", "1GB", "abc"])
def test_a_bad_quantity_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)


def test_content_keys_ignore_quantity_spelling_empty_fields_and_taint_time_added() -> None:
    written = {
        "nodeSelector": {"a": 1},
        "devices": [
            {
                "name": "d",
                "attributes": {},
                "capacity": {"memory": {"value": "80Gi"}},
                "taints": [{"key": "k", "effect": "NoSchedule"}],
            }
        ],
    }
    returned = {
        "nodeSelector": {"a": 1},
        "devices": [
            {
                "name": "d",
                "capacity": {"memory": {"value": "81920Mi"}},
                "taints": [
                    {"key": "k", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}
                ],
            }
        ],
    }
    assert content_key(written) == content_key(returned)


def test_content_keys_see_a_changed_value_and_a_missing_device() -> None:
    base = {"devices": [{"name": "d", "attributes": {"health": {"string": "OK"}}}]}
    changed = {"devices": [{"name": "d", "attributes": {"health": {"string": "Warning"}}}]}
    assert content_key(base) != content_key(changed)
    assert content_key(base) != content_key({"devices": []})
    assert content_key({"devices": []}) == content_key({})


def test_dropped_paths_name_fields_the_server_left_out() -> None:
    sent = {
        "devices": [
            {"name": "a", "taints": [{"key": "k"}], "bindsToNode": True},
            {"name": "b", "bindingConditions": ["X"]},
        ],
        "allNodes": True,
    }
    returned = {"devices": [{"name": "a", "bindsToNode": True}, {"name": "b"}], "allNodes": True}
    assert dropped_paths(sent, returned, "spec") == {
        "spec.devices[].taints",
        "spec.devices[].bindingConditions",
    }
    assert dropped_paths(sent, sent, "spec") == set()
    assert dropped_paths({"devices": []}, {}, "spec") == set()


def test_strip_paths_removes_fields_from_every_list_element() -> None:
    content = {"devices": [{"name": "a", "taints": [1]}, {"name": "b"}]}
    assert strip_paths(content, {"devices[].taints"}) == {"devices": [{"name": "a"}, {"name": "b"}]}
    assert content["devices"][0]["taints"] == [1]  # a copy


def test_expected_key_without_dropped_taints_equals_the_key_of_the_returned_form() -> None:
    desired = pool_of(3, tainted=[1])
    # resource_slice_spec shares the device dicts with the desired pool: copy before changing.
    spec = copy.deepcopy(resource_slice_spec(DRIVER, desired, desired.slices[0], 1))
    for device in spec["devices"]:
        device.pop("taints", None)
    assert expected_key(desired, desired.slices[0]) != content_key(content_of(spec))
    assert expected_key(
        desired, desired.slices[0], frozenset({"spec.devices[].taints"})
    ) == content_key(content_of(spec))


# --------------------------------------------------------------------------- scenarios
def test_a_new_pool_is_created_at_generation_one() -> None:
    server = FakeServer()
    desired = pool_of(200)
    plan = sync(server, desired)
    assert [w.verb for w in plan.writes] == ["create", "create"]
    assert plan.generation == 1 and plan.bumped
    assert [w.body["metadata"]["generateName"] for w in plan.writes if w.body] == [
        f"0-{DRIVER}-",
        f"1-{DRIVER}-",
    ]
    assert assert_published(server, desired) == 1
    assert sync(server, desired).writes == ()


def test_one_changed_slice_is_updated_in_place_without_a_generation_bump() -> None:
    server = FakeServer()
    sync(server, pool_of(200))
    changed = desired_pools(
        [
            d
            if d.name != "gpu-rack-1-0150"
            else PoolDevice(
                d.name, d.device_type, d.location, health="Warning", memory_mib=d.memory_mib
            )
            for d in devices(200)
        ],
        CONFIG,
    )[POOL]
    plan = sync(server, changed)
    assert [(w.verb, w.index) for w in plan.writes] == [("update", 1)]
    assert not plan.bumped and plan.generation == 1
    assert assert_published(server, changed) == 1
    assert sync(server, changed).writes == ()


def test_two_changed_slices_bump_the_generation_and_rewrite_every_slice() -> None:
    server = FakeServer()
    sync(server, pool_of(300))
    changed = pool_of(300, health="Warning")
    plan = sync(server, changed)
    assert [(w.verb, w.index) for w in plan.writes] == [("update", 0), ("update", 1), ("update", 2)]
    assert plan.bumped and plan.generation == 2
    assert assert_published(server, changed) == 2


def test_growth_past_128_devices_adds_a_slice_and_bumps_the_generation() -> None:
    server = FakeServer()
    sync(server, pool_of(100))
    grown = pool_of(130)
    plan = sync(server, grown)
    assert [(w.verb, w.index) for w in plan.writes] == [("update", 0), ("create", 1)]
    assert plan.generation == 2
    assert assert_published(server, grown) == 2
    assert sync(server, grown).writes == ()


def test_a_shrinking_pool_deletes_first_then_rewrites_the_rest() -> None:
    server = FakeServer()
    sync(server, pool_of(300))
    shrunk = pool_of(100)
    plan = sync(server, shrunk)
    assert [(w.verb, w.index) for w in plan.writes] == [("delete", 1), ("delete", 2), ("update", 0)]
    # One matched slice changed (its count), no slice is new: the generation is kept.
    assert plan.generation == 1
    assert assert_published(server, shrunk) == 1


def test_a_pool_no_longer_desired_loses_every_slice() -> None:
    server = FakeServer()
    sync(server, pool_of(200))
    server.put(
        "junk", {"driver": DRIVER, "pool": {"name": POOL, "generation": 9, "resourceSliceCount": 1}}
    )
    plan = sync(server, None)
    assert [w.verb for w in plan.writes] == ["delete"] * 3 and plan.generation is None
    assert server.objects == {}
    assert sync(server, None).writes == ()


def test_deletes_carry_uid_and_resource_version_preconditions() -> None:
    server = FakeServer()
    obj = server.put(
        "7-fabric.example.com-aaaaa",
        {"driver": DRIVER, "pool": {"name": POOL, "generation": 1, "resourceSliceCount": 8}},
    )
    (write,) = plan_pool(DRIVER, POOL, None, server.existing()).writes
    assert (write.name, write.uid, write.resource_version) == (
        obj["metadata"]["name"],
        obj["metadata"]["uid"],
        obj["metadata"]["resourceVersion"],
    )


def test_leftovers_are_adopted_by_index_or_deleted() -> None:
    server = FakeServer()
    desired = pool_of(200)
    good = resource_slice_spec(DRIVER, desired, desired.slices[0], 4)
    server.put(f"0-{DRIVER}-keep1", good, labels={"team": "a"})
    server.put(f"0-{DRIVER}-dupe1", {**good, "pool": {**good["pool"], "generation": 3}})
    server.put("hand-made-slice", good)
    server.put(f"5-{DRIVER}-toohi", good)
    stale = resource_slice_spec(DRIVER, desired, desired.slices[1], 4)
    stale["pool"]["resourceSliceCount"] = 6
    server.put(f"1-{DRIVER}-count", stale)
    found = classify(desired, server.existing(), [expected_key(desired, c) for c in desired.slices])
    assert [s.name for s in found.obsolete] == [
        f"0-{DRIVER}-dupe1",
        f"5-{DRIVER}-toohi",
        "hand-made-slice",
    ]
    assert [(i, s.name) for i, s in found.unchanged] == [(0, f"0-{DRIVER}-keep1")]
    assert [(i, s.name) for i, s in found.changed] == [(1, f"1-{DRIVER}-count")]
    assert found.missing == () and found.max_generation == 4
    plan = sync(server, desired)
    assert [(w.verb, w.name) for w in plan.writes] == [
        ("delete", f"0-{DRIVER}-dupe1"),
        ("delete", f"5-{DRIVER}-toohi"),
        ("delete", "hand-made-slice"),
        ("update", f"1-{DRIVER}-count"),
    ]
    assert assert_published(server, desired) == 4
    assert server.objects[f"0-{DRIVER}-keep1"]["metadata"]["labels"] == {"team": "a"}


def test_an_update_keeps_labels_and_carries_the_resource_version() -> None:
    server = FakeServer()
    desired = pool_of(3)
    old = resource_slice_spec(DRIVER, pool_of(2), pool_of(2).slices[0], 1)
    obj = server.put(f"0-{DRIVER}-aaaaa", old, labels={"x": "y"})
    (write,) = plan_pool(DRIVER, POOL, desired, server.existing()).writes
    assert write.verb == "update" and write.body is not None
    assert write.body["metadata"] == {
        "name": obj["metadata"]["name"],
        "labels": {"x": "y"},
        "resourceVersion": obj["metadata"]["resourceVersion"],
    }


def test_slices_at_an_older_generation_than_the_pool_are_changed() -> None:
    server = FakeServer()
    desired = pool_of(200)
    for content, generation in zip(desired.slices, (3, 2), strict=True):
        server.put(
            f"{content.index}-{DRIVER}-s", resource_slice_spec(DRIVER, desired, content, generation)
        )
    plan = sync(server, desired)
    assert [(w.verb, w.index) for w in plan.writes] == [("update", 1)]
    assert plan.generation == 3 and not plan.bumped


def test_the_accepted_returned_form_counts_as_in_sync() -> None:
    server = FakeServer()
    desired = pool_of(3, tainted=[0])
    # resource_slice_spec shares the device dicts with the desired pool: copy before changing.
    spec = copy.deepcopy(resource_slice_spec(DRIVER, desired, desired.slices[0], 1))
    for device in spec["devices"]:
        device.pop("taints", None)
    server.put(f"0-{DRIVER}-aaaaa", spec)
    wanted = [expected_key(desired, desired.slices[0])]
    assert plan_pool(DRIVER, POOL, desired, server.existing(), expected_keys=wanted).writes
    accepted = {wanted[0]: content_key(content_of(spec))}
    assert (
        plan_pool(
            DRIVER, POOL, desired, server.existing(), expected_keys=wanted, accepted=accepted
        ).writes
        == ()
    )


def test_plan_refuses_slices_of_another_pool() -> None:
    server = FakeServer()
    server.put(
        "x", {"driver": DRIVER, "pool": {"name": "other", "generation": 0, "resourceSliceCount": 1}}
    )
    with pytest.raises(ValueError, match="belongs to pool 'other'"):
        plan_pool(DRIVER, POOL, None, server.existing("other"))


# --------------------------------------------------------------------------- properties
def _random_pool(data: st.DataObject) -> DesiredPool | None:
    if data.draw(st.integers(0, 4), label="desired") == 0:
        return None
    count = data.draw(st.integers(0, 300), label="devices")
    tainted = data.draw(st.sets(st.integers(0, max(0, count - 1)), max_size=70), label="taint")
    if count == 0:
        return desired_pools(
            devices(1, tainted=[0]),
            PoolConfig(driver_name=DRIVER, binds_to_node=False, unhealthy="withhold"),
        )[POOL]
    health = data.draw(st.sampled_from(["OK", "Warning"]), label="health")
    return pool_of(count, tainted=sorted(tainted), health=health)


def _random_leftovers(data: st.DataObject, server: FakeServer, desired: DesiredPool | None) -> None:
    specs = (
        [resource_slice_spec(DRIVER, desired, c, 0) for c in desired.slices]
        if desired is not None
        else []
    )
    specs.append(resource_slice_spec(DRIVER, pool_of(5), pool_of(5).slices[0], 0))
    for number in range(data.draw(st.integers(0, 6), label="leftovers")):
        name = data.draw(
            st.sampled_from(["{i}-" + DRIVER + "-x{n}", "0{i}-" + DRIVER + "-y{n}", "junk-{n}"]),
            label="name",
        )
        spec = copy.deepcopy(data.draw(st.sampled_from(specs), label="spec"))
        spec["pool"]["generation"] = data.draw(st.integers(0, 5), label="generation")
        spec["pool"]["resourceSliceCount"] = data.draw(st.integers(1, 4), label="count")
        server.put(name.format(i=data.draw(st.integers(0, 4), label="index"), n=number), spec)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_applying_a_plan_yields_exactly_the_desired_pool_and_a_second_plan_is_empty(
    data: st.DataObject,
) -> None:
    server = FakeServer()
    earlier = _random_pool(data)
    if data.draw(st.booleans(), label="published before"):
        sync(server, earlier)
    _random_leftovers(data, server, earlier)
    desired = _random_pool(data)
    before = server.existing()
    highest = max((s.generation for s in before), default=None)
    plan = sync(server, desired)

    verbs = [w.verb for w in plan.writes]
    assert verbs == sorted(verbs, key=["delete", "update", "create"].index)
    if desired is None:
        assert server.objects == {} and set(verbs) <= {"delete"}
    else:
        generation = assert_published(server, desired)
        assert generation == plan.generation
        if plan.bumped:
            # Bumped past everything that existed; every slice of the pool was written.
            assert generation == (highest if highest is not None else 0) + 1
            assert sorted(w.index for w in plan.writes if w.verb != "delete") == list(
                range(len(desired.slices))
            )
        else:
            assert generation == highest
            assert "create" not in verbs and verbs.count("update") <= 1
    assert sync(server, desired).writes == ()


def test_a_pool_recreated_after_its_slices_vanished_goes_past_the_remembered_generation() -> None:
    server = FakeServer()
    desired = pool_of(10)
    plan = plan_pool(DRIVER, POOL, desired, [], floor_generation=4)
    assert plan.generation == 5 and plan.bumped
    server.apply(plan)
    # Existing slices below the floor (a newer one was deleted by someone else) are rewritten.
    lower = plan_pool(DRIVER, POOL, desired, server.existing(), floor_generation=6)
    assert lower.generation == 7 and [w.verb for w in lower.writes] == ["update"]
    assert plan_pool(DRIVER, POOL, desired, server.existing(), floor_generation=5).writes == ()
