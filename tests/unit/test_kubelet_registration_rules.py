"""The kubelet stand-in's choice of DRA service: by name from Kubernetes 1.32 on, by version
number on 1.31 (pkg/kubelet/cm/dra/plugin/registration.go of each release)."""

from __future__ import annotations

import pytest

from fabric_dra_sim.kubelet.registration import (
    KUBELET_131_SERVICES,
    KUBELET_SERVICES,
    choose_service,
)


def test_a_newer_kubelet_takes_the_first_name_it_speaks_in_the_plugins_order() -> None:
    assert choose_service(["v1.DRAPlugin", "v1beta1.DRAPlugin", "1.0.0"]) == "v1.DRAPlugin"
    assert choose_service(["v1beta1.DRAPlugin", "v1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    assert choose_service(["1.0.0", "v1.DRAPlugin"], KUBELET_SERVICES) == "v1.DRAPlugin"
    with pytest.raises(ValueError, match="none of services supported"):
        choose_service(["1.0.0"], KUBELET_SERVICES)


@pytest.mark.parametrize(
    "versions",
    [
        ["v1.DRAPlugin", "v1beta1.DRAPlugin", "1.0.0"],
        ["1.0.0"],
        ["v1.0.0"],
        ["1.2", "0.9.0"],
        ["2.0.0", "1.0.0"],
        ["1.0.0-alpha"],
    ],
)
def test_a_1_31_kubelet_takes_a_1_x_version_and_skips_the_rest(versions: list[str]) -> None:
    assert choose_service(versions, KUBELET_131_SERVICES) == "v1alpha3.Node"


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        (["v1.DRAPlugin", "v1beta1.DRAPlugin"], "could not find a highest supported version"),
        (["2.0.0"], "could not find a highest supported version"),
        (["01.0.0"], "could not find a highest supported version"),
        (["1"], "could not find a highest supported version"),
        (["0.3.0"], "must be v1.x"),
        ([], "empty list"),
    ],
)
def test_a_1_31_kubelet_refuses_a_plugin_without_a_1_x_version(
    versions: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        choose_service(versions, KUBELET_131_SERVICES)
