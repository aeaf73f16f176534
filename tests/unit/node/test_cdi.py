"""CDI names, the spec object and its file write (app.node.cdi).

The name rules are those of the CDI library's pkg/parser/parser.go; the accept and refuse cases
below follow its rules (first, middle and last character), not its test table.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.node.cdi import (
    CDI_VERSION,
    CDI_VERSION_DOTTED_CLASS,
    CdiDevice,
    CdiError,
    CdiWriteError,
    Mount,
    build_spec,
    cdi_device_id,
    cdi_device_name,
    cdi_kind,
    encode_spec,
    env_name_for,
    list_spec_files,
    parse_kind,
    remove_spec,
    spec_file_name,
    validate_class,
    validate_device_name,
    validate_env_name,
    validate_vendor,
    write_spec,
)
from app.node.identity import DeviceNode

UID = "3f2a9c1e-0b7d-4e53-9a61-2c8d4f0e7b15"
KIND = "fabric.example.com/gpu"

# Independent statements of the parser.go rules, to check the validators against.
VENDOR_RULE = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
DEVICE_NAME_RULE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
ENV_RULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@pytest.fixture
def strict_umask() -> Iterator[None]:
    """A umask that would make files 0o600 and directories 0o700 if the code relied on it."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


# --- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["a", "A1", "vendor.com", "fabric.example.com", "other-vendor1.com", "yet_another-vendor2.com"],
)
def test_vendor_and_class_names_that_follow_the_rule_are_accepted(name: str) -> None:
    assert validate_vendor(name) == name
    assert validate_class(name) == name


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("", "must not be empty"),
        ("_invalid.com", "must start with a letter"),
        ("1vendor", "must start with a letter"),
        ("invalid2.com-", "must end with a letter or digit"),
        ("class_", "must end with a letter or digit"),
        ("a/b", "character '/' is not allowed"),
        ("a b", "character ' ' is not allowed"),
        ("a:b", "character ':' is not allowed"),
        ("a*b", "character '\\*' is not allowed"),
        ("vendör.com", "character 'ö' is not allowed"),
        ("éa", "must start with a letter"),
        ("aé", "must end with a letter or digit"),
    ],
)
def test_vendor_and_class_names_that_break_the_rule_are_refused(name: str, rule: str) -> None:
    with pytest.raises(CdiError, match=f"invalid CDI vendor {re.escape(repr(name))}: {rule}"):
        validate_vendor(name)
    with pytest.raises(CdiError, match=f"invalid CDI class {re.escape(repr(name))}: {rule}"):
        validate_class(name)


@pytest.mark.parametrize("name", ["0", "a", "dev", "dev_1:2.3", f"{UID}-gpu-3f2a", "Dev.1"])
def test_device_names_that_follow_the_rule_are_accepted(name: str) -> None:
    assert validate_device_name(name) == name


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("", "must not be empty"),
        ("-dev", "must start with a letter or digit"),
        (":dev", "must start with a letter or digit"),
        ("dev:", "must end with a letter or digit"),
        ("dev.", "must end with a letter or digit"),
        ("dev/x", "character '/' is not allowed"),
        ("dev=x", "character '=' is not allowed"),
        ("dév1", "character 'é' is not allowed"),
        ("é", "must start with a letter or digit"),
    ],
)
def test_device_names_that_break_the_rule_are_refused(name: str, rule: str) -> None:
    with pytest.raises(CdiError, match=f"invalid CDI device name {re.escape(repr(name))}: {rule}"):
        validate_device_name(name)


NAME_ALPHABET = "aZ09_-.:/ é*"


@given(st.text(alphabet=NAME_ALPHABET, max_size=8))
def test_vendor_and_class_validation_agrees_with_the_rule(name: str) -> None:
    ok = VENDOR_RULE.fullmatch(name) is not None
    for validate in (validate_vendor, validate_class):
        if ok:
            assert validate(name) == name
        else:
            with pytest.raises(CdiError):
                validate(name)


@given(st.text(alphabet=NAME_ALPHABET, max_size=8))
def test_device_name_validation_agrees_with_the_rule(name: str) -> None:
    if DEVICE_NAME_RULE.fullmatch(name):
        assert validate_device_name(name) == name
    else:
        with pytest.raises(CdiError):
            validate_device_name(name)


