"""The publisher's local view of its ResourceSlices: echoes, tombstones, deletions seen, resync."""

from __future__ import annotations

from typing import Any

from app.publisher.view import CONTENT_KEY, SliceView

DRIVER = "fabric.example.com"


def resource_slice(
    name: str, rv: int, pool: str = "p1", *, generation: int = 1, key: str = "k"
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rv)},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
            CONTENT_KEY: key,
        },
    }


def test_the_echo_of_our_own_write_queues_nothing() -> None:
    view = SliceView(DRIVER)
    assert view.on_answer(resource_slice("s-0", 5), "k")
    assert view.on_event("ADDED", resource_slice("s-0", 5)) == []
    assert view.on_event("MODIFIED", resource_slice("s-0", 4)) == []
    assert view.names("p1") == ["s-0"]


def test_someone_elses_change_queues_the_pool_and_a_move_both_pools() -> None:
    view = SliceView(DRIVER)
    view.on_event("ADDED", resource_slice("s-0", 5))
    assert view.on_event("MODIFIED", resource_slice("s-0", 6)) == ["p1"]
    assert view.on_event("MODIFIED", resource_slice("s-0", 7, pool="p2")) == ["p2", "p1"]
    assert view.pools_with_slices() == {"p2"}
    assert not view.has_slices("p1")


def test_our_delete_is_not_undone_by_an_older_event_and_its_echo_queues_nothing() -> None:
    view = SliceView(DRIVER)
    view.on_event("ADDED", resource_slice("s-0", 5))
    view.forget("s-0", 5, tombstone=True)
    assert view.on_event("MODIFIED", resource_slice("s-0", 5)) == []
    assert view.get("s-0") is None
    assert view.on_event("DELETED", resource_slice("s-0", 6)) == []


def test_a_deletion_seen_before_the_answer_of_the_write_is_not_hidden() -> None:
    view = SliceView(DRIVER)
    assert view.on_event("ADDED", resource_slice("s-0", 5)) == ["p1"]
    assert view.on_event("DELETED", resource_slice("s-0", 6)) == ["p1"]
    assert not view.on_answer(resource_slice("s-0", 5), "k")
    assert view.get("s-0") is None
    view.on_read(resource_slice("s-0", 6))  # a read served before the deletion
    assert view.get("s-0") is None
    assert view.on_answer(resource_slice("s-0", 7), "k")  # recreated
    assert view.names("p1") == ["s-0"]


def test_resync_corrects_missing_outdated_and_gone_slices_only() -> None:
    view = SliceView(DRIVER)
    view.on_event("ADDED", resource_slice("same", 3))
    view.on_event("ADDED", resource_slice("old", 3, key="a"))
    view.on_event("ADDED", resource_slice("gone", 3))
    view.on_answer(resource_slice("newer", 9), "k")  # written after the list was served
    listed = [
        resource_slice("same", 3),
        resource_slice("old", 4, key="b"),
        resource_slice("missing", 4),
    ]
    assert view.correct(listed, 5) == 3
    assert view.names("p1") == ["missing", "newer", "old", "same"]
    old = view.get("old")
    assert old is not None and old.content_key == "b"
    # "gone" was seen deleted at the list's version: an older event does not bring it back.
    assert view.on_event("MODIFIED", resource_slice("gone", 4)) == []
    assert view.correct([*listed, resource_slice("newer", 9)], 9) == 0


def test_the_floor_generation_is_the_highest_seen_even_after_the_slice_is_gone() -> None:
    view = SliceView(DRIVER)
    assert view.floor_generation("p1") is None
    view.on_event("ADDED", resource_slice("s-0", 5, generation=3))
    view.on_event("DELETED", resource_slice("s-0", 6, generation=3))
    assert view.floor_generation("p1") == 3
    view.discard_pool("p1")
    assert view.pools_with_slices() == set()


def test_the_tombstones_and_deletions_seen_are_bounded() -> None:
    view = SliceView(DRIVER, max_names=2)
    for number in range(3):
        view.forget(f"s-{number}", number, tombstone=True)
        view.on_event("DELETED", resource_slice(f"d-{number}", 10 + number))
    # The oldest of each is forgotten: its old events are stored again.
    assert view.on_event("ADDED", resource_slice("s-0", 1)) == ["p1"]
    assert view.on_event("ADDED", resource_slice("s-1", 1)) == []
    assert view.on_event("ADDED", resource_slice("d-0", 1)) == ["p1"]
    assert view.on_event("ADDED", resource_slice("d-1", 1)) == []
