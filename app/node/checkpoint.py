"""The node plugin's checkpoint: which claims it prepared, kept on disk across restarts.

One JSON file, ``<plugins_dir>/<driver>/checkpoint.json``, written atomically (a temporary
file in the same directory, fsync, rename, fsync of the directory) before every CDI spec write
and after it, so that a plugin killed at any point knows after its restart what it may have
left on disk. Like the kubelet's own checkpoints (pkg/kubelet/checkpointmanager) the file
carries a checksum of its content; a file that fails it, or that is not ours, is moved aside
(``checkpoint.json.bad-<unix time>``) and the claims are rebuilt from the CDI spec files, whose
names carry the claim UID (:func:`app.node.cdi.spec_file_name`).

Shape (version 1)::

    {"version": 1, "checksum": "<sha256 of the canonical claims JSON>",
     "claims": {"<uid>": {"namespace": ..., "name": ..., "state": "preparing" | "prepared",
                          "specs": ["<file name>", ...],
                          "devices": [{"requests": [...], "pool": ..., "device": ...,
                                       "cdiDeviceIds": [...], "identity": {...}}]}}}
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from app.node.identity import DeviceIdentity

log = logging.getLogger(__name__)

VERSION = 1
State = Literal["preparing", "prepared"]
PREPARING: State = "preparing"
PREPARED: State = "prepared"


class CheckpointError(Exception):
    """The checkpoint could not be written (one line: the path and the OS error)."""


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as answered to the kubelet.

    Attributes:
        requests: the claim's request names it serves.
        pool, device: its pool and name.
        cdi_device_ids: the CDI IDs (``<vendor>/<class>=<name>``).
        identity: what the plugin looked for on the host (for the health checks).
    """

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    identity: DeviceIdentity | None = None


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """One claim the plugin prepared or is preparing.

    Attributes:
        uid, namespace, name: the claim.
        state: ``preparing`` (CDI specs may be on disk, the kubelet has no answer yet) or
            ``prepared`` (answered).
        specs: CDI spec file names written for it (in the CDI directory).
        devices: the answer (empty while ``preparing``).
    """

    uid: str
    namespace: str
    name: str
    state: State
    specs: tuple[str, ...] = ()
    devices: tuple[PreparedDevice, ...] = field(default_factory=tuple)


def _identity_json(identity: DeviceIdentity | None) -> dict[str, Any] | None:
    if identity is None:
        return None
    return {
        "pool": identity.pool,
        "device": identity.device,
        "deviceType": identity.device_type,
        "requests": list(identity.requests),
        "uuid": identity.uuid,
        "serial": identity.serial,
        "pciVendorId": identity.pci_vendor_id,
        "pciDeviceId": identity.pci_device_id,
        "slot": identity.slot,
    }


def _identity_from(data: Any) -> DeviceIdentity | None:
    if not isinstance(data, Mapping):
        return None

    def text(key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) else None

    return DeviceIdentity(
        pool=str(data.get("pool", "")),
        device=str(data.get("device", "")),
        device_type=str(data.get("deviceType", "")),
        requests=tuple(str(r) for r in data.get("requests") or ()),
        uuid=text("uuid"),
        serial=text("serial"),
        pci_vendor_id=text("pciVendorId"),
        pci_device_id=text("pciDeviceId"),
        slot=text("slot"),
    )


def record_json(record: ClaimRecord) -> dict[str, Any]:
    """``record`` as the checkpoint stores it."""
    return {
        "namespace": record.namespace,
        "name": record.name,
        "state": record.state,
        "specs": list(record.specs),
        "devices": [
            {
                "requests": list(d.requests),
                "pool": d.pool,
                "device": d.device,
                "cdiDeviceIds": list(d.cdi_device_ids),
                "identity": _identity_json(d.identity),
            }
            for d in record.devices
        ],
    }


