"""Properties of the allocator on small random inputs, checked against a brute-force search.

Up to 8 devices in up to 3 pools, up to 3 requests with simple attribute-equality selectors, and
at most one matchAttribute or distinctAttribute constraint. The allocator must find an allocation
exactly when the brute force finds one, and every allocation it returns must hold: selectors
(re-evaluated in a fresh CEL environment), counts, constraints, reach, taints (an untolerated
one makes ``All`` fail), no device used twice within the claim (admin access or not), and none
taken from another claim unless the request has admin access. Pools whose slices disagree on
``resourceSliceCount`` are never allocated from.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_allocator_builders import (
    DRIVER,
    NODE,
    RACK,
    device,
    device_class,
    in_selector,
    resource_slice,
)

from app.allocator import Allocator, gather_pools
from app.allocator.cel import CelEnvironment
from app.allocator.model import Claim, Device, claim_from_json

ENGINE = Allocator()
POOL_NAMES = ("p0", "p1", "p2")
COLORS = ("red", "blue")
A = f'device.attributes["{DRIVER}"]'


@dataclass(frozen=True)
class Selector:
    """A CEL selector and the same test in Python, over the raw attributes dict."""

    cel: str
    test: Callable[[dict[str, Any]], bool]


SELECTORS = {
    "any": Selector("true", lambda a: True),
    "gpu": Selector(f'{A}.kind == "gpu"', lambda a: a["kind"] == "gpu"),
    "red": Selector(f'has({A}.color) && {A}.color == "red"', lambda a: a.get("color") == "red"),
    "blue": Selector(f'has({A}.color) && {A}.color == "blue"', lambda a: a.get("color") == "blue"),
    "size1": Selector(f"has({A}.size) && {A}.size == 1", lambda a: a.get("size") == 1),
    "size2": Selector(f"has({A}.size) && {A}.size == 2", lambda a: a.get("size") == 2),
}
CLASSES = {name: device_class(name, SELECTORS[name].cel) for name in ("any", "gpu", "red")}

devices_strategy = st.lists(
    st.fixed_dictionaries(
        {
            "pool": st.sampled_from(POOL_NAMES),
            "kind": st.sampled_from(("gpu", "nic")),
            "color": st.one_of(st.none(), st.sampled_from(COLORS)),
            "size": st.one_of(st.none(), st.integers(0, 2)),
            "tainted": st.sampled_from((False, False, False, True)),
        }
    ),
    min_size=1,
    max_size=8,
)
TAINT = {"key": f"{DRIVER}/unhealthy", "value": "Critical", "effect": "NoSchedule"}
request_strategy = st.fixed_dictionaries(
    {
        "class": st.sampled_from(sorted(CLASSES)),
        "selector": st.one_of(st.none(), st.sampled_from(("blue", "size1", "size2", "gpu"))),
        "mode": st.sampled_from(("ExactCount", "ExactCount", "ExactCount", "All")),
        "count": st.integers(1, 2),
        "admin": st.sampled_from((False, False, False, True)),
        "tolerates": st.sampled_from((False, False, True)),
    }
)
constraint_strategy = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "kind": st.sampled_from(("matchAttribute", "distinctAttribute")),
            "attribute": st.sampled_from(("color", "size")),
            "scope": st.lists(st.integers(0, 2), max_size=2, unique=True),
        }
    ),
)


def build(
    raw_devices: list[dict[str, Any]],
    raw_requests: list[dict[str, Any]],
    raw_constraint: dict[str, Any] | None,
    unreachable: set[str],
) -> tuple[Claim, list[dict[str, Any]], dict[str, dict[str, Any]]]:
    by_pool: dict[str, list[dict[str, Any]]] = {}
    attributes: dict[str, dict[str, Any]] = {}
    for index, raw in enumerate(raw_devices):
        attrs = {k: v for k, v in raw.items() if k not in ("pool", "tainted") and v is not None}
        attributes[f"{raw['pool']}/d{index}"] = attrs
        by_pool.setdefault(raw["pool"], []).append(
            device(f"d{index}", taints=[TAINT] if raw["tainted"] else None, **attrs)
        )
    slices = [
        resource_slice(
            pool, devs, selector=in_selector(RACK, "rack-99") if pool in unreachable else None
        )
        for pool, devs in by_pool.items()
    ]
    requests = []
    for index, raw in enumerate(raw_requests):
        exactly: dict[str, Any] = {
            "deviceClassName": raw["class"],
            "allocationMode": raw["mode"],
            "adminAccess": raw["admin"],
        }
        if raw["mode"] == "ExactCount":
            exactly["count"] = raw["count"]
        if raw["selector"]:
            exactly["selectors"] = [{"cel": {"expression": SELECTORS[raw["selector"]].cel}}]
        if raw["tolerates"]:
            exactly["tolerations"] = [{"key": TAINT["key"], "operator": "Exists"}]
        requests.append({"name": f"r{index}", "exactly": exactly})
    constraints = []
    if raw_constraint is not None:
        scope = [f"r{i}" for i in raw_constraint["scope"] if i < len(raw_requests)]
        constraints.append(
            {"requests": scope, raw_constraint["kind"]: f"{DRIVER}/{raw_constraint['attribute']}"}
        )
    claim = claim_from_json(
        {"devices": {"requests": requests, "constraints": constraints}},
        uid="u",
        namespace="ns",
        name="c",
    )
    return claim, slices, attributes


def matches(raw: dict[str, Any], attrs: dict[str, Any]) -> bool:
    return SELECTORS[raw["class"]].test(attrs) and (
        raw["selector"] is None or SELECTORS[raw["selector"]].test(attrs)
    )


def constraint_holds(
    raw_constraint: dict[str, Any] | None,
    raw_requests: list[dict[str, Any]],
    picks: list[list[str]],
    attributes: dict[str, dict[str, Any]],
) -> bool:
    if raw_constraint is None:
        return True
    scope = [i for i in raw_constraint["scope"] if i < len(raw_requests)] or range(
        len(raw_requests)
    )
    found = [attributes[d].get(raw_constraint["attribute"]) for i in scope for d in picks[i]]
    if any(v is None for v in found):
        return False
    if raw_constraint["kind"] == "matchAttribute":
        return len(set(found)) <= 1
    return len(set(found)) == len(found)


def options(
    raw: dict[str, Any],
    attributes: dict[str, dict[str, Any]],
    reachable: set[str],
    in_use: set[str],
    tainted: set[str],
) -> list[list[str]]:
    matched = [
        d
        for d in sorted(attributes, key=lambda k: (k.split("/")[0], k))
        if d.split("/")[0] in reachable and matches(raw, attributes[d])
    ]
    free = [
        d
        for d in matched
        if (raw["admin"] or d not in in_use) and (raw["tolerates"] or d not in tainted)
    ]
    if raw["mode"] == "All":
        return [matched] if matched and len(free) == len(matched) else []
    return [list(c) for c in itertools.combinations(free, raw["count"])]


def brute_force(
    raw_requests: list[dict[str, Any]],
    raw_constraint: dict[str, Any] | None,
    attributes: dict[str, dict[str, Any]],
    reachable: set[str],
    in_use: set[str],
    tainted: set[str],
) -> bool:
    choices = [options(r, attributes, reachable, in_use, tainted) for r in raw_requests]
    for picks in itertools.product(*choices):
        # One claim: no device twice in it, whatever the requests' admin access.
        held = [d for p in picks for d in p]
        if len(held) == len(set(held)) and constraint_holds(
            raw_constraint, raw_requests, list(picks), attributes
        ):
            return True
    return False


@settings(max_examples=250, deadline=None)
@given(
    devices_strategy,
    st.lists(request_strategy, min_size=1, max_size=3),
    constraint_strategy,
    st.sets(st.integers(0, 7), max_size=3),
    st.sets(st.sampled_from(POOL_NAMES), max_size=1),
)
def test_the_allocator_finds_an_allocation_exactly_when_brute_force_does_and_it_is_valid(
    raw_devices: list[dict[str, Any]],
    raw_requests: list[dict[str, Any]],
    raw_constraint: dict[str, Any] | None,
    busy: set[int],
    unreachable: set[str],
) -> None:
    claim, slices, attributes = build(raw_devices, raw_requests, raw_constraint, unreachable)
    in_use = {f"{raw_devices[i]['pool']}/d{i}" for i in busy if i < len(raw_devices)}
    tainted = {f"{raw['pool']}/d{i}" for i, raw in enumerate(raw_devices) if raw["tainted"]}
    pools = gather_pools(slices)
    result = ENGINE.allocate(
        [claim], CLASSES, pools, {(DRIVER, *d.split("/")) for d in in_use}, NODE
    )
    reachable = {p for p in POOL_NAMES if p not in unreachable}
    expected = brute_force(raw_requests, raw_constraint, attributes, reachable, in_use, tainted)
    assert result.ok is expected, result.failure
    if not result.ok:
        return
    by_id: dict[str, Device] = {f"{d.pool}/{d.name}": d for p in pools for d in p.devices}
    results = result.allocations["u"]["devices"]["results"]
    picks: list[list[str]] = [[] for _ in raw_requests]
    for entry in results:
        picks[int(entry["request"][1:])].append(f"{entry['pool']}/{entry['device']}")
    fresh = CelEnvironment()
    for raw, chosen in zip(raw_requests, picks, strict=True):
        assert len(chosen) == len(set(chosen))
        if raw["mode"] == "ExactCount":
            assert len(chosen) == raw["count"]
        else:
            assert chosen and chosen == options(raw, attributes, reachable, in_use, tainted)[0]
        for device_id in chosen:
            assert device_id.split("/")[0] in reachable
            assert raw["admin"] or device_id not in in_use
            assert raw["tolerates"] or device_id not in tainted
            expressions = [fresh.compile(SELECTORS[raw["class"]].cel)]
            if raw["selector"]:
                expressions.append(fresh.compile(SELECTORS[raw["selector"]].cel))
            assert fresh.evaluate(expressions, by_id[device_id])
    held = [d for p in picks for d in p]
    assert len(held) == len(set(held))
    assert constraint_holds(raw_constraint, raw_requests, picks, attributes)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=4))
def test_a_pool_is_used_only_when_all_its_newest_slices_agree_on_their_count(
    counts: list[int],
) -> None:
    # An older generation with another count never matters.
    slices = [resource_slice("p0", [device("old", kind="gpu")], generation=1, count=9)]
    for index, count in enumerate(counts):
        one = resource_slice("p0", [device(f"d{index}", kind="gpu")], generation=2, count=count)
        one["metadata"]["name"] = f"p0-slice-{index}"
        slices.append(one)
    (pool,) = gather_pools(slices)
    agree = len(set(counts)) == 1
    assert pool.consistent is agree
    assert pool.usable is (agree and counts[0] == len(counts))
    if not agree:
        assert pool.invalid_reason is not None and not pool.devices
        for count in set(counts):
            assert f"{count} (slice" in pool.invalid_reason
        for index in range(len(counts)):
            assert f"'p0-slice-{index}'" in pool.invalid_reason
    claim = claim_from_json(
        {"devices": {"requests": [{"name": "r0", "exactly": {"deviceClassName": "gpu"}}]}},
        uid="u",
        namespace="ns",
        name="c",
    )
    result = ENGINE.allocate([claim], CLASSES, (pool,), set(), NODE)
    assert result.ok is pool.usable
    if not agree:
        assert result.failure is not None
        assert result.failure.incomplete_pools == ()
        assert result.failure.invalid_pools == (f"{DRIVER}/p0 ({pool.invalid_reason})",)
        assert pool.invalid_reason in result.failure.message


class _Unindexed(frozenset[tuple[str, str, str]]):
    """An in-use set the allocator cannot index cheaply (it claims to be huge), so that it
    checks every device one by one."""

    def __len__(self) -> int:
        return 10**9


@settings(max_examples=150, deadline=None)
@given(
    devices_strategy,
    st.lists(request_strategy, min_size=1, max_size=3),
    constraint_strategy,
    st.sets(st.integers(0, 7), max_size=3),
    st.sets(st.sampled_from(POOL_NAMES), max_size=1),
)
def test_skipping_the_per_device_check_of_free_untainted_pools_changes_nothing(
    raw_devices: list[dict[str, Any]],
    raw_requests: list[dict[str, Any]],
    raw_constraint: dict[str, Any] | None,
    busy: set[int],
    unreachable: set[str],
) -> None:
    """Pools with no device in use and no taint are taken whole; the outcome (allocations,
    failure and every request's report) is the one the device-by-device check gives."""
    claim, slices, _ = build(raw_devices, raw_requests, raw_constraint, unreachable)
    in_use = {(DRIVER, raw_devices[i]["pool"], f"d{i}") for i in busy if i < len(raw_devices)}
    pools = gather_pools(slices)
    fast = Allocator().allocate([claim], CLASSES, pools, in_use, NODE)
    slow = Allocator().allocate([claim], CLASSES, pools, _Unindexed(in_use), NODE)
    assert fast.allocations == slow.allocations
    assert fast.failure == slow.failure
    assert fast.reports == slow.reports
