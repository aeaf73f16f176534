"""HTTP to one Redfish service: the one request function, sessions, retries, concurrency.

Every call goes through :meth:`RedfishTransport.request`: authentication (a login session's
``X-Auth-Token``, renewed once on 401, or Basic credentials), TLS, the per-call timeout, the
concurrency limit, redirects refused, and error answers mapped to typed errors
(:func:`app.fabric.redfish.parse.errors.error_from_response`). Error bodies without a Redfish
error object (``{"message": ...}``, plain text) still give their text to the error message.

Retries (tenacity, exponential backoff with jitter): GETs on any
:class:`~app.fabric.errors.FabricUnavailable` except TLS failures; writes only when nothing can
have happened (the connection was never made, or the service answered 429/503, honouring
``Retry-After``). A write whose outcome is unknown is never resent here: the caller reads the
state again (:mod:`app.fabric.redfish.composition`).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import logging
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

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
    FabricError,
    FabricInvalidData,
    FabricTimeout,
    FabricUnavailable,
)
from app.fabric.redfish.parse.errors import error_from_response
from app.fabric.redfish.parse.headers import parse_retry_after

logger = logging.getLogger(__name__)

T = TypeVar("T")
U = TypeVar("U")

AuthMode = Literal["session", "basic", "none"]
SESSIONS = "/redfish/v1/SessionService/Sessions"
LOGOUT_TIMEOUT_S = 3.0
"""How long closing waits for the login session's DELETE, seconds (best effort)."""


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


class RequestNotSent(FabricUnavailable):
    """The connection could not be made: the request never reached the service."""


class ServiceBusy(FabricUnavailable):
    """The service answered 429 or 503: it did nothing and asks to be called later."""

    def __init__(
        self, message: str, *, status: int, vendor_code: str | None, retry_after: float | None
    ) -> None:
        super().__init__(message, status=status, vendor_code=vendor_code)
        self.retry_after = retry_after


class TlsFailure(FabricUnavailable):
    """TLS verification failed; retrying cannot help until the configuration changes."""


# OpenSSL's reasons when the server's first bytes are not a TLS record: a plain-HTTP server
# answering the ClientHello (``WRONG_VERSION_NUMBER`` up to OpenSSL 3.1, ``record layer
# failure`` or ``packet length too long`` in others, ``http request`` for an HTTP reply).
_NOT_TLS_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"}
)


