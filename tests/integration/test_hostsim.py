"""The host simulator (:mod:`fabric_dra_sim.hostsim`) behind the end of ``fabric-dra demo``'s
story: a device appears on a node's fake host while the Redfish simulator has it attached to
that node's server, and goes when detached. Checked in process, against the node plugin's real
finder (:func:`app.node.finder.locate`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from builders import eventually

from app.node.finder import DeviceNotFound, locate
from app.node.identity import DeviceIdentity, HostDevice
from fabric_dra_sim.fakehost import FakeHost
from fabric_dra_sim.hostsim import HostSim
from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

GPU_BLOCK = "/redfish/v1/CompositionService/ResourceBlocks/us-east-rack-01-gpu-00"
NVME_BLOCK = "/redfish/v1/CompositionService/ResourceBlocks/us-east-rack-01-nvme-01"
CXL_BLOCK = "/redfish/v1/CompositionService/ResourceBlocks/us-east-rack-01-cxl-memory-02"
FPGA_BLOCK = "/redfish/v1/CompositionService/ResourceBlocks/us-east-rack-01-fpga-03"
HOST_1 = "node-us-east-rack-01-1"
HOST_2 = "node-us-east-rack-01-2"


def small_fabric() -> RedfishSimulator:
    """Two servers and one device of each type (GPU, NVMe, CXL memory, FPGA); not served."""
    spec = InventorySpec(
        regions=1,
        racks_per_region=1,
        devices_per_rack=4,
        hosts_per_rack=2,
        device_mix="mixed",
        seed=1,
    )
    return RedfishSimulator(spec=spec)


def device_of(fabric: RedfishSimulator, block: str) -> dict[str, object]:
    block_body = fabric.tree[block]
    for key in ("Processors", "Drives", "Memory"):
        for ref in block_body.get(key) or ():
            body: dict[str, object] = fabric.tree[ref["@odata.id"]]
            return body
    raise AssertionError(f"no device in {block}")


def host_files(host: FakeHost) -> set[str]:
    return {str(p.relative_to(host.root)) for p in host.root.rglob("*")}


@pytest.fixture
def hosts(tmp_path: Path) -> dict[str, tuple[str, FakeHost]]:
    return {
        "worker-1": (HOST_1, FakeHost(tmp_path / "one")),
        "worker-2": (HOST_2, FakeHost(tmp_path / "two")),
    }


async def find(
    host: FakeHost, device_type: str, uuid: str | None = None, serial: str | None = None
) -> HostDevice:
    wanted = DeviceIdentity(pool="p", device="d", device_type=device_type, uuid=uuid, serial=serial)
    return await locate(wanted, host_root=host.root, timeout_s=0, poll_s=0.1, rescan=False)


async def test_an_attached_gpu_appears_on_its_node_only_and_goes_when_detached(
    hosts: dict[str, tuple[str, FakeHost]],
) -> None:
    fabric = small_fabric()
    sim = HostSim(fabric, hosts)
    one, two = hosts["worker-1"][1], hosts["worker-2"][1]
    empty = host_files(one)
    sim.sync_once()
    assert sim.shown == {}
    fabric.attach_out_of_band(GPU_BLOCK, HOST_1)
    sim.sync_once()
    assert list(sim.shown) == [("worker-1", GPU_BLOCK)]
    uuid = str(device_of(fabric, GPU_BLOCK)["UUID"])
    found = await find(one, device_type="gpu", uuid=uuid)
    assert found.matched_by == "uuid"
    paths = {(n.path, n.type, n.major, n.minor) for n in found.device_nodes}
    assert ("/dev/nvidia0", "c", 195, 0) in paths
    assert ("/dev/nvidiactl", "c", 195, 255) in paths
    with pytest.raises(DeviceNotFound):
        await find(two, device_type="gpu", uuid=uuid)
    fabric.detach_out_of_band(GPU_BLOCK)
    sim.sync_once()
    assert sim.shown == {}
    assert host_files(one) == empty
    with pytest.raises(DeviceNotFound):
        await find(one, device_type="gpu", uuid=uuid)


async def test_nvme_and_two_devices_on_one_host_get_their_own_addresses(
    hosts: dict[str, tuple[str, FakeHost]],
) -> None:
    fabric = small_fabric()
    sim = HostSim(fabric, hosts)
    fabric.attach_out_of_band(GPU_BLOCK, HOST_2)
    fabric.attach_out_of_band(NVME_BLOCK, HOST_2)
    sim.sync_once()
    two = hosts["worker-2"][1]
    addresses = {s.pci_address for s in sim.shown.values()}
    assert len(addresses) == 2
    serial = str(device_of(fabric, NVME_BLOCK)["SerialNumber"])
    found = await find(two, device_type="nvme", serial=serial)
    assert found.matched_by == "nvme-serial"
    assert found.pci_address in addresses
    # The GPU leaves; the drive stays findable.
    fabric.detach_out_of_band(GPU_BLOCK)
    sim.sync_once()
    assert list(sim.shown) == [("worker-2", NVME_BLOCK)]
    assert (await find(two, device_type="nvme", serial=serial)).matched_by == "nvme-serial"


@pytest.mark.parametrize(
    ("block", "edit", "expected"),
    [
        (GPU_BLOCK, {"UUID": None}, "the GPU has no UUID"),
        (NVME_BLOCK, {"SerialNumber": ""}, "the NVMe drive has no SerialNumber"),
        (CXL_BLOCK, {}, "CXL memory SerialNumber 'CX"),
        (FPGA_BLOCK, {}, "fpga SerialNumber 'FPGA"),
    ],
    ids=["gpu-without-uuid", "nvme-without-serial", "cxl-serial-not-a-number", "fpga-no-dsn"],
)
async def test_a_device_the_host_could_not_show_is_skipped_and_said_once(
    hosts: dict[str, tuple[str, FakeHost]], block: str, edit: dict[str, object], expected: str
) -> None:
    fabric = small_fabric()
    device = device_of(fabric, block)
    for key, value in edit.items():
        if value is None:
            device.pop(key)
        else:
            device[key] = value
    sim = HostSim(fabric, hosts)
    one = hosts["worker-1"][1]
    before = host_files(one)
    fabric.attach_out_of_band(block, HOST_1)
    sim.sync_once()
    sim.sync_once()
    assert sim.shown == {}
    assert host_files(one) == before
    assert len(sim.notes) == 1, sim.notes
    assert sim.notes[0].startswith(f"node worker-1: device of {block} not shown on the host: ")
    assert expected in sim.notes[0], sim.notes[0]


@pytest.mark.parametrize(
    ("block", "serial", "device_type", "matched_by"),
    [
        (CXL_BLOCK, "0x1122334455667788", "cxl-memory", "cxl-serial"),
        (FPGA_BLOCK, "00-11-22-33-44-55-66-77", "fpga", "pci-dsn"),
    ],
    ids=["cxl-with-a-numeric-serial", "fpga-with-a-dsn-serial"],
)
async def test_a_serial_the_host_can_show_is_found_by_the_finder(
    hosts: dict[str, tuple[str, FakeHost]],
    block: str,
    serial: str,
    device_type: str,
    matched_by: str,
) -> None:
    fabric = small_fabric()
    device = device_of(fabric, block)
    device["SerialNumber"] = serial
    device.pop("UUID", None)
    sim = HostSim(fabric, hosts)
    fabric.attach_out_of_band(block, HOST_1)
    sim.sync_once()
    found = await find(hosts["worker-1"][1], device_type=device_type, serial=serial)
    assert found.matched_by == matched_by


async def test_the_host_simulator_follows_the_fabric_while_running(
    hosts: dict[str, tuple[str, FakeHost]],
) -> None:
    fabric = small_fabric()
    sim = HostSim(fabric, hosts, poll_s=0.05)
    await sim.start()
    try:
        fabric.attach_out_of_band(NVME_BLOCK, HOST_1)
        await eventually(lambda: ("worker-1", NVME_BLOCK) in sim.shown, what="the drive shown")
        fabric.detach_out_of_band(NVME_BLOCK)
        await eventually(lambda: not sim.shown, what="the drive gone")
    finally:
        await sim.stop()


@pytest.mark.parametrize(
    ("mapping", "poll_s", "expected"),
    [
        ({"worker-1": HOST_1}, 0.0, "poll_s must be > 0, got 0.0"),
        (
            {"worker-1": HOST_1, "worker-2": HOST_1},
            0.1,
            f"nodes worker-1 and worker-2 both map to fabric host {HOST_1}",
        ),
    ],
    ids=["no-poll-interval", "two-nodes-one-server"],
)
def test_the_host_simulator_refuses_bad_arguments(
    tmp_path: Path, mapping: dict[str, str], poll_s: float, expected: str
) -> None:
    hosts = {node: (host, FakeHost(tmp_path / node)) for node, host in mapping.items()}
    with pytest.raises(ValueError, match=re.escape(expected)):
        HostSim(small_fabric(), hosts, poll_s=poll_s)
