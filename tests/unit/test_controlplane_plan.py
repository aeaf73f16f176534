"""Decisions of the classic DRA protocol: pure functions of app.controlplane.plan."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.allocator import Allocator, Node, claim_from_json, device_class_from_json, gather_pools
from app.claims.model import WantedDevice
from app.controlplane import plan as cp
from app.reservations import HeldDevice

DRIVER = "fabric.example.com"
FINALIZER = "fabric.example.com/deletion-protection"
REGION = "topology.kubernetes.io/region"


def claim(
    *,
    uid: str = "u1",
    controller: str | None = DRIVER,
    status: dict[str, Any] | None = None,
    deleting: bool = False,
    finalizers: list[str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "c", "namespace": "ns", "uid": uid, "resourceVersion": "7"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if finalizers is not None:
        metadata["finalizers"] = finalizers
    spec: dict[str, Any] = {
        "devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": "gpu"}}]}
    }
    if controller:
        spec["controller"] = controller
    return {"metadata": metadata, "spec": spec, "status": status or {}}


ALLOCATION = {
    "devices": {
        "results": [{"request": "dev", "driver": DRIVER, "pool": "us-east/r1", "device": "gpu-0"}]
    }
}
POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"}}
CONSUMER = {"resource": "pods", "name": "p", "uid": "pod-uid"}


# ---------------------------------------------------------------------------- pods and claims
def test_pod_claims_resolve_direct_and_template_claims() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimName": "claim-a"},
                {"name": "b", "resourceClaimTemplateName": "tmpl"},
                {"name": "c", "resourceClaimTemplateName": "tmpl"},
                {"resourceClaimName": "nameless"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"}]},
    }
    assert cp.pod_claims(pod) == [
        cp.PodClaim("a", "claim-a"),
        cp.PodClaim("b", "p-b-x1"),
        cp.PodClaim("c", None),
    ]


@pytest.mark.parametrize(
    ("obj", "phase"),
    [
        (None, "gone"),
        (claim(controller=None), "foreign"),
        (claim(controller="other.example.com"), "foreign"),
        (claim(), "pending"),
        (claim(status={"allocation": ALLOCATION, "reservedFor": [CONSUMER]}), "allocated"),
        (claim(status={"allocation": ALLOCATION}), "allocated"),
        (claim(status={"allocation": ALLOCATION, "deallocationRequested": True}), "deallocate"),
        (
            claim(
                status={
                    "allocation": ALLOCATION,
                    "deallocationRequested": True,
                    "reservedFor": [CONSUMER],
                }
            ),
            "allocated",
        ),
        (claim(deleting=True, status={"allocation": ALLOCATION}), "deallocate"),
        (
            claim(deleting=True, status={"allocation": ALLOCATION, "reservedFor": [CONSUMER]}),
            "deleting",
        ),
        (claim(deleting=True), "deallocate"),
    ],
)
def test_claim_phase(obj: dict[str, Any] | None, phase: str) -> None:
    assert cp.claim_phase(obj, DRIVER) == phase


def test_allocated_status_sets_controller_and_the_pod_in_one_status() -> None:
    before = claim(status={"deallocationRequested": True})
    after = cp.allocated_status(before, ALLOCATION, DRIVER, CONSUMER, "n1")
    assert after["status"] == {
        "allocation": {
            **ALLOCATION,
            "controller": DRIVER,
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            },
        },
        "reservedFor": [CONSUMER],
    }
    assert before["status"] == {"deallocationRequested": True}  # not modified
    again = cp.allocated_status(after, ALLOCATION, DRIVER, CONSUMER, "n1")
    assert again["status"]["reservedFor"] == [CONSUMER]


def test_cleared_status_drops_allocation_and_request_together() -> None:
    before = claim(
        status={
            "allocation": ALLOCATION,
            "deallocationRequested": True,
            "devices": [{"driver": DRIVER}],
        }
    )
    assert cp.needs_status_clear(before)
    after = cp.cleared_status(before)
    assert after["status"] == {} and not cp.needs_status_clear(after)


# ---------------------------------------------------------------------------- finalizers
def test_finalizer_is_added_with_a_guard_and_only_once() -> None:
    assert cp.add_finalizer_patch(claim(), FINALIZER) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
    ]
    assert cp.add_finalizer_patch(claim(finalizers=["x/y"]), FINALIZER) == [
        {"op": "test", "path": "/metadata/finalizers", "value": ["x/y"]},
        {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
    ]
    assert cp.add_finalizer_patch(claim(finalizers=[FINALIZER]), FINALIZER) is None


def test_finalizer_is_removed_by_index_guarded_by_the_whole_list() -> None:
    assert cp.remove_finalizer_patch(claim(finalizers=["x/y", FINALIZER]), FINALIZER) == [
        {"op": "test", "path": "/metadata/finalizers", "value": ["x/y", FINALIZER]},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]
    assert cp.remove_finalizer_patch(claim(finalizers=["x/y"]), FINALIZER) is None
    assert cp.remove_finalizer_patch(claim(), FINALIZER) is None


# ---------------------------------------------------------------------------- in use
def test_devices_in_use_come_from_claims_and_the_journal_but_not_the_claims_allocated_now() -> None:
    other = claim(
        uid="u2",
        status={
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "dev",
                            "driver": DRIVER,
                            "pool": "us-east/r1",
                            "device": "gpu-1",
                        },
                        {
                            "request": "dev",
                            "driver": DRIVER,
                            "pool": "us-east/r1",
                            "device": "gpu-9",
                            "adminAccess": True,
                        },
                        {
                            "request": "dev",
                            "driver": "other.example.com",
                            "pool": "x",
                            "device": "y",
                        },
                    ]
                }
            }
        },
    )
    held = [HeldDevice("u3", "us-east/r1", "gpu-2"), HeldDevice("u1", "us-east/r1", "gpu-3")]
    expected = {(DRIVER, "us-east/r1", "gpu-1"), (DRIVER, "us-east/r1", "gpu-2")}
    assert cp.devices_in_use([other], held, DRIVER, {"u1"}) == expected
    # The same from the index the controller keeps from claim events and the journal.
    index = cp.InUse()
    index.set_claim("u2", cp.claim_devices(other, DRIVER))
    index.set_claim("u1", frozenset({(DRIVER, "us-east/r1", "gpu-7")}))
    index.set_held(held, DRIVER)
    assert set(index.view({"u1"})) == expected
    assert cp.claim_devices(claim(), DRIVER) == frozenset()


def test_chosen_devices_are_our_results_in_order() -> None:
    assert cp.chosen_devices(ALLOCATION, DRIVER) == [WantedDevice("dev", "us-east/r1", "gpu-0")]


# ---------------------------------------------------------------------------- answers
def test_merged_entries_keep_other_drivers_and_always_answer_ours() -> None:
    existing = [
        {"name": "other", "unsuitableNodes": ["n9"]},
        {"name": "a", "unsuitableNodes": ["n1"]},
    ]
    merged = cp.merged_claim_entries(existing, {"a": [], "b": ["n2"]})
    assert merged == [
        {"name": "other", "unsuitableNodes": ["n9"]},
        {"name": "a"},
        {"name": "b", "unsuitableNodes": ["n2"]},
    ]
    assert cp.same_claim_entries(
        merged,
        [
            {"name": "other", "unsuitableNodes": ["n9"]},
            {"name": "a", "unsuitableNodes": []},
            {"name": "b", "unsuitableNodes": ["n2"]},
        ],
    )
    assert not cp.same_claim_entries(merged, existing)


@given(st.lists(st.text("abn0123456789-", min_size=1, max_size=8), max_size=300, unique=True))
def test_an_answer_never_lists_more_than_128_nodes(nodes: list[str]) -> None:
    merged = cp.merged_claim_entries([], {"a": nodes})
    assert len(merged[0].get("unsuitableNodes", [])) == min(len(nodes), cp.MAX_NODES)


def slices(devices_per_region: dict[str, int]) -> list[dict[str, Any]]:
    out = []
    for region, count in devices_per_region.items():
        out.append(
            {
                "spec": {
                    "driver": DRIVER,
                    "pool": {"name": f"{region}/r1", "generation": 0, "resourceSliceCount": 1},
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": REGION, "operator": "In", "values": [region]}
                                ]
                            }
                        ]
                    },
                    "devices": [
                        {
                            "name": f"gpu-{region}-{i}",
                            "attributes": {"deviceType": {"string": "gpu"}},
                        }
                        for i in range(count)
                    ],
                }
            }
        )
    return out


CLASSES = {
    "gpu": device_class_from_json(
        {
            "metadata": {"name": "gpu"},
            "spec": {
                "selectors": [
                    {"cel": {"expression": f'device.attributes["{DRIVER}"].deviceType == "gpu"'}}
                ]
            },
        }
    )
}
NODES = {
    n.name: n
    for n in [
        Node("east-1", {REGION: "east"}),
        Node("east-2", {REGION: "east"}),
        Node("west-1", {REGION: "west"}),
        Node("nowhere", {}),
    ]
}


def pending(count: int, name: str = "gpu") -> cp.Pending:
    spec = {
        "devices": {
            "requests": [{"name": "dev", "exactly": {"deviceClassName": "gpu", "count": count}}]
        }
    }
    return cp.Pending(name, claim_from_json(spec, uid=f"uid-{name}", namespace="ns", name=name))


def test_unsuitable_nodes_are_those_without_enough_devices_or_without_a_fabric_host() -> None:
    pools = gather_pools(slices({"east": 2, "west": 1}))
    answers = cp.unsuitable_nodes(
        Allocator(),
        [pending(2)],
        CLASSES,
        pools,
        set(),
        ["east-1", "west-1", "nowhere", "east-2", "unknown"],
        NODES,
        hosts={"east-1", "west-1", "nowhere"},
    )
    assert answers == {"gpu": ["west-1", "nowhere", "east-2", "unknown"]}


def test_all_claims_of_the_pod_are_answered_together() -> None:
    pools = gather_pools(slices({"east": 2, "west": 2}))
    in_use = {(DRIVER, "west/r1", "gpu-west-0")}
    answers = cp.unsuitable_nodes(
        Allocator(),
        [pending(1, "a"), pending(1, "b")],
        CLASSES,
        pools,
        in_use,
        ["east-1", "west-1"],
        NODES,
        hosts=set(NODES),
    )
    # West has one free device left: each claim alone would fit, both together do not.
    assert answers == {"a": ["west-1"], "b": ["west-1"]}


@given(st.integers(0, 3), st.integers(0, 3), st.integers(1, 3))
def test_a_node_is_unsuitable_exactly_when_the_allocator_fails_there(
    east: int, west: int, count: int
) -> None:
    pools = gather_pools(slices({"east": east, "west": west}))
    allocator = Allocator()
    potential = ["east-1", "west-1"]
    answers = cp.unsuitable_nodes(
        allocator, [pending(count)], CLASSES, pools, set(), potential, NODES, hosts=set(NODES)
    )
    for node_name, have in (("east-1", east), ("west-1", west)):
        assert (node_name in answers["gpu"]) == (have < count)


class CountingAllocator(Allocator):
    """An allocator that counts its runs."""

    runs = 0

    def allocate(self, *args: Any, **kwargs: Any) -> Any:
        self.runs += 1
        return super().allocate(*args, **kwargs)


def test_remembered_answers_are_reused_until_the_nodes_pools_change() -> None:
    pools = gather_pools(slices({"east": 2, "west": 2}))
    reachable = {n: tuple(p for p in pools if p.reaches_node(node)) for n, node in NODES.items()}
    allocator, memo = CountingAllocator(), cp.NodeAnswers()
    potential = ["east-1", "east-2", "west-1"]

    def answer(in_use: set[Any], name: str = "gpu") -> dict[str, list[str]]:
        return cp.unsuitable_nodes(
            allocator,
            [pending(2, name)],
            CLASSES,
            pools,
            in_use,
            potential,
            NODES,
            set(NODES),
            reachable,
            memo,
        )

    assert answer(set()) == {"gpu": []}
    assert allocator.runs == 3
    # Another pod whose claim has the same spec: every answer comes from memory.
    assert answer(set(), "other") == {"other": []}
    assert allocator.runs == 3
    # A device taken in the west pool: only west-1 is worked out again.
    assert answer({(DRIVER, "west/r1", "gpu-west-0")}) == {"gpu": ["west-1"]}
    assert allocator.runs == 4
    assert (memo.hits, memo.misses) == (5, 4)
    memo.clear()
    assert answer({(DRIVER, "west/r1", "gpu-west-0")}) == {"gpu": ["west-1"]}
    assert allocator.runs == 7


@given(
    st.lists(st.tuples(st.sampled_from(["east", "west"]), st.integers(0, 3)), max_size=6),
    st.integers(1, 3),
)
def test_remembered_answers_equal_fresh_ones(taken: list[tuple[str, int]], count: int) -> None:
    pools = gather_pools(slices({"east": 3, "west": 2}))
    memo = cp.NodeAnswers()
    potential = ["east-1", "west-1", "east-2"]
    in_use: set[Any] = set()
    for region, index in taken:
        in_use.add((DRIVER, f"{region}/r1", f"gpu-{region}-{index}"))
        remembered = cp.unsuitable_nodes(
            Allocator(),
            [pending(count)],
            CLASSES,
            pools,
            set(in_use),
            potential,
            NODES,
            set(NODES),
            None,
            memo,
        )
        fresh = cp.unsuitable_nodes(
            Allocator(), [pending(count)], CLASSES, pools, set(in_use), potential, NODES, set(NODES)
        )
        assert remembered == fresh


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["claim", "pending", "journal", "drop"]),
            st.sampled_from(["u1", "u2", "uid-gpu"]),
            st.sampled_from(["east", "west"]),
            st.integers(0, 3),
        ),
        max_size=12,
    ),
    st.integers(1, 3),
)
def test_answers_from_the_in_use_index_equal_fresh_ones(
    steps: list[tuple[str, str, str, int]], count: int
) -> None:
    # The live index, as the scheduling pass uses it: one view per question leaving out the
    # pod's own claim ("uid-gpu"), remembered answers looked up by pool keys, and the
    # allocator reading each pool's devices in use from the index. Against a plain set.
    pools = gather_pools(slices({"east": 3, "west": 2}))
    reachable = {n: tuple(p for p in pools if p.reaches_node(node)) for n, node in NODES.items()}
    potential = ["east-1", "west-1", "east-2", "nowhere"]
    index, memo = cp.InUse(), cp.NodeAnswers()
    claims: dict[str, frozenset[Any]] = {}
    held: set[HeldDevice] = set()
    for kind, uid, region, number in steps:
        device = (DRIVER, f"{region}/r1", f"gpu-{region}-{number}")
        if kind == "claim":
            claims[uid] = claims.get(uid, frozenset()) | {device}
            index.set_claim(uid, claims[uid])
        elif kind == "pending":
            index.hold_pending(uid, [device])
        elif kind == "journal":
            held.add(HeldDevice(uid, device[1], device[2]))
            index.hold(HeldDevice(uid, device[1], device[2]), DRIVER)
        else:
            index.drop_pending(uid)
        expected = cp.devices_in_use(
            [_allocated(u, frozenset((d[1], d[2]) for d in ds)) for u, ds in claims.items()],
            held,
            DRIVER,
            {"uid-gpu"},
        ) | {d for u, ds in index._pending.items() if u != "uid-gpu" for d in ds}
        remembered = cp.unsuitable_nodes(
            Allocator(),
            [pending(count)],
            CLASSES,
            pools,
            index.view({"uid-gpu"}),
            potential,
            NODES,
            set(NODES),
            reachable,
            memo,
        )
        fresh = cp.unsuitable_nodes(
            Allocator(), [pending(count)], CLASSES, pools, expected, potential, NODES, set(NODES)
        )
        assert remembered == fresh


def test_remembered_answers_are_bounded() -> None:
    pools = gather_pools(slices({"east": 1}))
    memo = cp.NodeAnswers(max_entries=2)
    for count in (1, 2, 3, 4):
        cp.unsuitable_nodes(
            Allocator(),
            [pending(count)],
            CLASSES,
            pools,
            set(),
            ["east-1"],
            NODES,
            set(NODES),
            None,
            memo,
        )
        assert len(memo) <= 2


# ---------------------------------------------------------------------------- in-use index
_UIDS = st.sampled_from(["u1", "u2", "u3"])
_DEVICES = st.tuples(st.sampled_from(["east/r1", "west/r1"]), st.sampled_from(["d0", "d1", "d2"]))
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), _UIDS, st.frozensets(_DEVICES, max_size=2)),
        st.tuples(st.just("hold"), _UIDS, _DEVICES),
        st.tuples(st.just("release"), _UIDS, _DEVICES),
        st.tuples(
            st.just("held"), st.just(""), st.frozensets(st.tuples(_UIDS, _DEVICES), max_size=3)
        ),
    ),
    max_size=25,
)


@given(_STEPS, st.frozensets(_UIDS, max_size=2))
def test_the_in_use_index_matches_a_count_from_scratch(
    steps: list[tuple[str, str, Any]],
    exclude: frozenset[str],
) -> None:
    index = cp.InUse()
    claims: dict[str, frozenset[tuple[str, str]]] = {}
    held: set[tuple[str, tuple[str, str]]] = set()
    keys: dict[str, tuple[Any, ...]] = {}
    sets: dict[str, frozenset[Any]] = {}
    list_sets: dict[tuple[Any, ...], frozenset[Any]] = {}
    for kind, uid, value in steps:
        if kind == "claim":
            claims[uid] = value
            index.set_claim(uid, frozenset((DRIVER, p, d) for p, d in value))
        elif kind == "hold":
            held.add((uid, value))
            index.hold(HeldDevice(uid, *value), DRIVER)
        elif kind == "release":
            held.discard((uid, value))
            index.release(HeldDevice(uid, *value), DRIVER)
        else:
            held = set(value)
            index.set_held([HeldDevice(u, p, d) for u, (p, d) in value], DRIVER)
        expected = cp.devices_in_use(
            [_allocated(u, devices) for u, devices in claims.items()],
            [HeldDevice(u, p, d) for u, (p, d) in held],
            DRIVER,
            exclude,
        )
        view = index.view(exclude)
        assert set(view) == expected
        assert all(
            ((DRIVER, p, d) in view) == ((DRIVER, p, d) in expected)
            for p in ("east/r1", "west/r1")
            for d in ("d0", "d1", "d2", "d9")
        )
        for pool in ("east/r1", "west/r1"):
            now = frozenset(x for x in expected if x[1] == pool)
            # What the allocator looks devices up in, pool by pool.
            assert set(view.in_use_of_pool(DRIVER, pool)) == now
            key = view.pool_key(pool)
            # One synchronous pass works the keys out once, to the same values.
            one_pass = cp._PassView(view)
            assert one_pass.pool_key(pool) == key
            names = (pool, "east/r1", "west/r1")
            pools: Any = [SimpleNamespace(name=n) for n in names]
            # A list's key is the same as at any earlier step only when the devices in use
            # in its pools are too (the sum of versions or, with devices only left-out
            # claims hold, every pool's key).
            in_list = frozenset(x for x in expected if x[1] in names)
            list_key = (names, one_pass.pools_key(pools))
            assert list_sets.setdefault(list_key, in_list) == in_list
            assert one_pass.pools_key(pools) == list_key[1]
            # An unchanged key always means unchanged in-use devices of the pool.
            if keys.get(pool) == key:
                assert sets[pool] == now
            keys[pool], sets[pool] = key, now
            # "No device of the pool in use" is never said of a pool with one in use, and
            # is said whenever no claim holds any (left-out claims may make it say "may").
            held_by_anyone = any(
                d[1] == pool for u, ds in claims.items() for d in ((DRIVER, *x) for x in ds)
            ) or any(device[0] == pool for _, device in held)
            assert view.may_hold_pool(DRIVER, pool) == held_by_anyone
            if now:
                assert view.may_hold_pool(DRIVER, pool)


def test_a_device_passing_from_hold_to_hold_keeps_its_pools_key() -> None:
    # An allocation holds its devices pending, then in the journal, then in the claim's
    # allocation, then drops the pending hold: the pool's devices in use are the same all
    # along, so remembered answers about the pool stay good (one change, not four).
    index = cp.InUse()
    device = (DRIVER, "east/r1", "d0")
    view = index.view()
    before = view.pool_key("east/r1")
    index.hold_pending("u1", [device])
    held = view.pool_key("east/r1")
    assert held != before
    index.hold(HeldDevice("u1", "east/r1", "d0"), DRIVER)
    index.set_claim("u1", frozenset({device}))
    index.drop_pending("u1")
    assert view.pool_key("east/r1") == held
    # Left out of the question, the claim frees the device: another key.
    assert index.view({"u1"}).pool_key("east/r1") not in (held, before)
    index.set_claim("u1", frozenset())
    index.release(HeldDevice("u1", "east/r1", "d0"), DRIVER)
    assert view.pool_key("east/r1") not in (held, before)
    assert not view.may_hold_pool(DRIVER, "east/r1")


def _allocated(uid: str, devices: frozenset[tuple[str, str]]) -> dict[str, Any]:
    """A claim of ``uid`` allocated ``devices`` ((pool, device) pairs) of our driver."""
    return {
        "metadata": {"uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": DRIVER, "pool": p, "device": d}
                        for p, d in sorted(devices)
                    ]
                }
            }
        },
    }


@given(
    st.lists(st.sampled_from([f"n{i}" for i in range(200)]), unique=True, max_size=140),
    st.sampled_from(["", "n0", "n150", "other"]),
)
def test_the_answer_covers_the_selected_node_even_when_it_is_not_a_potential_node(
    potential: list[str], selected: str
) -> None:
    nodes = cp.answer_nodes(potential, selected)
    assert len(nodes) <= cp.MAX_NODES and len(set(nodes)) == len(nodes)
    if selected:
        assert selected in nodes
    if not selected or selected in potential:
        assert nodes == potential[: cp.MAX_NODES]
    else:
        assert nodes == [selected, *potential][: cp.MAX_NODES]


def test_pending_holds_are_a_part_the_journal_reads_do_not_change() -> None:
    index = cp.InUse()
    before = (DRIVER, "east/r1", "d0")
    chosen = (DRIVER, "east/r1", "d1")
    index.hold(HeldDevice("u1", "east/r1", "d0"), DRIVER)
    key = index.view().pool_key("east/r1")
    assert index.hold_pending("u1", [chosen]) == {chosen}
    assert index.hold_pending("u1", [chosen]) == frozenset()
    assert set(index.view()) == {before, chosen}
    assert index.view().pool_key("east/r1") != key, "other decisions see the change"
    assert chosen not in index.view({"u1"}), "the claim's own decisions leave it out"
    # A full read of the journal made before the reservation commits keeps the hold, and so
    # do the feed's holds and releases.
    index.set_held([], DRIVER)
    assert set(index.view()) == {chosen}
    index.hold(HeldDevice("u1", "east/r1", "d1"), DRIVER)
    index.release(HeldDevice("u1", "east/r1", "d1"), DRIVER)
    assert set(index.view()) == {chosen}
    # Ending it leaves what the journal holds meanwhile.
    index.hold(HeldDevice("u1", "east/r1", "d1"), DRIVER)
    index.drop_pending("u1")
    assert set(index.view()) == {chosen}
    index.release(HeldDevice("u1", "east/r1", "d1"), DRIVER)
    assert set(index.view()) == set()
    index.hold_pending("u2", [before, chosen])
    index.drop_pending("u2", frozenset({before}))
    assert set(index.view()) == {chosen}


def test_allocation_devices_leave_out_admin_access_and_other_drivers() -> None:
    allocation = {
        "devices": {
            "results": [
                {"driver": DRIVER, "pool": "p", "device": "d0", "request": "r"},
                {"driver": DRIVER, "pool": "p", "device": "d1", "adminAccess": True},
                {"driver": "other.example.com", "pool": "p", "device": "d2"},
                "not a result",
            ]
        }
    }
    assert cp.allocation_devices(allocation, DRIVER) == {(DRIVER, "p", "d0")}
    assert cp.allocation_devices({}, DRIVER) == frozenset()


# ---------------------------------------------------------------- pod_view

_NAMES = st.sampled_from(["a", "b", "gpu", ""])
_POD_CLAIM = st.one_of(
    st.fixed_dictionaries({"name": _NAMES, "resourceClaimName": _NAMES}),
    st.fixed_dictionaries({"name": _NAMES, "resourceClaimTemplateName": _NAMES}),
)
PODS = st.builds(
    lambda name, rv, deleting, node, claims, statuses, conditions: {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"u-{name}",
            "resourceVersion": rv,
            "labels": {"app": "x"},
            "managedFields": [{"manager": "kubectl"}],
            **({"deletionTimestamp": "2026-12-06T00:00:00Z"} if deleting else {}),
        },
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "env": [{"name": "A"}]}],
            "resourceClaims": claims,
            **({"nodeName": node} if node else {}),
        },
        "status": {
            "phase": "Pending",
            "conditions": conditions,
            "resourceClaimStatuses": statuses,
        },
    },
    _NAMES,
    st.sampled_from(["1", "2"]),
    st.booleans(),
    st.sampled_from(["", "node-1"]),
    st.lists(_POD_CLAIM, max_size=3),
    st.lists(st.fixed_dictionaries({"name": _NAMES, "resourceClaimName": _NAMES}), max_size=3),
    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["PodScheduled", "Ready"])})),
)


@given(PODS)
def test_a_pod_cut_down_reads_the_same_to_the_controller_and_the_pod_is_left_alone(
    pod: dict[str, Any],
) -> None:
    before = repr(pod)
    view = cp.pod_view(pod)
    assert repr(pod) == before
    assert cp.pod_claims(view) == cp.pod_claims(pod)
    assert cp.being_deleted(view) == cp.being_deleted(pod)
    assert view["spec"].get("nodeName") == pod["spec"].get("nodeName")
    for key in ("name", "namespace", "uid", "resourceVersion"):
        assert view["metadata"][key] == pod["metadata"][key]
    assert "containers" not in view["spec"] and "conditions" not in view["status"]
    assert "managedFields" not in view["metadata"] and "labels" not in view["metadata"]


@given(PODS, PODS)
def test_two_pods_are_the_same_view_exactly_when_what_the_controller_reads_is_equal(
    a: dict[str, Any], b: dict[str, Any]
) -> None:
    def read(pod: dict[str, Any]) -> tuple[Any, ...]:
        return (
            pod["metadata"]["name"],
            pod["metadata"].get("deletionTimestamp"),
            pod["spec"].get("nodeName"),
            pod["spec"]["resourceClaims"],
            pod["status"]["resourceClaimStatuses"],
        )

    assert cp.same_pod_view(cp.pod_view(a), cp.pod_view(b)) == (read(a) == read(b))
    # A condition written by the scheduler and a new resourceVersion: the same view.
    conditioned = {
        **a,
        "metadata": {**a["metadata"], "resourceVersion": "99"},
        "status": {**a["status"], "conditions": [{"type": "PodScheduled", "status": "False"}]},
    }
    assert cp.same_pod_view(cp.pod_view(a), cp.pod_view(conditioned))


@pytest.mark.parametrize(
    "pod", [{}, {"metadata": None, "spec": "x", "status": []}, {"status": {"phase": "Running"}}]
)
def test_a_malformed_pod_is_cut_down_without_error(pod: dict[str, Any]) -> None:
    view = cp.pod_view(pod)
    assert cp.pod_claims(view) == []
    assert cp.same_pod_view(view, cp.pod_view(pod))
