"""The resource tree of the Redfish fabric simulator: generated inventories and mockup loading.

A tree is a plain ``dict`` mapping a normalised URI (no trailing slash, e.g.
``/redfish/v1/Systems/node-us-east-rack-01-1``) to the JSON object served there. This module
builds such trees and knows nothing of HTTP; :mod:`fabric_dra_sim.redfish` serves and mutates them.

Schema versions and enum values follow DMTF DSP8010 2025.4 (the CSDL files in
``../shared/data/redfish/csdl``); messages follow the DMTF Base message registry.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JsonObject = dict[str, Any]
Tree = dict[str, JsonObject]

ROOT = "/redfish/v1"
SYSTEMS = f"{ROOT}/Systems"
CHASSIS = f"{ROOT}/Chassis"
COMPOSITION = f"{ROOT}/CompositionService"
BLOCKS = f"{COMPOSITION}/ResourceBlocks"
ZONES = f"{COMPOSITION}/ResourceZones"
SESSION_SERVICE = f"{ROOT}/SessionService"
SESSIONS = f"{SESSION_SERVICE}/Sessions"
TASK_SERVICE = f"{ROOT}/TaskService"
TASKS = f"{TASK_SERVICE}/Tasks"
TASK_MONITORS = f"{TASK_SERVICE}/TaskMonitors"

BASE_REGISTRY = "Base.1.18"
"""Prefix of every message id the simulator sends (DMTF Base message registry 1.18)."""

NAMED_REGIONS = ("us-east", "us-west", "eu-central", "eu-west", "ap-south", "ap-northeast")
CITIES = {
    "us-east": "Ashburn",
    "us-west": "San Jose",
    "eu-central": "Frankfurt",
    "eu-west": "Dublin",
    "ap-south": "Mumbai",
    "ap-northeast": "Tokyo",
}
DEVICE_TYPES = ("gpu", "fpga", "nvme", "cxl-memory")
"""Device types the generator knows, as :class:`app.fabric.types.DeviceType` values."""
MIXED_CYCLE = ("gpu", "nvme", "cxl-memory", "fpga")
"""Order of device types in ``device_mix="mixed"``: slot i gets ``MIXED_CYCLE[i % 4]``.

