"""The node-side parts of a claim's opaque configuration (app.claims.model): FabricDeviceConfig's
``env`` and ``mounts``, how :func:`effective_config` merges them across config entries, and the
identity data the controller writes for the node plugin (:func:`device_identity_data`)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from app.claims.model import (
    FabricDeviceConfig,
    InvalidClaimConfig,
    MountConfig,
    device_identity_data,
    effective_config,
)
from app.fabric.types import DeviceType, FabricDevice, Location

DRIVER = "fabric.example.com"
HEAD = {"apiVersion": "fabric-dra.io/v1alpha1", "kind": "FabricDeviceConfig"}


def config(**fields: Any) -> dict[str, Any]:
    return {**HEAD, **fields}


def entry(
    parameters: dict[str, Any],
    requests: list[str] | None = None,
    source: str = "FromClaim",
    driver: str = DRIVER,
) -> dict[str, Any]:
    out: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        out["requests"] = requests
    return out


def claim_with(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [], "config": list(entries)}}}}


def refusal(parameters: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        FabricDeviceConfig.model_validate(parameters)
    return str(caught.value)


# --- env ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["A", "_", "_X1", "my_var", "MY_VAR_2", "x" * 200, "FABRIC_DR"])
def test_env_names_that_follow_the_rule_are_accepted(name: str) -> None:
    parsed = FabricDeviceConfig.model_validate(config(env={name: "v"}))
    assert parsed.env == {name: "v"}


@pytest.mark.parametrize("name", ["", "1A", "A-B", "A B", "A=B", "A.B", "é", "A\x00"])
def test_env_names_that_break_the_rule_are_refused_and_named(name: str) -> None:
    message = refusal(config(env={name: "v"}))
    assert "[A-Za-z_][A-Za-z0-9_]*" in message
    assert repr(name) in message


@pytest.mark.parametrize(
    "name", ["FABRIC_DRA_X", "FABRIC_DRA_", "fabric_dra_devices", "Fabric_Dra_A"]
)
def test_env_names_with_our_prefix_are_refused_in_any_case(name: str) -> None:
    message = refusal(config(env={name: "v"}))
    assert "FABRIC_DRA_ prefix is ours" in message


def test_at_most_32_env_variables() -> None:
    ok = {f"V{i}": "x" for i in range(32)}
    assert FabricDeviceConfig.model_validate(config(env=ok)).env == ok
    message = refusal(config(env={**ok, "V32": "x"}))
    assert "env" in message and "32" in message


def test_env_values_are_at_most_4096_characters() -> None:
    assert FabricDeviceConfig.model_validate(config(env={"A": "x" * 4096})).env == {"A": "x" * 4096}
    message = refusal(config(env={"A": "x" * 4097}))
    assert "4096" in message


def test_env_values_must_be_strings() -> None:
    message = refusal(config(env={"A": 5}))
    assert "env.A" in message


# --- mounts ------------------------------------------------------------------------------------


def test_a_mount_is_read_only_unless_it_says_otherwise() -> None:
    parsed = FabricDeviceConfig.model_validate(
        config(
            mounts=[
                {"hostPath": "/data", "containerPath": "/mnt/data"},
                {"hostPath": "/scratch", "containerPath": "/mnt/s", "readOnly": False},
            ]
        )
    )
    assert parsed.mounts == [
        MountConfig(hostPath="/data", containerPath="/mnt/data", readOnly=True),
        MountConfig(hostPath="/scratch", containerPath="/mnt/s", readOnly=False),
    ]


@pytest.mark.parametrize(
    "path", ["data", "", "./data", "/data/../etc", "/..", "/a/..", "/a\x00b", "/" + "a" * 4096]
)
@pytest.mark.parametrize("which", ["hostPath", "containerPath"])
def test_mount_paths_must_be_absolute_without_dotdot(path: str, which: str) -> None:
    mount = {"hostPath": "/data", "containerPath": "/mnt", which: path}
    message = refusal(config(mounts=[mount]))
    assert which in message
    assert "absolute path without .." in message or "4096" in message


@pytest.mark.parametrize("path", ["/", "/data", "/data/x..y", "/a/.b/c", "/a//b", "/" + "a" * 4095])
def test_mount_paths_that_are_absolute_without_dotdot_are_accepted(path: str) -> None:
    parsed = FabricDeviceConfig.model_validate(
        config(mounts=[{"hostPath": path, "containerPath": path}])
    )
    assert parsed.mounts is not None and parsed.mounts[0].hostPath == path


def test_at_most_16_mounts() -> None:
    mounts = [{"hostPath": f"/d{i}", "containerPath": f"/m{i}"} for i in range(17)]
    assert len(FabricDeviceConfig.model_validate(config(mounts=mounts[:16])).mounts or []) == 16
    message = refusal(config(mounts=mounts))
    assert "mounts" in message and "16" in message


@pytest.mark.parametrize(
    "mount",
    [
        {"hostPath": "/d"},
        {"containerPath": "/d"},
        {"hostPath": "/d", "containerPath": "/d", "readonly": True},
        {"hostPath": "/d", "containerPath": "/d", "readOnly": "sometimes"},
        "/d:/d",
    ],
)
def test_malformed_mounts_are_refused(mount: Any) -> None:
    assert "mounts.0" in refusal(config(mounts=[mount]))


def test_an_unknown_field_is_refused() -> None:
    assert "environment" in refusal(config(environment={"A": "1"}))


# --- effective_config --------------------------------------------------------------------------


def test_a_later_entry_adds_env_and_overrides_the_same_names() -> None:
    claim = claim_with(
        entry(config(env={"A": "class", "B": "class"}), source="FromClass"),
        entry(config(env={"B": "claim", "C": "claim"})),
    )
    merged = effective_config(claim, DRIVER, ["r"])
    assert merged["r"].env == (("A", "class"), ("B", "claim"), ("C", "claim"))


def test_a_later_entry_replaces_the_mounts() -> None:
    claim = claim_with(
        entry(config(mounts=[{"hostPath": "/a", "containerPath": "/a"}]), source="FromClass"),
        entry(config(mounts=[{"hostPath": "/b", "containerPath": "/b", "readOnly": False}])),
    )
    assert effective_config(claim, DRIVER, ["r"])["r"].mounts == (("/b", "/b", False),)


def test_an_entry_without_mounts_keeps_the_earlier_mounts() -> None:
    claim = claim_with(
        entry(config(mounts=[{"hostPath": "/a", "containerPath": "/a"}])),
        entry(config(env={"X": "1"})),
    )
    merged = effective_config(claim, DRIVER, ["r"])["r"]
    assert merged.mounts == (("/a", "/a", True),)
    assert merged.env == (("X", "1"),)


def test_env_and_mounts_go_only_to_the_requests_an_entry_names() -> None:
    claim = claim_with(
        entry(config(env={"ALL": "1"})),
        entry(
            config(env={"ONLY_GPU": "1"}, mounts=[{"hostPath": "/g", "containerPath": "/g"}]),
            requests=["gpu"],
        ),
    )
    merged = effective_config(claim, DRIVER, ["gpu", "disk"])
    assert merged["gpu"].env == (("ALL", "1"), ("ONLY_GPU", "1"))
    assert merged["gpu"].mounts == (("/g", "/g", True),)
    assert merged["disk"].env == (("ALL", "1"),)
    assert merged["disk"].mounts == ()


def test_other_drivers_entries_are_not_read() -> None:
    claim = claim_with(entry({"anything": True}, driver="other.example.com"))
    assert effective_config(claim, DRIVER, ["r"])["r"].env == ()


def test_an_invalid_entry_names_its_index_source_requests_and_field() -> None:
    claim = claim_with(
        entry(config(env={"A": "1"})),
        entry(config(env={"FABRIC_DRA_X": "1"}), requests=["r"], source="FromClass"),
    )
    with pytest.raises(InvalidClaimConfig) as caught:
        effective_config(claim, DRIVER, ["r"])
    message = str(caught.value)
    assert message.startswith("config[1] (FromClass) for requests ['r']: env.FABRIC_DRA_X")
    assert "FABRIC_DRA_ prefix is ours" in message


def test_a_bad_mount_is_reported_with_its_position() -> None:
    claim = claim_with(entry(config(mounts=[{"hostPath": "/ok", "containerPath": "rel"}])))
    with pytest.raises(InvalidClaimConfig, match=r"mounts\.0\.containerPath"):
        effective_config(claim, DRIVER, ["r"])


ENV_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: not n.upper().startswith("FABRIC_DRA_")
)
ENVS = st.dictionaries(ENV_NAMES, st.text(max_size=10), max_size=6)


@given(st.lists(ENVS, min_size=1, max_size=5))
def test_env_merging_is_a_union_where_later_entries_win(envs: list[dict[str, str]]) -> None:
    claim = claim_with(*(entry(config(env=e)) for e in envs))
    expected: dict[str, str] = {}
    for env in envs:
        expected.update(env)
    assert effective_config(claim, DRIVER, ["r"])["r"].env == tuple(sorted(expected.items()))


PATHS = st.from_regex(r"(/[a-z]{1,4}){1,3}", fullmatch=True)
MOUNT_LISTS = st.lists(
    st.builds(
        lambda h, c, ro: {"hostPath": h, "containerPath": c, "readOnly": ro},
        PATHS,
        PATHS,
        st.booleans(),
    ),
    min_size=1,
    max_size=4,
)


@given(st.lists(MOUNT_LISTS, min_size=1, max_size=4))
def test_the_last_entry_with_mounts_decides_them(mount_lists: list[list[dict[str, Any]]]) -> None:
    claim = claim_with(*(entry(config(mounts=m)) for m in mount_lists))
    last = mount_lists[-1]
    assert effective_config(claim, DRIVER, ["r"])["r"].mounts == tuple(
        (m["hostPath"], m["containerPath"], m["readOnly"]) for m in last
    )


# --- device_identity_data ----------------------------------------------------------------------


def fabric_device(**changes: Any) -> FabricDevice:
    fields: dict[str, Any] = {
        "vendor_id": "/redfish/v1/Chassis/1/PCIeDevices/GPU0",
        "attach_unit": "/redfish/v1/CompositionService/ResourceBlocks/B0",
        "device_type": DeviceType.GPU,
        **changes,
    }
    return FabricDevice(**fields)


def test_identity_data_carries_every_identity_field_the_fabric_gives() -> None:
    device = fabric_device(
        serial="SN-1",
        uuid="3f2a6b1c-0d4e-4f5a-8b9c-0123456789ab",
        attributes={"pci_vendor_id": "0x10de", "pci_device_id": "0x20b5", "other": "x"},
        location=Location(slot="7"),
    )
    assert device_identity_data(device) == {
        "deviceType": "gpu",
        "uuid": "3f2a6b1c-0d4e-4f5a-8b9c-0123456789ab",
        "serialNumber": "SN-1",
        "pciVendorId": "0x10de",
        "pciDeviceId": "0x20b5",
        "slot": "7",
    }


def test_identity_data_has_only_the_type_when_the_fabric_says_nothing_else() -> None:
    device = fabric_device(device_type=DeviceType.CXL_MEMORY)
    assert device_identity_data(device) == {"deviceType": "cxl-memory"}


def test_identity_data_leaves_out_empty_and_non_string_values() -> None:
    device = fabric_device(
        serial="",
        uuid="",
        attributes={"pci_vendor_id": 4318, "pci_device_id": True},
        location=Location(slot=""),
    )
    assert device_identity_data(device) == {"deviceType": "gpu"}
