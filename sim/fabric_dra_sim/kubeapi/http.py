"""The aiohttp application: discovery, the resource endpoints, watches and the middleware for
authentication, authorization (RBAC, see rbac.py), latency, injected faults and the request log.

URL layout as kube-apiserver serves it (k8s.io/apiserver pkg/endpoints/installer.go):
``/api/v1/[namespaces/<ns>/]<plural>[/<name>[/<subresource>]]`` and the same under
``/apis/<group>/<version>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from app.jsontypes import dumps_json

from .bodies import ClientGone, decode_object, decode_value, media_type, read_body
from .errors import StatusError, bad_request, method_not_allowed, unauthorized
from .faults import Faults, RequestRecord
from .fieldvalidation import directive
from .listing import (
    WatchFilter,
    parse_list_options,
    parse_list_resource_version,
    parse_watch_resource_version,
    query_bool,
    query_int,
    too_large_resource_version,
    watch_list_enabled,
    watch_too_old,
)
from .operations import APPLY_PATCH, Api
from .options import accepted_status, check_write_options, delete_options
from .rbac import RbacPolicy, request_attributes
from .resources import (
    ResourceType,
    api_group,
    api_group_list,
    api_resource_list,
    api_versions,
)
from .selectors import parse_field_selector_for, parse_label_selector
from .store import StoreEvent, Watcher, WatchExpired, WatchItem
from .values import json_kind

DEFAULT_WATCH_TIMEOUT_S = 1800.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class ServerState:
    """Everything the handlers share: the verbs, faults, settings and the open watches."""

    api: Api
    faults: Faults
    git_version: str
    token: str | None
    bookmark_interval_s: float
    watchers: set[Watcher] = field(default_factory=set)
    tokens: dict[str, str] = field(default_factory=dict)
    rbac: RbacPolicy | None = None


def encode_json(value: Any) -> bytes:
    """``value`` as kube-apiserver's compact UTF-8 JSON (Go's encoding/json)."""
    return dumps_json(value)


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON response with kube-apiserver's content type."""
    return web.Response(
        body=encode_json(body), status=status, content_type="application/json", headers=headers
    )


def status_response(err: StatusError) -> web.Response:
    """The HTTP response for a StatusError."""
    return json_response(err.body(), err.code, err.headers or None)


@dataclass(frozen=True)
class Target:
    """A parsed resource URL: type, namespace ('' = cluster or all), name, subresource."""

    rt: ResourceType
    namespace: str
    name: str
    subresource: str


def parse_target(api: Api, group: str, version: str, tail: str) -> Target:
    """Resolve the path after ``/api/v1`` or ``/apis/<g>/<v>``; StatusError 404 if unknown."""
    parts = [p for p in tail.split("/") if p]
    if len(parts) >= 3 and parts[0] == "namespaces":
        rt = api.find(group, version, parts[2])
        if rt is not None and rt.namespaced:
            rest = parts[3:]
            if len(rest) > 2:
                raise StatusError(
                    404, "NotFound", "the server could not find the requested resource"
                )
            return _target(rt, parts[1], rest)
    if not parts:
        raise StatusError(404, "NotFound", "the server could not find the requested resource")
    rt = api.find(group, version, parts[0])
    if rt is None or len(parts) > 3:
        raise StatusError(404, "NotFound", "the server could not find the requested resource")
    return _target(rt, "", parts[1:])


def _target(rt: ResourceType, namespace: str, rest: list[str]) -> Target:
    name = rest[0] if rest else ""
    sub = rest[1] if len(rest) > 1 else ""
    if sub and sub not in rt.subresources:
        raise StatusError(404, "NotFound", "the server could not find the requested resource")
    return Target(rt, namespace, name, sub)


def _manager(request: web.Request) -> str:
    agent = request.headers.get("User-Agent", "unknown")
    return agent.split("/", 1)[0] or "unknown"


async def _json_body(request: web.Request) -> Any:
    # A DELETE or binding body: size limit, media type, then JSON or YAML (bodies.py).
    raw = await read_body(request)
    if not raw:
        return None
    return decode_value(raw, media_type(request))


async def _object_body(request: web.Request) -> tuple[Any, list[str]]:
    # A create or update body and the paths of its repeated keys, which the strict decoder
    # reports (fieldvalidation.py). The media type is checked before the body is read, as
    # k8s.io/apiserver handlers/create.go negotiates the serializer first.
    kind = media_type(request)
    return decode_object(await read_body(request), kind)


