"""A list-and-watch informer over one typed list function, with a local cache.

Modelled on client-go's Reflector + DeltaFIFO + Indexer (``k8s.io/client-go/tools/cache``):

1. list (paginated with ``limit`` / ``continue``) and fill the cache keyed by (namespace, name);
2. watch from the list's resourceVersion with ``allowWatchBookmarks``, a server ``timeoutSeconds``
   (minutes, with jitter, as client-go's ``minWatchTimeout``) and a client read timeout a bit
   longer, so a half-open connection cannot hang the watch;
3. on 410 Gone / Expired (an error status or an ``ERROR`` watch event) re-list and diff the cache
   against the new list, emitting synthetic ADDED / MODIFIED / DELETED for what changed in the gap
   (client-go's ``Replace``: deletions missed in the gap become deletes of the last known state);
4. on a cut stream, a refused connection or a server error, reconnect from the last seen
   resourceVersion with capped exponential backoff and jitter, and re-list after repeated
   failures (a restarted server may have lost the history).

Events are de-duplicated against the cache: an object's resourceVersion is delivered at most once,
an ADDED for an object already cached is delivered as MODIFIED, and an event older than the
cached object (a replay from a misbehaving server or proxy) is dropped, so consumers see a
consistent stream that never goes back in time whatever the server replays. The watch resumes
from the newest resourceVersion seen, never an older one. Objects are plain JSON dicts as the
server sent them (the generated models would drop unknown fields), less
``metadata.managedFields``, optionally converted by ``converter`` (e.g.
``versions.slice_from_wire``) so consumers see the v1 shape. The managed fields are dropped as
controller-runtime's ``TransformStripManagedFields`` (pkg/cache) and kube-scheduler's informers
drop them: nothing here reads them, they are a large part of a written object, and a status
write built from a cached object has no use for them.

The loop runs as a supervised task: an unexpected crash is logged and the loop restarts with
backoff. ``is_healthy()`` turns False while the watch keeps failing, so readiness can report it.

The kubernetes-asyncio ``Watch`` helper is not used: it retries 410 with the same version, hides
reconnects and deserialises every event into a model; the raw stream is read here instead.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from app.aio import cancel_and_wait
from app.jsontypes import JsonDict, loads_json
from app.kube.errors import (
    KubeError,
    KubeGone,
    KubeInvalidResponse,
    error_from_status,
    translate_error,
)

logger = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
ObjectKey = tuple[str, str]
EventHandler = Callable[[EventType, JsonDict, JsonDict | None], Awaitable[None]]
Converter = Callable[[JsonDict], JsonDict]
ListFunction = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class InformerEvent:
    """One change delivered to a queue subscriber.

    Attributes:
        type: ADDED, MODIFIED or DELETED.
        obj: the object after the change (for DELETED: its last state).
        old: the cached object before the change; None for ADDED.
    """

    type: EventType
    obj: JsonDict
    old: JsonDict | None


@dataclass(frozen=True)
class InformerSettings:
    """Settings of one :class:`Informer`.

    Attributes:
        name: what is watched, for logs and errors (``"resourceslices"``).
        namespace: passed as the first argument of a namespaced list function; None for
            cluster-scoped or all-namespace list functions.
        label_selector / field_selector: passed to list and watch.
        page_size: ``limit`` of each list page (> 0).
        watch_timeout_s: server-side watch timeout base, seconds (>= 1); each watch asks for a
            random value in ``[base, base * (1 + watch_timeout_jitter)]`` so many informers do
            not reconnect at once (client-go: 5 to 10 minutes).
        watch_timeout_jitter: see above (>= 0).
        client_timeout_margin_s: the client's read timeout is the server timeout plus this; it
            only fires when the server went silent (> 0).
        list_timeout_s: total time allowed for one list page, seconds.
        connect_timeout_s: TCP connect timeout, seconds.
        backoff_initial_s / backoff_max_s: reconnect backoff: the step doubles from
            ``backoff_initial_s`` per failure in a row up to ``backoff_max_s``, and each
            wait is a random value in ``[step / 2, step]`` (equal jitter).
        relist_after_failures: re-list instead of resuming after this many failures in a row.
        unhealthy_after_failures: ``is_healthy()`` is False after this many failures in a row.
    """

    name: str
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    page_size: int = 500
    watch_timeout_s: float = 300.0
    watch_timeout_jitter: float = 1.0
    client_timeout_margin_s: float = 30.0
    list_timeout_s: float = 60.0
    connect_timeout_s: float = 10.0
    backoff_initial_s: float = 0.8
    backoff_max_s: float = 30.0
    relist_after_failures: int = 2
    unhealthy_after_failures: int = 3

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"informer {self.name}: page_size must be >= 1")
        if self.watch_timeout_s < 1:
            raise ValueError(f"informer {self.name}: watch_timeout_s must be >= 1")
        if self.watch_timeout_jitter < 0:
            raise ValueError(f"informer {self.name}: watch_timeout_jitter must be >= 0")
        if self.client_timeout_margin_s <= 0:
            raise ValueError(f"informer {self.name}: client_timeout_margin_s must be > 0")
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ValueError(f"informer {self.name}: need 0 < backoff_initial_s <= backoff_max_s")
        if self.relist_after_failures < 1 or self.unhealthy_after_failures < 1:
            raise ValueError(f"informer {self.name}: failure thresholds must be >= 1")


def object_key(obj: Mapping[str, Any]) -> ObjectKey:
    """The cache key of ``obj``: (namespace or "", name)."""
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))


def resource_version_of(obj: Mapping[str, Any]) -> str | None:
    """``metadata.resourceVersion`` of ``obj``, if any."""
    metadata = obj.get("metadata") or {}
    version = metadata.get("resourceVersion")
    return str(version) if version is not None else None


def _older(version: str | None, than: str | None) -> bool:
    """True when resourceVersion ``version`` is older than ``than``. They are compared as
    integers when both are (etcd revisions, as kube-apiserver hands them out); otherwise
    nothing is older, as client-go treats them as opaque."""
    if version is None or than is None:
        return False
    try:
        return int(version) < int(than)
    except ValueError:
        return False


def _uid(obj: Mapping[str, Any]) -> str | None:
    uid = (obj.get("metadata") or {}).get("uid")
    return str(uid) if uid else None


class _ShortWatch(KubeError):
    """A watch ended cleanly at once without a single line: treated as a failure so a server
    that keeps closing watches cannot drive a tight reconnect loop."""

    retryable = True


class Informer:
    """List and watch one resource; keep a cache; deliver changes to handlers and queues.

    Args:
        list_function: a typed list function, e.g. ``ResourceV1Api(api).list_resource_slice``
            or ``ResourceV1Api(api).list_namespaced_resource_claim`` (with
            ``settings.namespace``). It is called with ``_preload_content=False``.
        settings: see :class:`InformerSettings`.
        converter: applied to every object before it is cached and delivered (version shape).
            It receives a dict just decoded from the answer, which nothing else holds (and
            without ``metadata.managedFields``): it may convert it in place.
        rng: randomness for jitter (inject a seeded one in tests).
        sleep: async sleep used for backoff (inject a fake in tests).
        now: monotonic seconds, for timing watches.

    Use: register handlers (:meth:`add_handler`) or queues (:meth:`subscribe`), :meth:`start`,
    wait for ``has_synced``, read :meth:`get` / :meth:`objects` (or by uid: :meth:`by_uid`),
    and ``await stop()``.
    Handlers run one at a time in event order; a handler that raises is logged and skipped
    (the event is not redelivered). Queue subscribers receive :class:`InformerEvent`.
    """

    def __init__(
        self,
        list_function: ListFunction,
        settings: InformerSettings,
        *,
        converter: Converter | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._list_function = list_function
        self._converter = converter
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._now = now
        self._cache: dict[ObjectKey, JsonDict] = {}
        # uid -> cache key of the object that has it (client-go: an Indexer index by uid).
        self._by_uid: dict[str, ObjectKey] = {}
        self._handlers: list[EventHandler] = []
        self._queues: list[asyncio.Queue[InformerEvent]] = []
        self._resource_version: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._list_failures = 0
        self._watch_failures = 0
        self._gone_streak = 0
        self._running = False
        self.has_synced = asyncio.Event()
        self.last_error: BaseException | None = None
        self.last_error_at: float | None = None
        # Counters for metrics and tests.
        self.list_count = 0
        self.watch_count = 0
        self.gone_count = 0
        self.restart_count = 0
        self.handler_error_count = 0

    # ----------------------------------------------------------------- consumers
    def add_handler(self, handler: EventHandler) -> None:
        """Call ``await handler(event_type, obj, old_obj)`` for every change. Register before
        :meth:`start` so the initial list is seen too."""
        self._handlers.append(handler)

    def subscribe(self, maxsize: int = 0) -> asyncio.Queue[InformerEvent]:
        """Return a queue receiving every change as :class:`InformerEvent`. A bounded queue
        (``maxsize``) slows the informer down when the consumer falls behind."""
        queue: asyncio.Queue[InformerEvent] = asyncio.Queue(maxsize)
        self._queues.append(queue)
        return queue

    def get(self, name: str, namespace: str | None = None) -> JsonDict | None:
        """The cached object, or None. Do not modify it."""
        return self._cache.get((namespace or "", name))

    def objects(self) -> list[JsonDict]:
        """Every cached object (a new list of the cached dicts; do not modify them)."""
        return list(self._cache.values())

    def keys(self) -> list[ObjectKey]:
        """Every cached (namespace, name)."""
        return list(self._cache)

    def by_uid(self, uid: str) -> JsonDict | None:
        """The cached object whose ``metadata.uid`` is ``uid``, or None (never seen, deleted,
        or its name now belongs to an object with another uid). Do not modify it."""
        key = self._by_uid.get(uid)
        return self._cache.get(key) if key is not None else None

    def key_of_uid(self, uid: str) -> ObjectKey | None:
        """The (namespace, name) of the cached object whose uid is ``uid``, or None."""
        return self._by_uid.get(uid)

    def uids(self) -> list[str]:
        """The uids of every cached object that has one."""
        return list(self._by_uid)

    @property
    def resource_version(self) -> str | None:
        """The last resourceVersion seen (list, event or bookmark)."""
        return self._resource_version

    @property
    def consecutive_failures(self) -> int:
        """The longer of the current streaks of failed lists and of failed watches.

        A watch attempt counts as failed until it delivers a line (event or bookmark), so a
        server that lists fine but breaks every watch still shows a growing streak.
        """
        return max(self._list_failures, self._watch_failures)

    def is_healthy(self) -> bool:
        """True when synced, running and not failing repeatedly; readiness should follow it."""
        task_alive = self._task is not None and not self._task.done()
        return (
            task_alive
            and self.has_synced.is_set()
            and self.consecutive_failures < self.settings.unhealthy_after_failures
        )

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the supervised list-and-watch task (idempotent)."""
        if self._task is None or self._task.done():
            self._running = True
            self._task = asyncio.create_task(
                self._supervise(), name=f"informer-{self.settings.name}"
            )

    async def stop(self) -> None:
        """Stop the task and close its connection. The cache stays readable."""
        self._running = False
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def wait_synced(self, timeout_s: float | None = None) -> None:
        """Wait until the first list has filled the cache.

        Raises:
            TimeoutError: not synced within ``timeout_s``.
        """
        await asyncio.wait_for(self.has_synced.wait(), timeout_s)

    async def list_fresh(self) -> tuple[list[JsonDict], str]:
        """List every object from the server now, with this informer's selectors, paging and
        converter, without touching the cache or emitting events (for a consumer's periodic
        check of its own view).

        Returns:
            (converted objects, the list's resourceVersion).

        Raises:
            KubeError: the list failed.
        """
        return await self._list_all()

    # ----------------------------------------------------------------- loop
    async def _supervise(self) -> None:
        while self._running:
            try:
                await self._run()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                # A bug (in a converter, say) must neither kill the informer silently nor spin:
                # log it, count it against health, back off, and start again with a re-list.
                self.restart_count += 1
                self._record_failure(err, listing=True)
                logger.exception("informer %s: loop crashed; restarting", self.settings.name)
                await self._sleep(self._backoff(self._failures))
            else:
                return

    async def _run(self) -> None:
        need_list = True
        while self._running:
            listing = need_list
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                    listing = False
                await self._watch_once()
            except KubeGone as err:
                # History compacted past our resourceVersion: only a fresh list can catch up.
                self.gone_count += 1
                self._gone_streak += 1
                logger.info("informer %s: %s; re-listing", self.settings.name, err)
                need_list = True
                if self._gone_streak > 1:
                    # 410 again before any event got through: back off so a server that keeps
                    # answering 410 does not get a tight loop of full lists.
                    self._record_failure(err, listing=listing)
                    await self._sleep(self._backoff(self._gone_streak - 1))
            except KubeError as err:
                self._record_failure(err, listing=listing)
                logger.warning(
                    "informer %s: %s (failure %d in a row)",
                    self.settings.name,
                    err,
                    self._failures,
                )
                if self._failures >= self.settings.relist_after_failures:
                    need_list = True
                delay = self._backoff(max(self._failures, self.consecutive_failures))
                if err.retry_after is not None:
                    # The server said when to come back (429, or 503 during a restart).
                    delay = max(delay, min(err.retry_after, self.settings.backoff_max_s))
                await self._sleep(delay)

    def _record_failure(self, err: BaseException, *, listing: bool) -> None:
        self._failures += 1
        if listing:
            self._list_failures += 1
        else:
            self._watch_failures += 1
        self.last_error = err
        self.last_error_at = self._now()

    def _record_success(self, *, listing: bool) -> None:
        # The backoff streak ends with any success; the health streaks only with their own.
        self._failures = 0
        if listing:
            self._list_failures = 0
        else:
            self._watch_failures = 0
            self._gone_streak = 0

    def _backoff(self, failures: int) -> float:
        cap = min(
            self.settings.backoff_max_s,
            self.settings.backoff_initial_s * 2.0 ** min(max(failures - 1, 0), 32),
        )
        # "Equal jitter": never below half the step, so a storm still spreads out.
        return cap / 2 + self._rng.uniform(0, cap / 2)

    def _call_args(self) -> tuple[Any, ...]:
        return (self.settings.namespace,) if self.settings.namespace is not None else ()

    def _selector_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.settings.label_selector:
            kwargs["label_selector"] = self.settings.label_selector
        if self.settings.field_selector:
            kwargs["field_selector"] = self.settings.field_selector
        return kwargs

    # ----------------------------------------------------------------- list
    async def _list_all(self) -> tuple[list[JsonDict], str]:
        """List every object, page by page. Returns (converted objects, list
        resourceVersion). Each page is converted as it arrives, so that only one page of raw
        objects is held at a time (a converter that slims objects keeps a large list small:
        1,172 ResourceSlices of 100,000 devices are about 320 MiB as raw JSON dicts)."""
        what = f"list {self.settings.name}"
        items: list[JsonDict] = []
        continue_token: str | None = None
        restarted = False
        while True:
            kwargs = self._selector_kwargs()
            kwargs["limit"] = self.settings.page_size
            if continue_token:
                kwargs["_continue"] = continue_token
            try:
                page = await self._request_json(
                    kwargs,
                    aiohttp.ClientTimeout(
                        total=self.settings.list_timeout_s,
                        sock_connect=self.settings.connect_timeout_s,
                    ),
                    what,
                )
            except KubeGone:
                # The continue token outlived the server's history: start the list again
                # (client-go's pager falls back to a full list the same way). Once only.
                if continue_token is None or restarted:
                    raise
                restarted = True
                items, continue_token = [], None
                continue
            kind = str(page.get("kind") or "")
            item_kind = kind[: -len("List")] if kind.endswith("List") else ""
            api_version = page.get("apiVersion")
            for raw in page.get("items") or []:
                if not isinstance(raw, dict):
                    raise KubeInvalidResponse(f"{what}: an item is not an object")
                # List items come without apiVersion/kind; fill them in so listed and watched
                # objects look the same to converters and consumers.
                if item_kind and "kind" not in raw:
                    raw["kind"] = item_kind
                if api_version and "apiVersion" not in raw:
                    raw["apiVersion"] = api_version
                items.append(self._convert(raw))
            metadata = page.get("metadata") or {}
            del page
            continue_token = metadata.get("continue") or None
            if not continue_token:
                version = metadata.get("resourceVersion")
                if not version:
                    raise KubeInvalidResponse(f"{what}: the list has no resourceVersion")
                return items, str(version)

    async def _relist(self) -> None:
        self.list_count += 1
        listed, list_version = await self._list_all()
        fresh: dict[ObjectKey, JsonDict] = {object_key(obj): obj for obj in listed}
        del listed
        # Diff against what consumers have seen (client-go's DeltaFIFO.Replace).
        for key in [k for k in self._cache if k not in fresh]:
            old = self._drop(key)
            await self._emit("DELETED", old, old)
        for key, obj in fresh.items():
            await self._upsert(key, obj)
        self._resource_version = list_version
        self._record_success(listing=True)
        if not self.has_synced.is_set():
            logger.info(
                "informer %s: synced %d objects at resourceVersion %s",
                self.settings.name,
                len(self._cache),
                list_version,
            )
            self.has_synced.set()

    # ----------------------------------------------------------------- watch
    def _watch_timeout_s(self) -> int:
        base = self.settings.watch_timeout_s
        return max(1, int(base * (1 + self._rng.uniform(0, self.settings.watch_timeout_jitter))))

    async def _watch_once(self) -> None:
        """One watch request: returns when the server ends it; raises KubeError on failure."""
        server_timeout = self._watch_timeout_s()
        what = f"watch {self.settings.name} from resourceVersion {self._resource_version}"
        kwargs = self._selector_kwargs()
        kwargs.update(
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=server_timeout,
            resource_version=self._resource_version,
        )
        timeout = aiohttp.ClientTimeout(
            sock_connect=self.settings.connect_timeout_s,
            sock_read=server_timeout + self.settings.client_timeout_margin_s,
        )
        self.watch_count += 1
        started = self._now()
        response = await self._open(kwargs, timeout, what)
        lines = 0
        try:
            while True:
                try:
                    line = await response.content.readline()
                except ValueError as err:  # a line longer than the read buffer
                    raise KubeInvalidResponse(f"{what}: {err}") from err
                except Exception as err:
                    raise translate_error(err, what) from err
                if not line:
                    break
                if not line.strip():
                    continue
                lines += 1
                await self._handle_line(line, what)
                if lines == 1:
                    # Only a stream that delivered something counts as a recovery: a server
                    # that accepts watches and breaks them at once keeps counting failures.
                    self._record_success(listing=False)
        finally:
            # close(), not release(): a half-read stream must not go back to the pool.
            response.close()
        if lines == 0 and self._now() - started < min(1.0, server_timeout / 2):
            raise _ShortWatch(f"{what}: the server closed the watch at once")
        # A watch that ran its course is a success even when nothing happened meanwhile.
        self._record_success(listing=False)

    async def _handle_line(self, line: bytes, what: str) -> None:
        try:
            event = loads_json(line)
        except ValueError as err:
            raise KubeInvalidResponse(f"{what}: an event is not JSON") from err
        if not isinstance(event, dict):
            raise KubeInvalidResponse(f"{what}: an event is not an object")
        event_type = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise KubeInvalidResponse(f"{what}: event {event_type} has no object: {line[:200]!r}")
        if event_type == "ERROR":
            code = obj.get("code")
            status = int(code) if isinstance(code, int) else 500
            raise error_from_status(status, what, body=obj)
        version = resource_version_of(obj)
        if event_type == "BOOKMARK":
            # A bookmark only moves our resourceVersion forward; its object is a stub.
            self._advance(version)
            return
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            raise KubeInvalidResponse(f"{what}: unknown event type {event_type!r}")
        key = object_key(obj)
        old = self._cache.get(key)
        if old is not None and _older(version, resource_version_of(old)):
            # Older than what is cached: a replayed event must not undo newer state (a
            # DELETED of an earlier incarnation would drop the object that exists now).
            return
        converted = self._convert(obj)
        if event_type == "DELETED":
            if old is not None:
                self._drop(key)
                await self._emit("DELETED", converted, old)
        else:
            await self._upsert(key, converted)
        self._advance(version)

    def _advance(self, version: str | None) -> None:
        """Move the watch's resourceVersion to ``version`` unless that is older."""
        if version and not _older(version, self._resource_version):
            self._resource_version = version

    async def _open(
        self, kwargs: dict[str, Any], client_timeout: aiohttp.ClientTimeout, what: str
    ) -> aiohttp.ClientResponse:
        try:
            response = await self._list_function(
                *self._call_args(),
                _preload_content=False,
                _request_timeout=client_timeout,
                **kwargs,
            )
        except Exception as err:
            raise translate_error(err, what) from err
        if not isinstance(response, aiohttp.ClientResponse):
            raise KubeInvalidResponse(f"{what}: the list function gave no raw response")
        if not 200 <= response.status <= 299:
            try:
                body = await response.read()
            except Exception:
                body = b""
            finally:
                response.close()
            raise error_from_status(response.status, what, body=body, headers=response.headers)
        return response

    async def _request_json(
        self, kwargs: dict[str, Any], client_timeout: aiohttp.ClientTimeout, what: str
    ) -> JsonDict:
        response = await self._open(kwargs, client_timeout, what)
        try:
            body = await response.read()
        except Exception as err:
            raise translate_error(err, what) from err
        finally:
            response.release()
        try:
            data = loads_json(body)
        except ValueError as err:
            raise KubeInvalidResponse(f"{what}: the answer is not JSON") from err
        if not isinstance(data, dict):
            raise KubeInvalidResponse(f"{what}: the answer is not a JSON object")
        return data

    # ----------------------------------------------------------------- delivery
    async def _upsert(self, key: ObjectKey, obj: JsonDict) -> None:
        """Cache ``obj`` and emit what changed: nothing when this resourceVersion was already
        delivered (a replay after a reconnect, or seen in the last list); DELETED then ADDED when
        the name now belongs to a new object (another uid: deleted and re-created in a gap)."""
        old = self._cache.get(key)
        if old is not None and resource_version_of(old) == resource_version_of(obj):
            return
        if old is not None and _uid(old) and _uid(obj) and _uid(old) != _uid(obj):
            self._drop(key)
            await self._emit("DELETED", old, old)
            old = None
        self._put(key, obj)
        await self._emit("ADDED" if old is None else "MODIFIED", obj, old)

    def _put(self, key: ObjectKey, obj: JsonDict) -> None:
        """Cache ``obj`` under ``key`` and index it by uid (the index is updated before any
        handler runs, so handlers see both agree)."""
        old = self._cache.get(key)
        old_uid = _uid(old) if old is not None else None
        new_uid = _uid(obj)
        if old_uid is not None and old_uid != new_uid and self._by_uid.get(old_uid) == key:
            del self._by_uid[old_uid]
        self._cache[key] = obj
        if new_uid is not None:
            self._by_uid[new_uid] = key

    def _drop(self, key: ObjectKey) -> JsonDict:
        """Remove ``key`` from the cache and the uid index; returns the object it held."""
        old = self._cache.pop(key)
        uid = _uid(old)
        if uid is not None and self._by_uid.get(uid) == key:
            del self._by_uid[uid]
        return old

    def _convert(self, obj: JsonDict) -> JsonDict:
        metadata = obj.get("metadata")
        if isinstance(metadata, dict):
            metadata.pop("managedFields", None)  # just decoded: nobody else holds it
        return self._converter(obj) if self._converter is not None else obj

    async def _emit(self, event_type: EventType, obj: JsonDict, old: JsonDict | None) -> None:
        for handler in self._handlers:
            try:
                await handler(event_type, obj, old)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.handler_error_count += 1
                logger.exception(
                    "informer %s: handler failed on %s %s",
                    self.settings.name,
                    event_type,
                    object_key(obj),
                )
        for queue in self._queues:
            await queue.put(InformerEvent(event_type, obj, old))
