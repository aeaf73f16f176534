"""Which fabric host a Kubernetes node is. Pure functions.

The fabric manager names servers its own way (Redfish: a ComputerSystem's ``Id`` and
``HostName``); Kubernetes names nodes. ``hosts.match`` chooses the rule:

* ``hostname`` (default): the node's ``kubernetes.io/hostname`` label, else its name, equals a
  host's ``hostname`` (case-insensitive; a short name matches the first label of a FQDN);
* ``label`` / ``annotation``: the node's label or annotation ``hosts.key`` holds the host id;
* ``provider_id``: ``spec.providerID`` ends with ``/<host id>`` or equals it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True, slots=True)
class HostRef:
    """A fabric host as the mapping needs it."""

    host_id: str
    hostname: str | None = None


def _short(name: str) -> str:
    return name.split(".", 1)[0].lower()


@dataclass(frozen=True)
class HostIndex:
    """Hosts indexed for :func:`host_for_node`. Build once per inventory."""

    by_id: Mapping[str, HostRef]
    by_hostname: Mapping[str, HostRef]
    by_short: Mapping[str, HostRef]

    @classmethod
    def build(cls, hosts: Iterable[HostRef]) -> HostIndex:
        """Index ``hosts`` by id, full hostname and short hostname (lowercase).

        A short name shared by two hosts is left out of the short index: it is ambiguous.
        """
        hosts = list(hosts)
        by_hostname = {h.hostname.lower(): h for h in hosts if h.hostname}
        shorts: dict[str, list[HostRef]] = {}
        for host in hosts:
            if host.hostname:
                shorts.setdefault(_short(host.hostname), []).append(host)
        by_short = {name: found[0] for name, found in shorts.items() if len(found) == 1}
        return cls({h.host_id: h for h in hosts}, by_hostname, by_short)


def host_for_node(node: Mapping[str, Any], index: HostIndex, match: str, key: str) -> str | None:
    """The host id of ``node`` (a Node JSON object), or None when no host matches.

    Args:
        node: a core/v1 Node as a JSON dict.
        index: the hosts, see :class:`HostIndex`.
        match: ``hostname``, ``label``, ``annotation`` or ``provider_id``.
        key: the label or annotation key for ``label`` / ``annotation``.

    Raises:
        ValueError: an unknown ``match``.
    """
    metadata = node.get("metadata") or {}
    if match == "hostname":
        labels = metadata.get("labels") or {}
        for name in (labels.get(HOSTNAME_LABEL), metadata.get("name")):
            if not name:
                continue
            found = index.by_hostname.get(name.lower()) or index.by_short.get(_short(name))
            if found:
                return found.host_id
        return None
    if match in ("label", "annotation"):
        values = metadata.get("labels" if match == "label" else "annotations") or {}
        value = values.get(key)
        return value if value in index.by_id else None
    if match == "provider_id":
        provider_id = (node.get("spec") or {}).get("providerID") or ""
        if provider_id in index.by_id:
            return str(provider_id)
        tail = provider_id.rstrip("/").rsplit("/", 1)[-1]
        return tail if tail in index.by_id else None
    raise ValueError(f"unknown host match rule {match!r}")
