"""Pure parsing of what Linux shows in sysfs, procfs and PCI configuration space.

Every function takes the text or bytes of one file and returns a value, or ``None`` when the
input is not what the kernel writes there (truncated, garbage, out of range): the finder skips
such a candidate instead of failing. Nothing here touches the filesystem.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

# domain:bus:device.function, as the PCI core names devices (drivers/pci/probe.c,
# pci_setup_device: "%04x:%02x:%02x.%d").
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
# domain:bus:device, as /sys/bus/pci/slots/*/address shows a slot (drivers/pci/slot.c,
# address_read_file).
_PCI_SLOT_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}")
# "major:minor" as a device's "dev" attribute prints it (drivers/base/core.c, dev_show).
_DEV_NUMBERS = re.compile(r"(\d{1,4}):(\d{1,7})")
# dev_t has 12 bits of major and 20 of minor (include/linux/kdev_t.h, MINORBITS).
_MAX_MAJOR = (1 << 12) - 1
_MAX_MINOR = (1 << 20) - 1

_HEX_ID = re.compile(r"0x([0-9a-f]{4})")
_DSN_GROUPED = re.compile(r"[0-9a-f]{2}([-:])[0-9a-f]{2}(\1[0-9a-f]{2}){6}")
_HEX_DIGITS = re.compile(r"[0-9a-f]+")

# PCI Express Base Specification (revision 5.0), section 7.6.3 "PCI Express Extended Capability
# Header": the extended capabilities start at 100h in the 4 KiB configuration space; each header
# dword holds the capability id (bits 15:0), its version (19:16) and the next capability's
# offset (31:20, 0 ends the list; bits 1:0 are reserved, so Linux masks it with 0xffc:
# include/uapi/linux/pci_regs.h PCI_EXT_CAP_NEXT).
EXTENDED_CONFIG_START = 0x100
CONFIG_SPACE_SIZE = 4096
# Section 7.9.3 "Device Serial Number Extended Capability": id 0003h; the 64-bit serial follows
# the header, lower dword first (Linux drivers/pci/pci.c, pci_get_dsn).
DSN_CAPABILITY_ID = 0x0003
_HEADER_TYPE_OFFSET = 0x0E


def is_pci_address(name: str) -> bool:
    """True when ``name`` is a PCI function's sysfs name, e.g. ``0000:3b:00.0`` (lower case)."""
    return _PCI_ADDRESS.fullmatch(name) is not None


def parse_slot_address(text: str) -> str | None:
    """The ``domain:bus:device`` of a ``/sys/bus/pci/slots/<slot>/address`` file
    (``"0000:3b:00\\n"``), lower-cased; ``None`` for anything else (an empty slot prints
    nothing useful)."""
    value = text.strip().lower()
    return value if _PCI_SLOT_ADDRESS.fullmatch(value) else None


def parse_dev_numbers(text: str) -> tuple[int, int] | None:
    """``(major, minor)`` from a sysfs ``dev`` attribute (``"259:0\\n"``); ``None`` when it is
    garbage or out of dev_t's range (major < 4096, minor < 2**20)."""
    found = _DEV_NUMBERS.fullmatch(text.strip())
    if found is None:
        return None
    major, minor = int(found.group(1)), int(found.group(2))
    if major > _MAX_MAJOR or minor > _MAX_MINOR:
        return None
    return major, minor


def parse_pci_id(text: str) -> int | None:
    """A vendor or device id as sysfs prints it (``"0x10de\\n"``) or as an identity carries it
    (``"0x10DE"``), as a number; ``None`` for anything but ``0x`` and four hex digits."""
    found = _HEX_ID.fullmatch(text.strip().lower())
    return int(found.group(1), 16) if found else None


def format_pci_id(value: int) -> str:
    """``0x10de`` for 0x10DE: the form sysfs prints."""
    return f"0x{value:04x}"


def parse_nvme_serial(text: str) -> str | None:
    """An NVMe controller's serial (``/sys/class/nvme/nvmeN/serial``) without the space padding
    the Identify Controller data carries (NVMe Base Specification, "Serial Number (SN)": ASCII,
    padded with spaces); ``None`` when blank."""
    value = text.strip()
    return value or None


def normalise_uuid(text: str) -> str | None:
    """A UUID in canonical lower-case form, from an identity, an NVMe namespace's ``uuid`` file or
    NVIDIA's ``GPU UUID`` (a ``GPU-`` prefix is dropped; braces, ``urn:uuid:`` and missing dashes
    are accepted). ``None`` for anything that is not a UUID, and for the all-zero UUID that a
    namespace without one reports."""
    value = text.strip()
    if value[:4].lower() == "gpu-":
        value = value[4:]
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return None
    return None if parsed.int == 0 else str(parsed)


def parse_dsn_text(text: str) -> int | None:
    """A PCIe Device Serial Number written as text, most significant byte first:
    ``00-11-22-33-44-55-66-77`` (lspci's form), ``00:11:...:77``, ``0011223344556677`` or
    ``0x0011223344556677``, any case. ``None`` for anything else."""
    value = text.strip().lower()
    if _DSN_GROUPED.fullmatch(value):
        return int(value.replace(value[2], ""), 16)
    value = value.removeprefix("0x")
    if len(value) == 16 and _HEX_DIGITS.fullmatch(value):
        return int(value, 16)
    return None


