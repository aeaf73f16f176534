"""The Redfish fabric backend: inventory and attach/detach through a Redfish CompositionService.

This module owns the HTTP side: one request function (authentication, TLS, timeouts, the
concurrency limit, error mapping), retries, collection paging, the listing walk and the
attach/detach protocol. Turning payloads into value types is in :mod:`app.fabric.redfish_parse`,
which also documents how Redfish locations and holders map to ours.

Listing: ``/redfish/v1/`` -> ``CompositionService.ResourceBlocks`` -> each block -> its
``Processors``, ``Drives``, ``Storage/*/Drives``, ``SimpleStorage`` devices, ``Memory``,
``NetworkInterfaces`` and ``EthernetInterfaces``. ``vendor_id`` is the URI a device was reached
at from its block and ``attach_unit`` is the block's URI. A device linked from two blocks under
one URI is rejected (``duplicate``, every copy). With ``device_identity`` ``serial`` or ``uuid``
one physical device reached under two URIs is listed once, the first in collection order; the
others are rejected as ``duplicate``. Server-owned blocks (a server's own CPUs, DRAM and NICs;
rules in :mod:`app.fabric.redfish_parse`) yield no device and are reported in
``Listing.local_units``; a block's processors are read first, so a server's block costs no
reads of its memory or NICs. A resource that answers HTTP 500 after one retry (real services
answer 500 for dangling links) is a ``fetch-failed`` rejection of that item; a 500 on the
service root or a collection page still fails the listing.

Attach / detach expand an existing System (Redfish "expandable system" composition, DSP2050):
the ``ComputerSystem.AddResourceBlock`` / ``RemoveResourceBlock`` actions when the System
advertises them, else ``PATCH`` of the System's full ``Links.ResourceBlocks`` (every other
block it holds kept, its own server block included) with ``If-Match``. Both are idempotent:
the current holders are read first and nothing is written when the wanted state already
holds. A server-owned block is refused (:class:`~app.fabric.errors.FabricServerOwned`) before
anything is sent. Every write that reports success (200/204, or a task that completed) is
verified: the System is read once and must list the block (or no longer list it); if not yet,
the block's ``Links.ComputerSystems`` is read too, and both are polled every
``verify_poll_s`` up to ``verify_timeout_s``, then
:class:`~app.fabric.errors.FabricNotEffective`. A 202 hands its task monitor to the caller's
``on_operation`` before the first poll, so that :meth:`RedfishBackend.resume` can follow it
after a restart instead of sending again.

ETags: ``If-Match`` carries the System's ``@odata.etag``, else its ``ETag`` header, quoting
repaired (:func:`app.fabric.redfish_parse.preferred_etag`). After a 412 the System is read
again; if its ETag did not change, the service refused its own tag (a spelling it compares
differently), and the write is sent once more without ``If-Match`` instead of looping.

Retries (tenacity, exponential backoff with jitter): GETs on any
:class:`~app.fabric.errors.FabricUnavailable` except TLS failures; writes only when nothing can
have happened (the connection was never made, or the service answered 429/503, honouring
``Retry-After``). A write whose outcome is unknown (timeout, dropped connection, another 5xx, a
task monitor that vanished) is never resent blindly: the state is read again and the write is
made again only if it has not taken effect, at most ``RetrySettings.attempts`` times.

Errors beyond :mod:`app.fabric.errors`: :class:`FabricTaskTimeout` (a FabricTimeout carrying the
task monitor URI as ``op_id``). Listings also raise FabricInvalidData when the service root or a
collection page is malformed. Error bodies without a Redfish error object (``{"message": ...}``,
plain text) still give their text to the error message.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import logging
import random
import ssl
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import aiohttp
from multidict import CIMultiDictProxy
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
)
from yarl import URL

from app.fabric.errors import (
    FabricAuthError,
    FabricConflict,
    FabricError,
    FabricInvalidData,
    FabricNotEffective,
    FabricNotFound,
    FabricPreconditionFailed,
    FabricServerOwned,
    FabricTimeout,
    FabricUnavailable,
)
from app.fabric.redfish_parse import (
    MAX_EXPAND_LEVELS,
    BadItem,
    BlockInfo,
    ChassisPlace,
    CollectionPage,
    DeviceContext,
    DeviceSource,
    IdentityMode,
    SystemInfo,
    block_hosts,
    classify_message_ids,
    device_identity,
    error_from_response,
    expand_levels,
    host_from_system,
    inline_resources,
    is_cpu,
    is_task,
    link,
    location_from_chain,
    message_ids,
    norm_uri,
    obj,
    parse_block,
    parse_chassis,
    parse_collection_page,
    parse_device,
    parse_retry_after,
    parse_simple_storage,
    parse_system,
    parse_task,
    preferred_etag,
    server_owned_reason,
    storage_drive_links,
    systems_by_block,
)
from app.fabric.types import (
    FabricDevice,
    FabricHost,
    Listing,
    Location,
    Operation,
    OperationState,
    Rejected,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
U = TypeVar("U")

AuthMode = Literal["session", "basic", "none"]
OnOperation = Callable[[str], Awaitable[None]]
"""Called with a task monitor URI before it is first polled (the caller journals it)."""
SERVICE_ROOT = "/redfish/v1/"
SESSIONS = "/redfish/v1/SessionService/Sessions"
MAX_CHASSIS_DEPTH = 8
MAX_PAGES = 100_000


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """How calls are retried.

    Attributes:
        attempts: tries per call, first included (>= 1).
        initial_backoff_s: first backoff in seconds; doubles each try, plus up to as much
            random jitter.
        max_backoff_s: largest backoff in seconds.
        max_retry_after_s: largest ``Retry-After`` honoured, in seconds (longer is capped).
    """

    attempts: int = 4
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    max_retry_after_s: float = 60.0


class FabricTaskTimeout(FabricTimeout):
    """A Redfish task did not finish within the task timeout.

    Attributes:
        op_id: the task monitor URI; pass it to :meth:`RedfishBackend.operation_status`.
    """

    def __init__(self, message: str, *, op_id: str) -> None:
        super().__init__(message)
        self.op_id = op_id


class _NotSent(FabricUnavailable):
    """The connection could not be made: the request never reached the service."""


class _Busy(FabricUnavailable):
    """The service answered 429 or 503: it did nothing and asks to be called later."""

    def __init__(
        self, message: str, *, status: int, vendor_code: str | None, retry_after: float | None
    ) -> None:
        super().__init__(message, status=status, vendor_code=vendor_code)
        self.retry_after = retry_after


class _TlsFailure(FabricUnavailable):
    """TLS verification failed; retrying cannot help until the configuration changes."""


class _Secret:
    """A string that never shows itself in repr or str."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class _Response:
    status: int
    headers: CIMultiDictProxy[str]
    body: Any