@given(st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,20}[A-Za-z0-9]", fullmatch=True))
def test_names_built_from_the_allowed_alphabet_make_a_kind_that_parses_back(name: str) -> None:
    kind = cdi_kind(name, name)
    assert parse_kind(kind) == (name, name)


def test_kind_is_the_driver_and_the_device_type() -> None:
    assert cdi_kind("fabric.example.com", "gpu") == "fabric.example.com/gpu"
    assert cdi_kind("fabric.example.com", "cxl-memory") == "fabric.example.com/cxl-memory"
    assert parse_kind("fabric.example.com/gpu") == ("fabric.example.com", "gpu")


@pytest.mark.parametrize(
    ("driver", "device_type", "message"),
    [
        ("fabric/example", "gpu", "invalid CDI vendor 'fabric/example'"),
        ("fabric.example.com", "", "invalid CDI class '': must not be empty"),
        ("fabric.example.com", "gpu!", "invalid CDI class 'gpu!'"),
        ("fabric.example.com", "g" * 64, "longer than 63 characters"),
        ("f" * 254, "gpu", "longer than 253 characters"),
    ],
)
def test_a_bad_driver_or_device_type_makes_no_kind(
    driver: str, device_type: str, message: str
) -> None:
    with pytest.raises(CdiError, match=re.escape(message)):
        cdi_kind(driver, device_type)


def test_the_longest_names_the_spec_allows_make_a_kind() -> None:
    assert cdi_kind("f" * 253, "g" * 63) == "f" * 253 + "/" + "g" * 63


@pytest.mark.parametrize(
    "kind",
    # SPEC.md, "Kind": the invalid examples, and empty parts.
    ["foo", "vendor.com/foo/", "vendor.com/foo/bar", "/foo", "vendor.com/", "", "vendor.com=x"],
)
def test_a_kind_that_is_not_vendor_slash_class_is_refused(kind: str) -> None:
    with pytest.raises(CdiError, match=re.escape(repr(kind))):
        parse_kind(kind)


def test_device_name_id_and_file_name_of_a_claims_device() -> None:
    name = cdi_device_name(UID, "gpu-3f2a")
    assert name == f"{UID}-gpu-3f2a"
    assert cdi_device_id(KIND, name) == f"fabric.example.com/gpu={UID}-gpu-3f2a"
    assert spec_file_name(KIND, UID) == f"fabric.example.com-gpu_{UID}.json"


@pytest.mark.parametrize("claim_uid", ["", "a/b", ".hidden", "-x", "x y", "../etc"])
def test_a_claim_uid_that_cannot_be_a_name_is_refused(claim_uid: str) -> None:
    with pytest.raises(CdiError, match=f"invalid claim UID {re.escape(repr(claim_uid))}"):
        cdi_device_name(claim_uid, "gpu-1")
    with pytest.raises(CdiError, match=f"invalid claim UID {re.escape(repr(claim_uid))}"):
        spec_file_name(KIND, claim_uid)


@pytest.mark.parametrize("device", ["", "gpu-", "gpu/1", "gpu 1"])
def test_a_device_that_makes_a_bad_cdi_name_is_refused(device: str) -> None:
    with pytest.raises(CdiError, match="invalid CDI device name"):
        cdi_device_name(UID, device)


def test_a_device_id_needs_a_good_kind_and_name() -> None:
    with pytest.raises(CdiError, match="invalid CDI kind 'gpu'"):
        cdi_device_id("gpu", "dev")
    with pytest.raises(CdiError, match="invalid CDI device name 'dev/1'"):
        cdi_device_id(KIND, "dev/1")


@pytest.mark.parametrize(
    ("device", "field", "name"),
    [
        ("gpu-3f2a", "uuid", "FABRIC_DRA_DEVICE_GPU_3F2A_UUID"),
        ("nvme.0", "serial", "FABRIC_DRA_DEVICE_NVME_0_SERIAL"),
        ("cxl-memory-1", "type", "FABRIC_DRA_DEVICE_CXL_MEMORY_1_TYPE"),
        ("GPU_A", "pool", "FABRIC_DRA_DEVICE_GPU_A_POOL"),
        ("gpüx", "uuid", "FABRIC_DRA_DEVICE_GP_X_UUID"),
        ("straße", "uuid", "FABRIC_DRA_DEVICE_STRA_E_UUID"),
    ],
)
def test_env_names_are_upper_cased_with_other_characters_made_underscores(
    device: str, field: str, name: str
) -> None:
    assert env_name_for(device, field) == name


