"""The allocator, scenario by scenario: claims, classes and slices as JSON in, allocations or
precise reasons out."""

from __future__ import annotations

from typing import Any

import pytest
from test_allocator_builders import (
    DRIVER,
    NODE,
    RACK,
    REGION,
    attr,
    claim,
    device,
    device_class,
    in_selector,
    request,
    resource_slice,
)

from app.allocator import Allocator, Node, gather_pools, outcome
from app.allocator.model import Claim, DeviceClass

GPU = device_class(
    "gpu.fabric.example.com",
    f'{attr(DRIVER + "/deviceType")} == "gpu"',
    config=[{"profile": "gpu-default"}],
)
NIC = device_class(
    "nic.fabric.example.com",
    f'{attr(DRIVER + "/deviceType")} == "nic"',
    config=[{"profile": "nic-default"}],
)
CLASSES = {c.name: c for c in (GPU, NIC)}


def allocate(
    claims: list[Claim],
    slices: list[dict[str, Any]],
    *,
    classes: dict[str, DeviceClass] | None = None,
    in_use: set[tuple[str, str, str]] | None = None,
    node: Node = NODE,
    allocator: Allocator | None = None,
) -> outcome.Outcome:
    return (allocator or Allocator()).allocate(
        claims, CLASSES if classes is None else classes, gather_pools(slices), in_use or set(), node
    )


def picked(result: outcome.Outcome, uid: str = "uid-claim-0") -> list[tuple[str, str, str]]:
    assert result.failure is None, result.failure
    return [
        (r["request"], r["pool"], r["device"])
        for r in result.allocations[uid]["devices"]["results"]
    ]


def gpus(pool: str, *names: str, **attributes: Any) -> list[dict[str, Any]]:
    return [device(n, deviceType="gpu", **attributes) for n in names]


def test_the_seed_example_joins_a_gpu_and_a_nic_in_one_rack_and_passes_config_in_order() -> None:
    rack_attribute = f"{DRIVER}/rack"
    slices = [
        # The first GPU in name order sits in a rack without a NIC: the search must back off.
        resource_slice(
            "us-east/rack-11",
            gpus("us-east/rack-11", "gpu-a", rack="rack-11"),
            selector=in_selector(REGION, "us-east"),
        ),
        resource_slice(
            "us-east/rack-12",
            [
                device("gpu-b", deviceType="gpu", rack="rack-12"),
                device("nic-a", deviceType="nic", rack="rack-12"),
            ],
            selector=in_selector(REGION, "us-east"),
        ),
    ]
    the_claim = claim(
        request("gpu", GPU.name),
        request("nic", NIC.name),
        constraints=[{"requests": ["gpu", "nic"], "matchAttribute": rack_attribute}],
        config=[
            {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {"mig": 1}}},
            {"opaque": {"driver": DRIVER, "parameters": {"all": True}}},
        ],
    )
    result = allocate([the_claim], slices)
    assert picked(result) == [
        ("gpu", "us-east/rack-12", "gpu-b"),
        ("nic", "us-east/rack-12", "nic-a"),
    ]
    allocation = result.allocations["uid-claim-0"]
    assert allocation["devices"]["config"] == [
        {
            "source": "FromClass",
            "requests": ["gpu"],
            "opaque": {"driver": DRIVER, "parameters": {"profile": "gpu-default"}},
        },
        {
            "source": "FromClass",
            "requests": ["nic"],
            "opaque": {"driver": DRIVER, "parameters": {"profile": "nic-default"}},
        },
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {"driver": DRIVER, "parameters": {"mig": 1}},
        },
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"all": True}}},
    ]
    assert allocation["nodeSelector"] == in_selector(REGION, "us-east")


