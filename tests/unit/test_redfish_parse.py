"""Redfish payload parsing, against the DMTF mockups and hand-made bad data."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from builders import REDFISH_DATA
from hypothesis import given
from hypothesis import strategies as st

from app.fabric.errors import (
    FabricAuthError,
    FabricConflict,
    FabricError,
    FabricInvalidData,
    FabricNotFound,
    FabricPreconditionFailed,
    FabricTimeout,
    FabricUnavailable,
)
from app.fabric.redfish.parse.blocks import BlockInfo, DeviceSource, block_hosts, parse_block
from app.fabric.redfish.parse.chassis import ChassisPlace, location_from_chain, parse_chassis
from app.fabric.redfish.parse.collection import parse_collection_page
from app.fabric.redfish.parse.common import MAX_STRING_BYTES, BadItem, text
from app.fabric.redfish.parse.devices import (
    KIND_PARSERS,
    DeviceContext,
    parse_device,
    parse_simple_storage,
    storage_drive_links,
)
from app.fabric.redfish.parse.errors import error_from_response
from app.fabric.redfish.parse.headers import parse_retry_after
from app.fabric.redfish.parse.systems import host_from_system, parse_system
from app.fabric.redfish.parse.tasks import parse_task
from app.fabric.types import DeviceType, Health, Location, OperationState

DATA = REDFISH_DATA
COMPOSABILITY = DATA / "dmtf-public-composability"
BLADED = DATA / "dmtf-public-bladed-partitions"
LOCATIONS = DATA / "dmtf-location-examples"
BLOCKS = "/redfish/v1/CompositionService/ResourceBlocks"


def mockup(folder: Path, uri: str) -> dict[str, Any]:
    """The resource at ``uri`` in a DMTF mockup folder (``<uri>/index.json``)."""
    path = folder / uri.strip("/") / "index.json"
    assert path.is_file(), f"mockup file {path} is missing (set REDFISH_DATA_DIR)"
    loaded = json.loads(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def block_of(uri: str, folder: Path = COMPOSABILITY) -> BlockInfo:
    return parse_block(mockup(folder, uri), uri)


def gpu_payload(**changes: Any) -> dict[str, Any]:
    """A valid GPU Processor payload, with ``changes`` applied (None deletes a key)."""
    payload: dict[str, Any] = {
        "@odata.id": f"{BLOCKS}/B/Processors/GPU0",
        "Id": "GPU0",
        "ProcessorType": "GPU",
        "Manufacturer": "Vendor",
        "Model": "Model X",
        "SerialNumber": "S1",
        "ProcessorMemory": [{"CapacityMiB": 40960}, {"CapacityMiB": 40960}],
        "Status": {"State": "Enabled", "Health": "OK"},
    }
    for key, value in changes.items():
        if value is None:
            payload.pop(key, None)
        else:
            payload[key] = value
    return payload


def gpu_context() -> DeviceContext:
    return DeviceContext(BlockInfo(uri=f"{BLOCKS}/B", block_types=("Processor",)))


# --- location -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mockup_folder", "uri", "expected"),
    [
        pytest.param(
            "public-telemetry",
            "/redfish/v1/Chassis/1",
            Location(region="TX", site="Houston", row="North", rack="WEB43", chassis="1"),
            id="postal-address-territory-city-and-placement",
        ),
        pytest.param(
            "public-tower",
            "/redfish/v1/Chassis/Tower",
            Location(region="TN", site="Memphis", chassis="Tower"),
            id="postal-address-only",
        ),
        pytest.param(
            "public-rackmount1",
            "/redfish/v1/Chassis/1U",
            Location(
                region="Oregon",
                site="Onsite-Main",
                zone="35",
                row="North",
                rack="WEB43",
                chassis="1U",
            ),
            id="physical-address-and-placement-room-facility",
        ),
        pytest.param(
            "public-pdu",
            "/redfish/v1/Chassis/TransferSwitch1",
            Location(region="OR", site="3A", zone="213", row="North", chassis="TransferSwitch1"),
            id="building-and-room-win-over-city",
        ),
        pytest.param(
            "public-power-shelf",
            "/redfish/v1/Chassis/PowerShelf",
            Location(row="North 1", rack="42", chassis="PowerShelf"),
            id="placement-only",
        ),
    ],
)
def test_location_examples_map_by_the_documented_rule(
    mockup_folder: str, uri: str, expected: Location
) -> None:
    place = parse_chassis(mockup(LOCATIONS / mockup_folder, uri), uri)
    assert location_from_chain([place]) == expected


def test_location_takes_each_part_from_the_nearest_chassis_that_has_it() -> None:
    enclosure = ChassisPlace(chassis_id="encl-1", slot="bay-3", region=None)
    rack = ChassisPlace(chassis_id="r7", chassis_type="Rack", region="us-east", row="row-2")
    group = ChassisPlace(chassis_id="pod-a", chassis_type="RackGroup", region="ignored")
    location = location_from_chain([enclosure, rack, group], fabric="zone-1")
    # The enclosure's own PartLocation is where the enclosure sits, not a device's slot.
    assert location == Location(
        region="us-east", row="row-2", rack="r7", chassis="encl-1", slot=None, fabric="zone-1"
    )
    # A host's chassis is the host itself: its PartLocation is the host's slot.
    assert location_from_chain([enclosure, rack, group], chassis_slot=True).slot == "bay-3"


def test_row_falls_back_to_the_rack_group_id_and_rack_to_the_rack_id() -> None:
    chain = [
        ChassisPlace(chassis_id="encl"),
        ChassisPlace(chassis_id="rack-09", chassis_type="Rack"),
        ChassisPlace(chassis_id="row-c", chassis_type="RackGroup"),
    ]
    location = location_from_chain(chain)
    assert (location.row, location.rack) == ("row-c", "rack-09")


def test_placement_rack_wins_over_the_rack_chassis_id() -> None:
    chain = [
        ChassisPlace(chassis_id="encl", rack="R1"),
        ChassisPlace(chassis_id="rack-chassis", chassis_type="Rack"),
    ]
    assert location_from_chain(chain).rack == "R1"


def test_a_device_with_no_chassis_keeps_only_its_fabric() -> None:
    assert location_from_chain([], fabric="2") == Location(fabric="2")


def test_chassis_id_comes_from_the_resource_not_its_wrong_odata_id() -> None:
    uri = "/redfish/v1/Chassis/ComposableModule7"
    payload = mockup(COMPOSABILITY, uri)
    assert payload["@odata.id"].endswith("ComposableModule6")  # the mockup's copy-paste error
    place = parse_chassis(payload, uri)
    assert place.chassis_id == "ComposableModule7"
    assert place.contained_by == "/redfish/v1/Chassis/ComposableEnclosure"


@pytest.mark.parametrize(
    ("location", "kind"),
    [
        pytest.param({"PostalAddress": {"Territory": 5}}, "bad-type", id="territory-not-string"),
        pytest.param({"Placement": "rack 4"}, "bad-type", id="placement-not-object"),
        pytest.param({"Placement": {"Rack": "x" * 2000}}, "bad-value", id="rack-over-1kib"),
        pytest.param(
            {"PartLocation": {"LocationOrdinalValue": -1}}, "bad-value", id="negative-ordinal"
        ),
    ],
)
def test_bad_location_data_is_a_bad_item(location: dict[str, Any], kind: str) -> None:
    with pytest.raises(BadItem) as caught:
        parse_chassis({"@odata.id": "/c", "Id": "c", "Location": location}, "/c")
    assert caught.value.kind == kind
    assert "\n" not in caught.value.reason


def test_chassis_body_that_is_not_an_object_is_a_bad_item() -> None:
    with pytest.raises(BadItem, match="not a JSON object"):
        parse_chassis(["not", "an", "object"], "/c")


# --- blocks and hosts ---------------------------------------------------------------------


def test_offload_block_links_its_gpu_zone_and_chassis() -> None:
    block = block_of(f"{BLOCKS}/OffloadBlock9")
    assert block.device_links == (
        (DeviceSource.PROCESSOR, f"{BLOCKS}/OffloadBlock9/Processors/Block9GPU"),
    )
    assert block.fabric == "2"
    assert block.chassis == ("/redfish/v1/Chassis/ComposableModule6",)
    assert not block.is_compute
    assert not block.shareable


def test_sharing_needs_both_capable_and_enabled() -> None:
    assert block_of(f"{BLOCKS}/DriveBlock3").shareable
    payload = mockup(COMPOSABILITY, f"{BLOCKS}/DriveBlock3")
    payload["CompositionStatus"]["SharingEnabled"] = False
    assert not parse_block(payload, f"{BLOCKS}/DriveBlock3").shareable


def test_system_blocks_are_compute_with_no_devices() -> None:
    block = block_of(f"{BLOCKS}/SystemBlock11")
    assert block.is_compute
    assert block.device_links == ()
    assert block.linked_systems == ()


def systems_index(folder: Path) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    members = mockup(folder, "/redfish/v1/Systems")["Members"]
    systems = [parse_system(mockup(folder, m["@odata.id"]), m["@odata.id"]) for m in members]
    return {s.uri: s.resource_blocks for s in systems}, {s.uri: s.host_id for s in systems}


def test_shared_block_is_held_by_both_systems_in_link_order() -> None:
    by_system, ids = systems_index(COMPOSABILITY)
    assert block_hosts(block_of(f"{BLOCKS}/DriveBlock3"), by_system, ids) == (
        "ComposedSystem",
        "ComposedSystem2",
    )


def test_top_level_computer_systems_counts_only_when_the_system_lists_the_block() -> None:
    by_system, ids = systems_index(COMPOSABILITY)
    # SystemBlock12 names its System only in a top-level ComputerSystems array; the System
    # lists the block back, so it is held.
    assert block_hosts(block_of(f"{BLOCKS}/SystemBlock12"), by_system, ids) == (
        "SystemAfterAddResourceAction",
    )
    # Without the System's confirmation the top-level array alone says nothing.
    assert block_hosts(block_of(f"{BLOCKS}/SystemBlock12"), {}, {}) == ()


def test_unused_block_has_no_host_whatever_its_composition_state_says() -> None:
    by_system, ids = systems_index(COMPOSABILITY)
    payload = mockup(COMPOSABILITY, f"{BLOCKS}/OffloadBlock9")
    payload["CompositionStatus"]["CompositionState"] = "Composed"
    assert block_hosts(parse_block(payload, f"{BLOCKS}/OffloadBlock9"), by_system, ids) == ()


def test_holder_missing_from_the_systems_listing_is_named_by_its_uri() -> None:
    block = BlockInfo(uri="/b", linked_systems=("/redfish/v1/Systems/ghost",))
    assert block_hosts(block, {}, {}) == ("ghost",)


def test_bladed_block_is_held_by_its_linked_partition() -> None:
    by_system, ids = systems_index(BLADED)
    block = block_of(f"{BLOCKS}/BladeComputeBlock1", BLADED)
    assert block_hosts(block, by_system, ids) == ("ComposedPartition1",)


def test_storage_drives_are_the_same_uris_as_the_block_drives() -> None:
    block = block_of(f"{BLOCKS}/BladeStorageBlock8", BLADED)
    storage_uri = block.storage[0]
    drives = storage_drive_links(mockup(BLADED, storage_uri), storage_uri)
    assert set(drives) == {uri for _, uri in block.device_links}


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        pytest.param({"@odata.id": None}, "missing-field", id="missing-odata-id"),
        pytest.param({"ResourceBlockType": "Processor"}, "bad-type", id="type-not-array"),
        pytest.param({"Processors": {"x": 1}}, "missing-field", id="link-without-odata-id"),
        pytest.param({"Processors": ["/a/b"]}, "bad-type", id="link-not-object"),
        pytest.param({"Links": []}, "bad-type", id="links-not-object"),
        pytest.param(
            {"CompositionStatus": {"SharingCapable": "yes"}}, "bad-type", id="flag-not-boolean"
        ),
    ],
)
def test_bad_block_data_is_a_bad_item(change: dict[str, Any], kind: str) -> None:
    payload = mockup(COMPOSABILITY, f"{BLOCKS}/OffloadBlock9")
    for key, value in change.items():
        if value is None:
            del payload[key]
        else:
            payload[key] = value
    with pytest.raises(BadItem) as caught:
        parse_block(payload, f"{BLOCKS}/OffloadBlock9")
    assert caught.value.kind == kind


def test_expandable_system_advertises_both_actions() -> None:
    uri = "/redfish/v1/Systems/SystemAfterAddResourceAction"
    system = parse_system(mockup(COMPOSABILITY, uri), uri)
    assert system.add_target == f"{uri}/Actions/ComputerSystem.AddResourceBlock"
    assert system.remove_target == f"{uri}/Actions/ComputerSystem.RemoveResourceBlock"
    assert system.resource_blocks == (f"{BLOCKS}/SystemBlock12", f"{BLOCKS}/DriveBlock10")
    host = host_from_system(system, Location(rack="r1"))
    assert host.host_id == "SystemAfterAddResourceAction"
    assert host.hostname == "SystemAfterAddResourceAction"
    assert host.attached_units == system.resource_blocks
    assert host.location.rack == "r1"


def test_system_without_actions_or_blocks_parses() -> None:
    uri = "/redfish/v1/Systems/SystemPreResourceBlock"
    system = parse_system(mockup(COMPOSABILITY, uri), uri)
    assert (system.add_target, system.remove_target, system.resource_blocks) == (None, None, ())


def test_system_with_a_non_string_hostname_is_a_bad_item() -> None:
    uri = "/redfish/v1/Systems/ComposedSystem"
    payload = mockup(COMPOSABILITY, uri)
    payload["HostName"] = ["a"]
    with pytest.raises(BadItem, match="HostName"):
        parse_system(payload, uri)


# --- devices ------------------------------------------------------------------------------


def test_mockup_gpu_becomes_a_gpu_device() -> None:
    block = block_of(f"{BLOCKS}/OffloadBlock9")
    source, uri = block.device_links[0]
    location = Location(chassis="ComposableModule6", fabric="2")
    device = parse_device(
        mockup(COMPOSABILITY, uri), uri, source, DeviceContext(block, location, None)
    )
    assert device is not None
    assert device.device_type is DeviceType.GPU
    assert device.vendor_id == uri
    assert device.attach_unit == f"{BLOCKS}/OffloadBlock9"
    assert (device.vendor, device.model) == ("Contoso Graphics", "Contoso Workstation VID2000")
    assert device.health is Health.OK
    assert device.state == "Enabled"
    assert device.location == location
    assert device.host_id is None


def test_mockup_nvme_drive_reports_capacity_in_bytes() -> None:
    block = block_of(f"{BLOCKS}/DriveBlock3")
    source, uri = block.device_links[0]
    device = parse_device(
        mockup(COMPOSABILITY, uri), uri, source, DeviceContext(block, host_id="ComposedSystem")
    )
    assert device is not None
    assert device.device_type is DeviceType.NVME
    assert device.capacity == {"capacity_bytes": 274877906944}
    assert device.shareable
    assert device.host_id == "ComposedSystem"


def test_compute_block_parts_are_not_devices() -> None:
    block = block_of(f"{BLOCKS}/ComputeBlock1")
    context = DeviceContext(block)
    for source, uri in block.device_links:
        assert parse_device(mockup(COMPOSABILITY, uri), uri, source, context) is None


def test_gpu_in_a_compute_block_is_not_a_device() -> None:
    # A Compute block is a server's own: none of its parts is composable, not even a GPU.
    block = BlockInfo(uri="/b", block_types=("Compute",))
    device = parse_device(
        gpu_payload(), "/b/Processors/GPU0", DeviceSource.PROCESSOR, DeviceContext(block)
    )
    assert device is None


def test_processor_memory_is_summed_in_mib() -> None:
    device = parse_device(gpu_payload(), "/d", DeviceSource.PROCESSOR, gpu_context())
    assert device is not None
    assert device.memory_mib == 81920


def test_memory_summary_is_the_fallback_for_gpu_memory() -> None:
    payload = gpu_payload(ProcessorMemory=None, MemorySummary={"TotalMemorySizeMiB": 16384})
    device = parse_device(payload, "/d", DeviceSource.PROCESSOR, gpu_context())
    assert device is not None
    assert device.memory_mib == 16384


def test_device_slot_wins_over_the_chassis_slot() -> None:
    payload = gpu_payload(Location={"PartLocation": {"ServiceLabel": "GPU bay 4"}})
    context = DeviceContext(gpu_context().block, Location(chassis="e", slot="e-slot"))
    device = parse_device(payload, "/d", DeviceSource.PROCESSOR, context)
    assert device is not None
    assert device.location == Location(chassis="e", slot="GPU bay 4")


def test_drive_physical_location_ordinal_is_the_slot_and_array_location_is_ignored() -> None:
    payload = {
        "@odata.id": "/d",
        "Protocol": "SAS",
        "PhysicalLocation": {"PartLocation": {"LocationOrdinalValue": 7}},
        "Location": [{"Info": "legacy"}],
        "Revision": "100A",
    }
    block = BlockInfo(uri="/b", block_types=("Storage",))
    device = parse_device(payload, "/d", DeviceSource.DRIVE, DeviceContext(block))
    assert device is not None
    assert device.device_type is DeviceType.DRIVE
    assert device.location.slot == "7"
    assert device.firmware_version == "100A"


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param({"CapacityMiB": 65536, "CXL": {}}, DeviceType.CXL_MEMORY, id="cxl"),
        pytest.param({"CapacityMiB": 65536, "MemoryType": "DRAM"}, DeviceType.MEMORY, id="dram"),
    ],
)
def test_memory_blocks_give_memory_devices(payload: dict[str, Any], expected: DeviceType) -> None:
    block = BlockInfo(uri="/b", block_types=("Memory",))
    device = parse_device(
        {"@odata.id": "/m", **payload}, "/m", DeviceSource.MEMORY, DeviceContext(block)
    )
    assert device is not None
    assert (device.device_type, device.memory_mib) == (expected, 65536)


def test_network_interfaces_are_nics() -> None:
    block = block_of(f"{BLOCKS}/NetworkBlock8")
    source, uri = block.device_links[0]
    device = parse_device(mockup(COMPOSABILITY, uri), uri, source, DeviceContext(block))
    assert device is not None
    assert device.device_type is DeviceType.NIC
    assert device.attributes["speed_mbps"] == 100


MINIMAL_DEVICES = {
    DeviceSource.PROCESSOR: ({"ProcessorType": "GPU"}, DeviceType.GPU),
    DeviceSource.DRIVE: ({"Protocol": "NVMe"}, DeviceType.NVME),
    DeviceSource.MEMORY: ({}, DeviceType.MEMORY),
    DeviceSource.NETWORK_INTERFACE: ({}, DeviceType.NIC),
    DeviceSource.ETHERNET_INTERFACE: ({}, DeviceType.NIC),
}


@pytest.mark.parametrize("source", list(DeviceSource), ids=str)
def test_every_block_property_that_links_devices_has_a_parser(source: DeviceSource) -> None:
    """The parser table covers every DeviceSource: a minimal resource of each kind gives a
    device of that kind's type."""
    payload, expected = MINIMAL_DEVICES[source]
    assert source in KIND_PARSERS
    device = parse_device(
        {"@odata.id": "/d", **payload}, "/d", source, DeviceContext(BlockInfo(uri="/b"))
    )
    assert device is not None
    assert device.device_type is expected


