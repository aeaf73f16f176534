"""Named behaviour profiles of the Redfish simulator: what real third-party services do.

A profile is a name, a description and a :class:`ProfileSwitches` value (the switches it turns
on); a composite profile names others. :func:`resolve_profiles` merges a list of names into one
:class:`ProfileSwitches`, which :class:`fabric_dra_sim.redfish.RedfishSimulator` obeys. The default,
no profile, is ``ProfileSwitches()``: the simulator's own DSP0266-conformant behaviour.

This module also holds the tree edits that some profiles make once, before the simulator
starts serving (compute blocks, placeholder identities, blank health, dangling links, no
block actions). It knows nothing of HTTP.

Sources of the modelled behaviour, cited next to each rule:

* "What a real composability service did" in ``../shared/docs/REDFISH-REFERENCE.md`` (a
  real third-party composability service tried here, and public reports);
* DSP0266 (the Redfish specification) for ETags, ``If-Match`` and task monitors;
* the Task schema (``Task_v1.xml``, DSP8010) for ``TaskState`` values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from fabric_dra_sim.redfish_tree import (
    BLOCKS,
    SYSTEMS,
    ZONES,
    JsonObject,
    Tree,
    link,
    normalise,
    status,
)

ErrorFormat = Literal["redfish", "message", "text"]
EtagStyle = Literal["strong", "none", "double-quoted"]

PLACEHOLDER_HOSTNAME = "localhost"
PLACEHOLDER_UUID = "00000000-0000-0000-0000-000000000000"
PLACEHOLDER_SERIAL = "0123456789"

DANGLING_EVERY = 10
"""``unknown-500``: device blocks whose index is a multiple of this get a dangling Drive link."""
DANGLING_DRIVE_ID = "Dangling0"
"""The last segment of the dangling Drive URI: ``<block URI>/Drives/Dangling0``."""

HEALTH_VARIANTS: tuple[JsonObject | None, ...] = (
    {"Health": None, "State": "Enabled"},
    {"Health": "", "State": ""},
    {"State": None},
    None,  # no Status at all
    {"Health": "Degraded", "State": "Enabled"},
)
"""``null-health``: device ``i`` (0-based, see :func:`blank_health`) gets
``HEALTH_VARIANTS[i % 6]`` as its ``Status``, None meaning no Status at all; ``i % 6 == 5``
keeps its ``{"State": "Enabled", "Health": "OK"}``."""
HEALTH_CYCLE = len(HEALTH_VARIANTS) + 1

COMPONENT_KEYS = (
    "Processors",
    "Memory",
    "Storage",
    "Drives",
    "NetworkInterfaces",
    "EthernetInterfaces",
    "SimpleStorage",
)
"""The ResourceBlock properties that link its devices (ResourceBlock schema)."""

_BLOCK_ACTIONS = ("#ComputerSystem.AddResourceBlock", "#ComputerSystem.RemoveResourceBlock")


@dataclass(frozen=True)
class ProfileSwitches:
    """Every behaviour a profile can change; the defaults are the simulator's own behaviour.

    Attributes:
        server_owned_compute: every block reports ``ResourceBlockType: []``; each System holds
            its own compute block from the start and may not give it up (406).
        error_format: ``redfish`` (DSP0266 error object), ``message`` (``{"message": text}``)
            or ``text`` (``text/plain`` text).
        etag_style: ``strong`` (``ETag`` header equals ``@odata.etag``), ``none`` (no ETags,
            ``If-Match`` ignored) or ``double-quoted`` (header ``""abc""``, body ``"abc"``).
        block_actions: AddResourceBlock / RemoveResourceBlock exist (False: removed from
            every System, their URIs unknown).
        unknown_status: the status of a request for an unknown URI (404, or 500).
        dangling_drives: every :data:`DANGLING_EVERY`-th device block links a missing Drive.
        placeholder_identity: every System has the same HostName, UUID and SerialNumber.
        attach_noop: attaches are answered with success but change nothing (see
            ``RedfishSimulator.noop_attaches``).
        task_200_body: task monitors answer 200 with the Task body, never 202.
        task_killed: every task ends ``Killed`` without making its change.
        task_purged: a task and its monitor vanish as soon as the task has run.
        volatile_state: ``RedfishSimulator.restart()`` forgets every attachment.
        null_health: some devices (and their blocks) have null, empty, missing or unknown
            health.
    """

    server_owned_compute: bool = False
    error_format: ErrorFormat = "redfish"
    etag_style: EtagStyle = "strong"
    block_actions: bool = True
    unknown_status: int = 404
    dangling_drives: bool = False
    placeholder_identity: bool = False
    attach_noop: bool = False
    task_200_body: bool = False
    task_killed: bool = False
    task_purged: bool = False
    volatile_state: bool = False
    null_health: bool = False


@dataclass(frozen=True)
class Profile:
    """One named profile.

    Attributes:
        name: the name tests and ``--profile`` use.
        description: what the service does, and where the behaviour comes from.
        switches: the switches this profile turns on (only the fields it changes differ from
            ``ProfileSwitches()``).
        includes: for a composite, the profiles it is made of (``switches`` is then the
            default).
    """

    name: str
    description: str
    switches: ProfileSwitches = ProfileSwitches()
    includes: tuple[str, ...] = ()


_REF = "REDFISH-REFERENCE.md, 'What a real composability service did'"

_PROFILE_LIST = (
    Profile(
        "server-owned-compute",
        "Every ResourceBlock reports ResourceBlockType: []. Each generated System starts out "
        "holding its own compute block, <System Id>-compute (a CPU Processor CPU0, a DDR5 "
        "DRAM Memory DIMM0 without CXL, a NetworkInterface NIC0), listed in the System's "
        "Links.ResourceBlocks (first) and the block's Links.ComputerSystems and located in "
        "the System's rack Chassis. A PATCH of Links.ResourceBlocks leaving it out, or "
        f"RemoveResourceBlock of it, answers 406 and changes nothing. Source: {_REF}.",
        ProfileSwitches(server_owned_compute=True),
    ),
    Profile(
        "message-errors",
        'Every error answer\'s body is {"message": "<text>"}, with no Redfish error '
        f"object. Source: {_REF}.",
        ProfileSwitches(error_format="message"),
    ),
    Profile(
        "text-errors",
        "Every error answer is a text/plain body holding the message text. Source: public "
        f"reports in {_REF}.",
        ProfileSwitches(error_format="text"),
    ),
    Profile(
        "no-etags",
        "No ETag headers and no @odata.etag; If-Match (and require_if_match) is ignored; no "
        "AddResourceBlock/RemoveResourceBlock actions: they are not advertised and their URIs "
        f"are unknown resources (404, or 500 with unknown-500). PATCH only. Source: {_REF}.",
        ProfileSwitches(etag_style="none", block_actions=False),
    ),
    Profile(
        "unknown-500",
        "A request for any unknown URI answers 500, not 404 (a reference to an unknown block "
        "inside a PATCH or action body still answers 404). Device blocks 0, 10, 20, ... (in "
        "collection order) link one extra Drive <block>/Drives/Dangling0 that does not exist. "
        f"Source: {_REF}.",
        ProfileSwitches(unknown_status=500, dangling_drives=True),
    ),
    Profile(
        "placeholder-identity",
        f"Every System has HostName {PLACEHOLDER_HOSTNAME!r}, UUID {PLACEHOLDER_UUID!r} and "
        f"SerialNumber {PLACEHOLDER_SERIAL!r}; only Id and the URI tell them apart. "
        f"Source: {_REF}.",
        ProfileSwitches(placeholder_identity=True),
    ),
    Profile(
        "attach-noop",
        "An attach (a PATCH adding a block, or AddResourceBlock) answers 200 with the usual "
        "body but changes nothing; RedfishSimulator.noop_attaches says how many attaches are "
        "swallowed (None, the profile's default: all of them). Source: public reports in "
        f"{_REF}.",
        ProfileSwitches(attach_noop=True),
    ),
    Profile(
        "double-quoted-etag",
        'The ETag header is quoted twice (""abc"") while @odata.etag is "abc". The '
        'service compares If-Match with its own normalised tag, so "abc" and ""abc"" '
        'both match and anything else (W/"abc" included) is 412. Source: public reports '
        f"in {_REF}; DSP0266 for If-Match.",
        ProfileSwitches(etag_style="double-quoted"),
    ),
    Profile(
        "task-200-body",
        "With task_mode, the task monitor answers 200 with the Task body (TaskState Running, "
        "PercentComplete) while the task runs, and 200 with the Task body in its final state "
        "(TaskState Completed, or Exception) when done; never 202. Source: public reports in "
        f"{_REF}; DSP0266 says 202 while running.",
        ProfileSwitches(task_200_body=True),
    ),
    Profile(
        "task-killed",
        "With task_mode, every task ends with TaskState Killed, TaskStatus Critical and a "
        "TaskAborted message, and its change is not made; the monitor then answers 200 with "
        "the Task body. Source: the Task schema's TaskState (Killed: terminated by an "
        "operator).",
        ProfileSwitches(task_killed=True),
    ),
    Profile(
        "task-purged",
        "With task_mode, the task monitor and the Task resource vanish as soon as the task "
        "has run (its change is made): the read that runs it already answers as for an "
        f"unknown resource (404, or 500 with unknown-500). Source: public reports in {_REF}.",
        ProfileSwitches(task_purged=True),
    ),
    Profile(
        "volatile-state",
        "RedfishSimulator.restart() forgets every attachment made since start (Systems go "
        "back to their initial blocks) besides dropping sessions and tasks. "
        f"Source: {_REF} (state is in memory).",
        ProfileSwitches(volatile_state=True),
    ),
    Profile(
        "null-health",
        "Device i (0-based, in block collection order) gets Status "
        "{Health: null, State: Enabled} when i % 6 == 0, {Health: '', State: ''} when 1, "
        "{State: null} when 2, no Status when 3, {Health: Degraded, State: Enabled} when 4, "
        "and keeps Health OK when 5; the block holding it gets the same Status (Health null "
        f"for the Degraded one). Source: public reports in {_REF}.",
        ProfileSwitches(null_health=True),
    ),
    Profile(
        "real-service",
        "What the real composability service did: server-owned-compute, message-errors, "
        f"no-etags, unknown-500, placeholder-identity and volatile-state. Source: {_REF}.",
        includes=(
            "server-owned-compute",
            "message-errors",
            "no-etags",
            "unknown-500",
            "placeholder-identity",
            "volatile-state",
        ),
    ),
)

PROFILES: Mapping[str, Profile] = MappingProxyType({p.name: p for p in _PROFILE_LIST})
"""Every profile by name."""
PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)
"""The valid profile names, in documentation order."""


def resolve_profiles(names: Iterable[str]) -> ProfileSwitches:
    """Merge the switches of ``names`` (composites expanded) into one value.

    Raises:
        ValueError: an unknown name (the message lists the valid ones), or two profiles
            that set one switch to different values (``message-errors`` with
            ``text-errors``, ``no-etags`` with ``double-quoted-etag``).
    """
    default = ProfileSwitches()
    merged: dict[str, Any] = {}
    set_by: dict[str, str] = {}

    def add(name: str) -> None:
        profile = PROFILES.get(name)
        if profile is None:
            raise ValueError(
                f"unknown Redfish simulator profile {name!r}; valid profiles: "
                f"{', '.join(PROFILE_NAMES)}"
            )
        for included in profile.includes:
            add(included)
        for field in dataclasses.fields(ProfileSwitches):
            value = getattr(profile.switches, field.name)
            if value == getattr(default, field.name):
                continue
            if field.name in merged and merged[field.name] != value:
                raise ValueError(
                    f"profiles {set_by[field.name]!r} and {name!r} cannot be "
                    f"combined: both set {field.name}"
                )
            merged[field.name] = value
            set_by[field.name] = name

    for name in names:
        add(name)
    # A task that is killed without effect and one that ran and vanished cannot both be
    # what one service does with every task.
    ends = [set_by[f] for f in ("task_killed", "task_purged") if merged.get(f)]
    if len(ends) > 1:
        raise ValueError(
            f"profiles {ends[0]!r} and {ends[1]!r} cannot be combined: both "
            "decide how every task ends"
        )
    return dataclasses.replace(default, **merged)


def needs_tasks(switches: ProfileSwitches) -> bool:
    """True when a profile only means something with writes answered as tasks."""
    return switches.task_200_body or switches.task_killed or switches.task_purged


# ----- tree edits, made once before serving -------------------------------------------------


def _refs(value: Any) -> list[str]:
    return (
        [
            normalise(r["@odata.id"])
            for r in value
            if isinstance(r, dict) and isinstance(r.get("@odata.id"), str)
        ]
        if isinstance(value, list)
        else []
    )


def _members(tree: Tree, collection_uri: str) -> list[str]:
    return [u for u in _refs(tree.get(collection_uri, {}).get("Members")) if u in tree]


def device_uris(tree: Tree, blocks: list[str]) -> list[tuple[str, str]]:
    """(block URI, device URI) for every device the ``blocks`` link that exists, in order:
    block by block, then :data:`COMPONENT_KEYS` order. A generated block has one device."""
    found: list[tuple[str, str]] = []
    for block in blocks:
        for key in COMPONENT_KEYS:
            found += [(block, d) for d in _refs(tree[block].get(key)) if d in tree]
    return found


def blank_health(tree: Tree, blocks: list[str]) -> None:
    """``null-health``: give device ``i`` of :func:`device_uris` ``HEALTH_VARIANTS[i % 6]``.

    The block holding it gets the same Status (the Degraded variant: Health null), so that the
    device's health cannot be read from its block either; a block holding several devices
    ends with the Status of its last changed one. Public reports in REDFISH-REFERENCE.md
    ("What a real composability service did"): health missing, null or empty.
    """
    for index, (block, device) in enumerate(device_uris(tree, blocks)):
        variant = index % HEALTH_CYCLE
        if variant >= len(HEALTH_VARIANTS):
            continue
        chosen = HEALTH_VARIANTS[variant]
        if chosen is None:
            tree[device].pop("Status", None)
            tree[block].pop("Status", None)
            continue
        tree[device]["Status"] = dict(chosen)
        tree[block]["Status"] = (
            {"Health": None, "State": "Enabled"}
            if chosen.get("Health") == "Degraded"
            else dict(chosen)
        )


def add_dangling_drives(tree: Tree, blocks: list[str]) -> list[str]:
    """``unknown-500``: blocks 0, 10, 20, ... of ``blocks`` link a Drive that does not exist.

    REDFISH-REFERENCE.md ("What a real composability service did"): many links dangle.

    Returns:
        The dangling Drive URIs.
    """
    dangling = []
    for block in blocks[::DANGLING_EVERY]:
        uri = f"{block}/Drives/{DANGLING_DRIVE_ID}"
        drives = tree[block].get("Drives")
        if not isinstance(drives, list):
            drives = tree[block]["Drives"] = []
        drives.append(link(uri))
        dangling.append(uri)
    return dangling


def placeholder_identities(tree: Tree) -> None:
    """``placeholder-identity``: every System gets the same HostName, UUID and SerialNumber.

    REDFISH-REFERENCE.md ("What a real composability service did"): placeholders.
    """
    for system in _members(tree, SYSTEMS):
        tree[system].update(
            {
                "HostName": PLACEHOLDER_HOSTNAME,
                "UUID": PLACEHOLDER_UUID,
                "SerialNumber": PLACEHOLDER_SERIAL,
            }
        )


def remove_block_actions(tree: Tree) -> None:
    """``no-etags``: no System advertises AddResourceBlock / RemoveResourceBlock.

    REDFISH-REFERENCE.md ("What a real composability service did"): PATCH only.
    """
    for system in _members(tree, SYSTEMS):
        actions = tree[system].get("Actions")
        if isinstance(actions, dict):
            for name in _BLOCK_ACTIONS:
                actions.pop(name, None)
            if not actions:
                del tree[system]["Actions"]


def compute_block_uri(system_id: str) -> str:
    """The URI of the compute block ``server-owned-compute`` gives System ``system_id``."""
    return f"{BLOCKS}/{system_id}-compute"


def add_compute_blocks(tree: Tree) -> dict[str, str]:
    """``server-owned-compute``: untype every block and give each System its own compute block.

    Every block in the collection gets ``ResourceBlockType: []``. Each System gets a block
    :func:`compute_block_uri` holding ``Processors/CPU0`` (ProcessorType CPU),
    ``Memory/DIMM0`` (DDR5 DRAM, no CXL object) and ``NetworkInterfaces/NIC0``, appended to
    the ResourceBlocks collection, listed first in the System's ``Links.ResourceBlocks`` and
    in the block's ``Links.ComputerSystems``, located in the System's first
    ``Links.Chassis`` (a generated System's rack; the rack's ``Links.ResourceBlocks`` lists
    it) and, for a generated tree, in the rack region's zone. REDFISH-REFERENCE.md ("What a
    real composability service did"): ``ResourceBlockType: []`` on every block, each System
    starts out holding its own compute block.

    Returns:
        Compute block URI -> the URI of the System that owns it.
    """
    for block in _members(tree, BLOCKS):
        tree[block]["ResourceBlockType"] = []
    owned: dict[str, str] = {}
    blocks_coll = tree[BLOCKS]
    for system in _members(tree, SYSTEMS):
        resource = tree[system]
        system_id = resource.get("Id")
        system_id = system_id if isinstance(system_id, str) else system.rsplit("/", 1)[-1]
        uri = compute_block_uri(system_id)
        links = resource.get("Links")
        if not isinstance(links, dict):
            links = resource["Links"] = {}
        chassis = [c for c in _refs(links.get("Chassis")) if c in tree][:1]
        zones = []
        for rack in chassis:
            rack_links = tree[rack].setdefault("Links", {})
            rack_links.setdefault("ResourceBlocks", []).append(link(uri))
            location = tree[rack].get("Location")
            postal = location.get("PostalAddress") if isinstance(location, dict) else None
            territory = postal.get("Territory") if isinstance(postal, dict) else None
            zone = f"{ZONES}/zone-{territory}"
            if zone in tree:
                zones.append(zone)
                tree[zone].setdefault("Links", {}).setdefault("ResourceBlocks", []).append(
                    link(uri)
                )
        cpu, dimm, nic = (
            f"{uri}/Processors/CPU0",
            f"{uri}/Memory/DIMM0",
            f"{uri}/NetworkInterfaces/NIC0",
        )
        tree[uri] = {
            "@odata.id": uri,
            "@odata.type": "#ResourceBlock.v1_4_3.ResourceBlock",
            "Id": f"{system_id}-compute",
            "Name": f"Compute block of {system_id}",
            "ResourceBlockType": [],
            "Status": status(),
            "CompositionStatus": {
                "Reserved": False,
                "CompositionState": "Composed",
                "SharingCapable": False,
                "MaxCompositions": 1,
                "NumberOfCompositions": 1,
            },
            "Processors": [link(cpu)],
            "Memory": [link(dimm)],
            "NetworkInterfaces": [link(nic)],
            "Links": {
                "Chassis": [link(c) for c in chassis],
                "ComputerSystems": [link(system)],
                "Zones": [link(z) for z in zones],
            },
        }
        tree[cpu] = {
            "@odata.id": cpu,
            "@odata.type": "#Processor.v1_22_0.Processor",
            "Id": "CPU0",
            "Name": "Intel Xeon Gold 6430",
            "ProcessorType": "CPU",
            "Manufacturer": "Intel",
            "Model": "Xeon Gold 6430",
            "TotalCores": 32,
            "TotalThreads": 64,
            "Status": status(),
        }
        tree[dimm] = {
            "@odata.id": dimm,
            "@odata.type": "#Memory.v1_23_0.Memory",
            "Id": "DIMM0",
            "Name": "DDR5 RDIMM 64GB",
            "MemoryType": "DRAM",
            "MemoryDeviceType": "DDR5",
            "MemoryMedia": ["DRAM"],
            "CapacityMiB": 65536,
            "Status": status(),
        }
        tree[nic] = {
            "@odata.id": nic,
            "@odata.type": "#NetworkInterface.v1_2_3.NetworkInterface",
            "Id": "NIC0",
            "Name": "Ethernet adapter",
            "Status": status(),
        }
        refs = links.get("ResourceBlocks")
        links["ResourceBlocks"] = [link(uri), *(refs if isinstance(refs, list) else [])]
        blocks_coll["Members"].append(link(uri))
        blocks_coll["Members@odata.count"] = len(blocks_coll["Members"])
        owned[uri] = system
    return owned