def test_class_config_lists_every_request_that_used_the_class_once() -> None:
    slices = [resource_slice("p", gpus("p", "g0", "g1"))]
    result = allocate([claim(request("a", GPU.name), request("b", GPU.name))], slices)
    assert result.allocations["uid-claim-0"]["devices"]["config"] == [
        {
            "source": "FromClass",
            "requests": ["a", "b"],
            "opaque": {"driver": DRIVER, "parameters": {"profile": "gpu-default"}},
        }
    ]


def test_exact_count_takes_the_first_devices_in_pool_then_name_order() -> None:
    slices = [
        resource_slice("b-pool", gpus("b", "g0")),
        resource_slice("a-pool", gpus("a", "g9", "g1")),
    ]
    result = allocate([claim(request("gpu", GPU.name, count=2))], slices)
    assert picked(result) == [("gpu", "a-pool", "g1"), ("gpu", "a-pool", "g9")]


def test_request_selectors_narrow_the_class() -> None:
    slices = [
        resource_slice(
            "p",
            [
                device("g0", deviceType="gpu", model="A100"),
                device("g1", deviceType="gpu", model="H100"),
            ],
        )
    ]
    result = allocate(
        [claim(request("gpu", GPU.name, f'{attr(DRIVER + "/model")} == "H100"'))], slices
    )
    assert picked(result) == [("gpu", "p", "g1")]


def test_all_takes_every_matching_device() -> None:
    slices = [resource_slice("p", [*gpus("p", "g0", "g1"), device("n0", deviceType="nic")])]
    result = allocate([claim(request("gpu", GPU.name, mode="All"))], slices)
    assert picked(result) == [("gpu", "p", "g0"), ("gpu", "p", "g1")]


def test_all_needs_at_least_one_device() -> None:
    result = allocate(
        [claim(request("gpu", GPU.name, mode="All"))],
        [resource_slice("p", [device("n0", deviceType="nic")])],
    )
    assert result.failure is not None
    assert result.failure.reason == outcome.NOT_ENOUGH_DEVICES


def test_all_fails_while_a_matching_device_is_in_use_unless_admin_access() -> None:
    slices = [resource_slice("p", gpus("p", "g0", "g1"))]
    busy = {(DRIVER, "p", "g1")}
    failed = allocate([claim(request("gpu", GPU.name, mode="All"))], slices, in_use=busy)
    assert failed.failure is not None and failed.failure.reason == outcome.DEVICES_NOT_FREE
    admin = allocate([claim(request("gpu", GPU.name, mode="All", admin=True))], slices, in_use=busy)
    assert picked(admin) == [("gpu", "p", "g0"), ("gpu", "p", "g1")]
    assert all(
        r["adminAccess"] is True for r in admin.allocations["uid-claim-0"]["devices"]["results"]
    )


def test_all_fails_while_a_pool_reaching_the_node_is_incomplete() -> None:
    slices = [resource_slice("p", gpus("p", "g0")), resource_slice("q", gpus("q", "g1"), count=2)]
    result = allocate([claim(request("gpu", GPU.name, mode="All"))], slices)
    assert result.failure is not None
    assert result.failure.reason == outcome.POOLS_NOT_READY
    assert result.failure.incomplete_pools == (f"{DRIVER}/q",)


def test_admin_access_may_take_a_device_in_use_and_does_not_hold_it() -> None:
    slices = [resource_slice("p", gpus("p", "g0"))]
    busy = {(DRIVER, "p", "g0")}
    result = allocate(
        [
            claim(request("watch", GPU.name, admin=True), name="one"),
            claim(request("use", GPU.name, admin=True), name="two"),
        ],
        slices,
        in_use=busy,
    )
    assert picked(result, "uid-one") == [("watch", "p", "g0")]
    assert picked(result, "uid-two") == [("use", "p", "g0")]
    normal = allocate([claim(request("gpu", GPU.name))], slices, in_use=busy)
    assert normal.failure is not None
    assert normal.failure.requests[0].in_use == 1


