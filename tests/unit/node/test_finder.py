"""The node plugin's device finder, against fake sysfs/procfs trees laid out as Linux lays them
out (real directories and relative symlinks), and the vendor hook runner."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest
from builders import eventually
from hypothesis import given
from hypothesis import strategies as st

from app.node.finder import (
    CxlSerialMatcher,
    DeviceNotFound,
    HookFailed,
    NvmeSerialMatcher,
    PciDsnMatcher,
    PciIdSlotMatcher,
    UuidMatcher,
    hook_environment,
    locate,
    matchers_for,
    run_hook,
)
from app.node.identity import DeviceIdentity, DeviceNode, HostDevice
from app.node.sysfs import (
    extended_capabilities,
    find_dsn,
    format_dsn,
    parse_dev_numbers,
    parse_dsn_text,
    parse_proc_devices,
    serial_candidates,
)
from fabric_dra_sim.fakehost import FakeHost, config_space, dsn_body

GPU_UUID = "3f2a6b1c-0d4e-4f5a-8b9c-0123456789ab"
NS_UUID = "a1b2c3d4-e5f6-4789-8abc-def012345678"
DSN = 0x0011223344556677


def ident(
    device_type: str = "gpu",
    *,
    uuid: str | None = None,
    serial: str | None = None,
    pci_vendor_id: str | None = None,
    pci_device_id: str | None = None,
    slot: str | None = None,
) -> DeviceIdentity:
    return DeviceIdentity(
        pool="rack-1",
        device=f"{device_type}-1",
        device_type=device_type,
        requests=("r",),
        uuid=uuid,
        serial=serial,
        pci_vendor_id=pci_vendor_id,
        pci_device_id=pci_device_id,
        slot=slot,
    )


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


# --- pure parsing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("259:0\n", (259, 0)),
        ("10:196", (10, 196)),
        ("4096:0\n", None),
        ("1:1048576\n", None),
        ("abc\n", None),
        ("259:\n", None),
        ("", None),
        ("-1:3", None),
    ],
)
def test_dev_numbers_are_read_or_refused(text: str, expected: tuple[int, int] | None) -> None:
    assert parse_dev_numbers(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "00-11-22-33-44-55-66-77",
        "00:11:22:33:44:55:66:77",
        "0011223344556677",
        "0x0011223344556677",
    ],
)
def test_dsn_text_forms_are_read_most_significant_byte_first(text: str) -> None:
    assert parse_dsn_text(text) == DSN
    assert parse_dsn_text(text.upper().replace("0X", "0x")) == DSN


@pytest.mark.parametrize(
    "text",
    ["", "S123", "00-11-22-33-44-55-66", "00-11:22-33-44-55-66-77", "00112233445566778", "zz" * 8],
)
def test_text_that_is_no_dsn_is_refused(text: str) -> None:
    assert parse_dsn_text(text) is None


@given(st.integers(0, 2**64 - 1))
def test_dsn_text_round_trips(serial: int) -> None:
    text = format_dsn(serial)
    assert parse_dsn_text(text) == serial
    assert parse_dsn_text(text.replace("-", ":").upper()) == serial
    assert parse_dsn_text(text.replace("-", "")) == serial


_SLOTS = list(range(0x110, 0x1000 - 16, 16))


@st.composite
def capability_chains(draw: st.DrawFn) -> tuple[int, bytes]:
    serial = draw(st.integers(0, 2**64 - 1))
    others = draw(st.integers(0, 8))
    rest = draw(st.lists(st.sampled_from(_SLOTS), min_size=others, max_size=others, unique=True))
    offsets = [0x100, *rest]
    ids = [draw(st.integers(0, 0xFFFF).filter(lambda i: i != 0x0003)) for _ in offsets]
    position = draw(st.integers(0, others))
    caps = []
    for index, (offset, capability_id) in enumerate(zip(offsets, ids, strict=True)):
        if index == position:
            caps.append((offset, 0x0003, dsn_body(serial)))
        else:
            caps.append((offset, capability_id, draw(st.binary(min_size=8, max_size=8))))
    return serial, config_space(caps)


@given(capability_chains())
def test_the_dsn_is_found_anywhere_in_a_capability_chain(chain: tuple[int, bytes]) -> None:
    serial, config = chain
    assert find_dsn(config) == serial


@given(st.binary(max_size=4096))
def test_any_config_bytes_give_a_serial_or_none_and_the_walk_ends(config: bytes) -> None:
    offsets = [offset for offset, _, _ in extended_capabilities(config)]
    assert len(offsets) == len(set(offsets))
    found = find_dsn(config)
    assert found is None or 0 <= found < 2**64


def test_a_capability_loop_ends_without_a_serial() -> None:
    looped = bytearray(config_space([(0x100, 0x0001, b""), (0x140, 0x000B, b"")]))
    looped[0x140:0x144] = (0x000B | (1 << 16) | (0x100 << 20)).to_bytes(4, "little")
    assert [o for o, _, _ in extended_capabilities(bytes(looped))] == [0x100, 0x140]
    assert find_dsn(bytes(looped)) is None
    itself = bytearray(4096)
    itself[0x100:0x104] = (0x0001 | (0x100 << 20)).to_bytes(4, "little")
    assert find_dsn(bytes(itself)) is None


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (config_space([(0x100, 0x0003, dsn_body(DSN))], size=256), "conventional space only"),
        (config_space([(0x100, 0x0003, dsn_body(DSN))], size=64), "read without privilege"),
        (config_space([(0x100, 0x0003, dsn_body(DSN))])[:0x108], "cut inside the capability"),
        (config_space([(0x100, 0x0001, b""), (0xFFC, 0x0003, b"")]), "header at the last dword"),
        (b"\xff" * 4096, "function does not answer"),
        (b"", "empty"),
    ],
)
def test_truncated_or_dead_config_space_has_no_serial(config: bytes, why: str) -> None:
    assert find_dsn(config) is None, why


def test_a_next_offset_below_the_extended_space_ends_the_walk() -> None:
    space = bytearray(config_space([(0x100, 0x0001, b"")]))
    space[0x100:0x104] = (0x0001 | (0x40 << 20)).to_bytes(4, "little")
    space[0x40:0x44] = (0x0003).to_bytes(4, "little")
    assert find_dsn(bytes(space)) is None


def test_serial_candidates_read_decimal_and_hex() -> None:
    assert serial_candidates("0x1234") == {0x1234}
    assert serial_candidates("4660") == {4660, 0x4660}
    assert serial_candidates("abcd") == {0xABCD}
    assert serial_candidates("00-11-22-33-44-55-66-77") == {DSN}
    assert serial_candidates("serial?") == frozenset()
    assert serial_candidates("0x" + "f" * 17) == frozenset()


def test_proc_devices_gives_character_majors_only() -> None:
    text = "Character devices:\n  1 mem\n195 nvidia-frontend\nbad line\n\nBlock devices:\n  8 sd\n"
    assert parse_proc_devices(text) == {"mem": 1, "nvidia-frontend": 195}


# --- NVMe serial ---------------------------------------------------------------------------


def test_an_nvme_controller_is_found_by_its_space_padded_serial(host: FakeHost) -> None:
    host.nvme(0, serial="S9XYZ01", namespaces=2, address="0000:3b:00.0")
    host.nvme(1, serial="OTHER", address="0000:5e:00.0")
    found = NvmeSerialMatcher(host.root).find(ident("nvme", serial=" S9XYZ01 "))
    assert found is not None
    assert found.matched_by == "nvme-serial"
    assert found.sysfs_path == "/sys/class/nvme/nvme0"
    assert found.pci_address == "0000:3b:00.0"
    assert found.device_nodes == (
        DeviceNode("/dev/nvme0", "c", 241, 0),
        DeviceNode("/dev/nvme0n1", "b", 259, 1),
        DeviceNode("/dev/nvme0n2", "b", 259, 2),
    )


def test_a_namespace_without_its_own_dev_file_is_read_from_sys_block(host: FakeHost) -> None:
    host.nvme(0, serial="S1", namespaces=0)
    (host.root / "sys/devices/pci0000:00/0000:3b:00.0/nvme/nvme0/nvme0n1").mkdir()
    host.write("/sys/block/nvme0n1/dev", "259:7\n")
    found = NvmeSerialMatcher(host.root).find(ident("nvme", serial="S1"))
    assert found is not None
    assert DeviceNode("/dev/nvme0n1", "b", 259, 7) in found.device_nodes


def test_a_multipath_namespace_path_gives_the_subsystems_block_device(host: FakeHost) -> None:
    host.nvme(0, serial="S1", namespaces=0)
    host.write("/sys/devices/pci0000:00/0000:3b:00.0/nvme/nvme0/nvme0c0n1/dev", "259:99\n")
    host.write("/sys/block/nvme0n1/dev", "259:3\n")
    found = NvmeSerialMatcher(host.root).find(ident("nvme", serial="S1"))
    assert found is not None
    assert found.device_nodes == (
        DeviceNode("/dev/nvme0", "c", 241, 0),
        DeviceNode("/dev/nvme0n1", "b", 259, 3),
    )


def test_a_fabrics_controller_has_no_pci_address(host: FakeHost) -> None:
    host.nvme(2, serial="NVMEOF1", address=None)
    found = NvmeSerialMatcher(host.root).find(ident("nvme", serial="NVMEOF1"))
    assert found is not None
    assert found.pci_address is None


def test_an_unknown_nvme_serial_is_not_found_and_explained(host: FakeHost) -> None:
    host.nvme(0, serial="S1")
    matcher = NvmeSerialMatcher(host.root)
    assert matcher.find(ident("nvme", serial="S2")) is None
    assert matcher.explain(ident("nvme", serial="S2")) == (
        "no NVMe serial 'S2' in /sys/class/nvme/*/serial (1 controllers)"
    )
    assert matcher.find(ident("nvme")) is None
    assert matcher.explain(ident("nvme", serial="  ")) == "nvme-serial skipped: no serial"


def test_broken_nvme_entries_are_skipped(host: FakeHost) -> None:
    host.nvme(0, serial="S1")
    host.nvme(1, serial="S1", address="0000:5e:00.0")
    ctrl0 = host.root / "sys/devices/pci0000:00/0000:3b:00.0/nvme/nvme0"
    (ctrl0 / "serial").unlink()
    (ctrl0 / "serial").mkdir()  # a directory where the file should be
    ctrl1 = host.root / "sys/devices/pci0000:00/0000:5e:00.0/nvme/nvme1"
    (ctrl1 / "dev").write_text("garbage\n")
    (ctrl1 / "device").unlink()
    (ctrl1 / "device").symlink_to("../../../nowhere")  # dangling, and no PCI address
    host.link("/sys/class/nvme/nvme7", "../../devices/gone/nvme7")  # dangling controller
    host.write("/sys/class/nvme/nvme-subsys0", "")  # not a controller name
    found = NvmeSerialMatcher(host.root).find(ident("nvme", serial="S1"))
    assert found is not None
    assert found.sysfs_path == "/sys/class/nvme/nvme1"
    assert found.pci_address is None
    assert found.device_nodes == (DeviceNode("/dev/nvme1n1", "b", 259, 17),)


def test_a_serial_file_that_is_not_text_or_is_a_fifo_is_skipped(host: FakeHost) -> None:
    host.nvme(0, serial="S1")
    host.nvme(1, serial="S1", address="0000:5e:00.0")
    (host.root / "sys/devices/pci0000:00/0000:3b:00.0/nvme/nvme0/serial").write_bytes(b"S1\xff\n")
    serial1 = host.root / "sys/devices/pci0000:00/0000:5e:00.0/nvme/nvme1/serial"
    serial1.unlink()
    os.mkfifo(serial1)
    assert NvmeSerialMatcher(host.root).find(ident("nvme", serial="S1")) is None


# --- PCIe Device Serial Number -------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["00-11-22-33-44-55-66-77", "0011223344556677", "00:11:22:33:44:55:66:77"]
)
def test_a_pci_function_is_found_by_its_dsn(host: FakeHost, text: str) -> None:
    host.pci("0000:3b:00.0", dsn=0x1111, iommu_group=7)
    host.pci("0000:5e:00.0", dsn=DSN, iommu_group=42).vfio_bound(42, 3)
    found = PciDsnMatcher(host.root).find(ident("fpga", serial=text))
    assert found == HostDevice(
        identity=ident("fpga", serial=text),
        matched_by="pci-dsn",
        sysfs_path="/sys/bus/pci/devices/0000:5e:00.0",
        pci_address="0000:5e:00.0",
        device_nodes=(
            DeviceNode("/dev/vfio/42", "c", 243, 3),
            DeviceNode("/dev/vfio/vfio", "c", 10, 196),
        ),
    )


def test_a_function_not_bound_to_vfio_gets_no_vfio_nodes(host: FakeHost) -> None:
    host.pci("0000:5e:00.0", vendor="0x1d0f", dsn=DSN, iommu_group=42)
    found = PciDsnMatcher(host.root).find(ident("fpga", serial=format_dsn(DSN)))
    assert found is not None
    assert found.device_nodes == ()


def test_a_dsn_match_on_an_nvme_function_gives_its_nvme_nodes(host: FakeHost) -> None:
    host.pci("0000:3b:00.0", vendor="0x144d", device="0xa80a", dsn=DSN)
    host.nvme(0, serial="S1", address="0000:3b:00.0")
    found = PciDsnMatcher(host.root).find(ident("nvme", serial=format_dsn(DSN)))
    assert found is not None
    assert [n.path for n in found.device_nodes] == ["/dev/nvme0", "/dev/nvme0n1"]


def test_the_lowest_function_of_a_multi_function_device_wins_and_bridges_are_ignored(
    host: FakeHost,
) -> None:
    host.pci("0000:3a:00.0", dsn=DSN, header=1)  # the switch port above it
    host.pci("0000:3b:00.1", device="0x1aef", dsn=DSN)
    host.pci("0000:3b:00.0", dsn=DSN)
    found = PciDsnMatcher(host.root).find(ident("gpu", serial=format_dsn(DSN)))
    assert found is not None
    assert found.pci_address == "0000:3b:00.0"


def test_the_same_dsn_in_two_devices_is_ambiguous(host: FakeHost) -> None:
    host.pci("0000:3b:00.0", dsn=DSN).pci("0000:5e:00.0", dsn=DSN)
    matcher = PciDsnMatcher(host.root)
    identity = ident("gpu", serial=format_dsn(DSN))
    assert matcher.find(identity) is None
    assert "ambiguous: 0000:3b:00.0, 0000:5e:00.0" in matcher.explain(identity)


def test_unreadable_or_truncated_config_is_skipped(host: FakeHost) -> None:
    host.pci("0000:3b:00.0", config=config_space([(0x100, 0x0003, dsn_body(DSN))], size=64))
    host.pci("0000:5e:00.0", dsn=DSN)
    config = host.root / "sys/devices/pci0000:00/0000:5e:00.0/config"
    config.unlink()
    config.symlink_to("missing")  # dangling
    host.link("/sys/bus/pci/devices/0000:99:00.0", "../../../devices/gone")
    host.write("/sys/bus/pci/devices/not-an-address", "")
    matcher = PciDsnMatcher(host.root)
    identity = ident("gpu", serial=format_dsn(DSN))
    assert matcher.find(identity) is None
    assert matcher.explain(identity) == (
        "no DSN 00-11-22-33-44-55-66-77 in /sys/bus/pci/devices/*/config "
        "(1 of 3 functions readable)"
    )


def test_a_serial_that_is_no_dsn_skips_the_dsn_matcher(host: FakeHost) -> None:
    host.pci("0000:3b:00.0", dsn=DSN)
    matcher = PciDsnMatcher(host.root)
    assert matcher.find(ident("nvme", serial="S9XYZ01")) is None
    assert matcher.explain(ident("nvme", serial="S9XYZ01")) == (
        "pci-dsn skipped: serial 'S9XYZ01' is not a PCIe device serial number"
    )
    assert matcher.explain(ident("gpu")) == "pci-dsn skipped: no serial"


# --- UUID ----------------------------------------------------------------------------------


def test_an_nvme_namespace_is_found_by_its_uuid(host: FakeHost) -> None:
    host.nvme(0, serial="S1", namespaces=2, uuids=("00000000-0000-0000-0000-000000000000", NS_UUID))
    found = UuidMatcher(host.root).find(ident("nvme", uuid=NS_UUID.upper()))
    assert found is not None
    assert found.matched_by == "uuid"
    assert found.device_nodes == (
        DeviceNode("/dev/nvme0", "c", 241, 0),
        DeviceNode("/dev/nvme0n2", "b", 259, 2),
    )


def test_the_all_zero_uuid_of_a_namespace_matches_nothing(host: FakeHost) -> None:
    host.nvme(0, serial="S1", uuids=("00000000-0000-0000-0000-000000000000",))
    matcher = UuidMatcher(host.root)
    identity = ident("nvme", uuid="00000000-0000-0000-0000-000000000000")
    assert matcher.find(identity) is None
    assert "is not a UUID" in matcher.explain(identity)


@pytest.mark.parametrize("given_uuid", [GPU_UUID, f"GPU-{GPU_UUID.upper()}", f"gpu-{GPU_UUID}"])
def test_an_nvidia_gpu_is_found_by_its_uuid(host: FakeHost, given_uuid: str) -> None:
    host.nvidia_gpu("0000:3b:00.0", uuid="11111111-2222-4333-8444-555555555555", minor=0)
    host.nvidia_gpu("0000:5e:00.0", uuid=GPU_UUID, minor=1)
    host.proc_devices("  1 mem", "195 nvidia-frontend", "508 nvidia-uvm")
    found = UuidMatcher(host.root).find(ident("gpu", uuid=given_uuid))
    assert found is not None
    assert found.pci_address == "0000:5e:00.0"
    assert found.sysfs_path == "/sys/bus/pci/devices/0000:5e:00.0"
    assert found.device_nodes == (
        DeviceNode("/dev/nvidia1", "c", 195, 1),
        DeviceNode("/dev/nvidiactl", "c", 195, 255),
        DeviceNode("/dev/nvidia-uvm", "c", 508, 0),
        DeviceNode("/dev/nvidia-uvm-tools", "c", 508, 1),
    )


def test_device_numbers_come_from_the_hosts_dev_first(host: FakeHost) -> None:
    host.nvidia_gpu("0000:5e:00.0", uuid=GPU_UUID, minor=0)
    host.proc_devices("195 nvidia-frontend")
    # A real character device stands in for the host's /dev/nvidia0 (/dev/null is 1:3).
    host.link("/dev/nvidia0", "/dev/null")
    host.write("/dev/nvidiactl", "a regular file is no device")
    found = UuidMatcher(host.root).find(ident("gpu", uuid=GPU_UUID))
    assert found is not None
    assert found.device_nodes == (
        DeviceNode("/dev/nvidia0", "c", 1, 3),
        DeviceNode("/dev/nvidiactl", "c", 195, 255),
    )


def test_a_gpu_without_device_numbers_anywhere_has_no_nodes(host: FakeHost) -> None:
    host.nvidia_gpu("0000:5e:00.0", uuid=GPU_UUID, minor=0, iommu_group=3)
    found = UuidMatcher(host.root).find(ident("gpu", uuid=GPU_UUID))
    assert found is not None
    assert found.device_nodes == ()


def test_garbage_nvidia_information_is_skipped(host: FakeHost) -> None:
    host.nvidia_gpu("0000:5e:00.0", uuid=GPU_UUID, minor=0)
    info = host.root / "proc/driver/nvidia/gpus/0000:5e:00.0/information"
    info.write_bytes(b"\x00\xff garbage")
    host.write("/proc/driver/nvidia/gpus/not-an-address/information", f"GPU UUID: GPU-{GPU_UUID}\n")
    matcher = UuidMatcher(host.root)
    assert matcher.find(ident("gpu", uuid=GPU_UUID)) is None
    assert matcher.explain(ident("gpu", uuid=GPU_UUID)) == (
        f"no uuid {GPU_UUID} in /sys/class/nvme/*/nvme*n*/uuid or "
        "/proc/driver/nvidia/gpus/*/information"
    )


def test_a_bad_device_minor_gives_no_nvidia_nodes(host: FakeHost) -> None:
    host.nvidia_gpu("0000:5e:00.0", uuid=GPU_UUID, minor=0)
    host.proc_devices("195 nvidia")
    info = host.root / "proc/driver/nvidia/gpus/0000:5e:00.0/information"
    info.write_text(info.read_text().replace("Device Minor: \t 0", "Device Minor: \t 999"))
    found = UuidMatcher(host.root).find(ident("gpu", uuid=GPU_UUID))
    assert found is not None
    assert found.device_nodes == ()


def test_an_identity_uuid_that_is_no_uuid_skips_the_matcher(host: FakeHost) -> None:
    matcher = UuidMatcher(host.root)
    assert (
        matcher.explain(ident("gpu", uuid="not-a-uuid"))
        == "uuid skipped: 'not-a-uuid' is not a UUID"
    )
    assert matcher.explain(ident("gpu")) == "uuid skipped: no uuid"


# --- CXL serial ----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["0x1234abcd", "305441741", "1234ABCD"])
def test_a_cxl_memory_device_is_found_by_its_serial(host: FakeHost, text: str) -> None:
    host.cxl_mem(0, serial=0x99).cxl_mem(1, serial=0x1234ABCD, address="0000:36:00.0")
    found = CxlSerialMatcher(host.root).find(ident("cxl-memory", serial=text))
    assert found == HostDevice(
        identity=ident("cxl-memory", serial=text),
        matched_by="cxl-serial",
        sysfs_path="/sys/bus/cxl/devices/mem1",
        pci_address="0000:36:00.0",
        device_nodes=(DeviceNode("/dev/cxl/mem1", "c", 250, 1),),
    )


def test_garbage_cxl_entries_are_skipped_and_the_miss_explained(host: FakeHost) -> None:
    host.cxl_mem(0, serial=0x10)
    (host.root / "sys/devices/pci0000:34/0000:35:00.0/mem0/serial").write_text("sixteen\n")
    host.write("/sys/bus/cxl/devices/memory0/serial", "0x10\n")
    matcher = CxlSerialMatcher(host.root)
    identity = ident("cxl-memory", serial="0x10")
    assert matcher.find(identity) is None
    assert matcher.explain(identity) == (
        "no CXL memory device serial 0x10 in /sys/bus/cxl/devices/mem*/serial (1 memory devices)"
    )
    assert matcher.explain(ident("cxl-memory", serial="n/a")) == (
        "cxl-serial skipped: serial 'n/a' is not a number"
    )


def test_a_cxl_device_with_a_bad_dev_file_has_no_node(host: FakeHost) -> None:
    host.cxl_mem(0, serial=0x10)
    (host.root / "sys/devices/pci0000:34/0000:35:00.0/mem0/dev").write_text("250\n")
    found = CxlSerialMatcher(host.root).find(ident("cxl-memory", serial="0x10"))
    assert found is not None
    assert found.device_nodes == ()


# --- PCI id and slot -----------------------------------------------------------------------


def test_the_only_function_with_the_ids_is_found(host: FakeHost) -> None:
    host.pci("0000:3b:00.0", vendor="0x10de", device="0x20b5")
    host.pci("0000:5e:00.0", vendor="0x8086", device="0x0b60")
    found = PciIdSlotMatcher(host.root).find(
        ident("accelerator", pci_vendor_id="0x8086", pci_device_id="0x0B60")
    )
    assert found is not None
    assert found.pci_address == "0000:5e:00.0"
    assert found.matched_by == "pci-id-slot"


def test_two_functions_with_the_ids_and_no_slot_are_refused(host: FakeHost) -> None:
    host.pci("0000:3b:00.0").pci("0000:5e:00.0")
    matcher = PciIdSlotMatcher(host.root)
    identity = ident(pci_vendor_id="0x10de", pci_device_id="0x20b5")
    assert matcher.find(identity) is None
    assert matcher.explain(identity) == (
        "PCI function 0x10de:0x20b5 in /sys/bus/pci/devices/*/vendor,device is ambiguous: "
        "0000:3b:00.0, 0000:5e:00.0 and no slot to tell them apart"
    )


def test_the_slot_tells_two_functions_apart(host: FakeHost) -> None:
    host.pci("0000:3b:00.0").pci("0000:5e:00.0").slot("7", "0000:5e:00").slot("3", "0000:3b:00")
    found = PciIdSlotMatcher(host.root).find(
        ident(pci_vendor_id="0x10de", pci_device_id="0x20b5", slot="7")
    )
    assert found is not None
    assert found.pci_address == "0000:5e:00.0"


@pytest.mark.parametrize(
    ("slot", "address", "reason"),
    [
        ("9", None, "no slot '9' with an address in /sys/bus/pci/slots/*/address (2 functions"),
        ("9", "garbage", "no slot '9' with an address"),
        (
            "9",
            "0000:77:00",
            "no PCI function 0x10de:0x20b5 in /sys/bus/pci/devices/*/vendor,device "
            "in slot '9' (0000:77:00)",
        ),
        ("../../x", None, "pci-id-slot skipped: slot '../../x' is not a slot directory name"),
        ("..", None, "pci-id-slot skipped: slot '..' is not a slot directory name"),
    ],
)
def test_a_slot_that_does_not_hold_the_device_is_explained(
    host: FakeHost, slot: str, address: str | None, reason: str
) -> None:
    host.pci("0000:3b:00.0").pci("0000:5e:00.0")
    if address is not None:
        host.slot(slot, address)
    matcher = PciIdSlotMatcher(host.root)
    identity = ident(pci_vendor_id="0x10de", pci_device_id="0x20b5", slot=slot)
    assert matcher.find(identity) is None
    assert matcher.explain(identity).startswith(reason)


@pytest.mark.parametrize(
    ("vendor", "device", "reason"),
    [
        (None, "0x20b5", "no PCI vendor and device id"),
        ("0x10de", None, "no PCI vendor and device id"),
        ("10de", "0x20b5", "PCI ids '10de':'0x20b5' are not 0x and 4 hex digits"),
        ("0x10de", "0xzzzz", "PCI ids '0x10de':'0xzzzz' are not 0x and 4 hex digits"),
    ],
)
def test_missing_or_malformed_ids_skip_the_id_matcher(
    host: FakeHost, vendor: str | None, device: str | None, reason: str
) -> None:
    host.pci("0000:3b:00.0")
    matcher = PciIdSlotMatcher(host.root)
    identity = ident(pci_vendor_id=vendor, pci_device_id=device)
    assert matcher.find(identity) is None
    assert matcher.explain(identity) == f"pci-id-slot skipped: {reason}"


def test_garbage_vendor_files_are_skipped(host: FakeHost) -> None:
    host.pci("0000:3b:00.0").pci("0000:5e:00.0")
    (host.root / "sys/devices/pci0000:00/0000:3b:00.0/vendor").write_text("nvidia\n")
    found = PciIdSlotMatcher(host.root).find(ident(pci_vendor_id="0x10de", pci_device_id="0x20b5"))
    assert found is not None
    assert found.pci_address == "0000:5e:00.0"


# --- matchers by type ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_type", "names"),
    [
        ("nvme", ["nvme-serial", "uuid", "pci-dsn"]),
        ("gpu", ["uuid", "pci-dsn", "pci-id-slot"]),
        ("FPGA", ["uuid", "pci-dsn", "pci-id-slot"]),
        ("accelerator", ["uuid", "pci-dsn", "pci-id-slot"]),
        ("cxl-memory", ["cxl-serial", "pci-dsn"]),
        ("nic", ["pci-dsn", "pci-id-slot"]),
        ("drive", ["pci-dsn", "pci-id-slot"]),
    ],
)
def test_matchers_are_tried_in_the_order_of_the_type(device_type: str, names: list[str]) -> None:
    assert [m.name for m in matchers_for(device_type)] == names


# --- locate --------------------------------------------------------------------------------


class FakeTime:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def test_a_present_device_is_located_at_once(host: FakeHost) -> None:
    host.nvme(0, serial="S1")
    fake = FakeTime()
    found = await locate(
        ident("nvme", serial="S1"),
        host_root=host.root,
        timeout_s=30,
        poll_s=0.5,
        rescan=False,
        clock=fake.clock,
        sleep=fake.sleep,
    )
    assert found.matched_by == "nvme-serial"
    assert fake.sleeps == []


async def test_a_missing_device_times_out_saying_what_was_looked_for(host: FakeHost) -> None:
    host.pci("0000:3b:00.0", dsn=0x42)
    fake = FakeTime()
    identity = ident("gpu", uuid=GPU_UUID, serial=format_dsn(DSN))
    with pytest.raises(DeviceNotFound) as caught:
        await locate(
            identity,
            host_root=host.root,
            timeout_s=30,
            poll_s=4,
            rescan=False,
            clock=fake.clock,
            sleep=fake.sleep,
        )
    assert str(caught.value) == (
        f"device gpu-1 (gpu) not found on this host after 30 s (host root {host.root}): "
        f"no uuid {GPU_UUID} in /sys/class/nvme/*/nvme*n*/uuid or "
        "/proc/driver/nvidia/gpus/*/information; "
        "no DSN 00-11-22-33-44-55-66-77 in /sys/bus/pci/devices/*/config "
        "(1 of 1 functions readable); "
        "pci-id-slot skipped: no PCI vendor and device id"
    )
    assert caught.value.identity == identity
    assert sum(fake.sleeps) == 30
    assert max(fake.sleeps) <= 4


async def test_a_failed_rescan_is_logged_and_the_wait_goes_on(
    host: FakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeTime()
    with (
        caplog.at_level(logging.WARNING, "app.node.finder"),
        pytest.raises(DeviceNotFound) as caught,
    ):
        await locate(
            ident("nvme", serial="S1"),
            host_root=host.root,
            timeout_s=2,
            poll_s=1,
            rescan=True,
            clock=fake.clock,
            sleep=fake.sleep,
        )
    assert "could not request a PCI rescan" in caplog.text
    assert "PCI rescan through" in str(caught.value)
    assert "failed: No such file or directory" in str(caught.value)
    assert not (host.root / "sys/bus/pci/rescan").exists()
    assert fake.sleeps == [1, 1]


async def test_a_device_that_appears_after_the_rescan_is_found(host: FakeHost) -> None:
    rescan = host.write("/sys/bus/pci/rescan", "")
    fake = FakeTime()

    async def sleep(seconds: float) -> None:
        # The kernel's rescan brings the function up; its driver binds a little later.
        await fake.sleep(seconds)
        if rescan.read_text() == "1" and len(fake.sleeps) == 2:
            host.nvme(0, serial="S1")

    found = await locate(
        ident("nvme", serial="S1"),
        host_root=host.root,
        timeout_s=30,
        poll_s=0.5,
        rescan=True,
        clock=fake.clock,
        sleep=sleep,
    )
    assert found.sysfs_path == "/sys/class/nvme/nvme0"
    assert rescan.read_text() == "1"
    assert fake.sleeps == [0.5, 0.5]


async def test_no_rescan_is_written_when_the_device_is_there_or_rescan_is_off(
    host: FakeHost,
) -> None:
    rescan = host.write("/sys/bus/pci/rescan", "")
    fake = FakeTime()
    with pytest.raises(DeviceNotFound):
        await locate(
            ident("nvme", serial="S1"),
            host_root=host.root,
            timeout_s=1,
            poll_s=1,
            rescan=False,
            clock=fake.clock,
            sleep=fake.sleep,
        )
    host.nvme(0, serial="S1")
    await locate(
        ident("nvme", serial="S1"),
        host_root=host.root,
        timeout_s=1,
        poll_s=1,
        rescan=True,
        clock=fake.clock,
        sleep=fake.sleep,
    )
    assert rescan.read_text() == ""


class Flaky:
    """A matcher from outside that fails once, then finds the device."""

    name = "flaky"

    def __init__(self, device: HostDevice) -> None:
        self.device = device
        self.calls = 0

    def find(self, identity: DeviceIdentity) -> HostDevice | None:
        self.calls += 1
        if self.calls == 1:
            raise OSError("EIO")
        return self.device

    def explain(self, identity: DeviceIdentity) -> str:
        return "flaky"


async def test_a_failing_matcher_does_not_end_the_wait(host: FakeHost) -> None:
    identity = ident("nic")
    device = HostDevice(identity, "flaky", "/sys/x", None, ())
    fake = FakeTime()
    matcher = Flaky(device)
    found = await locate(
        identity,
        host_root=host.root,
        timeout_s=5,
        poll_s=1,
        rescan=False,
        matchers=[matcher],
        clock=fake.clock,
        sleep=fake.sleep,
    )
    assert found is device
    assert matcher.calls == 2


@pytest.mark.parametrize(("timeout_s", "poll_s"), [(-1, 1), (5, 0), (5, -0.5)])
async def test_a_bad_wait_is_refused(host: FakeHost, timeout_s: float, poll_s: float) -> None:
    with pytest.raises(ValueError, match="must be >= 0 and poll interval"):
        await locate(
            ident("nvme", serial="S1"),
            host_root=host.root,
            timeout_s=timeout_s,
            poll_s=poll_s,
            rescan=False,
        )


# --- the vendor hook -----------------------------------------------------------------------


def script(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def test_a_hook_gets_the_device_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    device = HostDevice(
        ident("gpu"), "uuid", "/sys/bus/pci/devices/0000:3b:00.0", "0000:3b:00.0", ()
    )
    code = (
        "import json, os, sys; json.dump({k: v for k, v in os.environ.items() "
        "if k.startswith(('FABRIC_DRA_', 'EXTRA'))}, open(sys.argv[1], 'w'))"
    )
    await run_hook([*script(code), str(out)], {"EXTRA": "yes"}, 30, device=device)
    # What the hook inherits from this process as it is (FABRIC_DRA_TEST_DATABASES, say)
    # is not what the hook was given.
    given = {k: v for k, v in json.loads(out.read_text()).items() if os.environ.get(k) != v}
    assert given == {
        "EXTRA": "yes",
        "FABRIC_DRA_DEVICE": "gpu-1",
        "FABRIC_DRA_PCI_ADDRESS": "0000:3b:00.0",
        "FABRIC_DRA_DEVICE_TYPE": "gpu",
    }


def test_the_hook_environment_of_a_device_without_pci_address() -> None:
    device = HostDevice(ident("nvme"), "nvme-serial", "/sys/class/nvme/nvme0", None, ())
    assert hook_environment(device)["FABRIC_DRA_PCI_ADDRESS"] == ""


async def test_a_failing_hook_reports_its_status_and_last_stderr_line() -> None:
    code = (
        "import sys; print('first', file=sys.stderr); "
        "print('card 3 is busy\\n\\n', file=sys.stderr); sys.exit(3)"
    )
    with pytest.raises(HookFailed) as caught:
        await run_hook(script(code), {}, 30)
    assert str(caught.value) == f"hook {sys.executable!r} exited with status 3: card 3 is busy"


async def test_a_hooks_stderr_line_is_bounded_in_the_message() -> None:
    code = "import sys; sys.stderr.write('x' * 20000); sys.exit(1)"
    with pytest.raises(HookFailed) as caught:
        await run_hook(script(code), {}, 30)
    message = str(caught.value)
    assert message.endswith("x" * 500)
    assert "x" * 501 not in message
    assert "\n" not in message


async def test_a_silent_failing_hook_says_so() -> None:
    with pytest.raises(HookFailed, match=r"status 2: \(no output on stderr\)$"):
        await run_hook(script("raise SystemExit(2)"), {}, 30)


async def test_a_hook_killed_by_a_signal_names_it() -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    with pytest.raises(HookFailed, match="killed by signal SIGTERM"):
        await run_hook(script(code), {}, 30)


async def test_a_hook_that_runs_too_long_is_killed_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); "
        "print('still waiting for the card', file=sys.stderr, flush=True); time.sleep(600)"
    )
    with pytest.raises(HookFailed) as caught:
        await run_hook(script(code), {}, 1.5)
    assert str(caught.value) == (
        f"hook {sys.executable!r} did not finish within 1.5 s and was killed: "
        "still waiting for the card"
    )
    child = int(pid_file.read_text())

    def child_gone() -> bool:
        # Killed with the group: gone, or a zombie waiting for its new parent to reap it.
        try:
            return Path(f"/proc/{child}/stat").read_text().split(") ", 1)[1].startswith("Z")
        except FileNotFoundError:
            return True

    await eventually(child_gone, what="the hook's child to be killed")


async def test_a_missing_hook_executable_is_reported(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-hook")
    with pytest.raises(HookFailed, match=r"could not start: No such file or directory"):
        await run_hook([missing], {}, 30)
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\n")
    with pytest.raises(HookFailed, match=r"could not start: Permission denied"):
        await run_hook([str(plain)], {}, 30)


async def test_an_empty_hook_command_is_refused() -> None:
    with pytest.raises(HookFailed, match="hook command is empty"):
        await run_hook([], {}, 30)
    with pytest.raises(HookFailed, match="hook command is empty"):
        await run_hook([""], {}, 30)
