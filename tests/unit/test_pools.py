"""Pools and slice contents: pure functions, checked against the official ResourceSlice schema
and the Go-side validation rules ported in the Kubernetes API emulator."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.fabric.types import Location
from app.pools import (
    PoolConfig,
    PoolDevice,
    desired_pools,
    label_value,
    minimum_slices,
    pool_name,
    pool_segment,
    quantity,
    resource_slice_spec,
)
from fabric_dra_sim.kubeapi.context import Cluster, RuleContext
from fabric_dra_sim.kubeapi.dra import resource_slice_causes
from fabric_dra_sim.kubeapi.validation import schema_validator

CONFIG = PoolConfig(
    driver_name="fabric.example.com",
    node_labels={"region": "topology.kubernetes.io/region", "rack": "fabric-dra.io/rack"},
)


def device(i: int, **changes: Any) -> PoolDevice:
    base = PoolDevice(
        name=f"gpu-{i:05d}",
        device_type="gpu",
        location=Location(region="us-east", rack="rack-01", row="row-1"),
        vendor="NVIDIA",
        model="H100",
        uuid=f"GPU-{i:08d}",
        firmware_version="535.104.5",
        memory_mib=81920,
    )
    return replace(base, **changes)


def slice_problems(spec: dict[str, Any]) -> list[str]:
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s-0"},
        "spec": spec,
    }
    problems = [
        e.message for e in schema_validator("ResourceSlice", "resource.k8s.io/v1").iter_errors(obj)
    ]
    problems += [
        f"{c.field}: {c.message}"
        for c in resource_slice_causes(obj, RuleContext(Cluster(34, frozenset()), "v1"))
    ]
    return problems


def test_pools_group_by_region_and_rack_with_node_selectors() -> None:
    devices = [device(1), device(2), device(3, location=Location(region="us-west", rack="r7"))]
    pools = desired_pools(devices, CONFIG)
    assert sorted(pools) == ["us-east/rack-01", "us-west/r7"]
    east = pools["us-east/rack-01"]
    assert east.device_count == 2 and len(east.slices) == 1
    assert east.node_selector == {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {
                        "key": "topology.kubernetes.io/region",
                        "operator": "In",
                        "values": ["us-east"],
                    },
                    {"key": "fabric-dra.io/rack", "operator": "In", "values": ["rack-01"]},
                ]
            }
        ]
    }
    assert east.location == (("region", "us-east"), ("rack", "rack-01"))


def test_device_shape() -> None:
    entry = (
        desired_pools([device(1, capacity={"lanes": 16})], CONFIG)["us-east/rack-01"]
        .slices[0]
        .devices[0]
    )
    assert entry["name"] == "gpu-00001"
    assert entry["attributes"]["deviceType"] == {"string": "gpu"}
    assert entry["attributes"]["firmwareVersion"] == {"version": "535.104.5"}
    assert entry["attributes"]["rack"] == {"string": "rack-01"}
    assert entry["attributes"]["health"] == {"string": "OK"}
    assert entry["capacity"] == {"memory": {"value": "80Gi"}, "lanes": {"value": "16"}}
    assert entry["bindsToNode"] is True
    assert entry["bindingConditions"] == ["FabricDeviceReady"]
    assert entry["bindingFailureConditions"] == ["FabricDeviceFailed"]
    assert "taints" not in entry


def test_non_semver_firmware_is_a_string() -> None:
    entry = (
        desired_pools([device(1, firmware_version="v2.1 build 7")], CONFIG)["us-east/rack-01"]
        .slices[0]
        .devices[0]
    )
    assert entry["attributes"]["firmwareVersion"] == {"string": "v2.1 build 7"}


def test_binding_conditions_can_be_turned_off() -> None:
    entry = (
        desired_pools([device(1)], replace(CONFIG, binds_to_node=False))["us-east/rack-01"]
        .slices[0]
        .devices[0]
    )
    assert not {"bindsToNode", "bindingConditions", "bindingFailureConditions"} & set(entry)


@pytest.mark.parametrize(
    ("changes", "taint_key"),
    [
        ({"health": "Critical"}, "fabric.example.com/unhealthy"),
        ({"cordoned": True}, "fabric.example.com/cordoned"),
        ({"attach_failed": True}, "fabric.example.com/attach-failed"),
        ({"detach_failed": True}, "fabric.example.com/detach-failed"),
        ({"held_by": "system-7"}, "fabric.example.com/held-by-other-host"),
    ],
)
def test_out_of_service_devices_are_tainted_or_withheld(changes: dict, taint_key: str) -> None:
    pool = desired_pools([device(1, **changes), device(2)], CONFIG)["us-east/rack-01"]
    tainted = pool.slices[0].devices[0]
    assert tainted["name"] == "gpu-00001"
    assert [t["key"] for t in tainted["taints"]] == [taint_key]
    assert all(t["effect"] == "NoSchedule" for t in tainted["taints"])

    withheld = desired_pools(
        [device(1, **changes), device(2)], replace(CONFIG, unhealthy="withhold")
    )["us-east/rack-01"]
    assert withheld.withheld == ("gpu-00001",)
    assert [d["name"] for d in withheld.slices[0].devices] == ["gpu-00002"]
    # Where the API server drops taints, withholding is the only safe choice.
    no_taints = desired_pools([device(1, **changes)], replace(CONFIG, taints_supported=False))
    assert no_taints["us-east/rack-01"].withheld == ("gpu-00001",)


def test_a_device_held_by_another_server_names_the_holder_as_a_valid_label_value() -> None:
    entry = (
        desired_pools([device(1, held_by="/redfish/v1/Systems/Blade 7")], CONFIG)["us-east/rack-01"]
        .slices[0]
        .devices[0]
    )
    [taint] = entry["taints"]
    assert taint["key"] == "fabric.example.com/held-by-other-host"
    assert taint["value"].startswith("redfish-v1-Systems-Blade-7-")
    assert len(taint["value"]) <= 63


@pytest.mark.parametrize(
    ("setting", "tainted", "withheld"),
    [("taint", True, False), ("withhold", False, True), ("offer", False, False)],
)
def test_unknown_health_is_not_offered_as_healthy_unless_configured(
    setting: str, tainted: bool, withheld: bool
) -> None:
    config = replace(CONFIG, unknown_health=setting)
    pool = desired_pools([device(1, health="Unknown")], config)["us-east/rack-01"]
    assert (pool.withheld == ("gpu-00001",)) is withheld
    entries = pool.slices[0].devices
    if not withheld:
        keys = [t["key"] for t in entries[0].get("taints", [])]
        assert keys == (["fabric.example.com/health-unknown"] if tainted else [])


def test_unknown_health_is_withheld_where_taints_are_dropped() -> None:
    config = replace(CONFIG, taints_supported=False)
    pool = desired_pools([device(1, health="Unknown")], config)["us-east/rack-01"]
    assert pool.withheld == ("gpu-00001",)


def test_warning_health_is_published_without_taint() -> None:
    entry = (
        desired_pools([device(1, health="Warning")], CONFIG)["us-east/rack-01"].slices[0].devices[0]
    )
    assert entry["attributes"]["health"] == {"string": "Warning"} and "taints" not in entry


def test_a_pool_whose_devices_are_all_withheld_keeps_one_empty_slice() -> None:
    pool = desired_pools([device(1, cordoned=True)], replace(CONFIG, unhealthy="withhold"))[
        "us-east/rack-01"
    ]
    assert len(pool.slices) == 1 and pool.slices[0].devices == ()


def test_chunking_128_and_64_with_taints() -> None:
    pool = desired_pools([device(i) for i in range(300)], CONFIG)["us-east/rack-01"]
    assert [len(s.devices) for s in pool.slices] == [128, 128, 44]
    assert [s.index for s in pool.slices] == [0, 1, 2]
    sick = [device(i, health="Critical") if i < 3 else device(i) for i in range(300)]
    pool = desired_pools(sick, CONFIG)["us-east/rack-01"]
    assert [len(s.devices) for s in pool.slices] == [64, 128, 108]
    assert len(pool.slices) == minimum_slices(3, 297)


def test_long_and_surplus_attributes_are_dropped_and_reported() -> None:
    extras = {f"extra{i:02d}": i for i in range(40)}
    entry_pool = desired_pools([device(1, model="m" * 65, attributes=extras)], CONFIG)[
        "us-east/rack-01"
    ]
    entry = entry_pool.slices[0].devices[0]
    assert "model" not in entry["attributes"]
    assert len(entry["attributes"]) + len(entry["capacity"]) == 32
    reasons = {(d.attribute, d.reason) for d in entry_pool.dropped}
    assert ("model", "longer than 64 characters") in reasons
    assert any(r == "more than 32 attributes" for _, r in reasons)


def test_duplicate_device_names_are_refused() -> None:
    with pytest.raises(ValueError, match="used twice"):
        desired_pools([device(1), device(1)], CONFIG)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("rack-12", "rack-12"), (None, "unknown"), ("Rack 12", "rack-12-"), ("机架", "x-")],
)
def test_pool_segments(value: str | None, expected: str) -> None:
    segment = pool_segment(value)
    assert segment.startswith(expected)
    if expected.endswith("-"):
        assert len(segment) == len(expected) + 8


def test_values_that_sanitise_alike_get_distinct_pools() -> None:
    a = pool_name(Location(region="us-east", rack="Rack 12"), ("region", "rack"))
    b = pool_name(Location(region="us-east", rack="rack 12"), ("region", "rack"))
    assert a != b


def test_pool_name_fits_253_characters_with_many_long_keys() -> None:
    long = "x" * 100
    keys = ("region", "zone", "site", "row", "rack", "fabric", "fabric_zone", "chassis")
    name = pool_name(Location(**dict.fromkeys(keys, long)), keys)
    assert len(name) <= 253 and name.count("/") == 7


@pytest.mark.parametrize(
    ("value", "expected"),
    [("rack_12.a", "rack_12.a"), ("Rack 12", "Rack-12-"), (None, "unknown"), ("-x-", "x-")],
)
def test_label_values(value: str | None, expected: str) -> None:
    assert label_value(value).startswith(expected)


@pytest.mark.parametrize(
    ("amount", "binary", "text"),
    [
        (0, True, "0"),
        (81920 * 2**20, True, "80Gi"),
        (1536, True, "1536"),
        (3072, True, "3Ki"),
        (1000, False, "1k"),
        (274877906944, True, "256Gi"),
        (123, False, "123"),
        (2**70, True, "1024Ei"),
    ],
)
def test_quantities_are_canonical(amount: int, binary: bool, text: str) -> None:
    assert quantity(amount, binary=binary) == text


# Properties over random inventories.
_text = st.text(min_size=1, max_size=80)
_location = st.builds(
    Location,
    region=st.one_of(st.none(), st.sampled_from(["us-east", "eu-west", "Zone A", "东"])),
    rack=st.one_of(st.none(), st.sampled_from(["rack-01", "rack-02", "R 3", "rack_04"])),
    row=st.one_of(st.none(), _text),
)
_device = st.builds(
    PoolDevice,
    name=st.just(""),
    device_type=st.sampled_from(["gpu", "fpga", "nvme", "memory"]),
    location=_location,
    health=st.sampled_from(["OK", "Warning", "Critical", "Unknown"]),
    vendor=st.one_of(st.none(), _text),
    model=st.one_of(st.none(), _text),
    firmware_version=st.one_of(
        st.none(), st.sampled_from(["1.2.3", "1.2", "2.0.0-rc.1+b5"]), _text
    ),
    memory_mib=st.one_of(st.none(), st.integers(0, 2**30)),
    capacity=st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True), st.integers(0, 2**62), max_size=4
    ),
    attributes=st.dictionaries(
        st.from_regex(r"[a-z][a-zA-Z0-9_]{0,31}", fullmatch=True),
        st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=70)),
        max_size=30,
    ),
    cordoned=st.booleans(),
    attach_failed=st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_device, max_size=300), st.sampled_from(["taint", "withhold"]))
def test_any_inventory_gives_valid_minimal_slices(devices: list[PoolDevice], policy: str) -> None:
    devices = [replace(d, name=f"dev-{i}") for i, d in enumerate(devices)]
    config = replace(CONFIG, unhealthy=policy)
    pools = desired_pools(devices, config)
    published: set[str] = set()
    for pool in pools.values():
        names = [d["name"] for s in pool.slices for d in s.devices]
        assert len(names) == len(set(names)), "device names unique in the pool"
        published |= set(names)
        tainted = sum(1 for s in pool.slices for d in s.devices if d.get("taints"))
        assert len(pool.slices) == minimum_slices(tainted, len(names) - tainted)
        for content in pool.slices:
            spec = resource_slice_spec(config.driver_name, pool, content, generation=3)
            assert slice_problems(spec) == []
    expected = {
        d.name
        for d in devices
        if policy == "taint" or not (d.health == "Critical" or d.cordoned or d.attach_failed)
    }
    assert published == expected