# k8s.io/apiserver pkg/endpoints/filters/warning.go: past 4096 characters of warning text in
# one response every warning is cut to 256 characters.
WARNING_TOTAL_RUNES = 4 * 1024
WARNING_ITEM_RUNES = 256
WARNINGS_KEY = web.RequestKey("warnings", list[str])


def _warning_header(text: str) -> str | None:
    # k8s.io/apimachinery pkg/util/net/http.go NewWarningHeader: code 299, agent "-", the text
    # quoted with \ and " escaped; text with control characters is refused (None).
    if any(unicodedata.category(c) == "Cc" for c in text):
        return None
    return '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def warning_headers(messages: Iterable[str]) -> list[str]:
    """The ``Warning`` header values for ``messages``, as kube-apiserver's warning recorder
    writes them (k8s.io/apiserver pkg/endpoints/filters/warning.go recorder.AddWarning):
    empty and repeated messages skipped, ``299 - "<text>"``, and once the texts pass 4096
    characters every one (earlier ones included) cut to 256 characters, later ones dropped
    when the cut texts fill the budget again.
    """
    recorded: set[str] = set()
    ordered: list[str] = []
    headers: list[str] = []
    written = 0
    truncating = False
    for text in messages:
        if not text or (truncating and written >= WARNING_TOTAL_RUNES) or text in recorded:
            continue
        recorded.add(text)
        ordered.append(text)
        if truncating:
            text = text[:WARNING_ITEM_RUNES]
        header = _warning_header(text)
        if header is None:
            continue
        if truncating or written + len(text) <= WARNING_TOTAL_RUNES:
            written += len(text)
            headers.append(header)
            continue
        truncating = True
        written = 0
        headers = []
        for earlier in ordered:
            cut = earlier[:WARNING_ITEM_RUNES]
            replayed = _warning_header(cut)
            if replayed is not None:
                written += len(cut)
                headers.append(replayed)
    return headers


def _flag(value: str | None) -> bool:
    # The parameter codec's boolean: only "0" and "false" (any case) are false (listing.py).
    return query_bool(value)


def _query_lists(request: web.Request) -> dict[str, list[str]]:
    return {key: request.query.getall(key) for key in request.query}


def _int_param(request: web.Request, name: str) -> int:
    return query_int(name, request.query.get(name, ""))


def _binding_node(body: Any) -> str:
    # The Binding body decoded as its Go type (k8s.io/api core/v1 Binding, ObjectReference):
    # a wrong JSON type is a 400 decode error (handlers/create.go transformDecodeError), a
    # null a zero value.
    if body is None:
        return ""
    if not isinstance(body, dict):
        raise bad_request(
            f"json: cannot unmarshal {json_kind(body)} into Go value of type v1.Binding"
        )
    target = body.get("target")
    if target is None:
        return ""
    if not isinstance(target, dict):
        raise bad_request(
            f"json: cannot unmarshal {json_kind(target)} into Go struct field "
            "Binding.target of type v1.ObjectReference"
        )
    name = target.get("name")
    if name is None:
        return ""
    if not isinstance(name, str):
        raise bad_request(
            f"json: cannot unmarshal {json_kind(name)} into Go struct field "
            "Binding.target.name of type string"
        )
    return name


