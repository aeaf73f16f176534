"""The node plugin's pure decisions (app.node.plan): whether a claim is ours to prepare here,
where each allocated device stands, the opaque config with its host-path check, and the CDI
specs and kubelet answer of a prepared claim. Every spec made is checked with the kubelet
stand-in's CDI validation (fabric_dra_sim.kubelet.cdi_check)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.claims.model import EffectiveConfig, WantedDevice
from app.node.identity import DeviceIdentity, DeviceNode, HostDevice
from app.node.plan import (
    DEVICES_ENV,
    MOUNT_OPTIONS_RO,
    MOUNT_OPTIONS_RW,
    ClaimNotPreparable,
    ClaimRef,
    Verdict,
    check_claim,
    claim_config,
    claim_specs,
    device_states,
    identity_from_data,
    states_from_journal,
)
from fabric_dra_sim.kubelet.cdi_check import validate_spec

DRIVER = "fabric.example.com"
NODE = "node-a"
UID = "0b7d3f2a-9c1e-4e53-9a61-2c8d4f0e7b15"
REF = ClaimRef("default", "claim-1", UID)
READY = "FabricDeviceReady"
FAILED = "FabricDeviceFailed"
GPU_UUID = "3f2a6b1c-0d4e-4f5a-8b9c-0123456789ab"


# --- builders ----------------------------------------------------------------------------------


def selector(node: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


def claim(
    results: list[tuple[str, str, str]],
    *,
    entries: list[Any] | None = None,
    config: list[dict[str, Any]] | None = None,
    node: str | None = NODE,
    uid: str = UID,
    driver: str = DRIVER,
) -> dict[str, Any]:
    """A v1 claim allocated ``results`` (request, pool, device) of ``driver``."""
    allocation: dict[str, Any] = {
        "devices": {
            "results": [
                {"request": r, "pool": p, "device": d, "driver": driver} for r, p, d in results
            ],
            "config": config or [],
        }
    }
    if node is not None:
        allocation["nodeSelector"] = selector(node)
    status: dict[str, Any] = {"allocation": allocation}
    if entries is not None:
        status["devices"] = entries
    return {"metadata": {"name": "claim-1", "namespace": "default", "uid": uid}, "status": status}


def cond(type_: str, status: bool, reason: str = "Attached", message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
    }


def status_entry(
    pool: str,
    device: str,
    *,
    ready: bool = True,
    failed: bool = False,
    data: dict[str, Any] | None = None,
    driver: str = DRIVER,
    message: str = "",
    reason: str = "Attached",
) -> dict[str, Any]:
    return {
        "driver": driver,
        "pool": pool,
        "device": device,
        "conditions": [cond(READY, ready, reason, message), cond(FAILED, failed, reason, message)],
        "data": {"node": NODE, "deviceType": "gpu", **(data or {})},
    }


def opaque(parameters: dict[str, Any], requests: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "source": "FromClaim",
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "fabric-dra.io/v1alpha1",
                "kind": "FabricDeviceConfig",
                **parameters,
            },
        },
    }
    if requests is not None:
        out["requests"] = requests
    return out


def identity(
    device: str = "gpu-0",
    device_type: str = "gpu",
    *,
    pool: str = "rack-1",
    requests: tuple[str, ...] = ("dev",),
    uuid: str | None = GPU_UUID,
    serial: str | None = None,
) -> DeviceIdentity:
    return DeviceIdentity(pool, device, device_type, requests, uuid=uuid, serial=serial)


def found(ident: DeviceIdentity, *nodes: DeviceNode) -> HostDevice:
    return HostDevice(ident, "uuid", "/sys/bus/pci/devices/0000:3b:00.0", "0000:3b:00.0", nodes)


def states(c: dict[str, Any], ready: tuple[str, ...] = (READY,)) -> list[Any]:
    return device_states(c, DRIVER, NODE, ready, (FAILED,))


def edits_env(edits: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in edits.get("env", []))


# --- check_claim -------------------------------------------------------------------------------


def test_a_claim_allocated_to_this_node_is_accepted() -> None:
    check_claim(claim([("dev", "rack-1", "gpu-0")]), REF, DRIVER, NODE)


def test_a_claim_whose_allocation_names_no_single_node_is_accepted() -> None:
    check_claim(claim([("dev", "rack-1", "gpu-0")], node=None), REF, DRIVER, NODE)


def test_a_claim_with_another_uid_is_refused() -> None:
    other = claim([("dev", "rack-1", "gpu-0")], uid="other-uid")
    with pytest.raises(ClaimNotPreparable, match="has UID other-uid, the kubelet asked for " + UID):
        check_claim(other, REF, DRIVER, NODE)


@pytest.mark.parametrize("status", [None, {}, {"allocation": None}, {"allocation": {}}])
def test_a_claim_that_is_not_allocated_is_refused(status: Any) -> None:
    unallocated: dict[str, Any] = {"metadata": {"uid": UID}}
    if status is not None:
        unallocated["status"] = status
    with pytest.raises(ClaimNotPreparable, match="claim default/claim-1 is not allocated"):
        check_claim(unallocated, REF, DRIVER, NODE)


def test_a_claim_allocated_to_another_node_is_refused() -> None:
    elsewhere = claim([("dev", "rack-1", "gpu-0")], node="node-b")
    with pytest.raises(
        ClaimNotPreparable, match="allocated to node node-b, not to this node node-a"
    ):
        check_claim(elsewhere, REF, DRIVER, NODE)


def test_a_claim_without_metadata_is_refused_as_another_uid() -> None:
    with pytest.raises(ClaimNotPreparable, match="has UID None"):
        check_claim({}, REF, DRIVER, NODE)


# --- identity_from_data ------------------------------------------------------------------------


def test_identity_from_data_reads_every_field() -> None:
    wanted = WantedDevice("dev", "rack-1", "gpu-0")
    data = {
        "deviceType": "gpu",
        "uuid": GPU_UUID,
        "serialNumber": "SN1",
        "pciVendorId": "0x10de",
        "pciDeviceId": "0x20b5",
        "slot": "7",
        "node": NODE,
        "host": "sys-1",
    }
    assert identity_from_data(wanted, ["dev", "more"], data) == DeviceIdentity(
        "rack-1", "gpu-0", "gpu", ("dev", "more"), GPU_UUID, "SN1", "0x10de", "0x20b5", "7"
    )


def test_identity_from_data_drops_empty_and_non_string_fields() -> None:
    wanted = WantedDevice("dev", "rack-1", "gpu-0")
    data = {"uuid": "", "serialNumber": 12, "pciVendorId": None, "slot": ["7"]}
    got = identity_from_data(wanted, ["dev"], data)
    assert (got.uuid, got.serial, got.pci_vendor_id, got.pci_device_id, got.slot) == (None,) * 5
    assert got.device_type == "other"


# --- device_states -----------------------------------------------------------------------------


def test_a_device_with_every_ready_condition_on_this_node_is_ready() -> None:
    c = claim(
        [("dev", "rack-1", "gpu-0")],
        entries=[status_entry("rack-1", "gpu-0", data={"uuid": GPU_UUID})],
    )
    (state,) = states(c)
    assert state.verdict is Verdict.READY
    assert state.identity == identity()


def test_a_device_without_an_entry_is_waiting() -> None:
    (state,) = states(claim([("dev", "rack-1", "gpu-0")], entries=[]))
    assert state.verdict is Verdict.WAITING
    assert state.why == "not attached yet"
    assert state.identity is None


def test_a_device_still_attaching_is_waiting_with_the_reason() -> None:
    entry = status_entry("rack-1", "gpu-0", ready=False, reason="Attaching", message="task 3")
    (state,) = states(claim([("dev", "rack-1", "gpu-0")], entries=[entry]))
    assert state.verdict is Verdict.WAITING
    assert state.why == "not attached yet: Attaching: task 3"


def test_a_device_missing_one_of_several_ready_conditions_is_waiting() -> None:
    c = claim([("dev", "rack-1", "gpu-0")], entries=[status_entry("rack-1", "gpu-0")])
    (state,) = states(c, ready=(READY, "AlsoNeeded"))
    assert state.verdict is Verdict.WAITING


def test_a_failed_device_is_failed_with_the_controllers_message() -> None:
    entry = status_entry("rack-1", "gpu-0", ready=False, failed=True, message="attach gave up")
    (state,) = states(claim([("dev", "rack-1", "gpu-0")], entries=[entry]))
    assert state.verdict is Verdict.FAILED
    assert state.why == "attach gave up"


def test_failure_wins_over_ready() -> None:
    entry = status_entry("rack-1", "gpu-0", ready=True, failed=True, reason="Lost", message="")
    (state,) = states(claim([("dev", "rack-1", "gpu-0")], entries=[entry]))
    assert (state.verdict, state.why) == (Verdict.FAILED, "Lost")


def test_a_device_attached_to_another_node_is_failed() -> None:
    entry = status_entry("rack-1", "gpu-0", data={"node": "node-b"})
    (state,) = states(claim([("dev", "rack-1", "gpu-0")], entries=[entry]))
    assert state.verdict is Verdict.FAILED
    assert state.why == "attached to node node-b, not to this node node-a"


def test_a_ready_entry_that_names_no_node_is_ready() -> None:
    entry = status_entry("rack-1", "gpu-0")
    del entry["data"]["node"]
    (state,) = states(claim([("dev", "rack-1", "gpu-0")], entries=[entry]))
    assert state.verdict is Verdict.READY


def test_other_drivers_results_and_entries_are_ignored() -> None:
    c = claim([("dev", "rack-1", "gpu-0")], entries=[status_entry("rack-1", "gpu-0")])
    c["status"]["allocation"]["devices"]["results"].append(
        {"request": "dev", "pool": "p", "device": "x", "driver": "other.example.com"}
    )
    c["status"]["devices"].insert(
        0, status_entry("rack-1", "gpu-0", failed=True, driver="other.example.com")
    )
    (state,) = states(c)
    assert state.verdict is Verdict.READY


def test_a_device_serving_two_requests_is_one_state_with_both_requests() -> None:
    c = claim(
        [("b", "rack-1", "gpu-0"), ("a", "rack-1", "gpu-0"), ("a", "rack-1", "gpu-1")],
        entries=[status_entry("rack-1", "gpu-0"), status_entry("rack-1", "gpu-1")],
    )
    got = states(c)
    assert [(s.wanted.device, s.identity.requests if s.identity else None) for s in got] == [
        ("gpu-0", ("a", "b")),
        ("gpu-1", ("a",)),
    ]


def test_malformed_entries_and_conditions_do_not_break_the_verdict() -> None:
    entry = status_entry("rack-1", "gpu-0")
    entry["conditions"].insert(0, "junk")
    entry["data"] = "not an object"
    c = claim([("dev", "rack-1", "gpu-0")], entries=["junk", entry])
    (state,) = states(c)
    assert state.verdict is Verdict.READY
    assert state.identity is not None and state.identity.device_type == "other"


# --- states_from_journal -----------------------------------------------------------------------


def reservation(device: str, state: str, node: str | None = NODE, **data: Any) -> dict[str, Any]:
    return {
        "pool": "rack-1",
        "device": device,
        "state": state,
        "node": node,
        "data": {"deviceType": "gpu", **data},
    }


def journal(*reservations: dict[str, Any]) -> list[Any]:
    c = claim([("dev", "rack-1", "gpu-0"), ("dev", "rack-1", "gpu-1")])
    return states_from_journal(c, DRIVER, NODE, list(reservations))


def test_a_device_without_a_reservation_is_waiting() -> None:
    got = journal(reservation("gpu-0", "attached"))
    assert [(s.wanted.device, s.verdict, s.why) for s in got] == [
        ("gpu-0", Verdict.READY, ""),
        ("gpu-1", Verdict.WAITING, "no reservation yet"),
    ]


@pytest.mark.parametrize("state", ["failed", "detach-failed"])
def test_a_failed_reservation_is_failed(state: str) -> None:
    got = journal(reservation("gpu-0", state), reservation("gpu-1", "attached"))
    assert (got[0].verdict, got[0].why) == (Verdict.FAILED, f"reservation is {state}")


@pytest.mark.parametrize("state", ["reserved", "attaching", "detaching", "None"])
def test_a_reservation_not_attached_yet_is_waiting(state: str) -> None:
    got = journal(reservation("gpu-0", state), reservation("gpu-1", "attached"))
    assert (got[0].verdict, got[0].why) == (Verdict.WAITING, f"reservation is {state}")


def test_a_reservation_attached_to_another_node_is_failed() -> None:
    got = journal(reservation("gpu-0", "attached", node="node-b"), reservation("gpu-1", "attached"))
    assert got[0].verdict is Verdict.FAILED
    assert got[0].why == "attached to node node-b, not to this node node-a"


def test_an_attached_reservation_gives_the_identity_from_its_data() -> None:
    got = journal(
        reservation("gpu-0", "attached", uuid=GPU_UUID, serialNumber="S0"),
        reservation("gpu-1", "attached", node=None),
    )
    assert [s.verdict for s in got] == [Verdict.READY, Verdict.READY]
    assert got[0].identity == identity(serial="S0")
    assert got[1].identity == identity("gpu-1", uuid=None)


# --- claim_config ------------------------------------------------------------------------------


def mount_claim(host_path: str) -> dict[str, Any]:
    mounts = [{"hostPath": host_path, "containerPath": "/mnt"}]
    return claim([("dev", "rack-1", "gpu-0")], config=[opaque({"mounts": mounts})])


@pytest.mark.parametrize(
    ("host_path", "prefixes"),
    [
        ("/data", ["/data"]),
        ("/data/x", ["/data"]),
        ("/data/x/y", ["/data/"]),
        ("/data/x", ["/other", "/data"]),
        ("/anything", ["/"]),
        ("/data", ["/data/"]),
    ],
)
def test_a_mount_under_an_allowed_prefix_is_accepted(host_path: str, prefixes: list[str]) -> None:
    configs = claim_config(mount_claim(host_path), DRIVER, prefixes)
    assert configs["dev"].mounts == ((host_path, "/mnt", True),)


@pytest.mark.parametrize(
    ("host_path", "prefixes"),
    [
        ("/database", ["/data"]),
        ("/dat", ["/data"]),
        ("/data2/x", ["/data"]),
        ("/etc/shadow", ["/data", "/scratch"]),
        ("/d", ["/data/x"]),
    ],
)
def test_a_mount_outside_the_allowed_prefixes_is_refused(
    host_path: str, prefixes: list[str]
) -> None:
    with pytest.raises(ClaimNotPreparable) as caught:
        claim_config(mount_claim(host_path), DRIVER, prefixes)
    assert str(caught.value) == (
        f"request dev: mount of host path {host_path} is not allowed "
        f"(allowed prefixes: {', '.join(prefixes)})"
    )


def test_no_allowed_prefix_refuses_every_mount_and_says_where_to_allow() -> None:
    with pytest.raises(
        ClaimNotPreparable, match=r"allowed prefixes: none \(node.allowed_host_paths\)"
    ):
        claim_config(mount_claim("/data"), DRIVER, [])


def test_a_claim_without_mounts_needs_no_prefix() -> None:
    c = claim([("dev", "rack-1", "gpu-0")], config=[opaque({"env": {"A": "1"}})])
    assert claim_config(c, DRIVER, []) == {"dev": EffectiveConfig(env=(("A", "1"),))}


def test_a_malformed_config_is_not_preparable() -> None:
    c = claim([("dev", "rack-1", "gpu-0")], config=[opaque({"env": {"FABRIC_DRA_X": "1"}})])
    with pytest.raises(ClaimNotPreparable, match=r"^invalid FabricDeviceConfig: config\[0\] "):
        claim_config(c, DRIVER, ["/"])


def test_claim_config_covers_each_of_our_requests_once() -> None:
    c = claim([("b", "rack-1", "gpu-0"), ("a", "rack-1", "gpu-1"), ("a", "rack-1", "gpu-2")])
    assert sorted(claim_config(c, DRIVER, [])) == ["a", "b"]


# --- claim_specs -------------------------------------------------------------------------------

GPU_NODES = (DeviceNode("/dev/nvidia0", "c", 195, 0), DeviceNode("/dev/nvidiactl", "c", 195, 255))
NVME_NODES = (DeviceNode("/dev/nvme0", "c", 241, 0), DeviceNode("/dev/nvme0n1", "b", 259, 1))


def two_kinds() -> list[HostDevice]:
    return [
        found(
            identity("nvme-0", "nvme", uuid=None, serial="S5GX", requests=("disk",)), *NVME_NODES
        ),
        found(identity("gpu-0", requests=("dev",)), *GPU_NODES),
        found(identity("gpu-1", uuid=None, requests=("dev", "more"))),
    ]


def test_one_spec_per_device_type_named_for_the_claim() -> None:
    specs, _ = claim_specs(DRIVER, UID, two_kinds(), {})
    assert [s.file_name for s in specs] == [
        f"fabric.example.com-gpu_{UID}.json",
        f"fabric.example.com-nvme_{UID}.json",
    ]
    assert [s.spec["kind"] for s in specs] == ["fabric.example.com/gpu", "fabric.example.com/nvme"]
    assert [[d["name"] for d in s.spec["devices"]] for s in specs] == [
        [f"{UID}-gpu-0", f"{UID}-gpu-1"],
        [f"{UID}-nvme-0"],
    ]
    for spec in specs:
        assert validate_spec(spec.spec) == []


def test_the_answer_gives_each_device_its_cdi_id_and_requests() -> None:
    _, answer = claim_specs(DRIVER, UID, two_kinds(), {})
    assert [(a.requests, a.pool, a.device, a.cdi_device_ids) for a in answer] == [
        (("dev",), "rack-1", "gpu-0", (f"fabric.example.com/gpu={UID}-gpu-0",)),
        (("dev", "more"), "rack-1", "gpu-1", (f"fabric.example.com/gpu={UID}-gpu-1",)),
        (("disk",), "rack-1", "nvme-0", (f"fabric.example.com/nvme={UID}-nvme-0",)),
    ]
    assert answer[2].identity.serial == "S5GX"


def test_each_device_gets_its_nodes_and_identity_variables() -> None:
    specs, _ = claim_specs(DRIVER, UID, two_kinds(), {})
    gpu0, gpu1 = specs[0].spec["devices"]
    assert gpu0["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
    ]
    assert edits_env(gpu0["containerEdits"]) == {
        "FABRIC_DRA_DEVICE_GPU_0_POOL": "rack-1",
        "FABRIC_DRA_DEVICE_GPU_0_TYPE": "gpu",
        "FABRIC_DRA_DEVICE_GPU_0_UUID": GPU_UUID,
    }
    assert "deviceNodes" not in gpu1["containerEdits"]
    assert edits_env(gpu1["containerEdits"]) == {
        "FABRIC_DRA_DEVICE_GPU_1_POOL": "rack-1",
        "FABRIC_DRA_DEVICE_GPU_1_TYPE": "gpu",
    }
    (nvme,) = specs[1].spec["devices"]
    assert edits_env(nvme["containerEdits"])["FABRIC_DRA_DEVICE_NVME_0_SERIAL"] == "S5GX"
    assert "FABRIC_DRA_DEVICE_NVME_0_UUID" not in edits_env(nvme["containerEdits"])


def test_every_spec_lists_all_the_claims_devices_in_fabric_dra_devices() -> None:
    # A container given both kinds sees the whole list whichever spec the runtime applies last.
    specs, _ = claim_specs(DRIVER, UID, two_kinds(), {})
    assert [edits_env(s.spec["containerEdits"]) for s in specs] == [
        {DEVICES_ENV: f"gpu-0:{GPU_UUID}:,gpu-1::,nvme-0::S5GX"},
        {DEVICES_ENV: f"gpu-0:{GPU_UUID}:,gpu-1::,nvme-0::S5GX"},
    ]


def test_config_env_and_mounts_go_only_to_devices_serving_the_request() -> None:
    configs = {
        "dev": EffectiveConfig(env=(("MODE", "dev"),), mounts=(("/data", "/mnt/data", True),)),
        "more": EffectiveConfig(env=(("EXTRA", "1"),), mounts=(("/scratch", "/mnt/s", False),)),
        "disk": EffectiveConfig(env=(("DISK", "yes"),)),
        "unused": EffectiveConfig(env=(("NEVER", "1"),)),
    }
    specs, _ = claim_specs(DRIVER, UID, two_kinds(), configs)
    gpu0, gpu1 = (d["containerEdits"] for d in specs[0].spec["devices"])
    (nvme,) = (d["containerEdits"] for d in specs[1].spec["devices"])
    assert edits_env(gpu0)["MODE"] == "dev" and "EXTRA" not in edits_env(gpu0)
    assert gpu0["mounts"] == [
        {"hostPath": "/data", "containerPath": "/mnt/data", "options": list(MOUNT_OPTIONS_RO)}
    ]
    assert {k: edits_env(gpu1)[k] for k in ("MODE", "EXTRA")} == {"MODE": "dev", "EXTRA": "1"}
    assert gpu1["mounts"] == [
        {"hostPath": "/data", "containerPath": "/mnt/data", "options": list(MOUNT_OPTIONS_RO)},
        {"hostPath": "/scratch", "containerPath": "/mnt/s", "options": list(MOUNT_OPTIONS_RW)},
    ]
    assert edits_env(nvme)["DISK"] == "yes"
    assert "MODE" not in edits_env(nvme) and "mounts" not in nvme
    assert all(
        "NEVER" not in edits_env(d["containerEdits"]) for s in specs for d in s.spec["devices"]
    )


def test_two_devices_of_one_type_with_the_same_name_in_two_pools_are_not_preparable() -> None:
    clash = [found(identity("gpu-0", pool="rack-1")), found(identity("gpu-0", pool="rack-2"))]
    with pytest.raises(ClaimNotPreparable, match=r"^cannot make a CDI spec: .*given twice"):
        claim_specs(DRIVER, UID, clash, {})


@pytest.mark.parametrize(
    ("driver", "uid", "device_type", "why"),
    [
        ("-bad", UID, "gpu", "vendor"),
        (DRIVER, "../x", "gpu", "claim UID"),
        (DRIVER, UID, "gpu/x", "class"),
        (DRIVER, UID, "x" * 64, "longer than 63"),
    ],
)
def test_names_cdi_refuses_make_the_claim_not_preparable(
    driver: str, uid: str, device_type: str, why: str
) -> None:
    with pytest.raises(ClaimNotPreparable, match=r"^cannot make a CDI spec: ") as caught:
        claim_specs(driver, uid, [found(identity(device_type=device_type))], {})
    assert why in str(caught.value)


def test_a_nul_in_an_identity_value_is_not_preparable() -> None:
    with pytest.raises(ClaimNotPreparable, match="NUL"):
        claim_specs(DRIVER, UID, [found(identity(serial="a\x00b"))], {})


def test_no_devices_give_no_specs() -> None:
    assert claim_specs(DRIVER, UID, [], {}) == ([], [])


# --- claim_specs properties --------------------------------------------------------------------

TYPES = st.sampled_from(["gpu", "fpga", "nvme", "cxl-memory", "drive", "memory", "nic", "x.y"])
LABELS = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
VALUES = st.none() | st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12
)
REQUESTS = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True)
NODES = st.lists(
    st.builds(
        DeviceNode,
        st.from_regex(r"/dev/[a-z]{1,6}[0-9]{0,2}", fullmatch=True),
        st.sampled_from(["c", "b"]),
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**32 - 1),
    ),
    max_size=3,
    unique_by=lambda n: n.path,
)


@st.composite
def host_devices(draw: st.DrawFn) -> list[HostDevice]:
    names = draw(st.lists(LABELS, max_size=6, unique=True))
    out = []
    for name in names:
        ident = DeviceIdentity(
            pool=draw(st.sampled_from(["rack-1", "rack-2"])),
            device=name,
            device_type=draw(TYPES),
            requests=tuple(sorted(draw(REQUESTS))),
            uuid=draw(VALUES),
            serial=draw(VALUES),
        )
        out.append(HostDevice(ident, "uuid", "/sys/x", None, tuple(draw(NODES))))
    return out


CONFIGS = st.dictionaries(
    st.sampled_from(["a", "b", "c"]),
    st.builds(
        lambda env, mounts: EffectiveConfig(env=tuple(sorted(env.items())), mounts=tuple(mounts)),
        st.dictionaries(
            st.from_regex(r"[A-Z][A-Z0-9_]{0,5}", fullmatch=True),
            st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
            max_size=3,
        ),
        st.lists(
            st.tuples(
                st.from_regex(r"/data(/[a-z]{1,3}){0,2}", fullmatch=True),
                st.from_regex(r"/mnt(/[a-z]{1,3}){0,2}", fullmatch=True),
                st.booleans(),
            ),
            max_size=3,
        ),
    ),
)


@given(host_devices(), CONFIGS)
def test_every_spec_made_is_one_a_runtime_accepts(
    devices: list[HostDevice], configs: dict[str, EffectiveConfig]
) -> None:
    specs, answer = claim_specs(DRIVER, UID, devices, configs)
    assert len(specs) == len({d.identity.device_type for d in devices})
    assert len(answer) == len(devices)
    for spec in specs:
        assert validate_spec(spec.spec) == [], spec
    ids = {i for a in answer for i in a.cdi_device_ids}
    defined = {f"{s.spec['kind']}={d['name']}" for s in specs for d in s.spec["devices"]}
    assert ids == defined


@given(host_devices(), CONFIGS, st.randoms(use_true_random=False))
def test_the_output_does_not_depend_on_the_order_devices_are_found(
    devices: list[HostDevice], configs: dict[str, EffectiveConfig], rnd: random.Random
) -> None:
    shuffled = list(devices)
    rnd.shuffle(shuffled)
    first = claim_specs(DRIVER, UID, devices, configs)
    assert claim_specs(DRIVER, UID, shuffled, configs) == first
    assert claim_specs(DRIVER, UID, list(reversed(devices)), configs) == first


@given(host_devices())
def test_fabric_dra_devices_lists_each_device_of_the_claim_once(devices: list[HostDevice]) -> None:
    specs, _ = claim_specs(DRIVER, UID, devices, {})
    for spec in specs:
        members = sorted((d.identity for d in devices), key=lambda i: (i.pool, i.device))
        assert edits_env(spec.spec["containerEdits"])[DEVICES_ENV] == ",".join(
            f"{i.device}:{i.uuid or ''}:{i.serial or ''}" for i in members
        )