def test_device_health_falls_back_to_the_block() -> None:
    block = BlockInfo(uri="/b", block_types=("Processor",), health=Health.CRITICAL, state="X")
    device = parse_device(
        gpu_payload(Status=None), "/d", DeviceSource.PROCESSOR, DeviceContext(block)
    )
    assert device is not None
    assert (device.health, device.state) == (Health.CRITICAL, "X")


def test_unknown_health_value_is_unknown_not_an_error() -> None:
    device = parse_device(
        gpu_payload(Status={"Health": "Degraded"}), "/d", DeviceSource.PROCESSOR, gpu_context()
    )
    assert device is not None
    assert device.health is Health.UNKNOWN


@pytest.mark.parametrize(
    ("change", "kind", "mentions"),
    [
        pytest.param({"@odata.id": None}, "missing-field", "@odata.id", id="missing-odata-id"),
        pytest.param({"ProcessorType": None}, "missing-field", "ProcessorType", id="no-type"),
        pytest.param({"Manufacturer": 42}, "bad-type", "Manufacturer", id="vendor-not-string"),
        pytest.param(
            {"Model": "m" * (MAX_STRING_BYTES + 1)}, "bad-value", "Model", id="model-over-1kib"
        ),
        pytest.param(
            {"SerialNumber": "é" * 513}, "bad-value", "SerialNumber", id="serial-over-1kib-in-utf8"
        ),
        pytest.param(
            {"ProcessorMemory": [{"CapacityMiB": -1}]},
            "bad-value",
            "CapacityMiB",
            id="negative-memory",
        ),
        pytest.param(
            {"ProcessorMemory": [{"CapacityMiB": True}]},
            "bad-type",
            "CapacityMiB",
            id="memory-is-boolean",
        ),
        pytest.param(
            {"ProcessorMemory": [{"CapacityMiB": 1.5}]},
            "bad-type",
            "CapacityMiB",
            id="memory-is-float",
        ),
        pytest.param(
            {"ProcessorMemory": {"CapacityMiB": 1}},
            "bad-type",
            "ProcessorMemory",
            id="memory-not-array",
        ),
        pytest.param(
            {"ProcessorMemory": [{"CapacityMiB": 2**63}]},
            "bad-value",
            "CapacityMiB",
            id="memory-beyond-int64",
        ),
        pytest.param({"Status": "OK"}, "bad-type", "Status", id="status-not-object"),
    ],
)
def test_bad_processor_data_is_a_bad_item(change: dict[str, Any], kind: str, mentions: str) -> None:
    with pytest.raises(BadItem) as caught:
        parse_device(gpu_payload(**change), "/d", DeviceSource.PROCESSOR, gpu_context())
    assert caught.value.kind == kind
    assert mentions in caught.value.reason
    assert "\n" not in caught.value.reason
    assert len(caught.value.reason) < 200


