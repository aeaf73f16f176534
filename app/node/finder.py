"""Find an attached device on this host, and run the vendor's hook for it.

A matcher looks for one kind of evidence in the host's sysfs and procfs (read under
``host_root``: ``/`` in production, the host's root mounted into the plugin's container, or a
fake tree in tests): an NVMe controller's serial, a PCIe Device Serial Number, a UUID, a CXL
memory device's serial, or a PCI vendor and device id in a slot. :func:`locate` tries the
matchers for the device's type until one finds it or the wait runs out. A file that cannot be
read or holds garbage only rules out its candidate: matchers return ``None`` rather than raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import stat
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from app.aio import cancel_and_wait
from app.node.identity import DeviceIdentity, DeviceNode, HostDevice
from app.node.sysfs import (
    CONFIG_SPACE_SIZE,
    find_dsn,
    format_dsn,
    format_pci_id,
    header_type,
    is_pci_address,
    normalise_uuid,
    parse_colon_fields,
    parse_cxl_serial,
    parse_dev_numbers,
    parse_device_minor,
    parse_dsn_text,
    parse_nvme_serial,
    parse_pci_id,
    parse_proc_devices,
    parse_slot_address,
    serial_candidates,
)

log = logging.getLogger(__name__)

NVIDIA_VENDOR_ID = 0x10DE
_NVIDIACTL_MINOR = 255
_NVME_CONTROLLER = re.compile(r"nvme\d+")
# A namespace under its controller: nvme0n1, or nvme0c1n1 (a path of a multipath namespace whose
# block device is the subsystem's nvme0n1: drivers/nvme/host/multipath.c, nvme_set_disk_name).
_NVME_NAMESPACE = re.compile(r"nvme(\d+)(c\d+)?n(\d+)")
_CXL_MEMDEV = re.compile(r"mem\d+")
_TEXT_LIMIT = 64 * 1024
_STDERR_KEEP = 8 * 1024
_STDERR_LINE = 500
_STDERR_GRACE_S = 1.0

PCI_DEVICES = "/sys/bus/pci/devices"
NVME_CLASS = "/sys/class/nvme"
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
CXL_DEVICES = "/sys/bus/cxl/devices"
PCI_SLOTS = "/sys/bus/pci/slots"
PCI_RESCAN = "/sys/bus/pci/rescan"


class DeviceNotFound(Exception):
    """An allocated device did not show up on this host in time.

    The message names the device, its type, how long was waited and, for each matcher, what it
    looked for and where (host paths), e.g. ``device gpu-1 (gpu) not found on this host after
    30 s: no uuid 3f2a... in /proc/driver/nvidia/gpus/*/information; no DSN 00-11-... in
    /sys/bus/pci/devices/*/config``.

    Attributes:
        identity: the device looked for.
        reasons: one line per matcher tried.
    """

    def __init__(
        self,
        identity: DeviceIdentity,
        reasons: Sequence[str],
        waited_s: float,
        notes: Sequence[str] = (),
    ) -> None:
        self.identity = identity
        self.reasons = tuple(reasons)
        extra = f" ({', '.join(notes)})" if notes else ""
        looked = "; ".join(self.reasons) or "no matcher to try"
        super().__init__(
            f"device {identity.device} ({identity.device_type}) not found on this host after "
            f"{waited_s:g} s{extra}: {looked}"
        )


class HookFailed(Exception):
    """The vendor hook exited non-zero, was killed, timed out or could not start. The message is
    one line naming the hook and ending with the last line of its stderr (at most 500
    characters)."""


class DeviceMatcher(Protocol):
    """One way of finding a device on this host.

    ``find`` reads the filesystem synchronously (:func:`locate` runs it in a thread) and returns
    ``None`` when the device is not there, when a candidate's files are unreadable or garbage,
    and when the identity lacks the field the matcher needs. ``explain`` says, in one line, what
    ``find`` looked for and where (or why it was skipped), for :class:`DeviceNotFound`.
    """

    name: str

    def find(self, identity: DeviceIdentity) -> HostDevice | None:
        """The device, or ``None``."""
        ...

    def explain(self, identity: DeviceIdentity) -> str:
        """What was looked for and where, as host paths."""
        ...


class _Host:
    """Reads the host's files under ``root``; every read failure is ``None`` (or empty)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, host_path: str) -> Path:
        return self.root.joinpath(host_path.lstrip("/"))

    def data(self, host_path: str, limit: int = _TEXT_LIMIT) -> bytes | None:
        # Non-blocking, and regular files only: a FIFO or a device in a broken tree must not
        # hang the look (sysfs and procfs attributes are regular files).
        try:
            fd = os.open(self.path(host_path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            chunks: list[bytes] = []
            size = 0
            while size < limit:
                chunk = os.read(fd, limit - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)

    def text(self, host_path: str) -> str | None:
        raw = self.data(host_path)
        if raw is None:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def names(self, host_path: str, pattern: re.Pattern[str] | None = None) -> list[str]:
        try:
            found = os.listdir(self.path(host_path))
        except OSError:
            return []
        return sorted(n for n in found if pattern is None or pattern.fullmatch(n))

    def link_target(self, host_path: str) -> str | None:
        try:
            return os.readlink(self.path(host_path))
        except OSError:
            return None

    def dev_numbers(self, host_path: str) -> tuple[int, int] | None:
        text = self.text(host_path)
        return parse_dev_numbers(text) if text is not None else None

    def char_numbers(self, dev_path: str) -> tuple[int, int] | None:
        """Numbers of the character device at ``dev_path`` (``/dev/...``) on the host."""
        try:
            info = os.stat(self.path(dev_path))
        except (OSError, ValueError):
            return None
        if not stat.S_ISCHR(info.st_mode):
            return None
        return os.major(info.st_rdev), os.minor(info.st_rdev)


def _dedupe(nodes: Sequence[DeviceNode]) -> tuple[DeviceNode, ...]:
    seen: dict[str, DeviceNode] = {}
    for node in nodes:
        seen.setdefault(node.path, node)
    return tuple(seen.values())


def _nvme_namespace_block(name: str) -> str | None:
    """The block device of a namespace directory under a controller: itself, or for a
    multipath path ``nvme0c1n1`` the subsystem's ``nvme0n1``."""
    found = _NVME_NAMESPACE.fullmatch(name)
    return f"nvme{found.group(1)}n{found.group(3)}" if found else None


def _nvme_nodes(
    host: _Host, controller: str, only_namespace: str | None = None
) -> list[DeviceNode]:
    """The controller's character device and its namespaces' block devices (or only
    ``only_namespace``'s, a directory name under the controller)."""
    nodes: list[DeviceNode] = []
    numbers = host.dev_numbers(f"{NVME_CLASS}/{controller}/dev")
    if numbers:
        nodes.append(DeviceNode(f"/dev/{controller}", "c", *numbers))
    for entry in host.names(f"{NVME_CLASS}/{controller}", _NVME_NAMESPACE):
        if only_namespace is not None and entry != only_namespace:
            continue
        block = _nvme_namespace_block(entry)
        if block is None:
            continue
        numbers = None
        if block == entry:
            numbers = host.dev_numbers(f"{NVME_CLASS}/{controller}/{entry}/dev")
        numbers = numbers or host.dev_numbers(f"/sys/block/{block}/dev")
        if numbers:
            nodes.append(DeviceNode(f"/dev/{block}", "b", *numbers))
    return nodes


def _pci_address_of(target: str | None, parent: bool = False) -> str | None:
    """The PCI address in a sysfs symlink's target: its last component (``device`` links), or
    the one before (a CXL memory device's own link)."""
    if target is None:
        return None
    parts = [p for p in target.split("/") if p]
    index = -2 if parent else -1
    if len(parts) < -index:
        return None
    return parts[index] if is_pci_address(parts[index]) else None


def _nvme_device(
    host: _Host,
    identity: DeviceIdentity,
    matched_by: str,
    controller: str,
    only_namespace: str | None = None,
) -> HostDevice:
    return HostDevice(
        identity=identity,
        matched_by=matched_by,
        sysfs_path=f"{NVME_CLASS}/{controller}",
        pci_address=_pci_address_of(host.link_target(f"{NVME_CLASS}/{controller}/device")),
        device_nodes=_dedupe(_nvme_nodes(host, controller, only_namespace)),
    )


def _nvidia_nodes(host: _Host, address: str) -> list[DeviceNode]:
    """``/dev/nvidiaN`` (N the GPU's ``Device Minor``), ``/dev/nvidiactl`` and, when present,
    the unified-memory devices; numbers from the host's ``/dev``, else from ``/proc/devices``
    (the driver registers its major there; nvidiactl is minor 255)."""
    info = parse_colon_fields(host.text(f"{NVIDIA_GPUS}/{address}/information") or "")
    minor = parse_device_minor(info.get("Device Minor", ""))
    if minor is None:
        return []
    majors = parse_proc_devices(host.text("/proc/devices") or "")
    major = majors.get("nvidia-frontend", majors.get("nvidia"))
    uvm = majors.get("nvidia-uvm")
    wanted: list[tuple[str, int | None, int]] = [
        (f"/dev/nvidia{minor}", major, minor),
        ("/dev/nvidiactl", major, _NVIDIACTL_MINOR),
        ("/dev/nvidia-uvm", uvm, 0),
        ("/dev/nvidia-uvm-tools", uvm, 1),
    ]
    nodes: list[DeviceNode] = []
    for path, fallback_major, fallback_minor in wanted:
        numbers = host.char_numbers(path)
        if numbers is None and fallback_major is not None:
            numbers = (fallback_major, fallback_minor)
        if numbers is not None:
            nodes.append(DeviceNode(path, "c", *numbers))
    return nodes


def _vfio_nodes(host: _Host, address: str) -> list[DeviceNode]:
    """The function's VFIO group ``/dev/vfio/<group>`` and ``/dev/vfio/vfio``, when the group's
    device numbers are known (the host's ``/dev``, else ``/sys/class/vfio/<group>/dev``): a
    function not bound to vfio-pci has no group device, and then needs neither."""
    target = host.link_target(f"{PCI_DEVICES}/{address}/iommu_group")
    group = target.rstrip("/").rpartition("/")[2] if target else ""
    if not group.isdecimal():
        return []
    numbers = host.char_numbers(f"/dev/vfio/{group}") or host.dev_numbers(
        f"/sys/class/vfio/{group}/dev"
    )
    if numbers is None:
        return []
    nodes = [DeviceNode(f"/dev/vfio/{group}", "c", *numbers)]
    container = host.char_numbers("/dev/vfio/vfio") or host.dev_numbers("/sys/class/misc/vfio/dev")
    if container is not None:
        nodes.append(DeviceNode("/dev/vfio/vfio", "c", *container))
    return nodes


def _pci_nodes(host: _Host, address: str) -> tuple[DeviceNode, ...]:
    """What a container needs for a PCI function: an NVMe controller's devices when it is one,
    its VFIO group, and an NVIDIA GPU's devices."""
    nodes: list[DeviceNode] = []
    for controller in host.names(f"{PCI_DEVICES}/{address}/nvme", _NVME_CONTROLLER):
        nodes.extend(_nvme_nodes(host, controller))
    nodes.extend(_vfio_nodes(host, address))
    if parse_pci_id(host.text(f"{PCI_DEVICES}/{address}/vendor") or "") == NVIDIA_VENDOR_ID:
        nodes.extend(_nvidia_nodes(host, address))
    return _dedupe(nodes)


def _pci_device(host: _Host, identity: DeviceIdentity, matched_by: str, address: str) -> HostDevice:
    return HostDevice(
        identity=identity,
        matched_by=matched_by,
        sysfs_path=f"{PCI_DEVICES}/{address}",
        pci_address=address,
        device_nodes=_pci_nodes(host, address),
    )


@dataclass(frozen=True, slots=True)
class _Outcome:
    device: HostDevice | None
    reason: str


class _SysfsMatcher:
    """Shared shape of the matchers below: one search gives the device or the reason."""

    name = ""

    def __init__(self, host_root: Path = Path("/")) -> None:
        self._host = _Host(host_root)

    def find(self, identity: DeviceIdentity) -> HostDevice | None:
        """The device, or ``None`` (see :class:`DeviceMatcher`)."""
        return self._search(identity).device

    def explain(self, identity: DeviceIdentity) -> str:
        """What :meth:`find` looks for and where, or why it is skipped."""
        outcome = self._search(identity)
        if outcome.device is not None:
            return f"{self.name}: found at {outcome.device.sysfs_path}"
        return outcome.reason

    def _search(self, identity: DeviceIdentity) -> _Outcome:
        raise NotImplementedError

    def _skip(self, why: str) -> _Outcome:
        return _Outcome(None, f"{self.name} skipped: {why}")


class NvmeSerialMatcher(_SysfsMatcher):
    """An NVMe controller whose ``/sys/class/nvme/nvmeN/serial`` (space padding stripped)
    equals ``identity.serial``. Device nodes: ``/dev/nvmeN`` (character, from
    ``nvmeN/dev``) and each namespace's block device (``nvmeN/nvmeNnM/dev`` or
    ``/sys/block/nvmeNnM/dev``); the PCI address is the name of the controller's ``device``
    link target (none for a fabrics controller)."""

    name = "nvme-serial"

    def _search(self, identity: DeviceIdentity) -> _Outcome:
        serial = parse_nvme_serial(identity.serial or "")
        if serial is None:
            return self._skip("no serial")
        controllers = self._host.names(NVME_CLASS, _NVME_CONTROLLER)
        for controller in controllers:
            text = self._host.text(f"{NVME_CLASS}/{controller}/serial")
            if text is not None and parse_nvme_serial(text) == serial:
                return _Outcome(_nvme_device(self._host, identity, self.name, controller), "")
        return _Outcome(
            None,
            f"no NVMe serial {serial!r} in {NVME_CLASS}/*/serial ({len(controllers)} controllers)",
        )


class PciDsnMatcher(_SysfsMatcher):
    """A PCI function whose Device Serial Number (PCI Express Base Specification, section 7.9.3
    "Device Serial Number Extended Capability"; Linux drivers/pci/pci.c ``pci_get_dsn``), read
    from the binary ``/sys/bus/pci/devices/*/config``, equals ``identity.serial`` (lspci's
    ``00-11-...-77``, ``00:11:...``, or 16 hex digits, any case).

    Bridges are ignored (a switch's ports carry the switch's serial). The functions of one
    multi-function device share the serial: the lowest function is the answer. Matching
    functions in different devices are ambiguous: no match. Reading the extended configuration
    space needs CAP_SYS_ADMIN (others see 64 bytes).
    """

    name = "pci-dsn"

    def _search(self, identity: DeviceIdentity) -> _Outcome:
        if not identity.serial:
            return self._skip("no serial")
        wanted = parse_dsn_text(identity.serial)
        if wanted is None:
            return self._skip(f"serial {identity.serial!r} is not a PCIe device serial number")
        addresses = [a for a in self._host.names(PCI_DEVICES) if is_pci_address(a)]
        matches: list[str] = []
        readable = 0
        for address in addresses:
            config = self._host.data(f"{PCI_DEVICES}/{address}/config", CONFIG_SPACE_SIZE)
            if config is None:
                continue
            readable += 1
            if header_type(config) == 0 and find_dsn(config) == wanted:
                matches.append(address)
        where = f"DSN {format_dsn(wanted)} in {PCI_DEVICES}/*/config"
        if not matches:
            return _Outcome(None, f"no {where} ({readable} of {len(addresses)} functions readable)")
        devices = sorted({m.rpartition(".")[0] for m in matches})
        if len(devices) > 1:
            return _Outcome(None, f"{where} is ambiguous: {', '.join(matches)} (different devices)")
        return _Outcome(_pci_device(self._host, identity, self.name, matches[0]), "")


class UuidMatcher(_SysfsMatcher):
    """A UUID equal to ``identity.uuid`` (any case, ``GPU-`` prefix ignored): an NVMe
    namespace's ``/sys/class/nvme/*/nvme*n*/uuid`` (device nodes: the controller and that
    namespace), or an NVIDIA GPU's ``GPU UUID`` in ``/proc/driver/nvidia/gpus/<pci
    address>/information`` (device nodes: its VFIO group and NVIDIA devices)."""

    name = "uuid"

    def _search(self, identity: DeviceIdentity) -> _Outcome:
        if not identity.uuid:
            return self._skip("no uuid")
        wanted = normalise_uuid(identity.uuid)
        if wanted is None:
            return self._skip(f"{identity.uuid!r} is not a UUID")
        for controller in self._host.names(NVME_CLASS, _NVME_CONTROLLER):
            for entry in self._host.names(f"{NVME_CLASS}/{controller}", _NVME_NAMESPACE):
                text = self._host.text(f"{NVME_CLASS}/{controller}/{entry}/uuid")
                if text is not None and normalise_uuid(text) == wanted:
                    device = _nvme_device(self._host, identity, self.name, controller, entry)
                    return _Outcome(device, "")
        for address in self._host.names(NVIDIA_GPUS):
            if not is_pci_address(address):
                continue
            info = parse_colon_fields(self._host.text(f"{NVIDIA_GPUS}/{address}/information") or "")
            if normalise_uuid(info.get("GPU UUID", "")) == wanted:
                return _Outcome(_pci_device(self._host, identity, self.name, address), "")
        return _Outcome(
            None,
            f"no uuid {wanted} in {NVME_CLASS}/*/nvme*n*/uuid or {NVIDIA_GPUS}/*/information",
        )


class CxlSerialMatcher(_SysfsMatcher):
    """A CXL memory device whose ``/sys/bus/cxl/devices/memN/serial`` (``0x...``) equals
    ``identity.serial`` read as decimal or hex. Device node ``/dev/cxl/memN`` (from
    ``memN/dev``); the PCI address is that of the device's parent in sysfs."""

    name = "cxl-serial"

    def _search(self, identity: DeviceIdentity) -> _Outcome:
        if not identity.serial:
            return self._skip("no serial")
        wanted = serial_candidates(identity.serial)
        if not wanted:
            return self._skip(f"serial {identity.serial!r} is not a number")
        memdevs = self._host.names(CXL_DEVICES, _CXL_MEMDEV)
        for memdev in memdevs:
            serial = parse_cxl_serial(self._host.text(f"{CXL_DEVICES}/{memdev}/serial") or "")
            if serial is None or serial not in wanted:
                continue
            numbers = self._host.dev_numbers(f"{CXL_DEVICES}/{memdev}/dev")
            nodes = (DeviceNode(f"/dev/cxl/{memdev}", "c", *numbers),) if numbers else ()
            device = HostDevice(
                identity=identity,
                matched_by=self.name,
                sysfs_path=f"{CXL_DEVICES}/{memdev}",
                pci_address=_pci_address_of(
                    self._host.link_target(f"{CXL_DEVICES}/{memdev}"), parent=True
                ),
                device_nodes=nodes,
            )
            return _Outcome(device, "")
        shown = " or ".join(f"0x{n:x}" for n in sorted(wanted))
        return _Outcome(
            None,
            f"no CXL memory device serial {shown} in {CXL_DEVICES}/mem*/serial "
            f"({len(memdevs)} memory devices)",
        )


def _valid_slot_name(slot: str) -> bool:
    return bool(slot) and "/" not in slot and "\0" not in slot and slot not in (".", "..")


class PciIdSlotMatcher(_SysfsMatcher):
    """The one PCI function with ``identity.pci_vendor_id`` and ``pci_device_id`` (sysfs
    ``vendor``/``device``, ``0x10de``), in the slot ``/sys/bus/pci/slots/<identity.slot>`` (its
    ``address`` is ``domain:bus:device``) when the identity names a slot. Two or more such
    functions are ambiguous: no match, and the reason lists them."""

    name = "pci-id-slot"

    def _search(self, identity: DeviceIdentity) -> _Outcome:
        vendor = parse_pci_id(identity.pci_vendor_id or "")
        device = parse_pci_id(identity.pci_device_id or "")
        if identity.pci_vendor_id is None or identity.pci_device_id is None:
            return self._skip("no PCI vendor and device id")
        if vendor is None or device is None:
            shown = f"{identity.pci_vendor_id!r}:{identity.pci_device_id!r}"
            return self._skip(f"PCI ids {shown} are not 0x and 4 hex digits")
        ids = f"{format_pci_id(vendor)}:{format_pci_id(device)}"
        matches = [
            address
            for address in self._host.names(PCI_DEVICES)
            if is_pci_address(address)
            and parse_pci_id(self._host.text(f"{PCI_DEVICES}/{address}/vendor") or "") == vendor
            and parse_pci_id(self._host.text(f"{PCI_DEVICES}/{address}/device") or "") == device
        ]
        where = f"PCI function {ids} in {PCI_DEVICES}/*/vendor,device"
        if identity.slot is not None:
            slot = identity.slot
            if not _valid_slot_name(slot):
                return self._skip(f"slot {slot!r} is not a slot directory name")
            slot_address = parse_slot_address(self._host.text(f"{PCI_SLOTS}/{slot}/address") or "")
            if slot_address is None:
                return _Outcome(
                    None,
                    f"no slot {slot!r} with an address in {PCI_SLOTS}/*/address "
                    f"({len(matches)} functions {ids} elsewhere)",
                )
            matches = [a for a in matches if a.startswith(f"{slot_address}.")]
            where = f"{where} in slot {slot!r} ({slot_address})"
        if not matches:
            return _Outcome(None, f"no {where}")
        if len(matches) > 1:
            return _Outcome(
                None,
                f"{where} is ambiguous: {', '.join(matches)}"
                + ("" if identity.slot is not None else " and no slot to tell them apart"),
            )
        return _Outcome(_pci_device(self._host, identity, self.name, matches[0]), "")


def matchers_for(device_type: str, host_root: Path = Path("/")) -> tuple[DeviceMatcher, ...]:
    """The matchers to try, in order, for a device type (case-insensitive): ``nvme``: NVMe
    serial, UUID, PCIe DSN; ``gpu``, ``fpga``, ``accelerator``: UUID, PCIe DSN, PCI id and slot;
    ``cxl-memory``: CXL serial, PCIe DSN; any other: PCIe DSN, PCI id and slot. Each reads
    under ``host_root``."""
    kind = device_type.strip().lower()
    if kind == "nvme":
        return (
            NvmeSerialMatcher(host_root),
            UuidMatcher(host_root),
            PciDsnMatcher(host_root),
        )
    if kind in ("gpu", "fpga", "accelerator"):
        return (UuidMatcher(host_root), PciDsnMatcher(host_root), PciIdSlotMatcher(host_root))
    if kind == "cxl-memory":
        return (CxlSerialMatcher(host_root), PciDsnMatcher(host_root))
    return (PciDsnMatcher(host_root), PciIdSlotMatcher(host_root))


def _look(matchers: Sequence[DeviceMatcher], identity: DeviceIdentity) -> HostDevice | None:
    for matcher in matchers:
        try:
            found = matcher.find(identity)
        except (OSError, ValueError) as err:
            # Ours do not raise; a matcher supplied from outside must not end the wait.
            log.warning("matcher %s failed for device %s: %s", matcher.name, identity.device, err)
            continue
        if found is not None:
            return found
    return None


def _last_look(
    matchers: Sequence[DeviceMatcher], identity: DeviceIdentity
) -> HostDevice | list[str]:
    """One more look, then the reasons: the device may have appeared since the last poll."""
    found = _look(matchers, identity)
    if found is not None:
        return found
    reasons: list[str] = []
    for matcher in matchers:
        try:
            reasons.append(matcher.explain(identity))
        except (OSError, ValueError) as err:
            reasons.append(f"{matcher.name} failed: {err}")
    return reasons


def _request_rescan(host_root: Path, device: str) -> str:
    """Write ``1`` to ``/sys/bus/pci/rescan`` (never creating it); a note for the error."""
    path = host_root.joinpath(PCI_RESCAN.lstrip("/"))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
    except OSError as err:
        log.warning(
            "device %s: could not request a PCI rescan through %s: %s",
            device,
            path,
            err,
            extra={"device": device},
        )
        return f"PCI rescan through {path} failed: {err.strerror or err}"
    log.info("device %s: requested a PCI rescan", device, extra={"device": device})
    return "a PCI rescan was requested"


async def locate(
    identity: DeviceIdentity,
    *,
    host_root: Path,
    timeout_s: float,
    poll_s: float,
    rescan: bool,
    matchers: Sequence[DeviceMatcher] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> HostDevice:
    """Find ``identity`` on this host, looking every ``poll_s`` seconds for up to ``timeout_s``
    seconds (``clock`` in seconds, ``sleep`` injectable for tests).

    ``matchers`` default to :func:`matchers_for` the device's type under ``host_root``; the
    first to find the device wins. Each look runs in a worker thread. With ``rescan``, a first
    look that finds nothing is followed by one write of ``1`` to the host's
    ``/sys/bus/pci/rescan`` (a failure is logged and the wait goes on) and an immediate second
    look.

    Raises:
        DeviceNotFound: not found when the time is up (one last look is made then); the message
            says what each matcher looked for and where.
        ValueError: ``timeout_s`` < 0 or ``poll_s`` <= 0.
    """
    if timeout_s < 0 or poll_s <= 0:
        raise ValueError(
            f"device {identity.device}: wait {timeout_s!r} s must be >= 0 and poll interval "
            f"{poll_s!r} s > 0"
        )
    chosen = (
        tuple(matchers) if matchers is not None else matchers_for(identity.device_type, host_root)
    )
    notes: list[str] = []
    if host_root != Path("/"):
        notes.append(f"host root {host_root}")
    start = clock()
    rescanned = False
    while True:
        found = await asyncio.to_thread(_look, chosen, identity)
        if found is None and rescan and not rescanned:
            rescanned = True
            notes.append(await asyncio.to_thread(_request_rescan, host_root, identity.device))
            found = await asyncio.to_thread(_look, chosen, identity)
        if found is not None:
            log.debug(
                "device %s found at %s by %s",
                identity.device,
                found.sysfs_path,
                found.matched_by,
                extra={"device": identity.device, "pool": identity.pool},
            )
            return found
        waited = clock() - start
        if waited >= timeout_s:
            last = await asyncio.to_thread(_last_look, chosen, identity)
            if isinstance(last, HostDevice):
                return last
            raise DeviceNotFound(identity, last, timeout_s, notes)
        await sleep(min(poll_s, timeout_s - waited))


def hook_environment(device: HostDevice) -> dict[str, str]:
    """The variables a hook gets about its device: ``FABRIC_DRA_DEVICE`` (the device name in
    the pool), ``FABRIC_DRA_PCI_ADDRESS`` (empty when not a PCI function) and
    ``FABRIC_DRA_DEVICE_TYPE``."""
    return {
        "FABRIC_DRA_DEVICE": device.identity.device,
        "FABRIC_DRA_PCI_ADDRESS": device.pci_address or "",
        "FABRIC_DRA_DEVICE_TYPE": device.identity.device_type,
    }


async def _collect(stream: asyncio.StreamReader, tail: bytearray) -> None:
    while chunk := await stream.read(4096):
        tail.extend(chunk)
        del tail[:-_STDERR_KEEP]


def _last_line(tail: bytes | bytearray) -> str:
    lines = [line.strip() for line in tail.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return "(no output on stderr)"
    return lines[-1][:_STDERR_LINE]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _kill_group(process: asyncio.subprocess.Process) -> None:
    # The hook runs in a session of its own: its children go with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def _drain(reader: asyncio.Task[None]) -> None:
    """Let the stderr reader reach the end; a child that keeps the pipe open is not waited for."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(reader), _STDERR_GRACE_S)
    if not reader.done():
        await cancel_and_wait(reader)


async def run_hook(
    command: Sequence[str],
    env: Mapping[str, str],
    timeout_s: float,
    *,
    device: HostDevice | None = None,
) -> None:
    """Run the vendor hook ``command`` (an executable and its arguments, no shell) with this
    process's environment plus ``env`` plus, given ``device``, :func:`hook_environment`;
    stdin and stdout are ``/dev/null``, the tail of stderr is kept for the error.

    The hook gets ``timeout_s`` seconds; then it and its process group are killed. Cancelling
    the call kills them too.

    Raises:
        HookFailed: empty command, the executable missing or not executable, a non-zero exit,
            death by a signal, or the timeout; one line ending with stderr's last line.
    """
    if not command or not command[0]:
        raise HookFailed("hook command is empty")
    name = command[0]
    child_env = {**os.environ, **env, **(hook_environment(device) if device else {})}
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=child_env,
            start_new_session=True,
        )
    except OSError as err:
        raise HookFailed(f"hook {name!r} could not start: {err.strerror or err}") from err
    assert process.stderr is not None
    tail = bytearray()
    reader = asyncio.create_task(_collect(process.stderr, tail))
    try:
        returncode = await asyncio.wait_for(process.wait(), timeout_s)
    except TimeoutError:
        _kill_group(process)
        await process.wait()
        await _drain(reader)
        raise HookFailed(
            f"hook {name!r} did not finish within {timeout_s:g} s and was killed: "
            f"{_last_line(tail)}"
        ) from None
    except BaseException:
        _kill_group(process)
        await asyncio.shield(process.wait())
        await _drain(reader)
        raise
    await _drain(reader)
    if returncode < 0:
        raise HookFailed(
            f"hook {name!r} was killed by signal {_signal_name(-returncode)}: {_last_line(tail)}"
        )
    if returncode != 0:
        raise HookFailed(f"hook {name!r} exited with status {returncode}: {_last_line(tail)}")
