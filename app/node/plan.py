"""Pure decisions of the node plugin: is a claim ours and for this node, is each device ready,
and what the CDI specs and the kubelet's answer for a prepared claim are.

Everything here works on the resource.k8s.io/v1 JSON shape of a ResourceClaim
(:func:`app.kube.versions.claim_from_wire`) and raises :class:`ClaimNotPreparable` with the
message the kubelet shows in the pod's events.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.claims.model import (
    EffectiveConfig,
    InvalidClaimConfig,
    WantedDevice,
    effective_config,
    node_from_allocation,
    wanted_devices,
)
from app.node import cdi
from app.node.identity import DeviceIdentity, HostDevice

# How our status.devices data names the identity fields (app.claims.model.device_identity_data).
_DATA_FIELDS = {
    "uuid": "uuid",
    "serialNumber": "serial",
    "pciVendorId": "pci_vendor_id",
    "pciDeviceId": "pci_device_id",
    "slot": "slot",
}
DEVICES_ENV = "FABRIC_DRA_DEVICES"
MOUNT_OPTIONS_RO = ("bind", "ro", "nosuid", "nodev")
MOUNT_OPTIONS_RW = ("bind", "rw", "nosuid", "nodev")


class ClaimNotPreparable(Exception):
    """This claim cannot be prepared on this node; the message says why (one line)."""


class ClaimReadFailed(ClaimNotPreparable):
    """The claim (or the controller's journal) could not be read now; trying again may work."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources / NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class Verdict(enum.Enum):
    """Where one allocated device stands, from the node's point of view."""

    READY = "ready"
    WAITING = "waiting"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class DeviceState:
    """One allocated device's :class:`Verdict`, the identity to look for when ready, and why
    it is not ready otherwise."""

    wanted: WantedDevice
    verdict: Verdict
    identity: DeviceIdentity | None = None
    why: str = ""


def check_claim(claim: Mapping[str, Any], ref: ClaimRef, driver: str, node: str) -> None:
    """Refuse a claim that is not the one asked for, not allocated, or allocated elsewhere.

    Raises:
        ClaimNotPreparable: the UID differs (deleted and made again), the claim is not
            allocated, or its allocation's node selector names another node.
    """
    metadata = claim.get("metadata") or {}
    uid = metadata.get("uid")
    if uid != ref.uid:
        raise ClaimNotPreparable(
            f"claim {ref} has UID {uid}, the kubelet asked for {ref.uid} "
            "(deleted and created again?)"
        )
    status = claim.get("status") or {}
    if not status.get("allocation"):
        raise ClaimNotPreparable(f"claim {ref} is not allocated")
    allocated_node = node_from_allocation(claim)
    if allocated_node is not None and allocated_node != node:
        raise ClaimNotPreparable(
            f"claim {ref} is allocated to node {allocated_node}, not to this node {node}"
        )


def our_devices(claim: Mapping[str, Any], driver: str) -> list[WantedDevice]:
    """Our driver's allocation results (other drivers' results are not ours to prepare)."""
    return wanted_devices(claim, driver)


def _entry(claim: Mapping[str, Any], driver: str, wanted: WantedDevice) -> Mapping[str, Any]:
    for entry in (claim.get("status") or {}).get("devices") or []:
        if (
            isinstance(entry, Mapping)
            and entry.get("driver") == driver
            and entry.get("pool") == wanted.pool
            and entry.get("device") == wanted.device
        ):
            return entry
    return {}


def _condition(entry: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for item in entry.get("conditions") or []:
        if isinstance(item, Mapping) and item.get("type") == type_:
            return item
    return None


def identity_from_data(
    wanted: WantedDevice, requests: Sequence[str], data: Mapping[str, Any]
) -> DeviceIdentity:
    """The identity to look for, from our ``status.devices`` entry's ``data`` (or the
    controller's answer, which uses the same names)."""
    fields: dict[str, str | None] = {}
    for key, attribute in _DATA_FIELDS.items():
        value = data.get(key)
        fields[attribute] = value if isinstance(value, str) and value else None
    return DeviceIdentity(
        pool=wanted.pool,
        device=wanted.device,
        device_type=str(data.get("deviceType") or "other"),
        requests=tuple(requests),
        **fields,
    )


def device_states(
    claim: Mapping[str, Any],
    driver: str,
    node: str,
    ready_types: Sequence[str],
    failed_types: Sequence[str],
) -> list[DeviceState]:
    """Each of our devices' state, from our driver's ``status.devices`` entries.

    A device is ready when every ``ready_types`` condition is True and its ``data.node`` is
    this node; failed when a ``failed_types`` condition is True (the controller gave up), or
    when it was attached to another node; waiting otherwise (no entry yet, still attaching,
    or a lost attachment being attached again).
    """
    requests: dict[tuple[str, str], list[str]] = {}
    for wanted in our_devices(claim, driver):
        requests.setdefault((wanted.pool, wanted.device), []).append(wanted.request)
    states = []
    seen: set[tuple[str, str]] = set()
    for wanted in our_devices(claim, driver):
        key = (wanted.pool, wanted.device)
        if key in seen:
            continue
        seen.add(key)
        entry = _entry(claim, driver, wanted)
        data = entry.get("data") if isinstance(entry.get("data"), Mapping) else {}
        assert isinstance(data, Mapping)
        failed = [
            c for t in failed_types if (c := _condition(entry, t)) and c.get("status") == "True"
        ]
        if failed:
            why = str(failed[0].get("message") or failed[0].get("reason") or "failed")
            states.append(DeviceState(wanted, Verdict.FAILED, why=why))
            continue
        ready = bool(entry) and all(
            (c := _condition(entry, t)) is not None and c.get("status") == "True"
            for t in ready_types
        )
        if not ready:
            reason = ""
            first = _condition(entry, ready_types[0]) if ready_types else None
            if first is not None:
                reason = f": {first.get('reason')}: {first.get('message')}"
            states.append(DeviceState(wanted, Verdict.WAITING, why=f"not attached yet{reason}"))
            continue
        attached_to = data.get("node")
        if attached_to not in (None, node):
            states.append(
                DeviceState(
                    wanted,
                    Verdict.FAILED,
                    why=f"attached to node {attached_to}, not to this node {node}",
                )
            )
            continue
        identity = identity_from_data(wanted, requests[key], data)
        states.append(DeviceState(wanted, Verdict.READY, identity=identity))
    return states


def states_from_journal(
    claim: Mapping[str, Any], driver: str, node: str, reservations: Sequence[Mapping[str, Any]]
) -> list[DeviceState]:
    """Each of our devices' state from the controller's journal (its admin API's
    ``/api/v1/claim-devices/{uid}`` answer: ``pool``, ``device``, ``state``, ``node``,
    ``data``), for a claim without ``status.devices`` (Kubernetes 1.31)."""
    by_key = {(str(r.get("pool")), str(r.get("device"))): r for r in reservations}
    requests: dict[tuple[str, str], list[str]] = {}
    for wanted in our_devices(claim, driver):
        requests.setdefault((wanted.pool, wanted.device), []).append(wanted.request)
    states = []
    for (pool, device), names in sorted(requests.items()):
        wanted = WantedDevice(names[0], pool, device)
        found = by_key.get((pool, device))
        if found is None:
            states.append(DeviceState(wanted, Verdict.WAITING, why="no reservation yet"))
            continue
        state = str(found.get("state"))
        if state in ("failed", "detach-failed"):
            states.append(DeviceState(wanted, Verdict.FAILED, why=f"reservation is {state}"))
        elif state != "attached":
            states.append(DeviceState(wanted, Verdict.WAITING, why=f"reservation is {state}"))
        elif found.get("node") not in (None, node):
            states.append(
                DeviceState(
                    wanted,
                    Verdict.FAILED,
                    why=f"attached to node {found.get('node')}, not to this node {node}",
                )
            )
        else:
            data = found.get("data") if isinstance(found.get("data"), Mapping) else {}
            assert isinstance(data, Mapping)
            identity = identity_from_data(wanted, names, data)
            states.append(DeviceState(wanted, Verdict.READY, identity=identity))
    return states


def claim_config(
    claim: Mapping[str, Any], driver: str, allowed_host_paths: Sequence[str]
) -> dict[str, EffectiveConfig]:
    """Our opaque configuration per request, with every mount checked against the allowed
    host path prefixes.

    Raises:
        ClaimNotPreparable: a malformed FabricDeviceConfig, or a mount outside the prefixes.
    """
    requests = sorted({w.request for w in our_devices(claim, driver)})
    try:
        configs = effective_config(claim, driver, requests)
    except InvalidClaimConfig as err:
        raise ClaimNotPreparable(f"invalid FabricDeviceConfig: {err}") from None
    for request, config in configs.items():
        for host_path, _, _ in config.mounts:
            if not any(_under(host_path, prefix) for prefix in allowed_host_paths):
                allowed = ", ".join(allowed_host_paths) or "none (node.allowed_host_paths)"
                raise ClaimNotPreparable(
                    f"request {request}: mount of host path {host_path} is not allowed "
                    f"(allowed prefixes: {allowed})"
                )
    return configs


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/") or "/"
    return path == prefix or path.startswith(prefix if prefix == "/" else prefix + "/")


@dataclass(frozen=True, slots=True)
class SpecFile:
    """One CDI spec to write: its file name and JSON object."""

    file_name: str
    spec: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AnswerDevice:
    """One device of the kubelet's answer."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    identity: DeviceIdentity


def claim_specs(
    driver: str,
    claim_uid: str,
    found: Sequence[HostDevice],
    configs: Mapping[str, EffectiveConfig],
) -> tuple[list[SpecFile], list[AnswerDevice]]:
    """The CDI specs for a claim's devices found on the host (one per device type), and the
    kubelet's answer (CDI IDs per device).

    Each device gets its device nodes, ``FABRIC_DRA_DEVICE_<NAME>_{UUID,SERIAL,TYPE,POOL}``
    and the env and mounts of the requests it serves. Every spec of the claim sets
    ``FABRIC_DRA_DEVICES`` to the same value, ``<device>:<uuid>:<serial>`` for each of the
    claim's devices (all types, sorted) joined by commas, so a container that gets devices of
    several types still sees them all. (Two claims in one container each set it: the runtime
    keeps one; the per-device variables have no such limit.)

    Raises:
        ClaimNotPreparable: a name CDI refuses (:class:`app.node.cdi.CdiError`).
    """
    listing = ",".join(
        f"{d.identity.device}:{d.identity.uuid or ''}:{d.identity.serial or ''}"
        for d in sorted(found, key=lambda d: (d.identity.pool, d.identity.device))
    )
    by_type: dict[str, list[HostDevice]] = {}
    for host_device in found:
        by_type.setdefault(host_device.identity.device_type, []).append(host_device)
    specs: list[SpecFile] = []
    answer: list[AnswerDevice] = []
    try:
        for device_type, members in sorted(by_type.items()):
            kind = cdi.cdi_kind(driver, device_type)
            devices = []
            for host_device in sorted(members, key=lambda d: (d.identity.pool, d.identity.device)):
                ident = host_device.identity
                name = cdi.cdi_device_name(claim_uid, ident.device)
                env = [
                    (cdi.env_name_for(ident.device, "TYPE"), ident.device_type),
                    (cdi.env_name_for(ident.device, "POOL"), ident.pool),
                ]
                if ident.uuid:
                    env.append((cdi.env_name_for(ident.device, "UUID"), ident.uuid))
                if ident.serial:
                    env.append((cdi.env_name_for(ident.device, "SERIAL"), ident.serial))
                mounts: dict[str, cdi.Mount] = {}
                for request in ident.requests:
                    config = configs.get(request)
                    if config is None:
                        continue
                    env.extend(config.env)
                    for host_path, container_path, read_only in config.mounts:
                        options = MOUNT_OPTIONS_RO if read_only else MOUNT_OPTIONS_RW
                        mounts[container_path] = cdi.Mount(host_path, container_path, options)
                devices.append(
                    cdi.CdiDevice(
                        name=name,
                        device_nodes=host_device.device_nodes,
                        env=tuple(dict(env).items()),
                        mounts=tuple(mounts[k] for k in sorted(mounts)),
                    )
                )
                answer.append(
                    AnswerDevice(
                        ident.requests,
                        ident.pool,
                        ident.device,
                        (cdi.cdi_device_id(kind, name),),
                        ident,
                    )
                )
            spec = cdi.build_spec(kind, devices, {DEVICES_ENV: listing})
            specs.append(SpecFile(cdi.spec_file_name(kind, claim_uid), spec))
    except cdi.CdiError as err:
        raise ClaimNotPreparable(f"cannot make a CDI spec: {err}") from None
    return specs, answer
