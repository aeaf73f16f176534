"""Building the Kubernetes API client, and one JSON call helper shared by the kube layer.

A :class:`KubeClient` owns a kubernetes-asyncio ``ApiClient`` built from a frozen
:class:`KubeClientSettings`: in-cluster (service-account token file and CA), a kubeconfig file
(optionally a context), or a URL with an optional bearer token file and CA bundle. Nothing is
read from the environment here; :meth:`KubeClientSettings.in_cluster` takes the environment
mapping from its caller.

Bearer tokens read from a file are re-read every ``token_refresh_s`` seconds, because the kubelet
rotates projected service-account tokens in place (client-go's ``transport/token_source.go``
caches the file for one minute the same way).

``Warning`` headers of every answer :func:`call_json` reads are logged, once per distinct
message (:class:`WarningLog`): a field the server dropped from one of our writes (an unknown
field under the default ``fieldValidation=Warn``) must not pass unseen.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import yaml
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import load_kube_config
from yarl import URL

from app.jsontypes import JsonDict, loads_json
from app.kube.errors import KubeError, KubeInvalidResponse, error_from_status, translate_error

# The kubelet mounts these into every pod with a service account
# (https://kubernetes.io/docs/tasks/run-application/access-api-from-pod/).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


logger = logging.getLogger(__name__)

# fieldValidation values (k8s.io/apimachinery pkg/apis/meta/v1 types.go): our own writes that
# must not lose a field silently send Strict.
FIELD_VALIDATION_STRICT = "Strict"


class KubeAuthMode(StrEnum):
    """How the client finds the API server and authenticates."""

    IN_CLUSTER = "in-cluster"
    KUBECONFIG = "kubeconfig"
    URL = "url"


@dataclass(frozen=True)
class KubeClientSettings:
    """How to reach the Kubernetes API server.

    Attributes:
        mode: which of the fields below apply.
        url: API server base URL (``https://10.0.0.1:443``); required for ``url`` and
            ``in-cluster``.
        token_file: bearer token file (``url``: optional; ``in-cluster``: the service-account
            token).
        ca_file: CA bundle to verify the server with (``url``, ``in-cluster``).
        verify_tls: False turns certificate verification off (tests and demos only).
        kubeconfig: kubeconfig path (``kubeconfig``).
        context: kubeconfig context; None means the file's current context.
        token_refresh_s: re-read the token file at most this often, seconds (>= 0).
        user_agent: sent with every request.
        connection_pool_size: most concurrent connections to the server (watches count).
        request_timeout_s: the longest a request that names no timeout of its own may take,
            seconds (finite, > 0): discovery, reads and writes. Watches and lists name their
            own. kubernetes-asyncio's default is none at all, so a server that accepts the
            connection and never answers would hold the caller (start-up, a worker) forever.
    """

    mode: KubeAuthMode
    url: str | None = None
    token_file: Path | None = None
    ca_file: Path | None = None
    verify_tls: bool = True
    kubeconfig: Path | None = None
    context: str | None = None
    token_refresh_s: float = 60.0
    user_agent: str = "fabric-dra"
    connection_pool_size: int = 64
    request_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.mode in (KubeAuthMode.URL, KubeAuthMode.IN_CLUSTER) and not self.url:
            raise ValueError(f"kube client ({self.mode}): url is required")
        if self.mode is KubeAuthMode.IN_CLUSTER and self.token_file is None:
            raise ValueError("kube client (in-cluster): token_file is required")
        if self.mode is KubeAuthMode.KUBECONFIG and self.kubeconfig is None:
            raise ValueError("kube client (kubeconfig): kubeconfig path is required")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"kube client: url must start with http:// or https://: {self.url}")
        if self.token_refresh_s < 0:
            raise ValueError("kube client: token_refresh_s must be >= 0")
        if self.connection_pool_size < 1:
            raise ValueError("kube client: connection_pool_size must be >= 1")
        if not 0 < self.request_timeout_s < math.inf:
            raise ValueError(
                f"kube client: request_timeout_s must be a finite number > 0, "
                f"not {self.request_timeout_s}"
            )

    @classmethod
    def in_cluster(
        cls, environ: Mapping[str, str], *, service_account_dir: Path = SERVICE_ACCOUNT_DIR
    ) -> KubeClientSettings:
        """Settings for a pod: host and port from ``KUBERNETES_SERVICE_HOST`` /
        ``KUBERNETES_SERVICE_PORT`` in ``environ`` (pass ``os.environ``), token and CA from the
        mounted service account (client-go ``rest.InClusterConfig``).

        Raises:
            KubeError: the variables are missing or empty.
        """
        host = environ.get("KUBERNETES_SERVICE_HOST", "")
        port = environ.get("KUBERNETES_SERVICE_PORT", "")
        if not host or not port:
            raise KubeError(
                "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be "
                "set (is this running in a pod?)"
            )
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        return cls(
            mode=KubeAuthMode.IN_CLUSTER,
            url=f"https://{host}:{port}",
            token_file=service_account_dir / "token",
            ca_file=service_account_dir / "ca.crt",
        )


class _TokenFile:
    """Reads a bearer token file and re-reads it when it may have been rotated."""

    def __init__(self, path: Path, refresh_s: float, now: Callable[[], float]) -> None:
        self._path = path
        self._refresh_s = refresh_s
        self._now = now
        self._token: str | None = None
        self._read_at = float("-inf")

    def token(self) -> str:
        """The current token; re-read from the file once ``refresh_s`` has passed.

        Raises:
            KubeError: the file is missing or empty at the first read. A failed re-read keeps the
                last good token (the kubelet swaps the file atomically, but a read may race it).
        """
        now = self._now()
        if self._token is None or now - self._read_at >= self._refresh_s:
            try:
                # A small tmpfs read; blocking the loop for it is cheaper than a thread hop.
                text = self._path.read_text(encoding="utf-8").strip()
            except OSError as err:
                if self._token is None:
                    raise KubeError(f"bearer token file {self._path}: {err}") from err
                text = ""
            if text:
                self._token = text
                self._read_at = now
            elif self._token is None:
                raise KubeError(f"bearer token file {self._path} is empty")
        return self._token

    def refresh_hook(self, configuration: Configuration) -> None:
        """``Configuration.refresh_api_key_hook``: called before every authenticated request."""
        configuration.api_key["BearerToken"] = self.token()
        configuration.api_key_prefix["BearerToken"] = "Bearer"


class JsonApiClient(ApiClient):
    """A kubernetes-asyncio ``ApiClient`` that sends JSON request bodies as they are.

    Before every request ``ApiClient.sanitize_for_serialization`` walks the body and builds a
    copy of every dict and list in it, to turn model objects and datetimes into JSON values.
    This project's bodies are JSON values already (objects read as raw JSON, see
    :func:`call_json`, and dicts built from strings, numbers, booleans and lists), so a dict
    is passed on unchanged: the walk was about a tenth of the controller's CPU per request.
    Anything else (a model object, a list of query parameters) still goes through the
    library's conversion. A dict that holds a model object or a datetime is a programming
    error: ``json.dumps`` refuses it, and :func:`call_json` reports it as a
    :class:`KubeError`.
    """

    default_timeout: aiohttp.ClientTimeout | None = None
    """The timeout of a request that names none (see ``KubeClientSettings.request_timeout_s``);
    None leaves kubernetes-asyncio's (no timeout)."""

    def sanitize_for_serialization(self, obj: Any) -> Any:
        if type(obj) is dict:
            return obj
        return super().sanitize_for_serialization(obj)

    def request(
        self,
        method: str,
        url: str,
        query_params: Any = None,
        headers: Any = None,
        post_params: Any = None,
        body: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        """``ApiClient.request`` with :attr:`default_timeout` for a request that names none."""
        return super().request(
            method,
            url,
            query_params=query_params,
            headers=headers,
            post_params=post_params,
            body=body,
            _preload_content=_preload_content,
            _request_timeout=(
                self.default_timeout if _request_timeout is None else _request_timeout
            ),
        )


class KubeClient:
    """Owns a kubernetes-asyncio ``ApiClient``; close it with :meth:`close` or ``async with``.

    Build one with :func:`connect`. ``api`` is the ``ApiClient`` to pass to the typed API classes
    (``ResourceV1Api(client.api)``).
    """

    def __init__(self, api: ApiClient, settings: KubeClientSettings) -> None:
        self.api = api
        self.settings = settings
        self._closed = False

    @property
    def host(self) -> str:
        """The API server base URL in use."""
        return str(self.api.configuration.host)

    async def close(self) -> None:
        """Close the HTTP session. Idempotent."""
        if not self._closed:
            self._closed = True
            await self.api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _check_kubeconfig(path: Path) -> None:
    """Fail with the real problem where kubernetes-asyncio would say something misleading: it
    reads a missing file as an empty config ("Expected key current-context") and an empty or
    non-mapping document with a TypeError.

    Raises:
        KubeError: one line naming ``path``.
    """
    if not path.exists():
        raise KubeError(f"kubeconfig {path}: no such file")
    if path.is_dir():
        raise KubeError(f"kubeconfig {path}: is a directory, not a kubeconfig file")
    try:
        # A small file, read once at start; blocking the loop for it is fine.
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as err:
        # Not the error's text: it quotes the offending line, which may hold a token.
        where = f" at line {err.problem_mark.line + 1}" if err.problem_mark else ""
        raise KubeError(f"kubeconfig {path}: invalid YAML{where}: {err.problem}") from err
    except RecursionError:
        raise KubeError(f"kubeconfig {path}: nested too deeply to read") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise KubeError(f"kubeconfig {path}: {_one_line(err)}") from err
    if not isinstance(document, dict):
        raise KubeError(f"kubeconfig {path}: not a kubeconfig (empty, or not a YAML mapping)")
    problem = kubeconfig_shape_problem(document)
    if problem is not None:
        raise KubeError(f"kubeconfig {path}: {problem}")


# The named lists of a kubeconfig and the mapping each entry holds, with the fields of that
# mapping that are text (k8s.io/client-go/tools/clientcmd/api/v1/types.go: Config,
# NamedCluster/Cluster, NamedAuthInfo/AuthInfo, NamedContext/Context). client-go's strict
# decoding refuses any other type there ("cannot unmarshal number into Go struct field").
_KUBECONFIG_LISTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "clusters": (
        "cluster",
        ("server", "certificate-authority", "certificate-authority-data", "tls-server-name"),
    ),
    "users": (
        "user",
        (
            *("token", "tokenFile", "client-certificate", "client-certificate-data"),
            *("client-key", "client-key-data"),
        ),
    ),
    "contexts": ("context", ("cluster", "user", "namespace")),
}