Drives and memory come second and third so that a rack of only two or three devices still
covers more than one schema."""


@dataclass
class InventorySpec:
    """A generated inventory, reproducible by seed.

    Attributes:
        regions: number of regions; names are ``us-east, us-west, eu-central, eu-west,
            ap-south, ap-northeast`` and then ``region-7``, ``region-8``, ...
        racks_per_region: racks in each region, named ``rack-01``, ``rack-02``, ...
        devices_per_rack: devices in each rack, one per ResourceBlock.
        hosts_per_rack: ComputerSystems in each rack, HostName ``node-<region>-<rack>-<i>``
            (i from 1).
        device_mix: ``"gpu"`` (all GPUs) or ``"mixed"`` (GPUs, FPGAs, NVMe drives, CXL
            memory, cycling per slot).
        seed: the same seed gives an identical tree, UUIDs and serial numbers included.
        host_prefix: the first part of each ComputerSystem's HostName (its Id and URI keep
            ``node-...``): two simulators with other prefixes stand for two halls whose
            fabric managers use the same resource ids for different servers.
    """

    regions: int = 2
    racks_per_region: int = 4
    devices_per_rack: int = 16
    hosts_per_rack: int = 4
    device_mix: str = "gpu"
    seed: int = 0
    host_prefix: str = "node"

    def validate(self) -> None:
        """Check the numbers and the mix.

        Raises:
            ValueError: a count is negative or the mix is not ``gpu`` or ``mixed``.
        """
        for name in ("regions", "racks_per_region", "devices_per_rack", "hosts_per_rack"):
            if getattr(self, name) < 0:
                raise ValueError(f"InventorySpec.{name} must be >= 0, got {getattr(self, name)}")
        if self.device_mix not in ("gpu", "mixed"):
            raise ValueError(
                f"InventorySpec.device_mix must be 'gpu' or 'mixed', got {self.device_mix!r}"
            )


def region_name(index: int) -> str:
    """The name of region ``index`` (0-based): the named regions first, then ``region-N``."""
    if index < len(NAMED_REGIONS):
        return NAMED_REGIONS[index]
    return f"region-{index + 1}"


def rack_name(index: int) -> str:
    """The name of rack ``index`` (0-based): ``rack-01``, ``rack-02``, ..."""
    return f"rack-{index + 1:02d}"


def link(uri: str) -> JsonObject:
    """A Redfish reference object ``{"@odata.id": uri}``."""
    return {"@odata.id": uri}


def normalise(path: str) -> str:
    """A URI path without its trailing slash (``/redfish/v1/`` -> ``/redfish/v1``)."""
    stripped = path.rstrip("/")
    return stripped or "/"


def message(
    key: str,
    text: str,
    *,
    args: list[str] | None = None,
    severity: str = "Critical",
    resolution: str = "None.",
) -> JsonObject:
    """One ``@Message.ExtendedInfo`` entry with a Base registry message id.

    ``key`` is the message key in the Base registry (``ResourceInUse``, ...).
    """
    return {
        "MessageId": f"{BASE_REGISTRY}.{key}",
        "Message": text,
        "MessageArgs": list(args or []),
        "MessageSeverity": severity,
        "Resolution": resolution,
    }


def error_body(
    key: str, text: str, *, args: list[str] | None = None, resolution: str = "None."
) -> JsonObject:
    """A Redfish error response body (DSP0266 "Error responses").

    Shape: ``{"error": {"code", "message", "@Message.ExtendedInfo": [message]}}``.
    """
    return {
        "error": {
            "code": f"{BASE_REGISTRY}.{key}",
            "message": text,
            "@Message.ExtendedInfo": [message(key, text, args=args, resolution=resolution)],
        }
    }


def collection(uri: str, odata_type: str, name: str, members: list[str]) -> JsonObject:
    """A resource collection with ``Members`` and a matching ``Members@odata.count``."""
    return {
        "@odata.id": uri,
        "@odata.type": f"#{odata_type}.{odata_type}",
        "Name": name,
        "Members": [link(m) for m in members],
        "Members@odata.count": len(members),
    }


def status(health: str = "OK", state: str = "Enabled") -> JsonObject:
    """A ``Status`` object (Resource.Status): ``State`` and ``Health``."""
    return {"State": state, "Health": health}


@dataclass(frozen=True)
class _Model:
    vendor: str
    model: str
    part_prefix: str
    memory_mib: int
    memory_type: str


_GPU_MODELS = (
    _Model("NVIDIA", "A100 80GB PCIe", "900-21001", 81920, "HBM2E"),
    _Model("NVIDIA", "H100 PCIe", "900-21010", 81920, "HBM3"),
    _Model("AMD", "Instinct MI210", "102-D67302", 65536, "HBM2E"),
)
_FPGA_MODELS = (
    _Model("AMD", "Alveo U55C", "A-U55C-P00G", 16384, "HBM2"),
    _Model("Intel", "Agilex 7 FPGA I-Series", "DK-DEV-AGI027", 32768, "DDR4"),
)
_NVME_MODELS = (
    ("Samsung", "PM1733", "MZWLJ3T8HBLS", 3_840_755_982_336),
    ("Kioxia", "CM6-V", "KCM6XVUL3T20", 3_200_631_791_616),
)
_CXL_MODELS = (
    ("Samsung", "CMM-D 128GB", "MZ-CMM128", 131072),
    ("SK hynix", "CMM-DDR5 96GB", "HMCG94AEBRA", 98304),
)


class TreeBuilder:
    """Builds a generated tree for an :class:`InventorySpec` and adds blocks to it later.

    Every random choice draws from one ``random.Random(seed)`` in a fixed order, so the same
    spec yields the same tree. Blocks added at run time (:meth:`add_block`) continue the same
    random stream.
    """

    def __init__(self, spec: InventorySpec) -> None:
        spec.validate()
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.tree: Tree = {}
        self._next_slot: dict[str, int] = {}

    def _uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def _serial(self, prefix: str) -> str:
        return f"{prefix}{self.rng.randrange(10**10):010d}"

    def _firmware(self, major: int) -> str:
        return f"{major}.{self.rng.randrange(200)}.{self.rng.randrange(20)}"

    def build(self) -> Tree:
        """Generate the whole tree and return it.

        Returns:
            URI -> JSON object, with the service root, CompositionService, Chassis,
            ResourceBlocks (with their devices), ResourceZones, Systems, SessionService
            and TaskService.
        """
        spec = self.spec
        t = self.tree
        t[ROOT] = {
            "@odata.id": ROOT,
            "@odata.type": "#ServiceRoot.v1_20_0.ServiceRoot",
            "Id": "RootService",
            "Name": "Fabric Manager Simulator",
            "RedfishVersion": "1.21.0",
            "UUID": self._uuid(),
            "Product": "fabric-dra Redfish simulator",
            "Vendor": "fabric-dra",
            "ProtocolFeaturesSupported": {
                "ExpandQuery": {
                    "ExpandAll": False,
                    "Levels": False,
                    "Links": False,
                    "NoLinks": False,
                },
                "FilterQuery": False,
                "SelectQuery": False,
                "OnlyMemberQuery": False,
                "ExcerptQuery": False,
                "TopSkipQuery": True,
            },
            "CompositionService": link(COMPOSITION),
            "Systems": link(SYSTEMS),
            "Chassis": link(CHASSIS),
            "SessionService": link(SESSION_SERVICE),
            # ServiceRoot names its TaskService link "Tasks" (ServiceRoot_v1.xml).
            "Tasks": link(TASK_SERVICE),
            "Links": {"Sessions": link(SESSIONS)},
        }
        t[COMPOSITION] = {
            "@odata.id": COMPOSITION,
            "@odata.type": "#CompositionService.v1_2_3.CompositionService",
            "Id": "CompositionService",
            "Name": "Composition Service",
            "Status": status(),
            "ServiceEnabled": True,
            "AllowOverprovisioning": False,
            "AllowZoneAffinity": True,
            "ResourceBlocks": link(BLOCKS),
            "ResourceZones": link(ZONES),
        }
        t[BLOCKS] = collection(BLOCKS, "ResourceBlockCollection", "Resource Block Collection", [])
        t[ZONES] = collection(ZONES, "ZoneCollection", "Resource Zone Collection", [])
        t[CHASSIS] = collection(CHASSIS, "ChassisCollection", "Chassis Collection", [])
        t[SYSTEMS] = collection(
            SYSTEMS, "ComputerSystemCollection", "Computer System Collection", []
        )
        for r in range(spec.regions):
            region = region_name(r)
            self._add_zone(region)
            for k in range(spec.racks_per_region):
                rack = rack_name(k)
                self._add_rack(region, rack)
                for h in range(spec.hosts_per_rack):
                    self._add_system(region, rack, h + 1)
                for d in range(spec.devices_per_rack):
                    kind = "gpu" if spec.device_mix == "gpu" else MIXED_CYCLE[d % len(MIXED_CYCLE)]
                    self.add_block(region, rack, kind)
        return t

    def _append_member(self, collection_uri: str, uri: str) -> None:
        coll = self.tree[collection_uri]
        coll["Members"].append(link(uri))
        coll["Members@odata.count"] = len(coll["Members"])

    def _add_zone(self, region: str) -> None:
        uri = f"{ZONES}/zone-{region}"
        self.tree[uri] = {
            "@odata.id": uri,
            "@odata.type": "#Zone.v1_6_3.Zone",
            "Id": f"zone-{region}",
            "Name": f"Fabric zone of {region}",
            "ZoneType": "ZoneOfResourceBlocks",
            "Status": status(),
            "Links": {"ResourceBlocks": []},
        }
        self._append_member(ZONES, uri)

    def _postal(self, region: str) -> JsonObject:
        return {
            "Country": "US",
            "Territory": region,
            "City": CITIES.get(region, f"city-{region}"),
            "Building": f"dc-{region}",
        }

    def _add_rack(self, region: str, rack: str) -> None:
        rack_uri = f"{CHASSIS}/{region}-{rack}"
        enclosure_uri = f"{rack_uri}-fabric"
        self.tree[rack_uri] = {
            "@odata.id": rack_uri,
            "@odata.type": "#Chassis.v1_28_0.Chassis",
            "Id": f"{region}-{rack}",
            "Name": f"Rack {rack} in {region}",
            "ChassisType": "Rack",
            "SerialNumber": self._serial("RK"),
            "Status": status(),
            "Location": {
                "PostalAddress": self._postal(region),
                "Placement": {"Row": "row-1", "Rack": rack},
            },
            "Links": {"Contains": [link(enclosure_uri)], "ComputerSystems": []},
        }
        self.tree[enclosure_uri] = {
            "@odata.id": enclosure_uri,
            "@odata.type": "#Chassis.v1_28_0.Chassis",
            "Id": f"{region}-{rack}-fabric",
            "Name": f"Fabric enclosure of {region}/{rack}",
            "ChassisType": "Enclosure",
            "Manufacturer": "Contoso Fabric",
            "Model": "PCIe/CXL Switch Enclosure 4U",
            "SerialNumber": self._serial("FE"),
            "Status": status(),
            "Location": {
                "PostalAddress": self._postal(region),
                "Placement": {
                    "Row": "row-1",
                    "Rack": rack,
                    "RackOffset": 20,
                    "RackOffsetUnits": "EIA_310",
                },
            },
            "Links": {"ContainedBy": link(rack_uri), "ResourceBlocks": []},
        }
        self._append_member(CHASSIS, rack_uri)
        self._append_member(CHASSIS, enclosure_uri)

    def _add_system(self, region: str, rack: str, index: int) -> None:
        host = f"node-{region}-{rack}-{index}"
        uri = f"{SYSTEMS}/{host}"
        rack_uri = f"{CHASSIS}/{region}-{rack}"
        self.tree[uri] = {
            "@odata.id": uri,
            "@odata.type": "#ComputerSystem.v1_27_0.ComputerSystem",
            "Id": host,
            "Name": f"Server {host}",
            "SystemType": "Physical",
            "HostName": f"{self.spec.host_prefix}{host.removeprefix('node')}",
            "Manufacturer": "Contoso",
            "Model": "C-Server 2U",
            "UUID": self._uuid(),
            "SerialNumber": self._serial("SV"),
            "PowerState": "On",
            "Status": status(),
            "Composition": {"UseCases": ["ExpandableSystem"]},
            "Links": {"ResourceBlocks": [], "Chassis": [link(rack_uri)]},
            "Actions": {
                "#ComputerSystem.AddResourceBlock": {
                    "target": f"{uri}/Actions/ComputerSystem.AddResourceBlock"
                },
                "#ComputerSystem.RemoveResourceBlock": {
                    "target": f"{uri}/Actions/ComputerSystem.RemoveResourceBlock"
                },
            },
        }
        self.tree[rack_uri]["Links"]["ComputerSystems"].append(link(uri))
        self._append_member(SYSTEMS, uri)

    def add_block(self, region: str, rack: str, kind: str) -> str:
        """Add one device and its ResourceBlock to rack ``rack`` of ``region``.

        Args:
            region: an existing region name.
            rack: an existing rack name in that region.
            kind: one of :data:`DEVICE_TYPES`.

        Returns:
            The new block's URI.

        Raises:
            KeyError: the rack does not exist.
            ValueError: ``kind`` is unknown.
        """
        if kind not in DEVICE_TYPES:
            raise ValueError(f"device type must be one of {', '.join(DEVICE_TYPES)}, got {kind!r}")
        enclosure_uri = f"{CHASSIS}/{region}-{rack}-fabric"
        zone_uri = f"{ZONES}/zone-{region}"
        if enclosure_uri not in self.tree or zone_uri not in self.tree:
            raise KeyError(f"no rack {rack!r} in region {region!r}")
        slot = self._next_slot.get(enclosure_uri, 0)
        self._next_slot[enclosure_uri] = slot + 1
        block_id = f"{region}-{rack}-{kind}-{slot:02d}"
        block_uri = f"{BLOCKS}/{block_id}"
        part_location = {
            "PartLocation": {
                "ServiceLabel": f"slot-{slot}",
                "LocationType": "Slot",
                "LocationOrdinalValue": slot,
            }
        }
        block: JsonObject = {
            "@odata.id": block_uri,
            "@odata.type": "#ResourceBlock.v1_4_3.ResourceBlock",
            "Id": block_id,
            "Name": f"{kind.upper()} block {slot} of {region}/{rack}",
            "Status": status(),
            "CompositionStatus": {
                "Reserved": False,
                "CompositionState": "Unused",
                "SharingCapable": False,
                "MaxCompositions": 1,
                "NumberOfCompositions": 0,
            },
            "Links": {
                "Chassis": [link(enclosure_uri)],
                "ComputerSystems": [],
                "Zones": [link(zone_uri)],
            },
        }
        if kind in ("gpu", "fpga"):
            model = self.rng.choice(_GPU_MODELS if kind == "gpu" else _FPGA_MODELS)
            dev_id = f"{kind.upper()}0"
            dev_uri = f"{block_uri}/Processors/{dev_id}"
            block["ResourceBlockType"] = ["Processor"]
            block["Processors"] = [link(dev_uri)]
            device: JsonObject = {
                "@odata.id": dev_uri,
                "@odata.type": "#Processor.v1_22_0.Processor",
                "Id": dev_id,
                "Name": f"{model.vendor} {model.model}",
                "ProcessorType": kind.upper(),
                "Manufacturer": model.vendor,
                "Model": model.model,
                "SerialNumber": self._serial(kind.upper()),
                "PartNumber": f"{model.part_prefix}-{self.rng.randrange(1000):03d}",
                "UUID": self._uuid(),
                "FirmwareVersion": self._firmware(535 if kind == "gpu" else 3),
                "ProcessorMemory": [
                    {"CapacityMiB": model.memory_mib, "MemoryType": model.memory_type}
                ],
                "Location": part_location,
                "Status": status(),
                "Links": {"Chassis": link(enclosure_uri)},
            }
        elif kind == "nvme":
            vendor, name, part, capacity = self.rng.choice(_NVME_MODELS)
            dev_uri = f"{block_uri}/Drives/NVMe0"
            block["ResourceBlockType"] = ["Storage"]
            block["Drives"] = [link(dev_uri)]
            device = {
                "@odata.id": dev_uri,
                "@odata.type": "#Drive.v1_22_0.Drive",
                "Id": "NVMe0",
                "Name": f"{vendor} {name}",
                "Manufacturer": vendor,
                "Model": name,
                "SerialNumber": self._serial("NV"),
                "PartNumber": f"{part}-{self.rng.randrange(1000):03d}",
                "FirmwareVersion": self._firmware(1),
                "Identifiers": [{"DurableNameFormat": "UUID", "DurableName": self._uuid()}],
                "CapacityBytes": capacity,
                "Protocol": "NVMe",
                "MediaType": "SSD",
                "PhysicalLocation": part_location,
                "Status": status(),
                "Links": {"Chassis": link(enclosure_uri)},
            }
        else:
            vendor, name, part, capacity_mib = self.rng.choice(_CXL_MODELS)
            dev_uri = f"{block_uri}/Memory/CXL0"
            block["ResourceBlockType"] = ["Memory"]
            block["Memory"] = [link(dev_uri)]
            device = {
                "@odata.id": dev_uri,
                "@odata.type": "#Memory.v1_23_0.Memory",
                "Id": "CXL0",
                "Name": f"{vendor} {name}",
                "Manufacturer": vendor,
                "Model": name,
                "SerialNumber": self._serial("CX"),
                "PartNumber": f"{part}-{self.rng.randrange(1000):03d}",
                "FirmwareRevision": self._firmware(2),
                "CapacityMiB": capacity_mib,
                "MemoryType": "DRAM",
                "MemoryDeviceType": "DDR5",
                "MemoryMedia": ["DRAM"],
                # The CXL object marks a CXL Type 3 memory device (Memory v1.17+).
                "CXL": {"StagedVolatileSizeMiB": capacity_mib},
                "Location": part_location,
                "Status": status(),
            }
        self.tree[block_uri] = block
        self.tree[dev_uri] = device
        self.tree[enclosure_uri]["Links"]["ResourceBlocks"].append(link(block_uri))
        self.tree[zone_uri]["Links"]["ResourceBlocks"].append(link(block_uri))
        self._append_member(BLOCKS, block_uri)
        return block_uri


def _index_files(root: Path) -> Iterator[Path]:
    yield from sorted(root.rglob("index.json"))


def load_mockup(directory: Path) -> Tree:
    """Read a DMTF mockup directory (``<dir>/redfish/v1/.../index.json``) as a tree.

    Each file is served at the URI of its folder, exactly as written: a wrong ``@odata.id``
    or ``Members@odata.count`` inside a file stays wrong (clients must survive that).

    Raises:
        ValueError: there is no ``redfish/v1/index.json`` or a file is not a JSON object.
    """
    base = directory / "redfish" / "v1"
    if not (base / "index.json").is_file():
        raise ValueError(f"{directory}: no redfish/v1/index.json (not a Redfish mockup folder)")
    tree: Tree = {}
    for path in _index_files(base):
        rel = path.parent.relative_to(directory).as_posix()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: cannot read mockup resource: {err}") from err
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a mockup resource must be a JSON object")
        tree[normalise("/" + rel)] = data
    return tree


def odata_service_document(tree: Tree) -> JsonObject:
    """The OData service document (``/redfish/v1/odata``) naming the root's top-level links."""
    root = tree.get(ROOT, {})
    values = [
        {"name": name, "kind": "Singleton", "url": value["@odata.id"]}
        for name, value in root.items()
        if isinstance(value, dict) and isinstance(value.get("@odata.id"), str) and name != "Links"
    ]
    return {"@odata.context": f"{ROOT}/$metadata", "value": values}


