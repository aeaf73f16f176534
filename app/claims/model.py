"""What a ResourceClaim asks of us, and what we write back on it. Pure functions on v1 JSON.

Sources: DRA-REFERENCE.md ("ResourceClaim", "Binding conditions", "Who writes what"); the
claim types in k8s.io/api resource/v1 (AllocationResult, AllocatedDeviceStatus); KEP-5007.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from app.fabric.types import FabricDevice

HOSTNAME_LABEL = "kubernetes.io/hostname"
# A condition reason is CamelCase (metav1.Condition: ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$).
REASON_ATTACHED = "Attached"
REASON_ATTACH_FAILED = "AttachFailed"
REASON_BAD_CONFIG = "InvalidConfig"
REASON_DEVICE_LOST = "DeviceLost"
MOVED_MARK = "the fabric now shows it on host"
"""Part of the journalled message of a device found on another host."""
REPAIR_RETRY_S = 300.0
"""Seconds after which a reservation that failed to attach a lost device again (its pod
bound and running on the node) is tried again, its attach tries counted from zero."""
REASON_DEVICE_MOVED = "DeviceMoved"
REASON_DETACH_FAILED = "DetachFailed"
# The device is still held by another reservation (being detached, or not released yet): the
# claim waits (binding condition False, no failure condition) instead of failing.
REASON_WAITING_FOR_DETACH = "WaitingForDetach"


@dataclass(frozen=True, slots=True, order=True)
class WantedDevice:
    """One allocation result of our driver: ``request`` got ``device`` from ``pool``."""

    request: str
    pool: str
    device: str


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIX = "FABRIC_DRA_"


def _env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"environment variable name {name!r} is not [A-Za-z_][A-Za-z0-9_]*")
    if name.upper().startswith(RESERVED_ENV_PREFIX):
        raise ValueError(f"environment variable name {name!r}: the FABRIC_DRA_ prefix is ours")
    return name


def _absolute_path(path: str) -> str:
    if not path.startswith("/") or ".." in path.split("/") or "\x00" in path:
        raise ValueError(f"{path!r} is not an absolute path without ..")
    if len(path) > 4096:
        raise ValueError("path longer than 4096 characters")
    return path


class MountConfig(BaseModel):
    """One bind mount of a :class:`FabricDeviceConfig`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hostPath: Annotated[str, AfterValidator(_absolute_path)]
    containerPath: Annotated[str, AfterValidator(_absolute_path)]
    readOnly: bool = True


class FabricDeviceConfig(BaseModel):
    """Opaque configuration for fabric-dra devices, in a claim's or a DeviceClass's
    ``config[].opaque.parameters`` with ``driver`` set to our driver name.

    Example::

        {"apiVersion": "fabric-dra.io/v1alpha1", "kind": "FabricDeviceConfig",
         "attachTimeoutSeconds": 120, "maxAttachAttempts": 3}

    Fields:
        attachTimeoutSeconds: how long one attach may take before it counts as failed
            (1 to 3600; default: the fabric backend's task timeout).
        maxAttachAttempts: attach attempts before the device is reported failed (1 to 20,
            default 5).
        env: extra environment variables for the containers that get the device (the node
            plugin puts them in the CDI spec): at most 32, names ``[A-Za-z_][A-Za-z0-9_]*``
            not starting with ``FABRIC_DRA_`` (ours), values at most 4096 characters.
        mounts: extra bind mounts, at most 16: ``hostPath`` and ``containerPath`` absolute
            without ``..``, ``readOnly`` (default true). The node plugin refuses a ``hostPath``
            outside its ``node.allowed_host_paths``.
    Unknown fields are refused, so a typo does not pass silently. A later entry's ``env``
    adds to an earlier one's; its ``mounts`` replace them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    apiVersion: Literal["fabric-dra.io/v1alpha1"]
    kind: Literal["FabricDeviceConfig"]
    attachTimeoutSeconds: int | None = Field(default=None, ge=1, le=3600)
    maxAttachAttempts: int | None = Field(default=None, ge=1, le=20)
    env: (
        dict[Annotated[str, AfterValidator(_env_name)], Annotated[str, Field(max_length=4096)]]
        | None
    ) = Field(default=None, max_length=32)
    mounts: list[MountConfig] | None = Field(default=None, max_length=16)


@dataclass(frozen=True, slots=True)
class EffectiveConfig:
    """The configuration that applies to one request after merging class and claim config.

    ``env`` is sorted by name; ``mounts`` are ``(hostPath, containerPath, readOnly)``.
    """

    attach_timeout_s: float | None = None
    max_attach_attempts: int = 5
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[tuple[str, str, bool], ...] = ()


class InvalidClaimConfig(ValueError):
    """The claim's or class's opaque configuration for our driver is not valid."""


def wanted_devices(claim: Mapping[str, Any], driver_name: str) -> list[WantedDevice]:
    """Our driver's allocation results in ``claim`` (v1 shape), sorted; empty when unallocated."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return sorted(
        WantedDevice(str(r.get("request", "")), str(r.get("pool", "")), str(r.get("device", "")))
        for r in results
        if isinstance(r, Mapping) and r.get("driver") == driver_name
    )