def test_devices_in_use_are_skipped() -> None:
    slices = [resource_slice("p", gpus("p", "g0", "g1"))]
    result = allocate([claim(request("gpu", GPU.name))], slices, in_use={(DRIVER, "p", "g0")})
    assert picked(result) == [("gpu", "p", "g1")]


def test_two_claims_of_one_pod_do_not_share_a_device() -> None:
    slices = [resource_slice("p", gpus("p", "g0", "g1"))]
    result = allocate(
        [claim(request("gpu", GPU.name), name="one"), claim(request("gpu", GPU.name), name="two")],
        slices,
    )
    assert picked(result, "uid-one") == [("gpu", "p", "g0")]
    assert picked(result, "uid-two") == [("gpu", "p", "g1")]
    short = allocate(
        [
            claim(request("gpu", GPU.name), name="one"),
            claim(request("gpu", GPU.name, count=2), name="two"),
        ],
        slices,
    )
    assert short.failure is not None
    assert short.failure.reason == outcome.DEVICES_CONTENDED


def test_an_incomplete_pool_is_skipped_and_named() -> None:
    slices = [resource_slice("us-east/rack-12", gpus("p", "g0"), count=2)]
    result = allocate([claim(request("gpu", GPU.name))], slices)
    assert result.failure is not None
    assert result.failure.reason == outcome.NOT_ENOUGH_DEVICES
    assert result.failure.incomplete_pools == (f"{DRIVER}/us-east/rack-12",)
    assert result.failure.requests[0].considered == 0


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    slices = [
        resource_slice("p", gpus("p", "old"), generation=1),
        resource_slice("p", gpus("p", "new"), generation=2),
    ]
    assert picked(allocate([claim(request("gpu", GPU.name))], slices)) == [("gpu", "p", "new")]
    # A newer generation that is still incomplete hides the complete older one.
    torn = [
        resource_slice("p", gpus("p", "old"), generation=1),
        resource_slice("p", gpus("p", "new"), generation=2, count=2),
    ]
    assert allocate([claim(request("gpu", GPU.name))], torn).failure is not None


def test_a_pool_with_duplicate_device_names_is_invalid_and_skipped() -> None:
    slices = [
        resource_slice("bad", gpus("bad", "g0"), count=2),
        resource_slice("bad", gpus("bad", "g0"), count=2),
        resource_slice("good", gpus("good", "g5")),
    ]
    result = allocate([claim(request("gpu", GPU.name))], slices)
    assert picked(result) == [("gpu", "good", "g5")]
    failed = allocate([claim(request("gpu", GPU.name, count=2))], slices)
    assert failed.failure is not None
    assert failed.failure.invalid_pools == (f"{DRIVER}/bad (duplicate device name 'g0')",)


@pytest.mark.parametrize(
    ("selector", "reaches"),
    [
        (in_selector(RACK, "rack-12"), True),
        (in_selector(RACK, "rack-13"), False),
        (in_selector(RACK, "rack-13", operator="NotIn"), True),
        (in_selector(RACK, "rack-12", operator="NotIn"), False),
        (in_selector(REGION, operator="Exists"), True),
        (in_selector("fabric-dra.io/none", operator="Exists"), False),
        (in_selector("fabric-dra.io/none", operator="DoesNotExist"), True),
        (in_selector("gpus", "4", operator="Gt"), True),
        (in_selector("gpus", "8", operator="Gt"), False),
        (in_selector("gpus", "9", operator="Lt"), True),
        (in_selector(RACK, "9", operator="Lt"), False),
        (
            {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
                        ]
                    }
                ]
            },
            True,
        ),
        ({"nodeSelectorTerms": [{}]}, False),
    ],
)
def test_a_pool_reaches_the_node_through_its_node_selector(
    selector: dict[str, Any], reaches: bool
) -> None:
    result = allocate(
        [claim(request("gpu", GPU.name))], [resource_slice("p", gpus("p", "g0"), selector=selector)]
    )
    assert result.ok is reaches


