"""The informer against the Kubernetes API emulator over real HTTP: initial list with
pagination, watch events, 410 storms, dropped connections, server restarts, relist diffs and
health reporting. Every test compares what the informer delivered with the emulator's store."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import aiohttp
import pytest
from builders import eventually
from kubernetes_asyncio.client import ResourceV1Api, ResourceV1beta1Api

from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, call_json, connect
from app.kube.errors import KubeUnavailable
from app.kube.informer import EventType, Informer, InformerEvent, InformerSettings, object_key
from app.kube.versions import ResourceApiVersion, slice_from_wire
from fabric_dra_sim.kubeapi import KubeEmulator

DRIVER = "fabric.example.com"
NS = "default"

eventually = partial(eventually, timeout_s=10.0, interval_s=0.02)


def resource_slice(name: str, devices: int = 1, *, version: str = "v1") -> dict[str, Any]:
    device_list: list[dict[str, Any]] = [{"name": f"dev-{i}"} for i in range(devices)]
    if version == "v1beta1":
        device_list = [{"name": d["name"], "basic": {}} for d in device_list]
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"app": "fabric"}},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": f"pool-{name}", "generation": 0, "resourceSliceCount": 1},
            "allNodes": True,
            "devices": device_list,
        },
    }


def fast_settings(**changes: Any) -> InformerSettings:
    values: dict[str, Any] = {
        "name": "resourceslices",
        "page_size": 2,
        "watch_timeout_s": 2.0,
        "watch_timeout_jitter": 0.5,
        "client_timeout_margin_s": 2.0,
        "list_timeout_s": 5.0,
        "backoff_initial_s": 0.02,
        "backoff_max_s": 0.1,
    }
    values.update(changes)
    return InformerSettings(**values)


class Recorder:
    """Collects delivered events and checks the no-duplicate rule as they arrive."""

    def __init__(self) -> None:
        self.events: list[tuple[EventType, str, str | None]] = []
        self.delivered: set[tuple[str, str | None]] = set()
        self.duplicates: list[tuple[EventType, str, str | None]] = []

    async def __call__(
        self, event_type: EventType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        name = obj["metadata"]["name"]
        version = obj["metadata"].get("resourceVersion")
        entry = (event_type, name, version)
        if event_type != "DELETED":
            if (name, version) in self.delivered:
                self.duplicates.append(entry)
            self.delivered.add((name, version))
            if event_type == "MODIFIED":
                assert old is not None
            else:
                assert old is None
        self.events.append(entry)

    def deleted(self) -> set[str]:
        return {name for kind, name, _ in self.events if kind == "DELETED"}


@pytest.fixture
async def emulator() -> AsyncIterator[tuple[KubeEmulator, str]]:
    emu = KubeEmulator(served_resource_versions=("v1",), bookmark_interval_s=0.3)
    url = await emu.start()
    try:
        yield emu, url
    finally:
        await emu.stop()


@pytest.fixture
async def kube(emulator: tuple[KubeEmulator, str]) -> AsyncIterator[KubeClient]:
    client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emulator[1]))
    try:
        yield client
    finally:
        await client.close()


def store_versions(emu: KubeEmulator) -> dict[str, str]:
    return {
        obj["metadata"]["name"]: obj["metadata"]["resourceVersion"]
        for obj in emu.list("resource.k8s.io/v1", "ResourceSlice")
    }


def cache_versions(informer: Informer) -> dict[str, str]:
    return {
        obj["metadata"]["name"]: obj["metadata"]["resourceVersion"] for obj in informer.objects()
    }


async def relabel(kube: KubeClient, name: str, value: str) -> str:
    """Change a label through the API (a MODIFIED event); returns the new resourceVersion."""
    api = ResourceV1Api(kube.api)
    current = await call_json(api.read_resource_slice(name, _preload_content=False), f"read {name}")
    current["metadata"].setdefault("labels", {})["round"] = value
    written = await call_json(
        api.replace_resource_slice(name, current, _preload_content=False),  # type: ignore[arg-type]
        f"update {name}",
    )
    return str(written["metadata"]["resourceVersion"])


def make_informer(kube: KubeClient, recorder: Recorder, **changes: Any) -> Informer:
    informer = Informer(
        ResourceV1Api(kube.api).list_resource_slice,
        fast_settings(**changes),
        rng=random.Random(7),
    )
    informer.add_handler(recorder)
    return informer


async def test_initial_list_is_paginated_and_fills_the_cache(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    for i in range(5):
        emu.create(resource_slice(f"s{i}"))
    recorder = Recorder()
    informer = make_informer(kube, recorder)
    informer.start()
    try:
        await informer.wait_synced(10)
        assert cache_versions(informer) == store_versions(emu)
        assert sorted(name for _, name, _ in recorder.events) == [f"s{i}" for i in range(5)]
        assert {kind for kind, _, _ in recorder.events} == {"ADDED"}
        # Five objects, two per page: three list requests.
        lists = [r for r in emu.requests if r.method == "GET" and r.path.endswith("resourceslices")]
        assert len(lists) >= 3
        listed = informer.get("s0")
        assert listed is not None
        assert listed["kind"] == "ResourceSlice"
        assert listed["apiVersion"] == "resource.k8s.io/v1"
        # Cached without the managed fields the server keeps (controller-runtime's
        # TransformStripManagedFields).
        stored = emu.get("resource.k8s.io/v1", "ResourceSlice", "s0")
        assert stored is not None and stored["metadata"]["managedFields"]
        assert "managedFields" not in listed["metadata"]
        assert informer.is_healthy()
    finally:
        await informer.stop()


async def test_a_listed_page_is_converted_before_the_next_page_is_asked_for(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    # Converting page by page keeps only one page of raw objects in memory: a slimming
    # converter then bounds what a large list costs.
    emu, _ = emulator
    for i in range(5):
        emu.create(resource_slice(f"s{i}"))

    def list_requests() -> int:
        return sum(
            1 for r in emu.requests if r.method == "GET" and r.path.endswith("resourceslices")
        )

    seen: list[tuple[str, int]] = []

    def slim(obj: dict[str, Any]) -> dict[str, Any]:
        seen.append((obj["metadata"]["name"], list_requests()))
        return {"metadata": obj["metadata"], "kind": obj["kind"], "apiVersion": "slim"}

    before = list_requests()
    informer = Informer(
        ResourceV1Api(kube.api).list_resource_slice, fast_settings(), converter=slim
    )
    informer.start()
    try:
        await informer.wait_synced(10)
        # Two objects a page: each object was converted while its own page was the last
        # one served.
        assert [(name, count - before) for name, count in seen[:5]] == [
            ("s0", 1),
            ("s1", 1),
            ("s2", 2),
            ("s3", 2),
            ("s4", 3),
        ]
        listed = informer.get("s3")
        assert listed is not None
        assert listed["apiVersion"] == "slim"
    finally:
        await informer.stop()


async def test_watch_delivers_every_change_once_in_order(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    emu.create(resource_slice("a"))
    recorder = Recorder()
    informer = make_informer(kube, recorder)
    queue = informer.subscribe()
    informer.start()
    try:
        await informer.wait_synced(10)
        created = emu.create(resource_slice("b"))
        changed = await relabel(kube, "a", "1")
        emu.delete("resource.k8s.io/v1", "ResourceSlice", "b")
        await eventually(lambda: "b" in recorder.deleted(), what="DELETED b")
        kinds = [(kind, name) for kind, name, _ in recorder.events]
        assert kinds == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
        assert ("MODIFIED", "a", changed) in recorder.events
        assert ("ADDED", "b", created["metadata"]["resourceVersion"]) in recorder.events
        queued: list[InformerEvent] = []
        while not queue.empty():
            queued.append(queue.get_nowait())
        assert [(e.type, e.obj["metadata"]["name"]) for e in queued] == kinds
        assert not any("managedFields" in e.obj["metadata"] for e in queued)
        assert informer.get("b") is None
        assert cache_versions(informer) == store_versions(emu)
        assert not recorder.duplicates
    finally:
        await informer.stop()


async def test_dropped_connections_lose_and_duplicate_nothing(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    for i in range(4):
        emu.create(resource_slice(f"s{i}"))
    recorder = Recorder()
    informer = make_informer(kube, recorder)
    informer.start()
    try:
        await informer.wait_synced(10)
        written: set[tuple[str, str]] = set()
        for round_ in range(6):
            for i in range(4):
                written.add((f"s{i}", await relabel(kube, f"s{i}", str(round_))))
            await emu.close_watches()
            await asyncio.sleep(0.05)
        await eventually(
            lambda: cache_versions(informer) == store_versions(emu), what="cache = store"
        )
        assert not recorder.duplicates
        # No compaction happened, so the watch resumed each time: every version was delivered.
        modified = {(name, rv) for kind, name, rv in recorder.events if kind == "MODIFIED"}
        assert written <= modified
        assert informer.watch_count > 6
    finally:
        await informer.stop()


async def test_a_410_storm_converges_without_duplicates(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    for i in range(6):
        emu.create(resource_slice(f"s{i}"))
    recorder = Recorder()
    informer = make_informer(kube, recorder)
    informer.start()
    try:
        await informer.wait_synced(10)
        rng = random.Random(1)
        alive = {f"s{i}" for i in range(6)}
        gone: set[str] = set()
        counter = 6
        for round_ in range(12):
            await relabel(kube, rng.choice(sorted(alive)), f"live-{round_}")
            # Cut the watch and change things before the informer can reconnect (nothing
            # below yields to the loop), then compact: the resume must get 410 and re-list.
            await emu.close_watches()
            for name in rng.sample(sorted(alive), 2):
                current = emu.get("resource.k8s.io/v1", "ResourceSlice", name)
                assert current is not None
                current["metadata"].setdefault("labels", {})["round"] = str(round_)
                emu.update(current)
            victim = rng.choice(sorted(alive))
            emu.delete("resource.k8s.io/v1", "ResourceSlice", victim)
            alive.discard(victim)
            gone.add(victim)
            emu.create(resource_slice(f"s{counter}"))
            alive.add(f"s{counter}")
            counter += 1
            emu.compact()
            await asyncio.sleep(0.05)
        await eventually(
            lambda: cache_versions(informer) == store_versions(emu), what="cache = store"
        )
        assert set(cache_versions(informer)) == alive
        assert not recorder.duplicates
        # Every object that went away was reported gone, also those deleted during a gap.
        assert gone <= recorder.deleted()
        assert informer.gone_count >= 6
        assert informer.list_count >= 6
    finally:
        await informer.stop()


async def test_a_deletion_during_a_gap_becomes_a_deleted_event_from_the_relist(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    first = emu.create(resource_slice("keep"))
    doomed = emu.create(resource_slice("doomed"))
    recorder = Recorder()
    informer = make_informer(kube, recorder, relist_after_failures=100)
    informer.start()
    try:
        await informer.wait_synced(10)
        lists_before = informer.list_count
        # Cut the watch and keep it down while the object goes and the history is compacted.
        emu.fail_next(4, method="GET", path_regex="resourceslices", status=503)
        await emu.close_watches()
        emu.delete("resource.k8s.io/v1", "ResourceSlice", "doomed")
        emu.create(resource_slice("later"))
        emu.compact()
        await eventually(lambda: "doomed" in recorder.deleted(), what="DELETED doomed")
        deleted = [e for e in recorder.events if e[0] == "DELETED"]
        # The delete came from the relist diff: it carries the last state we knew.
        assert deleted == [("DELETED", "doomed", doomed["metadata"]["resourceVersion"])]
        assert informer.list_count > lists_before
        assert informer.gone_count >= 1
        await eventually(lambda: informer.get("later") is not None, what="ADDED later")
        assert cache_versions(informer) == store_versions(emu)
        kept = informer.get("keep")
        assert kept is not None
        assert kept["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        assert not recorder.duplicates
    finally:
        await informer.stop()


async def test_a_server_restart_is_survived(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    emu.create(resource_slice("a"))
    recorder = Recorder()
    informer = make_informer(kube, recorder)
    informer.start()
    try:
        await informer.wait_synced(10)
        await emu.restart(keep_store=True)
        emu.create(resource_slice("after-restart"))
        await relabel(kube, "a", "x")
        await eventually(
            lambda: cache_versions(informer) == store_versions(emu), what="cache = store"
        )
        assert ("ADDED", "after-restart") in [(k, n) for k, n, _ in recorder.events]
        assert not recorder.duplicates
        await eventually(informer.is_healthy, what="healthy again")
    finally:
        await informer.stop()


async def test_a_persistently_failing_watch_turns_unhealthy_and_recovers(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    emu.create(resource_slice("a"))
    recorder = Recorder()
    informer = make_informer(kube, recorder, unhealthy_after_failures=3)
    informer.start()
    try:
        await informer.wait_synced(10)
        assert informer.is_healthy()
        emu.fail_next(8, method="GET", path_regex="resourceslices", status=500)
        await emu.close_watches()
        await eventually(lambda: not informer.is_healthy(), what="unhealthy")
        assert informer.last_error is not None
        assert "500" in str(informer.last_error)
        emu.create(resource_slice("b"))
        await eventually(informer.is_healthy, what="healthy again")
        await eventually(lambda: informer.get("b") is not None, what="b seen")
        assert cache_versions(informer) == store_versions(emu)
        assert not recorder.duplicates
    finally:
        await informer.stop()


async def test_a_crashing_handler_does_not_stop_the_informer(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    recorder = Recorder()
    informer = make_informer(kube, recorder)

    async def broken(event_type: EventType, obj: dict[str, Any], old: Any) -> None:
        raise RuntimeError("handler bug")

    informer.add_handler(broken)
    informer.start()
    try:
        await informer.wait_synced(10)
        emu.create(resource_slice("a"))
        emu.create(resource_slice("b"))
        await eventually(lambda: len(recorder.events) == 2, what="two events")
        assert informer.handler_error_count == 2
        assert informer.is_healthy()
    finally:
        await informer.stop()


async def test_label_selector_and_converter_for_an_older_version(
    kube_v1beta1: tuple[KubeEmulator, KubeClient],
) -> None:
    emu, kube = kube_v1beta1
    emu.create(resource_slice("mine", 2, version="v1beta1"))
    other = resource_slice("other", version="v1beta1")
    other["metadata"]["labels"] = {"app": "someone-else"}
    emu.create(other)
    recorder = Recorder()
    informer = Informer(
        ResourceV1beta1Api(kube.api).list_resource_slice,
        fast_settings(label_selector="app=fabric"),
        converter=lambda obj: slice_from_wire(obj, ResourceApiVersion.V1BETA1),
    )
    informer.add_handler(recorder)
    informer.start()
    try:
        await informer.wait_synced(10)
        assert informer.keys() == [("", "mine")]
        mine = informer.get("mine")
        assert mine is not None
        assert mine["apiVersion"] == "resource.k8s.io/v1"
        assert mine["spec"]["devices"] == [{"name": "dev-0"}, {"name": "dev-1"}]
    finally:
        await informer.stop()


@pytest.fixture
async def kube_v1beta1() -> AsyncIterator[tuple[KubeEmulator, KubeClient]]:
    emu = KubeEmulator(served_resource_versions=("v1beta1",), bookmark_interval_s=0.3)
    url = await emu.start()
    client = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=url))
    try:
        yield emu, client
    finally:
        await client.close()
        await emu.stop()


async def test_namespaced_claims_are_keyed_by_namespace(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": NS},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]}
        },
    }
    emu.create(claim)
    seen: list[tuple[str, tuple[str, str]]] = []

    async def handler(event_type: EventType, obj: dict[str, Any], old: Any) -> None:
        seen.append((event_type, object_key(obj)))

    informer = Informer(
        ResourceV1Api(kube.api).list_namespaced_resource_claim,
        fast_settings(name="resourceclaims", namespace=NS),
    )
    informer.add_handler(handler)
    informer.start()
    try:
        await informer.wait_synced(10)
        assert seen == [("ADDED", (NS, "c1"))]
        assert informer.get("c1", NS) is not None
    finally:
        await informer.stop()


async def test_stop_closes_everything(emulator: tuple[KubeEmulator, str], kube: KubeClient) -> None:
    informer = make_informer(kube, Recorder())
    informer.start()
    await informer.wait_synced(10)
    await informer.stop()
    assert not informer.is_healthy()
    await informer.stop()  # idempotent


async def test_a_crash_inside_the_loop_is_logged_and_the_loop_restarts(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    emu.create(resource_slice("a"))
    calls = {"n": 0}

    def flaky(obj: dict[str, Any]) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("converter bug")
        return obj

    recorder = Recorder()
    informer = Informer(
        ResourceV1Api(kube.api).list_resource_slice, fast_settings(), converter=flaky
    )
    informer.add_handler(recorder)
    informer.start()
    try:
        await informer.wait_synced(10)
        assert informer.restart_count == 1
        assert isinstance(informer.last_error, RuntimeError)
        assert [(k, n) for k, n, _ in recorder.events] == [("ADDED", "a")]
        assert informer.is_healthy()
    finally:
        await informer.stop()


async def test_a_410_answer_to_the_watch_request_itself_relists(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    emu.create(resource_slice("a"))
    recorder = Recorder()
    informer = make_informer(kube, recorder)
    informer.start()
    try:
        await informer.wait_synced(10)
        lists_before = informer.list_count
        emu.fail_next(1, method="GET", path_regex="resourceslices", status=410)
        await emu.close_watches()
        emu.create(resource_slice("b"))
        await eventually(lambda: informer.get("b") is not None, what="b seen")
        assert informer.gone_count == 1
        assert informer.list_count == lists_before + 1
        assert not recorder.duplicates
    finally:
        await informer.stop()


async def test_retry_after_from_the_server_is_honoured(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    sleeps: list[float] = []

    async def recording_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(0.01)

    informer = Informer(
        ResourceV1Api(kube.api).list_resource_slice,
        fast_settings(backoff_max_s=5.0),
        sleep=recording_sleep,
    )
    emu.fail_next(1, method="GET", path_regex="resourceslices", status=429, retry_after=3)
    informer.start()
    try:
        await informer.wait_synced(10)
        assert sleeps[0] == 3.0
    finally:
        await informer.stop()


async def test_watches_cut_while_lists_work_still_turn_unhealthy(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    emu.create(resource_slice("a"))
    real = ResourceV1Api(kube.api).list_resource_slice
    broken = {"on": False}

    async def list_function(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("watch") and broken["on"]:
            raise aiohttp.ClientPayloadError("Response payload is not completed")
        return await real(*args, **kwargs)

    informer = Informer(list_function, fast_settings(unhealthy_after_failures=3))
    informer.start()
    try:
        await informer.wait_synced(10)
        broken["on"] = True
        await emu.close_watches()
        await eventually(lambda: not informer.is_healthy(), what="unhealthy")
        assert isinstance(informer.last_error, KubeUnavailable)
        assert isinstance(informer.last_error.__cause__, aiohttp.ClientPayloadError)
        # Lists went on working in between (re-list after repeated failures).
        assert informer.list_count >= 2
        broken["on"] = False
        emu.create(resource_slice("b"))
        await eventually(informer.is_healthy, what="healthy again")
        await eventually(lambda: informer.get("b") is not None, what="b seen")
    finally:
        await informer.stop()


async def test_the_uid_index_follows_adds_deletes_and_a_name_reused_by_a_new_object(
    emulator: tuple[KubeEmulator, str], kube: KubeClient
) -> None:
    emu, _ = emulator
    first = emu.create(resource_slice("a"))
    emu.create(resource_slice("b"))
    seen_in_handlers: list[tuple[EventType, str, bool]] = []
    informer = Informer(ResourceV1Api(kube.api).list_resource_slice, fast_settings())

    async def check(event_type: EventType, obj: dict[str, Any], old: Any) -> None:
        # Handlers see the index already agree with the cache.
        uid = obj["metadata"]["uid"]
        seen_in_handlers.append((event_type, obj["metadata"]["name"], informer.by_uid(uid) is obj))

    informer.add_handler(check)
    informer.start()
    try:
        await informer.wait_synced(10)
        old_uid = first["metadata"]["uid"]
        assert informer.by_uid(old_uid) is informer.get("a")
        assert informer.key_of_uid(old_uid) == ("", "a")
        emu.delete("resource.k8s.io/v1", "ResourceSlice", "a")
        again = emu.create(resource_slice("a"))
        new_uid = again["metadata"]["uid"]
        await eventually(lambda: informer.by_uid(new_uid) is not None, what="new a indexed")
        assert informer.by_uid(old_uid) is None and informer.key_of_uid(old_uid) is None
        assert informer.key_of_uid(new_uid) == ("", "a")
        assert sorted(informer.uids()) == sorted(
            o["metadata"]["uid"] for o in emu.list("resource.k8s.io/v1", "ResourceSlice")
        )
        assert ("DELETED", "a", False) in seen_in_handlers
        assert all(ok for kind, _, ok in seen_in_handlers if kind != "DELETED")
        assert informer.by_uid("no-such-uid") is None
    finally:
        await informer.stop()