def kubeconfig_shape_problem(document: Mapping[str, Any]) -> str | None:
    """What in a kubeconfig's ``document`` has a type client-go would refuse, in one phrase
    (``clusters[0].cluster.server is a number, not text``), or None.

    kubernetes-asyncio reads such a file without checking and fails later with an
    ``AssertionError`` or an ``AttributeError`` that names nothing; this names the field.
    Only the fields fabric-dra's connection uses are checked, with their types from
    k8s.io/client-go/tools/clientcmd/api/v1/types.go.
    """
    current = document.get("current-context")
    if current is not None and not isinstance(current, str):
        return f"current-context is {_yaml_type(current)}, not text"
    for field, (inner, texts) in _KUBECONFIG_LISTS.items():
        entries = document.get(field)
        if entries is None:
            continue
        if not isinstance(entries, list):
            return f"{field} is {_yaml_type(entries)}, not a list of {{name, {inner}}} entries"
        for index, entry in enumerate(entries):
            where = f"{field}[{index}]"
            if not isinstance(entry, dict):
                return f"{where} is {_yaml_type(entry)}, not a {{name, {inner}}} mapping"
            if not isinstance(entry.get("name"), str):
                return f"{where}.name is {_yaml_type(entry.get('name'))}, not text"
            body = entry.get(inner)
            if body is None:
                continue
            if not isinstance(body, dict):
                return f"{where}.{inner} is {_yaml_type(body)}, not a mapping"
            for key in texts:
                if key in body and not isinstance(body[key], str):
                    return f"{where}.{inner}.{key} is {_yaml_type(body[key])}, not text"
    return None