class Handlers:
    """The request handlers bound to one :class:`ServerState`."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    # -- discovery --------------------------------------------------------------------------
    async def version(self, _request: web.Request) -> web.StreamResponse:
        """``GET /version``."""
        parts = self.state.git_version.lstrip("v").split(".")
        return json_response(
            {
                "major": parts[0],
                "minor": parts[1] if len(parts) > 1 else "0",
                "gitVersion": self.state.git_version,
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.24",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        )

    async def healthz(self, _request: web.Request) -> web.StreamResponse:
        """``GET /healthz`` (also livez, readyz)."""
        return web.Response(text="ok")

    async def core_versions(self, _request: web.Request) -> web.StreamResponse:
        """``GET /api``."""
        return json_response(api_versions())

    async def core_resources(self, _request: web.Request) -> web.StreamResponse:
        """``GET /api/v1``."""
        return json_response(api_resource_list(self.state.api.types, "", "v1"))

    async def groups(self, _request: web.Request) -> web.StreamResponse:
        """``GET /apis``."""
        return json_response(api_group_list(self.state.api.types))

    async def group(self, request: web.Request) -> web.StreamResponse:
        """``GET /apis/<group>``."""
        doc = api_group(self.state.api.types, request.match_info["group"])
        if doc is None:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        return json_response(doc)

    async def group_version(self, request: web.Request) -> web.StreamResponse:
        """``GET /apis/<group>/<version>``."""
        doc = api_resource_list(
            self.state.api.types, request.match_info["group"], request.match_info["version"]
        )
        if doc is None:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        return json_response(doc)

    # -- resources --------------------------------------------------------------------------
    async def core_resource(self, request: web.Request) -> web.StreamResponse:
        """Everything under ``/api/v1/``."""
        target = parse_target(self.state.api, "", "v1", request.match_info["tail"])
        return await self._dispatch(request, target)

    async def group_resource(self, request: web.Request) -> web.StreamResponse:
        """Everything under ``/apis/<group>/<version>/``."""
        target = parse_target(
            self.state.api,
            request.match_info["group"],
            request.match_info["version"],
            request.match_info["tail"],
        )
        return await self._dispatch(request, target)

    async def _dispatch(self, request: web.Request, t: Target) -> web.StreamResponse:
        api = self.state.api
        method = request.method
        query = request.query
        # dryRun is a list parameter; only "All" is known (options.py).
        dry_run_values = query.getall("dryRun", [])
        dry_run = bool(dry_run_values)
        if t.rt.namespaced and not t.namespace and (method != "GET" or t.name):
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        if t.subresource == "binding":
            if method != "POST":
                raise method_not_allowed(
                    f"the server does not allow this method on the "
                    f"requested resource ({method} pods/binding)"
                )
            return await self._bind(request, t)
        if method == "GET":
            if t.name:
                await self._wait_get_resource_version(query.get("resourceVersion", ""))
                return json_response(api.get(t.rt, t.namespace, t.name, share_result=True))
            if _flag(query.get("watch")):
                return await self._watch(request, t)
            return await self._list(request, t)
        if method == "POST":
            if t.name:
                raise method_not_allowed(
                    f"the server does not allow this method on the "
                    f"requested resource (POST {t.rt.plural}/{t.name})"
                )
            check_write_options(
                "Create", dry_run=dry_run_values, field_manager=query.get("fieldManager", "")
            )
            field_validation = directive(query.get("fieldValidation"), "Create")
            body, duplicates = await _object_body(request)
            with self._warnings(request):
                new_obj = api.create(
                    t.rt,
                    t.namespace,
                    body,
                    manager=query.get("fieldManager") or _manager(request),
                    dry_run=dry_run,
                    field_validation=field_validation,
                    duplicates=duplicates,
                    # Just decoded, and encoded at once: no copy either way.
                    body_owned=True,
                    share_result=True,
                )
            return json_response(new_obj, 201)
        if not t.name:
            if method == "DELETE":
                return await self._delete_collection(request, t)
            raise method_not_allowed(
                f"the server does not allow this method on the requested "
                f"resource ({method} {t.rt.plural})"
            )
        if method == "PUT":
            check_write_options(
                "Update", dry_run=dry_run_values, field_manager=query.get("fieldManager", "")
            )
            field_validation = directive(query.get("fieldValidation"), "Update")
            body, duplicates = await _object_body(request)
            with self._warnings(request):
                updated = api.update(
                    t.rt,
                    t.namespace,
                    t.name,
                    body,
                    subresource=t.subresource,
                    manager=query.get("fieldManager") or _manager(request),
                    dry_run=dry_run,
                    field_validation=field_validation,
                    duplicates=duplicates,
                    body_owned=True,
                    share_result=True,
                )
            return json_response(updated)
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            check_write_options(
                "Patch",
                dry_run=dry_run_values,
                field_manager=query.get("fieldManager", ""),
                force_given="force" in query,
                apply=content_type == APPLY_PATCH,
            )
            field_validation = directive(query.get("fieldValidation"), "Patch")
            raw = await read_body(request)
            with self._warnings(request):
                obj, created = api.patch(
                    t.rt,
                    t.namespace,
                    t.name,
                    content_type,
                    raw,
                    subresource=t.subresource,
                    manager=_manager(request),
                    field_manager=query.get("fieldManager", ""),
                    force=_flag(query.get("force")),
                    dry_run=dry_run,
                    field_validation=field_validation,
                    share_result=True,
                )
            return json_response(obj, 201 if created else 200)
        if method == "DELETE":
            if t.subresource:
                raise method_not_allowed(
                    "the server does not allow this method on the requested resource"
                )
            options, delete_dry_run = delete_options(
                await _json_body(request), _query_lists(request)
            )
            with self._warnings(request):
                gone, deleted = api.delete(
                    t.rt, t.namespace, t.name, options, dry_run=delete_dry_run
                )
            # k8s.io/apiserver handlers/delete.go and registry store.go finalizeDelete: a kind
            # without ReturnDeletedObject answers a removal with a Success Status; an object
            # that stays (finalizers, graceful deletion) is answered with itself.
            if deleted and not t.rt.returns_deleted_object:
                details: dict[str, Any] = {
                    "name": t.name,
                    "kind": t.rt.plural,
                    "uid": gone["metadata"]["uid"],
                }
                if t.rt.group:
                    details["group"] = t.rt.group
                return json_response(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Success",
                        "details": details,
                    }
                )
            return json_response(gone, accepted_status(deleted, options))
        raise method_not_allowed(
            f"the server does not allow this method on the requested resource ({method})"
        )

    @contextlib.contextmanager
    def _warnings(self, request: web.Request) -> Iterator[None]:
        # The verbs are synchronous: what Api.warnings holds between these two points (no
        # await in the block) belongs to this request. The middleware sends it as headers,
        # on errors too, as the real recorder writes them with any response.
        warnings = self.state.api.warnings
        warnings.clear()
        try:
            yield
        finally:
            request[WARNINGS_KEY] = [*request.get(WARNINGS_KEY, ()), *warnings]
            warnings.clear()

    def _selectors(self, request: web.Request, t: Target) -> WatchFilter:
        labels = parse_label_selector(request.query.get("labelSelector", ""))
        fields = parse_field_selector_for(
            request.query.get("fieldSelector", ""), t.rt.group, t.rt.version, t.rt.kind
        )
        return WatchFilter(t.rt, t.namespace, labels, fields)

    async def _list(self, request: web.Request, t: Target) -> web.StreamResponse:
        # k8s.io/apiserver pkg/endpoints/handlers/get.go ListResource: options parsed and
        # validated (400/422), then the storage checks (400), then the watch cache waits
        # for a resourceVersion it has not reached (504 after the wait).
        flt = self._selectors(request, t)
        api = self.state.api
        opts = parse_list_options(request.query, watch_list=watch_list_enabled(api.cluster))
        requested = parse_list_resource_version(opts)
        if requested > api.store.rv and not await self._wait_fresh(requested):
            raise too_large_resource_version(requested, api.store.rv)
        result = api.list_objects(
            t.rt,
            t.namespace,
            flt.labels,
            flt.fields,
            opts.limit,
            opts.continue_token,
            resource_version=opts.resource_version,
            resource_version_match=opts.resource_version_match,
        )
        meta: dict[str, Any] = {"resourceVersion": result.resource_version}
        if result.continue_token:
            meta["continue"] = result.continue_token
        if result.remaining is not None:
            meta["remainingItemCount"] = result.remaining
        return json_response(
            {
                "kind": f"{t.rt.kind}List",
                "apiVersion": t.rt.api_version,
                "metadata": meta,
                "items": result.items,
            }
        )

    async def _wait_get_resource_version(self, value: str) -> None:
        # k8s.io/apiserver pkg/storage/cacher/delegator.go CacheDelegator.Get: a GET with a
        # resourceVersion is served by the watch cache, which first parses it
        # (api_object_versioner.go ParseResourceVersion: a storage InvalidError, which
        # registry/generic/registry/store.go Get passes on unchanged and
        # handlers/responsewriters/status.go ErrorToAPIStatus answers as a 500 without a
        # reason), then waits until it is fresh enough (watch_cache.go WaitUntilFreshAndGet,
        # 504 ResourceVersionTooLarge after the wait, as a list).
        if value in ("", "0"):
            return
        if not (value.isascii() and value.isdigit()) or int(value) >= 2**64:
            shown = json.dumps(value)
            problem = (
                "value out of range" if value.isascii() and value.isdigit() else "invalid syntax"
            )
            raise StatusError(
                500,
                "",
                f"resourceVersion: Invalid value: {shown}: "
                f"strconv.ParseUint: parsing {shown}: {problem}",
            )
        requested = int(value)
        if requested > self.state.api.store.rv and not await self._wait_fresh(requested):
            raise too_large_resource_version(requested, self.state.api.store.rv)

    async def _wait_fresh(self, rv: int) -> bool:
        """Wait up to the configured time for the store to reach ``rv``; True when it did
        (k8s.io/apiserver pkg/storage/cacher/watch_cache.go waitUntilFreshLocked)."""
        store = self.state.api.store
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.state.faults.fresh_wait_s
        while store.rv < rv:
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(0.01, left))
        return True

    async def _delete_collection(self, request: web.Request, t: Target) -> web.StreamResponse:
        flt = self._selectors(request, t)
        api = self.state.api
        options, dry_run = delete_options(await _json_body(request), _query_lists(request))
        result = api.list_objects(t.rt, t.namespace, flt.labels, flt.fields)
        for obj in result.items:
            meta = obj["metadata"]
            with contextlib.suppress(StatusError), self._warnings(request):
                api.delete(t.rt, meta.get("namespace", ""), meta["name"], options, dry_run=dry_run)
        return json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        )

    async def _bind(self, request: web.Request, t: Target) -> web.StreamResponse:
        node = _binding_node(await _json_body(request))
        if not node:
            raise StatusError(422, "Invalid", "Binding target.name: Required value")
        api = self.state.api
        pod = api.get(t.rt, t.namespace, t.name)
        current = (pod.get("spec") or {}).get("nodeName")
        if current:
            raise StatusError(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on pods/binding "
                f'"{t.name}": pod {t.name} is already assigned '
                f'to node "{current}"',
            )
        pod.setdefault("spec", {})["nodeName"] = node
        api.update(t.rt, t.namespace, t.name, pod, manager=_manager(request))
        return json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
            201,
        )

    async def _watch(self, request: web.Request, t: Target) -> web.StreamResponse:
        # k8s.io/apiserver pkg/endpoints/handlers/get.go (options, 400/422) and
        # pkg/storage/cacher/cacher.go Watch: once the options are valid, every failure
        # (410 too old, 504 too large) is an ERROR event in a 200 stream.
        flt = self._selectors(request, t)
        api = self.state.api
        store = api.store
        opts = parse_list_options(request.query, watch_list=watch_list_enabled(api.cluster))
        rv = parse_watch_resource_version(opts, t.rt.plural, t.rt.group)
        timeout = float(_int_param(request, "timeoutSeconds") or DEFAULT_WATCH_TIMEOUT_S)
        bookmarks = _flag(request.query.get("allowWatchBookmarks"))
        send_initial = opts.send_initial_events
        error: StatusError | None = None
        if send_initial and rv > store.rv and not await self._wait_fresh(rv):
            # waitUntilWatchCacheFreshAndForceAllEvents: only a watch asking for initial
            # events waits; any other watch from a future version just starts there.
            error = too_large_resource_version(rv, store.rv)
        # Snapshot and registration happen without an await in between, so no event is lost
        # or doubled between the initial state and the live stream.
        lines: list[dict[str, Any]] = []
        since = rv
        if error is None:
            if send_initial or (send_initial is None and rv == 0):
                # k8s.io/apiserver pkg/storage/cacher/watch_cache.go getAllEventsSinceLocked:
                # the current state as ADDED (sendInitialEvents, or the legacy "0").
                for _, obj in store.items(t.rt.group_resource):
                    shown = flt.matches(obj)
                    if shown is not None:
                        lines.append({"type": "ADDED", "object": shown})
                if send_initial and bookmarks:
                    lines.append(self._bookmark(t.rt, initial_end=True))
                since = store.rv
            elif rv == 0:
                since = store.rv  # sendInitialEvents=false from "0": from now on
            else:
                events = store.watch_events_since(t.rt.group_resource, rv)
                if events is None:
                    error = watch_too_old(rv, store.history(t.rt.group_resource).oldest_watch_rv)
                else:
                    for event in events:
                        line = flt.render(event)
                        if line is not None:
                            lines.append(line)
        floor = max(since, rv)
        # The cache watcher skips events up to the version it started from (a watch from a
        # future version sees nothing before it).
        watcher = Watcher(t.rt.group_resource, accepts=lambda event: event.rv > floor)
        if error is None:
            store.watchers.add(watcher)
            self.state.watchers.add(watcher)
        response = web.StreamResponse(
            status=200,
            headers={"Content-Type": "application/json", "Cache-Control": "no-cache, private"},
        )
        try:
            await response.prepare(request)
            if error is not None:
                await self._send(response, {"type": "ERROR", "object": error.body()})
                await _end(response)
                return response
            for line in lines:
                await self._send(response, line)
            await self._stream(request, response, t, flt, watcher, timeout, bookmarks)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass  # the client went away mid-stream: nothing is left to tell it
        finally:
            store.watchers.discard(watcher)
            self.state.watchers.discard(watcher)
        return response

    async def _stream(
        self,
        request: web.Request,
        response: web.StreamResponse,
        t: Target,
        flt: WatchFilter,
        watcher: Watcher,
        duration_s: float,
        bookmarks: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration_s
        next_bookmark = loop.time() + self.state.bookmark_interval_s
        # An item that ends the stream, taken from the queue behind events being sent.
        carried: list[WatchItem] = []
        while True:
            now = loop.time()
            # Wake at least every second to notice a client that went away, so that its
            # handler does not linger until the watch timeout.
            wake = min(deadline, next_bookmark if bookmarks else deadline, now + 1.0)
            try:
                if carried:
                    item = carried.pop()
                else:
                    # asyncio.timeout, not wait_for: no task per event.
                    async with asyncio.timeout(max(0.0, wake - now)):
                        item = await watcher.queue.get()
            except TimeoutError:
                if request.transport is None or request.transport.is_closing():
                    return
                if loop.time() >= deadline:
                    if bookmarks:
                        await self._send(response, self._bookmark(t.rt))
                    await _end(response)
                    return
                if bookmarks and loop.time() >= next_bookmark:
                    await self._send(response, self._bookmark(t.rt))
                    next_bookmark = loop.time() + self.state.bookmark_interval_s
                continue
            if item is None:
                if watcher.abort and request.transport is not None:
                    # Cut the connection mid-stream, as a dying API server or proxy does.
                    request.transport.abort()
                    return
                await _end(response)
                return
            if isinstance(item, WatchExpired):
                await self._send(
                    response,
                    {"type": "ERROR", "object": StatusError(410, "Expired", item.message).body()},
                )
                await _end(response)
                return
            # The events queued meanwhile go out in one write (one chunk, one system call),
            # up to the first that ends the stream.
            lines = []
            event: WatchItem = item
            while isinstance(event, StoreEvent):
                line = flt.render(event)
                if line is not None:
                    lines.append(line)
                if watcher.queue.empty():
                    break
                event = watcher.queue.get_nowait()
                if not isinstance(event, StoreEvent):
                    carried.append(event)
            if lines:
                await self._send_all(response, lines)

    def _bookmark(self, rt: ResourceType, initial_end: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(self.state.api.store.rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {
            "type": "BOOKMARK",
            "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta},
        }

    @classmethod
    async def _send(cls, response: web.StreamResponse, line: dict[str, Any]) -> None:
        await cls._send_all(response, [line])

    @staticmethod
    async def _send_all(response: web.StreamResponse, lines: list[dict[str, Any]]) -> None:
        await response.write(b"".join(encode_json(line) + b"\n" for line in lines))


PUBLIC_INFO_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/version", "/version/"})


def _bearer_token(header: str) -> str | None:
    # k8s.io/apiserver pkg/authentication/request/bearertoken/bearertoken.go
    # AuthenticateRequest: the scheme is compared case-insensitively, the token is the second
    # space-separated part; anything else carries no bearer token.
    parts = header.strip().split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]


def _authorize(state: ServerState, request: web.Request, path: str) -> None:
    """Raise 401 or 403 unless the request's bearer token may make this request."""
    # A token from ``tokens`` names a restricted user checked against the RBAC policy;
    # the admin token (or, without one, a request carrying no token) is unrestricted,
    # like a test harness holding cluster-admin. Once any bearer token is configured, a
    # token nobody issued is refused with 401, as kube-apiserver's bearer token
    # authenticator refuses it (k8s.io/apiserver pkg/authentication/request/bearertoken:
    # an unrecognised token is an error, never anonymous access).
    bearer = _bearer_token(request.headers.get("Authorization", ""))
    if bearer is None:
        # Anonymous requests may read the public info paths (the
        # system:public-info-viewer ClusterRole bound to system:unauthenticated,
        # k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go).
        if state.token is not None and path not in PUBLIC_INFO_PATHS:
            raise unauthorized()
        return
    if state.token is not None and bearer == state.token:
        return
    user = state.tokens.get(bearer)
    if user is None:
        if state.token is not None or state.tokens:
            raise unauthorized()
        return
    if state.rbac is None:
        return
    attributes = request_attributes(request.method, path, request.query)
    if attributes is not None:
        state.rbac.check(user, attributes)