def test_negative_drive_capacity_is_a_bad_item() -> None:
    block = BlockInfo(uri="/b", block_types=("Storage",))
    with pytest.raises(BadItem, match="CapacityBytes") as caught:
        parse_device(
            {"@odata.id": "/d", "CapacityBytes": -5}, "/d", DeviceSource.DRIVE, DeviceContext(block)
        )
    assert caught.value.kind == "bad-value"


def test_device_body_that_is_not_an_object_is_a_bad_item() -> None:
    with pytest.raises(BadItem, match="not a JSON object"):
        parse_device([1, 2], "/d", DeviceSource.PROCESSOR, gpu_context())


def test_simple_storage_devices_get_json_pointer_ids_and_bad_entries_stay_apart() -> None:
    uri = f"{BLOCKS}/DriveBlock7/SimpleStorage/Block7SASTray"
    block = block_of(f"{BLOCKS}/DriveBlock7")
    payload = mockup(COMPOSABILITY, uri)
    payload["Devices"].append({"Name": "broken", "CapacityBytes": "big"})
    results = parse_simple_storage(payload, uri, DeviceContext(block))
    good = [r for r in results if not isinstance(r, tuple)]
    bad = [r for r in results if isinstance(r, tuple)]
    assert [d.vendor_id for d in good] == [f"{uri}#/Devices/{i}" for i in range(4)]
    assert all(d.capacity == {"capacity_bytes": 1099511627776} for d in good)
    assert all(d.attach_unit == f"{BLOCKS}/DriveBlock7" for d in good)
    assert bad[0][0] == f"{uri}#/Devices/4"
    assert bad[0][1].kind == "bad-type"


