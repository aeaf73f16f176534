"""The store's per-resource event rings: snapshots rebuilt at an old version, watch windows,
watch-cache restarts, watchers that fall behind, replayed events."""

from __future__ import annotations

from typing import Any

from fabric_dra_sim.kubeapi.store import WATCH_TOO_OLD, Store, StoreEvent, Watcher, WatchExpired

NODES = ("", "nodes")
PODS = ("", "pods")


def _obj(name: str, rv: int, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv)}, **extra}


def _create(store: Store, gr: tuple[str, str], name: str, **extra: Any) -> int:
    rv = store.next_rv()
    store.put(gr, ("", name), _obj(name, rv, **extra), "ADDED", None)
    return rv


def _modify(store: Store, gr: tuple[str, str], name: str, **extra: Any) -> int:
    old = store.get(gr, ("", name))
    rv = store.next_rv()
    store.put(gr, ("", name), _obj(name, rv, **extra), "MODIFIED", old)
    return rv


def _delete(store: Store, gr: tuple[str, str], name: str) -> int:
    rv = store.next_rv()
    store.remove(gr, ("", name), _obj(name, rv))
    return rv


def _names(snapshot: Any) -> dict[str, str]:
    return {key[1]: obj["metadata"]["resourceVersion"] for key, obj in snapshot}


def test_a_snapshot_shows_objects_as_they_were_at_its_version() -> None:
    store = Store()
    _create(store, NODES, "a")
    _create(store, NODES, "b")
    at = _create(store, NODES, "c")
    _modify(store, NODES, "a", spec={"x": 1})
    _delete(store, NODES, "b")
    _create(store, NODES, "d")
    _create(store, PODS, "unrelated")
    assert _names(store.snapshot(NODES, at)) == {"a": "1", "b": "2", "c": "3"}
    # Now: a modified, b gone, d new.
    assert _names(store.snapshot(NODES, store.rv)) == {"a": "4", "c": "3", "d": "6"}


def test_a_snapshot_older_than_the_ring_is_gone() -> None:
    store = Store(history_size=2)
    first = _create(store, NODES, "a")
    for _ in range(3):
        _modify(store, NODES, "a")
    assert store.snapshot(NODES, first) is None
    assert store.snapshot(NODES, store.rv - 1) is not None


def test_each_resource_has_its_own_window() -> None:
    store = Store(history_size=2)
    start = store.rv
    _create(store, PODS, "quiet")
    for i in range(5):
        _create(store, NODES, f"n{i}")
    # The busy resource evicted its old events; the quiet one still reaches back.
    assert store.watch_events_since(NODES, start) is None
    assert [e.obj["metadata"]["name"] for e in store.watch_events_since(PODS, start) or []] == [
        "quiet"
    ]


def test_history_size_can_be_set_per_resource() -> None:
    store = Store(history_size=100)
    store.set_history_size(NODES, 1)
    start = _create(store, NODES, "a")
    _create(store, NODES, "b")
    _create(store, NODES, "c")
    assert store.watch_events_since(NODES, start) is None
    assert store.history(PODS).capacity == 100


def test_oldest_resumable_version_follows_the_watch_cache() -> None:
    store = Store(history_size=2)
    ring = store.history(NODES)
    assert ring.oldest_watch_rv == 0  # nothing evicted: back to where the ring started
    _create(store, NODES, "a")
    second = _create(store, NODES, "b")
    third = _create(store, NODES, "c")
    # GetIntervalLocked: after an eviction, the oldest kept event minus one.
    assert ring.oldest_watch_rv == second - 1
    assert store.watch_events_since(NODES, second - 1) is not None
    assert [e.rv for e in store.watch_events_since(NODES, second) or []] == [third]


def test_a_watch_cache_restart_expires_watches_but_keeps_snapshots() -> None:
    store = Store()
    old = _create(store, NODES, "a")
    _modify(store, NODES, "a")
    store.restart_watch_cache()
    assert store.watch_events_since(NODES, old) is None
    assert store.watch_events_since(NODES, store.rv) == []
    assert _names(store.snapshot(NODES, old)) == {"a": str(old)}
    # A resource first used after the restart starts there too.
    assert store.watch_events_since(PODS, old) is None


def test_compaction_loses_snapshots_too() -> None:
    store = Store()
    old = _create(store, NODES, "a")
    _modify(store, NODES, "a")
    store.compact()
    assert store.snapshot(NODES, old) is None
    assert store.watch_events_since(NODES, old) is None


def test_a_watcher_a_whole_window_behind_gets_410() -> None:
    store = Store(history_size=3)
    watcher = Watcher(NODES, accepts=lambda _e: True)
    store.watchers.add(watcher)
    for i in range(5):
        _create(store, NODES, f"n{i}")
    items = [watcher.queue.get_nowait() for _ in range(watcher.queue.qsize())]
    assert [type(i).__name__ for i in items] == ["StoreEvent"] * 3 + ["WatchExpired"]
    assert items[-1] == WatchExpired(WATCH_TOO_OLD)
    assert watcher.expired


def test_an_old_event_can_be_delivered_past_the_version_filter() -> None:
    store = Store()
    _create(store, NODES, "a")
    _modify(store, NODES, "a")
    watcher = Watcher(NODES, accepts=lambda e: e.rv > store.rv)
    store.watchers.add(watcher)
    old_event = store.history(NODES).events[0]
    assert store.deliver(old_event) == 1
    item = watcher.queue.get_nowait()
    assert isinstance(item, StoreEvent) and item.rv == old_event.rv
    assert store.expire_watchers(PODS) == 0
    assert store.expire_watchers(None) == 1