@pytest.mark.parametrize(("node_name", "reaches"), [("node-1", True), ("node-2", False)])
def test_a_node_local_pool_reaches_only_its_node(node_name: str, reaches: bool) -> None:
    result = allocate(
        [claim(request("gpu", GPU.name))],
        [resource_slice("p", gpus("p", "g0"), node_name=node_name)],
    )
    assert result.ok is reaches
    if reaches:
        assert result.allocations["uid-claim-0"]["nodeSelector"] == {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
            ]
        }


def test_an_all_nodes_pool_gives_no_node_selector() -> None:
    result = allocate([claim(request("gpu", GPU.name))], [resource_slice("p", gpus("p", "g0"))])
    assert "nodeSelector" not in result.allocations["uid-claim-0"]


def test_a_device_that_binds_to_the_node_pins_the_allocation_to_the_node() -> None:
    slices = [
        resource_slice(
            "p",
            [device("g0", deviceType="gpu", binds=True)],
            selector=in_selector(REGION, "us-east"),
        )
    ]
    allocation = allocate([claim(request("gpu", GPU.name))], slices).allocations["uid-claim-0"]
    assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        "node-1"
    ]
    assert allocation["devices"]["results"][0]["bindingConditions"] == ["FabricDeviceReady"]


def test_pool_selectors_merge_into_one_term_and_all_nodes_pools_add_nothing() -> None:
    slices = [
        resource_slice("a", gpus("a", "g0"), selector=in_selector(REGION, "us-east")),
        resource_slice("b", gpus("b", "g1"), selector=in_selector(RACK, "rack-12")),
        resource_slice("c", gpus("c", "g2")),
    ]
    result = allocate([claim(request("gpu", GPU.name, count=3))], slices)
    assert result.allocations["uid-claim-0"]["nodeSelector"] == {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": REGION, "operator": "In", "values": ["us-east"]},
                    {"key": RACK, "operator": "In", "values": ["rack-12"]},
                ]
            }
        ]
    }


def test_pools_with_binding_conditions_are_tried_after_the_others() -> None:
    slices = [
        resource_slice("a", [device("g0", deviceType="gpu", binds=True)]),
        resource_slice("z", gpus("z", "g1")),
    ]
    assert picked(allocate([claim(request("gpu", GPU.name))], slices)) == [("gpu", "z", "g1")]
    result = allocate([claim(request("gpu", GPU.name, count=2))], slices)
    assert picked(result) == [("gpu", "z", "g1"), ("gpu", "a", "g0")]


def test_tainted_devices_are_skipped_unless_tolerated() -> None:
    taint = {"key": f"{DRIVER}/unhealthy", "value": "Critical", "effect": "NoSchedule"}
    slices = [resource_slice("p", [device("g0", deviceType="gpu", taints=[taint])])]
    result = allocate([claim(request("gpu", GPU.name))], slices)
    assert result.failure is not None and result.failure.requests[0].tainted == 1
    tolerant = request(
        "gpu", GPU.name, tolerations=[{"key": f"{DRIVER}/unhealthy", "operator": "Exists"}]
    )
    assert picked(allocate([claim(tolerant)], slices)) == [("gpu", "p", "g0")]


def test_match_attribute_refuses_a_device_lacking_the_attribute() -> None:
    slices = [
        resource_slice(
            "p",
            [
                device("g0", deviceType="gpu"),
                device("g1", deviceType="gpu", rack="r1"),
                device("g2", deviceType="gpu", rack="r1"),
            ],
        )
    ]
    result = allocate(
        [
            claim(
                request("gpu", GPU.name, count=2),
                constraints=[{"matchAttribute": f"{DRIVER}/rack"}],
            )
        ],
        slices,
    )
    assert picked(result) == [("gpu", "p", "g1"), ("gpu", "p", "g2")]


