"""What-if: which nodes and pools could satisfy a claim now, and why the others cannot."""

from __future__ import annotations

from test_allocator_builders import (
    DRIVER,
    RACK,
    REGION,
    device,
    device_class,
    in_selector,
    resource_slice,
)

from app.allocator import Allocator, Node, gather_pools, outcome, what_if

GPU = device_class("gpu", 'device.attributes["fabric.example.com"].deviceType == "gpu"')
NODES = [
    Node("node-a", {REGION: "us-east", RACK: "rack-1"}),
    Node("node-b", {REGION: "us-east", RACK: "rack-2"}),
    Node("node-c", {REGION: "us-west", RACK: "rack-9"}),
]
POOLS = gather_pools(
    [
        resource_slice(
            "us-east/rack-1", [device("g0", deviceType="gpu")], selector=in_selector(RACK, "rack-1")
        ),
        resource_slice(
            "us-east/rack-2", [device("g1", deviceType="gpu")], selector=in_selector(RACK, "rack-2")
        ),
        resource_slice(
            "us-east/shared",
            [device("g2", deviceType="gpu")],
            selector=in_selector(REGION, "us-east"),
        ),
    ]
)
SPEC = {
    "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 2}}]}
}


def test_what_if_answers_each_node_with_its_pools_or_its_reason() -> None:
    answers = what_if(SPEC, {"gpu": GPU}, POOLS, set(), NODES)
    assert [a.node for a in answers] == ["node-a", "node-b", "node-c"]
    assert [a.satisfiable for a in answers] == [True, True, False]
    assert answers[0].pools == (f"{DRIVER}/us-east/rack-1", f"{DRIVER}/us-east/shared")
    assert answers[0].allocation is not None
    assert [r["device"] for r in answers[0].allocation["devices"]["results"]] == ["g0", "g2"]
    failure = answers[2].failure
    assert failure is not None and failure.reason == outcome.NOT_ENOUGH_DEVICES
    assert failure.requests[0].considered == 0
    assert "0 devices reachable" in failure.message


def test_what_if_counts_devices_in_use() -> None:
    answers = what_if(
        SPEC,
        {"gpu": GPU},
        POOLS,
        {(DRIVER, "us-east/shared", "g2")},
        NODES[:1],
        allocator=Allocator(),
    )
    failure = answers[0].failure
    assert failure is not None
    assert (failure.requests[0].matched, failure.requests[0].in_use) == (2, 1)
    assert answers[0].pools == (f"{DRIVER}/us-east/rack-1",)


def test_what_if_refuses_an_unreadable_claim_spec_for_every_node() -> None:
    spec = {"devices": {"requests": [{"name": "gpu"}]}}
    answers = what_if(spec, {"gpu": GPU}, POOLS, set(), NODES)
    assert all(a.failure is not None and a.failure.reason == outcome.INVALID_CLAIM for a in answers)
    assert "exactly one of" in (answers[0].failure.message if answers[0].failure else "")


def test_what_if_names_a_pool_whose_slices_disagree_on_their_count() -> None:
    torn = [
        resource_slice("us-east/rack-1", [device("g0", deviceType="gpu")], count=1),
        resource_slice("us-east/rack-1", [device("g1", deviceType="gpu")], count=2),
    ]
    torn[1]["metadata"]["name"] = "rack-1-b"
    (answer,) = what_if(SPEC, {"gpu": GPU}, gather_pools(torn), set(), NODES[:1])
    failure = answer.failure
    assert failure is not None and not answer.satisfiable
    reason = (
        "the slices of generation 0 disagree on resourceSliceCount: "
        "1 (slice 'us-east-rack-1-0'); 2 (slice 'rack-1-b')"
    )
    assert failure.invalid_pools == (f"{DRIVER}/us-east/rack-1 ({reason})",)
    assert reason in failure.message
