"""Mode selection from the setting and discovery."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.kube.versions import ResourceApiVersion
from app.modes import ModeError, Modes, choose_modes

V1, V1BETA2, V1BETA1 = (ResourceApiVersion.V1, ResourceApiVersion.V1BETA2,
                        ResourceApiVersion.V1BETA1)
CLASSIC = ["resourceslices", "resourceclaims", "deviceclasses", "resourceclaimtemplates",
           "podschedulingcontexts"]


@pytest.mark.parametrize(("setting", "served", "expected"), [
    ("auto", ["v1"], Modes(V1, False)),
    ("auto", ["v1beta1"], Modes(V1BETA1, False)),
    ("auto", ["v1alpha3"], Modes(None, True)),
    ("auto", ["v1beta2", "v1beta1", "v1alpha3"], Modes(V1BETA2, True)),
    ("structured", ["v1", "v1beta2", "v1alpha3"], Modes(V1, False)),
    ("control-plane", ["v1", "v1alpha3"], Modes(None, True)),
    ("both", ["v1beta1", "v1alpha3"], Modes(V1BETA1, True)),
])
def test_modes_follow_the_setting_and_the_served_versions(
    setting: str, served: list[str], expected: Modes
) -> None:
    assert choose_modes(setting, served) == expected


def test_auto_without_podschedulingcontexts_is_structured_only() -> None:
    resources = [r for r in CLASSIC if r != "podschedulingcontexts"]
    assert choose_modes("auto", ["v1beta1", "v1alpha3"], resources) == Modes(V1BETA1, False)
    assert choose_modes("auto", ["v1alpha3"], CLASSIC) == Modes(None, True)


@pytest.mark.parametrize(("setting", "served", "resources", "words"), [
    ("control-plane", ["v1"], None, ["serves v1", "v1alpha3", "podschedulingcontexts"]),
    ("control-plane", ["v1alpha3"], ["resourceclaims"], ["feature gate is off"]),
    ("structured", ["v1alpha3"], None, ["serves v1alpha3", "v1 or v1beta2 or v1beta1"]),
    ("both", ["v1"], None, ["control-plane (classic DRA) mode needs"]),
    ("both", ["v1alpha3"], None, ["structured parameters need"]),
    ("auto", [], None, ["serves no version"]),
    ("sideways", ["v1"], None, ["not one of structured, control-plane, both, auto"]),
])
def test_a_mode_the_server_cannot_serve_is_a_clear_error(
    setting: str, served: list[str], resources: list[str] | None, words: list[str]
) -> None:
    with pytest.raises(ModeError) as caught:
        choose_modes(setting, served, resources)
    for word in words:
        assert word in str(caught.value)


@given(st.sampled_from(["structured", "control-plane", "both", "auto"]),
       st.lists(st.sampled_from(["v1", "v1beta2", "v1beta1", "v1alpha3", "v2"]), unique=True))
def test_a_chosen_mode_is_always_served(setting: str, served: list[str]) -> None:
    try:
        modes = choose_modes(setting, served)
    except ModeError:
        return
    assert modes.structured is None or modes.structured.value in served
    assert not modes.control_plane or "v1alpha3" in served
    assert modes.structured is not None or modes.control_plane
    if setting == "auto":
        assert (modes.structured is not None) == bool({"v1", "v1beta2", "v1beta1"} & set(served))


def test_describe_names_the_modes() -> None:
    assert Modes(V1, True).describe() == "structured (v1) and control-plane (v1alpha3)"