def test_an_impossible_constraint_is_named() -> None:
    slices = [
        resource_slice(
            "p",
            [device("g0", deviceType="gpu", rack="r1"), device("n0", deviceType="nic", rack="r2")],
        )
    ]
    result = allocate(
        [
            claim(
                request("gpu", GPU.name),
                request("nic", NIC.name),
                constraints=[{"matchAttribute": f"{DRIVER}/rack"}],
            )
        ],
        slices,
    )
    assert result.failure is not None
    assert result.failure.reason == outcome.CONSTRAINT_FAILED
    assert result.failure.constraint == f"{DRIVER}/rack"
    assert "matchAttribute" in result.failure.message


def test_distinct_attribute_needs_different_values() -> None:
    slices = [
        resource_slice(
            "p",
            [
                device("g0", deviceType="gpu", slot=1),
                device("g1", deviceType="gpu", slot=1),
                device("g2", deviceType="gpu", slot=2),
            ],
        )
    ]
    result = allocate(
        [
            claim(
                request("gpu", GPU.name, count=2),
                constraints=[{"distinctAttribute": f"{DRIVER}/slot"}],
            )
        ],
        slices,
    )
    assert picked(result) == [("gpu", "p", "g0"), ("gpu", "p", "g2")]


def test_first_available_takes_the_first_subrequest_that_fits() -> None:
    slices = [resource_slice("p", [device("g0", deviceType="gpu", model="A100")])]
    spec = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "big",
                "deviceClassName": GPU.name,
                "selectors": [{"cel": {"expression": f'{attr(DRIVER + "/model")} == "H100"'}}],
            },
            {"name": "small", "deviceClassName": GPU.name},
        ],
    }
    result = allocate(
        [
            claim(
                spec, config=[{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {}}}]
            )
        ],
        slices,
    )
    assert picked(result) == [("gpu/small", "p", "g0")]
    assert result.allocations["uid-claim-0"]["devices"]["config"][0]["requests"] == ["gpu/small"]


def test_a_missing_device_class_is_reported() -> None:
    result = allocate([claim(request("gpu", "nope"))], [resource_slice("p", gpus("p", "g0"))])
    assert result.failure is not None
    assert result.failure.reason == outcome.CLASS_NOT_FOUND
    assert result.failure.device_class == "nope"


@pytest.mark.parametrize(
    ("class_selector", "request_selector", "reason", "blamed"),
    [
        ("device.driver ==", "", outcome.SELECTOR_INVALID, "device class"),
        ("true", "device.attributes[", outcome.SELECTOR_INVALID, "request"),
        ("1 + 1", "", outcome.SELECTOR_INVALID, "device class"),
        ("true", "x" * (10 * 1024 + 1), outcome.SELECTOR_INVALID, "request"),
        (f'{attr(DRIVER + "/nothere")} == "x"', "", outcome.SELECTOR_FAILED, "device class"),
        ("true", f"{attr(DRIVER + '/model')}", outcome.SELECTOR_FAILED, "request"),
        (
            "true",
            "["
            + ",".join(["1"] * 200)
            + "].all(a, ["
            + ",".join(["1"] * 200)
            + "].all(b, a == b))",
            outcome.SELECTOR_FAILED,
            "request",
        ),
    ],
    ids=[
        "syntax",
        "request-syntax",
        "not-bool",
        "too-long",
        "unknown-attribute",
        "non-bool-value",
        "too-expensive",
    ],
)
def test_bad_cel_is_a_clean_failure_naming_the_class_or_request(
    class_selector: str, request_selector: str, reason: str, blamed: str
) -> None:
    classes = {"c": device_class("c", class_selector)}
    req = request("gpu", "c", *([request_selector] if request_selector else []))
    result = allocate(
        [claim(req)], [resource_slice("p", [device("g0", model="A")])], classes=classes
    )
    assert result.failure is not None
    assert result.failure.reason == reason
    assert result.failure.message.startswith(
        "device class 'c'" if blamed == "device class" else "claim default/claim-0, request 'gpu'"
    )
    assert result.failure.expression == (
        class_selector if blamed == "device class" else request_selector
    )


