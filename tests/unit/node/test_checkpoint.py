"""The node plugin's checkpoint (app.node.checkpoint): the file's encoding and its checksum, a
corrupt file moved aside on load, and writes that are atomic and leave memory as it was when
they fail."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.node.checkpoint import (
    PREPARED,
    PREPARING,
    VERSION,
    Checkpoint,
    CheckpointError,
    ClaimRecord,
    PreparedDevice,
    decode,
    encode,
)
from app.node.identity import DeviceIdentity

UID = "0b7d3f2a-9c1e-4e53-9a61-2c8d4f0e7b15"


def record(uid: str = UID, state: Any = PREPARED, name: str = "claim-1") -> ClaimRecord:
    ident = DeviceIdentity("rack-1", "gpu-0", "gpu", ("dev",), uuid="3f2a", serial="S1")
    device = PreparedDevice(
        ("dev",), "rack-1", "gpu-0", (f"fabric.example.com/gpu={uid}-gpu-0",), ident
    )
    return ClaimRecord(
        uid, "default", name, state, (f"fabric.example.com-gpu_{uid}.json",), (device,)
    )


def file_with(claims: Any, version: Any = VERSION, checksum: str | None = None) -> bytes:
    """A checkpoint file whose checksum is computed here from the documented rule (sha256 of
    the claims' canonical JSON), so a bad record gets past the checksum."""
    if checksum is None:
        canonical = json.dumps(claims, sort_keys=True, separators=(",", ":"))
        checksum = hashlib.sha256(canonical.encode()).hexdigest()
    return json.dumps({"version": version, "checksum": checksum, "claims": claims}).encode()


def good_claim(**changes: Any) -> dict[str, Any]:
    return {
        "namespace": "default",
        "name": "c",
        "state": "prepared",
        "specs": [],
        "devices": [],
        **changes,
    }


# --- encode / decode ---------------------------------------------------------------------------

TEXT = st.text(max_size=12)
OPTIONAL = st.none() | TEXT
IDENTITIES = st.none() | st.builds(
    DeviceIdentity,
    TEXT,
    TEXT,
    TEXT,
    st.lists(TEXT, max_size=3).map(tuple),
    OPTIONAL,
    OPTIONAL,
    OPTIONAL,
    OPTIONAL,
    OPTIONAL,
)
DEVICES = st.builds(
    PreparedDevice,
    st.lists(TEXT, max_size=3).map(tuple),
    TEXT,
    TEXT,
    st.lists(TEXT, max_size=2).map(tuple),
    IDENTITIES,
)


@st.composite
def records(draw: st.DrawFn) -> list[ClaimRecord]:
    uids = draw(st.lists(TEXT, max_size=4, unique=True))
    return [
        ClaimRecord(
            uid,
            draw(TEXT),
            draw(TEXT),
            draw(st.sampled_from([PREPARING, PREPARED])),
            tuple(draw(st.lists(TEXT, max_size=3))),
            tuple(draw(st.lists(DEVICES, max_size=3))),
        )
        for uid in uids
    ]


@given(records())
def test_decode_gives_back_what_was_encoded(recs: list[ClaimRecord]) -> None:
    assert decode(encode(recs)) == {r.uid: r for r in recs}


@given(records(), st.randoms(use_true_random=False))
def test_the_encoding_does_not_depend_on_the_order_of_the_records(
    recs: list[ClaimRecord], rnd: Any
) -> None:
    shuffled = list(recs)
    rnd.shuffle(shuffled)
    assert encode(shuffled) == encode(recs)


@given(st.data())
def test_a_flipped_byte_fails_unless_the_content_is_unchanged(data: st.DataObject) -> None:
    raw = encode([record(), record("second-uid", PREPARING, "claim-2")])
    position = data.draw(st.integers(0, len(raw) - 1), label="position")
    mask = data.draw(st.integers(1, 255), label="mask")
    flipped = bytearray(raw)
    flipped[position] ^= mask
    try:
        got = decode(bytes(flipped))
    except ValueError:
        return
    # Only a change JSON does not see (one whitespace byte for another) may pass, and then the
    # records are the same.
    assert chr(raw[position]) in " \n\t\r" and chr(flipped[position]) in " \n\t\r"
    assert got == decode(raw)


def test_a_flipped_byte_in_a_value_fails_the_checksum() -> None:
    raw = encode([record()])
    at = raw.index(b'"claim-1"') + 1
    flipped = raw[:at] + b"C" + raw[at + 1 :]
    with pytest.raises(ValueError, match=r"^checksum does not match the content$"):
        decode(flipped)


def test_edited_content_with_the_old_checksum_fails() -> None:
    body = json.loads(encode([record()]))
    body["claims"][UID]["state"] = "preparing"
    with pytest.raises(ValueError, match="checksum does not match"):
        decode(json.dumps(body).encode())


def test_an_edited_checksum_fails() -> None:
    body = json.loads(encode([record()]))
    body["checksum"] = "0" * 64
    with pytest.raises(ValueError, match="checksum does not match"):
        decode(json.dumps(body).encode())


@pytest.mark.parametrize("raw", [b"", b"garbage", b"{", b"\xff\xfe\xfa", b'{"version": 1,}'])
def test_what_is_not_json_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError, match=r"^not JSON: "):
        decode(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"[]",
        b'"text"',
        b"null",
        b"{}",
        file_with({}, version=2),
        file_with({}, version="1"),
        file_with({}, version=None),
    ],
)
def test_what_is_not_a_version_1_checkpoint_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError, match=r"^not a version 1 checkpoint$"):
        decode(raw)