def metadata_document(tree: Tree) -> str:
    """The CSDL ``$metadata`` document referencing every schema namespace the tree uses."""
    namespaces: dict[str, set[str]] = {}
    for resource in tree.values():
        odata_type = resource.get("@odata.type")
        if isinstance(odata_type, str) and odata_type.startswith("#"):
            qualified = odata_type[1:].rsplit(".", 1)[0]
            schema = qualified.split(".", 1)[0]
            namespaces.setdefault(schema, set()).update({schema, qualified})
    for schema in (
        "ServiceRoot",
        "Task",
        "TaskCollection",
        "Session",
        "SessionCollection",
        "Message",
        "RedfishExtensions",
    ):
        namespaces.setdefault(schema, set()).add(schema)
    namespaces["RedfishExtensions"].add("RedfishExtensions.v1_0_0")
    namespaces["ServiceRoot"].add("ServiceRoot.v1_0_0")
    refs = []
    for schema in sorted(namespaces):
        file_name = f"{schema}_v1.xml"
        includes = "".join(
            f'    <edmx:Include Namespace="{ns}"'
            + (' Alias="Redfish"' if ns == "RedfishExtensions.v1_0_0" else "")
            + "/>\n"
            for ns in sorted(namespaces[schema])
        )
        refs.append(
            f'  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/{file_name}">\n'
            f"{includes}  </edmx:Reference>\n"
        )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">\n'
        + "".join(refs)
        + "  <edmx:DataServices>\n"
        '    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="Service">\n'
        '      <EntityContainer Name="Service"'
        ' Extends="ServiceRoot.v1_0_0.ServiceContainer"/>\n'
        "    </Schema>\n"
        "  </edmx:DataServices>\n"
        "</edmx:Edmx>\n"
    )
