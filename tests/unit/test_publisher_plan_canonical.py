"""The publisher plan against the values the API server answers: a taint's ``timeAdded``
(stamped by defaulting on every write that omits it) is read back and sent on update, so an
unchanged taint keeps its age; a new taint is left for the server to stamp."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.fabric.types import Location
from app.pools import DesiredPool, PoolConfig, PoolDevice, desired_pools, resource_slice_spec
from app.publisher.plan import (
    TAINT_TIMES,
    content_key,
    existing_slice,
    keep_taint_times,
    plan_pool,
    taint_times,
)

DRIVER = "fabric.example.com"
CONFIG = PoolConfig(driver_name=DRIVER, binds_to_node=False)
POOL = "us-east/rack-1"
OLD = "2020-01-01T00:00:00Z"


def devices(
    count: int, *, tainted: tuple[int, ...] = (), memory_mib: int = 81920
) -> list[PoolDevice]:
    return [
        PoolDevice(
            name=f"gpu-{i:04d}",
            device_type="gpu",
            location=Location(region="us-east", rack="rack-1"),
            memory_mib=memory_mib if i == 2 else 81920,
            health="Critical" if i in tainted else "OK",
        )
        for i in range(count)
    ]


def pool(**kw: Any) -> DesiredPool:
    return desired_pools(devices(3, **kw), CONFIG)[POOL]


def stored(desired: DesiredPool, when: str = OLD) -> dict[str, Any]:
    """The slice as the API server holds it: every taint stamped with ``when``."""
    spec = copy.deepcopy(resource_slice_spec(DRIVER, desired, desired.slices[0], 1))
    for device in spec["devices"]:
        for taint in device.get("taints", []):
            taint["timeAdded"] = when
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"0-{DRIVER}-abcde", "uid": "u", "resourceVersion": "7"},
        "spec": spec,
    }


def test_taint_times_are_read_per_device_and_taint() -> None:
    obj = stored(pool(tainted=(0,)))
    times = taint_times(obj["spec"])
    assert list(times.values()) == [OLD]
    assert existing_slice(obj, DRIVER).taint_times == times


def test_a_slim_spec_carries_the_taint_times() -> None:
    slim = {
        "metadata": {"name": f"0-{DRIVER}-abcde"},
        "spec": {
            "pool": {"name": POOL, "generation": 1, "resourceSliceCount": 1},
            TAINT_TIMES: {"k": OLD},
        },
    }
    assert existing_slice(slim, DRIVER, "key").taint_times == {"k": OLD}


def test_an_update_sends_back_the_time_of_an_unchanged_taint() -> None:
    before = pool(tainted=(0,))
    current = existing_slice(stored(before), DRIVER)
    after = pool(tainted=(0,), memory_mib=40960)  # another device changes
    plan = plan_pool(DRIVER, POOL, after, [current])
    (update,) = plan.writes
    assert update.verb == "update" and update.body is not None
    taints = update.body["spec"]["devices"][0]["taints"]
    assert [t["timeAdded"] for t in taints] == [OLD]


def test_a_new_taint_is_left_for_the_server_to_stamp() -> None:
    current = existing_slice(stored(pool(tainted=(0,))), DRIVER)
    plan = plan_pool(DRIVER, POOL, pool(tainted=(0, 1)), [current])
    (update,) = plan.writes
    assert update.body is not None
    first, second = (d["taints"] for d in update.body["spec"]["devices"][:2])
    assert first[0]["timeAdded"] == OLD
    assert "timeAdded" not in second[0]


def test_a_changed_taint_is_a_new_taint() -> None:
    current = existing_slice(stored(pool(tainted=(0,))), DRIVER)
    changed = {
        k: f"x{v}" if k == "value" else v
        for k, v in pool(tainted=(0,)).slices[0].devices[0]["taints"][0].items()
    }
    spec = {"devices": [{"name": "gpu-0000", "taints": [changed]}]}
    keep_taint_times(spec, current.taint_times)
    assert "timeAdded" not in spec["devices"][0]["taints"][0]


def test_the_desired_pool_is_not_modified() -> None:
    desired = pool(tainted=(0,))
    original = copy.deepcopy(desired.slices[0].devices)
    current = existing_slice(stored(desired), DRIVER)
    plan_pool(
        DRIVER,
        POOL,
        pool(tainted=(0,), memory_mib=40960),
        [replace(current, resource_slice_count=9)],
    )
    spec = resource_slice_spec(DRIVER, desired, desired.slices[0], 1)
    keep_taint_times(spec, current.taint_times)
    assert list(desired.slices[0].devices) == list(original)
    assert "timeAdded" not in desired.slices[0].devices[0]["taints"][0]


def test_a_slice_in_sync_apart_from_the_server_time_is_not_rewritten() -> None:
    desired = pool(tainted=(0,))
    current = existing_slice(stored(desired, "2026-06-01T12:00:00Z"), DRIVER)
    assert plan_pool(DRIVER, POOL, desired, [current]).writes == ()


def test_counter_values_compare_by_quantity_like_capacities() -> None:
    def content(value: str) -> dict[str, Any]:
        return {
            "sharedCounters": [{"name": "set", "counters": {"mem": {"value": value}}}],
            "devices": [
                {
                    "name": "d",
                    "consumesCounters": [
                        {"counterSet": "set", "counters": {"mem": {"value": value}}}
                    ],
                }
            ],
        }

    assert content_key(content("1024Mi")) == content_key(content("1Gi"))
    assert content_key(content("1024Mi")) != content_key(content("2Gi"))


_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(
    spec=st.dictionaries(
        st.sampled_from(["devices", "pool", "nodeSelector", "driver"]), _ANY_JSON, max_size=4
    ),
    metadata=_ANY_JSON,
)
def test_a_malformed_slice_is_read_as_empty_never_raises(
    spec: dict[str, Any], metadata: Any
) -> None:
    # An API server that stores writes unchecked (or a bug elsewhere) can hand the informer
    # anything: one such slice must not stop the publisher's informer.
    existing = existing_slice({"metadata": metadata, "spec": spec}, "fabric.example.com")
    assert isinstance(existing.generation, int)
    assert all(isinstance(v, str) for v in taint_times(spec).values())