class _Secret:
    """A string that never shows itself in repr or str."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class Response:
    """A 1xx or 2xx answer: its status, headers and decoded JSON body (None when empty)."""

    status: int
    headers: CIMultiDictProxy[str]
    body: Any


class RedfishTransport:
    """Requests to one Redfish service over aiohttp.

    Args:
        base_url: the service origin, ``https://host[:port]`` (no path, no user info).
        username, password: credentials (plain values the caller has read); never logged,
            never in messages or repr.
        auth: ``session`` (``POST /redfish/v1/SessionService/Sessions``, ``X-Auth-Token``,
            renewed once on 401, deleted on :meth:`close`), ``basic`` or ``none``.
        verify_tls: verify the service's certificate.
        ca_file: a PEM CA bundle to verify against instead of the system store.
        timeout_s: per HTTP call, in seconds.
        max_concurrency: HTTP calls in flight at once.
        session: an aiohttp session to use (not closed by :meth:`close`); else one is made on
            first use and owned.
        retry: see :class:`RetrySettings`.

    Attributes:
        retries: retries by reason, for metrics (``transient`` here; the composition adds
            ``precondition`` and ``unknown-outcome``): they are handled inside a call and
            would otherwise leave no trace.

    Raises:
        ValueError: a malformed base URL, an unknown auth mode, missing credentials, an
            unreadable CA bundle, a non-positive timeout or concurrency, or no attempts.
    """

    def __init__(
        self,
        base_url: str,
        *,
        username: str | None,
        password: str | None,
        auth: AuthMode,
        verify_tls: bool,
        ca_file: str | Path | None,
        timeout_s: float,
        max_concurrency: int,
        session: aiohttp.ClientSession | None,
        retry: RetrySettings | None,
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
        if max_concurrency < 1 or timeout_s <= 0:
            raise ValueError("max_concurrency and timeout_s must be positive")
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
        self.retries: collections.Counter[str] = collections.Counter()
        if self._retry.attempts < 1:
            raise ValueError("retry.attempts must be at least 1")
        self._token: str | None = None
        self._session_uri: str | None = None
        self._login_lock = asyncio.Lock()
        self._closed = False

    @property
    def origin(self) -> URL:
        """The service origin (scheme, host, port)."""
        return self._origin

    @property
    def auth(self) -> AuthMode:
        """The authentication mode."""
        return self._auth

    @property
    def retry(self) -> RetrySettings:
        """How calls are retried."""
        return self._retry

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise FabricError(f"redfish backend for {self._origin} is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_concurrency)
            )
        return self._session

    def path(self, ref: str) -> str:
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

    def _tls_problem(self, err: aiohttp.ClientError) -> str:
        """What went wrong in the TLS handshake, without aiohttp's text (it holds the repr of
        the SSL context object)."""
        if isinstance(err, aiohttp.ClientConnectorCertificateError):
            cert_error = err.certificate_error
            reason = getattr(cert_error, "verify_message", None) or getattr(
                cert_error, "reason", None
            )
            return (
                f"TLS verification of {self._origin} failed ({reason or type(cert_error).__name__}"
                "); configure the CA bundle that signed its certificate"
            )
        ssl_error = getattr(err, "os_error", err)
        reason = str(getattr(ssl_error, "reason", None) or "")
        if reason in _NOT_TLS_REASONS:
            return (
                f"{self._origin} did not answer in TLS ({reason}): is it a plain-HTTP server? "
                "Then configure an http:// URL"
            )
        return f"TLS handshake with {self._origin} failed ({reason or type(ssl_error).__name__})"

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
            raise TlsFailure(f"{context}: {self._tls_problem(err)}") from err
        except aiohttp.ClientConnectorError as err:
            raise RequestNotSent(f"{context}: cannot connect to {self._origin}: {err}") from err
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
            self._session_uri = None if location is None else self.path(location)
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

    async def request(
        self,
        method: str,
        ref: str,
        *,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """The one request function: auth, error mapping and JSON decoding.

        Returns:
            A 1xx or 2xx answer, with its JSON body decoded (None when empty).

        Raises:
            FabricError: a subclass for every failure (see
                :func:`app.fabric.redfish.parse.errors.error_from_response`); 429/503 answers are
                ``ServiceBusy`` (a FabricUnavailable) with the ``Retry-After`` delay;
                FabricInvalidData for a success body that is not JSON, or a redirect.
        """
        path = self.path(ref)
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
                raise ServiceBusy(
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
            return Response(status, response_headers, None)
        try:
            decoded = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise FabricInvalidData(
                f"{context}: HTTP {status} body is not valid JSON ({err})", status=status
            ) from err
        return Response(status, response_headers, decoded)

    def _wait(self, state: RetryCallState) -> float:
        # The first try ran before the loop (see _with_retries): the loop's try 1 is the
        # call's try 2.
        error = state.outcome.exception() if state.outcome is not None else None
        return self._wait_after(error, state.attempt_number + 1)

    def _wait_after(self, error: BaseException | None, attempt: int) -> float:
        """Seconds to wait after try number ``attempt`` failed with ``error``: the
        service's ``Retry-After`` (capped) on a 429/503, else :meth:`backoff`."""
        if isinstance(error, ServiceBusy) and error.retry_after is not None:
            return min(error.retry_after, self._retry.max_retry_after_s)
        return self.backoff(attempt)

    def backoff(self, attempt: int) -> float:
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
        :meth:`app.fabric.redfish.reader.ResourceReader.read_item`)."""

        def count(_state: Any) -> None:
            self.retries["transient"] += 1

        # The loop starts at the call's second try (see _with_retries).
        most = stop_after_attempt(self._retry.attempts - 1)

        def stop(state: RetryCallState) -> bool:
            if most(state):
                return True
            error = state.outcome.exception() if state.outcome is not None else None
            return item and isinstance(error, FabricUnavailable) and error.status == 500

        return AsyncRetrying(
            stop=stop,
            wait=self._wait,
            retry=retry_if_exception(retryable),
            reraise=True,
            before_sleep=count,
        )

    async def get(self, ref: str, *, item: bool = False) -> Response:
        """GET with retries on FabricUnavailable (not on TLS failures); with ``item``, an
        HTTP 500 is retried once only."""
        return await self._with_retries(
            lambda err: isinstance(err, FabricUnavailable) and not isinstance(err, TlsFailure),
            lambda: self.request("GET", ref),
            item=item,
        )

    async def write(
        self, method: str, ref: str, body: Any, headers: Mapping[str, str] | None = None
    ) -> Response:
        """A write, retried only when the service cannot have acted on it."""
        return await self._with_retries(
            lambda err: isinstance(err, RequestNotSent | ServiceBusy),
            lambda: self.request(method, ref, json_body=body, headers=headers),
        )

    async def _with_retries(
        self,
        retryable: Callable[[BaseException], bool],
        call: Callable[[], Awaitable[Response]],
        *,
        item: bool = False,
    ) -> Response:
        """``call()``, tried up to ``RetrySettings.attempts`` times while it fails with an
        error ``retryable`` accepts (see :meth:`_retrying`). The first try runs outside
        tenacity: most calls succeed at once, and building the retry loop for each of them
        cost more than the request's own bookkeeping."""
        try:
            return await call()
        except Exception as err:
            if self._retry.attempts <= 1 or not retryable(err):
                raise
            first = err
        self.retries["transient"] += 1
        await asyncio.sleep(self._wait_after(first, 1))

        async def again() -> Response:  # tenacity awaits coroutine functions only
            return await call()

        retrying = self._retrying(retryable, item=item)
        return await retrying(again)

    async def stream_lines(
        self, ref: str, *, last_event_id: str | None, idle_timeout_s: float
    ) -> AsyncIterator[str]:
        """GET ``ref`` as a ``text/event-stream`` and yield its lines (decoded as UTF-8,
        line endings removed) until the service ends the stream. The first line yielded is an
        empty one, as soon as the service has answered with the stream.

        The stream has an HTTP session of its own, so that it holds none of the connections
        the listings and attaches share; it authenticates as every request does (a session
        token is renewed once on 401). ``Last-Event-ID`` is sent when given (DSP0266: the
        service may replay what was missed).

        Raises:
            FabricError: the stream could not be opened (the same classes as :meth:`request`:
                401/403 FabricAuthError, 404 FabricNotFound, ...), the answer is not an event
                stream (FabricInvalidData), or the connection failed or stayed silent for
                ``idle_timeout_s`` seconds (FabricUnavailable, FabricTimeout).
        """
        path = self.path(ref)
        context = f"GET {path} (event stream)"
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        if self._auth == "basic":
            headers["Authorization"] = self._basic.value
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self._timeout.total, sock_read=idle_timeout_s
        )
        token = await self._ensure_token() if self._auth == "session" else None
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for renewal in (False, True):
                if token is not None:
                    headers["X-Auth-Token"] = token
                try:
                    async with http.get(
                        self._origin.join(URL(path, encoded=True)),
                        headers=headers,
                        ssl=self._ssl,
                        allow_redirects=False,
                    ) as response:
                        if response.status == 401 and token is not None and not renewal:
                            token = await self._renew(token)
                            continue
                        if response.status >= 400:
                            body = _error_body(await response.read())
                            raise error_from_response(response.status, body, context=context)
                        kind = response.headers.get("Content-Type", "")
                        if response.status != 200 or not kind.startswith("text/event-stream"):
                            raise FabricInvalidData(
                                f"{context}: HTTP {response.status} {kind or 'no content type'}"
                                " is not an event stream",
                                status=response.status,
                            )
                        yield ""  # open: an empty line, which no event stream parser acts on
                        async for raw in response.content:
                            yield raw.decode("utf-8", errors="replace").rstrip("\r\n")
                        return
                except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError) as err:
                    raise TlsFailure(f"{context}: {self._tls_problem(err)}") from err
                except aiohttp.ClientConnectorError as err:
                    raise RequestNotSent(
                        f"{context}: cannot connect to {self._origin}: {err}"
                    ) from err
                except TimeoutError as err:
                    raise FabricTimeout(
                        f"{context}: nothing received for {idle_timeout_s} s"
                    ) from err
                except aiohttp.ClientError as err:
                    raise FabricUnavailable(
                        f"{context}: {err.__class__.__name__}: {self._redact(str(err))}"
                    ) from err

    async def close(self, logout_timeout_s: float | None = None) -> None:
        """Delete the login session (best effort, given up after ``logout_timeout_s``
        seconds, :data:`LOGOUT_TIMEOUT_S` by default: the service expires an idle session by
        itself) and close the owned HTTP session.

        Safe to call twice.
        """
        if self._closed:
            return
        if logout_timeout_s is None:
            logout_timeout_s = LOGOUT_TIMEOUT_S
        try:
            if self._token is not None and self._session_uri is not None:
                try:
                    async with asyncio.timeout(logout_timeout_s):
                        status, _, _ = await self._send(
                            "DELETE", self._session_uri, headers={"X-Auth-Token": self._token}
                        )
                    if status >= 400 and status != 404:
                        logger.info("redfish logout from %s: HTTP %s", self._origin, status)
                except TimeoutError:
                    logger.info(
                        "redfish logout from %s: no answer within %.0f s; the session is left "
                        "to expire",
                        self._origin,
                        logout_timeout_s,
                    )
                except (FabricError, RuntimeError) as err:
                    # RuntimeError: an injected session that its owner closed already.
                    logger.info("redfish logout from %s failed: %s", self._origin, err)
        finally:
            self._token = None
            self._closed = True
            if self._owns_session and self._session is not None:
                await self._session.close()
            self._session = None


async def gather(func: Callable[[T], Coroutine[Any, Any, U]], items: Iterable[T]) -> list[U]:
    """``func`` over ``items`` concurrently, results in the order of ``items``; the first error
    cancels the rest and is raised as itself (not as an exception group)."""
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


def _decode(raw: bytes) -> Any:
    """The JSON in a body, or None when there is none or it is not JSON."""
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def _error_body(raw: bytes) -> Any:
    """An error body for :func:`~app.fabric.redfish.parse.errors.error_from_response`: its JSON,
    else its text (a plain-text or HTML answer), else None when empty."""
    decoded = _decode(raw)
    if decoded is not None or not raw.strip():
        return decoded
    return raw[:4096].decode("utf-8", "replace")


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
