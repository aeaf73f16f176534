"""Mode selection from the setting and discovery."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.kube.versions import ResourceApiVersion
from app.modes import ModeError, Modes, choose_modes

V1, V1BETA2, V1BETA1 = (
    ResourceApiVersion.V1,
    ResourceApiVersion.V1BETA2,
    ResourceApiVersion.V1BETA1,
)
CLASSIC = [
    "resourceslices",
    "resourceclaims",
    "deviceclasses",
    "resourceclaimtemplates",
    "podschedulingcontexts",
]


# What real clusters serve: 1.31 v1alpha3 only; 1.32/1.33 v1beta1 (and v1beta2 from 1.33);
# 1.34 and later v1, v1beta2, v1beta1.
@pytest.mark.parametrize(
    ("setting", "served", "expected"),
    [
        ("auto", ["v1", "v1beta2", "v1beta1"], Modes(V1, False)),
        ("auto", ["v1beta1"], Modes(V1BETA1, False)),
        ("auto", ["v1beta2", "v1beta1"], Modes(V1BETA2, False)),
        ("auto", ["v1alpha3"], Modes(None, True)),
        ("structured", ["v1", "v1beta2", "v1beta1"], Modes(V1, False)),
        ("control-plane", ["v1alpha3"], Modes(None, True)),
    ],
)
def test_modes_follow_the_setting_and_the_served_versions(
    setting: str, served: list[str], expected: Modes
) -> None:
    assert choose_modes(setting, served) == expected


def test_auto_on_1_31_needs_podschedulingcontexts() -> None:
    resources = [r for r in CLASSIC if r != "podschedulingcontexts"]
    with pytest.raises(ModeError, match="podschedulingcontexts"):
        choose_modes("auto", ["v1alpha3"], resources)
    assert choose_modes("auto", ["v1alpha3"], CLASSIC) == Modes(None, True)


@pytest.mark.parametrize(
    "served", [["v1", "v1beta2", "v1beta1"], ["v1alpha3"], ["v1beta1", "v1alpha3"]]
)
def test_both_modes_is_refused_because_no_release_serves_them_together(
    served: list[str],
) -> None:
    with pytest.raises(ModeError) as caught:
        choose_modes("both", served, CLASSIC)
    message = str(caught.value)
    for words in (
        "controller.mode both",
        "no Kubernetes release serves both",
        "Kubernetes 1.32 and later",
        "which 1.32 removed",
        "use auto",
    ):
        assert words in message
    assert "\n" not in message


def test_auto_runs_one_mode_even_if_a_server_offered_both() -> None:
    assert choose_modes("auto", ["v1beta1", "v1alpha3"], CLASSIC) == Modes(V1BETA1, False)


@pytest.mark.parametrize(
    ("setting", "served", "resources", "words"),
    [
        ("control-plane", ["v1"], None, ["serves v1", "v1alpha3", "podschedulingcontexts"]),
        ("control-plane", ["v1alpha3"], ["resourceclaims"], ["feature gate is off"]),
        ("structured", ["v1alpha3"], None, ["serves v1alpha3", "v1 or v1beta2 or v1beta1"]),
        ("both", ["v1"], None, ["no Kubernetes release serves both", "serves v1"]),
        ("both", ["v1alpha3"], None, ["no Kubernetes release serves both", "serves v1alpha3"]),
        ("auto", [], None, ["serves no version"]),
        ("sideways", ["v1"], None, ["not one of structured, control-plane, both, auto"]),
    ],
)
def test_a_mode_the_server_cannot_serve_is_a_clear_error(
    setting: str, served: list[str], resources: list[str] | None, words: list[str]
) -> None:
    with pytest.raises(ModeError) as caught:
        choose_modes(setting, served, resources)
    for word in words:
        assert word in str(caught.value)


@given(
    st.sampled_from(["structured", "control-plane", "both", "auto"]),
    st.lists(st.sampled_from(["v1", "v1beta2", "v1beta1", "v1alpha3", "v2"]), unique=True),
)
def test_a_chosen_mode_is_always_served(setting: str, served: list[str]) -> None:
    # Every case checks something: whether the setting can be served decides, independently of
    # choose_modes, between "refused with ModeError" and "a mode that is served".
    structured = bool({"v1", "v1beta2", "v1beta1"} & set(served))
    classic = "v1alpha3" in served
    servable = {
        "structured": structured,
        "control-plane": classic,
        "both": False,
        "auto": structured or classic,
    }[setting]
    if not servable:
        with pytest.raises(ModeError):
            choose_modes(setting, served)
        return
    modes = choose_modes(setting, served)
    assert modes.structured is None or modes.structured.value in served
    assert not modes.control_plane or "v1alpha3" in served
    assert modes.structured is not None or modes.control_plane
    assert modes.structured is None or not modes.control_plane  # one mode at a time
    if setting == "auto":
        assert (modes.structured is not None) == bool({"v1", "v1beta2", "v1beta1"} & set(served))


def test_describe_names_the_modes() -> None:
    assert Modes(V1, True).describe() == "structured (v1) and control-plane (v1alpha3)"