@pytest.mark.parametrize("claims", [[], "x", None, 1])
def test_claims_that_are_not_an_object_are_refused(claims: Any) -> None:
    with pytest.raises(ValueError, match=r"^claims is not an object$"):
        decode(file_with(claims))


def test_an_empty_checkpoint_is_valid() -> None:
    assert decode(file_with({})) == {}
    assert decode(encode([])) == {}


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        ("prepared", "claim u: not an object"),
        (good_claim(state="done"), "claim u: state 'done' is not preparing or prepared"),
        (good_claim(state=None), "claim u: state None is not preparing or prepared"),
        ({"state": "prepared", "name": "c"}, "claim u: missing or wrong field 'namespace'"),
        ({"state": "prepared", "namespace": "d"}, "claim u: missing or wrong field 'name'"),
        (good_claim(devices=["x"]), "claim u: devices is not a list of objects"),
        (good_claim(devices=[{"device": "d"}]), "claim u: missing or wrong field 'pool'"),
        (good_claim(devices=[{"pool": "p"}]), "claim u: missing or wrong field 'device'"),
        (good_claim(devices=5), "claim u: devices is not a list of objects"),
        (good_claim(specs=7), "claim u: specs is not a list of strings"),
        (good_claim(specs="abc"), "claim u: specs is not a list of strings"),
        (
            good_claim(devices=[{"pool": "p", "device": "d", "requests": 3}]),
            "claim u: requests is not a list of strings",
        ),
    ],
)
def test_a_bad_record_is_refused_and_named(claim: Any, message: str) -> None:
    with pytest.raises(ValueError, match=r"^claim u: ") as caught:
        decode(file_with({"u": claim}))
    assert str(caught.value).startswith(message)


def test_a_device_without_identity_decodes_to_none() -> None:
    claim = good_claim(devices=[{"pool": "p", "device": "d", "identity": None}])
    (got,) = decode(file_with({"u": claim})).values()
    assert got.devices == (PreparedDevice((), "p", "d", (), None),)


# --- Checkpoint.load ---------------------------------------------------------------------------


def test_a_missing_file_is_an_empty_checkpoint(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "none" / "checkpoint.json")
    cp.records = {"stale": record("stale")}
    assert cp.load() is None
    assert cp.records == {}


def test_a_good_file_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(encode([record()]))
    cp = Checkpoint(path)
    assert cp.load() is None
    assert cp.records == {UID: record()}


