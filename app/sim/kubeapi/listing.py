"""List pages, continue tokens and the per-watch filter that turns store events into the
events one watcher sees (k8s.io/apiserver pkg/storage/cacher semantics for selectors).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import bad_request
from .objects import visible_as
from .resources import ResourceType
from .selectors import FieldRequirement, Requirement, fields_match, labels_match
from .store import StoreEvent


@dataclass(frozen=True)
class ListResult:
    """A list page: ``items``, list ``resource_version``, ``continue_token`` ('' at the end),
    ``remaining`` items after this page (None when unknown).
    """

    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str
    remaining: int | None


@dataclass(frozen=True)
class WatchFilter:
    """What one watch wants: its resource type, namespace ('' = all), selectors."""

    rt: ResourceType
    namespace: str
    labels: Sequence[Requirement]
    fields: Sequence[FieldRequirement]

    def matches(self, obj: dict[str, Any] | None) -> dict[str, Any] | None:
        """The object as the watcher sees it, or None when it does not match."""
        shown = visible_as(self.rt, obj)
        if shown is None:
            return None
        meta = shown.get("metadata") or {}
        if self.namespace and meta.get("namespace", "") != self.namespace:
            return None
        if not labels_match(self.labels, meta.get("labels")):
            return None
        if not fields_match(self.fields, shown):
            return None
        return shown

    def render(self, event: StoreEvent) -> dict[str, Any] | None:
        """The watch event JSON for ``event``, or None to skip it. An object that starts or
        stops matching the selectors is reported as ADDED or DELETED, like the watch cache does.
        """
        current = self.matches(event.obj)
        if event.type == "MODIFIED":
            before = self.matches(event.old)
            if current is not None and before is None:
                return {"type": "ADDED", "object": current}
            if current is None and before is not None:
                shown = visible_as(self.rt, event.obj)
                return {"type": "DELETED", "object": shown}
        if current is None:
            return None
        return {"type": event.type, "object": current}


def encode_continue(rv: int, namespace: str, name: str) -> str:
    """An opaque continue token: base64 of the list version and the last key returned."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": [namespace, name]})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    """Decode a continue token; raises StatusError 400 when it is not one of ours."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), (str(data["start"][0]), str(data["start"][1]))
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error) as err:
        raise bad_request(f"invalid continue token: {err}") from err