async def _with_faults(
    state: ServerState, request: web.Request, handler: Handler, path: str
) -> web.StreamResponse:
    """Run ``handler`` with the injected faults: latency, an error instead of the handler,
    a delayed answer, an answer held until the test releases it."""
    if state.faults.latency_s > 0:
        await asyncio.sleep(state.faults.latency_s)
    injected = state.faults.take(request.method, path)
    if injected is not None:
        raise injected
    response = await handler(request)
    delay = state.faults.take_delay(request.method, path)
    if delay > 0 and not response.prepared:
        # The request took effect (its watch event is already out); only its
        # answer is late, as behind a slow proxy or a client-side stall.
        await asyncio.sleep(delay)
    hold = state.faults.take_hold(request.method, path)
    if hold is not None and not response.prepared:
        hold.reached.set()
        await hold.released.wait()
    return response


async def _handle(
    state: ServerState, request: web.Request, handler: Handler, path: str
) -> web.StreamResponse:
    """Authorize and run the request, its errors answered as Kubernetes Status objects."""
    try:
        if not path.startswith("/_emulator/"):
            _authorize(state, request, path)
        return await _with_faults(state, request, handler, path)
    except StatusError as err:
        return status_response(err)
    except ClientGone:
        # The client went away mid-body: no answer reaches it, and nothing is logged.
        return web.Response(status=400)
    except web.HTTPException as err:
        if err.status == 404:
            return status_response(
                StatusError(404, "NotFound", "the server could not find the requested resource")
            )
        if err.status == 405:
            return status_response(
                method_not_allowed(f"method {request.method} is not allowed on {path}")
            )
        raise