class RedfishBackend:
    """A :class:`~app.fabric.backend.FabricBackend` speaking Redfish over aiohttp.

    Args:
        base_url: the service origin, ``https://host[:port]`` (no path, no user info).
        username, password: credentials (plain values the caller has read); never logged,
            never in messages or repr.
        auth: ``session`` (``POST /redfish/v1/SessionService/Sessions``, ``X-Auth-Token``,
            renewed once on 401, deleted on :meth:`close`), ``basic`` or ``none``.
        verify_tls: verify the service's certificate (default True).
        ca_file: a PEM CA bundle to verify against instead of the system store.
        timeout_s: per HTTP call, in seconds.
        max_concurrency: HTTP calls in flight at once.
        session: an aiohttp session to use (not closed by :meth:`close`); else one is made on
            first use and owned.
        retry: see :class:`RetrySettings`.
        task_poll_interval_s: seconds between task monitor polls when the service gives no
            ``Retry-After``.
        task_timeout_s: seconds to wait for a 202 task before :class:`FabricTaskTimeout`.
        server_owned_blocks: fnmatch patterns of ResourceBlock ``Id``s or URIs that belong to
            a server (setting ``fabric.server_owned_blocks``); such blocks are never devices.
        verify_poll_s: seconds between reads while a reported success is not yet visible.
        verify_timeout_s: seconds a reported success may take to become visible before
            :class:`~app.fabric.errors.FabricNotEffective`.
        device_identity: ``uri``, ``serial`` or ``uuid``: what makes two listed devices one
            (setting ``fabric.device_identity``).

    Attributes:
        retries: retries by reason (``transient``, ``precondition``, ``unknown-outcome``).
        verifications: verification reads and outcomes (``read``: GETs made to verify a
            write, ``poll``: waits because it was not visible yet, ``not-effective``).

    Raises:
        ValueError: a malformed base URL, an unknown auth mode, missing credentials, an
            unreadable CA bundle, a non-positive timeout, or an unknown device identity.
    """

    kind = "redfish"

    def __init__(
        self,
        base_url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        auth: AuthMode = "session",
        verify_tls: bool = True,
        ca_file: str | Path | None = None,
        timeout_s: float = 30.0,
        max_concurrency: int = 16,
        session: aiohttp.ClientSession | None = None,
        retry: RetrySettings | None = None,
        task_poll_interval_s: float = 1.0,
        task_timeout_s: float = 300.0,
        server_owned_blocks: Sequence[str] = (),
        verify_poll_s: float = 0.2,
        verify_timeout_s: float = 10.0,
        device_identity: IdentityMode = "uri",
    ) -> None:
        origin = URL(base_url)
        if not origin.is_absolute() or origin.scheme not in ("http", "https"):
            raise ValueError(f"base URL {base_url!r} is not an http(s) URL")
        if origin.user is not None or origin.password is not None:
            raise ValueError("base URL must not carry credentials")
        if origin.path not in ("", "/") or origin.query_string or origin.fragment:
            raise ValueError(f"base URL {origin.origin()} must be an origin, without a path")
        if auth not in ("session", "basic", "none"):
            raise ValueError(f"auth mode {auth!r} is not one of session, basic, none")
        if auth != "none" and (username is None or password is None):
            raise ValueError(f"auth mode {auth!r} needs a username and a password")
        if max_concurrency < 1 or timeout_s <= 0 or task_timeout_s <= 0:
            raise ValueError("max_concurrency, timeout_s and task_timeout_s must be positive")
        if verify_poll_s <= 0 or verify_timeout_s < 0:
            raise ValueError("verify_poll_s must be positive and verify_timeout_s not negative")
        if device_identity not in ("uri", "serial", "uuid"):
            raise ValueError(f"device identity {device_identity!r} is not one of uri, serial, uuid")
        self._origin = origin.origin()
        self._username = _Secret(username or "")
        self._password = _Secret(password or "")
        # RFC 7617 Basic credentials, UTF-8 encoded.
        pair = f"{username or ''}:{password or ''}".encode()
        self._basic = _Secret(f"Basic {base64.b64encode(pair).decode('ascii')}")
        self._auth: AuthMode = auth
        self._ssl: ssl.SSLContext | bool = False
        if self._origin.scheme == "https":
            if verify_tls:
                try:
                    self._ssl = ssl.create_default_context(
                        cafile=None if ca_file is None else str(ca_file)
                    )
                except (OSError, ssl.SSLError) as err:
                    raise ValueError(f"CA bundle {ca_file} cannot be used: {err}") from err
            else:
                self._ssl = False
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._max_concurrency = max_concurrency
        self._session = session
        self._owns_session = session is None
        self._retry = retry or RetrySettings()
        # Retries by reason (transient, precondition, unknown-outcome), for metrics: they are
        # handled inside a call and would otherwise leave no trace.
        self.retries: collections.Counter[str] = collections.Counter()
        if self._retry.attempts < 1:
            raise ValueError("retry.attempts must be at least 1")
        self._poll_s = task_poll_interval_s
        self._task_timeout_s = task_timeout_s
        self._server_patterns = tuple(server_owned_blocks)
        self._verify_poll_s = verify_poll_s
        self._verify_timeout_s = verify_timeout_s
        self._identity: IdentityMode = device_identity
        self.verifications: collections.Counter[str] = collections.Counter()
        # Block URI -> why it is server-owned (None: it is not), learnt from listings and
        # attach checks: a block's processors do not change, and this spares attach a read
        # of each of them.
        self._server_owned: dict[str, str | None] = {}
        self._token: str | None = None
        self._session_uri: str | None = None
        self._login_lock = asyncio.Lock()
        self._root: Mapping[str, Any] | None = None
        self._expand_refused = False
        self._closed = False

    def __repr__(self) -> str:
        return f"RedfishBackend({str(self._origin)!r}, auth={self._auth!r})"

    # --- transport ------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise FabricError(f"redfish backend for {self._origin} is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_concurrency)
            )
        return self._session

    def _path(self, ref: str) -> str:
        """The path (and query) of ``ref`` resolved against the service origin.

        Raises:
            FabricInvalidData: ``ref`` points at another origin; credentials are only sent to
                the configured one.
        """
        target = self._origin.join(URL(ref))
        if target.origin() != self._origin:
            raise FabricInvalidData(f"refusing to follow {ref!r}: outside {self._origin}")
        return target.raw_path_qs

    def _redact(self, message: str) -> str:
        for secret in (self._password.value, self._username.value):
            if len(secret) >= 3:
                message = message.replace(secret, "<redacted>")
        return message

    async def _send(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str],
        json_body: Any = None,
        basic: bool = False,
    ) -> tuple[int, CIMultiDictProxy[str], bytes]:
        """One HTTP exchange; transport failures become typed errors."""
        context = f"{method} {path}"
        send_headers = dict(headers)
        if basic:
            send_headers["Authorization"] = self._basic.value
        try:
            async with (
                self._semaphore,
                self._http().request(
                    method,
                    self._origin.join(URL(path, encoded=True)),
                    headers=send_headers,
                    data=None if json_body is None else json.dumps(json_body),
                    ssl=self._ssl,
                    timeout=self._timeout,
                    allow_redirects=False,
                ) as response,
            ):
                raw = await response.read()
                return response.status, response.headers, raw
        except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError) as err:
            raise _TlsFailure(
                f"{context}: TLS verification of {self._origin} failed ({err.__class__.__name__}:"
                f" {self._redact(str(err))}); configure the CA bundle that signed its certificate"
            ) from err
        except aiohttp.ClientConnectorError as err:
            raise _NotSent(f"{context}: cannot connect to {self._origin}: {err}") from err
        except TimeoutError as err:
            raise FabricTimeout(f"{context}: no answer within {self._timeout.total} s") from err
        except aiohttp.ServerDisconnectedError as err:
            raise FabricUnavailable(f"{context}: server closed the connection") from err
        except aiohttp.ClientError as err:
            raise FabricUnavailable(
                f"{context}: {err.__class__.__name__}: {self._redact(str(err))}"
            ) from err

    async def _login(self) -> None:
        body = {"UserName": self._username.value, "Password": self._password.value}
        status, headers, raw = await self._send(
            "POST",
            SESSIONS,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
            json_body=body,
        )
        context = f"login to {self._origin}"
        if status in (401, 403):
            raise FabricAuthError(f"{context}: credentials refused (HTTP {status})", status=status)
        if status >= 400:
            error = error_from_response(status, _error_body(raw), context=context)
            raise type(error)(
                self._redact(str(error)), status=status, vendor_code=error.vendor_code
            )
        token = headers.get("X-Auth-Token")
        if not token:
            raise FabricInvalidData(f"{context}: HTTP {status} without an X-Auth-Token header")
        self._token = token
        location = headers.get("Location")
        if location is None:
            decoded = _decode(raw)
            if isinstance(decoded, Mapping) and isinstance(decoded.get("@odata.id"), str):
                location = decoded["@odata.id"]
        try:
            self._session_uri = None if location is None else self._path(location)
        except FabricInvalidData:
            self._session_uri = None

    async def _ensure_token(self) -> str:
        if self._token is not None:
            return self._token
        async with self._login_lock:
            if self._token is None:
                await self._login()
            assert self._token is not None
            return self._token

    async def _renew(self, stale: str) -> str:
        async with self._login_lock:
            # Concurrent requests may all see the same 401: only the first logs in again.
            if self._token == stale:
                self._token = None
                self._session_uri = None
                await self._login()
            assert self._token is not None
            return self._token

    async def _request(
        self,
        method: str,
        ref: str,
        *,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> _Response:
        """The one request function: auth, error mapping and JSON decoding.

        Returns:
            A 1xx or 2xx answer, with its JSON body decoded (None when empty).

        Raises:
            FabricError: a subclass for every failure (see
                :func:`app.fabric.redfish_parse.error_from_response`); 429/503 answers are
                ``_Busy`` (a FabricUnavailable) with the ``Retry-After`` delay;
                FabricInvalidData for a success body that is not JSON, or a redirect.
        """
        path = self._path(ref)
        context = f"{method} {path}"
        send_headers = {"Accept": "application/json", "OData-Version": "4.0"}
        if json_body is not None:
            send_headers["Content-Type"] = "application/json"
        send_headers.update(headers or {})
        token: str | None = None
        if self._auth == "session":
            token = await self._ensure_token()
        for renewal in (False, True):
            if token is not None:
                send_headers["X-Auth-Token"] = token
            status, response_headers, raw = await self._send(
                method,
                path,
                headers=send_headers,
                json_body=json_body,
                basic=self._auth == "basic",
            )
            if status == 401 and token is not None and not renewal:
                logger.info("redfish session for %s expired; logging in again", self._origin)
                token = await self._renew(token)
                continue
            break
        if status >= 400:
            body = _error_body(raw)
            error = error_from_response(status, body, context=context)
            if status in (429, 503):
                raise _Busy(
                    str(error),
                    status=status,
                    vendor_code=error.vendor_code,
                    retry_after=parse_retry_after(response_headers.get("Retry-After")),
                )
            raise error
        if 300 <= status < 400:
            # Not followed: a redirect could carry the session token to another origin.
            raise FabricInvalidData(
                f"{context}: HTTP {status} redirect to {response_headers.get('Location')!r}"
                " is not followed",
                status=status,
            )
        if not raw.strip():
            return _Response(status, response_headers, None)
        try:
            decoded = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise FabricInvalidData(
                f"{context}: HTTP {status} body is not valid JSON ({err})", status=status
            ) from err
        return _Response(status, response_headers, decoded)

    def _wait(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, _Busy) and error.retry_after is not None:
            return min(error.retry_after, self._retry.max_retry_after_s)
        return self._backoff(state.attempt_number)

    def _backoff(self, attempt: int) -> float:
        """Seconds to wait after failed try number ``attempt`` (from 1)."""
        # Exponential backoff with jitter on top, so that many callers do not retry in
        # lockstep after a shared outage.
        settings = self._retry
        step: float = settings.initial_backoff_s * 2.0 ** min(attempt - 1, 30)
        return min(step + random.uniform(0.0, step), settings.max_backoff_s)

    def _retrying(
        self, retryable: Callable[[BaseException], bool], *, item: bool = False
    ) -> AsyncRetrying:
        """Retries of one call; with ``item``, an HTTP 500 is retried once only (see
        :meth:`_read_item`)."""

        def count(_state: Any) -> None:
            self.retries["transient"] += 1

        most = stop_after_attempt(self._retry.attempts)

        def stop(state: RetryCallState) -> bool:
            if most(state):
                return True
            error = state.outcome.exception() if state.outcome is not None else None
            return (
                item
                and state.attempt_number >= 2
                and isinstance(error, FabricUnavailable)
                and error.status == 500
            )

        return AsyncRetrying(
            stop=stop,
            wait=self._wait,
            retry=retry_if_exception(retryable),
            reraise=True,
            before_sleep=count,
        )

    async def _get(self, ref: str, *, item: bool = False) -> _Response:
        """GET with retries on FabricUnavailable (not on TLS failures); with ``item``, an
        HTTP 500 is retried once only."""
        retrying = self._retrying(
            lambda err: isinstance(err, FabricUnavailable) and not isinstance(err, _TlsFailure),
            item=item,
        )
        return await retrying(self._request, "GET", ref)

    async def _write(
        self, method: str, ref: str, body: Any, headers: Mapping[str, str] | None = None
    ) -> _Response:
        """A write, retried only when the service cannot have acted on it."""
        retrying = self._retrying(lambda err: isinstance(err, _NotSent | _Busy))
        return await retrying(self._request, method, ref, json_body=body, headers=headers)

    async def _gather(
        self, func: Callable[[T], Coroutine[Any, Any, U]], items: Iterable[T]
    ) -> list[U]:
        """``func`` over ``items`` concurrently; the first error cancels the rest and is raised
        as itself (not as an exception group)."""
        tasks: list[asyncio.Task[U]] = []
        try:
            async with asyncio.TaskGroup() as group:
                for item in items:
                    tasks.append(group.create_task(func(item)))
        except BaseExceptionGroup as errors:
            first = _first_error(errors)
            # Keep the error's own cause (the transport error) rather than the group.
            raise first from first.__cause__
        return [task.result() for task in tasks]

    # --- reading --------------------------------------------------------------------------

    async def _service_root(self) -> Mapping[str, Any]:
        if self._root is None:
            response = await self._get(SERVICE_ROOT)
            if not isinstance(response.body, Mapping):
                raise FabricInvalidData(f"GET {SERVICE_ROOT}: body is not a JSON object")
            self._root = response.body
        return self._root

    async def _root_link(self, *names: str) -> str:
        current: Mapping[str, Any] = await self._service_root()
        where = SERVICE_ROOT
        for index, name in enumerate(names):
            try:
                uri = link(current.get(name), f"{where} {name}")
            except BadItem as err:
                raise FabricInvalidData(f"service has no usable {name}: {err.reason}") from err
            if index == len(names) - 1:
                return uri
            response = await self._get(uri)
            if not isinstance(response.body, Mapping):
                raise FabricInvalidData(f"GET {uri}: body is not a JSON object")
            current, where = response.body, uri
        raise ValueError("no link names given")

    async def _expand_query(self, most: int = MAX_EXPAND_LEVELS) -> str | None:
        """The ``$expand`` value for collections, at most ``most`` levels deep, when the
        service offers it, else None."""
        levels = min(most, expand_levels(await self._service_root()))
        if levels == 0 or self._expand_refused:
            return None
        return "." if levels == 1 else f".($levels={levels})"

    async def _pages(
        self, uri: str, expand: str | None = None
    ) -> AsyncIterator[tuple[CollectionPage, list[Any]]]:
        """Each page of a collection, following ``Members@odata.nextLink``, with its raw
        ``Members`` (expanded resources when ``expand`` is given and the service expands).

        Raises:
            FabricUnavailable: any page could not be read (never a partial list).
            FabricInvalidData: a page is not a collection, or the pages loop.
            FabricAuthError: credentials refused.
        """
        seen: set[str] = set()
        page_ref: str | None = uri
        if self._expand_refused:
            expand = None
        if expand is not None:
            page_ref = str(URL(uri).update_query({"$expand": expand}))
        while page_ref is not None:
            page_path = self._path(page_ref)
            if page_path in seen or len(seen) >= MAX_PAGES:
                raise FabricInvalidData(f"collection {uri}: page {page_path} repeats")
            seen.add(page_path)
            try:
                response = await self._get(page_path)
            except FabricError as err:
                if expand is not None and not seen - {page_path} and err.status in (400, 501):
                    # Advertised but refused (seen in the wild, and in mockups served as they
                    # are): read this and every later collection without $expand.
                    logger.info("redfish %s refuses $expand (%s); reading without it",
                                self._origin, err)
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
            yield page, response.body["Members"]
            page_ref = page.next_link

    async def _collection(self, uri: str) -> tuple[list[str], list[Rejected]]:
        """Every member URI of a collection, following ``Members@odata.nextLink``.

        Raises:
            FabricUnavailable: any page could not be read (never a partial list).
            FabricInvalidData: a page is not a collection, or the pages loop.
            FabricAuthError: credentials refused.
        """
        members: dict[str, None] = {}
        rejected: list[Rejected] = []
        async for page, _ in self._pages(uri):
            for member in page.members:
                members.setdefault(member, None)
            rejected.extend(_bad_members(uri, page))
        return list(members), rejected

    async def _expanded_collection(
        self, uri: str, expand: str
    ) -> tuple[list[tuple[str, Any]], list[Rejected]]:
        """Every member of a collection read with ``$expand``: (URI, body) pairs, where the
        body is None for a member the service left as a link (the caller reads it)."""
        members: dict[str, Any] = {}
        rejected: list[Rejected] = []
        async for page, raw in self._pages(uri, expand):
            members.update((member, None) for member in page.members if member not in members)
            for entry in raw:
                body = _expanded(entry)
                if body is not None and members.get(body[0], 0) is None:
                    members[body[0]] = body[1]
            rejected.extend(_bad_members(uri, page))
        return list(members.items()), rejected

    async def _read_item(self, uri: str, *, strict: bool = False) -> Any:
        """A member resource's body, or BadItem when this one item cannot be read.

        A 4xx (404 for a dangling link, say), a body that is not JSON, or an HTTP 500 that
        repeats once (real services answer 500 for resources that do not exist) is this
        item's ``fetch-failed``. Listing-wide failures (other FabricUnavailable, including a
        500 with ``strict``, and FabricAuthError) propagate.
        """
        try:
            response = await self._get(uri, item=not strict)
        except FabricUnavailable as err:
            if strict or err.status != 500:
                raise
            raise BadItem(f"{err} (after one retry)", "fetch-failed") from err
        except FabricAuthError:
            raise
        except FabricError as err:
            raise BadItem(str(err), "fetch-failed") from err
        return response.body

    async def _systems(self, *, strict: bool = False) -> tuple[list[SystemInfo], list[Rejected]]:
        """Every System, and the Systems that could not be read or parsed. With ``strict``
        (the device listing, which needs every System to know who holds a block) an HTTP 500
        on a System fails the call instead."""
        systems_uri = await self._root_link("Systems")
        # The System bodies are all the listing needs: not their processors, memory, storage.
        expand = await self._expand_query(most=1)
        if expand is None:
            uris, rejected = await self._collection(systems_uri)
            members: list[tuple[str, Any]] = [(uri, None) for uri in uris]
        else:
            members, rejected = await self._expanded_collection(systems_uri, expand)

        async def read(member: tuple[str, Any]) -> SystemInfo | Rejected:
            uri, body = member
            try:
                payload = await self._read_item(uri, strict=strict) if body is None else body
                return parse_system(payload, uri)
            except BadItem as err:
                return Rejected(uri, f"system: {err.reason}", err.kind)

        systems: list[SystemInfo] = []
        ids: set[str] = set()
        for result in await self._gather(read, members):
            if isinstance(result, Rejected):
                rejected.append(result)
            elif result.host_id in ids:
                rejected.append(
                    Rejected(result.uri, f"system Id {result.host_id!r} repeats", "duplicate")
                )
            else:
                ids.add(result.host_id)
                systems.append(result)
        return systems, rejected

    async def list_hosts(self) -> Listing[FabricHost]:
        """Every ComputerSystem as a :class:`FabricHost`.

        Location comes from the System's first ``Links.Chassis`` (rules in
        :mod:`app.fabric.redfish_parse`). A System that cannot be read or parsed is a
        Rejected entry.

        Raises:
            FabricUnavailable: the listing could not be read completely.
            FabricAuthError: credentials were refused.
            FabricInvalidData: the service root or a collection page is malformed.
        """
        systems, rejected = await self._systems()
        walk = _ChassisCache(self)

        async def host(system: SystemInfo) -> FabricHost | Rejected:
            try:
                chain = await walk.chain(system.chassis[0]) if system.chassis else []
            except BadItem as err:
                return Rejected(system.uri, f"system location: {err.reason}", err.kind)
            return host_from_system(system, location_from_chain(chain, chassis_slot=True))

        hosts: list[FabricHost] = []
        for result in await self._gather(host, systems):
            if isinstance(result, Rejected):
                rejected.append(result)
            else:
                hosts.append(result)
        return Listing(tuple(hosts), tuple(rejected))

    async def list_devices(self) -> Listing[FabricDevice]:
        """Every composable device, with location, health, holder and shareability.

        A block, device, storage or chassis that cannot be read (404, 500 twice, malformed
        JSON) or parsed becomes a Rejected entry for the devices it concerns; the rest still
        lists. Server-owned blocks give no devices and are listed in ``local_units`` (their
        count is logged at debug). Systems are read too, to find holders that only the
        System records; a System that cannot be parsed is reported by :meth:`list_hosts`,
        not here.

        Raises:
            FabricUnavailable: any collection page, a System, or a needed resource could not
                be read after retries (never a partial listing).
            FabricAuthError: credentials were refused.
            FabricInvalidData: the service root or a collection page is malformed.
        """
        blocks_uri = await self._root_link("CompositionService", "ResourceBlocks")
        expand = await self._expand_query()
        if expand is not None:
            return await self._list_devices_expanded(blocks_uri, expand)
        block_uris, rejected = await self._collection(blocks_uri)
        walk = await self._walk()
        collector = _Collector(self._identity, rejected)
        for results in await self._gather(walk.block, block_uris):
            collector.add(results)
        return self._finish(collector)

    async def _walk(self) -> _DeviceWalk:
        systems, _ = await self._systems(strict=True)
        return _DeviceWalk(
            self,
            blocks_by_system={s.uri: s.resource_blocks for s in systems},
            system_ids={s.uri: s.host_id for s in systems},
        )

    def _finish(self, collector: _Collector) -> Listing[FabricDevice]:
        listing = collector.listing()
        if listing.local_units:
            logger.debug(
                "redfish %s: %d server-owned blocks are not devices",
                self._origin, len(listing.local_units),
            )
        return listing

    async def _list_devices_expanded(self, blocks_uri: str, expand: str) -> Listing[FabricDevice]:
        """:meth:`list_devices` reading the blocks collection with ``$expand``: each page
        brings its blocks (and, with levels, their devices), so the listing needs a request
        per page instead of one per block and per device. Pages are walked as they arrive,
        so only one page of raw JSON is held at a time. A member or device the service left
        as a link is read on its own, as without ``$expand``.
        """
        walk = await self._walk()
        rejected: list[Rejected] = []
        collector = _Collector(self._identity, rejected)
        done: set[str] = set()
        async for page, raw in self._pages(blocks_uri, expand):
            rejected.extend(_bad_members(blocks_uri, page))
            bodies = dict(filter(None, map(_expanded, raw)))
            todo = [uri for uri in dict.fromkeys(page.members) if uri not in done]
            done.update(todo)

            async def block(uri: str, bodies: dict[str, Any] = bodies) -> list[_BlockResult]:
                return await walk.block(uri, bodies.get(uri))

            for results in await self._gather(block, todo):
                collector.add(results)
        return self._finish(collector)

    # --- attach / detach ------------------------------------------------------------------

    async def _system_uri(self, host_id: str) -> str:
        systems_uri = await self._root_link("Systems")
        return f"{norm_uri(systems_uri)}/{quote(host_id, safe='')}"

    async def _read_system(self, host_id: str, what: str) -> tuple[SystemInfo, str | None]:
        """The System and the ETag to send back (``@odata.etag``, else the header)."""
        uri = await self._system_uri(host_id)
        try:
            response = await self._get(uri)
        except FabricNotFound as err:
            raise FabricNotFound(f"{what}: host not found: {err}", status=err.status) from err
        try:
            system = parse_system(response.body, uri)
        except BadItem as err:
            raise FabricInvalidData(f"{what}: system {uri}: {err.reason}") from err
        return system, preferred_etag(response.headers.get("ETag"), system.etag)

    async def _read_block(self, uri: str, what: str) -> BlockInfo:
        try:
            response = await self._get(uri)
        except FabricNotFound as err:
            raise FabricNotFound(f"{what}: device not found: {err}", status=err.status) from err
        try:
            return parse_block(response.body, uri)
        except BadItem as err:
            raise FabricInvalidData(f"{what}: block {uri}: {err.reason}") from err

    async def _refuse_server_owned(self, block: BlockInfo, what: str) -> None:
        """Raise FabricServerOwned when ``block`` is a server's (rules in
        :mod:`app.fabric.redfish_parse`). The CPU rule uses what a listing learnt, else reads
        the block's processors once (then remembered)."""
        reason = server_owned_reason(block, self._server_patterns)
        if reason is None and block.uri in self._server_owned:
            reason = self._server_owned[block.uri]
        elif reason is None:
            processors = [u for s, u in block.device_links if s is DeviceSource.PROCESSOR]

            async def read(uri: str) -> Any:
                try:
                    return await self._read_item(uri)
                except BadItem:
                    return None

            payloads = await self._gather(read, processors)
            cpu = next((u for u, p in zip(processors, payloads, strict=True) if is_cpu(p)), None)
            reason = None if cpu is None else f"it holds CPU {cpu}"
            if reason is not None or all(p is not None for p in payloads):
                self._server_owned[block.uri] = reason
        if reason is not None:
            raise FabricServerOwned(
                f"{what}: the block belongs to a server ({reason}); it is never attached or "
                "detached"
            )

    async def attach(
        self, device: FabricDevice, host_id: str, *, on_operation: OnOperation | None = None
    ) -> Operation:
        """Attach ``device.attach_unit`` (a ResourceBlock URI) to System ``host_id``.

        Already held by ``host_id``: success with no write. Held by another System and not
        shareable: FabricConflict. A 202 answer (or a 200 carrying a running Task) is
        followed to completion; its task monitor URI is first awaited in
        ``on_operation(monitor)``, before the first poll, so that the caller can journal it
        and :meth:`resume` after a restart. A write that reports success is verified by
        reading the System back (one GET; more only while the change is not visible yet).

        Returns:
            COMPLETED, with the task monitor as ``op_id`` when the service ran a task.

        Raises:
            FabricServerOwned: the block is a server's own (nothing is sent).
            FabricNotFound: unknown block or host (HTTP 404 / ResourceNotFound).
            FabricConflict: held by another host, or HTTP 409 / ResourceInUse.
            FabricPreconditionFailed: the System's ETag changed twice in a row (HTTP 412).
            FabricNotEffective: the service reported success, but the System does not hold
                the block after ``verify_timeout_s`` (retryable).
            FabricTaskTimeout: the task did not finish in time or its monitor stopped
                answering (``op_id`` is the monitor).
            FabricTimeout: the outcome stayed unknown after repeated re-reads.
            FabricUnavailable: the service could not be reached.
            FabricError: the service refused (400/405/406/501 are permanent), or the task
                failed (its TaskState in the message). Whatever ``on_operation`` raises
                propagates (the task may then still run: :meth:`resume` it).
        """
        return await self._change(device, host_id, attach=True, on_operation=on_operation)

    async def detach(
        self, device: FabricDevice, host_id: str, *, on_operation: OnOperation | None = None
    ) -> Operation:
        """Detach ``device.attach_unit`` from System ``host_id``.

        Not held by ``host_id`` (free, or held by another System only): success with no
        write. A PATCH keeps every other block the System holds. Otherwise as
        :meth:`attach` (FabricNotEffective when the System still holds the block after
        ``verify_timeout_s``).
        """
        return await self._change(device, host_id, attach=False, on_operation=on_operation)

    async def resume(
        self,
        op_id: str,
        device: FabricDevice,
        host_id: str,
        *,
        attach: bool,
        on_operation: OnOperation | None = None,
    ) -> Operation:
        """Finish an attach (``attach=True``) or detach whose task monitor ``op_id`` was
        handed to ``on_operation`` before, e.g. by a process that has since restarted.

        * The monitor says the task runs (202, or a Task body in a running TaskState, with
          200 or 202): it is polled until it ends; nothing is sent meanwhile.
        * The task completed: the change is verified as :meth:`attach` does.
        * The monitor is gone (404/410), or the task ended in failure (TaskState Exception,
          Killed, Cancelled; an error status): the state is read. If the wanted state holds,
          COMPLETED; if not, the task ended without effect, so the change is made as
          :meth:`attach` / :meth:`detach` would (a new task monitor goes to
          ``on_operation``).

        Returns:
            COMPLETED, with ``op_id`` (or the new monitor when the change was sent again).

        Raises:
            FabricInvalidData: ``op_id`` is not on this service.
            FabricTaskTimeout: the task still runs after the task timeout, or its monitor
                cannot be read (``op_id`` is the monitor).
            Otherwise as :meth:`attach`.
        """
        block_uri = norm_uri(self._path(device.attach_unit))
        what = _what(block_uri, host_id, attach)
        monitor = self._path(op_id)
        await self._refuse_server_owned(await self._read_block(block_uri, what), what)
        end = await self._poll_monitor(monitor, what, delay=None, immediately=True)
        if end is not None and end.operation.state is OperationState.COMPLETED:
            await self._verify(host_id, block_uri, attach=attach, what=what, via_block=True)
            return end.operation
        ended = "is gone" if end is None else f"ended: {end.operation.message or 'failed'}"
        system, _ = await self._read_system(host_id, what)
        block = await self._read_block(block_uri, what)
        holds = block_uri in system.resource_blocks or system.uri in block.linked_systems
        if holds == attach:
            return Operation(
                monitor, OperationState.COMPLETED, f"task {monitor} {ended}; the state holds"
            )
        logger.warning("%s: task %s %s, without effect; sending again", what, monitor, ended)
        return await self._change(device, host_id, attach=attach, on_operation=on_operation)

    async def _change(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        attach: bool,
        on_operation: OnOperation | None,
    ) -> Operation:
        block_uri = norm_uri(self._path(device.attach_unit))
        what = _what(block_uri, host_id, attach)
        precondition_retries = 0
        unknown_outcomes = 0
        refused_etag: str | None = None
        while True:
            system, etag = await self._read_system(host_id, what)
            block = await self._read_block(block_uri, what)
            await self._refuse_server_owned(block, what)
            listed = block_uri in system.resource_blocks
            holds = listed or system.uri in block.linked_systems
            if attach and holds:
                return Operation(None, OperationState.COMPLETED, "already attached")
            if not attach and not holds:
                return Operation(None, OperationState.COMPLETED, "not attached")
            if attach and not block.shareable:
                others = [
                    h
                    for h in block_hosts(block, {}, {system.uri: system.host_id})
                    if h != system.host_id
                ]
                if others:
                    raise FabricConflict(f"{what}: block is attached to {', '.join(others)}")
            if refused_etag is not None and etag == refused_etag:
                # The service refused the very ETag it still reports: it compares another
                # spelling (quoted twice, header unlike @odata.etag). Nothing changed, so the
                # write goes once more without If-Match rather than into a 412 loop.
                logger.info("%s: the service refused its own ETag %s; sending without "
                            "If-Match", what, etag)
                etag = None
            try:
                response = await self._write_change(system, etag, block_uri, attach)
            except FabricPreconditionFailed:
                if precondition_retries >= 1:
                    raise
                precondition_retries += 1
                refused_etag = etag
                self.retries["precondition"] += 1
                continue
            except (_NotSent, _Busy):
                raise
            except FabricUnavailable as err:
                # The write may or may not have happened: read the state again and decide.
                unknown_outcomes += 1
                self.retries["unknown-outcome"] += 1
                if unknown_outcomes >= self._retry.attempts:
                    raise FabricTimeout(
                        f"{what}: outcome unknown after {unknown_outcomes} tries: {err}"
                    ) from err
                logger.warning("%s: outcome unknown (%s); reading the state again", what, err)
                await asyncio.sleep(self._backoff(unknown_outcomes))
                continue
            via_block = not attach and not listed
            if not _is_task_answer(response):
                await self._verify(host_id, block_uri, attach=attach, what=what,
                                   via_block=via_block)
                return Operation(None, OperationState.COMPLETED)
            monitor = self._monitor_of(response, what)
            if on_operation is not None:
                await on_operation(monitor)
            end = await self._poll_monitor(
                monitor, what, delay=parse_retry_after(response.headers.get("Retry-After"))
            )
            if end is not None:
                if end.operation.state is OperationState.FAILED:
                    raise end.error or _task_error(end.body, what, end.operation)
                await self._verify(host_id, block_uri, attach=attach, what=what,
                                   via_block=via_block)
                return end.operation
            unknown_outcomes += 1
            if unknown_outcomes >= self._retry.attempts:
                raise FabricTimeout(f"{what}: task outcome unknown after {unknown_outcomes} tries")

    async def _write_change(
        self, system: SystemInfo, etag: str | None, block_uri: str, attach: bool
    ) -> _Response:
        target = system.add_target if attach else system.remove_target
        if target is not None:
            return await self._write("POST", target, {"ResourceBlock": {"@odata.id": block_uri}})
        # The full new list (DSP2050 "expand a system"): every other block stays, the
        # System's own server block included, which real services refuse to lose (406).
        if attach:
            wanted = [*system.resource_blocks, block_uri]
        else:
            wanted = [uri for uri in system.resource_blocks if uri != block_uri]
        headers = {"If-Match": etag} if etag else None
        body = {"Links": {"ResourceBlocks": [{"@odata.id": uri} for uri in wanted]}}
        return await self._write("PATCH", system.uri, body, headers)

    async def _verify(
        self, host_id: str, block_uri: str, *, attach: bool, what: str, via_block: bool
    ) -> None:
        """Check that a write the service reported as done took effect.

        Reads the System (one GET): done when its ``Links.ResourceBlocks`` holds the block
        (attach) or no longer holds it (detach; with ``via_block``, meaning the System never
        listed it, the block's ``Links.ComputerSystems`` must no longer name the System
        either). Otherwise the block is read too (some services record the holder only
        there), and both are read again every ``verify_poll_s`` up to ``verify_timeout_s``.

        Raises:
            FabricNotEffective: the change did not show within ``verify_timeout_s``.
            FabricError: as the reads.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._verify_timeout_s
        while True:
            system, _ = await self._read_system(host_id, what)
            self.verifications["read"] += 1
            listed = block_uri in system.resource_blocks
            if listed == attach and (attach or not via_block):
                return
            if not (listed and not attach):
                block = await self._read_block(block_uri, what)
                self.verifications["read"] += 1
                linked = system.uri in block.linked_systems
                if attach and linked:
                    return
                if not attach and not listed and not linked:
                    return
            remaining = deadline - loop.time()
            if remaining <= 0:
                self.verifications["not-effective"] += 1
                held = "does not hold the block" if attach else "still holds the block"
                raise FabricNotEffective(
                    f"{what}: the service reported success but host {host_id!r} {held} "
                    f"after {self._verify_timeout_s:g} s"
                )
            self.verifications["poll"] += 1
            await asyncio.sleep(min(self._verify_poll_s, remaining))

    def _monitor_of(self, accepted: _Response, what: str) -> str:
        """The task monitor path of a 202 (or running-Task) answer: its ``Location``, else
        the body's ``TaskMonitor`` or ``@odata.id`` (Task.v1)."""
        monitor_ref = accepted.headers.get("Location")
        if monitor_ref is None and isinstance(accepted.body, Mapping):
            for key in ("TaskMonitor", "@odata.id"):
                raw_id = accepted.body.get(key)
                if isinstance(raw_id, str):
                    monitor_ref = raw_id
                    break
        if monitor_ref is None:
            raise FabricInvalidData(
                f"{what}: HTTP {accepted.status} task answer without a task monitor Location"
            )
        return self._path(monitor_ref)

    async def _poll_monitor(
        self, monitor: str, what: str, *, delay: float | None, immediately: bool = False
    ) -> _TaskEnd | None:
        """Poll a task monitor until the task ends.

        Args:
            monitor: the monitor (or Task) path.
            what: the operation, for messages.
            delay: seconds before the first poll (the write's ``Retry-After``), else the
                poll interval.
            immediately: poll at once (resuming a task that may have ended long ago).

        Returns:
            How the task ended (COMPLETED, or FAILED with the error to raise), or None when
            the monitor is gone (404/410) before saying how it ended.

        Raises:
            FabricTaskTimeout: not finished within the task timeout, or the monitor could not
                be read (``op_id`` is the monitor either way).
            FabricAuthError, FabricInvalidData: as the reads.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._task_timeout_s
        first = True
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise FabricTaskTimeout(
                    f"{what}: task {monitor} not finished within {self._task_timeout_s} s",
                    op_id=monitor,
                )
            if not (first and immediately):
                # A service answering "Retry-After: 0" forever must not be polled in a busy
                # loop.
                pause = self._poll_s if delay is None else max(delay, self._poll_s / 10)
                await asyncio.sleep(min(pause, self._retry.max_retry_after_s, remaining))
            first = False
            try:
                response = await self._get(monitor)
            except FabricNotFound:
                logger.warning("%s: task monitor %s is gone; reading the state", what, monitor)
                return None
            except FabricUnavailable as err:
                # The task may still run: hand out its monitor so the caller can ask later.
                raise FabricTaskTimeout(
                    f"{what}: task {monitor} could not be followed: {err}", op_id=monitor
                ) from err
            except (FabricAuthError, FabricInvalidData):
                raise
            except FabricError as err:
                # The monitor answers the operation's own final status: it failed.
                failed = Operation(monitor, OperationState.FAILED, str(err))
                error = type(err)(
                    f"{what}: task failed: {err}", status=err.status, vendor_code=err.vendor_code
                )
                return _TaskEnd(failed, None, error)
            operation = _task_outcome(response, monitor)
            if operation.state is OperationState.RUNNING:
                delay = parse_retry_after(response.headers.get("Retry-After"))
                continue
            return _TaskEnd(operation, response.body, None)

    async def operation_status(self, op_id: str) -> Operation:
        """The state of a task monitor or Task URI returned earlier.

        Returns:
            RUNNING while the monitor answers 202 (or the Task runs), COMPLETED when done,
            FAILED with the service's message when the operation ended in an error.

        Raises:
            FabricNotFound: the monitor or task does not exist (any more).
            FabricUnavailable, FabricAuthError: the service could not be asked.
            FabricInvalidData: ``op_id`` is not on this service, or the answer is malformed.
        """
        monitor = self._path(op_id)
        try:
            response = await self._get(monitor)
        except (FabricNotFound, FabricUnavailable, FabricAuthError, FabricInvalidData):
            raise
        except FabricError as err:
            return Operation(monitor, OperationState.FAILED, str(err))
        return _task_outcome(response, monitor)

    async def close(self) -> None:
        """Delete the login session (best effort) and close the owned HTTP session.

        Safe to call twice.
        """
        if self._closed:
            return
        try:
            if self._token is not None and self._session_uri is not None:
                try:
                    status, _, _ = await self._send(
                        "DELETE", self._session_uri, headers={"X-Auth-Token": self._token}
                    )
                    if status >= 400 and status != 404:
                        logger.info("redfish logout from %s: HTTP %s", self._origin, status)
                except (FabricError, RuntimeError) as err:
                    # RuntimeError: an injected session that its owner closed already.
                    logger.info("redfish logout from %s failed: %s", self._origin, err)
        finally:
            self._token = None
            self._closed = True
            if self._owns_session and self._session is not None:
                await self._session.close()
            self._session = None


class _ChassisCache:
    """Chassis reads for one listing: each chassis is read once, however many ask for it."""

    def __init__(self, backend: RedfishBackend) -> None:
        self._backend = backend
        self._places: dict[str, ChassisPlace | BadItem] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def place(self, uri: str) -> ChassisPlace:
        key = norm_uri(uri)
        if key not in self._places:
            async with self._locks.setdefault(key, asyncio.Lock()):
                if key not in self._places:
                    try:
                        self._places[key] = parse_chassis(await self._backend._read_item(key), key)
                    except BadItem as err:
                        self._places[key] = BadItem(f"chassis {key}: {err.reason}", err.kind)
        value = self._places[key]
        if isinstance(value, BadItem):
            raise BadItem(value.reason, value.kind)
        return value

    async def chain(self, uri: str) -> list[ChassisPlace]:
        """The chassis at ``uri`` and its ``ContainedBy`` parents, nearest first."""
        chain: list[ChassisPlace] = []
        seen: set[str] = set()
        current: str | None = norm_uri(uri)
        while current is not None and current not in seen and len(chain) < MAX_CHASSIS_DEPTH:
            seen.add(current)
            place = await self.place(current)
            chain.append(place)
            current = None if place.contained_by is None else norm_uri(place.contained_by)
        return chain


class _DeviceWalk:
    """The per-listing walk from one ResourceBlock to its devices."""

    def __init__(
        self,
        backend: RedfishBackend,
        *,
        blocks_by_system: Mapping[str, Sequence[str]],
        system_ids: Mapping[str, str],
    ) -> None:
        self._backend = backend
        self._chassis = _ChassisCache(backend)
        self._blocks_by_system = blocks_by_system
        self._systems_by_block = systems_by_block(blocks_by_system)
        self._system_ids = system_ids

    async def block(self, uri: str, body: Any = None) -> list[_BlockResult]:
        """The devices of one block, or Rejected entries for its bad parts, or one
        :class:`_ServerOwned` when the block is a server's (then nothing else).

        ``body`` is the block as an expanded collection member, if the service sent it so;
        resources expanded inside it are used instead of being read again. Processors are
        read first: a CPU among them makes the block server-owned, and its memory, NICs and
        storage are then not read at all.
        """
        inline = inline_resources(body)

        async def read(item_uri: str) -> Any:
            found = inline.get(norm_uri(item_uri))
            return await self._backend._read_item(item_uri) if found is None else found

        try:
            block = parse_block(await read(uri) if body is None else body, uri)
        except BadItem as err:
            return [Rejected(uri, f"resource block: {err.reason}", err.kind)]
        reason = server_owned_reason(block, self._backend._server_patterns)
        if reason is not None:
            self._backend._server_owned[block.uri] = reason
            return [_ServerOwned(block.uri, reason)]

        async def fetch(item: tuple[DeviceSource, str]) -> tuple[DeviceSource, str, Any]:
            source, device_uri = item
            try:
                return source, device_uri, await read(device_uri)
            except BadItem as err:
                return source, device_uri, err

        processors = [d for d in block.device_links if d[0] is DeviceSource.PROCESSOR]
        fetched = await self._backend._gather(fetch, processors)
        cpu = next((u for _, u, payload in fetched if is_cpu(payload)), None)
        if cpu is not None:
            reason = f"it holds CPU {cpu}"
            self._backend._server_owned[block.uri] = reason
            return [_ServerOwned(block.uri, reason)]
        if all(not isinstance(payload, BadItem) for _, _, payload in fetched):
            self._backend._server_owned[block.uri] = None
        results: list[_BlockResult] = []
        device_links = [d for d in block.device_links if d[0] is not DeviceSource.PROCESSOR]
        known = {device_uri for _, device_uri in block.device_links}
        for storage_uri in block.storage:
            try:
                drives = storage_drive_links(await read(storage_uri), storage_uri)
            except BadItem as err:
                results.append(Rejected(storage_uri, f"storage: {err.reason}", err.kind))
                continue
            for drive in drives:
                if drive not in known:
                    known.add(drive)
                    device_links.append((DeviceSource.DRIVE, drive))
        simple_storage = block.simple_storage
        if not fetched and not device_links and not simple_storage:
            return results

        async def fetch_simple(storage_uri: str) -> tuple[str, Any]:
            try:
                return storage_uri, await read(storage_uri)
            except BadItem as err:
                return storage_uri, err

        fetched += await self._backend._gather(fetch, device_links)
        fetched_simple = await self._backend._gather(fetch_simple, simple_storage)
        try:
            location = await self._location(block, fetched)
        except BadItem as err:
            bad = [device_uri for _, device_uri, _ in fetched] + list(simple_storage)
            return results + [Rejected(u, f"location: {err.reason}", err.kind) for u in bad]
        holders = block_hosts(
            block, self._blocks_by_system, self._system_ids, index=self._systems_by_block
        )
        context = DeviceContext(block, location, holders[0] if holders else None)
        for source, device_uri, payload in fetched:
            if isinstance(payload, BadItem):
                results.append(Rejected(device_uri, f"device: {payload.reason}", payload.kind))
                continue
            try:
                device = parse_device(payload, device_uri, source, context)
            except BadItem as err:
                results.append(Rejected(device_uri, f"device: {err.reason}", err.kind))
                continue
            if device is not None:
                results.append(device)
        for storage_uri, payload in fetched_simple:
            if isinstance(payload, BadItem):
                results.append(Rejected(storage_uri, f"storage: {payload.reason}", payload.kind))
                continue
            try:
                entries = parse_simple_storage(payload, storage_uri, context)
            except BadItem as err:
                results.append(Rejected(storage_uri, f"storage: {err.reason}", err.kind))
                continue
            for entry in entries:
                if isinstance(entry, FabricDevice):
                    results.append(entry)
                else:
                    vendor_id, problem = entry
                    results.append(Rejected(vendor_id, f"device: {problem.reason}", problem.kind))
        return results

    async def _location(
        self, block: BlockInfo, fetched: Sequence[tuple[DeviceSource, str, Any]]
    ) -> Location:
        chassis_uri = block.chassis[0] if block.chassis else None
        if chassis_uri is None:
            # No chassis on the block: use the first device's own Links.Chassis.
            for _, _, payload in fetched:
                if isinstance(payload, Mapping):
                    try:
                        device_chassis = obj(payload, "Links").get("Chassis")
                        if isinstance(device_chassis, list):
                            device_chassis = device_chassis[0] if device_chassis else None
                        if device_chassis is not None:
                            chassis_uri = link(device_chassis, "Links.Chassis")
                            break
                    except BadItem:
                        continue
        chain = await self._chassis.chain(chassis_uri) if chassis_uri else []
        return location_from_chain(chain, fabric=block.fabric)


def _bad_members(uri: str, page: CollectionPage) -> list[Rejected]:
    return [
        Rejected(f"{uri}#/Members/{index}", f"collection member: {reason}", "bad-type")
        for index, reason in page.bad_members
    ]


def _expanded(member: Any) -> tuple[str, Mapping[str, Any]] | None:
    """(URI, body) of a collection member the service expanded, else None (a plain link)."""
    if not isinstance(member, Mapping):
        return None
    uri = member.get("@odata.id")
    if not isinstance(uri, str) or not any(not key.startswith("@") for key in member):
        return None
    return uri, member


@dataclass(frozen=True, slots=True)
class _ServerOwned:
    """A block the walk found to be a server's: no devices, reported in ``local_units``."""

    uri: str
    reason: str


_BlockResult = FabricDevice | Rejected | _ServerOwned


class _Collector:
    """One listing's devices, gathered block by block in collection order.

    * A device that two ResourceBlocks link under one URI is rejected (kind ``duplicate``),
      every copy: a device is composed through one block, and there is no telling which
      block the service really attaches it with (Redfish ResourceBlock
      ``Processors``/``Memory``/``Drives`` link the block's own devices).
    * With identity ``serial`` / ``uuid`` (:func:`app.fabric.redfish_parse.device_identity`),
      a device whose identity an earlier device already has is the same physical device
      under another URI: the first in collection order is kept, the others are rejected as
      ``duplicate`` naming both URIs.
    """

    def __init__(self, identity: IdentityMode, rejected: list[Rejected]) -> None:
        self._identity: IdentityMode = identity
        self._devices: dict[str, FabricDevice] = {}
        self._rejected = rejected
        self._duplicates: set[str] = set()
        self._by_identity: dict[str, str] = {}
        self._local: dict[str, None] = {}

    def add(self, results: Iterable[_BlockResult]) -> None:
        for result in results:
            if isinstance(result, Rejected):
                self._rejected.append(result)
            elif isinstance(result, _ServerOwned):
                self._local.setdefault(result.uri, None)
            else:
                self._add_device(result)

    def _add_device(self, device: FabricDevice) -> None:
        vendor_id = device.vendor_id
        if vendor_id in self._duplicates:
            return
        first = self._devices.get(vendor_id)
        if first is not None:
            if first.attach_unit != device.attach_unit:
                del self._devices[vendor_id]
                self._duplicates.add(vendor_id)
                self._rejected.append(Rejected(
                    vendor_id, f"device is linked from two blocks ({first.attach_unit} and "
                    f"{device.attach_unit}): duplicate, left out", "duplicate"))
            return
        key = device_identity(device, self._identity)
        if key is not None:
            kept = self._by_identity.get(key)
            if kept is not None and kept in self._devices:
                self._rejected.append(Rejected(
                    vendor_id, f"device {vendor_id} has the {self._identity} of {kept} "
                    f"(one physical device reached through two blocks): duplicate, listed "
                    f"once as {kept}", "duplicate"))
                return
            self._by_identity[key] = vendor_id
        self._devices[vendor_id] = device

    def listing(self) -> Listing[FabricDevice]:
        return Listing(
            tuple(self._devices.values()), tuple(self._rejected), tuple(self._local)
        )


def _decode(raw: bytes) -> Any:
    """The JSON in a body, or None when there is none or it is not JSON."""
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def _error_body(raw: bytes) -> Any:
    """An error body for :func:`~app.fabric.redfish_parse.error_from_response`: its JSON,
    else its text (a plain-text or HTML answer), else None when empty."""
    decoded = _decode(raw)
    if decoded is not None or not raw.strip():
        return decoded
    return raw[:4096].decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class _TaskEnd:
    """How a followed task ended: its operation (COMPLETED or FAILED), the monitor's last
    body, and for a failure answered with an error status, the error to raise."""

    operation: Operation
    body: Any
    error: FabricError | None


def _what(block_uri: str, host_id: str, attach: bool) -> str:
    if attach:
        return f"attach {block_uri} to host {host_id!r}"
    return f"detach {block_uri} from host {host_id!r}"


def _is_task_answer(response: _Response) -> bool:
    """True for a write answer that hands over a task: 202 (DSP0266 "Asynchronous
    operations"), or a 200/201 whose body is a Task still running (seen in the wild)."""
    if response.status == 202:
        return True
    if not is_task(response.body):
        return False
    try:
        return parse_task(response.body, "").state is OperationState.RUNNING
    except FabricInvalidData:
        return False


def _task_outcome(response: _Response, monitor: str) -> Operation:
    """A monitor's answer as an operation: a Task body decides by its TaskState whatever the
    status (a 200 with a running Task is RUNNING); else 202 is RUNNING and any other success
    COMPLETED (the monitor answers the operation's own final status, DSP0266)."""
    if is_task(response.body):
        return parse_task(response.body, monitor)
    if response.status == 202:
        return Operation(monitor, OperationState.RUNNING)
    return Operation(monitor, OperationState.COMPLETED)


def _task_error(body: Any, what: str, operation: Operation) -> FabricError:
    ids = message_ids(body)
    known = classify_message_ids(ids)
    error_class, code = known if known is not None else (FabricError, ids[0] if ids else None)
    return error_class(
        f"{what}: task {operation.op_id} failed: {operation.message or 'no message'}",
        vendor_code=code,
    )


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The most telling error in a task group's failure: auth first, then any fabric error."""
    leaves: list[BaseException] = []

    def collect(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                collect(inner)
        else:
            leaves.append(error)

    collect(group)
    for wanted in (FabricAuthError, FabricError):
        for leaf in leaves:
            if isinstance(leaf, wanted):
                return leaf
    return leaves[0] if leaves else group
