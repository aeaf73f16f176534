"""Small builders for allocator tests: v1 slice, class and claim JSON."""

from __future__ import annotations

from typing import Any

from app.allocator import DeviceClass, Node, claim_from_json, device_class_from_json
from app.allocator.model import Claim

DRIVER = "fabric.example.com"
REGION = "topology.kubernetes.io/region"
RACK = "fabric-dra.io/rack"
NODE = Node("node-1", {REGION: "us-east", RACK: "rack-12", "gpus": "8"})


def typed(value: Any) -> dict[str, Any]:
    """A typed attribute value for a Python value."""
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, str) and value.startswith("v:"):
        return {"version": value[2:]}
    return {"string": value}


def device(
    name: str,
    *,
    capacity: dict[str, str] | None = None,
    binds: bool = False,
    taints: list[dict[str, str]] | None = None,
    qualified: dict[str, Any] | None = None,
    **attributes: Any,
) -> dict[str, Any]:
    """A v1 slice device; ``v:1.2.3`` strings become version attributes; ``qualified`` holds
    attributes with a domain (``ext.io/family``)."""
    merged = {**attributes, **(qualified or {})}
    out: dict[str, Any] = {"name": name, "attributes": {k: typed(v) for k, v in merged.items()}}
    if capacity:
        out["capacity"] = {k: {"value": v} for k, v in capacity.items()}
    if binds:
        out["bindsToNode"] = True
        out["bindingConditions"] = ["FabricDeviceReady"]
        out["bindingFailureConditions"] = ["FabricDeviceFailed"]
    if taints:
        out["taints"] = taints
    return out


def in_selector(key: str, *values: str, operator: str = "In") -> dict[str, Any]:
    """A one-term node selector with one expression."""
    expression: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expression["values"] = list(values)
    return {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}


def resource_slice(
    pool: str,
    devices: list[dict[str, Any]],
    *,
    generation: int = 0,
    count: int = 1,
    node_name: str | None = None,
    selector: dict[str, Any] | None = None,
    driver: str = DRIVER,
) -> dict[str, Any]:
    """A v1 ResourceSlice; all nodes unless ``node_name`` or ``selector``."""
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
        "devices": devices,
    }
    if node_name:
        spec["nodeName"] = node_name
    elif selector:
        spec["nodeSelector"] = selector
    else:
        spec["allNodes"] = True
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{pool.replace('/', '-')}-{generation}"},
        "spec": spec,
    }


def device_class(
    name: str, *selectors: str, config: list[dict[str, Any]] | None = None
) -> DeviceClass:
    """A DeviceClass with CEL selectors and opaque config parameters."""
    return device_class_from_json(
        {
            "metadata": {"name": name},
            "spec": {
                "selectors": [{"cel": {"expression": s}} for s in selectors],
                "config": [{"opaque": {"driver": DRIVER, "parameters": p}} for p in config or ()],
            },
        }
    )


def request(
    name: str,
    class_name: str,
    *selectors: str,
    count: int | None = None,
    mode: str | None = None,
    admin: bool = False,
    tolerations: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A v1 claim request (``exactly``)."""
    exactly: dict[str, Any] = {"deviceClassName": class_name}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if count is not None:
        exactly["count"] = count
    if mode:
        exactly["allocationMode"] = mode
    if admin:
        exactly["adminAccess"] = True
    if tolerations:
        exactly["tolerations"] = tolerations
    return {"name": name, "exactly": exactly}


def claim(
    *requests: dict[str, Any],
    constraints: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
    name: str = "claim-0",
) -> Claim:
    """A Claim from requests, constraints and config (JSON)."""
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return claim_from_json({"devices": devices}, uid=f"uid-{name}", namespace="default", name=name)


def attr(domain_id: str) -> str:
    """A CEL lookup of a fully qualified attribute: ``device.attributes["d"].id``."""
    domain, _, ident = domain_id.rpartition("/")
    return f'device.attributes["{domain}"].{ident}'