# --- collections --------------------------------------------------------------------------


def test_collection_members_are_listed_whatever_the_count_says() -> None:
    payload = mockup(COMPOSABILITY, "/redfish/v1/Systems")
    assert payload["Members@odata.count"] == 2
    page = parse_collection_page(payload, "/redfish/v1/Systems")
    assert len(page.members) == 5
    assert page.next_link is None


def test_collection_member_without_odata_id_is_reported_alone() -> None:
    page = parse_collection_page(
        {"Members": [{"@odata.id": "/a"}, {"x": 1}, "junk"], "Members@odata.nextLink": "/p2"},
        "/c",
    )
    assert page.members == ("/a",)
    assert [index for index, _ in page.bad_members] == [1, 2]
    assert page.next_link == "/p2"


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param([], id="not-an-object"),
        pytest.param({"Name": "no members"}, id="no-members"),
        pytest.param({"Members": {"@odata.id": "/a"}}, id="members-not-array"),
        pytest.param({"Members": [], "Members@odata.nextLink": 3}, id="next-link-not-string"),
    ],
)
def test_unusable_collection_page_is_invalid_data(payload: Any) -> None:
    with pytest.raises(FabricInvalidData, match="collection /c"):
        parse_collection_page(payload, "/c")


# --- errors, Retry-After, tasks -----------------------------------------------------------