def node_from_allocation(claim: Mapping[str, Any]) -> str | None:
    """The single node an allocation is for, read from ``status.allocation.nodeSelector``.

    With ``bindsToNode`` the scheduler writes a selector for exactly one node: one term with
    ``matchFields`` ``metadata.name In [node]`` (or ``matchExpressions`` on the hostname label).
    A pool-wide selector, several terms or several values give None: the node must then be
    learnt from the consumer pod (``reservedFor``), see :func:`consumer_pods`.
    """
    allocation = (claim.get("status") or {}).get("allocation") or {}
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    if len(terms) != 1 or not isinstance(terms[0], Mapping):
        return None
    term = terms[0]
    candidates = [
        *[(f, "metadata.name") for f in term.get("matchFields") or []],
        *[(e, HOSTNAME_LABEL) for e in term.get("matchExpressions") or []],
    ]
    for requirement, key in candidates:
        if (
            isinstance(requirement, Mapping)
            and requirement.get("key") == key
            and requirement.get("operator") == "In"
            and len(requirement.get("values") or []) == 1
        ):
            return str(requirement["values"][0])
    return None


def consumer_pods(claim: Mapping[str, Any]) -> list[str]:
    """Names of the pods in ``status.reservedFor`` (same namespace as the claim)."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return [
        str(r["name"])
        for r in reserved
        if isinstance(r, Mapping) and r.get("resource") == "pods" and r.get("name")
    ]


def effective_config(
    claim: Mapping[str, Any], driver_name: str, requests: Iterable[str]
) -> dict[str, EffectiveConfig]:
    """Merge our driver's opaque config entries of the allocation, per request.

    Entries come from ``status.allocation.devices.config`` (class config first, then the
    claim's, as the allocator copies them); a later entry overrides fields an earlier one set.
    An entry with an empty ``requests`` list applies to every request.

    Returns:
        request name -> :class:`EffectiveConfig`, for every name in ``requests``.

    Raises:
        InvalidClaimConfig: an entry for our driver is not a valid
            :class:`FabricDeviceConfig`; the message names the entry, its source and requests.
    """
    wanted = list(requests)
    merged: dict[str, dict[str, Any]] = {r: {} for r in wanted}
    allocation = (claim.get("status") or {}).get("allocation") or {}
    entries = (allocation.get("devices") or {}).get("config") or []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            continue
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver_name:
            continue
        scope = list(entry.get("requests") or []) or wanted
        where = f"config[{index}] ({entry.get('source', 'unknown source')}) for requests {scope}"
        try:
            parsed = FabricDeviceConfig.model_validate(opaque.get("parameters"))
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "parameters"
            raise InvalidClaimConfig(f"{where}: {field}: {first['msg']}") from None
        values = parsed.model_dump(exclude_none=True, exclude={"apiVersion", "kind", "env"})
        for request in scope:
            if request in merged:
                merged[request].update(values)
                if parsed.env:
                    merged[request]["env"] = {**merged[request].get("env", {}), **parsed.env}
    return {
        request: EffectiveConfig(
            attach_timeout_s=values.get("attachTimeoutSeconds"),
            max_attach_attempts=values.get("maxAttachAttempts", 5),
            env=tuple(sorted(values.get("env", {}).items())),
            mounts=tuple(
                (m["hostPath"], m["containerPath"], m["readOnly"]) for m in values.get("mounts", [])
            ),
        )
        for request, values in merged.items()
    }


def rfc3339(moment: dt.datetime) -> str:
    """``moment`` in UTC as RFC 3339 with whole seconds (metav1.Time)."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: dt.datetime,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A metav1.Condition; ``lastTransitionTime`` is kept from ``previous`` when the status is
    unchanged (it marks transitions, not writes)."""
    text = "True" if status else "False"
    when = rfc3339(now)
    for old in previous:
        if old.get("type") == type_ and old.get("status") == text and old.get("lastTransitionTime"):
            when = str(old["lastTransitionTime"])
    return {
        "type": type_,
        "status": text,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": when,
    }


@dataclass(frozen=True, slots=True)
class DeviceReport:
    """What we say about one device on the claim.

    Attributes:
        wanted: which result it is.
        ready: True (attached), False (failed), None (neither yet: no entry is written).
        reason, message: for the conditions.
        data: the ``data`` object (uuid, host, node, ...), or None.
        failed: the failure conditions' status; None means ``not ready``. A device that
            lost its attachment and is being attached again is ``ready=False,
            failed=False``: not usable now, but not given up either.
    """

    wanted: WantedDevice
    ready: bool | None
    reason: str
    message: str
    data: Mapping[str, Any] | None = None
    failed: bool | None = None


def device_status_entries(
    claim: Mapping[str, Any],
    driver_name: str,
    reports: Iterable[DeviceReport],
    binding_conditions: Sequence[str],
    binding_failure_conditions: Sequence[str],
    now: dt.datetime,
) -> list[dict[str, Any]]:
    """The new ``status.devices`` list: other drivers' entries kept as they are, ours rebuilt.

    A ready device gets every binding condition True and every failure condition False; a
    failed one the opposite; a device with no verdict yet keeps no entry of ours. Entries for
    devices that are no longer in the allocation are dropped (the API server would drop them).
    """
    status = claim.get("status") or {}
    old_entries = [e for e in status.get("devices") or [] if isinstance(e, Mapping)]
    kept = [dict(e) for e in old_entries if e.get("driver") != driver_name]
    previous = {
        (e.get("pool"), e.get("device")): list(e.get("conditions") or [])
        for e in old_entries
        if e.get("driver") == driver_name
    }
    ours: list[dict[str, Any]] = []
    for report in sorted(reports, key=lambda r: r.wanted):
        if report.ready is None:
            continue
        before = previous.get((report.wanted.pool, report.wanted.device), [])
        conditions = [
            condition(t, report.ready, report.reason, report.message, now, before)
            for t in binding_conditions
        ] + [
            condition(
                t,
                not report.ready if report.failed is None else report.failed,
                report.reason,
                report.message,
                now,
                before,
            )
            for t in binding_failure_conditions
        ]
        entry: dict[str, Any] = {
            "driver": driver_name,
            "pool": report.wanted.pool,
            "device": report.wanted.device,
            "conditions": conditions,
        }
        if report.data is not None:
            entry["data"] = dict(report.data)
        ours.append(entry)
    return kept + ours


def same_device_status(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """True when two ``status.devices`` lists say the same (order of entries ignored)."""

    def key(entry: Mapping[str, Any]) -> tuple[str, str, str]:
        return (str(entry.get("driver")), str(entry.get("pool")), str(entry.get("device")))

    return sorted(map(dict, a), key=key) == sorted(map(dict, b), key=key)


# Device attribute names (FabricDevice.attributes) a backend may fill with PCI ids.
PCI_VENDOR_ATTRIBUTE = "pci_vendor_id"
PCI_DEVICE_ATTRIBUTE = "pci_device_id"


def device_identity_data(device: FabricDevice) -> dict[str, str]:
    """What the node plugin needs to find ``device`` on the host, for our ``status.devices``
    entry's ``data``: ``deviceType`` always; ``uuid``, ``serialNumber``, ``pciVendorId``,
    ``pciDeviceId`` (from the ``pci_vendor_id`` / ``pci_device_id`` attributes) and ``slot``
    when the fabric reports them. Values are strings as the fabric gave them."""
    data = {"deviceType": str(device.device_type)}
    for key, value in (
        ("uuid", device.uuid),
        ("serialNumber", device.serial),
        ("pciVendorId", device.attributes.get(PCI_VENDOR_ATTRIBUTE)),
        ("pciDeviceId", device.attributes.get(PCI_DEVICE_ATTRIBUTE)),
        ("slot", device.location.slot),
    ):
        if isinstance(value, str) and value:
            data[key] = value
    return data
