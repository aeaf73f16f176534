"""``KubeEmulator``: the Kubernetes API emulator as a Python object tests start and steer."""

from __future__ import annotations

import builtins
import re
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from app.jsontypes import json_copy

from .cluster import (
    DEFAULT_KUBERNETES_VERSION,
    build_cluster,
    parse_version,
    profile,
    resolve_served,
)
from .cluster import git_version as full_git_version
from .errors import StatusError, bad_request
from .faults import Faults, RequestRecord, ResponseHold
from .http import ServerState, build_app, json_response
from .operations import Api
from .rbac import RbacPolicy
from .resources import served_types
from .store import EventDrop, Store


class KubeEmulator:
    """A kube-apiserver stand-in over plain HTTP for the real kubernetes-asyncio client.

    ``kubernetes_version``: the emulated release, "1.34", "v1.34" or "v1.34.2" (1.31 and
    1.34 to 1.37, see :mod:`.cluster`; ``/version`` reports it); ``feature_gates``: gate
    overrides on top of that release's defaults (``{"DRADeviceTaints": True}``);
    ``served_resource_versions``: resource.k8s.io versions served (first = preferred; None =
    the release's default, e.g. v1 only for 1.34); ``history_size``: watch events retained
    (older resourceVersions get 410 Expired); ``validate``: schema and Go-rule validation on
    every write; ``token``: require ``Authorization: Bearer <token>`` (401 otherwise);
    ``git_version``: older name of ``kubernetes_version``; ``bookmark_interval_s``: BOOKMARK
    period on watches that allow them; ``tokens``: bearer tokens of restricted users
    (``{token: user}``, e.g. ``system:serviceaccount:fabric-dra:fabric-dra``), whose
    requests ``rbac`` (an :class:`RbacPolicy`) must allow (403 Forbidden otherwise) while
    the admin ``token`` (or any request, without one) stays unrestricted.

    Raises ValueError (one line) for an unsupported Kubernetes version, an unknown or locked
    feature gate, or resource versions that release cannot serve (e.g. v1 with v1alpha3,
    which no release serves together).
    """

    def __init__(
        self,
        *,
        kubernetes_version: str | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        served_resource_versions: Sequence[str] | None = None,
        history_size: int = 1000,
        validate: bool = True,
        token: str | None = None,
        git_version: str | None = None,
        bookmark_interval_s: float = 5.0,
        tokens: Mapping[str, str] | None = None,
        rbac: RbacPolicy | None = None,
    ) -> None:
        if (
            git_version is not None
            and kubernetes_version is not None
            and parse_version(git_version) != parse_version(kubernetes_version)
        ):
            raise ValueError(
                f"git_version {git_version!r} contradicts kubernetes_version {kubernetes_version!r}"
            )
        version = kubernetes_version or git_version or DEFAULT_KUBERNETES_VERSION
        self.cluster = build_cluster(version, feature_gates)
        self.served_resource_versions = resolve_served(profile(version), served_resource_versions)
        self._types = served_types(self.served_resource_versions)
        self._history_size = history_size
        self._validate = validate
        self._faults = Faults()
        self._api = Api(Store(history_size), self._types, validate=validate, cluster=self.cluster)
        self._rbac = rbac
        self._ensure_namespaces()
        self._state = ServerState(
            self._api,
            self._faults,
            full_git_version(version),
            token,
            bookmark_interval_s,
            tokens=dict(tokens or {}),
            rbac=rbac,
        )
        self._runner: web.AppRunner | None = None
        self._host = "127.0.0.1"
        self._port = 0
        self.url = ""

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0 = a free port); returns the base URL. Raises
        RuntimeError when already started, OSError when the port is taken.
        """
        if self._runner is not None:
            raise RuntimeError("the emulator is already running")
        app = build_app(self._state, self._control_routes())
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._port = int(runner.addresses[0][1])
        self._host = host
        self._runner = runner
        # An IPv6 literal is bracketed in a URL (RFC 3986 section 3.2.2).
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self._port}"
        return self.url

    async def stop(self) -> None:
        """End every watch cleanly and stop serving (the store is kept)."""
        self._end_watches(abort=False)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def restart(self, *, keep_store: bool = True) -> None:
        """Stop and serve again on the same port. The watch cache starts again at the current
        resourceVersion, as a restarted kube-apiserver refills it from etcd
        (k8s.io/apiserver pkg/storage/cacher/cacher.go startCaching): watches from older
        versions get 410 and must relist, while continue tokens (served by etcd) still work.
        Without ``keep_store`` every object and the history are lost too (default namespaces
        come back) while resourceVersions keep growing.
        """
        await self.stop()
        if keep_store:
            self._api.store.restart_watch_cache()
        else:
            self._api.store.clear()
            self._ensure_namespaces()
        await self.start(self._host, self._port)

    def _ensure_namespaces(self) -> None:
        self._api.ensure_default_namespaces()
        # A namespaced Role implies its namespace exists, as it would in a real cluster.
        for namespace in self._rbac.namespaces if self._rbac is not None else ():
            if self.get("v1", "Namespace", namespace) is None:
                self.create(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
                )

    # -- observation and faults -------------------------------------------------------------
    @property
    def requests(self) -> list[RequestRecord]:
        """Every request served so far, in order."""
        return self._faults.requests

    def writes(self, path_contains: str = "") -> list[RequestRecord]:
        """The non-GET requests whose path contains ``path_contains``."""
        return [
            r
            for r in self._faults.requests
            if r.method not in ("GET", "HEAD") and path_contains in r.path
        ]

    def fail_next(
        self,
        n: int,
        *,
        method: str = "*",
        path_regex: str = ".*",
        status: int = 500,
        retry_after: int | None = None,
    ) -> None:
        """Fail the next ``n`` matching requests with a Status body of HTTP ``status``; a
        ``retry_after`` (seconds) adds the Retry-After header. Raises ValueError for n < 1.
        """
        self._faults.fail_next(
            n, method=method, path_regex=path_regex, status=status, retry_after=retry_after
        )

    @property
    def latency_s(self) -> float:
        """Seconds added before every request is handled."""
        return self._faults.latency_s

    @latency_s.setter
    def latency_s(self, value: float) -> None:
        self._faults.latency_s = value

    def _end_watches(self, *, abort: bool) -> None:
        for watcher in list(self._state.watchers):
            watcher.abort = abort
            watcher.queue.put_nowait(None)

    @property
    def open_watches(self) -> int:
        """How many watch streams are open right now."""
        return len(self._state.watchers)

    async def close_watches(self) -> None:
        """Cut every open watch connection abruptly (clients see a broken transfer)."""
        self._end_watches(abort=True)

    def compact(self) -> None:
        """Drop the event history: watches from any older resourceVersion get 410 Expired."""
        self._api.store.compact()

    def _group_resource(self, resource: str) -> tuple[str, str]:
        for rt in self._types:
            if resource in (rt.plural, f"{rt.plural}.{rt.group}"):
                return rt.group_resource
        raise ValueError(f"unknown resource {resource!r}")

    def delay_responses(
        self, seconds: float, *, method: str = "*", path_regex: str = ".*", n: int | None = None
    ) -> None:
        """Hold back the response of the next ``n`` (None: every) requests whose method and
        path match by ``seconds`` after they took effect, so a write's watch event reaches
        watchers before its answer reaches the writer. ``seconds`` 0 removes every delay.
        Raises ValueError for negative seconds or n < 1.
        """
        self._faults.delay_responses(seconds, method=method, path_regex=path_regex, n=n)

    def hold_response(self, *, method: str = "*", path_regex: str = ".*") -> ResponseHold:
        """Hold the answer of the next request whose method and path match (``re.search``),
        after it took effect (its watch events are out), until ``release()`` is called on the
        returned :class:`ResponseHold`; its ``reached`` event is set once the answer is held.
        Orders a race without timing. Raises re.error for a bad pattern.
        """
        return self._faults.hold_response(method=method, path_regex=path_regex)

    def drop_events(
        self, resource: str, event_type: str = "DELETED", *, name: str | None = None, n: int = 1
    ) -> None:
        """Keep the next ``n`` watch events of ``resource`` (a plural) of ``event_type``
        (ADDED, MODIFIED or DELETED; of the object ``name`` when given) from every live watch,
        as when an event is lost between the server and a client. The history keeps them, so
        a watch started later from an older resourceVersion still gets them. Raises
        ValueError for an unknown resource or type, or n < 1.
        """
        if n < 1:
            raise ValueError("n must be at least 1")
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            raise ValueError(f"unknown event type {event_type!r}")
        self._api.store.event_drops.append(
            EventDrop(n, self._group_resource(resource), event_type, name)
        )

    def replay_event(
        self,
        resource: str,
        name: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
    ) -> str:
        """Send an old watch event of one object again into every live watch of
        ``resource`` (a plural, e.g. "resourceslices"), as a misbehaving server or proxy
        might: the event that produced ``resource_version``, or by default the one before the
        object's latest. Returns the resourceVersion replayed. Raises ValueError for an
        unknown resource, LookupError when the history holds no such event.
        """
        gr = self._group_resource(resource)
        key = (namespace or "", name)
        events = [
            e
            for e in self._api.store.history(gr).events
            if (
                str((e.obj.get("metadata") or {}).get("namespace") or ""),
                str((e.obj.get("metadata") or {}).get("name") or ""),
            )
            == key
        ]
        if resource_version is not None:
            chosen = [e for e in events if str(e.rv) == str(resource_version)]
            if not chosen:
                raise LookupError(
                    f"{resource} {key}: no event at resourceVersion "
                    f"{resource_version} in the history"
                )
            event = chosen[0]
        elif len(events) >= 2:
            event = events[-2]
        else:
            raise LookupError(f"{resource} {key}: the history holds no older event")
        self._api.store.deliver(event)
        return str(event.rv)

    def expire_watches(self, resource: str | None = None) -> int:
        """End the live watches (of ``resource``, a plural, or all) with an ERROR event
        410 Expired, as when the history is compacted under a watch
        (k8s.io/apiserver pkg/storage/etcd3/errors.go interpretWatchError). Returns how many
        watches got it. Raises ValueError for an unknown resource.
        """
        gr = self._group_resource(resource) if resource else None
        return self._api.store.expire_watchers(gr)

    def set_history_size(self, resource: str, size: int) -> None:
        """Give ``resource`` (a plural) its own watch-cache window of ``size`` events (the
        others keep ``history_size``). Raises ValueError for an unknown resource or size < 1.
        """
        self._api.store.set_history_size(self._group_resource(resource), size)

    @property
    def resource_version(self) -> int:
        """The store's current resourceVersion (that of the last write)."""
        return self._api.store.rv

    @property
    def fresh_wait_s(self) -> float:
        """Seconds a list or watch for a resourceVersion not reached yet waits before 504
        Timeout "Too large resource version" (kube-apiserver: 3)."""
        return self._faults.fresh_wait_s

    @fresh_wait_s.setter
    def fresh_wait_s(self, value: float) -> None:
        if value < 0:
            raise ValueError("fresh_wait_s must not be negative")
        self._faults.fresh_wait_s = value

    def drop_fields(self, resource: str, paths: Sequence[str]) -> None:
        """Silently drop dotted ``paths`` (``[]`` = every list element) from objects of
        ``resource`` (a plural such as "resourceslices") on every write, as an API server with
        the feature gate off does. An empty ``paths`` stops dropping.
        """
        self._api.dropped[resource] = list(paths)

    # -- direct store access ------------------------------------------------------------------
    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj`` (by its apiVersion, kind and metadata.namespace), validated like a
        POST; returns the stored object. Raises StatusError.
        """
        rt = self._api.type_of(obj.get("apiVersion", ""), obj.get("kind", ""))
        meta = obj.get("metadata")
        namespace = (meta.get("namespace") if isinstance(meta, dict) else None) or (
            "default" if rt.namespaced else ""
        )
        return self._api.create(rt, namespace, obj, manager="emulator")

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """A copy of the object, or None."""
        rt = self._api.type_of(api_version, kind)
        try:
            return self._api.get(rt, namespace or "", name)
        except StatusError as err:
            if err.code == 404:
                return None
            raise

    def list(
        self, api_version: str, kind: str, namespace: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Copies of all objects of that kind (in ``namespace`` when given)."""
        rt = self._api.type_of(api_version, kind)
        return self._api.list_objects(rt, namespace or "", [], []).items

    def update_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Write ``obj``'s status through the status subresource rules (a resourceVersion in
        ``obj`` is a precondition). Raises StatusError.
        """
        rt = self._api.type_of(obj.get("apiVersion", ""), obj.get("kind", ""))
        meta = obj.get("metadata") or {}
        return self._api.update(
            rt,
            meta.get("namespace") or "",
            meta.get("name", ""),
            json_copy(obj),
            subresource="status" if rt.has_status else "",
            manager="emulator",
        )

    def update(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace ``obj`` through the main endpoint rules (like a PUT). Raises StatusError."""
        rt = self._api.type_of(obj.get("apiVersion", ""), obj.get("kind", ""))
        meta = obj.get("metadata") or {}
        return self._api.update(
            rt,
            meta.get("namespace") or "",
            meta.get("name", ""),
            json_copy(obj),
            manager="emulator",
        )

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        """Delete like a DELETE without options (finalizers keep the object, marked for
        deletion). Raises StatusError 404 when there is no such object.
        """
        rt = self._api.type_of(api_version, kind)
        self._api.delete(rt, namespace or "", name)

    # -- HTTP control endpoints -------------------------------------------------------------
    def _control_routes(self) -> builtins.list[web.RouteDef]:
        async def fail_next(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            self.fail_next(
                int(body.get("n", 1)),
                method=body.get("method", "*"),
                path_regex=body.get("path_regex", ".*"),
                status=int(body.get("status", 500)),
                retry_after=body.get("retry_after"),
            )
            return json_response({"ok": True})

        async def compact(_request: web.Request) -> web.StreamResponse:
            self.compact()
            return json_response({"resourceVersion": str(self._api.store.rv)})

        async def close_watches(_request: web.Request) -> web.StreamResponse:
            await self.close_watches()
            return json_response({"ok": True})

        async def requests(_request: web.Request) -> web.StreamResponse:
            return json_response([r.__dict__ for r in self.requests])

        async def control_body(request: web.Request) -> dict[str, Any]:
            try:
                body = await request.json() if request.can_read_body else {}
            except ValueError as err:
                raise bad_request(f"the body is not JSON: {err}") from err
            if not isinstance(body, dict):
                raise bad_request("the body must be a JSON object")
            return body

        async def delay_responses(request: web.Request) -> web.StreamResponse:
            body = await control_body(request)
            try:
                n = body.get("n")
                self.delay_responses(
                    float(body.get("seconds", 0)),
                    method=str(body.get("method", "*")),
                    path_regex=str(body.get("path_regex", ".*")),
                    n=None if n is None else int(n),
                )
            except (ValueError, TypeError, re.error) as err:
                raise bad_request(str(err)) from err
            return json_response({"ok": True})

        async def replay_event(request: web.Request) -> web.StreamResponse:
            body = await control_body(request)
            try:
                rv = body.get("resource_version")
                replayed = self.replay_event(
                    str(body["resource"]),
                    str(body["name"]),
                    body.get("namespace"),
                    resource_version=None if rv is None else str(rv),
                )
            except (KeyError, ValueError, LookupError) as err:
                raise bad_request(str(err)) from err
            return json_response({"resourceVersion": replayed})

        async def expire_watches(request: web.Request) -> web.StreamResponse:
            body = await control_body(request)
            try:
                count = self.expire_watches(body.get("resource"))
            except ValueError as err:
                raise bad_request(str(err)) from err
            return json_response({"expired": count})

        return [
            web.post("/_emulator/fail_next", fail_next),
            web.post("/_emulator/compact", compact),
            web.post("/_emulator/close_watches", close_watches),
            web.get("/_emulator/requests", requests),
            web.post("/_emulator/delay_responses", delay_responses),
            web.post("/_emulator/replay_event", replay_event),
            web.post("/_emulator/expire_watches", expire_watches),
        ]