def redfish_error(*message_ids: str, code: str = "Base.1.18.GeneralError") -> dict[str, Any]:
    return {
        "error": {
            "code": code,
            "message": "See @Message.ExtendedInfo.",
            "@Message.ExtendedInfo": [
                {"MessageId": m, "Message": f"text of {m}\nsecond line"} for m in message_ids
            ],
        }
    }


@pytest.mark.parametrize(
    ("status", "body", "expected", "vendor_code"),
    [
        pytest.param(401, None, FabricAuthError, None, id="401-auth"),
        pytest.param(
            403,
            redfish_error("Base.1.18.ResourceNotFound"),
            FabricAuthError,
            "Base.1.18.ResourceNotFound",
            id="403-stays-auth",
        ),
        pytest.param(
            404,
            redfish_error("Base.1.18.ResourceNotFound"),
            FabricNotFound,
            "Base.1.18.ResourceNotFound",
            id="404-not-found",
        ),
        pytest.param(
            409,
            redfish_error("Base.1.18.ResourceInUse"),
            FabricConflict,
            "Base.1.18.ResourceInUse",
            id="409-in-use",
        ),
        pytest.param(
            400,
            redfish_error("Base.1.8.ResourceInUse"),
            FabricConflict,
            "Base.1.8.ResourceInUse",
            id="400-with-resource-in-use-is-conflict",
        ),
        pytest.param(
            400,
            redfish_error("Base.1.18.PropertyUnknown", "Base.1.18.PreconditionFailed"),
            FabricPreconditionFailed,
            "Base.1.18.PreconditionFailed",
            id="first-known-message-decides",
        ),
        pytest.param(412, None, FabricPreconditionFailed, None, id="412"),
        pytest.param(
            428,
            redfish_error("Base.1.18.PreconditionRequired"),
            FabricPreconditionFailed,
            "Base.1.18.PreconditionRequired",
            id="428",
        ),
        pytest.param(
            400,
            redfish_error("Base.1.18.PropertyUnknown"),
            FabricError,
            "Base.1.18.PropertyUnknown",
            id="400-other",
        ),
        pytest.param(
            500,
            redfish_error("Base.1.18.ResourceInUse"),
            FabricUnavailable,
            "Base.1.18.ResourceInUse",
            id="5xx-stays-unavailable",
        ),
        pytest.param(503, None, FabricUnavailable, None, id="503"),
        pytest.param(429, None, FabricUnavailable, None, id="429"),
        pytest.param(504, None, FabricTimeout, None, id="504-timeout"),
        pytest.param(
            404,
            {"error": {"code": "Base.1.0.GeneralError"}},
            FabricNotFound,
            "Base.1.0.GeneralError",
            id="code-only",
        ),
    ],
)
def test_http_errors_map_to_typed_errors(
    status: int, body: Any, expected: type[FabricError], vendor_code: str | None
) -> None:
    error = error_from_response(status, body, context="GET /x")
    assert type(error) is expected
    assert error.status == status
    assert error.vendor_code == vendor_code
    assert str(error).startswith(f"GET /x: HTTP {status}")
    assert "\n" not in str(error)