def test_env_names_need_a_device_and_a_field() -> None:
    with pytest.raises(CdiError, match="invalid device name ''"):
        env_name_for("", "uuid")
    with pytest.raises(CdiError, match="invalid field name '' for device 'gpu-1'"):
        env_name_for("gpu-1", "")


@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=8))
def test_env_names_are_always_valid(device: str, field: str) -> None:
    name = env_name_for(device, field)
    assert ENV_RULE.fullmatch(name)
    assert validate_env_name(name) == name
    assert name.isascii()


@given(st.text(alphabet="aZ_09-.é ", max_size=6))
def test_env_name_validation_agrees_with_the_rule(name: str) -> None:
    if ENV_RULE.fullmatch(name):
        assert validate_env_name(name) == name
    else:
        with pytest.raises(CdiError, match="must match"):
            validate_env_name(name)


# --- the spec object ---------------------------------------------------------------------------


def _gpu(name: str = f"{UID}-gpu-1") -> CdiDevice:
    return CdiDevice(
        name=name,
        device_nodes=(
            DeviceNode("/dev/nvidia1", "c", 195, 1),
            DeviceNode("/dev/nvidia0", "c", 195, 0),
        ),
        env=(("FABRIC_DRA_DEVICE_GPU_1_UUID", "GPU-1"), ("A_FIRST", "x=y")),
        mounts=(
            Mount("/opt/lib/sub", "/usr/lib/fabric/sub", ("bind", "ro")),
            Mount("/opt/lib", "/usr/lib/fabric"),
        ),
    )


def test_a_spec_lists_each_devices_edits_in_sorted_order() -> None:
    other = CdiDevice(name=f"{UID}-gpu-0", env=(("FABRIC_DRA_DEVICE_GPU_0_UUID", ""),))
    spec = build_spec(KIND, [_gpu(), other], {"FABRIC_DRA_DEVICES": "gpu-0::,gpu-1:GPU-1:"})
    assert spec == {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [
            {
                "name": f"{UID}-gpu-0",
                "containerEdits": {"env": ["FABRIC_DRA_DEVICE_GPU_0_UUID="]},
            },
            {
                "name": f"{UID}-gpu-1",
                "containerEdits": {
                    "env": ["A_FIRST=x=y", "FABRIC_DRA_DEVICE_GPU_1_UUID=GPU-1"],
                    "deviceNodes": [
                        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
                        {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1},
                    ],
                    "mounts": [
                        {"hostPath": "/opt/lib", "containerPath": "/usr/lib/fabric"},
                        {
                            "hostPath": "/opt/lib/sub",
                            "containerPath": "/usr/lib/fabric/sub",
                            "options": ["bind", "ro"],
                        },
                    ],
                },
            },
        ],
        "containerEdits": {"env": ["FABRIC_DRA_DEVICES=gpu-0::,gpu-1:GPU-1:"]},
    }


def test_a_spec_without_spec_wide_env_has_no_spec_wide_edits() -> None:
    spec = build_spec(
        KIND, [CdiDevice(name="d1", device_nodes=(DeviceNode("/dev/x", "b", 8, 0),))], {}
    )
    assert "containerEdits" not in spec
    assert spec["devices"] == [
        {
            "name": "d1",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/x", "type": "b", "major": 8, "minor": 0}]
            },
        }
    ]


def test_the_version_is_the_lowest_the_content_needs() -> None:
    device = [CdiDevice(name="9dev", env=(("X", "1"),))]
    assert CDI_VERSION == "0.5.0"
    assert build_spec(KIND, device, {})["cdiVersion"] == "0.5.0"
    assert build_spec("fabric.example.com/gpu.v2", device, {})["cdiVersion"] == (
        CDI_VERSION_DOTTED_CLASS
    )
    assert CDI_VERSION_DOTTED_CLASS == "0.6.0"


