"""The kubelet stand-in's CDI checks: schema plus semantic rules, loading a spec directory and
resolving CDI ids to container edits as a runtime does."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from fabric_dra_sim.kubelet.cdi_check import (
    CdiError,
    load_specs,
    minimum_version,
    parse_device_id,
    resolve,
    validate_spec,
)


def vendor_spec() -> dict[str, Any]:
    """A spec in the shape of the CDI SPEC.md example: a vendor GPU kind, two devices, spec-level
    edits (an env var, a device node, a hook) and per-device nodes and mounts."""
    return {
        "cdiVersion": "0.6.0",
        "kind": "vendor.com/device",
        "devices": [
            {
                "name": "myDevice",
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "hostPath": "/vendor/dev/card1",
                            "path": "/dev/card1",
                            "type": "c",
                            "major": 25,
                            "minor": 25,
                            "fileMode": 384,
                            "permissions": "rw",
                            "uid": 1000,
                            "gid": 1000,
                        },
                        {"path": "/dev/card-render1", "type": "c", "major": 25, "minor": 25},
                    ],
                    "mounts": [
                        {"hostPath": "/bin/vendorBin", "containerPath": "/bin/vendorBin"},
                        {
                            "hostPath": "/usr/lib/libVendor.so.0",
                            "containerPath": "/usr/lib/libVendor.so.0",
                            "options": ["ro"],
                        },
                    ],
                },
            },
            {"name": "other", "containerEdits": {"env": ["OTHER=1"]}},
        ],
        "containerEdits": {
            "env": ["FOO=VALID_SPEC", "BAR=BARVALUE1"],
            "deviceNodes": [{"path": "/dev/vendorctl", "type": "b", "major": 25, "minor": 25}],
            "mounts": [{"hostPath": "/bin/vendorBin", "containerPath": "/bin/vendorBin"}],
            "hooks": [{"hookName": "createContainer", "path": "/bin/vendor-hook"}],
        },
    }


def fabric_spec(claim_uid: str = "0d5f5a1c-aaaa-bbbb-cccc-0123456789ab") -> dict[str, Any]:
    """Our own shape: kind driver/type, device names claimUID-device (start with a digit)."""
    return {
        "cdiVersion": "0.6.0",
        "kind": "fabric.example.com/gpu",
        "containerEdits": {"env": ["FABRIC_DRA_DEVICES=gpu-1:u1:s1"]},
        "devices": [
            {
                "name": f"{claim_uid}-gpu-1",
                "containerEdits": {
                    "env": ["FABRIC_DRA_DEVICE_GPU_1_UUID=u1"],
                    "deviceNodes": [
                        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}
                    ],
                },
            }
        ],
    }


@pytest.mark.parametrize("spec", [vendor_spec(), fabric_spec()], ids=["spec-example", "fabric"])
def test_valid_specs_have_no_problems(spec: dict[str, Any]) -> None:
    assert validate_spec(spec) == []


def test_a_minimal_spec_with_one_env_device_is_valid() -> None:
    spec = {
        "cdiVersion": "0.3.0",
        "kind": "a/b",
        "devices": [{"name": "d", "containerEdits": {"env": ["A="]}}],
    }
    assert validate_spec(spec) == []


def _break(path: str, value: Any, delete: bool = False) -> dict[str, Any]:
    spec = copy.deepcopy(vendor_spec())
    node: Any = spec
    keys = [int(k) if k.isdigit() else k for k in path.split("/")]
    for key in keys[:-1]:
        node = node[key]
    if delete:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return spec


BAD = [
    ("missing cdiVersion", _break("cdiVersion", None, delete=True), "'cdiVersion' is a required"),
    ("missing kind", _break("kind", None, delete=True), "'kind' is a required"),
    ("missing devices", _break("devices", None, delete=True), "'devices' is a required"),
    ("no devices", _break("devices", []), "devices: [] should be non-empty"),
    ("unknown top-level field", _break("extra", 1), "Additional properties"),
    ("unknown device field", _break("devices/0/extra", 1), "devices/0: Additional"),
    ("unknown edits field", _break("containerEdits/devices", []), "containerEdits: Additional"),
    ("kind without class", _break("kind", "vendor.com"), "kind: 'vendor.com' does not match"),
    ("kind class ends with dash", _break("kind", "vendor.com/gpu-"), "kind: 'vendor.com/gpu-'"),
    ("kind vendor starts with digit", _break("kind", "1vendor/gpu"), "kind: '1vendor/gpu'"),
    ("device name with slash", _break("devices/0/name", "a/b"), "devices/0/name: 'a/b'"),
    ("device name empty", _break("devices/0/name", ""), "devices/0/name: '' does not match"),
    (
        "device without edits key",
        _break("devices/0/containerEdits", None, delete=True),
        "devices/0: 'containerEdits' is a required",
    ),
    ("env without =", _break("containerEdits/env/0", "FOO"), "containerEdits/env/0: 'FOO'"),
    ("env with empty name", _break("containerEdits/env/0", "=x"), "containerEdits/env/0: '=x'"),
    ("env not a string", _break("containerEdits/env/0", 5), "containerEdits/env/0: 5 is not"),
    (
        "device node without path",
        _break("containerEdits/deviceNodes/0/path", None, delete=True),
        "containerEdits/deviceNodes/0: 'path' is a required",
    ),
    (
        "device node bad type",
        _break("containerEdits/deviceNodes/0/type", "x"),
        "containerEdits/deviceNodes/0/type: 'x' is not one of",
    ),
    (
        "device node bad permissions",
        _break("containerEdits/deviceNodes/0/permissions", "rwx"),
        "containerEdits/deviceNodes/0/permissions: 'rwx' does not match",
    ),
    (
        "device node major a string",
        _break("containerEdits/deviceNodes/0/major", "25"),
        "containerEdits/deviceNodes/0/major: '25' is not of type 'integer'",
    ),
    (
        "mount without containerPath",
        _break("containerEdits/mounts/0/containerPath", None, delete=True),
        "containerEdits/mounts/0: 'containerPath' is a required",
    ),
    (
        "mount options a string",
        _break("containerEdits/mounts/0/options", "ro"),
        "containerEdits/mounts/0/options: 'ro' is not of type 'array'",
    ),
    (
        "hook with unknown name",
        _break("containerEdits/hooks/0/hookName", "preStart"),
        "containerEdits/hooks/0/hookName: 'preStart' is not one of",
    ),
    (
        "hook without path",
        _break("containerEdits/hooks/0/path", ""),
        "containerEdits/hooks/0/path: '' should be non-empty",
    ),
    (
        "negative additional gid",
        _break("containerEdits/additionalGids", [-1]),
        "containerEdits/additionalGids/0: -1 is less than the minimum",
    ),
    (
        "intelRdt unknown field",
        _break("containerEdits/intelRdt", {"closId": "x"}),
        "containerEdits/intelRdt: Additional",
    ),
    ("unknown version", _break("cdiVersion", "0.9.0"), "unknown CDI spec version '0.9.0'"),
    ("malformed version", _break("cdiVersion", "1.0"), "cdiVersion: '1.0' does not match"),
    (
        "version too old for a device node hostPath",
        _break("cdiVersion", "0.4.0"),
        "must be at least 0.5.0",
    ),
    (
        "device names repeat",
        _break("devices/1/name", "myDevice"),
        "devices/1/name: device name 'myDevice' is used more than once",
    ),
    (
        "device with empty edits",
        _break("devices/1/containerEdits", {}),
        "devices/1/containerEdits: device 'other' has no edits",
    ),
    (
        "duplicate net device",
        _break(
            "containerEdits/netDevices",
            [
                {"hostInterfaceName": "eth1", "name": "a"},
                {"hostInterfaceName": "eth1", "name": "b"},
            ],
        ),
        "duplicate net device hostInterfaceName 'eth1'",
    ),
]


@pytest.mark.parametrize(
    ("spec", "expected"), [(s, e) for _, s, e in BAD], ids=[n for n, _, _ in BAD]
)
def test_each_kind_of_invalid_spec_is_reported_where_it_is(spec: Any, expected: str) -> None:
    problems = validate_spec(spec)
    assert any(expected in p for p in problems), problems


def test_a_spec_that_is_not_an_object_is_invalid() -> None:
    assert validate_spec(["not", "a", "spec"]) == [
        "(top level): ['not', 'a', 'spec'] is not of type 'object'"
    ]


@pytest.mark.parametrize(
    ("change", "needed"),
    [
        ({}, "0.3.0"),
        (
            {"containerEdits": {"mounts": [{"hostPath": "/a", "containerPath": "/", "type": "x"}]}},
            "0.4.0",
        ),
        ({"devices": [{"name": "0abc", "containerEdits": {"env": ["A=1"]}}]}, "0.5.0"),
        ({"kind": "vendor/gpu.big"}, "0.6.0"),
        ({"containerEdits": {"additionalGids": [5]}}, "0.7.0"),
        ({"containerEdits": {"netDevices": [{"hostInterfaceName": "e", "name": "n"}]}}, "1.1.0"),
    ],
)
def test_minimum_version_follows_the_fields_used(change: dict[str, Any], needed: str) -> None:
    spec: dict[str, Any] = {
        "cdiVersion": "1.1.0",
        "kind": "vendor/gpu",
        "devices": [{"name": "d", "containerEdits": {"env": ["A=1"]}}],
    }
    spec.update(change)
    assert minimum_version(spec) == needed
    assert validate_spec(spec) == []


def test_our_device_names_start_with_a_digit_and_so_need_cdi_0_5_0() -> None:
    spec = fabric_spec()
    spec["cdiVersion"] = "0.4.0"
    assert any("at least 0.5.0" in p for p in validate_spec(spec))


_name_char = st.sampled_from("abcXYZ019_.-:")


@given(st.text(_name_char, min_size=1, max_size=20))
def test_device_name_rule_matches_the_cdi_parser(name: str) -> None:
    inner_ok = all(c.isalnum() or c in "_.-:" for c in name[1:-1])
    expected_ok = name[0].isalnum() and name[-1].isalnum() and inner_ok
    device = {"name": name, "containerEdits": {"env": ["A=1"]}}
    spec = {"cdiVersion": "0.5.0", "kind": "v/c", "devices": [device]}
    assert (validate_spec(spec) == []) == expected_ok


@given(st.text(st.sampled_from("abZ09_.-"), min_size=1, max_size=12))
def test_class_rule_matches_the_cdi_parser(kind_class: str) -> None:
    expected_ok = kind_class[0].isalpha() and kind_class[-1].isalnum()
    ok = True
    try:
        parse_device_id(f"vendor.com/{kind_class}=dev")
    except CdiError:
        ok = False
    assert ok == expected_ok


@pytest.mark.parametrize(
    ("cdi_id", "message"),
    [
        ("vendor.com/gpu", "not qualified"),
        ("gpu=dev", "not qualified"),
        ("/dev/null", "not qualified"),
        ("vendor.com/=dev", "not qualified"),
        ("1vendor/gpu=dev", "invalid vendor"),
        ("vendor/gpu-=dev", "invalid class"),
        ("vendor/gpu=dev/x", "invalid device name"),
    ],
)
def test_malformed_device_ids_are_refused(cdi_id: str, message: str) -> None:
    with pytest.raises(CdiError, match=message):
        parse_device_id(cdi_id)


def _write(directory: Path, name: str, spec: Any) -> Path:
    path = directory / name
    if name.endswith(".yaml"):
        path.write_text(yaml.safe_dump(spec))
    else:
        path.write_text(json.dumps(spec))
    return path


def test_load_specs_reads_json_and_yaml_and_ignores_other_files(tmp_path: Path) -> None:
    _write(tmp_path, "vendor.com-device.json", vendor_spec())
    _write(tmp_path, "fabric.example.com-gpu_x.yaml", fabric_spec())
    (tmp_path / "notes.txt").write_text("not a spec")
    (tmp_path / "old.yml").write_text("{")
    found = load_specs(tmp_path)
    assert sorted(found) == [
        "fabric.example.com/gpu=0d5f5a1c-aaaa-bbbb-cccc-0123456789ab-gpu-1",
        "vendor.com/device=myDevice",
        "vendor.com/device=other",
    ]
    assert load_specs(tmp_path / "missing") == {}


def test_an_invalid_spec_file_is_an_error_naming_the_file_and_the_problem(tmp_path: Path) -> None:
    bad = _break("containerEdits/env/0", "NOEQUALS")
    path = _write(tmp_path, "bad.json", bad)
    with pytest.raises(CdiError) as caught:
        load_specs(tmp_path)
    assert str(path) in str(caught.value)
    assert "containerEdits/env/0: 'NOEQUALS' does not match" in str(caught.value)


@pytest.mark.parametrize("text", ["{", "[1, 2", "\x00"], ids=["truncated", "unclosed", "nul"])
def test_an_unparseable_spec_file_is_an_error_naming_the_file(tmp_path: Path, text: str) -> None:
    (tmp_path / "broken.json").write_text(text)
    with pytest.raises(CdiError, match=r"broken\.json: cannot parse"):
        load_specs(tmp_path)


def test_the_same_device_in_two_files_is_an_error_naming_both(tmp_path: Path) -> None:
    _write(tmp_path, "a.json", vendor_spec())
    _write(tmp_path, "b.yaml", vendor_spec())
    with pytest.raises(
        CdiError, match=r"vendor.com/device=myDevice: defined in both .*a.json and .*b.yaml"
    ):
        load_specs(tmp_path)


def test_resolve_applies_spec_edits_once_then_each_device(tmp_path: Path) -> None:
    _write(tmp_path, "vendor.json", vendor_spec())
    _write(tmp_path, "fabric.json", fabric_spec())
    gpu = "fabric.example.com/gpu=0d5f5a1c-aaaa-bbbb-cccc-0123456789ab-gpu-1"
    edits = resolve(tmp_path, ["vendor.com/device=myDevice", "vendor.com/device=other", gpu, gpu])
    assert edits.env == [
        "FOO=VALID_SPEC",
        "BAR=BARVALUE1",
        "OTHER=1",
        "FABRIC_DRA_DEVICES=gpu-1:u1:s1",
        "FABRIC_DRA_DEVICE_GPU_1_UUID=u1",
    ]
    assert [n["path"] for n in edits.device_nodes] == [
        "/dev/vendorctl",
        "/dev/card1",
        "/dev/card-render1",
        "/dev/nvidia0",
    ]
    assert len(edits.mounts) == 3
    assert [h["hookName"] for h in edits.hooks] == ["createContainer"]
    assert edits.devices == ["vendor.com/device=myDevice", "vendor.com/device=other", gpu]
    assert edits.env_map()["FABRIC_DRA_DEVICE_GPU_1_UUID"] == "u1"


def test_resolve_of_nothing_is_empty(tmp_path: Path) -> None:
    edits = resolve(tmp_path, [])
    assert (edits.env, edits.device_nodes, edits.mounts) == ([], [], [])


def test_resolve_names_the_unknown_id(tmp_path: Path) -> None:
    _write(tmp_path, "vendor.json", vendor_spec())
    with pytest.raises(CdiError, match=r"vendor\.com/device=nope: not found in"):
        resolve(tmp_path, ["vendor.com/device=myDevice", "vendor.com/device=nope"])


def test_resolve_refuses_a_malformed_id_before_reading_files(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(CdiError, match="not qualified"):
        resolve(tmp_path, ["no-kind"])