def test_a_runtime_error_names_the_device() -> None:
    classes = {"c": device_class("c", f'{attr(DRIVER + "/model")} == "A"')}
    result = allocate(
        [claim(request("gpu", "c"))],
        [resource_slice("p", [device("g0", model="A"), device("g1")])],
        classes=classes,
    )
    assert result.failure is not None and result.failure.device == "g1"
    assert "p/g1" in result.failure.message


def test_a_search_that_runs_too_long_gives_up_with_a_reason() -> None:
    slices = [resource_slice("p", [device(f"g{i}", deviceType="gpu", slot=i) for i in range(30)])]
    result = Allocator(max_steps=50).allocate(
        [
            claim(
                request("gpu", GPU.name, count=3),
                constraints=[{"matchAttribute": f"{DRIVER}/slot"}],
            )
        ],
        CLASSES,
        gather_pools(slices),
        set(),
        NODE,
    )
    assert result.failure is not None
    assert result.failure.reason == outcome.SEARCH_LIMIT


def test_repeated_allocations_reuse_compiled_expressions_and_selector_results() -> None:
    engine = Allocator()
    slices = [resource_slice("p", gpus("p", "g0", "g1"))]
    the_claim = claim(request("gpu", GPU.name, f'{attr(DRIVER + "/deviceType")} != "x"'))
    first = allocate([the_claim], slices, allocator=engine)
    evaluations = engine.stats()["selector_evaluations"]
    # Same devices republished under a new generation: still cached.
    again = allocate(
        [the_claim], [resource_slice("p", gpus("p", "g0", "g1"), generation=7)], allocator=engine
    )
    assert picked(first) == picked(again)
    assert engine.stats()["selector_evaluations"] == evaluations
    assert engine.stats()["selector_hits"] >= 2
    changed = [resource_slice("p", gpus("p", "g0", "g1", model="new"), generation=8)]
    allocate([the_claim], changed, allocator=engine)
    assert engine.stats()["selector_evaluations"] > evaluations


def test_an_allocation_never_holds_more_than_32_devices() -> None:
    slices = [resource_slice("p", gpus("p", *(f"g{i:02d}" for i in range(40))))]
    result = allocate([claim(request("gpu", GPU.name, mode="All"))], slices)
    assert result.failure is not None
    assert result.failure.reason == outcome.TOO_MANY_DEVICES
    split = allocate(
        [claim(request("a", GPU.name, count=20), request("b", GPU.name, count=13))], slices
    )
    assert split.failure is not None
    assert split.failure.reason == outcome.TOO_MANY_DEVICES
    assert picked(
        allocate(
            [claim(request("a", GPU.name, count=20), request("b", GPU.name, count=12))], slices
        )
    )[-1] == ("b", "p", "g31")


def test_per_device_node_selection_lets_each_device_name_its_node() -> None:
    spec = resource_slice(
        "p",
        [
            {**device("g0", deviceType="gpu"), "nodeName": "node-2"},
            {**device("g1", deviceType="gpu"), "nodeName": "node-1"},
            {**device("g2", deviceType="gpu"), "allNodes": True},
        ],
    )
    del spec["spec"]["allNodes"]
    spec["spec"]["perDeviceNodeSelection"] = True
    result = allocate([claim(request("gpu", GPU.name, count=2))], [spec])
    assert picked(result) == [("gpu", "p", "g1"), ("gpu", "p", "g2")]
    assert result.allocations["uid-claim-0"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][
        0
    ]["values"] == ["node-1"]
    assert allocate([claim(request("gpu", GPU.name, count=3))], [spec]).failure is not None


def named(resource_slice_json: dict[str, Any], name: str) -> dict[str, Any]:
    resource_slice_json["metadata"]["name"] = name
    return resource_slice_json