def _node(
    path: str = "/dev/x", kind: str = "c", major: object = 1, minor: object = 0
) -> DeviceNode:
    return DeviceNode(path, kind, major, minor)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "devices", "spec_env", "message"),
    [
        ("gpu", [CdiDevice("d", env=(("X", "1"),))], {}, "invalid CDI kind 'gpu'"),
        (KIND, [], {}, "has no devices"),
        (
            KIND,
            [CdiDevice("d", env=(("X", "1"),)), CdiDevice("d", env=(("Y", "1"),))],
            {},
            "device name 'd' is given twice",
        ),
        (KIND, [CdiDevice("-d", env=(("X", "1"),))], {}, "invalid CDI device name '-d'"),
        (KIND, [CdiDevice("d")], {}, "'d': has no environment, device nodes or mounts"),
        (KIND, [CdiDevice("d", env=(("1X", "1"),))], {}, "name '1X': must match"),
        (KIND, [CdiDevice("d", env=(("A-B", "1"),))], {}, "name 'A-B': must match"),
        (KIND, [CdiDevice("d", env=(("", "1"),))], {}, "name '': must match"),
        (KIND, [CdiDevice("d", env=(("Ä", "1"),))], {}, "name 'Ä': must match"),
        (KIND, [CdiDevice("d", env=(("X", "1"),))], {"A=B": "1"}, "name 'A=B': must match"),
        (KIND, [CdiDevice("d", env=(("X", "1"), ("X", "2")))], {}, "'X' is given twice"),
        (KIND, [CdiDevice("d", env=(("X", "1"),))], {"X": "1"}, "also set for the whole spec"),
        (KIND, [CdiDevice("d", env=(("X", "a\x00b"),))], {}, "'X': value contains a NUL"),
        (KIND, [CdiDevice("d", env=(("X", "1"),))], {"Y": "\x00"}, "'Y': value contains a NUL"),
        (
            KIND,
            [CdiDevice("d", device_nodes=(_node("dev/x"),))],
            {},
            "device node path 'dev/x': must be an absolute path",
        ),
        (KIND, [CdiDevice("d", device_nodes=(_node(""),))], {}, "must be an absolute path"),
        (
            KIND,
            [CdiDevice("d", device_nodes=(_node("/dev/../etc/x"),))],
            {},
            "must not contain '..'",
        ),
        (KIND, [CdiDevice("d", device_nodes=(_node("/dev/\x00"),))], {}, "contains a NUL"),
        (KIND, [CdiDevice("d", device_nodes=(_node(kind="u"),))], {}, "type 'u' is not 'c' or 'b'"),
        (KIND, [CdiDevice("d", device_nodes=(_node(major=-1),))], {}, "major -1 is outside"),
        (KIND, [CdiDevice("d", device_nodes=(_node(minor=2**32),))], {}, "minor 4294967296 is"),
        (KIND, [CdiDevice("d", device_nodes=(_node(major=True),))], {}, "major True is not an int"),
        (KIND, [CdiDevice("d", device_nodes=(_node(minor="1"),))], {}, "minor '1' is not an int"),
        (
            KIND,
            [CdiDevice("d", device_nodes=(_node(), _node(minor=3)))],
            {},
            "device node path '/dev/x' is given twice",
        ),
        (
            KIND,
            [CdiDevice("d", mounts=(Mount("lib", "/lib"),))],
            {},
            "mount host path 'lib': must be an absolute path",
        ),
        (
            KIND,
            [CdiDevice("d", mounts=(Mount("/lib", "lib"),))],
            {},
            "mount container path 'lib': must be an absolute path",
        ),
        (
            KIND,
            [CdiDevice("d", mounts=(Mount("/a", "/lib"), Mount("/b", "/lib")))],
            {},
            "mount container path '/lib' is given twice",
        ),
        (
            KIND,
            [CdiDevice("d", mounts=(Mount("/a", "/lib", ("bind", "")),))],
            {},
            "option '' is empty",
        ),
    ],
)
def test_bad_spec_input_is_refused_with_the_value_named(
    kind: str, devices: list[CdiDevice], spec_env: dict[str, str], message: str
) -> None:
    with pytest.raises(CdiError, match=re.escape(message)):
        build_spec(kind, devices, spec_env)


