"""Kubernetes names derived from vendor ids. Pure functions.

A DRA device name is a DNS label: at most 63 characters of ``[a-z0-9-]``, starting and ending
alphanumeric (k8s.io/apimachinery pkg/util/validation IsDNS1123Label; the device name rule in
k8s.io/kubernetes pkg/apis/resource/validation). Vendor ids are anything: Redfish URIs, UUIDs,
names with capitals, spaces or non-ASCII letters. :func:`device_name` maps one to a readable
label made of its last meaningful parts, plus a short hash of the whole id so that two ids that
sanitise or truncate to the same text still get different names. The name is derived once and
stored: a device keeps it for life, even if the rule changes later.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Container

DNS_LABEL_MAX = 63
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NOT_LABEL_CHARS = re.compile(r"[^a-z0-9]+")

# Path segments that name Redfish collections or the service itself rather than a device; they
# add length without telling devices apart.
_NOISE_SEGMENTS = frozenset(
    {
        "redfish",
        "v1",
        "compositionservice",
        "resourceblocks",
        "processors",
        "drives",
        "memory",
        "storage",
        "networkinterfaces",
        "ethernetinterfaces",
        "networkdevicefunctions",
        "chassis",
        "systems",
        "fabrics",
        "endpoints",
    }
)
_HASH_LENGTHS = (8, 12, 16, 24)
_READABLE_PARTS = 2


def is_dns_label(value: str) -> bool:
    """True when ``value`` is a DNS-1123 label (Kubernetes IsDNS1123Label)."""
    return len(value) <= DNS_LABEL_MAX and bool(_DNS_LABEL.match(value))


def sanitize_label(text: str, max_length: int = DNS_LABEL_MAX) -> str:
    """Lowercase ``text`` and fold every run of other characters into one ``-``.

    Returns:
        A string of ``[a-z0-9-]`` without leading or trailing ``-``, at most ``max_length``
        long; empty when ``text`` has no ASCII letter or digit.
    """
    folded = _NOT_LABEL_CHARS.sub("-", text.lower()).strip("-")
    return folded[:max_length].rstrip("-")


def _readable(vendor_id: str) -> str:
    segments = [s for s in re.split(r"[/\\#?]+", vendor_id) if s]
    meaningful = [s for s in segments if s.lower() not in _NOISE_SEGMENTS] or segments
    return sanitize_label("-".join(meaningful[-_READABLE_PARTS:]), DNS_LABEL_MAX)


def device_name(
    vendor_id: str, taken: Container[str] = frozenset(), scope: str | None = None
) -> str:
    """Derive the Kubernetes device name for ``vendor_id``.

    The result is ``<readable>-<hash>`` where ``readable`` is the sanitised last two
    meaningful parts of the id (``/redfish/v1/CompositionService/ResourceBlocks/Block9/
    Processors/GPU0`` gives ``block9-gpu0``) and ``hash`` the first 8 hex digits of the id's
    SHA-256; an id with no usable characters gives ``device-<hash>``. When that name is in
    ``taken``, longer hashes are tried (12, 16, 24 digits). Deterministic: the same id and
    ``taken`` always give the same name.

    Args:
        vendor_id: the backend's id of the device; any non-empty string.
        taken: names already used by other devices.
        scope: the fabric manager's name when several are configured: it is hashed with the
            id, so that the same vendor id on two managers gives two names without either
            having to see the other's (their syncs may run at the same time).

    Returns:
        A DNS label of at most 63 characters, not in ``taken``.

    Raises:
        ValueError: ``vendor_id`` is empty, or every candidate is taken.
    """
    if not vendor_id:
        raise ValueError("empty vendor id")
    hashed = vendor_id if scope is None else f"{scope}\x00{vendor_id}"
    digest = hashlib.sha256(hashed.encode("utf-8", "surrogatepass")).hexdigest()
    readable = _readable(vendor_id) or "device"
    for length in _HASH_LENGTHS:
        suffix = digest[:length]
        stem = readable[: DNS_LABEL_MAX - length - 1].rstrip("-") or "device"
        candidate = f"{stem}-{suffix}"
        if candidate not in taken:
            return candidate
    raise ValueError(f"every name candidate for vendor id {vendor_id!r} is taken")