def _yaml_type(value: Any) -> str:
    """A YAML value's kind as a person reads it: ``a number``, ``a list``, ``missing``..."""
    if value is None:
        return "missing or null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


async def build_configuration(
    settings: KubeClientSettings, *, now: Callable[[], float] = time.monotonic
) -> Configuration:
    """Build the kubernetes-asyncio ``Configuration`` for ``settings``.

    Raises:
        KubeError: the kubeconfig or the token file cannot be used.
    """
    # type.__call__ skips Configuration's process-wide default copy: nothing global leaks in.
    configuration: Configuration = type.__call__(Configuration)
    if settings.mode is KubeAuthMode.KUBECONFIG:
        assert settings.kubeconfig is not None
        path = settings.kubeconfig
        _check_kubeconfig(path)
        try:
            await load_kube_config(
                config_file=str(path),
                context=settings.context,
                client_configuration=configuration,
                persist_config=False,
            )
        except Exception as err:
            raise KubeError(f"kubeconfig {path}: {_one_line(err)}") from err
        if settings.ca_file is not None:
            configuration.ssl_ca_cert = str(settings.ca_file)
        if not settings.verify_tls:
            configuration.verify_ssl = False
    else:
        assert settings.url is not None
        configuration.host = settings.url.rstrip("/")
        configuration.verify_ssl = settings.verify_tls
        if settings.ca_file is not None:
            configuration.ssl_ca_cert = str(settings.ca_file)
        if settings.token_file is not None:
            token_file = _TokenFile(settings.token_file, settings.token_refresh_s, now)
            token_file.refresh_hook(configuration)  # fail early on a missing or empty file
            configuration.refresh_api_key_hook = token_file.refresh_hook
    configuration.connection_pool_maxsize = settings.connection_pool_size
    return configuration


