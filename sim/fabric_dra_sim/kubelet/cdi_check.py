"""CDI spec files as a container runtime reads them: validation, loading and resolving CDI
device ids to the container edits a runtime would apply.

API:

* :func:`validate_spec`: every problem of one parsed spec, as one-line strings.
* :func:`load_specs`: every ``*.json`` / ``*.yaml`` spec in a directory, by CDI device id.
* :func:`resolve`: CDI device ids to one :class:`ContainerEdits`.
* :func:`parse_device_id`: ``vendor/class=name`` split and checked.

The rules come from the CDI spec, version 1.1.0 (github.com/cncf-tags/container-device-interface
``SPEC.md``), checked here with ``cdi_schema.json`` (written from the spec, JSON Schema draft 7
as the upstream schema declares) plus the rules a schema cannot express, each from the CDI Go
library: known ``cdiVersion`` and the minimum version the used fields need
(``specs-go/version.go``), unique device names, at least one device, no empty device edits
(``pkg/cdi/spec.go``, ``pkg/cdi/device.go``), unique net devices
(``pkg/cdi/container-edits.go``), qualified device names (``pkg/parser/parser.go``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml

# specs-go/version.go: the released spec versions, newest first.
KNOWN_VERSIONS = (
    "1.1.0",
    "1.0.0",
    "0.8.0",
    "0.7.0",
    "0.6.0",
    "0.5.0",
    "0.4.0",
    "0.3.0",
    "0.2.0",
    "0.1.0",
)
# pkg/cdi/cache.go reads these extensions only.
SPEC_SUFFIXES = (".json", ".yaml")

_NAME_PART = r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?"
_VENDOR_OR_CLASS = re.compile(rf"^{_NAME_PART}$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


class CdiError(Exception):
    """A CDI spec file or device id a runtime would refuse; the message is one line naming the
    file or the id."""


@dataclass(slots=True)
class ContainerEdits:
    """The edits a runtime applies to a container for a set of CDI devices, in the order it
    applies them (spec-level edits of a spec once, before its first device's edits).

    Attributes:
        env: ``NAME=value`` strings.
        device_nodes: CDI ``deviceNodes`` entries (dicts: path, type, major, minor ...).
        mounts: CDI ``mounts`` entries (dicts: hostPath, containerPath, options ...).
        hooks: CDI ``hooks`` entries.
        additional_gids: ``additionalGids``.
        devices: the CDI device ids resolved, in order.
    """

    env: list[str] = field(default_factory=list)
    device_nodes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)
    additional_gids: list[int] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)

    def add(self, edits: Mapping[str, Any]) -> None:
        """Append one CDI ``containerEdits`` object (as ``ContainerEdits.Append`` does)."""
        self.env.extend(str(e) for e in edits.get("env") or ())
        self.device_nodes.extend(dict(d) for d in edits.get("deviceNodes") or ())
        self.mounts.extend(dict(m) for m in edits.get("mounts") or ())
        self.hooks.extend(dict(h) for h in edits.get("hooks") or ())
        self.additional_gids.extend(int(g) for g in edits.get("additionalGids") or ())

    def env_map(self) -> dict[str, str]:
        """``env`` as a dict; a later entry wins, as in an OCI process environment."""
        out: dict[str, str] = {}
        for entry in self.env:
            key, _, value = entry.partition("=")
            out[key] = value
        return out


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """One device of a loaded spec file.

    Attributes:
        cdi_id: ``vendor/class=name``.
        path: the spec file it came from.
        spec: the whole parsed spec (for its spec-level ``containerEdits``).
        device: the ``devices[]`` entry.
    """

    cdi_id: str
    path: Path
    spec: Mapping[str, Any]
    device: Mapping[str, Any]


@functools.cache
def _validator() -> Any:
    text = resources.files(__package__).joinpath("cdi_schema.json").read_text(encoding="utf-8")
    schema = json.loads(text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _where(error: Any) -> str:
    return "/".join(str(p) for p in error.absolute_path) or "(top level)"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.lstrip("v").split("."))


def _all_edits(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices") or ()]
    return [e for e in edits if isinstance(e, Mapping)]


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The oldest CDI spec version that has every field ``spec`` uses
    (specs-go/version.go ``MinimumRequiredVersion``): 1.1.0 for netDevices or intelRdt
    schemata/enableMonitoring, 0.7.0 for intelRdt or additionalGids, 0.6.0 for annotations or a
    '.' in the class, 0.5.0 for a device name starting with a digit or a device node hostPath,
    0.4.0 for a mount type, else 0.3.0. ``spec`` must have passed the schema."""
    edits = _all_edits(spec)
    devices = [d for d in spec.get("devices") or () if isinstance(d, Mapping)]
    rdts = [e["intelRdt"] for e in edits if isinstance(e.get("intelRdt"), Mapping)]
    if any(e.get("netDevices") for e in edits) or any(
        "schemata" in r or r.get("enableMonitoring") for r in rdts
    ):
        return "1.1.0"
    if rdts or any(e.get("additionalGids") for e in edits):
        return "0.7.0"
    kind_class = str(spec.get("kind") or "").partition("/")[2]
    if spec.get("annotations") or any(d.get("annotations") for d in devices) or "." in kind_class:
        return "0.6.0"
    nodes = [n for e in edits for n in e.get("deviceNodes") or () if isinstance(n, Mapping)]
    if any(str(d.get("name") or "")[:1].isdigit() for d in devices) or any(
        n.get("hostPath") for n in nodes
    ):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts") or () if isinstance(m, Mapping)):
        return "0.4.0"
    return "0.3.0"


def _net_device_problems(edits: Mapping[str, Any], where: str) -> list[str]:
    problems: list[str] = []
    hosts: set[str] = set()
    names: set[str] = set()
    for net in edits.get("netDevices") or ():
        host, name = str(net.get("hostInterfaceName")), str(net.get("name"))
        if host in hosts:
            problems.append(f"{where}: duplicate net device hostInterfaceName {host!r}")
        if name in names:
            problems.append(f"{where}: duplicate net device name {name!r}")
        hosts.add(host)
        names.add(name)
    return problems


def _semantic_problems(spec: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    version = str(spec["cdiVersion"]).lstrip("v")
    if version not in KNOWN_VERSIONS:
        problems.append(f"cdiVersion: unknown CDI spec version {spec['cdiVersion']!r}")
    else:
        needed = minimum_version(spec)
        if _version_tuple(needed) > _version_tuple(version):
            problems.append(
                f"cdiVersion: {spec['cdiVersion']!r} is too old for the fields used, "
                f"the spec version must be at least {needed}"
            )
    problems += _net_device_problems(spec.get("containerEdits") or {}, "containerEdits")
    seen: set[str] = set()
    for i, device in enumerate(spec["devices"]):
        name = str(device["name"])
        if name in seen:
            problems.append(f"devices/{i}/name: device name {name!r} is used more than once")
        seen.add(name)
        edits = device["containerEdits"]
        if not any(edits.get(k) for k in edits) and "intelRdt" not in edits:
            problems.append(f"devices/{i}/containerEdits: device {name!r} has no edits")
        problems += _net_device_problems(edits, f"devices/{i}/containerEdits")
    return problems


def validate_spec(obj: object) -> list[str]:
    """Every problem of one parsed CDI spec (JSON or YAML already decoded), one line each and
    prefixed with where it is (``devices/0/name: ...``); empty when a runtime would accept it.

    Checks ``cdi_schema.json`` first; the semantic checks (version, duplicates, empty device
    edits) run only on a spec that passed the schema.
    """
    errors = sorted(_validator().iter_errors(obj), key=lambda e: list(e.absolute_path))
    problems = [f"{_where(e)}: {e.message}" for e in errors]
    if problems or not isinstance(obj, Mapping):
        return problems
    return _semantic_problems(obj)


def parse_device_id(cdi_id: str) -> tuple[str, str, str]:
    """Split a qualified CDI device id ``vendor/class=name`` (pkg/parser/parser.go
    ``ParseQualifiedName``).

    Raises:
        CdiError: missing vendor, class or name, or a part breaking its naming rule.
    """
    qualifier, sep, name = cdi_id.partition("=")
    vendor, slash, kind_class = qualifier.partition("/")
    if not sep or not slash or not vendor or not kind_class or not name:
        raise CdiError(f"CDI device id {cdi_id!r}: not qualified, want vendor/class=name")
    if not _VENDOR_OR_CLASS.match(vendor):
        raise CdiError(f"CDI device id {cdi_id!r}: invalid vendor {vendor!r}")
    if not _VENDOR_OR_CLASS.match(kind_class):
        raise CdiError(f"CDI device id {cdi_id!r}: invalid class {kind_class!r}")
    if not _DEVICE_NAME.match(name):
        raise CdiError(f"CDI device id {cdi_id!r}: invalid device name {name!r}")
    return vendor, kind_class, name


def read_spec_file(path: Path) -> Mapping[str, Any]:
    """Read and validate one spec file: ``.json`` parsed as JSON, ``.yaml`` as YAML.

    Raises:
        CdiError: unreadable, not parseable, or invalid; the message names the file and the
            first problem (and how many more there are).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise CdiError(f"CDI spec {path}: cannot read: {err}") from err
    try:
        obj = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        one_line = " ".join(str(err).split())
        raise CdiError(f"CDI spec {path}: cannot parse: {one_line}") from err
    problems = validate_spec(obj)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CdiError(f"CDI spec {path}: invalid: {problems[0]}{more}")
    assert isinstance(obj, Mapping)
    return obj


def load_specs(cdi_dir: Path) -> dict[str, CdiDevice]:
    """Every device of every ``*.json`` / ``*.yaml`` spec file in ``cdi_dir`` (not recursive;
    a missing directory has none), by CDI device id, files in name order.

    Raises:
        CdiError: a file is invalid (see :func:`read_spec_file`), or two files define the same
            device id (the message names both files).
    """
    if not cdi_dir.is_dir():
        return {}
    out: dict[str, CdiDevice] = {}
    for path in sorted(cdi_dir.iterdir()):
        if path.suffix not in SPEC_SUFFIXES or not path.is_file():
            continue
        spec = read_spec_file(path)
        for device in spec["devices"]:
            cdi_id = f"{spec['kind']}={device['name']}"
            if cdi_id in out:
                raise CdiError(
                    f"CDI device {cdi_id}: defined in both {out[cdi_id].path} and {path}"
                )
            out[cdi_id] = CdiDevice(cdi_id, path, spec, device)
    return out


def resolve(cdi_dir: Path, ids: Iterable[str]) -> ContainerEdits:
    """The container edits for CDI device ``ids`` (duplicates count once), as a runtime's CDI
    cache injects them (pkg/cdi/cache.go ``InjectDevices``): for each device in order, its
    spec's spec-level edits the first time that spec is met, then the device's edits.

    Raises:
        CdiError: an id is malformed or not defined by any spec in ``cdi_dir`` (the message
            names it and the directory), or a spec file there is invalid.
    """
    wanted = list(dict.fromkeys(ids))
    for cdi_id in wanted:
        parse_device_id(cdi_id)
    known = load_specs(cdi_dir)
    unknown = [i for i in wanted if i not in known]
    if unknown:
        raise CdiError(f"unresolvable CDI devices {', '.join(unknown)}: not found in {cdi_dir}")
    edits = ContainerEdits()
    specs_done: set[Path] = set()
    for cdi_id in wanted:
        found = known[cdi_id]
        if found.path not in specs_done:
            specs_done.add(found.path)
            edits.add(found.spec.get("containerEdits") or {})
        edits.add(found.device["containerEdits"])
        edits.devices.append(cdi_id)
    return edits


__all__ = [
    "KNOWN_VERSIONS",
    "CdiDevice",
    "CdiError",
    "ContainerEdits",
    "load_specs",
    "minimum_version",
    "parse_device_id",
    "read_spec_file",
    "resolve",
    "validate_spec",
]