def format_dsn(value: int) -> str:
    """lspci's form of a 64-bit Device Serial Number: ``00-11-22-33-44-55-66-77``."""
    raw = f"{value:016x}"
    return "-".join(raw[i : i + 2] for i in range(0, 16, 2))


def serial_candidates(text: str) -> frozenset[int]:
    """The numbers a serial written as text may mean, for comparing with a CXL memory device's
    serial (which Linux prints as ``0x%llx``): ``0x1234`` is hex; ``4660`` is decimal and also
    read as hex (a digits-only string is ambiguous); ``00-11-...`` and other hex-only strings are
    hex. Empty for text that is no number; values beyond 64 bits are dropped."""
    value = text.strip().lower()
    found: set[int] = set()
    dsn = parse_dsn_text(value)
    if dsn is not None:
        found.add(dsn)
    if value.startswith("0x"):
        if _HEX_DIGITS.fullmatch(value[2:]):
            found.add(int(value[2:], 16))
    elif _HEX_DIGITS.fullmatch(value):
        found.add(int(value, 16))
        if value.isdecimal():
            found.add(int(value))
    return frozenset(n for n in found if n < 1 << 64)


def parse_cxl_serial(text: str) -> int | None:
    """A CXL memory device's ``serial`` attribute (drivers/cxl/core/memdev.c, serial_show:
    ``"0x%llx\\n"``), as a number; ``None`` for anything else."""
    value = text.strip().lower()
    if not value.startswith("0x") or not _HEX_DIGITS.fullmatch(value[2:]) or len(value) > 18:
        return None
    return int(value[2:], 16)


def header_type(config: bytes) -> int | None:
    """The configuration header's layout (0 an endpoint, 1 a PCI-to-PCI bridge, 2 CardBus),
    without the multi-function bit; ``None`` when ``config`` is too short to hold it."""
    if len(config) <= _HEADER_TYPE_OFFSET:
        return None
    return config[_HEADER_TYPE_OFFSET] & 0x7F


def extended_capabilities(config: bytes) -> Iterator[tuple[int, int, int]]:
    """``(offset, capability id, version)`` for each extended capability in a PCI function's
    configuration space (the binary ``/sys/bus/pci/devices/<address>/config``), in list order.

    Stops, without an error, at the end of the list, at an offset outside the bytes given or
    below 100h, at an offset seen before (a loop), or at an all-zero or all-ones header (no
    extended capabilities, or a function that does not answer). A config file of 256 bytes or
    less (conventional PCI, or read without CAP_SYS_ADMIN: Linux then gives the first 64 bytes)
    has none.
    """
    offset = EXTENDED_CONFIG_START
    seen: set[int] = set()
    while offset >= EXTENDED_CONFIG_START and offset + 4 <= len(config) and offset not in seen:
        seen.add(offset)
        header = int.from_bytes(config[offset : offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return
        yield offset, header & 0xFFFF, (header >> 16) & 0xF
        offset = (header >> 20) & 0xFFC
        if offset == 0:
            return


def find_dsn(config: bytes) -> int | None:
    """The Device Serial Number in a PCI function's configuration space, or ``None`` when it
    has no DSN capability or the bytes end inside it. See :func:`extended_capabilities` for
    what is tolerated."""
    for offset, capability_id, _version in extended_capabilities(config):
        if capability_id == DSN_CAPABILITY_ID:
            if offset + 12 > len(config):
                return None
            return int.from_bytes(config[offset + 4 : offset + 12], "little")
    return None


def parse_colon_fields(text: str) -> dict[str, str]:
    """``Key: value`` lines (NVIDIA's ``/proc/driver/nvidia/gpus/<address>/information``:
    ``GPU UUID: \\t GPU-...``, ``Device Minor: \\t 0``) as a dict; lines without a colon are
    ignored, the first occurrence of a key wins."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and key.strip():
            fields.setdefault(key.strip(), value.strip())
    return fields


def parse_device_minor(text: str) -> int | None:
    """An NVIDIA ``Device Minor`` value (``"0"``), when it is a minor number (0..254: 255 is
    ``/dev/nvidiactl``'s)."""
    value = text.strip()
    if not value.isdecimal() or len(value) > 3 or int(value) > 254:
        return None
    return int(value)


def parse_proc_devices(text: str) -> dict[str, int]:
    """The character device majors of ``/proc/devices`` (``"195 nvidia-frontend"``) by driver
    name; the block section and malformed lines are ignored; the first major of a name wins."""
    majors: dict[str, int] = {}
    in_character = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            in_character = stripped == "Character devices:"
            continue
        number, _, name = stripped.partition(" ")
        if in_character and number.isdecimal() and name.strip():
            major = int(number)
            if major <= _MAX_MAJOR:
                majors.setdefault(name.strip(), major)
    return majors
