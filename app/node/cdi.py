"""CDI specs for prepared claims: names, the spec's JSON object, and its atomic file write.

The node plugin writes one Container Device Interface spec file per (claim, device type); the
kubelet hands the container runtime the CDI IDs of the claim's devices and the runtime applies
the edits found in the spec. Everything here is pure except the three file functions at the end
(:func:`write_spec`, :func:`remove_spec`, :func:`list_spec_files`).

Sources (github.com/cncf-tags/container-device-interface):

- ``SPEC.md``: the JSON format, the kind (``<vendor>/<class>``, class at most 63 characters,
  vendor a DNS subdomain at most 253), the version table.
- ``pkg/parser/parser.go``: ``ValidateVendorName``, ``ValidateClassName``,
  ``ValidateDeviceName``, ``ParseQualifier`` and the qualified name ``vendor/class=name``.
- ``specs-go/version.go``: the minimum version a spec's content needs (``requiresV050``,
  ``requiresV060``) and the refusal of versions a library does not know (``isValidVersion``).
- ``pkg/cdi/spec.go``: ``GenerateSpecName`` / ``GenerateTransientSpecName`` (file names),
  ``Spec.validate`` (at least one device, no duplicate device names).
- ``pkg/cdi/device.go``: a device with empty container edits is refused.
- ``pkg/cdi/container-edits.go``: ``ValidateEnv`` (``NAME=value`` with a non-empty name),
  device-node types.
- ``pkg/cdi/spec-dirs.go`` and ``cache.go``: the cache reads only ``*.json`` / ``*.yaml`` files,
  so a temporary file named ``.<name>.<random>.tmp`` is never loaded half-written.
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from app.jsontypes import JsonDict
from app.node.identity import DeviceNode

# specs-go/version.go: a device name that starts with a digit needs 0.5.0 (requiresV050), and
# our device names start with the claim's UID, which often does. Nothing else we emit (env,
# deviceNodes with path/type/major/minor, mounts without "type") needs more. The lowest
# version is the safest choice: a CDI library refuses any version it does not know
# (isValidVersion), so an older runtime would refuse a newer number.
CDI_VERSION = "0.5.0"
# specs-go/version.go requiresV060: a dot in the kind's class needs 0.6.0 (SPEC.md: "Dots (.)
# are supported from v0.6.0"). Only a spec whose device type has a dot gets it.
CDI_VERSION_DOTTED_CLASS = "0.6.0"

MAX_CLASS_LENGTH = 63  # SPEC.md, "Kind": the name segment is 63 characters or less
MAX_VENDOR_LENGTH = 253  # SPEC.md, "Kind": the prefix is a DNS subdomain of at most 253

SPEC_FILE_MODE = 0o644
SPEC_DIR_MODE = 0o755

_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_ALNUM = _LETTERS | frozenset("0123456789")
_VENDOR_CLASS_INNER = _ALNUM | frozenset("_-.")
_DEVICE_NAME_INNER = _VENDOR_CLASS_INNER | frozenset(":")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_PART_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_DEVICE_NODE_TYPES = ("b", "c")
_MAX_DEVICE_NUMBER = 2**32 - 1  # glibc's major()/minor() are 32-bit; the schema's int64 is wider


class CdiError(ValueError):
    """A name, kind, path or value that CDI (or our use of it) does not accept.

    The message names the value and the rule it breaks.
    """


class CdiWriteError(Exception):
    """A spec file could not be written, removed or listed.

    The message is one line: ``cannot write CDI spec <path>: <strerror>`` (``remove`` and
    ``list`` for the other two); the ``OSError`` is the cause.

    Attributes:
        path: the file (or directory) concerned.
        errno: the ``OSError``'s errno, if it had one.
    """

    def __init__(self, message: str, path: Path, error_number: int | None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = error_number


@dataclass(frozen=True, slots=True)
class Mount:
    """A bind mount to give the container (``containerEdits.mounts[]``).

    Attributes:
        host_path: absolute path on the host.
        container_path: absolute path inside the container.
        options: OCI mount options, e.g. ``("bind", "ro")``; runc makes a bind mount only when
            ``bind`` or ``rbind`` is among them (we emit no mount ``type``).
    """

    host_path: str
    container_path: str
    options: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """One CDI device of a spec: a claim's device and its container edits.

    Attributes:
        name: the CDI device name (:func:`cdi_device_name`).
        device_nodes: ``/dev`` entries (same path on host and in the container).
        env: ``(name, value)`` pairs, names unique within the device.
        mounts: bind mounts, container paths unique within the device.
    """

    name: str
    device_nodes: tuple[DeviceNode, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()


# --- names (pkg/parser/parser.go) -----------------------------------------------------------


def _check_chars(value: str, what: str, first: frozenset[str], inner: frozenset[str]) -> None:
    """The rule shared by parser.go's validators: first, middle and last characters."""
    if not value:
        raise CdiError(f"invalid CDI {what} {value!r}: must not be empty")
    if value[0] not in first:
        start = "a letter" if first is _LETTERS else "a letter or digit"
        raise CdiError(f"invalid CDI {what} {value!r}: must start with {start}")
    for ch in value[1:-1]:
        if ch not in inner:
            raise CdiError(
                f"invalid CDI {what} {value!r}: character {ch!r} is not allowed "
                f"(allowed: A-Z a-z 0-9 {' '.join(sorted(inner - _ALNUM))})"
            )
    if value[-1] not in _ALNUM:
        raise CdiError(f"invalid CDI {what} {value!r}: must end with a letter or digit")