def test_error_message_carries_the_vendor_text_on_one_line() -> None:
    error = error_from_response(409, redfish_error("Base.1.18.ResourceInUse"), context="POST /a")
    assert "text of Base.1.18.ResourceInUse second line" in str(error)


@given(
    status=st.integers(min_value=400, max_value=599),
    body=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "error",
                        "code",
                        "message",
                        "@Message.ExtendedInfo",
                        "MessageId",
                        "Message",
                        "Messages",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    ),
)
def test_any_error_body_maps_without_raising(status: int, body: Any) -> None:
    error = error_from_response(status, body, context="GET /x")
    assert isinstance(error, FabricError)
    assert error.status == status


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now) == 30
    assert parse_retry_after(format_datetime(now - timedelta(seconds=30), usegmt=True), now) == 0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None


@given(st.text(max_size=40))
def test_retry_after_never_raises_or_goes_negative(value: str) -> None:
    seconds = parse_retry_after(value)
    assert seconds is None or seconds >= 0


@pytest.mark.parametrize(
    ("task", "state"),
    [
        pytest.param({"TaskState": "Running"}, OperationState.RUNNING, id="running"),
        pytest.param({"TaskState": "New"}, OperationState.RUNNING, id="new"),
        pytest.param(
            {"TaskState": "Completed", "TaskStatus": "OK"}, OperationState.COMPLETED, id="completed"
        ),
        pytest.param(
            {"TaskState": "Completed", "TaskStatus": "Critical"},
            OperationState.FAILED,
            id="completed-critical",
        ),
        pytest.param(
            {
                "TaskState": "Exception",
                "Messages": [{"MessageId": "Base.1.18.ResourceInUse", "Message": "busy"}],
            },
            OperationState.FAILED,
            id="exception",
        ),
        pytest.param({"TaskState": "Cancelled"}, OperationState.FAILED, id="cancelled"),
    ],
)
def test_task_states_fold_into_operation_states(
    task: Mapping[str, Any], state: OperationState
) -> None:
    operation = parse_task(task, "/m/1")
    assert operation.state is state
    assert operation.op_id == "/m/1"