async def connect(
    settings: KubeClientSettings, *, now: Callable[[], float] = time.monotonic
) -> KubeClient:
    """Build a :class:`KubeClient` for ``settings`` (no request is sent yet).

    Args:
        settings: where the server is and how to authenticate.
        now: monotonic clock for the token re-read interval.

    Raises:
        KubeError: the configuration cannot be used (missing kubeconfig, token file, ...).
    """
    configuration = await build_configuration(settings, now=now)
    api = JsonApiClient(configuration=configuration)
    api.user_agent = settings.user_agent
    api.default_timeout = aiohttp.ClientTimeout(total=settings.request_timeout_s)
    _proxy_from_environment_once(api)
    return KubeClient(api, settings)


def _proxy_from_environment_once(api: ApiClient) -> None:
    """Look the proxy for the API server up once instead of on every request.

    kubernetes-asyncio opens its aiohttp session with ``trust_env=True``, so every request
    looks up ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` and reads ``~/.netrc``, each in a
    worker thread: two thread hops and a file read per request, a large share of a claim's
    cost. The environment does not change while the process runs: the proxy it names for the
    server (client-go's ``ProxyFromEnvironment`` rule) is resolved here and passed with every
    request, and the per-request lookups are turned off. ``.netrc`` credentials are never used
    for the API server (authentication is by token or certificate).
    """
    rest = api.rest_client
    session = rest.pool_manager
    if not hasattr(session, "_trust_env"):
        return  # another aiohttp: leave its behaviour alone
    if not rest.proxy:
        try:
            proxy, proxy_auth = get_env_proxy_for_url(URL(str(api.configuration.host)))
        except LookupError:
            proxy, proxy_auth = None, None
        if proxy is not None:
            rest.proxy = str(proxy)
            if proxy_auth is not None:
                rest.proxy_headers = {"Proxy-Authorization": proxy_auth.encode()}
    session._trust_env = False


