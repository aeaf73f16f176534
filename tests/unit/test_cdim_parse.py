"""NEC CDIM vendor data: what the backend makes of configuration-manager's resources (every
shape, including garbage), and nodes matched to CDIM CPUs by serial number."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.fabric.cdim import CdimBackend
from app.fabric.types import DeviceType, FabricDevice, Health, Rejected
from app.hostmap import (
    HOSTNAME,
    SERIAL,
    AmbiguityLog,
    HostIndex,
    HostRef,
    ambiguities,
    ambiguity_for_node,
    host_ref_for_node,
)

BACKEND = CdimBackend("http://cdim.example")


def _entry(**device: Any) -> dict[str, Any]:
    base = {
        "deviceID": "gpu-1",
        "type": "GPU",
        "model": "A100",
        "manufacturer": "NVIDIA",
        "serialNumber": "S1",
        "status": {"state": "Enabled", "health": "Critical"},
        "links": [{"deviceID": "cpu-1", "type": "CPU"}],
    }
    base.update(device)
    return {"device": base, "annotation": {"available": True}, "nodeIDs": [], "detected": True}


def test_a_resource_becomes_a_device_with_its_cpu_health_and_type() -> None:
    made = BACKEND._device(_entry(), set())
    assert isinstance(made, FabricDevice)
    assert (made.vendor_id, made.attach_unit, made.host_id) == ("gpu-1", "gpu-1", "cpu-1")
    assert made.device_type == DeviceType.GPU and made.health == Health.CRITICAL
    assert (made.vendor, made.model, made.serial, made.state) == ("NVIDIA", "A100", "S1", "Enabled")
    for kind, expected in (
        ("FPGA", DeviceType.FPGA),
        ("DSP", DeviceType.ACCELERATOR),
        ("memory", DeviceType.CXL_MEMORY),
        ("storage", DeviceType.NVME),
        ("networkInterface", DeviceType.NIC),
        ("Quantum", DeviceType.OTHER),
    ):
        found = BACKEND._device(_entry(type=kind), set())
        assert isinstance(found, FabricDevice) and found.device_type == expected


def test_ghosts_cpus_built_in_parts_and_unavailable_devices_are_not_offered() -> None:
    assert BACKEND._device({**_entry(), "detected": False}, set()) is None
    assert BACKEND._device(_entry(type="CPU"), set()) is None
    assert BACKEND._device(_entry(), {"gpu-1"}) == "gpu-1"  # a local unit, never a device
    unavailable = {**_entry(), "annotation": {"available": False}}
    assert BACKEND._device(unavailable, set()) is None
    # Without a CPU link, the node holding it says where it is.
    entry = _entry(links=[])
    entry["nodeIDs"] = ["cpu-2"]
    made = BACKEND._device(entry, set())
    assert isinstance(made, FabricDevice) and made.host_id == "cpu-2"


def test_bad_resources_are_rejected_with_a_reason() -> None:
    for bad, kind in (
        ("text", "missing-field"),
        ({"device": "x"}, "missing-field"),
        (_entry(deviceID=""), "missing-field"),
        (_entry(deviceID=7), "missing-field"),
        (_entry(type=None), "missing-field"),
    ):
        made = BACKEND._device(bad, set())
        assert isinstance(made, Rejected) and made.kind == kind, bad


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(
    valid=st.booleans(),
    device=st.dictionaries(
        st.sampled_from(
            ["deviceID", "type", "status", "links", "serialNumber", "model", "constraints"]
        ),
        _JSON,
    ),
    entry=st.dictionaries(
        st.sampled_from(["annotation", "nodeIDs", "detected", "resourceGroupIDs"]), _JSON
    ),
)
def test_any_resource_shape_gives_a_device_a_rejection_or_nothing(
    valid: bool, device: dict[str, Any], entry: dict[str, Any]
) -> None:
    if valid:  # a usable id and type, so that every other field is read
        device = {**device, "deviceID": "gpu-1", "type": "GPU"}
    made = BACKEND._device({**entry, "device": device}, set())
    assert made is None or isinstance(made, FabricDevice | Rejected | str)
    if isinstance(made, FabricDevice):
        assert made.vendor_id == device["deviceID"] and isinstance(made.vendor_id, str)


def test_nodes_match_cdim_cpus_by_serial_number() -> None:
    index = HostIndex.build(
        [
            HostRef("cpu-1", None, "cdim", "SER-1"),
            HostRef("cpu-2", None, "cdim", "SER-2"),
            HostRef("cpu-3", None, "cdim", "SER-X"),
            HostRef("cpu-4", None, "cdim", "SER-X"),
        ],
        report=None,
    )
    key = "example.com/cpu-serial"
    labelled = {"metadata": {"name": "n1", "labels": {key: "SER-2"}}}
    annotated = {"metadata": {"name": "n2", "annotations": {key: "SER-1"}}}
    shared = {"metadata": {"name": "n3", "labels": {key: "SER-X"}}}
    unknown = {"metadata": {"name": "n4", "labels": {key: "nope"}}}
    found = host_ref_for_node(labelled, index, "serial", key)
    assert found is not None and found.host_id == "cpu-2"
    found = host_ref_for_node(annotated, index, "serial", key)
    assert found is not None and found.host_id == "cpu-1"
    assert host_ref_for_node(shared, index, "serial", key) is None
    ambiguity = ambiguity_for_node(shared, index, "serial", key)
    assert ambiguity is not None and ambiguity.key == SERIAL
    assert ambiguity.hosts == ("cpu-3", "cpu-4")
    assert host_ref_for_node(unknown, index, "serial", key) is None
    assert ambiguity_for_node(unknown, index, "serial", key) is None


def test_shared_serials_are_logged_only_when_nodes_are_matched_by_serial(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Placeholder identities (one HostName and one SerialNumber on every System) are common:
    # a shared serial number is only news when serial numbers are the rule.
    hosts = [HostRef(f"h{i}", "localhost", "redfish", "0000") for i in range(3)]
    log = AmbiguityLog(logging.getLogger("test.hostmap"))
    with caplog.at_level(logging.WARNING, logger="test.hostmap"):
        HostIndex.build(hosts, report=log, match="hostname")
    assert "serial number" not in caplog.text and "'localhost'" in caplog.text
    index = HostIndex.build(hosts, report=log, match="serial")
    assert "serial number '0000' is shared by hosts h0, h1, h2" in caplog.text
    assert [a.key for a in ambiguities(index)] == [HOSTNAME]
    assert [a.key for a in ambiguities(index, serials=True)] == [HOSTNAME, SERIAL]
