"""Device names derived from vendor ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.naming import device_name, is_dns_label, sanitize_label


@pytest.mark.parametrize(
    ("vendor_id", "stem"),
    [
        ("/redfish/v1/CompositionService/ResourceBlocks/Block9/Processors/GPU0", "block9-gpu0"),
        (
            "/redfish/v1/CompositionService/ResourceBlocks/OffloadBlock9/Processors/Block9GPU",
            "offloadblock9-block9gpu",
        ),
        ("GPU 0 (bay #3)", "gpu-0-bay-3"),
        ("设备/显卡", "device"),
        ("/redfish/v1/", "redfish-v1"),
        ("----", "device"),
    ],
)
def test_name_is_readable_stem_plus_hash(vendor_id: str, stem: str) -> None:
    name = device_name(vendor_id)
    assert name.rsplit("-", 1)[0] == stem
    assert len(name.rsplit("-", 1)[1]) == 8
    assert is_dns_label(name)


def test_ids_that_sanitise_alike_get_different_names() -> None:
    assert device_name("Block/GPU0") != device_name("block/gpu0")
    assert device_name("a/b c") != device_name("a/b-c")


def test_long_ids_are_truncated_to_a_label() -> None:
    name = device_name("/x/" + "a" * 500)
    assert len(name) == 63
    assert is_dns_label(name)


def test_a_taken_name_gets_a_longer_hash() -> None:
    first = device_name("/rb/Block1/Processors/GPU0")
    second = device_name("/rb/Block1/Processors/GPU0", taken={first})
    assert second != first
    assert second.startswith(first.rsplit("-", 1)[0])
    assert is_dns_label(second)


def test_empty_vendor_id_is_refused() -> None:
    with pytest.raises(ValueError, match="empty vendor id"):
        device_name("")


def test_every_candidate_taken_is_refused() -> None:
    vendor_id = "/rb/B/GPU0"
    taken: set[str] = set()
    for _ in range(4):
        taken.add(device_name(vendor_id, taken))
    with pytest.raises(ValueError, match="taken"):
        device_name(vendor_id, taken)


@settings(max_examples=300)
@given(st.text(min_size=1, max_size=300))
def test_any_vendor_id_gives_a_stable_dns_label(vendor_id: str) -> None:
    name = device_name(vendor_id)
    assert is_dns_label(name)
    assert device_name(vendor_id) == name


@settings(max_examples=200)
@given(st.lists(st.text(min_size=1, max_size=40), min_size=2, max_size=30, unique=True))
def test_distinct_ids_get_distinct_names_when_taken_is_tracked(ids: list[str]) -> None:
    taken: set[str] = set()
    for vendor_id in ids:
        name = device_name(vendor_id, taken)
        assert name not in taken
        taken.add(name)


@given(st.text(max_size=200))
def test_sanitize_label_output_alphabet(text: str) -> None:
    out = sanitize_label(text)
    assert out == "" or is_dns_label(out)
