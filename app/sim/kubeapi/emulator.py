"""``KubeEmulator``: the Kubernetes API emulator as a Python object tests start and steer."""

from __future__ import annotations

import builtins
import copy
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from .context import (
    DRA_ADMIN_ACCESS,
    DRA_CONSUMABLE_CAPACITY,
    DRA_DEVICE_BINDING_CONDITIONS,
    DRA_DEVICE_TAINTS,
    DRA_PARTITIONABLE_DEVICES,
    DRA_PRIORITIZED_LIST,
    DRA_RESOURCE_CLAIM_DEVICE_STATUS,
    Cluster,
)
from .errors import StatusError
from .faults import Faults, RequestRecord
from .http import ServerState, build_app, json_response
from .operations import Api
from .rbac import RbacPolicy
from .resources import served_types
from .store import Store

ALL_GATES = (DRA_ADMIN_ACCESS, DRA_CONSUMABLE_CAPACITY, DRA_DEVICE_BINDING_CONDITIONS,
             DRA_DEVICE_TAINTS, DRA_PARTITIONABLE_DEVICES, DRA_PRIORITIZED_LIST,
             DRA_RESOURCE_CLAIM_DEVICE_STATUS)


class KubeEmulator:
    """A kube-apiserver stand-in over plain HTTP for the real kubernetes-asyncio client.

    ``served_resource_versions``: resource.k8s.io versions served (any of v1, v1beta2,
    v1beta1, v1alpha3; the first is preferred); ``history_size``: watch events retained
    (older resourceVersions get 410 Expired); ``validate``: schema and Go-rule validation on
    every write; ``token``: require ``Authorization: Bearer <token>`` (401 otherwise);
    ``git_version``: reported by ``/version``; ``bookmark_interval_s``: BOOKMARK period on
    watches that allow them; ``tokens``: bearer tokens of restricted users (``{token: user}``,
    e.g. ``system:serviceaccount:fabric-dra:fabric-dra``), whose requests ``rbac`` (an
    :class:`RbacPolicy`) must allow (403 Forbidden otherwise) while the admin ``token`` (or any
    request, without one) stays unrestricted. Raises ValueError for an unknown resource
    version.
    """

    def __init__(self, *, served_resource_versions: Sequence[str] = ("v1",),
                 history_size: int = 1000, validate: bool = True, token: str | None = None,
                 git_version: str = "v1.34.0", bookmark_interval_s: float = 5.0,
                 tokens: Mapping[str, str] | None = None,
                 rbac: RbacPolicy | None = None) -> None:
        if not served_resource_versions:
            raise ValueError("serve at least one resource.k8s.io version")
        self._types = served_types(served_resource_versions)
        self._history_size = history_size
        self._validate = validate
        self._faults = Faults()
        # Until the cluster profiles are in place: Kubernetes 1.34 with every DRA gate on.
        self._api = Api(Store(history_size), self._types, validate=validate,
                        cluster=Cluster(34, frozenset(ALL_GATES)))
        self._rbac = rbac
        self._ensure_namespaces()
        self._state = ServerState(self._api, self._faults, git_version, token,
                                  bookmark_interval_s, tokens=dict(tokens or {}), rbac=rbac)
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
        self.url = f"http://{host}:{self._port}"
        return self.url

    async def stop(self) -> None:
        """End every watch cleanly and stop serving (the store is kept)."""
        self._end_watches(abort=False)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def restart(self, *, keep_store: bool = True) -> None:
        """Stop and serve again on the same port. Without ``keep_store`` every object and
        the history are lost (default namespaces come back) while resourceVersions keep
        growing, so watchers resuming from an old version get 410 and must relist.
        """
        await self.stop()
        if not keep_store:
            self._api.store.clear()
            self._ensure_namespaces()
        await self.start(self._host, self._port)

    def _ensure_namespaces(self) -> None:
        self._api.ensure_default_namespaces()
        # A namespaced Role implies its namespace exists, as it would in a real cluster.
        for namespace in self._rbac.namespaces if self._rbac is not None else ():
            if self.get("v1", "Namespace", namespace) is None:
                self.create({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": namespace}})

    # -- observation and faults -------------------------------------------------------------
    @property
    def requests(self) -> list[RequestRecord]:
        """Every request served so far, in order."""
        return self._faults.requests

    def writes(self, path_contains: str = "") -> list[RequestRecord]:
        """The non-GET requests whose path contains ``path_contains``."""
        return [r for r in self._faults.requests
                if r.method not in ("GET", "HEAD") and path_contains in r.path]

    def fail_next(self, n: int, *, method: str = "*", path_regex: str = ".*",
                  status: int = 500, retry_after: int | None = None) -> None:
        """Fail the next ``n`` matching requests with a Status body of HTTP ``status``; a
        ``retry_after`` (seconds) adds the Retry-After header. Raises ValueError for n < 1.
        """
        self._faults.fail_next(n, method=method, path_regex=path_regex, status=status,
                               retry_after=retry_after)

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
        namespace = (obj.get("metadata") or {}).get("namespace") or (
            "default" if rt.namespaced else "")
        return self._api.create(rt, namespace, obj, manager="emulator")

    def get(self, api_version: str, kind: str, name: str,
            namespace: str | None = None) -> dict[str, Any] | None:
        """A copy of the object, or None."""
        rt = self._api.type_of(api_version, kind)
        try:
            return self._api.get(rt, namespace or "", name)
        except StatusError as err:
            if err.code == 404:
                return None
            raise

    def list(self, api_version: str, kind: str,
             namespace: str | None = None) -> builtins.list[dict[str, Any]]:
        """Copies of all objects of that kind (in ``namespace`` when given)."""
        rt = self._api.type_of(api_version, kind)
        return self._api.list_objects(rt, namespace or "", [], []).items

    def update_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Write ``obj``'s status through the status subresource rules (a resourceVersion in
        ``obj`` is a precondition). Raises StatusError.
        """
        rt = self._api.type_of(obj.get("apiVersion", ""), obj.get("kind", ""))
        meta = obj.get("metadata") or {}
        return self._api.update(rt, meta.get("namespace") or "", meta.get("name", ""),
                                copy.deepcopy(obj),
                                subresource="status" if rt.has_status else "",
                                manager="emulator")

    def update(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace ``obj`` through the main endpoint rules (like a PUT). Raises StatusError."""
        rt = self._api.type_of(obj.get("apiVersion", ""), obj.get("kind", ""))
        meta = obj.get("metadata") or {}
        return self._api.update(rt, meta.get("namespace") or "", meta.get("name", ""),
                                copy.deepcopy(obj), manager="emulator")

    def delete(self, api_version: str, kind: str, name: str,
               namespace: str | None = None) -> None:
        """Delete like a DELETE without options (finalizers keep the object, marked for
        deletion). Raises StatusError 404 when there is no such object.
        """
        rt = self._api.type_of(api_version, kind)
        self._api.delete(rt, namespace or "", name)

    # -- HTTP control endpoints -------------------------------------------------------------
    def _control_routes(self) -> builtins.list[web.RouteDef]:
        async def fail_next(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            self.fail_next(int(body.get("n", 1)), method=body.get("method", "*"),
                           path_regex=body.get("path_regex", ".*"),
                           status=int(body.get("status", 500)),
                           retry_after=body.get("retry_after"))
            return json_response({"ok": True})

        async def compact(_request: web.Request) -> web.StreamResponse:
            self.compact()
            return json_response({"resourceVersion": str(self._api.store.rv)})

        async def close_watches(_request: web.Request) -> web.StreamResponse:
            await self.close_watches()
            return json_response({"ok": True})

        async def requests(_request: web.Request) -> web.StreamResponse:
            return json_response([r.__dict__ for r in self.requests])

        return [web.post("/_emulator/fail_next", fail_next),
                web.post("/_emulator/compact", compact),
                web.post("/_emulator/close_watches", close_watches),
                web.get("/_emulator/requests", requests)]