def test_slices_that_disagree_on_resource_slice_count_make_the_pool_invalid_and_say_so() -> None:
    slices = [
        named(resource_slice("torn", gpus("torn", "g0"), count=2), "torn-a"),
        named(resource_slice("torn", gpus("torn", "g1"), count=3), "torn-b"),
        resource_slice("good", gpus("good", "g5")),
    ]
    (torn, good) = sorted(gather_pools(slices), key=lambda p: p.name, reverse=True)
    reason = (
        "the slices of generation 0 disagree on resourceSliceCount: "
        "2 (slice 'torn-a'); 3 (slice 'torn-b')"
    )
    assert (torn.invalid_reason, torn.devices, torn.usable) == (reason, (), False)
    assert good.usable
    # Nothing comes from the torn pool, and the reason reaches the failure and its message.
    assert picked(allocate([claim(request("gpu", GPU.name))], slices)) == [("gpu", "good", "g5")]
    failed = allocate([claim(request("gpu", GPU.name, count=2))], slices)
    assert failed.failure is not None
    assert failed.failure.reason == outcome.NOT_ENOUGH_DEVICES
    assert failed.failure.invalid_pools == (f"{DRIVER}/torn ({reason})",)
    assert failed.failure.incomplete_pools == ()
    assert reason in failed.failure.message
    every = allocate([claim(request("gpu", GPU.name, mode="All"))], slices)
    assert every.failure is not None and every.failure.reason == outcome.POOLS_NOT_READY
    assert reason in every.failure.message
    # Two slices that agree on a count of 2 are a complete, valid pool.
    agreed = [
        named(resource_slice("torn", gpus("torn", "g0"), count=2), "torn-a"),
        named(resource_slice("torn", gpus("torn", "g1"), count=2), "torn-b"),
    ]
    assert picked(allocate([claim(request("gpu", GPU.name, count=2))], agreed)) == [
        ("gpu", "torn", "g0"),
        ("gpu", "torn", "g1"),
    ]


def test_all_fails_when_a_matching_device_has_a_taint_it_does_not_tolerate() -> None:
    # Upstream allocator_test.go "tainted-all-devices-single": All takes no subset.
    taint = {"key": f"{DRIVER}/unhealthy", "value": "Critical", "effect": "NoExecute"}
    slices = [
        resource_slice(
            "p", [device("g0", deviceType="gpu"), device("g1", deviceType="gpu", taints=[taint])]
        )
    ]
    result = allocate([claim(request("gpu", GPU.name, mode="All"))], slices)
    assert result.failure is not None
    assert result.failure.reason == outcome.DEVICES_TAINTED
    assert result.failure.requests[0].tainted == 1
    assert "taints it does not tolerate" in result.failure.message
    tolerant = request(
        "gpu",
        GPU.name,
        mode="All",
        tolerations=[{"key": f"{DRIVER}/unhealthy", "operator": "Exists"}],
    )
    assert picked(allocate([claim(tolerant)], slices)) == [("gpu", "p", "g0"), ("gpu", "p", "g1")]
    # A taint without effect does not count.
    harmless = [
        resource_slice("p", [device("g0", deviceType="gpu", taints=[{**taint, "effect": "None"}])])
    ]
    assert picked(allocate([claim(request("gpu", GPU.name, mode="All"))], harmless)) == [
        ("gpu", "p", "g0")
    ]