def validate_vendor(vendor: str) -> str:
    """Check a CDI vendor name and return it.

    Rule (pkg/parser/parser.go ``ValidateVendorName``): ASCII only; starts with a letter, ends
    with a letter or digit, in between letters, digits, ``_``, ``-`` and ``.``.

    Raises:
        CdiError: the name breaks the rule.
    """
    _check_chars(vendor, "vendor", _LETTERS, _VENDOR_CLASS_INNER)
    return vendor


def validate_class(cls: str) -> str:
    """Check a CDI class name and return it.

    Rule (pkg/parser/parser.go ``ValidateClassName``): the vendor's rule.

    Raises:
        CdiError: the name breaks the rule.
    """
    _check_chars(cls, "class", _LETTERS, _VENDOR_CLASS_INNER)
    return cls


def validate_device_name(name: str) -> str:
    """Check a CDI device name (the part after ``=`` in a CDI ID) and return it.

    Rule (pkg/parser/parser.go ``ValidateDeviceName``): ASCII only; starts and ends with a
    letter or digit, in between letters, digits, ``_``, ``-``, ``.`` and ``:``.

    Raises:
        CdiError: the name breaks the rule.
    """
    _check_chars(name, "device name", _ALNUM, _DEVICE_NAME_INNER)
    return name


def _check_kind_parts(vendor: str, cls: str) -> None:
    validate_vendor(vendor)
    validate_class(cls)
    if len(vendor) > MAX_VENDOR_LENGTH:
        raise CdiError(f"invalid CDI vendor {vendor!r}: longer than {MAX_VENDOR_LENGTH} characters")
    if len(cls) > MAX_CLASS_LENGTH:
        raise CdiError(f"invalid CDI class {cls!r}: longer than {MAX_CLASS_LENGTH} characters")


def cdi_kind(driver: str, device_type: str) -> str:
    """The CDI kind of a driver's devices of one type: ``fabric.example.com/gpu``.

    The vendor is the DRA driver name, the class the device type.

    Raises:
        CdiError: ``driver`` is not a valid vendor or ``device_type`` not a valid class
            (pkg/parser/parser.go), or either is too long (SPEC.md, "Kind").
    """
    _check_kind_parts(driver, device_type)
    return f"{driver}/{device_type}"


