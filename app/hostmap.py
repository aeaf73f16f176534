"""Which fabric host a Kubernetes node is. Pure functions, plus a log of ambiguous identities.

The fabric manager names servers its own way (Redfish: a ComputerSystem's ``Id`` and
``HostName``); Kubernetes names nodes. ``hosts.match`` chooses the rule:

* ``hostname`` (default): the node's ``kubernetes.io/hostname`` label, else its name, equals a
  host's ``hostname`` (case-insensitive; a short name matches the first label of a FQDN);
* ``label`` / ``annotation``: the node's label or annotation ``hosts.key`` holds the host id;
* ``provider_id``: ``spec.providerID`` ends with ``/<host id>`` or equals it;
* ``serial``: the node's label (else annotation) ``hosts.key`` holds the host's serial number
  (NEC CDIM: its CPU's ``serialNumber``).

An identity shared by two or more hosts is never used to map a node: real Redfish services
ship the same placeholder ``HostName`` (``localhost``) on every System, and "the last one wins"
would attach devices to the wrong server. Such identities are kept aside in
:attr:`HostIndex.ambiguous` / :attr:`HostIndex.ambiguous_short` /
:attr:`HostIndex.ambiguous_ids` and reported by :func:`ambiguities`. Host ``UUID`` and
``SerialNumber`` are stored by the inventory; only ``serial`` matches on the serial number.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

HOSTNAME_LABEL = "kubernetes.io/hostname"

#: :attr:`Ambiguity.key` values.
HOSTNAME = "hostname"
SHORT_HOSTNAME = "short hostname"
HOST_ID = "host id"
SERIAL = "serial number"

log = logging.getLogger(__name__)

_NAME_HINT = (
    "with hosts.match=hostname no node maps to them by this name; give each host its "
    "own HostName, or match by label, annotation or provider_id"
)
_HINTS = {
    HOSTNAME: _NAME_HINT,
    SHORT_HOSTNAME: _NAME_HINT,
    SERIAL: "with hosts.match=serial no node maps to them; match by label or provider_id",
    HOST_ID: "two fabric managers report the same host id: with hosts.match label, "
    "annotation or provider_id no node maps to them (hosts.match=hostname still can)",
}


@dataclass(frozen=True, slots=True)
class HostRef:
    """A fabric host as the mapping needs it: its id, hostname and fabric manager
    (``hosts.backend``; "" when unknown)."""

    host_id: str
    hostname: str | None = None
    backend: str = ""
    serial: str | None = None


@dataclass(frozen=True, slots=True)
class Ambiguity:
    """One identity value shared by several hosts.

    Attributes:
        key: which identity: ``hostname`` (full name), ``short hostname`` (first label) or
            ``host id``.
        value: the shared value (lowercase for host names, as they are compared).
        hosts: the host ids sharing it, sorted.
    """

    key: str
    value: str
    hosts: tuple[str, ...]

    @property
    def message(self) -> str:
        """One line for people, e.g. ``hostname 'localhost' is shared by hosts sys-1, sys-2``
        (a shared host id: ``host id 'sys-1' is reported by 2 hosts``)."""
        if self.key == HOST_ID:
            return f"host id {self.value!r} is reported by {len(self.hosts)} hosts"
        return f"{self.key} {self.value!r} is shared by hosts {', '.join(self.hosts)}"

    @property
    def hint(self) -> str:
        """What to do about it, one clause (e.g. match nodes by label instead)."""
        return _HINTS[self.key]

    def to_json(self) -> dict[str, Any]:
        """``{"key", "value", "hosts"}``."""
        return {"key": self.key, "value": self.value, "hosts": list(self.hosts)}


def _short(name: str) -> str:
    return name.split(".", 1)[0].lower()


def _split(
    pairs: Iterable[tuple[str, HostRef]],
) -> tuple[dict[str, HostRef], dict[str, tuple[str, ...]]]:
    """``(value, host)`` pairs -> (values held by one host, values shared -> sorted host ids)."""
    found: dict[str, list[HostRef]] = {}
    for value, host in pairs:
        found.setdefault(value, []).append(host)
    unique = {value: hosts[0] for value, hosts in found.items() if len(hosts) == 1}
    shared = {
        value: tuple(sorted(h.host_id for h in hosts))
        for value, hosts in found.items()
        if len(hosts) > 1
    }
    return unique, shared


class AmbiguityLog:
    """Logs the ambiguous identities of each index built, only when they changed.

    The claim reconciler and the control-plane controller rebuild their index every few
    seconds from the same hosts; a warning per rebuild would bury everything else. A value is
    logged (WARNING) when it becomes ambiguous or its hosts change, and once (INFO) when it is
    no longer ambiguous.
    """

    def __init__(self, logger: logging.Logger = log) -> None:
        self.logger = logger
        self._reported: frozenset[Ambiguity] = frozenset()

    def report(self, found: Iterable[Ambiguity]) -> None:
        """Log what changed since the last call."""
        current = frozenset(found)
        if current == self._reported:
            return
        for item in sorted(current - self._reported, key=_order):
            self.logger.warning(
                "%s: %s",
                item.message,
                _HINTS[item.key],
                extra={
                    "identity_key": item.key,
                    "identity_value": item.value,
                    "hosts": list(item.hosts),
                },
            )
        still = {(a.key, a.value) for a in current}
        for item in sorted(self._reported, key=_order):
            if (item.key, item.value) not in still:
                self.logger.info(
                    "%s %r is no longer shared by several hosts",
                    item.key,
                    item.value,
                    extra={"identity_key": item.key, "identity_value": item.value},
                )
        self._reported = current


# The process-wide log used by HostIndex.build by default: every index of one process reads the
# same inventory, so one shared "last reported" set keeps it to one warning per change.
_DEFAULT_LOG = AmbiguityLog()


def _order(item: Ambiguity) -> tuple[int, str]:
    return ((HOSTNAME, SHORT_HOSTNAME, HOST_ID, SERIAL).index(item.key), item.value)


@dataclass(frozen=True)
class HostIndex:
    """Hosts indexed for :func:`host_for_node`. Build once per inventory.

    Attributes:
        by_id: host id -> host, for ids held by one host.
        by_hostname: lowercase full hostname -> host, for names held by one host.
        by_short: lowercase first label -> host, for short names held by one host.
        ambiguous: lowercase full hostname shared by several hosts -> their sorted ids.
        ambiguous_short: first label shared by several hosts -> their sorted ids.
        ambiguous_ids: host id reported by several hosts (several backends) -> itself, once
            per host.
    """

    by_id: Mapping[str, HostRef]
    by_hostname: Mapping[str, HostRef]
    by_short: Mapping[str, HostRef]
    ambiguous: Mapping[str, tuple[str, ...]]
    ambiguous_short: Mapping[str, tuple[str, ...]]
    ambiguous_ids: Mapping[str, tuple[str, ...]]
    by_serial: Mapping[str, HostRef] = field(default_factory=dict)
    ambiguous_serials: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        hosts: Iterable[HostRef],
        *,
        report: AmbiguityLog | None = _DEFAULT_LOG,
        match: str | None = None,
    ) -> HostIndex:
        """Index ``hosts`` by id, full hostname, short hostname (lowercase) and serial number.

        A value shared by two or more hosts is left out of its index and recorded as
        ambiguous; ``report`` (default: the process-wide :class:`AmbiguityLog`) logs the
        ambiguous values when they changed since its last report. Pass None to log nothing
        (commands and the admin API, which show them themselves). Shared serial numbers are
        logged only when ``match`` (``hosts.match``) is ``serial``: placeholder serials are
        common and harmless under the other rules.
        """
        hosts = list(hosts)
        named = [h for h in hosts if h.hostname]
        by_id, ambiguous_ids = _split((h.host_id, h) for h in hosts)
        by_hostname, ambiguous = _split((str(h.hostname).lower(), h) for h in named)
        by_short, ambiguous_short = _split((_short(str(h.hostname)), h) for h in named)
        by_serial, ambiguous_serials = _split((str(h.serial), h) for h in hosts if h.serial)
        index = cls(
            by_id,
            by_hostname,
            by_short,
            ambiguous,
            ambiguous_short,
            ambiguous_ids,
            by_serial,
            ambiguous_serials,
        )
        if report is not None:
            report.report(ambiguities(index, serials=match == "serial"))
        return index


def ambiguities(index: HostIndex, *, serials: bool = False) -> tuple[Ambiguity, ...]:
    """Every identity value shared by several hosts, for display: full hostnames, then short
    names, then host ids, then (with ``serials``) serial numbers, each by value.

    A short name shared by exactly the hosts of one shared full name (``localhost.localdomain``
    everywhere) is the same problem and is not listed twice.
    """
    full = [Ambiguity(HOSTNAME, value, ids) for value, ids in sorted(index.ambiguous.items())]
    full_sets = {a.hosts for a in full}
    short = [
        Ambiguity(SHORT_HOSTNAME, value, ids)
        for value, ids in sorted(index.ambiguous_short.items())
        if ids not in full_sets
    ]
    ids = [Ambiguity(HOST_ID, value, hosts) for value, hosts in sorted(index.ambiguous_ids.items())]
    shared = [
        Ambiguity(SERIAL, value, hosts)
        for value, hosts in sorted(index.ambiguous_serials.items())
        if serials
    ]
    return (*full, *short, *ids, *shared)


def host_for_node(node: Mapping[str, Any], index: HostIndex, match: str, key: str) -> str | None:
    """The host id of ``node`` (a Node JSON object), or None when no host matches; see
    :func:`host_ref_for_node`."""
    ref = host_ref_for_node(node, index, match, key)
    return None if ref is None else ref.host_id


def host_ref_for_node(
    node: Mapping[str, Any], index: HostIndex, match: str, key: str
) -> HostRef | None:
    """The host of ``node`` (a Node JSON object), with its fabric manager, or None when no
    host matches.

    A host found by hostname is the one host of that name, even when its id is also used on
    another fabric manager (``/redfish/v1/Systems/1`` on two managers); an id alone (label,
    annotation, providerID) must be held by one host.

    Args:
        node: a core/v1 Node as a JSON dict.
        index: the hosts, see :class:`HostIndex`.
        match: ``hostname``, ``label``, ``annotation``, ``provider_id`` or ``serial``.
        key: the label or annotation key for ``label`` / ``annotation`` / ``serial``.

    Raises:
        ValueError: an unknown ``match``.
    """
    metadata = node.get("metadata") or {}
    if match == "hostname":
        for name in _node_names(metadata):
            found = index.by_hostname.get(name.lower()) or index.by_short.get(_short(name))
            if found and (found.backend or found.host_id not in index.ambiguous_ids):
                return found
        return None
    if match in ("label", "annotation"):
        return index.by_id.get(_host_id_value(metadata, match, key))
    if match == "provider_id":
        for candidate in _provider_id_candidates(node):
            if candidate in index.by_id:
                return index.by_id[candidate]
        return None
    if match == "serial":
        value = _host_id_value(metadata, "label", key) or _host_id_value(
            metadata, "annotation", key
        )
        return index.by_serial.get(value) if value else None
    raise ValueError(f"unknown host match rule {match!r}")


def ambiguity_for_node(
    node: Mapping[str, Any], index: HostIndex, match: str, key: str
) -> Ambiguity | None:
    """Why ``node`` maps to no host when the reason is a shared identity: the first of its
    names (or its host id value) that is ambiguous, with the hosts sharing it; None when no
    shared identity is involved. Call it for nodes :func:`host_for_node` did not map.

    Raises:
        ValueError: an unknown ``match``.
    """
    metadata = node.get("metadata") or {}
    if match == "hostname":
        for name in _node_names(metadata):
            lower, short = name.lower(), _short(name)
            if lower in index.ambiguous:
                return Ambiguity(HOSTNAME, lower, index.ambiguous[lower])
            found = index.by_hostname.get(lower)
            if found is None and short in index.ambiguous_short:
                return Ambiguity(SHORT_HOSTNAME, short, index.ambiguous_short[short])
            found = found or index.by_short.get(short)
            if found is not None and not found.backend and found.host_id in index.ambiguous_ids:
                return Ambiguity(HOST_ID, found.host_id, index.ambiguous_ids[found.host_id])
        return None
    if match == "serial":
        value = _host_id_value(metadata, "label", key) or _host_id_value(
            metadata, "annotation", key
        )
        shared = index.ambiguous_serials.get(value)
        return Ambiguity(SERIAL, value, shared) if shared else None
    if match in ("label", "annotation"):
        candidates = [_host_id_value(metadata, match, key)]
    elif match == "provider_id":
        candidates = list(_provider_id_candidates(node))
    else:
        raise ValueError(f"unknown host match rule {match!r}")
    for candidate in candidates:
        if candidate in index.ambiguous_ids:
            return Ambiguity(HOST_ID, candidate, index.ambiguous_ids[candidate])
    return None


_NODE_METADATA = ("name", "uid", "resourceVersion", "labels", "annotations", "deletionTimestamp")


def node_identity(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` (a core/v1 Node as a JSON dict) cut down to what the drivers read of it: its
    name, labels and annotations (pool node selectors, the ``hostname``, ``label``,
    ``annotation`` and ``serial`` rules), ``spec.providerID`` (the ``provider_id`` rule), and
    the uid, resourceVersion and deletionTimestamp an informer keys and orders it by.

    The node informers' converter: a Node's status (conditions, images, addresses, volumes) is
    most of its size and changes far more often than these (kubelet reports its status at
    least every ``nodeStatusReportFrequency``, 5 minutes, and on every change; the
    attach-detach controller writes ``status.volumesAttached``). Returns a new dict; ``node``
    is not changed. Never raises: a ``metadata`` or ``spec`` that is not an object is left out,
    other fields are kept as they are.
    """
    metadata = node.get("metadata")
    slim: dict[str, Any] = {}
    if isinstance(metadata, dict):
        slim["metadata"] = {k: metadata[k] for k in _NODE_METADATA if k in metadata}
    spec = node.get("spec")
    if isinstance(spec, dict) and "providerID" in spec:
        slim["spec"] = {"providerID": spec["providerID"]}
    return slim


def same_node_identity(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when two versions of a Node (as :func:`node_identity` left them) differ in nothing
    the drivers read: only their resourceVersion (or nothing) changed. A node event for which
    this holds changes no host mapping and no pool's reach."""
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    return old.get("spec") == new.get("spec") and all(
        old_meta.get(k) == new_meta.get(k) for k in _NODE_METADATA if k != "resourceVersion"
    )


def _node_names(metadata: Mapping[str, Any]) -> list[str]:
    labels = metadata.get("labels") or {}
    return [str(n) for n in (labels.get(HOSTNAME_LABEL), metadata.get("name")) if n]


def _host_id_value(metadata: Mapping[str, Any], match: str, key: str) -> str:
    values = metadata.get("labels" if match == "label" else "annotations") or {}
    return str(values.get(key) or "")


def _provider_id_candidates(node: Mapping[str, Any]) -> tuple[str, ...]:
    provider_id = str((node.get("spec") or {}).get("providerID") or "")
    if not provider_id:
        return ()
    return provider_id, provider_id.rstrip("/").rsplit("/", 1)[-1]
