"""Reading a Redfish service's resources: the service root and its links, collections page
by page (with ``$expand`` when the service offers it), and single member resources.

Collections follow ``Members@odata.nextLink``; a failed page fails the whole read (never a
partial list). ``$expand`` (DSP0266 "Query parameters") is used as far as the service root's
``ProtocolFeaturesSupported.ExpandQuery`` offers it; a service that advertises it but refuses it
(400/501 on the first page) is read without it from then on. A member resource that answers
HTTP 500 after one retry (real services answer 500 for dangling links) is a ``fetch-failed``
item (:class:`~app.fabric.redfish.parse.common.BadItem`); a 500 on the service root or a
collection page still fails the read.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from yarl import URL

from app.fabric.errors import (
    FabricAuthError,
    FabricError,
    FabricInvalidData,
    FabricUnavailable,
)
from app.fabric.redfish.parse.collection import (
    MAX_EXPAND_LEVELS,
    CollectionPage,
    expand_levels,
    offers_top_skip,
    parse_collection_page,
)
from app.fabric.redfish.parse.common import BadItem, link
from app.fabric.redfish.transport import RedfishTransport
from app.fabric.types import Rejected

logger = logging.getLogger(__name__)

SERVICE_ROOT = "/redfish/v1/"
MAX_PAGES = 100_000
TOP_PAGE = 1000
"""Members asked for per window (``$top``, at least 2) when a collection is read with
``$expand`` from a service that offers ``$top``/``$skip``: a service that does not page by
itself would otherwise answer 100,000 expanded devices in one body, several hundred MB held
at once."""


class ResourceReader:
    """Reads resources of one service through ``transport``; remembers the service root and
    whether the service refuses ``$expand``.

    Args:
        transport: the service's transport.
    """

    def __init__(self, transport: RedfishTransport) -> None:
        self._transport = transport
        self._root: Mapping[str, Any] | None = None
        self._expand_refused = False
        self._top_refused = False

    @property
    def transport(self) -> RedfishTransport:
        """The transport the reads go through."""
        return self._transport

    async def service_root(self) -> Mapping[str, Any]:
        """The service root (``/redfish/v1/``), read once.

        Raises:
            FabricInvalidData: its body is not a JSON object.
            FabricError: as :meth:`RedfishTransport.get`.
        """
        if self._root is None:
            response = await self._transport.get(SERVICE_ROOT)
            if not isinstance(response.body, Mapping):
                raise FabricInvalidData(f"GET {SERVICE_ROOT}: body is not a JSON object")
            self._root = response.body
        return self._root

    async def root_link(self, *names: str) -> str:
        """The URI that ``names`` lead to from the service root: ``root_link("Systems")``,
        ``root_link("CompositionService", "ResourceBlocks")`` (each step but the last is read).

        Raises:
            FabricInvalidData: a step is missing or not a link, or a resource on the way is
                not a JSON object.
            ValueError: no names given.
        """
        current: Mapping[str, Any] = await self.service_root()
        where = SERVICE_ROOT
        for index, name in enumerate(names):
            try:
                uri = link(current.get(name), f"{where} {name}")
            except BadItem as err:
                raise FabricInvalidData(f"service has no usable {name}: {err.reason}") from err
            if index == len(names) - 1:
                return uri
            response = await self._transport.get(uri)
            if not isinstance(response.body, Mapping):
                raise FabricInvalidData(f"GET {uri}: body is not a JSON object")
            current, where = response.body, uri
        raise ValueError("no link names given")

    async def expand_query(self, most: int = MAX_EXPAND_LEVELS) -> str | None:
        """The ``$expand`` value for collections, at most ``most`` levels deep, when the
        service offers it, else None."""
        levels = min(most, expand_levels(await self.service_root()))
        if levels == 0 or self._expand_refused:
            return None
        return "." if levels == 1 else f".($levels={levels})"

    async def pages(
        self, uri: str, expand: str | None = None
    ) -> AsyncIterator[tuple[CollectionPage, list[Any]]]:
        """Each page of a collection, following ``Members@odata.nextLink``, with its raw
        ``Members`` (expanded resources when ``expand`` is given and the service expands).

        With ``expand``, a service that offers ``$top``/``$skip`` is asked for
        :data:`TOP_PAGE` members at a time (a window; ``nextLink`` pages of the service's own
        paging inside it are followed), the next window by ``$skip``, until a window brings
        fewer. Each window after the first starts at the last member already read: when that
        member is not where it was, the collection changed meanwhile and the read fails
        (a member shifted across two windows would otherwise be missed without a sign). A
        service that refuses ``$top`` (400/501), or ignores ``$skip`` (the next window brings
        the first members again), is read without them from then on; pages already given may
        then come again, and callers keep members by URI.

        Raises:
            FabricUnavailable: any page could not be read, or the collection changed while it
                was read window by window (never a partial list).
            FabricInvalidData: a page is not a collection, or the pages loop.
            FabricAuthError: credentials refused.
        """
        if self._expand_refused:
            expand = None
        top = (
            TOP_PAGE
            if expand is not None
            and not self._top_refused
            and offers_top_skip(await self.service_root())
            else None
        )
        seen: set[str] = set()
        members_seen: set[str] = set()
        start = 0  # the $skip of the current window
        window = 0  # members the current window brought so far
        last: str | None = None  # the last member read
        page_ref: str | None = _query(uri, expand, 0, top)
        while page_ref is not None:
            page_path = self._transport.path(page_ref)
            if page_path in seen or len(seen) >= MAX_PAGES:
                raise FabricInvalidData(f"collection {uri}: page {page_path} repeats")
            seen.add(page_path)
            try:
                response = await self._transport.get(page_path)
            except FabricError as err:
                first = not seen - {page_path}
                if first and top is not None and err.status in (400, 501):
                    logger.info(
                        "redfish %s refuses $top (%s); reading collections without it",
                        self._transport.origin,
                        err,
                    )
                    self._top_refused = True
                    top, page_ref = None, _query(uri, expand, 0, None)
                    seen.clear()
                    continue
                if expand is not None and first and err.status in (400, 501):
                    # Advertised but refused (seen in the wild, and in mockups served as they
                    # are): read this and every later collection without $expand.
                    logger.info(
                        "redfish %s refuses $expand (%s); reading without it",
                        self._transport.origin,
                        err,
                    )
                    self._expand_refused = True
                    expand, page_ref = None, uri
                    seen.clear()
                    continue
                if isinstance(err, FabricUnavailable | FabricAuthError | FabricInvalidData):
                    raise
                raise FabricUnavailable(
                    f"collection {uri}: page {page_path} unreadable: {err}",
                    status=err.status,
                    vendor_code=err.vendor_code,
                ) from err
            page = parse_collection_page(response.body, page_path)
            if top is not None and start and not window:
                # A window asked by $skip starts at the last member already read.
                first_member = page.members[0] if page.members else None
                if first_member != last and members_seen.issuperset(page.members):
                    # $skip ignored: the first members again. Read it all at once instead.
                    logger.info(
                        "redfish %s ignores $skip on %s; reading collections without $top",
                        self._transport.origin,
                        uri,
                    )
                    self._top_refused = True
                    top, page_ref, start, window = None, _query(uri, expand, 0, None), 0, 0
                    seen.clear()
                    continue
                if first_member != last:
                    raise FabricUnavailable(
                        f"collection {uri} changed while it was read {TOP_PAGE} members at a "
                        f"time (member {start} is no longer {last}); read again later"
                    )
            yield page, response.body["Members"]
            page_ref = page.next_link
            if top is not None:
                members_seen.update(page.members)
                window += len(page.members)
                if page.members:
                    last = page.members[-1]
                if page_ref is None and window >= top:
                    # A full window: the next one starts at its last member (read again).
                    start, window = start + window - 1, 0
                    page_ref = _query(uri, expand, start, top)

    async def collection(self, uri: str) -> tuple[list[str], list[Rejected]]:
        """Every member URI of a collection, following ``Members@odata.nextLink``.

        Raises:
            FabricUnavailable: any page could not be read (never a partial list).
            FabricInvalidData: a page is not a collection, or the pages loop.
            FabricAuthError: credentials refused.
        """
        members: dict[str, None] = {}
        rejected: list[Rejected] = []
        async for page, _ in self.pages(uri):
            for member in page.members:
                members.setdefault(member, None)
            rejected.extend(bad_members(uri, page))
        return list(members), rejected

    async def expanded_collection(
        self, uri: str, expand: str
    ) -> tuple[list[tuple[str, Any]], list[Rejected]]:
        """Every member of a collection read with ``$expand``: (URI, body) pairs, where the
        body is None for a member the service left as a link (the caller reads it)."""
        members: dict[str, Any] = {}
        rejected: list[Rejected] = []
        async for page, raw in self.pages(uri, expand):
            members.update((member, None) for member in page.members if member not in members)
            for entry in raw:
                body = expanded_member(entry)
                if body is not None and members.get(body[0], 0) is None:
                    members[body[0]] = body[1]
            rejected.extend(bad_members(uri, page))
        return list(members.items()), rejected

    async def read_item(self, uri: str, *, strict: bool = False) -> Any:
        """A member resource's body, or BadItem when this one item cannot be read.

        A 4xx (404 for a dangling link, say), a body that is not JSON, or an HTTP 500 that
        repeats once (real services answer 500 for resources that do not exist) is this
        item's ``fetch-failed``. Listing-wide failures (other FabricUnavailable, including a
        500 with ``strict``, and FabricAuthError) propagate.
        """
        try:
            response = await self._transport.get(uri, item=not strict)
        except FabricUnavailable as err:
            if strict or err.status != 500:
                raise
            raise BadItem(f"{err} (after one retry)", "fetch-failed") from err
        except FabricAuthError:
            raise
        except FabricError as err:
            raise BadItem(str(err), "fetch-failed") from err
        return response.body


def _query(uri: str, expand: str | None, skip: int, top: int | None) -> str:
    """``uri`` with ``$expand``, ``$skip`` and ``$top`` as given (none when None or 0)."""
    query: dict[str, str] = {}
    if expand is not None:
        query["$expand"] = expand
    if skip:
        query["$skip"] = str(skip)
    if top is not None:
        query["$top"] = str(top)
    return str(URL(uri).update_query(query)) if query else uri


def bad_members(uri: str, page: CollectionPage) -> list[Rejected]:
    """A Rejected (``bad-type``) for each member of ``page`` with no usable ``@odata.id``,
    named by its JSON pointer in collection ``uri``."""
    return [
        Rejected(f"{uri}#/Members/{index}", f"collection member: {reason}", "bad-type")
        for index, reason in page.bad_members
    ]


def expanded_member(member: Any) -> tuple[str, Mapping[str, Any]] | None:
    """(URI, body) of a collection member the service expanded, else None (a plain link)."""
    if not isinstance(member, Mapping):
        return None
    uri = member.get("@odata.id")
    if not isinstance(uri, str) or not any(not key.startswith("@") for key in member):
        return None
    return uri, member