ENV_VALUES = st.text(alphabet=st.characters(exclude_characters="\x00"), max_size=12)


@st.composite
def _devices(draw: st.DrawFn) -> list[CdiDevice]:
    names = draw(
        st.lists(
            st.from_regex(r"[a-z0-9][a-z0-9.:_-]{0,10}[a-z0-9]", fullmatch=True),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    devices = []
    for name in names:
        env = draw(
            st.dictionaries(
                st.from_regex(r"D_[A-Z0-9_]{0,6}", fullmatch=True),
                ENV_VALUES,
                min_size=1,
                max_size=4,
            )
        )
        paths = draw(
            st.lists(st.from_regex(r"/dev/[a-z0-9]{1,6}", fullmatch=True), max_size=3, unique=True)
        )
        nodes = tuple(DeviceNode(p, "c", i, i + 1) for i, p in enumerate(paths))
        devices.append(CdiDevice(name=name, device_nodes=nodes, env=tuple(env.items())))
    return devices


@given(
    _devices(),
    st.dictionaries(st.from_regex(r"S_[A-Z0-9_]{0,6}", fullmatch=True), ENV_VALUES, max_size=3),
    st.randoms(use_true_random=False),
)
def test_a_spec_does_not_depend_on_input_order_and_round_trips_through_json(
    devices: list[CdiDevice], spec_env: dict[str, str], rnd: random.Random
) -> None:
    spec = build_spec(KIND, devices, spec_env)
    shuffled = [
        CdiDevice(
            d.name,
            tuple(rnd.sample(d.device_nodes, len(d.device_nodes))),
            tuple(rnd.sample(d.env, len(d.env))),
            d.mounts,
        )
        for d in rnd.sample(devices, len(devices))
    ]
    env_items = list(spec_env.items())
    rnd.shuffle(env_items)
    again = build_spec(KIND, shuffled, dict(env_items))
    assert encode_spec(again) == encode_spec(spec)
    assert json.loads(encode_spec(spec)) == spec
    names = [d["name"] for d in spec["devices"]]
    assert names == sorted(d.name for d in devices)
    for entry in spec["devices"]:
        env = entry["containerEdits"]["env"]
        assert env == sorted(env, key=lambda kv: kv.split("=", 1)[0])
        assert all(value != [] for value in entry["containerEdits"].values())


def test_the_encoding_is_stable_sorted_ascii_with_a_final_newline() -> None:
    spec = build_spec(KIND, [CdiDevice("d", env=(("X", "café"),))], {})
    data = encode_spec(spec)
    assert data == encode_spec(json.loads(data))
    assert data.endswith(b"}\n")
    assert b"caf\\u00e9" in data
    text = data.decode("ascii")
    assert text.index('"cdiVersion"') < text.index('"devices"') < text.index('"kind"')


# --- files -------------------------------------------------------------------------------------


def _spec() -> dict[str, object]:
    return build_spec(KIND, [CdiDevice(f"{UID}-gpu-1", env=(("X", "1"),))], {})


def test_a_spec_file_is_written_whole_with_mode_0644_and_no_temporary_file_left(
    tmp_path: Path, strict_umask: None
) -> None:
    directory = tmp_path / "run" / "cdi"
    name = spec_file_name(KIND, UID)
    path = write_spec(directory, name, _spec())
    assert path == directory / name
    assert path.read_bytes() == encode_spec(_spec())
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    assert sorted(os.listdir(directory)) == [name]


def test_a_new_spec_replaces_the_old_one(tmp_path: Path) -> None:
    name = spec_file_name(KIND, UID)
    write_spec(tmp_path, name, _spec())
    newer = build_spec(KIND, [CdiDevice(f"{UID}-gpu-1", env=(("X", "2"),))], {})
    path = write_spec(tmp_path, name, newer)
    assert json.loads(path.read_bytes()) == newer
    assert os.listdir(tmp_path) == [name]


def test_writing_under_a_regular_file_fails_with_the_path_in_the_message(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    directory = blocker / "cdi"
    name = spec_file_name(KIND, UID)
    with pytest.raises(CdiWriteError) as caught:
        write_spec(directory, name, _spec())
    assert str(caught.value) == f"cannot write CDI spec {directory / name}: Not a directory"
    assert caught.value.errno == errno.ENOTDIR
    assert caught.value.path == directory / name
    assert isinstance(caught.value.__cause__, OSError)
    assert os.listdir(tmp_path) == ["not-a-directory"]


def test_a_cdi_directory_that_is_a_file_fails_the_write(tmp_path: Path) -> None:
    directory = tmp_path / "cdi"
    directory.write_text("x")
    with pytest.raises(CdiWriteError, match=re.escape(f"cannot write CDI spec {directory}/")):
        write_spec(directory, spec_file_name(KIND, UID), _spec())


def test_a_failed_rename_leaves_no_temporary_file(tmp_path: Path) -> None:
    name = spec_file_name(KIND, UID)
    in_the_way = tmp_path / name
    in_the_way.mkdir()
    (in_the_way / "keep").write_text("x")
    with pytest.raises(CdiWriteError, match=re.escape(f"cannot write CDI spec {in_the_way}: ")):
        write_spec(tmp_path, name, _spec())
    assert os.listdir(tmp_path) == [name]


def test_a_spec_that_cannot_be_encoded_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_spec(tmp_path, "fabric.example.com-gpu_x.json", {"kind": {1, 2}})
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "file_name", ["", "a/b.json", ".hidden.json", "spec.yaml", "spec", "..", "a\x00.json"]
)
def test_a_file_name_that_is_not_a_plain_json_name_is_refused(
    tmp_path: Path, file_name: str
) -> None:
    with pytest.raises(CdiError, match="invalid CDI spec file name"):
        write_spec(tmp_path, file_name, _spec())
    with pytest.raises(CdiError, match="invalid CDI spec file name"):
        remove_spec(tmp_path, file_name)
    assert os.listdir(tmp_path) == []


def test_remove_is_idempotent(tmp_path: Path) -> None:
    name = spec_file_name(KIND, UID)
    write_spec(tmp_path, name, _spec())
    assert remove_spec(tmp_path, name) is True
    assert os.listdir(tmp_path) == []
    assert remove_spec(tmp_path, name) is False
    assert remove_spec(tmp_path / "missing", name) is False


def test_remove_fails_when_it_cannot_remove(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CdiWriteError) as caught:
        remove_spec(blocker, "a.json")
    assert str(caught.value) == f"cannot remove CDI spec {blocker / 'a.json'}: Not a directory"
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(CdiWriteError, match=re.escape(f"cannot remove CDI spec {tmp_path}/")):
        remove_spec(tmp_path, "dir.json")


def test_listing_finds_only_the_vendors_spec_files(tmp_path: Path) -> None:
    ours = ["fabric.example.com-nvme_u2.json", "fabric.example.com-gpu_u1.json"]
    others = [
        "other.com-gpu_u1.json",
        ".fabric.example.com-gpu_u1.json.x1y2.tmp",
        "fabric.example.com-gpu_u3.yaml",
        "fabric.example.com.json",
    ]
    for name in ours + others:
        (tmp_path / name).write_text("{}")
    (tmp_path / "fabric.example.com-dir.json").mkdir()
    assert list_spec_files(tmp_path, "fabric.example.com") == sorted(ours)


def test_listing_a_missing_directory_finds_nothing(tmp_path: Path) -> None:
    assert list_spec_files(tmp_path / "missing", "fabric.example.com") == []


def test_listing_needs_a_good_vendor_and_a_readable_directory(tmp_path: Path) -> None:
    with pytest.raises(CdiError, match="invalid CDI vendor 'a/b'"):
        list_spec_files(tmp_path, "a/b")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CdiWriteError, match=re.escape(f"cannot list CDI specs in {blocker}: ")):
        list_spec_files(blocker, "fabric.example.com")


def test_a_written_spec_is_listed_and_gone_after_removal(tmp_path: Path) -> None:
    name = spec_file_name(KIND, UID)
    write_spec(tmp_path, name, _spec())
    assert list_spec_files(tmp_path, "fabric.example.com") == [name]
    remove_spec(tmp_path, name)
    assert list_spec_files(tmp_path, "fabric.example.com") == []
