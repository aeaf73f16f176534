"""The control-plane snapshot cache: a part is rebuilt only when its source changed, the
cached parts are replaced as one value, the answer memo is cleared with them, and the host map
is read again only when nodes or hosts changed or it has aged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.controlplane import plan as cp
from app.controlplane.snapshot import SnapshotCache
from app.heap import HeapSettler
from app.heldfeed import HeldFeed
from app.hostmap import HostRef
from app.reservations import HeldDevice


class Listing:
    """Stands in for an informer: hands out fixed objects and counts the calls."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.items = objects
        self.calls = 0

    def objects(self) -> list[dict[str, Any]]:
        self.calls += 1
        return list(self.items)


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}


class Sources:
    def __init__(self) -> None:
        self.slices = Listing([])
        self.classes = Listing([{"metadata": {"name": "gpu"}, "spec": {}}])
        self.nodes = Listing([node("n1")])
        self.host_reads = 0
        self.held_reads = 0
        self.now = 100.0
        self.settles: list[float] = []
        self.heap = HeapSettler(
            60.0, now=lambda: self.now, settle=lambda: self.settles.append(self.now)
        )

    async def host_refs(self) -> Sequence[HostRef]:
        self.host_reads += 1
        return [HostRef("n1", "n1")]

    async def held(self) -> list[HeldDevice]:
        self.held_reads += 1
        return []

    def cache(self) -> SnapshotCache:
        return SnapshotCache(
            self.slices,
            self.classes,
            self.nodes,  # type: ignore[arg-type]
            driver_name="fabric.example.com",
            host_refs=self.host_refs,
            held=self.held,
            feed=HeldFeed(),
            host_match="hostname",
            host_key="fabric-dra.io/host-id",
            hosts_refresh_s=10.0,
            answers=cp.NodeAnswers(),
            heap=self.heap,
            now=lambda: self.now,
        )


def remember_something(answers: cp.NodeAnswers) -> None:
    answers.spec_key([])


async def test_parts_are_reused_until_their_source_changes() -> None:
    sources = Sources()
    cache = sources.cache()
    first = await cache.snapshot(set())
    assert set(first.nodes) == {"n1"} and set(first.classes) == {"gpu"}
    assert first.hosts == {"n1": "n1"}
    calls = (sources.slices.calls, sources.classes.calls, sources.nodes.calls)
    remember_something(cache.answers)
    second = await cache.snapshot(set())
    assert (sources.slices.calls, sources.classes.calls, sources.nodes.calls) == calls
    assert second.nodes is first.nodes and second.reachable is first.reachable
    assert cache.answers._specs, "nothing changed: the memo stays"

    cache.changed("classes")
    third = await cache.snapshot(set())
    assert sources.classes.calls == calls[1] + 1
    assert sources.slices.calls == calls[0], "pools are not gathered again for a class"
    assert third.nodes is first.nodes and third.reachable is first.reachable
    assert not cache.answers._specs, "a rebuilt part clears the memo"


async def test_a_node_change_rebuilds_nodes_reach_and_hosts_but_not_pools() -> None:
    sources = Sources()
    cache = sources.cache()
    first = await cache.snapshot(set())
    slice_calls, host_reads = sources.slices.calls, sources.host_reads
    sources.nodes.items.append(node("n2"))
    cache.changed("nodes", "hosts")
    second = await cache.snapshot(set())
    assert set(second.nodes) == {"n1", "n2"} and set(second.reachable) == {"n1", "n2"}
    assert sources.host_reads == host_reads + 1
    assert sources.slices.calls == slice_calls and second.pools is first.pools


async def test_the_host_map_is_read_again_only_when_changed_or_aged() -> None:
    sources = Sources()
    cache = sources.cache()
    await cache.host_map()
    await cache.host_map()
    assert sources.host_reads == 1
    sources.now += 10.5
    await cache.host_map()
    assert sources.host_reads == 2
    cache.changed("hosts")
    await cache.host_map()
    assert sources.host_reads == 3
    await cache.snapshot(set())
    assert sources.host_reads == 3, "the snapshot uses the host map just read"
    remember_something(cache.answers)
    cache.changed("hosts")
    await cache.snapshot(set())
    assert sources.host_reads == 4
    assert cache.answers._specs, "a host change alone keeps the memo"


async def test_the_heap_is_settled_after_the_pools_are_rebuilt_at_most_once_a_minute() -> None:
    sources = Sources()
    cache = sources.cache()
    await cache.snapshot(set())
    assert sources.settles == [100.0], "the first pools are settled at once"
    cache.changed("classes", "nodes")
    await cache.snapshot(set())
    assert sources.settles == [100.0], "pools not rebuilt: nothing to settle"
    sources.now += 10
    cache.changed("slices")
    await cache.snapshot(set())
    assert sources.settles == [100.0], "too soon after the last settle"
    sources.now += 49
    await cache.snapshot(set())
    assert sources.settles == [100.0]
    sources.now += 1
    await cache.snapshot(set())
    assert sources.settles == [100.0, 160.0], "the waiting rebuild, once due"
    sources.now += 100
    await cache.snapshot(set())
    assert sources.settles == [100.0, 160.0], "nothing rebuilt since"
