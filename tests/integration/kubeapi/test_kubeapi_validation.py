"""Validation over HTTP: every ResourceSlice rule, claim status rules, DeviceClass rules and the
v1beta1 shape, each answered with the Status a real API server sends.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fabric_dra_sim.kubeapi import KubeEmulator


def untyped(api: Any) -> Any:
    """The typed client APIs take plain dicts at run time; their stubs only allow models."""
    return api


Builders = dict[str, Callable[..., dict[str, Any]]]
Mutation = Callable[[dict[str, Any]], None]


def body_of(err: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body or b"{}")
    return body


def _spec(**changes: Any) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        obj["spec"].update(changes)

    return mutate


def _pool(**changes: Any) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        obj["spec"]["pool"].update(changes)

    return mutate


def _device(index: int = 0, **changes: Any) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        obj["spec"]["devices"][index].update(changes)

    return mutate


def _drop(*keys: str) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        for key in keys:
            obj["spec"].pop(key, None)

    return mutate


def _both(*mutations: Mutation) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        for m in mutations:
            m(obj)

    return mutate


def _many_devices(count: int, taint_first: bool = False) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        obj["spec"]["devices"] = [{"name": f"d{i}"} for i in range(count)]
        if taint_first:
            obj["spec"]["devices"][0]["taints"] = [{"key": "broken", "effect": "NoSchedule"}]

    return mutate


BINDING: dict[str, Any] = {
    "bindsToNode": True,
    "bindingConditions": ["example.com/attached"],
    "bindingFailureConditions": ["example.com/failed"],
}
SLICE_RULES: list[tuple[str, Mutation, str]] = [
    ("driver-too-long", _spec(driver="a" * 60 + ".com"), "spec.driver"),
    ("driver-not-dns", _spec(driver="Fabric_Example"), "spec.driver"),
    ("pool-name-too-long", _pool(name="a" * 254), "spec.pool.name"),
    ("pool-name-empty-segment", _pool(name="us-east//rack"), "spec.pool.name"),
    ("pool-name-bad-segment", _pool(name="us-east/Rack_1"), "spec.pool.name"),
    ("negative-generation", _pool(generation=-1), "spec.pool.generation"),
    ("zero-slice-count", _pool(resourceSliceCount=0), "spec.pool.resourceSliceCount"),
    ("no-node-selection", _drop("allNodes"), "spec"),
    ("two-node-selections", _spec(nodeName="node-1"), "spec"),
    ("empty-node-name", _both(_drop("allNodes"), _spec(nodeName="")), "spec.nodeName"),
    ("all-nodes-false", _spec(allNodes=False), "spec.allNodes"),
    (
        "two-selector-terms",
        _both(
            _drop("allNodes"),
            _spec(
                nodeSelector={
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
                        {"matchExpressions": [{"key": "b", "operator": "Exists"}]},
                    ]
                }
            ),
        ),
        "spec.nodeSelector.nodeSelectorTerms",
    ),
    (
        "per-device-false",
        _both(_drop("allNodes"), _spec(perDeviceNodeSelection=False)),
        "spec.perDeviceNodeSelection",
    ),
    ("device-node-without-per-device", _device(nodeName="node-1"), "spec.devices[0]"),
    (
        "devices-and-counters",
        _spec(sharedCounters=[{"name": "mem", "counters": {"memory": {"value": "1Gi"}}}]),
        "spec",
    ),
    ("too-many-devices", _many_devices(129), "spec.devices"),
    ("too-many-tainted-devices", _many_devices(65, taint_first=True), "spec.devices"),
    ("device-name-not-label", _device(name="GPU_0"), "spec.devices[0].name"),
    (
        "duplicate-device-name",
        _both(_many_devices(2), _device(1, name="d0")),
        "spec.devices[1].name",
    ),
    (
        "attribute-two-values",
        _device(attributes={"model": {"string": "x", "int": 1}}),
        "spec.devices[0].attributes[model]",
    ),
    ("attribute-no-value", _device(attributes={"model": {}}), "spec.devices[0].attributes[model]"),
    (
        "string-too-long",
        _device(attributes={"model": {"string": "x" * 65}}),
        "spec.devices[0].attributes[model].string",
    ),
    (
        "version-not-semver",
        _device(attributes={"fw": {"version": "1.2"}}),
        "spec.devices[0].attributes[fw].version",
    ),
    (
        "id-too-long",
        _device(attributes={"a" * 33: {"int": 1}}),
        f"spec.devices[0].attributes[{'a' * 33}]",
    ),
    (
        "id-not-c-identifier",
        _device(attributes={"bad-id": {"int": 1}}),
        "spec.devices[0].attributes[bad-id]",
    ),
    (
        "domain-too-long",
        _device(attributes={"a" * 60 + ".com/x": {"int": 1}}),
        f"spec.devices[0].attributes[{'a' * 60}.com/x]",
    ),
    (
        "capacity-name-invalid",
        _device(capacity={"9mem": {"value": "1"}}),
        "spec.devices[0].capacity[9mem]",
    ),
    (
        "too-many-attributes",
        _device(
            attributes={f"a{i}": {"int": i} for i in range(20)},
            capacity={f"c{i}": {"value": "1"} for i in range(13)},
        ),
        "spec.devices[0]",
    ),
    (
        "too-many-taints",
        _device(taints=[{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)]),
        "spec.devices[0].taints",
    ),
    (
        "bad-taint-effect",
        _device(taints=[{"key": "k", "effect": "Sometimes"}]),
        "spec.devices[0].taints[0].effect",
    ),
    (
        "too-many-binding-conditions",
        _device(**{**BINDING, "bindingConditions": [f"example.com/c{i}" for i in range(5)]}),
        "spec.devices[0].bindingConditions",
    ),
    (
        "binding-without-failure",
        _device(bindsToNode=True, bindingConditions=["example.com/attached"]),
        "spec.devices[0].bindingFailureConditions",
    ),
    (
        "binding-duplicates",
        _device(**{**BINDING, "bindingConditions": ["example.com/a", "example.com/a"]}),
        "spec.devices[0].bindingConditions[1]",
    ),
    (
        "binding-overlap",
        _device(**{**BINDING, "bindingFailureConditions": ["example.com/attached"]}),
        "spec.devices[0].bindingFailureConditions[0]",
    ),
]


@pytest.mark.parametrize(("mutate", "field"), [pytest.param(m, f, id=i) for i, m, f in SLICE_RULES])
async def test_resource_slice_rule_is_422_with_the_field(
    api_client: client.ApiClient,
    builders: Builders,
    mutate: Mutation,
    field: str,
) -> None:
    body = builders["slice"]("s1")
    mutate(body)
    with pytest.raises(ApiException) as caught:
        await untyped(client.ResourceV1Api(api_client)).create_resource_slice(body)
    assert caught.value.status == 422
    status = body_of(caught.value)
    assert status["kind"] == "Status"
    assert status["reason"] == "Invalid"
    assert field in [c["field"] for c in status["details"]["causes"]], status


async def test_a_slice_with_every_optional_feature_within_limits_is_accepted(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    body = builders["slice"]("s1", devices=64)
    body["spec"]["devices"][0].update(
        {
            **BINDING,
            "taints": [{"key": "example.com/degraded", "effect": "NoSchedule"}],
            "attributes": {
                "fw": {"version": "1.2.3-rc.1+build.5"},
                "example.com/model": {"string": "x" * 64},
                "ok": {"bool": True},
            },
        }
    )
    created = await untyped(client.ResourceV1Api(api_client)).create_resource_slice(body)
    assert len(created.spec.devices) == 64


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"driver": "other.example.com"}, "spec.driver"),
        (
            {"pool": {"name": "us-west/rack-9", "generation": 0, "resourceSliceCount": 1}},
            "spec.pool.name",
        ),
        ({"nodeName": "node-2"}, "spec.nodeName"),
    ],
)
async def test_resource_slice_immutable_fields(
    api_client: client.ApiClient,
    builders: Builders,
    change: dict[str, Any],
    field: str,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    body = builders["slice"]("s1", nodeName="node-1")
    await api.create_resource_slice(body)
    updated = copy.deepcopy(body)
    updated["spec"].update(change)
    with pytest.raises(ApiException) as caught:
        await api.replace_resource_slice("s1", updated)
    assert caught.value.status == 422
    assert field in [c["field"] for c in body_of(caught.value)["details"]["causes"]]


async def test_unknown_fields_are_400_strict_decoding_and_missing_required_422(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    body = builders["slice"]("s1")
    body["spec"]["devices"][0]["colour"] = "red"
    with pytest.raises(ApiException) as caught:
        await api.create_resource_slice(body, field_validation="Strict")
    assert caught.value.status == 400
    assert 'unknown field "spec.devices[0].colour"' in body_of(caught.value)["message"]
    body = builders["slice"]("s1")
    del body["spec"]["pool"]
    with pytest.raises(ApiException) as caught:
        await api.create_resource_slice(body)
    assert caught.value.status == 422
    assert "spec.pool" in [c["field"] for c in body_of(caught.value)["details"]["causes"]]


def _condition(**changes: Any) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": "True",
        "reason": "Attached",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        **changes,
    }


def _device_status(**changes: Any) -> dict[str, Any]:
    return {"driver": "fabric.example.com", "pool": "us-east/rack-1", "device": "gpu-0", **changes}


CONSUMER = {"resource": "pods", "name": "p", "uid": "u1"}
CLAIM_STATUS_RULES: list[tuple[str, dict[str, Any], str]] = [
    ("reserved-without-allocation", {"reservedFor": [CONSUMER]}, "status.reservedFor"),
    (
        "too-many-consumers",
        {
            "allocation": True,
            "reservedFor": [
                {"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(257)
            ],
        },
        "status.reservedFor",
    ),
    (
        "duplicate-consumer",
        {"allocation": True, "reservedFor": [CONSUMER, CONSUMER]},
        "status.reservedFor[1]",
    ),
    (
        "device-not-allocated",
        {"allocation": True, "devices": [_device_status(device="gpu-9")]},
        "status.devices[0]",
    ),
    (
        "condition-without-reason",
        {"allocation": True, "devices": [_device_status(conditions=[_condition(reason="")])]},
        "status.devices[0].conditions[0].reason",
    ),
    (
        "condition-reason-not-camel-case",
        {"allocation": True, "devices": [_device_status(conditions=[_condition(reason="not ok")])]},
        "status.devices[0].conditions[0].reason",
    ),
    (
        "condition-without-time",
        {
            "allocation": True,
            "devices": [
                _device_status(
                    conditions=[
                        {k: v for k, v in _condition().items() if k != "lastTransitionTime"}
                    ]
                )
            ],
        },
        "status.devices[0].conditions[0].lastTransitionTime",
    ),
    (
        "too-many-conditions",
        {
            "allocation": True,
            "devices": [_device_status(conditions=[_condition(type=f"C{i}") for i in range(9)])],
        },
        "status.devices[0].conditions",
    ),
]


@pytest.mark.parametrize(
    ("status", "field"), [pytest.param(s, f, id=i) for i, s, f in CLAIM_STATUS_RULES]
)
async def test_resource_claim_status_rule_is_422_with_the_field(
    api_client: client.ApiClient,
    builders: Builders,
    status: dict[str, Any],
    field: str,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await api.create_namespaced_resource_claim("default", builders["claim"]())
    status = dict(status)
    if status.get("allocation") is True:
        status["allocation"] = builders["allocation"]()
    with pytest.raises(ApiException) as caught:
        await api.patch_namespaced_resource_claim_status(
            "claim-a", "default", {"status": status}, _content_type="application/merge-patch+json"
        )
    assert caught.value.status == 422
    assert field in [c["field"] for c in body_of(caught.value)["details"]["causes"]]


async def test_allocation_is_set_once_and_may_only_be_cleared(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    api: Any = client.ResourceV1Api(api_client)
    await api.create_namespaced_resource_claim("default", builders["claim"]())
    merge = "application/merge-patch+json"
    await api.patch_namespaced_resource_claim_status(
        "claim-a",
        "default",
        {
            "status": {
                "allocation": builders["allocation"](),
                "devices": [_device_status(conditions=[_condition()], data={"any": ["json"]})],
            }
        },
        _content_type=merge,
    )
    with pytest.raises(ApiException) as caught:
        await api.patch_namespaced_resource_claim_status(
            "claim-a",
            "default",
            {"status": {"allocation": builders["allocation"]("gpu-1")}},
            _content_type=merge,
        )
    assert caught.value.status == 422
    assert body_of(caught.value)["details"]["causes"][0]["field"] == "status.allocation"
    cleared = await api.patch_namespaced_resource_claim_status(
        "claim-a", "default", {"status": {"allocation": None}}, _content_type=merge
    )
    # The device status goes with the allocation (dropDeallocatedStatusDevices).
    assert cleared.status.allocation is None
    assert cleared.status.devices is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {"selectors": [{"cel": {"expression": "true || " * 1400 + "true"}}]},
            "spec.selectors[0].cel.expression",
        ),
        (
            {"config": [{"opaque": {"driver": "Bad_Driver", "parameters": {}}}]},
            "spec.config[0].opaque.driver",
        ),
        (
            {
                "config": [
                    {
                        "opaque": {
                            "driver": "fabric.example.com",
                            "parameters": {"blob": "x" * 11000},
                        }
                    }
                ]
            },
            "spec.config[0].opaque.parameters",
        ),
    ],
)
async def test_device_class_rules(
    api_client: client.ApiClient, spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(ApiException) as caught:
        await untyped(client.ResourceV1Api(api_client)).create_device_class(
            {"metadata": {"name": "gpu"}, "spec": spec}
        )
    assert caught.value.status == 422
    assert field in [c["field"] for c in body_of(caught.value)["details"]["causes"]]


def _v1beta1_slice(api_version: str = "resource.k8s.io/v1beta1") -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "ResourceSlice",
        "metadata": {"name": "s1"},
        "spec": {
            "driver": "fabric.example.com",
            "allNodes": True,
            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0",
                    "basic": {
                        "attributes": {"model": {"string": "a100"}},
                        "capacity": {"memory": {"value": "80Gi"}},
                    },
                }
            ],
        },
    }


async def test_v1beta1_shape_is_accepted_on_v1beta1_and_refused_on_v1(
    api_client: client.ApiClient,
) -> None:
    with pytest.raises(ApiException) as caught:
        await untyped(client.ResourceV1Api(api_client)).create_resource_slice(
            _v1beta1_slice("resource.k8s.io/v1"), field_validation="Strict"
        )
    assert caught.value.status == 400
    assert 'unknown field "spec.devices[0].basic"' in body_of(caught.value)["message"]
    emu = KubeEmulator(served_resource_versions=("v1beta1",))
    url = await emu.start()
    try:
        async with client.ApiClient(client.Configuration(host=url)) as beta_client:
            api: Any = client.ResourceV1beta1Api(beta_client)
            created = await api.create_resource_slice(_v1beta1_slice())
            assert created.spec.devices[0].basic.attributes["model"].string == "a100"
            bad = _v1beta1_slice()
            bad["spec"]["devices"][0]["basic"]["attributes"]["fw"] = {"version": "one"}
            bad["metadata"]["name"] = "s2"
            with pytest.raises(ApiException) as caught:
                await api.create_resource_slice(bad)
            assert caught.value.status == 422
            assert "spec.devices[0].basic.attributes[fw].version" in [
                c["field"] for c in body_of(caught.value)["details"]["causes"]
            ]
    finally:
        await emu.stop()


async def test_metadata_name_and_labels_are_validated(
    api_client: client.ApiClient,
    builders: Builders,
) -> None:
    body = builders["slice"]("Not_Valid")
    body["metadata"]["labels"] = {"bad key!": "v"}
    with pytest.raises(ApiException) as caught:
        await untyped(client.ResourceV1Api(api_client)).create_resource_slice(body)
    fields = [c["field"] for c in body_of(caught.value)["details"]["causes"]]
    assert "metadata.name" in fields
    assert "metadata.labels" in fields