def make_middleware(state: ServerState) -> Any:
    """Authentication, latency, injected faults, error mapping and the request log."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.rel_url.path
        query = request.rel_url.raw_query_string
        content_type = request.headers.get("Content-Type", "")
        status = 500
        try:
            response = await _handle(state, request, handler, path)
            if not response.prepared:
                for header in warning_headers(request.get(WARNINGS_KEY, ())):
                    response.headers.add("Warning", header)
            status = response.status
            return response
        finally:
            if not path.startswith("/_emulator/"):
                state.faults.requests.append(
                    RequestRecord(request.method, path, status, content_type, query)
                )

    return middleware


def build_app(
    state: ServerState, extra_routes: list[web.RouteDef] | None = None
) -> web.Application:
    """The aiohttp application for ``state`` (plus optional control routes)."""
    handlers = Handlers(state)
    app = web.Application(middlewares=[make_middleware(state)], client_max_size=16 * 1024**2)
    app.add_routes(
        [
            # The resource routes first: aiohttp tries the routes that share a path prefix
            # ("/apis", "/api/v1") in the order they were added, and nearly every request is
            # for a resource. A non-empty tail never matches a discovery path below.
            web.route("*", "/api/v1/{tail:.+}", handlers.core_resource),
            web.route("*", "/apis/{group}/{version}/{tail:.+}", handlers.group_resource),
            web.get("/version", handlers.version),
            web.get("/version/", handlers.version),
            web.get("/healthz", handlers.healthz),
            web.get("/livez", handlers.healthz),
            web.get("/readyz", handlers.healthz),
            web.get("/api", handlers.core_versions),
            web.get("/api/", handlers.core_versions),
            web.get("/api/v1", handlers.core_resources),
            web.get("/api/v1/", handlers.core_resources),
            web.get("/apis", handlers.groups),
            web.get("/apis/", handlers.groups),
            web.get("/apis/{group}", handlers.group),
            web.get("/apis/{group}/", handlers.group),
            web.get("/apis/{group}/{version}", handlers.group_version),
            web.get("/apis/{group}/{version}/", handlers.group_version),
            *(extra_routes or []),
        ]
    )
    return app


async def _end(response: web.StreamResponse) -> None:
    """Finish a watch stream; a client that already went away is no error."""
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
        await response.write_eof()