def parse_kind(kind: str) -> tuple[str, str]:
    """Split and check a kind: ``"fabric.example.com/gpu"`` -> ``("fabric.example.com", "gpu")``.

    Split at the first ``/`` as pkg/parser/parser.go ``ParseQualifier`` does, so
    ``a.com/b/c`` has the class ``b/c``, which the class rule refuses.

    Raises:
        CdiError: no ``/``, an empty part, or a part that breaks its rule.
    """
    vendor, sep, cls = kind.partition("/")
    if not sep or not vendor or not cls:
        raise CdiError(f"invalid CDI kind {kind!r}: must be <vendor>/<class>")
    try:
        _check_kind_parts(vendor, cls)
    except CdiError as err:
        raise CdiError(f"invalid CDI kind {kind!r}: {err}") from None
    return vendor, cls


def _check_claim_uid(claim_uid: str) -> None:
    # The UID goes into a file name and a device name: the device-name alphabet keeps it free of
    # '/' and of a leading '.', so the file stays in the CDI directory and is not hidden.
    try:
        validate_device_name(claim_uid)
    except CdiError as err:
        raise CdiError(f"invalid claim UID {claim_uid!r}: {err}") from None


def cdi_device_name(claim_uid: str, device: str) -> str:
    """The CDI device name of a claim's device: ``<claimUID>-<device>``.

    Unique on the node: two claims never share a UID, and a claim's devices of one type have
    distinct names in their pool (devices of one type in two pools with the same name would
    clash; the caller's spec build refuses that).

    Raises:
        CdiError: the UID or the result breaks the device-name rule
            (pkg/parser/parser.go ``ValidateDeviceName``).
    """
    _check_claim_uid(claim_uid)
    return validate_device_name(f"{claim_uid}-{device}")


def cdi_device_id(kind: str, name: str) -> str:
    """The fully qualified CDI device ID: ``<vendor>/<class>=<name>``.

    Source: pkg/parser/parser.go ``QualifiedName``; the kubelet passes these IDs to the runtime.

    Raises:
        CdiError: a bad kind or device name.
    """
    parse_kind(kind)
    validate_device_name(name)
    return f"{kind}={name}"


def spec_file_name(kind: str, claim_uid: str) -> str:
    """The spec file name of a claim's devices of one kind: ``<vendor>-<class>_<claimUID>.json``.

    Source: pkg/cdi/spec.go ``GenerateTransientSpecName`` (``<vendor>-<class>_<id>``, with
    ``/`` in the id made ``_``; our UIDs have none) plus the ``.json`` extension the cache reads.

    Raises:
        CdiError: a bad kind or claim UID.
    """
    vendor, cls = parse_kind(kind)
    _check_claim_uid(claim_uid)
    return f"{vendor}-{cls}_{claim_uid}.json"


def env_name_for(device: str, field: str) -> str:
    """The environment variable of one field of a device: ``FABRIC_DRA_DEVICE_<DEVICE>_<FIELD>``.

    ``device`` and ``field`` are upper-cased (ASCII) and every character outside ``A-Z0-9``
    becomes ``_``: ``("gpu-3f2a", "uuid")`` -> ``FABRIC_DRA_DEVICE_GPU_3F2A_UUID``. Names that
    differ only in such characters (``gpu-1``, ``gpu.1``) give the same variable.

    Raises:
        CdiError: ``device`` or ``field`` is empty.
    """
    if not device:
        raise CdiError("invalid device name '' for an environment variable: must not be empty")
    if not field:
        raise CdiError(f"invalid field name '' for device {device!r}: must not be empty")
    return f"FABRIC_DRA_DEVICE_{_env_part(device)}_{_env_part(field)}"


def _env_part(text: str) -> str:
    upper = "".join(ch.upper() if "a" <= ch <= "z" else ch for ch in text)
    return "".join(ch if ch in _ENV_PART_SAFE else "_" for ch in upper)