def record_from(uid: str, data: Mapping[str, Any]) -> ClaimRecord:
    """The record stored as ``data``.

    Raises:
        ValueError: a field is missing or has the wrong type.
    """
    state = data.get("state")
    if state not in (PREPARING, PREPARED):
        raise ValueError(f"claim {uid}: state {state!r} is not preparing or prepared")
    devices = []
    for entry in _strings_or_objects(data, "devices", uid, objects=True):
        devices.append(
            PreparedDevice(
                requests=tuple(_strings_or_objects(entry, "requests", uid)),
                pool=str(entry["pool"]),
                device=str(entry["device"]),
                cdi_device_ids=tuple(_strings_or_objects(entry, "cdiDeviceIds", uid)),
                identity=_identity_from(entry.get("identity")),
            )
        )
    return ClaimRecord(
        uid=uid,
        namespace=str(data["namespace"]),
        name=str(data["name"]),
        state=state,
        specs=tuple(_strings_or_objects(data, "specs", uid)),
        devices=tuple(devices),
    )


def _strings_or_objects(
    data: Mapping[str, Any], key: str, uid: str, *, objects: bool = False
) -> list[Any]:
    """``data[key]``: a list of strings (or of objects), empty when missing.

    Raises:
        ValueError: not a list, or an item of the wrong type.
    """
    value = data.get(key)
    if value is None:
        return []
    wanted = Mapping if objects else str
    if not isinstance(value, list) or not all(isinstance(v, wanted) for v in value):
        kind = "objects" if objects else "strings"
        raise ValueError(f"claim {uid}: {key} is not a list of {kind}")
    return value


def _checksum(claims: Mapping[str, Any]) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode(records: Iterable[ClaimRecord]) -> bytes:
    """The checkpoint file's bytes for ``records``."""
    claims = {r.uid: record_json(r) for r in sorted(records, key=lambda r: r.uid)}
    body = {"version": VERSION, "checksum": _checksum(claims), "claims": claims}
    return (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()


def decode(raw: bytes) -> dict[str, ClaimRecord]:
    """The records in a checkpoint file.

    Raises:
        ValueError: not JSON, another version, a checksum that does not match, a bad record.
    """
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"not JSON: {err}") from None
    if not isinstance(body, Mapping) or body.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} checkpoint")
    claims = body.get("claims")
    if not isinstance(claims, Mapping):
        raise ValueError("claims is not an object")
    if body.get("checksum") != _checksum(claims):
        raise ValueError("checksum does not match the content")
    records = {}
    for uid, data in claims.items():
        if not isinstance(data, Mapping):
            raise ValueError(f"claim {uid}: not an object")
        try:
            records[str(uid)] = record_from(str(uid), data)
        except (KeyError, TypeError) as err:
            raise ValueError(f"claim {uid}: missing or wrong field {err}") from None
    return records


class Checkpoint:
    """The checkpoint file and the records in memory.

    Args:
        path: the file; its directory is created (mode 0o750) when missing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[str, ClaimRecord] = {}

    def load(self) -> str | None:
        """Read the file. A missing file is an empty checkpoint.

        Returns:
            None, or a one-line problem when the file was unreadable or corrupt and was moved
            aside (the records are then empty and the caller rebuilds them).
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.records = {}
            return None
        except OSError as err:
            self.records = {}
            return f"cannot read checkpoint {self.path}: {err.strerror}"
        try:
            self.records = decode(raw)
            return None
        except ValueError as err:
            aside = self.path.with_name(f"{self.path.name}.bad-{int(time.time())}")
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            self.records = {}
            return f"checkpoint {self.path} is unusable ({err}); moved to {aside.name}"

    def put(self, record: ClaimRecord) -> None:
        """Store ``record`` (replacing the claim's previous one) and write the file.

        Raises:
            CheckpointError: the file could not be written; the record is not kept.
        """
        before = self.records.get(record.uid)
        self.records[record.uid] = record
        try:
            self._write()
        except CheckpointError:
            if before is None:
                del self.records[record.uid]
            else:
                self.records[record.uid] = before
            raise

    def drop(self, uid: str) -> None:
        """Forget a claim and write the file (nothing when it is not there).

        Raises:
            CheckpointError: the file could not be written; the record is kept.
        """
        before = self.records.pop(uid, None)
        if before is None:
            return
        try:
            self._write()
        except CheckpointError:
            self.records[uid] = before
            raise

    def _write(self) -> None:
        directory = self.path.parent
        temp: str | None = None
        try:
            directory.mkdir(mode=0o750, parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
            with os.fdopen(fd, "wb") as handle:
                handle.write(encode(self.records.values()))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, self.path)
            temp = None
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as err:
            raise CheckpointError(
                f"cannot write checkpoint {self.path}: {err.strerror or err}"
            ) from err
        finally:
            if temp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