def test_the_admin_requests_of_one_claim_never_pick_the_same_device() -> None:
    slices = [resource_slice("p", gpus("p", "g0", "g1"))]
    busy = {(DRIVER, "p", "g0")}
    both = allocate(
        [claim(request("watch", GPU.name, admin=True), request("use", GPU.name, admin=True))],
        slices,
        in_use=busy,
    )
    assert picked(both) == [("watch", "p", "g0"), ("use", "p", "g1")]
    mixed = allocate(
        [claim(request("use", GPU.name), request("watch", GPU.name, admin=True))], slices
    )
    assert picked(mixed) == [("use", "p", "g0"), ("watch", "p", "g1")]
    one = [resource_slice("p", gpus("p", "g0"))]
    short = allocate(
        [claim(request("watch", GPU.name, admin=True), request("use", GPU.name, admin=True))], one
    )
    assert short.failure is not None and short.failure.reason == outcome.DEVICES_CONTENDED
    # Upstream "all-devices-some-allocating-admin-access": the first request holds a device.
    every = allocate(
        [
            claim(
                request("one", GPU.name, admin=True),
                request("all", GPU.name, admin=True, mode="All"),
            )
        ],
        slices,
    )
    assert every.failure is not None


def test_request_tolerations_are_copied_into_the_allocation_results() -> None:
    # Upstream "tainted-two-devices-prioritized-list-tolerated": the chosen subrequest's own.
    taint = {"key": f"{DRIVER}/unhealthy", "value": "Critical", "effect": "NoExecute"}
    toleration = {
        "key": f"{DRIVER}/unhealthy",
        "operator": "Equal",
        "value": "Critical",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    }
    slices = [
        resource_slice(
            "p", [device("g0", deviceType="gpu", taints=[taint]), device("g1", deviceType="gpu")]
        )
    ]
    spec = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "strict", "deviceClassName": GPU.name, "count": 2},
            {
                "name": "tolerant",
                "deviceClassName": GPU.name,
                "count": 2,
                "tolerations": [toleration, {"operator": "Exists", "effect": "NoSchedule"}],
            },
        ],
    }
    result = allocate(
        [claim(spec, request("plain", GPU.name))], [*slices, resource_slice("q", gpus("q", "g9"))]
    )
    results = result.allocations["uid-claim-0"]["devices"]["results"]
    assert [(r["request"], r["device"]) for r in results] == [
        ("gpu/tolerant", "g0"),
        ("gpu/tolerant", "g1"),
        ("plain", "g9"),
    ]
    assert (
        results[0]["tolerations"]
        == results[1]["tolerations"]
        == [toleration, {"operator": "Exists", "effect": "NoSchedule"}]
    )
    assert "tolerations" not in results[2]


def test_claim_config_for_subrequests_that_were_not_chosen_is_left_out() -> None:
    slices = [resource_slice("p", [device("g0", deviceType="gpu", model="A100")])]
    spec = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "big",
                "deviceClassName": GPU.name,
                "selectors": [{"cel": {"expression": f'{attr(DRIVER + "/model")} == "H100"'}}],
            },
            {"name": "small", "deviceClassName": GPU.name},
        ],
    }

    def opaque(tag: str) -> dict[str, Any]:
        return {"driver": DRIVER, "parameters": {"tag": tag}}

    config = [
        {"requests": ["gpu/big"], "opaque": opaque("big")},
        {"requests": ["gpu/small"], "opaque": opaque("small")},
        {"requests": ["gpu"], "opaque": opaque("parent")},
        {"requests": ["gpu/big", "gpu/small"], "opaque": opaque("either")},
        {"opaque": opaque("all")},
    ]
    result = allocate([claim(spec, config=config)], slices)
    assert picked(result) == [("gpu/small", "p", "g0")]
    claim_config = [
        c
        for c in result.allocations["uid-claim-0"]["devices"]["config"]
        if c["source"] == "FromClaim"
    ]
    assert claim_config == [
        {"source": "FromClaim", "requests": ["gpu/small"], "opaque": opaque("small")},
        {"source": "FromClaim", "requests": ["gpu"], "opaque": opaque("parent")},
        {"source": "FromClaim", "requests": ["gpu/big", "gpu/small"], "opaque": opaque("either")},
        {"source": "FromClaim", "opaque": opaque("all")},
    ]