def test_task_failure_keeps_the_service_message() -> None:
    operation = parse_task(
        {"TaskState": "Exception", "Messages": [{"MessageId": "X", "Message": "in use"}]}, "/m"
    )
    assert operation.message == "TaskState Exception: in use"


@pytest.mark.parametrize("body", [{"TaskState": "Sleeping"}, {}, "Running"])
def test_malformed_task_is_invalid_data(body: Any) -> None:
    with pytest.raises(FabricInvalidData, match="task /m"):
        parse_task(body, "/m")


# --- properties ---------------------------------------------------------------------------


@given(st.text(max_size=300))
def test_short_strings_are_kept_stripped_and_blank_is_absent(value: str) -> None:
    result = text({"k": value}, "k")
    assert result == (value.strip() or None)


@given(st.text(min_size=MAX_STRING_BYTES + 1, max_size=MAX_STRING_BYTES + 50))
def test_strings_over_one_kib_are_rejected(value: str) -> None:
    with pytest.raises(BadItem) as caught:
        text({"k": value}, "k")
    assert caught.value.kind == "bad-value"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
DEVICE_KEYS = [
    "@odata.id",
    "ProcessorType",
    "Manufacturer",
    "Model",
    "SerialNumber",
    "UUID",
    "ProcessorMemory",
    "MemorySummary",
    "CapacityBytes",
    "CapacityMiB",
    "CXL",
    "Protocol",
    "Status",
    "Location",
    "PhysicalLocation",
    "SpeedMbps",
    "FirmwareVersion",
]


