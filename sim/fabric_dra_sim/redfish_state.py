"""The fabric state behind the Redfish simulator: who holds which ResourceBlock.

:class:`FabricState` owns the resource tree (URI -> JSON object), the list of Systems and
ResourceBlocks, the holders of each block and the history of attach/detach changes, and carries
out attach and detach the way DMTF's composability white paper (DSP2050) describes: a block is
held by the Systems in its ``Links.ComputerSystems``, a change updates that list, the block's
``CompositionStatus`` and the System's ``Links.ResourceBlocks``. It knows nothing of HTTP;
errors are :class:`RedfishError` (status + Base registry message) that the server turns into
Redfish error bodies.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fabric_dra_sim.redfish_tree import (
    BLOCKS,
    SYSTEMS,
    JsonObject,
    Tree,
    TreeBuilder,
    link,
    message,
    normalise,
)

HEALTHS = ("OK", "Warning", "Critical")
# Resource.Health -> the event's MessageSeverity (ResourceEvent registry).
_SEVERITY = {"OK": "OK", "Warning": "Warning", "Critical": "Critical"}
"""The values of ``Status.Health`` (Resource.Health)."""


class RedfishError(Exception):
    """An error answer: HTTP status, a Base registry message key and text, extra headers."""

    def __init__(
        self,
        status: int,
        key: str,
        text: str,
        *,
        args: list[str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(text)
        self.status = status
        self.key = key
        self.text = text
        self.args_ = args or []
        self.headers = headers or {}


@dataclass
class Result:
    """An answer: HTTP status, JSON body (None: no body), headers and, instead of a JSON body,
    a ``text/plain`` one (``text``, for the ``text-errors`` profile)."""

    status: int
    body: JsonObject | None
    headers: dict[str, str] = field(default_factory=dict)
    text: str | None = None


def not_found(uri: str) -> RedfishError:
    """404 ``ResourceNotFound`` for ``uri``."""
    return RedfishError(
        404,
        "ResourceNotFound",
        f"The requested resource {uri} was not found.",
        args=["Resource", uri],
    )


def error_key_for(status_code: int) -> str:
    """The Base message key that fits an injected error status."""
    if status_code == 503:
        return "ServiceTemporarilyUnavailable"
    if status_code == 500:
        return "InternalError"
    return "GeneralError"


def etag_matches(header: str, etag: str) -> bool:
    """True when an If-Match / If-None-Match value names ``etag`` (or is ``*``)."""
    candidates = [c.strip() for c in header.split(",")]
    return "*" in candidates or etag in candidates or f"W/{etag}" in candidates


def _type_error(name: str, value: Any) -> RedfishError:
    return RedfishError(
        400,
        "PropertyValueTypeError",
        f"The value {json.dumps(value)} for the property {name} is of a "
        "different type than the property can accept.",
        args=[json.dumps(value), name],
    )


def _param_type_error(action: str, key: str, value: Any) -> RedfishError:
    return RedfishError(
        400,
        "ActionParameterValueTypeError",
        f"The value {json.dumps(value)} for the parameter {key} in the "
        f"action {action} is of a different type than the parameter can "
        "accept.",
        args=[json.dumps(value), key, action],
    )


def parse_links_patch(body: JsonObject, system: JsonObject, old: list[str]) -> list[str]:
    """The System's new block list from a PATCH body ``{"Links": {"ResourceBlocks": [...]}}``.

    DSP0266: the array is the full new list, and an empty object ``{}`` keeps the element at
    that index of ``old`` (the current list). Duplicates are dropped, the first one kept.

    Args:
        body: the parsed request body.
        system: the System resource (to tell read-only properties from unknown ones).
        old: the System's current block URIs.

    Returns:
        The new block URIs, normalised, in the order given.

    Raises:
        RedfishError: 400 ``PropertyMissing``, ``PropertyValueTypeError``,
            ``PropertyValueError``, ``PropertyNotWritable`` or ``PropertyUnknown``.
    """
    for key in body:
        if key.startswith("@") or key == "Links":
            continue
        if key in system:
            raise RedfishError(
                400,
                "PropertyNotWritable",
                f"The property {key} is a read-only property and cannot be assigned a value.",
                args=[key],
            )
        raise RedfishError(
            400,
            "PropertyUnknown",
            f"The property {key} is not in the list of valid properties for the resource.",
            args=[key],
        )
    links = body.get("Links")
    if links is None:
        raise RedfishError(
            400,
            "PropertyMissing",
            "The property Links/ResourceBlocks is a required property and "
            "must be included in the request.",
            args=["Links/ResourceBlocks"],
        )
    if not isinstance(links, dict):
        raise _type_error("Links", links)
    for key in links:
        if key != "ResourceBlocks":
            raise RedfishError(
                400,
                "PropertyNotWritable",
                f"The property Links/{key} is a read-only property and cannot be assigned a value.",
                args=[f"Links/{key}"],
            )
    refs = links.get("ResourceBlocks")
    if not isinstance(refs, list):
        if refs is None:
            raise RedfishError(
                400,
                "PropertyMissing",
                "The property Links/ResourceBlocks is a required property "
                "and must be included in the request.",
                args=["Links/ResourceBlocks"],
            )
        raise _type_error("Links/ResourceBlocks", refs)
    new: list[str] = []
    for index, ref in enumerate(refs):
        name = f"Links/ResourceBlocks/{index}"
        if not isinstance(ref, dict):
            raise _type_error(name, ref)
        if not ref:
            # DSP0266: an empty object in a PATCHed array keeps the element at that index.
            if index >= len(old):
                raise RedfishError(
                    400,
                    "PropertyValueError",
                    f"The value provided for the property {name} is not "
                    "valid: there is no element to keep.",
                    args=[name],
                )
            new.append(old[index])
            continue
        target = ref.get("@odata.id")
        if set(ref) != {"@odata.id"} or not isinstance(target, str):
            raise _type_error(name, ref)
        new.append(normalise(target))
    return list(dict.fromkeys(new))


def parse_block_action(action: str, body: JsonObject) -> tuple[str, dict[str, str]]:
    """The parameters of ``ComputerSystem.AddResourceBlock`` / ``RemoveResourceBlock``.

    Body (ComputerSystem schema): ``{"ResourceBlock": {"@odata.id": uri}}`` with optional
    string parameters ``ResourceBlockETag`` and ``ComputerSystemETag``.

    Returns:
        (block URI, normalised; {parameter name: ETag} for the ETags given).

    Raises:
        RedfishError: 400 ``ActionParameterUnknown``, ``ActionParameterMissing`` or
            ``ActionParameterValueTypeError``.
    """
    for key, value in body.items():
        if key not in ("ResourceBlock", "ResourceBlockETag", "ComputerSystemETag"):
            raise RedfishError(
                400,
                "ActionParameterUnknown",
                f"The action {action} was submitted with the invalid parameter {key}.",
                args=[action, key],
            )
        if key != "ResourceBlock" and not isinstance(value, str):
            raise _param_type_error(action, key, value)
    ref = body.get("ResourceBlock")
    if ref is None:
        raise RedfishError(
            400,
            "ActionParameterMissing",
            f"The action {action} requires the parameter ResourceBlock to "
            "be present in the request body.",
            args=[action, "ResourceBlock"],
        )
    if not (isinstance(ref, dict) and isinstance(ref.get("@odata.id"), str)):
        raise _param_type_error(action, "ResourceBlock", ref)
    block = normalise(ref["@odata.id"])
    return block, {k: v for k, v in body.items() if k.endswith("ETag")}


class FabricState:
    """The Systems and ResourceBlocks of one tree and who holds what.

    Args:
        tree: URI -> JSON object; changed in place by attach, detach and the test controls.
        builder: the generator of a generated tree (None for a mockup): needed by
            :meth:`add_block`.

    Attributes:
        tree: the tree.
        systems: System URIs, in collection order.
        blocks: ResourceBlock URIs, in collection order.
        history: ("attach" | "detach", block URI, System Id) for every change made through
            the API, in order (not the out-of-band ones, nor :meth:`forget_attachments`).
        owned: block URI -> the URI of the System that owns it and may not give it up (406;
            the ``server-owned-compute`` profile's compute blocks).
        etags: put ``@odata.etag`` in answers (False: the ``no-etags`` profile).
        noop_attaches: how many attaches (changes that would add a block to a System) are
            answered with success without being made; None: all of them (``attach-noop``).
    """

    def __init__(self, tree: Tree, builder: TreeBuilder | None) -> None:
        self.tree = tree
        self._builder = builder
        self.history: list[tuple[str, str, str]] = []
        self.owned: dict[str, str] = {}
        self.etags = True
        self.noop_attaches: int | None = 0
        #: Called with (ResourceEvent message, origin URI, severity) on every change the
        #: simulator makes (the EventService's server-sent events); None: nobody listens.
        self.on_change: Callable[[str, str, str], None] | None = None
        self.systems: list[str] = self._members_present(SYSTEMS)
        self.blocks: list[str] = self._members_present(BLOCKS)
        self._system_set = frozenset(self.systems)
        named_by: dict[str, list[str]] = {}
        for system in self.systems:
            for block in self.system_blocks(system):
                named_by.setdefault(block, []).append(system)
        self._holders: dict[str, list[str]] = {
            b: self._initial_holders(b, named_by.get(b, [])) for b in self.blocks
        }
        self._initial: tuple[dict[str, list[str]], dict[str, list[str]]] = ({}, {})
        self.mark_initial()

    def mark_initial(self) -> None:
        """Remember who holds what now, as the state :meth:`forget_attachments` goes back to."""
        self._initial = (
            {b: list(h) for b, h in self._holders.items()},
            {s: self.system_blocks(s) for s in self.systems},
        )

    def forget_attachments(self) -> None:
        """Go back to the holders of :meth:`mark_initial` (a restart of a service that keeps
        its state in memory), without history entries.

        Blocks added since then end up unused, removed ones stay removed; nothing else
        changes.
        """
        initial_holders, initial_lists = self._initial
        changed = []
        for block in self.blocks:
            target = [h for h in initial_holders.get(block, []) if h in self._system_set]
            if self._holders[block] != target:
                self._holders[block] = target
                changed.append(block)
        for system in self.systems:
            # Keep references that were never blocks (a mockup's dangling ones) as they were.
            wanted = [
                b
                for b in initial_lists.get(system, [])
                if b in self._holders or b not in initial_holders
            ]
            if self.system_blocks(system) != wanted:
                self.tree[system].setdefault("Links", {})["ResourceBlocks"] = [
                    link(b) for b in wanted
                ]
        for block in changed:
            self._sync_block(block)

    def system_uri(self, system_id: str) -> str:
        """The URI of the System whose ``Id`` is ``system_id``.

        Raises:
            KeyError: no such System.
        """
        for uri in self.systems:
            if self.system_id(uri) == system_id:
                return uri
        raise KeyError(f"no ComputerSystem {system_id!r}")

    def attach_out_of_band(self, block_uri: str, system_id: str) -> None:
        """Make ``system_id`` hold the block as if someone else had attached it (no history).

        A no-op when it already does; an owned block may be attached elsewhere this way.

        Raises:
            KeyError: the block or the System is unknown.
            ValueError: the block is held by another System (and not shareable with room).
        """
        block = normalise(block_uri)
        if block not in self._holders:
            raise KeyError(f"no ResourceBlock {block_uri!r}")
        system = self.system_uri(system_id)
        if system in self._holders[block]:
            return
        try:
            self.check_block(block, system)
        except RedfishError as err:
            raise ValueError(err.text) from None
        self._attach(block, system, record=False)

    def detach_out_of_band(self, block_uri: str) -> list[str]:
        """Remove the block from every System holding it, as if by hand (no history).

        Returns:
            The ``Id`` of every System it was removed from.

        Raises:
            KeyError: the block is unknown.
        """
        block = normalise(block_uri)
        if block not in self._holders:
            raise KeyError(f"no ResourceBlock {block_uri!r}")
        removed = [self.system_id(s) for s in self._holders[block]]
        for system in list(self._holders[block]):
            self._detach(block, system, record=False)
        return removed

    def is_system(self, uri: str) -> bool:
        """True when ``uri`` (normalised) is a ComputerSystem."""
        return uri in self._system_set

    def etag(self, path: str) -> str:
        """The strong ETag of the resource at ``path``: a hash of its JSON content."""
        resource = {k: v for k, v in self.tree[path].items() if k != "@odata.etag"}
        digest = hashlib.sha256(json.dumps(resource, sort_keys=True).encode()).hexdigest()
        return f'"{digest[:20]}"'

    def with_etag(
        self, path: str, *, members: slice | None = None, etag: bool = True
    ) -> JsonObject:
        """A copy of the resource at ``path`` with ``@odata.etag`` set (unless ``etag`` is
        False: an expanded answer has none).

        ``members`` copies only that slice of a collection's ``Members`` (a page), so that
        paging a large collection does not copy all of it.
        """
        resource = self.tree[path]
        if members is not None and isinstance(resource.get("Members"), list):
            body = {k: copy.deepcopy(v) for k, v in resource.items() if k != "Members"}
            body["Members"] = copy.deepcopy(resource["Members"][members])
        else:
            body = copy.deepcopy(resource)
        if etag and self.etags:
            body["@odata.etag"] = self.etag(path)
        else:
            body.pop("@odata.etag", None)
        return body

    def _members_present(self, collection_uri: str) -> list[str]:
        members = self.tree.get(collection_uri, {}).get("Members", [])
        uris = [
            normalise(m["@odata.id"])
            for m in members
            if isinstance(m, dict) and isinstance(m.get("@odata.id"), str)
        ]
        return [u for u in dict.fromkeys(uris) if u in self.tree]

    def _initial_holders(self, block_uri: str, named_by: list[str]) -> list[str]:
        # Who holds a block: its Links.ComputerSystems plus every System whose
        # Links.ResourceBlocks names it (mockups sometimes fill only one side).
        holders: list[str] = []
        links = self.tree[block_uri].get("Links")
        if isinstance(links, dict):
            for ref in links.get("ComputerSystems") or []:
                if isinstance(ref, dict) and isinstance(ref.get("@odata.id"), str):
                    holders.append(normalise(ref["@odata.id"]))
        holders += named_by
        return [h for h in dict.fromkeys(holders) if h in self._system_set]

    def system_blocks(self, system_uri: str) -> list[str]:
        """The block URIs in the System's ``Links.ResourceBlocks``, in order."""
        links = self.tree[system_uri].get("Links")
        refs = links.get("ResourceBlocks") if isinstance(links, dict) else None
        return [
            normalise(r["@odata.id"])
            for r in refs or []
            if isinstance(r, dict) and isinstance(r.get("@odata.id"), str)
        ]

    def block_uris(self) -> list[str]:
        """Every ResourceBlock URI (``@odata.id``), in collection order."""
        return list(self.blocks)

    def system_ids(self) -> list[str]:
        """Every ComputerSystem ``Id``, in collection order."""
        return [self.system_id(u) for u in self.systems]

    def attachments(self) -> dict[str, str | None]:
        """Block URI -> the ``Id`` of the System holding it (the first one if shared), or None."""
        return {
            b: (self.system_id(h[0]) if (h := self._holders.get(b)) else None) for b in self.blocks
        }

    def holders(self, block_uri: str) -> list[str]:
        """The ``Id`` of every System holding ``block_uri`` (several for a shared block).

        Raises:
            KeyError: the block is unknown.
        """
        return [self.system_id(h) for h in self._holders[normalise(block_uri)]]

    def set_health(self, uri: str, health: str) -> None:
        """Set ``Status.Health`` of the resource at ``uri`` (a block, device or System).

        Raises:
            KeyError: no resource at ``uri``.
            ValueError: ``health`` is not OK, Warning or Critical (Resource.Health).
        """
        if health not in HEALTHS:
            raise ValueError(f"health must be one of {', '.join(HEALTHS)}, got {health!r}")
        resource = self.tree[normalise(uri)]
        current = resource.get("Status")
        before = current.get("Health") if isinstance(current, dict) else None
        resource["Status"] = {**(current if isinstance(current, dict) else {}), "Health": health}
        if before != health:
            self.changed(f"ResourceStatusChanged{health}", normalise(uri), _SEVERITY[health])

    def changed(self, message: str, origin: str, severity: str = "OK") -> None:
        """Tell :attr:`on_change` (the EventService) of a change."""
        if self.on_change is not None:
            self.on_change(message, origin, severity)

    def remove_block(self, block_uri: str) -> None:
        """Remove a block, its devices and every link to it (no history entry is written).

        Raises:
            KeyError: the block is unknown.
        """
        uri = normalise(block_uri)
        if uri not in self._holders:
            raise KeyError(f"no ResourceBlock {block_uri!r}")
        holders = list(self._holders[uri])
        for key in [k for k in self.tree if k == uri or k.startswith(uri + "/")]:
            del self.tree[key]
        self.blocks.remove(uri)
        del self._holders[uri]
        self.owned.pop(uri, None)
        coll = self.tree[BLOCKS]
        coll["Members"] = [m for m in coll["Members"] if normalise(m.get("@odata.id", "")) != uri]
        coll["Members@odata.count"] = len(coll["Members"])
        for resource in self.tree.values():
            links = resource.get("Links")
            if isinstance(links, dict) and isinstance(links.get("ResourceBlocks"), list):
                links["ResourceBlocks"] = [
                    r
                    for r in links["ResourceBlocks"]
                    if not (isinstance(r, dict) and normalise(str(r.get("@odata.id"))) == uri)
                ]
        self.changed("ResourceRemoved", uri)
        for system in holders:
            self.changed("ResourceChanged", system)

    def add_block(self, region: str, rack: str, device_type: str = "gpu") -> str:
        """Add a device in a new ResourceBlock to an existing rack of a generated tree.

        Args:
            region: region name (``us-east``).
            rack: rack name (``rack-01``).
            device_type: ``gpu``, ``fpga``, ``nvme`` or ``cxl-memory``.

        Returns:
            The new block's URI.

        Raises:
            ValueError: the simulator serves a mockup, or the device type is unknown.
            KeyError: no such rack.
        """
        if self._builder is None:
            raise ValueError("add_block needs a generated inventory, not a mockup")
        uri = self._builder.add_block(region, rack, device_type)
        self.blocks.append(uri)
        self._holders[uri] = []
        self.changed("ResourceCreated", uri)
        return uri

    def check_block(self, block: str, system: str) -> None:
        """Check that ``system`` may take ``block``.

        Raises:
            RedfishError: 404 ``ResourceNotFound`` (unknown block) or 409 ``ResourceInUse``
                (held by another System, and not shareable with room left).
        """
        if block not in self._holders:
            raise not_found(block)
        others = [h for h in self._holders[block] if h != system]
        if not others:
            return
        state = self.tree[block].get("CompositionStatus")
        state = state if isinstance(state, dict) else {}
        shareable = bool(state.get("SharingCapable")) and bool(state.get("SharingEnabled"))
        limit = state.get("MaxCompositions")
        room = not isinstance(limit, int) or len(others) < limit
        if not (shareable and room):
            raise RedfishError(
                409,
                "ResourceInUse",
                f"The change to the requested resource failed because the "
                f"resource {block} is in use by "
                f"{self.system_id(others[0])}.",
                args=[block],
            )

    def _take_noop_attach(self) -> bool:
        """True when this attach is to be swallowed (``attach-noop``), counting it."""
        if self.noop_attaches is None:
            return True
        if self.noop_attaches > 0:
            self.noop_attaches -= 1
            return True
        return False

    def _refuse_owned(self, block: str, system: str) -> None:
        # REDFISH-REFERENCE.md, "What a real composability service did": a PATCH of
        # Links.ResourceBlocks that leaves the System's own compute block out is refused
        # with 406 (and so, here, is RemoveResourceBlock of it).
        if self.owned.get(block) == system:
            raise RedfishError(
                406,
                "GeneralError",
                f"The compute block {block} belongs to "
                f"{self.system_id(system)} and cannot be removed from it.",
                args=[block],
            )

    def _attach(self, block: str, system: str, *, record: bool = True) -> None:
        self._holders[block].append(system)
        refs = self.tree[system].setdefault("Links", {}).setdefault("ResourceBlocks", [])
        if block not in self.system_blocks(system):
            refs.append(link(block))
        self._sync_block(block)
        self.changed("ResourceChanged", block)
        self.changed("ResourceChanged", system)
        if record:
            self.history.append(("attach", block, self.system_id(system)))

    def _detach(self, block: str, system: str, *, record: bool = True) -> None:
        self._holders[block].remove(system)
        links = self.tree[system].setdefault("Links", {})
        links["ResourceBlocks"] = [
            r
            for r in links.get("ResourceBlocks", [])
            if not (isinstance(r, dict) and normalise(str(r.get("@odata.id"))) == block)
        ]
        self._sync_block(block)
        self.changed("ResourceChanged", block)
        self.changed("ResourceChanged", system)
        if record:
            self.history.append(("detach", block, self.system_id(system)))

    def _sync_block(self, block: str) -> None:
        resource = self.tree[block]
        holders = self._holders[block]
        links = resource.get("Links")
        if not isinstance(links, dict):
            links = resource["Links"] = {}
        links["ComputerSystems"] = [link(h) for h in holders]
        comp = resource.get("CompositionStatus")
        if not isinstance(comp, dict):
            comp = resource["CompositionStatus"] = {}
        limit = comp.get("MaxCompositions")
        shareable = bool(comp.get("SharingCapable")) and bool(comp.get("SharingEnabled"))
        if not holders:
            comp["CompositionState"] = "Unused"
        elif shareable and (not isinstance(limit, int) or len(holders) < limit):
            comp["CompositionState"] = "ComposedAndAvailable"
        else:
            comp["CompositionState"] = "Composed"
        comp["NumberOfCompositions"] = len(holders)

    def apply_set(self, system: str, new: list[str]) -> Result:
        """Make ``new`` the System's full block list (the PATCH of ``Links.ResourceBlocks``).

        All checks come first, so a refused PATCH changes nothing. A swallowed attach
        (:attr:`noop_attaches`) answers 200 with the System as the PATCH asked for it while
        the stored System stays unchanged.

        Returns:
            200 with the System.

        Raises:
            RedfishError: 406 for a list without a block the System owns; as
                :meth:`check_block`, for each added block.
        """
        old = self.system_blocks(system)
        added = [b for b in new if b not in old]
        removed = [b for b in old if b not in new and b in self._holders]
        for block in removed:
            self._refuse_owned(block, system)
        for block in added:
            self.check_block(block, system)
        if any(system not in self._holders[b] for b in added) and self._take_noop_attach():
            body = self.with_etag(system)
            body.setdefault("Links", {})["ResourceBlocks"] = [link(b) for b in new]
            return Result(200, body, {"ETag": self.etag(system)})
        # Frees first, so that a PATCH never holds more than the final list at any moment.
        for block in removed:
            if system in self._holders[block]:
                self._detach(block, system)
        for block in added:
            if system not in self._holders[block]:
                self._attach(block, system)
        self.tree[system].setdefault("Links", {})["ResourceBlocks"] = [link(b) for b in new]
        return Result(200, self.with_etag(system), {"ETag": self.etag(system)})

    def apply_add(self, system: str, block: str) -> Result:
        """``ComputerSystem.AddResourceBlock``: 200 ``Success``, or 200 ``NoOperation`` when held.

        A swallowed attach (:attr:`noop_attaches`) answers ``Success`` and changes nothing.

        Raises:
            RedfishError: as :meth:`check_block`.
        """
        self.check_block(block, system)
        if system in self._holders[block]:
            return self._action_result(
                "NoOperation",
                "The request body submitted contain no "
                "data to act upon and no changes to the resource took "
                "place.",
                system,
            )
        if self._take_noop_attach():
            return self._action_result("Success", "The request completed successfully.", system)
        self._attach(block, system)
        return self._action_result("Success", "The request completed successfully.", system)

    def apply_remove(self, system: str, block: str) -> Result:
        """``ComputerSystem.RemoveResourceBlock``: 200 ``Success``, or 200 ``NoOperation``.

        Raises:
            RedfishError: 404 ``ResourceNotFound`` for an unknown block, 406 for a block the
                System owns.
        """
        if block not in self._holders:
            raise not_found(block)
        if system in self._holders[block]:
            self._refuse_owned(block, system)
        if system not in self._holders[block]:
            return self._action_result(
                "NoOperation",
                "The request body submitted contain no "
                "data to act upon and no changes to the resource took "
                "place.",
                system,
            )
        self._detach(block, system)
        return self._action_result("Success", "The request completed successfully.", system)

    def _action_result(self, key: str, text: str, system: str) -> Result:
        return Result(
            200,
            {"@Message.ExtendedInfo": [message(key, text, severity="OK")]},
            {"ETag": self.etag(system)},
        )

    def system_id(self, system_uri: str) -> str:
        """The System's ``Id`` (its last URI segment when the resource has none)."""
        resource = self.tree.get(system_uri, {})
        value = resource.get("Id")
        return value if isinstance(value, str) else system_uri.rsplit("/", 1)[-1]
