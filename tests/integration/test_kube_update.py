"""update_with_retry against the Kubernetes API emulator over real HTTP: a stale first copy is
re-read and the change applied again on top of the other writer's; conflicts that never end
are raised after the last attempt; an object deleted, or re-created under its name, is gone."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ResourceV1Api

from app.kube.client import KubeClient, call_json
from app.kube.errors import KubeConflict, KubeError, KubeNotFound
from app.kube.update import status_write_body, update_with_retry
from fabric_dra_sim.kubeapi import KubeEmulator

RESOURCE = "resource.k8s.io/v1"
JsonDict = dict[str, Any]


def resource_slice(name: str) -> JsonDict:
    return {
        "apiVersion": RESOURCE,
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {}},
        "spec": {
            "driver": "fabric.example.com",
            "allNodes": True,
            "devices": [{"name": "d0"}],
            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
        },
    }


class Slices:
    """Reads and label writes of one ResourceSlice through the real client."""

    def __init__(self, client: KubeClient, name: str) -> None:
        self.api = ResourceV1Api(client.api)
        self.name = name
        self.reads = 0
        self.writes = 0

    async def read(self) -> JsonDict | None:
        self.reads += 1
        try:
            return await call_json(
                self.api.read_resource_slice(self.name, _preload_content=False), f"read {self.name}"
            )
        except KubeNotFound:
            return None

    async def copy(self) -> JsonDict:
        """A copy read now (the object must exist)."""
        current = await self.read()
        assert current is not None
        return current

    async def label(self, current: JsonDict, key: str, value: str) -> JsonDict:
        self.writes += 1
        body = {
            **current,
            "metadata": {
                **current["metadata"],
                "labels": {**(current["metadata"].get("labels") or {}), key: value},
            },
        }
        return await call_json(
            self.api.replace_resource_slice(self.name, body, _preload_content=False),  # type: ignore[arg-type]
            f"update {self.name}",
        )


async def test_a_stale_copy_is_read_again_and_the_change_lands_beside_the_other_write(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    emu.create(resource_slice("s1"))
    slices = Slices(client, "s1")
    stale = await slices.copy()
    await slices.label(await slices.copy(), "other", "yes")  # someone else writes first
    conflicts: list[KubeError] = []

    async def ours(current: JsonDict) -> JsonDict:
        return await slices.label(current, "ours", "yes")

    written = await update_with_retry(
        stale,
        ours,
        slices.read,
        gone=None,
        attempts=3,
        uid=stale["metadata"]["uid"],
        on_conflict=conflicts.append,
    )
    assert written is not None
    assert written["metadata"]["labels"] == {"other": "yes", "ours": "yes"}
    assert len(conflicts) == 1 and isinstance(conflicts[0], KubeConflict)
    assert slices.reads == 3  # two before, one after the conflict
    stored = emu.get(RESOURCE, "ResourceSlice", "s1")
    assert stored is not None and stored["metadata"]["labels"]["ours"] == "yes"


async def test_conflicts_on_every_attempt_raise_the_last_one(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    emu.create(resource_slice("s1"))
    slices = Slices(client, "s1")
    first = await slices.copy()
    old_version = first["metadata"]["resourceVersion"]
    await slices.label(first, "bump", "1")
    conflicts: list[KubeError] = []

    async def always_stale(current: JsonDict) -> JsonDict:
        # Writes with the first resourceVersion whatever was read: stale every time.
        stale = {**current, "metadata": {**current["metadata"], "resourceVersion": old_version}}
        return await slices.label(stale, "ours", "yes")

    slices.reads = 0
    with pytest.raises(KubeConflict):
        await update_with_retry(
            first, always_stale, slices.read, gone=None, attempts=3, on_conflict=conflicts.append
        )
    assert slices.writes == 4 and len(conflicts) == 3
    assert slices.reads == 2, "no read after the last attempt"


@pytest.mark.parametrize("recreated", [False, True], ids=["deleted", "recreated"])
async def test_an_object_deleted_or_recreated_under_its_name_meanwhile_is_gone(
    emu: KubeEmulator,
    client: KubeClient,
    recreated: bool,
) -> None:
    emu.create(resource_slice("s1"))
    slices = Slices(client, "s1")
    stale = await slices.copy()
    emu.delete(RESOURCE, "ResourceSlice", "s1")
    if recreated:
        emu.create(resource_slice("s1"))

    async def ours(current: JsonDict) -> str:
        await slices.label(current, "ours", "yes")
        return "written"

    # The stale write answers 409 (re-created: the read then shows another uid) or 404.
    result = await update_with_retry(
        stale, ours, slices.read, gone="gone", uid=stale["metadata"]["uid"]
    )
    assert result == "gone"
    assert slices.writes == 1, "the one stale write; nothing on a new object"
    stored = emu.get(RESOURCE, "ResourceSlice", "s1")
    if recreated:
        assert stored is not None and "ours" not in stored["metadata"]["labels"]
    else:
        assert stored is None
    assert await update_with_retry(None, ours, slices.read, gone="gone") == "gone"
    assert slices.writes == 1


async def test_attempts_must_be_at_least_one() -> None:
    async def never(current: JsonDict) -> None:
        raise AssertionError

    async def no_read() -> JsonDict | None:
        return None

    empty: JsonDict = {}
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        await update_with_retry(empty, never, no_read, gone=None, attempts=0)


async def test_a_status_write_without_managed_fields_keeps_the_servers_own(
    emu: KubeEmulator,
    client: KubeClient,
) -> None:
    emu.create(
        {
            "apiVersion": RESOURCE,
            "kind": "ResourceClaim",
            "metadata": {"name": "c1", "namespace": "default"},
            "spec": {
                "devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}
            },
        }
    )
    api = ResourceV1Api(client.api)
    claim = await call_json(
        api.read_namespaced_resource_claim("c1", "default", _preload_content=False), "read c1"
    )
    assert claim["metadata"]["managedFields"], "the creation was recorded"
    body = status_write_body(
        {**claim, "status": {"allocation": {"devices": {"results": []}, "nodeSelector": None}}}
    )
    assert "managedFields" not in body["metadata"]
    assert claim["metadata"]["managedFields"], "the object given is not changed"
    assert body["metadata"]["resourceVersion"] == claim["metadata"]["resourceVersion"]
    written = await call_json(
        api.replace_namespaced_resource_claim_status(
            "c1", "default", body, field_manager="ours", _preload_content=False
        ),
        "update c1 status",
    )
    entries = written["metadata"]["managedFields"]
    # The creator's entry is kept, and the status write is recorded under our manager.
    assert entries[0] == claim["metadata"]["managedFields"][0]
    assert any(e["manager"] == "ours" and e.get("subresource") == "status" for e in entries)
    # Nothing to strip: a copy all the same.
    plain = {"metadata": {"name": "x"}}
    assert status_write_body(plain) == plain and status_write_body(plain) is not plain