@given(
    values=st.dictionaries(st.sampled_from(DEVICE_KEYS), JSON_VALUES, max_size=8),
    source=st.sampled_from(list(DeviceSource)),
)
def test_arbitrary_device_payloads_give_a_device_none_or_a_bad_item(
    values: dict[str, Any], source: DeviceSource
) -> None:
    payload = {**gpu_payload(), **values}
    problem: BadItem | None = None
    try:
        device = parse_device(payload, "/d", source, gpu_context())
    except BadItem as err:
        problem, device = err, None
    if problem is not None:
        assert problem.kind in {"missing-field", "bad-type", "bad-value"}
        assert "\n" not in problem.reason
    elif device is not None:
        assert device.vendor_id == "/d"
        assert all(v >= 0 for v in device.capacity.values())
        assert device.memory_mib is None or device.memory_mib >= 0


@given(regions=st.lists(st.none() | st.sampled_from(["a", "b", "c"]), min_size=1, max_size=5))
def test_region_is_the_nearest_reported_one(regions: list[str | None]) -> None:
    chain = [ChassisPlace(chassis_id=f"c{i}", region=r) for i, r in enumerate(regions)]
    expected = next((r for r in regions if r), None)
    assert location_from_chain(chain).region == expected
    assert location_from_chain(chain).chassis == "c0"


@pytest.mark.parametrize(
    ("device", "block", "expected"),
    [
        ("OK", "Critical", "Critical"),
        ("Warning", "OK", "Warning"),
        ("Unknown", "Warning", "Warning"),
        ("Unknown", "Unknown", "Unknown"),
        ("Critical", "Unknown", "Critical"),
        ("Unknown", "OK", "Unknown"),
        ("Unknown", "Critical", "Critical"),
        ("OK", "Unknown", "OK"),
        ("Warning", "Critical", "Critical"),
    ],
)
def test_device_health_is_the_worse_of_device_and_block(
    device: str, block: str, expected: str
) -> None:
    from app.fabric.redfish.parse.common import worst_health
    from app.fabric.types import Health

    assert worst_health(Health(device), Health(block)) is Health(expected)
