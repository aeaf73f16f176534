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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from .errors import StatusError, bad_request, method_not_allowed, unauthorized
from .faults import Faults, RequestRecord
from .listing import WatchFilter
from .operations import Api
from .rbac import RbacPolicy, request_attributes
from .resources import (
    ResourceType,
    api_group,
    api_group_list,
    api_resource_list,
    api_versions,
)
from .selectors import parse_field_selector, parse_label_selector
from .store import Watcher

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


def json_response(body: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response with kube-apiserver's content type."""
    return web.Response(text=json.dumps(body), status=status, content_type="application/json",
                        headers=headers)


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
                raise StatusError(404, "NotFound", "the server could not find the requested "
                                                   "resource")
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
    raw = await request.read()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError as err:
        raise bad_request(f"couldn't get version/kind; json parse error: {err}") from err


def _flag(value: str | None) -> bool:
    # The Python client sends booleans as "True"/"False"; Go clients send "true".
    return (value or "").lower() in ("true", "1")


def _int_param(request: web.Request, name: str) -> int:
    value = request.query.get(name, "")
    if not value:
        return 0
    try:
        return int(value)
    except ValueError as err:
        raise bad_request(f"invalid value for {name}: {value!r}") from err


class Handlers:
    """The request handlers bound to one :class:`ServerState`."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    # -- discovery --------------------------------------------------------------------------
    async def version(self, _request: web.Request) -> web.StreamResponse:
        """``GET /version``."""
        parts = self.state.git_version.lstrip("v").split(".")
        return json_response({
            "major": parts[0], "minor": parts[1] if len(parts) > 1 else "0",
            "gitVersion": self.state.git_version, "gitCommit": "0" * 40,
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"})

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
            raise StatusError(404, "NotFound", "the server could not find the requested "
                                               "resource")
        return json_response(doc)

    async def group_version(self, request: web.Request) -> web.StreamResponse:
        """``GET /apis/<group>/<version>``."""
        doc = api_resource_list(self.state.api.types, request.match_info["group"],
                                request.match_info["version"])
        if doc is None:
            raise StatusError(404, "NotFound", "the server could not find the requested "
                                               "resource")
        return json_response(doc)

    # -- resources --------------------------------------------------------------------------
    async def core_resource(self, request: web.Request) -> web.StreamResponse:
        """Everything under ``/api/v1/``."""
        target = parse_target(self.state.api, "", "v1", request.match_info["tail"])
        return await self._dispatch(request, target)

    async def group_resource(self, request: web.Request) -> web.StreamResponse:
        """Everything under ``/apis/<group>/<version>/``."""
        target = parse_target(self.state.api, request.match_info["group"],
                              request.match_info["version"], request.match_info["tail"])
        return await self._dispatch(request, target)

    async def _dispatch(self, request: web.Request, t: Target) -> web.StreamResponse:
        api = self.state.api
        method = request.method
        query = request.query
        dry_run = query.get("dryRun") == "All"
        if t.rt.namespaced and not t.namespace and (method != "GET" or t.name):
            raise StatusError(404, "NotFound", "the server could not find the requested "
                                               "resource")
        if t.subresource == "binding":
            if method != "POST":
                raise method_not_allowed(f'the server does not allow this method on the '
                                         f'requested resource ({method} pods/binding)')
            return await self._bind(request, t)
        if method == "GET":
            if t.name:
                return json_response(api.get(t.rt, t.namespace, t.name))
            if _flag(query.get("watch")):
                return await self._watch(request, t)
            return self._list(request, t)
        if method == "POST":
            if t.name:
                raise method_not_allowed(f"the server does not allow this method on the "
                                         f"requested resource (POST {t.rt.plural}/{t.name})")
            body = await _json_body(request)
            new_obj = api.create(t.rt, t.namespace, body,
                                 manager=query.get("fieldManager") or _manager(request),
                                 dry_run=dry_run)
            return json_response(new_obj, 201)
        if not t.name:
            if method == "DELETE":
                return await self._delete_collection(request, t)
            raise method_not_allowed(f"the server does not allow this method on the requested "
                                     f"resource ({method} {t.rt.plural})")
        if method == "PUT":
            body = await _json_body(request)
            return json_response(api.update(
                t.rt, t.namespace, t.name, body, subresource=t.subresource,
                manager=query.get("fieldManager") or _manager(request), dry_run=dry_run))
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            obj, created = api.patch(
                t.rt, t.namespace, t.name, content_type, await request.read(),
                subresource=t.subresource, manager=_manager(request),
                field_manager=query.get("fieldManager", ""),
                force=_flag(query.get("force")), dry_run=dry_run)
            return json_response(obj, 201 if created else 200)
        if method == "DELETE":
            if t.subresource:
                raise method_not_allowed("the server does not allow this method on the "
                                         "requested resource")
            options = await _json_body(request)
            if options is not None and not isinstance(options, dict):
                raise bad_request("DeleteOptions must be a JSON object")
            gone, deleted = api.delete(t.rt, t.namespace, t.name, options, dry_run=dry_run)
            if deleted and not t.rt.returns_deleted_object:
                details: dict[str, Any] = {"name": t.name, "kind": t.rt.plural,
                                           "uid": gone["metadata"]["uid"]}
                if t.rt.group:
                    details["group"] = t.rt.group
                return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                      "status": "Success", "details": details})
            return json_response(gone, 200 if deleted else 202)
        raise method_not_allowed(f"the server does not allow this method on the requested "
                                 f"resource ({method})")

    def _selectors(self, request: web.Request, t: Target) -> WatchFilter:
        labels = parse_label_selector(request.query.get("labelSelector", ""))
        fields = parse_field_selector(request.query.get("fieldSelector", ""), t.rt.selectable)
        return WatchFilter(t.rt, t.namespace, labels, fields)

    def _list(self, request: web.Request, t: Target) -> web.StreamResponse:
        flt = self._selectors(request, t)
        result = self.state.api.list_objects(
            t.rt, t.namespace, flt.labels, flt.fields, _int_param(request, "limit"),
            request.query.get("continue", ""))
        meta: dict[str, Any] = {"resourceVersion": result.resource_version}
        if result.continue_token:
            meta["continue"] = result.continue_token
        if result.remaining is not None:
            meta["remainingItemCount"] = result.remaining
        return json_response({"kind": f"{t.rt.kind}List", "apiVersion": t.rt.api_version,
                              "metadata": meta, "items": result.items})

    async def _delete_collection(self, request: web.Request, t: Target) -> web.StreamResponse:
        flt = self._selectors(request, t)
        api = self.state.api
        result = api.list_objects(t.rt, t.namespace, flt.labels, flt.fields)
        for obj in result.items:
            meta = obj["metadata"]
            with contextlib.suppress(StatusError):
                api.delete(t.rt, meta.get("namespace", ""), meta["name"],
                           dry_run=request.query.get("dryRun") == "All")
        return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success"})

    async def _bind(self, request: web.Request, t: Target) -> web.StreamResponse:
        body = await _json_body(request)
        node = ((body or {}).get("target") or {}).get("name") if isinstance(body, dict) else ""
        if not node:
            raise StatusError(422, "Invalid", "Binding target.name: Required value")
        api = self.state.api
        pod = api.get(t.rt, t.namespace, t.name)
        current = (pod.get("spec") or {}).get("nodeName")
        if current:
            raise StatusError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding '
                                               f'"{t.name}": pod {t.name} is already assigned '
                                               f'to node "{current}"')
        pod.setdefault("spec", {})["nodeName"] = node
        api.update(t.rt, t.namespace, t.name, pod, manager=_manager(request))
        return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success", "code": 201}, 201)

    async def _watch(self, request: web.Request, t: Target) -> web.StreamResponse:
        flt = self._selectors(request, t)
        store = self.state.api.store
        rv_param = request.query.get("resourceVersion", "")
        timeout = float(_int_param(request, "timeoutSeconds") or DEFAULT_WATCH_TIMEOUT_S)
        bookmarks = _flag(request.query.get("allowWatchBookmarks"))
        send_initial = _flag(request.query.get("sendInitialEvents"))
        # Snapshot and registration happen without an await in between, so no event is lost
        # or doubled between the initial state and the live stream.
        lines: list[dict[str, Any]] = []
        gone = False
        if rv_param in ("", "0") or send_initial:
            for _, obj in store.items(t.rt.group_resource):
                shown = flt.matches(obj)
                if shown is not None:
                    lines.append({"type": "ADDED", "object": shown})
            if send_initial and bookmarks:
                lines.append(self._bookmark(t.rt, initial_end=True))
        else:
            try:
                since = int(rv_param)
            except ValueError as err:
                raise bad_request(f"invalid resource version: {rv_param!r}") from err
            events = store.events_since(t.rt.group_resource, since)
            if events is None:
                gone = True
            else:
                for event in events:
                    line = flt.render(event)
                    if line is not None:
                        lines.append(line)
        watcher = Watcher(t.rt.group_resource, accepts=lambda _event: True)
        if not gone:
            store.watchers.add(watcher)
            self.state.watchers.add(watcher)
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "application/json", "Cache-Control": "no-cache, private"})
        try:
            await response.prepare(request)
            if gone:
                await self._send(response, {"type": "ERROR", "object": StatusError(
                    410, "Expired", f"too old resource version: {rv_param} "
                                    f"({store.compacted_rv})").body()})
                await response.write_eof()
                return response
            for line in lines:
                await self._send(response, line)
            await self._stream(request, response, t, flt, watcher, timeout, bookmarks)
        finally:
            store.watchers.discard(watcher)
            self.state.watchers.discard(watcher)
        return response

    async def _stream(self, request: web.Request, response: web.StreamResponse, t: Target,
                      flt: WatchFilter, watcher: Watcher, duration_s: float,
                      bookmarks: bool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration_s
        next_bookmark = loop.time() + self.state.bookmark_interval_s
        while True:
            now = loop.time()
            # Wake at least every second to notice a client that went away, so that its
            # handler does not linger until the watch timeout.
            wake = min(deadline, next_bookmark if bookmarks else deadline, now + 1.0)
            try:
                event = await asyncio.wait_for(watcher.queue.get(), max(0.0, wake - now))
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
            if event is None:
                if watcher.abort and request.transport is not None:
                    # Cut the connection mid-stream, as a dying API server or proxy does.
                    request.transport.abort()
                    return
                await _end(response)
                return
            line = flt.render(event)
            if line is not None:
                await self._send(response, line)

    def _bookmark(self, rt: ResourceType, initial_end: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(self.state.api.store.rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version,
                                               "metadata": meta}}

    @staticmethod
    async def _send(response: web.StreamResponse, line: dict[str, Any]) -> None:
        await response.write(json.dumps(line).encode() + b"\n")


def make_middleware(state: ServerState) -> Any:
    """Authentication, latency, injected faults, error mapping and the request log."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.rel_url.path
        content_type = request.headers.get("Content-Type", "")
        status = 500
        try:
            response = await _handle(request, handler, path)
            status = response.status
            return response
        finally:
            if not path.startswith("/_emulator/"):
                state.faults.requests.append(RequestRecord(request.method, path, status,
                                                           content_type))

    async def _handle(request: web.Request, handler: Handler, path: str) -> web.StreamResponse:
        try:
            if not path.startswith("/_emulator/"):
                _authorize(request, path)
            if state.faults.latency_s > 0:
                await asyncio.sleep(state.faults.latency_s)
            injected = state.faults.take(request.method, path)
            if injected is not None:
                raise injected
            return await handler(request)
        except StatusError as err:
            return status_response(err)
        except web.HTTPException as err:
            if err.status == 404:
                return status_response(StatusError(
                    404, "NotFound", "the server could not find the requested resource"))
            if err.status == 405:
                return status_response(method_not_allowed(f"method {request.method} is not "
                                                          f"allowed on {path}"))
            raise

    def _authorize(request: web.Request, path: str) -> None:
        # A token from ``tokens`` names a restricted user checked against the RBAC policy;
        # the admin token (or, without one, any request) is unrestricted, like a test
        # harness holding cluster-admin.
        header = request.headers.get("Authorization", "")
        bearer = header.removeprefix("Bearer ") if header.startswith("Bearer ") else None
        user = state.tokens.get(bearer) if bearer is not None else None
        if user is None:
            if state.token is not None and bearer != state.token:
                raise unauthorized()
            return
        if state.rbac is None:
            return
        attributes = request_attributes(request.method, path, request.query)
        if attributes is not None:
            state.rbac.check(user, attributes)

    return middleware


def build_app(state: ServerState, extra_routes: list[web.RouteDef] | None = None
              ) -> web.Application:
    """The aiohttp application for ``state`` (plus optional control routes)."""
    handlers = Handlers(state)
    app = web.Application(middlewares=[make_middleware(state)], client_max_size=16 * 1024**2)
    app.add_routes([
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
        web.route("*", "/api/v1/{tail:.+}", handlers.core_resource),
        web.route("*", "/apis/{group}/{version}/{tail:.+}", handlers.group_resource),
        *(extra_routes or []),
    ])
    return app


async def _end(response: web.StreamResponse) -> None:
    """Finish a watch stream; a client that already went away is no error."""
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
        await response.write_eof()
