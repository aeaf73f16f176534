"""Malformed bodies never crash the emulator: every write answers a Status (400 or 422), as
kube-apiserver does, whatever JSON arrives where an object, list or value belongs.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.errors import StatusError

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)

_SLICE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "s"},
    "spec": {
        "driver": "fabric.example.com",
        "allNodes": True,
        "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
        "devices": [
            {
                "name": "d",
                "attributes": {"a": {"int": 1}},
                "capacity": {"memory": {"value": "1Gi"}},
                "taints": [{"key": "k", "effect": "NoSchedule"}],
            }
        ],
    },
}
_CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c", "namespace": "default"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "r",
                    "exactly": {
                        "deviceClassName": "gpu",
                        "selectors": [{"cel": {"expression": "true"}}],
                    },
                }
            ]
        }
    },
}
_LEASE = {
    "apiVersion": "coordination.k8s.io/v1",
    "kind": "Lease",
    "metadata": {"name": "l", "namespace": "default"},
    "spec": {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "renewTime": "2026-01-01T00:00:00.000000Z",
    },
}
_PATHS = {
    "slice": [
        "spec",
        "spec.devices",
        "spec.devices.0",
        "spec.devices.0.attributes",
        "spec.devices.0.capacity",
        "spec.devices.0.capacity.memory",
        "spec.devices.0.taints",
        "spec.devices.0.taints.0",
        "spec.pool",
        "spec.pool.generation",
        "metadata",
        "metadata.labels",
    ],
    "claim": [
        "spec",
        "spec.devices",
        "spec.devices.requests",
        "spec.devices.requests.0",
        "spec.devices.requests.0.exactly",
        "spec.devices.requests.0.exactly.selectors",
        "metadata.finalizers",
    ],
    "lease": ["spec", "spec.renewTime", "spec.leaseDurationSeconds", "metadata"],
    "claim-status": [
        "status",
        "status.allocation",
        "status.allocation.devices",
        "status.allocation.devices.results",
        "status.allocation.devices.results.0",
        "status.allocation.devices.config",
        "status.allocation.devices.config.0",
        "status.allocation.nodeSelector",
        "status.allocation.nodeSelector.nodeSelectorTerms",
        "status.allocation.nodeSelector.nodeSelectorTerms.0",
        "status.reservedFor",
        "status.reservedFor.0",
        "status.devices",
        "status.devices.0",
        "status.devices.0.conditions",
        "status.devices.0.conditions.0",
    ],
}
_STATUS = {
    "allocation": {
        "devices": {
            "results": [
                {"request": "r", "driver": "fabric.example.com", "pool": "p", "device": "d"}
            ],
            "config": [
                {
                    "source": "FromClaim",
                    "requests": ["r"],
                    "opaque": {"driver": "fabric.example.com", "parameters": {}},
                }
            ],
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
            ]
        },
    },
    "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
    "devices": [
        {
            "driver": "fabric.example.com",
            "pool": "p",
            "device": "d",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Attached",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
    ],
}
_BASES = {
    "slice": _SLICE,
    "claim": _CLAIM,
    "lease": _LEASE,
    "claim-status": {**_CLAIM, "status": _STATUS},
}


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node: Any = obj
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(_BASES)), data=st.data(), value=_JSON)
def test_a_malformed_body_gets_a_status_never_a_crash(
    kind: str, data: st.DataObject, value: Any
) -> None:
    emulator = KubeEmulator()
    body = copy.deepcopy(_BASES[kind])
    _set(body, data.draw(st.sampled_from(_PATHS[kind])), value)
    try:
        if kind == "claim-status":
            emulator.create(copy.deepcopy(_CLAIM))
            emulator.update_status(body)
        else:
            emulator.create(body)
    except StatusError as err:
        assert err.code in (400, 422), err.body()