def parse_warning_header(value: str) -> list[tuple[int, str, str]]:
    """The ``(code, agent, text)`` warnings of one ``Warning`` header value.

    RFC 7234 section 5.5 as k8s.io/apimachinery pkg/util/net/http.go ParseWarningHeader reads
    it: ``299 - "text"`` with ``\\`` escapes, an optional quoted date, several warnings
    separated by commas. Parsing stops at the first malformed warning (the ones before it are
    kept), as client-go does.
    """
    out: list[tuple[int, str, str]] = []
    rest = value.strip()
    while rest:
        parts = rest.split(" ", 2)
        if len(parts) != 3 or not (len(parts[0]) == 3 and parts[0].isdigit()) or not parts[1]:
            break
        code, agent, quoted = int(parts[0]), parts[1], parts[2]
        if not 100 <= code <= 299 or not quoted.startswith('"'):
            break
        text: list[str] = []
        index, escaping, closed = 1, False, False
        while index < len(quoted):
            char = quoted[index]
            index += 1
            if escaping:
                text.append(char)
                escaping = False
            elif char == "\\":
                escaping = True
            elif char == '"':
                closed = True
                break
            else:
                text.append(char)
        if not closed:
            break
        out.append((code, agent, "".join(text)))
        rest = quoted[index:].strip()
        if rest.startswith('"'):  # warn-date
            end = rest.find('"', 1)
            if end < 0:
                break
            rest = rest[end + 1 :].strip()
        if rest and not rest.startswith(","):
            break
        rest = rest[1:].strip()
    return out


class WarningLog:
    """Logs API ``Warning`` headers at WARNING level, each distinct message once.

    client-go's default handler (k8s.io/client-go rest/warnings.go WarningLogger) logs every
    code-299 warning; kubectl deduplicates (WarningWriterOptions.Deduplicate). A controller
    repeats the same writes, so we deduplicate, remembering the last ``remember`` messages so
    that a long-running process does not grow without bound.
    """

    def __init__(self, log: logging.Logger = logger, remember: int = 1024) -> None:
        self._log = log
        self._remember = remember
        self._seen: OrderedDict[str, None] = OrderedDict()

    def handle(self, header_values: Iterable[str], what: str) -> list[str]:
        """Log the code-299 warnings of ``header_values`` not logged before, naming ``what``
        (the call, e.g. ``"update ResourceSlice x"``); returns the messages logged."""
        logged: list[str] = []
        for value in header_values:
            for code, _agent, text in parse_warning_header(value):
                if code != 299 or not text:
                    continue
                if text in self._seen:
                    self._seen.move_to_end(text)
                    continue
                self._seen[text] = None
                if len(self._seen) > self._remember:
                    self._seen.popitem(last=False)
                self._log.warning(
                    "%s: the API server warned: %s",
                    what,
                    text,
                    extra={"api_warning": text, "api_call": what},
                )
                logged.append(text)
        return logged


# The process-wide handler, as client-go has one (rest.SetDefaultWarningHandler).
_warning_log = WarningLog()


async def call_json(
    call: Awaitable[Any], what: str, *, warnings: WarningLog | None = None
) -> JsonDict:
    """Await a typed API call made with ``_preload_content=False`` and return its JSON body.

    Working on the raw JSON keeps every field the server sent (the generated models drop fields
    they do not know, and re-serialise timestamps in their own way).

    Args:
        call: e.g. ``api.read_namespaced_lease(name, ns, _preload_content=False)``.
        what: what is being done, for error messages (``"read Lease kube-system/x"``).
        warnings: where the answer's ``Warning`` headers go (default: the process-wide
            :class:`WarningLog`); they are logged for error answers too.

    Raises:
        KubeError: the matching subclass for an error status, a transport error or a body that
            is not a JSON object (temporary ones have ``retryable`` set).
    """
    try:
        response = await call
    except Exception as err:
        raise translate_error(err, what) from err
    if not isinstance(response, aiohttp.ClientResponse):
        raise KubeInvalidResponse(
            f"{what}: expected a raw response (call with _preload_content=False), "
            f"got {type(response).__name__}"
        )
    try:
        body = await response.read()
    except Exception as err:
        raise translate_error(err, what) from err
    finally:
        response.release()
    (warnings or _warning_log).handle(response.headers.getall("Warning", []), what)
    if not 200 <= response.status <= 299:
        raise error_from_status(response.status, what, body=body, headers=response.headers)
    try:
        data = loads_json(body)
    except ValueError as err:
        raise KubeInvalidResponse(f"{what}: the answer is not JSON") from err
    if not isinstance(data, dict):
        raise KubeInvalidResponse(f"{what}: the answer is not a JSON object")
    return data