@pytest.mark.parametrize("content", [b"not json", file_with({}, version=9), b""])
def test_a_corrupt_file_is_moved_aside_with_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(content)
    cp = Checkpoint(path)
    problem = cp.load()
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"checkpoint {path} is unusable (")
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("checkpoint.json.bad-")]
    assert problem.endswith(f"; moved to {aside.name}")
    assert aside.name.removeprefix("checkpoint.json.bad-").isdecimal()
    assert aside.read_bytes() == content
    assert not path.exists()
    assert cp.records == {}


def test_a_file_failing_its_checksum_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    body = json.loads(encode([record()]))
    body["claims"][UID]["name"] = "edited"
    path.write_text(json.dumps(body))
    problem = Checkpoint(path).load()
    assert problem is not None and "checksum does not match the content" in problem
    assert not path.exists()


def test_an_unreadable_file_is_reported_and_left_in_place(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.mkdir()
    cp = Checkpoint(path)
    problem = cp.load()
    assert problem is not None and problem.startswith(f"cannot read checkpoint {path}: ")
    assert "\n" not in problem
    assert path.is_dir()
    assert cp.records == {}


# --- put / drop --------------------------------------------------------------------------------


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_put_writes_the_file_and_creates_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "plugins" / "fabric.example.com" / "checkpoint.json"
    cp = Checkpoint(path)
    cp.put(record())
    cp.put(record("second", PREPARING))
    assert decode(path.read_bytes()) == {UID: record(), "second": record("second", PREPARING)}
    assert path.parent.stat().st_mode & 0o777 == 0o750
    assert files_in(path.parent) == ["checkpoint.json"]


def test_put_replaces_the_claims_record(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.put(record(state=PREPARING))
    cp.put(record(state=PREPARED))
    assert cp.records == {UID: record()}
    assert decode(cp.path.read_bytes()) == {UID: record()}


def test_a_reload_sees_what_was_put_and_dropped(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.put(record())
    cp.put(record("second"))
    cp.drop(UID)
    again = Checkpoint(cp.path)
    assert again.load() is None
    assert again.records == {"second": record("second")}


def test_dropping_an_unknown_claim_writes_nothing(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.drop("unknown")
    assert not cp.path.exists()


def test_a_put_that_cannot_write_keeps_no_new_record(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    cp = Checkpoint(blocker / "checkpoint.json")
    with pytest.raises(CheckpointError) as caught:
        cp.put(record())
    assert str(caught.value).startswith(f"cannot write checkpoint {cp.path}: ")
    assert "\n" not in str(caught.value)
    assert cp.records == {}


def test_a_put_that_cannot_write_keeps_the_previous_record(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.put(record(state=PREPARING))
    before = cp.path.read_bytes()
    blocker = tmp_path / "file"
    blocker.write_text("")
    cp.path = blocker / "checkpoint.json"
    with pytest.raises(CheckpointError):
        cp.put(record(state=PREPARED))
    assert cp.records == {UID: record(state=PREPARING)}
    assert (tmp_path / "checkpoint.json").read_bytes() == before


def test_a_failed_rename_leaves_no_temporary_file_and_no_change(tmp_path: Path) -> None:
    # The checkpoint path is a directory: the temporary file is written, its rename fails.
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.path.mkdir()
    cp.records = {UID: record()}
    with pytest.raises(CheckpointError):
        cp.put(record("second"))
    assert cp.records == {UID: record()}
    with pytest.raises(CheckpointError):
        cp.drop(UID)
    assert cp.records == {UID: record()}
    assert files_in(tmp_path) == ["checkpoint.json"]
    assert list(cp.path.iterdir()) == []


def test_a_drop_that_cannot_write_keeps_the_record(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.put(record())
    blocker = tmp_path / "file"
    blocker.write_text("")
    cp.path = blocker / "checkpoint.json"
    with pytest.raises(CheckpointError):
        cp.drop(UID)
    assert cp.records == {UID: record()}
