"""Label and field selector parsing and matching."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric_dra_sim.kubeapi.errors import StatusError
from fabric_dra_sim.kubeapi.selectors import (
    field_value,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)

LABELS = {"tier": "gold", "rack": "r1"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("tier=gold", True),
        ("tier==gold", True),
        ("tier=silver", False),
        ("tier!=gold", False),
        ("zone!=a", True),
        ("tier in (gold, silver)", True),
        ("tier in (silver)", False),
        ("tier notin (silver)", True),
        ("zone notin (a)", True),
        ("rack", True),
        ("zone", False),
        ("!zone", True),
        ("!rack", False),
        ("tier=gold,rack=r1", True),
        ("tier=gold,rack=r2", False),
        ("", True),
        ("tier in (gold),!zone", True),
    ],
)
def test_label_selector_matching(selector: str, matches: bool) -> None:
    assert labels_match(parse_label_selector(selector), LABELS) is matches


@pytest.mark.parametrize("selector", ["a in (b", "=b", "a b c", "a in b)"])
def test_label_selector_syntax_errors_are_400(selector: str) -> None:
    with pytest.raises(StatusError) as caught:
        parse_label_selector(selector)
    assert caught.value.code == 400


label_text = st.text(alphabet="abcxyz0189", min_size=1, max_size=5)


@given(st.dictionaries(label_text, label_text, max_size=4), label_text, label_text)
def test_equality_and_set_forms_agree(labels: dict[str, str], key: str, value: str) -> None:
    equal = labels_match(parse_label_selector(f"{key}={value}"), labels)
    in_set = labels_match(parse_label_selector(f"{key} in ({value})"), labels)
    not_equal = labels_match(parse_label_selector(f"{key}!={value}"), labels)
    assert equal == in_set == (labels.get(key) == value)
    assert not_equal is not equal


def test_field_selectors_only_allow_known_paths() -> None:
    reqs = parse_field_selector("spec.nodeName=n1,metadata.name!=x", ["spec.nodeName"])
    assert fields_match(reqs, {"metadata": {"name": "y"}, "spec": {"nodeName": "n1"}})
    assert not fields_match(reqs, {"metadata": {"name": "x"}, "spec": {"nodeName": "n1"}})
    with pytest.raises(StatusError) as caught:
        parse_field_selector("spec.other=1", ["spec.nodeName"])
    assert caught.value.code == 400
    assert "field label not supported: spec.other" in caught.value.message


def test_field_values_of_missing_and_boolean_fields() -> None:
    assert field_value({"spec": {}}, "spec.nodeName") == ""
    assert field_value({"spec": {"unschedulable": True}}, "spec.unschedulable") == "true"
