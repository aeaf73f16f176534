"""Redfish collections: one page of members, ``$expand`` support and expanded members.

Collections follow DSP0266 "Resource collections" (``Members``, ``Members@odata.nextLink``);
``$expand``, ``$top`` and ``$skip`` follow DSP0266 "Query parameters" (the ServiceRoot's
``ProtocolFeaturesSupported.ExpandQuery`` and ``TopSkipQuery``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.fabric.errors import FabricInvalidData
from app.fabric.redfish.parse.common import BadItem, link, norm_uri


@dataclass(frozen=True, slots=True)
class CollectionPage:
    """One page of a Redfish collection.

    Attributes:
        members: member URIs in order (``Members@odata.count`` is ignored: services get it
            wrong).
        next_link: ``Members@odata.nextLink``, or None on the last page.
        bad_members: ``(index, reason)`` for member entries with no usable ``@odata.id``.
    """

    members: tuple[str, ...]
    next_link: str | None
    bad_members: tuple[tuple[int, str], ...] = ()


def parse_collection_page(payload: Any, uri: str) -> CollectionPage:
    """Parse one collection page.

    Raises:
        FabricInvalidData: the page is not an object, has no ``Members`` array, or a
            non-string ``Members@odata.nextLink``: the listing cannot be trusted.
    """
    if not isinstance(payload, Mapping):
        raise FabricInvalidData(f"collection {uri}: body is not a JSON object")
    members = payload.get("Members")
    if not isinstance(members, list):
        raise FabricInvalidData(f"collection {uri}: Members is missing or not an array")
    next_link = payload.get("Members@odata.nextLink")
    if next_link is not None and not isinstance(next_link, str):
        raise FabricInvalidData(f"collection {uri}: Members@odata.nextLink is not a string")
    found: list[str] = []
    bad: list[tuple[int, str]] = []
    for index, member in enumerate(members):
        try:
            found.append(link(member, f"Members[{index}]"))
        except BadItem as err:
            bad.append((index, err.reason))
    return CollectionPage(tuple(found), next_link or None, tuple(bad))


MAX_EXPAND_LEVELS = 3
"""The deepest ``$expand`` the listing asks for: collection -> block -> device -> drive."""


def expand_levels(root: Any) -> int:
    """How many levels of ``$expand=.`` the service offers, from its ServiceRoot's
    ``ProtocolFeaturesSupported.ExpandQuery`` (DSP0266 "Query parameters"): 0 when it offers
    none, 1 when it expands without ``$levels``, else its ``MaxLevels`` (at most
    :data:`MAX_EXPAND_LEVELS`). Anything malformed counts as no support: the listing then
    reads each resource on its own, which every service answers.
    """
    if not isinstance(root, Mapping):
        return 0
    features = root.get("ProtocolFeaturesSupported")
    expand = features.get("ExpandQuery") if isinstance(features, Mapping) else None
    if not isinstance(expand, Mapping) or expand.get("NoLinks") is not True:
        return 0
    if expand.get("Levels") is not True:
        return 1
    most = expand.get("MaxLevels")
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        return 1
    return min(most, MAX_EXPAND_LEVELS)


def offers_top_skip(root: Any) -> bool:
    """Whether the service takes ``$top`` and ``$skip`` on collections, from its
    ServiceRoot's ``ProtocolFeaturesSupported.TopSkipQuery`` (DSP0266 "Query parameters",
    ServiceRoot schema). Anything but ``true`` counts as no."""
    if not isinstance(root, Mapping):
        return False
    features = root.get("ProtocolFeaturesSupported")
    return isinstance(features, Mapping) and features.get("TopSkipQuery") is True


def inline_resources(payload: Any) -> dict[str, Mapping[str, Any]]:
    """Every expanded resource inside ``payload``, by URI (without a trailing slash).

    An expanded reference is an object with ``@odata.id`` and properties of its own; a plain
    link ``{"@odata.id": ...}`` (annotations aside) is not. ``Links`` sections are not
    searched: ``$expand=.`` leaves them as links, and a resource found there could be a
    partial view. The payload itself is not included.
    """
    found: dict[str, Mapping[str, Any]] = {}

    def visit(value: Any) -> None:
        if isinstance(value, list):
            for element in value:
                visit(element)
        elif isinstance(value, Mapping):
            uri = value.get("@odata.id")
            if isinstance(uri, str) and any(not key.startswith("@") for key in value):
                found.setdefault(norm_uri(uri), value)
            for key, inner in value.items():
                if key != "Links" and isinstance(inner, list | Mapping):
                    visit(inner)

    if isinstance(payload, Mapping):
        for key, inner in payload.items():
            if key != "Links" and isinstance(inner, list | Mapping):
                visit(inner)
    return found
