"""The verbs over one storage: hub objects in the store, conversion on the way out, gated
fields kept on update when the stored object already uses them."""

from __future__ import annotations

from typing import Any

from fabric_dra_sim.kubeapi.cluster import build_cluster
from fabric_dra_sim.kubeapi.operations import Api
from fabric_dra_sim.kubeapi.resources import served_types
from fabric_dra_sim.kubeapi.store import Store

TAINT = {"key": "k", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}
VERSIONS = ("v1", "v1beta2", "v1beta1")


def api(store: Store, **gates: bool) -> Api:
    """An API server of Kubernetes 1.34 with ``gates`` over ``store`` (a restart with other
    gates keeps etcd)."""
    return Api(store, served_types(VERSIONS), validate=True, cluster=build_cluster("1.34", gates))


def beta1_slice(**device: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s1"},
        "spec": {
            "driver": "fabric.example.com",
            "allNodes": True,
            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
            "devices": [
                {"name": "gpu-0", "basic": {"attributes": {"m": {"string": "a"}}, **device}}
            ],
        },
    }


def slice_type(server: Api, version: str) -> Any:
    found = server.find("resource.k8s.io", version, "resourceslices")
    assert found is not None
    return found


def test_objects_written_in_any_version_are_stored_in_the_storage_version() -> None:
    store = Store()
    server = api(store, DRADeviceTaints=True)
    server.create(slice_type(server, "v1beta1"), "", beta1_slice(taints=[TAINT]), manager="t")
    stored = store.get(("resource.k8s.io", "resourceslices"), ("", "s1"))
    assert stored is not None
    assert stored["apiVersion"] == "resource.k8s.io/v1"
    assert stored["spec"]["devices"][0]["taints"] == [TAINT]
    # Reading in the storage version hands out the stored object unconverted (get copies it).
    assert server.shown(slice_type(server, "v1"), stored) is stored


def test_a_tainted_slice_keeps_its_taints_on_update_after_the_gate_is_turned_off() -> None:
    store = Store()
    on = api(store, DRADeviceTaints=True)
    on.create(slice_type(on, "v1beta1"), "", beta1_slice(taints=[TAINT]), manager="t")
    off = api(store)
    v1 = slice_type(off, "v1")
    current = off.get(v1, "", "s1")
    current["spec"]["devices"][0]["attributes"]["m"] = {"string": "b"}
    updated = off.update(v1, "", "s1", current, manager="t")
    assert updated["spec"]["devices"][0]["taints"] == [TAINT]
    assert updated["spec"]["devices"][0]["attributes"]["m"] == {"string": "b"}
    # A new slice written with the gate off loses them silently.
    fresh = beta1_slice(taints=[TAINT])
    fresh["metadata"]["name"] = "s2"
    created = off.create(slice_type(off, "v1beta1"), "", fresh, manager="t")
    assert "taints" not in created["spec"]["devices"][0]["basic"]


def test_a_no_op_write_of_a_converted_object_writes_nothing() -> None:
    # Stored as v1, shown as v1beta1 and written back unchanged: the round trip is exact.
    store = Store()
    server = api(store)
    beta1 = slice_type(server, "v1beta1")
    created = server.create(beta1, "", beta1_slice(), manager="t")
    rv = store.rv
    again = server.update(beta1, "", "s1", server.get(beta1, "", "s1"), manager="t")
    assert store.rv == rv
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def v1_slice() -> dict[str, Any]:
    out = beta1_slice()
    out["apiVersion"] = "resource.k8s.io/v1"
    out["spec"]["devices"] = [{"name": "gpu-0", "attributes": {"m": {"string": "a"}}}]
    return out


def test_in_process_callers_get_copies_and_the_http_layer_may_share_the_stored_object() -> None:
    store = Store()
    server = api(store)
    rt = slice_type(server, "v1")
    key = (("resource.k8s.io", "resourceslices"), ("", "s1"))
    body = v1_slice()
    created = server.create(rt, "", body, manager="t")
    # By default neither the body nor the answer is the stored object: changing them
    # changes nothing stored.
    created["spec"]["devices"][0]["name"] = "changed"
    body["spec"]["driver"] = "changed"
    stored = store.get(*key)
    assert stored is not None and stored["spec"]["devices"][0]["name"] == "gpu-0"
    assert stored["spec"]["driver"] == "fabric.example.com"
    assert server.get(rt, "", "s1") is not stored
    # The HTTP layer encodes the answer at once: it may be the stored object itself.
    assert server.get(rt, "", "s1", share_result=True) is stored
    update = server.get(rt, "", "s1")
    update["metadata"]["labels"] = {"a": "b"}
    updated = server.update(rt, "", "s1", update, manager="t", body_owned=True, share_result=True)
    assert updated is store.get(*key)
    # A patch works on a copy of the stored object, never on the object itself.
    before = store.get(*key)
    assert before is not None
    patched, _ = server.patch(
        rt,
        "",
        "s1",
        "application/merge-patch+json",
        b'{"metadata": {"labels": {"a": "c"}}}',
        manager="t",
        share_result=True,
    )
    assert before["metadata"]["labels"] == {"a": "b"}
    assert patched["metadata"]["labels"] == {"a": "c"}
    assert patched is store.get(*key)
