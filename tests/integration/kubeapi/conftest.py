"""Fixtures for the Kubernetes API emulator tests: a started emulator and a real client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from fabric_dra_sim.kubeapi import KubeEmulator

DRIVER = "fabric.example.com"


def slice_body(
    name: str = "slice-a", *, api_version: str = "resource.k8s.io/v1", devices: int = 1, **spec: Any
) -> dict[str, Any]:
    """A valid v1 ResourceSlice (allNodes unless ``spec`` chooses otherwise)."""
    body_spec: dict[str, Any] = {
        "driver": DRIVER,
        "pool": {"name": "us-east/rack-1", "generation": 0, "resourceSliceCount": 1},
        "devices": [
            {
                "name": f"gpu-{i}",
                "attributes": {"model": {"string": "a100"}},
                "capacity": {"memory": {"value": "80Gi"}},
            }
            for i in range(devices)
        ],
    }
    if not {"nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection"} & set(spec):
        body_spec["allNodes"] = True
    body_spec.update(spec)
    return {
        "apiVersion": api_version,
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": body_spec,
    }


def claim_body(name: str = "claim-a", namespace: str = "default") -> dict[str, Any]:
    """A valid v1 ResourceClaim asking for one device of class ``gpu``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
    }


def allocation(device: str = "gpu-0") -> dict[str, Any]:
    """A claim allocation of one device of the test pool."""
    return {
        "devices": {
            "results": [
                {"request": "gpu", "driver": DRIVER, "pool": "us-east/rack-1", "device": device}
            ]
        },
        "allocationTimestamp": "2026-01-01T00:00:00Z",
    }


@pytest.fixture
def builders() -> dict[str, Callable[..., dict[str, Any]]]:
    """The object builders, for test modules (they cannot import this conftest)."""
    return {"slice": slice_body, "claim": claim_body, "allocation": allocation}


@pytest.fixture
def emulator(emu: KubeEmulator) -> KubeEmulator:
    """The started Kubernetes 1.34 emulator of tests/integration/conftest.py (``emu``: every
    DRA gate on, short bookmark intervals; these tests exercise the gated rules)."""
    return emu


@pytest.fixture
async def api_client(emulator: KubeEmulator) -> AsyncIterator[client.ApiClient]:
    """A real kubernetes-asyncio ApiClient pointed at the emulator."""
    config = client.Configuration(host=emulator.url)
    async with client.ApiClient(config) as api:
        yield api