# --- the spec's JSON object ------------------------------------------------------------------


def validate_env_name(name: str) -> str:
    """Check an environment variable name (``[A-Za-z_][A-Za-z0-9_]*``, ASCII) and return it.

    Stricter than pkg/cdi/container-edits.go ``ValidateEnv`` (which wants only a non-empty name
    before ``=``): POSIX shells and most programs handle nothing else.

    Raises:
        CdiError: the name breaks the rule.
    """
    if not _ENV_NAME.fullmatch(name):
        raise CdiError(
            f"invalid environment variable name {name!r}: must match [A-Za-z_][A-Za-z0-9_]*"
        )
    return name


def _env_entries(pairs: Iterable[tuple[str, str]], owner: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for name, value in pairs:
        validate_env_name(name)
        if "\x00" in value:
            raise CdiError(f"{owner}: environment variable {name!r}: value contains a NUL byte")
        if name in env:
            raise CdiError(f"{owner}: environment variable {name!r} is given twice")
        env[name] = value
    return env


def _check_path(path: str, what: str) -> None:
    if not path.startswith("/"):
        raise CdiError(f"{what} {path!r}: must be an absolute path")
    if "\x00" in path:
        raise CdiError(f"{what} {path!r}: contains a NUL byte")
    if ".." in path.split("/"):
        raise CdiError(f"{what} {path!r}: must not contain '..'")


def _device_node_json(node: DeviceNode, owner: str) -> JsonDict:
    _check_path(node.path, f"{owner}: device node path")
    if node.type not in _DEVICE_NODE_TYPES:
        raise CdiError(f"{owner}: device node {node.path!r}: type {node.type!r} is not 'c' or 'b'")
    for what, number in (("major", node.major), ("minor", node.minor)):
        if isinstance(number, bool) or not isinstance(number, int):
            raise CdiError(f"{owner}: device node {node.path!r}: {what} {number!r} is not an int")
        if not 0 <= number <= _MAX_DEVICE_NUMBER:
            raise CdiError(
                f"{owner}: device node {node.path!r}: {what} {number} is outside "
                f"0..{_MAX_DEVICE_NUMBER}"
            )
    return {"path": node.path, "type": node.type, "major": node.major, "minor": node.minor}


def _mount_json(mount: Mount, owner: str) -> JsonDict:
    _check_path(mount.host_path, f"{owner}: mount host path")
    _check_path(mount.container_path, f"{owner}: mount container path")
    for option in mount.options:
        if not option or "\x00" in option:
            raise CdiError(
                f"{owner}: mount {mount.container_path!r}: option {option!r} is empty or has a "
                "NUL byte"
            )
    out: JsonDict = {"hostPath": mount.host_path, "containerPath": mount.container_path}
    if mount.options:
        # Order matters to the kernel ("ro" after "bind" ...): kept as given.
        out["options"] = list(mount.options)
    return out


def _device_edits(device: CdiDevice, spec_env: Mapping[str, str]) -> JsonDict:
    owner = f"CDI device {device.name!r}"
    env = _env_entries(device.env, owner)
    for name in env:
        if name in spec_env:
            raise CdiError(f"{owner}: environment variable {name!r} is also set for the whole spec")
    nodes = [_device_node_json(node, owner) for node in device.device_nodes]
    nodes.sort(key=lambda n: str(n["path"]))
    mounts = [_mount_json(mount, owner) for mount in device.mounts]
    # A parent path sorts before the paths under it, so nested mounts stay in a working order.
    mounts.sort(key=lambda m: str(m["containerPath"]))
    _refuse_repeats([str(n["path"]) for n in nodes], f"{owner}: device node path")
    _refuse_repeats([str(m["containerPath"]) for m in mounts], f"{owner}: mount container path")
    edits: JsonDict = {}
    # Empty lists are left out, as the Go library's `omitempty` does when it writes a spec.
    if env:
        edits["env"] = [f"{name}={env[name]}" for name in sorted(env)]
    if nodes:
        edits["deviceNodes"] = nodes
    if mounts:
        edits["mounts"] = mounts
    if not edits:
        # pkg/cdi/device.go validate: "invalid device, empty device edits".
        raise CdiError(f"{owner}: has no environment, device nodes or mounts (CDI refuses it)")
    return edits


def _refuse_repeats(values: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise CdiError(f"{what} {value!r} is given twice")
        seen.add(value)


def build_spec(kind: str, devices: Sequence[CdiDevice], spec_env: Mapping[str, str]) -> JsonDict:
    """The CDI spec object of a claim's devices of one kind.

    Shape (SPEC.md, "CDI JSON Specification")::

        {"cdiVersion": "0.5.0", "kind": "<vendor>/<class>",
         "devices": [{"name": ..., "containerEdits": {"env": ["K=V", ...],
                      "deviceNodes": [{"path", "type", "major", "minor"}, ...],
                      "mounts": [{"hostPath", "containerPath", "options"?}, ...]}}, ...],
         "containerEdits": {"env": ["K=V", ...]}}

    Deterministic: devices sorted by name, env by variable name, device nodes by path, mounts by
    container path (mount options keep their order); empty lists and an empty spec-level
    ``containerEdits`` are left out. ``cdiVersion`` is :data:`CDI_VERSION`, or
    :data:`CDI_VERSION_DOTTED_CLASS` when the class has a dot.

    Raises:
        CdiError: a bad kind or device name, no devices, a device name given twice
            (pkg/cdi/spec.go ``Spec.validate``), a device with no edits (pkg/cdi/device.go), a
            bad or repeated environment variable name, a NUL in a value, a relative path or one
            with ``..``, a device node type other than ``c``/``b``, a device number out of
            range, a repeated device node or mount path, an empty mount option.
    """
    _, cls = parse_kind(kind)
    if not devices:
        raise CdiError(f"CDI spec {kind!r}: has no devices (CDI refuses it)")
    global_env = _env_entries(spec_env.items(), f"CDI spec {kind!r}")
    by_name: dict[str, CdiDevice] = {}
    for device in devices:
        validate_device_name(device.name)
        if device.name in by_name:
            raise CdiError(f"CDI spec {kind!r}: device name {device.name!r} is given twice")
        by_name[device.name] = device
    spec: JsonDict = {
        "cdiVersion": CDI_VERSION_DOTTED_CLASS if "." in cls else CDI_VERSION,
        "kind": kind,
        "devices": [
            {"name": name, "containerEdits": _device_edits(by_name[name], global_env)}
            for name in sorted(by_name)
        ],
    }
    if global_env:
        spec["containerEdits"] = {"env": [f"{k}={global_env[k]}" for k in sorted(global_env)]}
    return spec


def encode_spec(spec: Mapping[str, object]) -> bytes:
    """The file content of a spec: JSON, keys sorted, 2-space indent, ASCII, a final newline.

    The same spec always gives the same bytes, so an unchanged spec can be recognised.

    Raises:
        TypeError, ValueError: ``spec`` holds something JSON cannot encode.
    """
    return (json.dumps(spec, sort_keys=True, indent=2, ensure_ascii=True) + "\n").encode("ascii")


# --- files ------------------------------------------------------------------------------------


def _check_file_name(file_name: str) -> None:
    if (
        not file_name
        or "/" in file_name
        or "\x00" in file_name
        or file_name.startswith(".")
        or not file_name.endswith(".json")
    ):
        raise CdiError(
            f"invalid CDI spec file name {file_name!r}: must be a plain name ending in .json, "
            "not starting with '.'"
        )


def _os_message(err: OSError) -> str:
    return err.strerror or str(err)


def _fsync_directory(directory: Path) -> None:
    # The rename is durable only once the directory itself is on disk.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_directory(directory: Path) -> None:
    try:
        directory.mkdir(mode=SPEC_DIR_MODE, parents=True, exist_ok=False)
    except FileExistsError:
        if not directory.is_dir():
            raise NotADirectoryError(
                errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory)
            ) from None
        return
    # mkdir's mode is cut by the umask; the directory must be readable by the runtime.
    os.chmod(directory, SPEC_DIR_MODE)


def write_spec(directory: Path, file_name: str, spec: Mapping[str, object]) -> Path:
    """Write a spec file atomically and return its path.

    The bytes (:func:`encode_spec`) go to ``.<file_name>.<random>.tmp`` in ``directory`` (the
    CDI cache reads only ``*.json``/``*.yaml``, pkg/cdi/spec-dirs.go, and the dot hides it),
    which is flushed, fsynced, given mode 0o644 and renamed over ``<directory>/<file_name>``;
    then the directory is fsynced. A reader sees the old file or the new one, never a part.
    ``directory`` is created (0o755) when missing. The temporary file never stays behind.

    Raises:
        CdiError: ``file_name`` is not a plain ``*.json`` name.
        CdiWriteError: an ``OSError``; message ``cannot write CDI spec <path>: <strerror>``.
    """
    _check_file_name(file_name)
    path = directory / file_name
    data = encode_spec(spec)
    temp: str | None = None
    try:
        _make_directory(directory)
        fd, temp = tempfile.mkstemp(prefix=f".{file_name}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), SPEC_FILE_MODE)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
        temp = None
        _fsync_directory(directory)
    except OSError as err:
        raise CdiWriteError(
            f"cannot write CDI spec {path}: {_os_message(err)}", path, err.errno
        ) from err
    finally:
        if temp is not None:
            with suppress(OSError):
                os.unlink(temp)
    return path


def remove_spec(directory: Path, file_name: str) -> bool:
    """Remove a spec file; True if it was removed, False if it was not there.

    Raises:
        CdiError: ``file_name`` is not a plain ``*.json`` name.
        CdiWriteError: another ``OSError``; message ``cannot remove CDI spec <path>: <strerror>``.
    """
    _check_file_name(file_name)
    path = directory / file_name
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as err:
        raise CdiWriteError(
            f"cannot remove CDI spec {path}: {_os_message(err)}", path, err.errno
        ) from err
    try:
        _fsync_directory(directory)
    except OSError as err:
        raise CdiWriteError(
            f"cannot remove CDI spec {path}: {_os_message(err)}", path, err.errno
        ) from err
    return True


def list_spec_files(directory: Path, vendor: str) -> list[str]:
    """The names of a vendor's spec files in ``directory``, sorted; [] if it does not exist.

    A file is the vendor's when its name starts with ``<vendor>-`` and ends with ``.json``
    (:func:`spec_file_name`); directories are skipped. The naming cannot tell vendor
    ``a.com`` from a vendor ``a.com-x`` (pkg/cdi/spec.go joins vendor and class with ``-``):
    a caller sharing the directory with such a vendor must read the files' ``kind``.

    Raises:
        CdiError: ``vendor`` breaks the vendor rule.
        CdiWriteError: the directory cannot be read (``cannot list CDI specs in <dir>: ...``).
    """
    validate_vendor(vendor)
    prefix = f"{vendor}-"
    try:
        with os.scandir(directory) as entries:
            names = [
                entry.name
                for entry in entries
                if entry.name.startswith(prefix)
                and entry.name.endswith(".json")
                and not entry.is_dir(follow_symlinks=False)
            ]
    except FileNotFoundError:
        return []
    except OSError as err:
        raise CdiWriteError(
            f"cannot list CDI specs in {directory}: {_os_message(err)}", directory, err.errno
        ) from err
    return sorted(names)
