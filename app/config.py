"""Settings: one validated model read from a YAML file, the environment and flags.

Precedence, lowest to highest: built-in defaults, the YAML file (``--config`` or
``FABRIC_DRA_CONFIG``), environment variables ``FABRIC_DRA_<SECTION>__<NAME>`` (for example
``FABRIC_DRA_FABRIC__URL``; top-level settings have no section: ``FABRIC_DRA_DRIVER_NAME``), and
command-line flags. Everything is validated once at start; a bad value raises
:class:`ConfigError` with one line naming the setting, where the value came from, what is wrong
and the expected form.

Where the values come from (the file, the environment, flags) and how a bad one is reported is
:mod:`app.configload` (:func:`app.configload.load_settings`); this module is the model.

Secrets never travel in settings values: the settings hold *paths* to files, and
:func:`read_secret` reads them at start into :class:`pydantic.SecretStr`, which never prints.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.aio import UVLOOP_MISSING, EventLoopChoice, uvloop_installed

ENV_PREFIX = "FABRIC_DRA_"
ENV_CONFIG_FILE = "FABRIC_DRA_CONFIG"
# FABRIC_DRA_ variables that are not settings: the operator commands' own (the admin endpoint
# and its token, see app.commands.actions) and the test suite's and benchmarks'. The settings
# loader passes them by, so that one shell can hold them and run every command.
ENV_NOT_SETTINGS = frozenset({ENV_CONFIG_FILE, "FABRIC_DRA_ADMIN_URL", "FABRIC_DRA_TOKEN_FILE"})
ENV_NOT_SETTINGS_PREFIXES = (
    "FABRIC_DRA_TEST_",
    "FABRIC_DRA_BENCH_",
    "FABRIC_DRA_CRASH_",
    "FABRIC_DRA_CDIM_CRASH_",
    "FABRIC_DRA_SOAK_",
    "FABRIC_DRA_SHARED_DATA",
)
NESTED_DELIMITER = "__"
MAX_SECRET_BYTES = 64 * 1024

# Kubernetes rules (k8s.io/apimachinery pkg/util/validation): a DNS-1123 subdomain is at most
# 253 characters of lowercase alphanumerics, '-' and '.', starting and ending alphanumeric; a
# label-key name part is at most 63 characters of alphanumerics, '-', '_' and '.'.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

_USERINFO = re.compile(r"://[^/@\s]*@")

_NOT_HTTP = "does not start with http:// or https://"

# Why controller.mode both is refused (app/modes.py has the long form, with discovery).
MODE_BOTH_REFUSED = (
    "is refused: no Kubernetes release serves both modes (structured parameters need "
    "resource.k8s.io v1, v1beta2 or v1beta1, Kubernetes 1.32 and later; the control-plane mode "
    "needs v1alpha3 with podschedulingcontexts, Kubernetes 1.31 only); use auto, structured or "
    "control-plane"
)

LocationKey = Literal[
    "region", "zone", "site", "row", "rack", "fabric", "fabric_zone", "chassis", "manager"
]
MANAGER_NAME_MAX = 32
"""The longest fabric manager name: it is stored in every device row (``devices.backend``)."""


class ConfigError(Exception):
    """A setting is missing or invalid. The message is one line meant for a person."""


def http_origin_problem(value: str) -> str | None:
    """What is wrong with ``value`` as an HTTP(S) server origin, or None when nothing is.

    An origin is ``http://`` or ``https://``, a host (a name, an IPv4 address or a bracketed
    IPv6 address), an optional port from 1 to 65535, and nothing more: no user information,
    path (a single trailing ``/`` is allowed), query or fragment, and no surrounding spaces.

    Returns:
        A phrase that follows the value in a message (``"has a port out of range (1 to
        65535)"``), or None.
    """
    from urllib.parse import urlsplit

    if value != value.strip():
        return "has leading or trailing whitespace"
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as err:
        # urlsplit: "Invalid IPv6 URL"; .port: "Port out of range 0-65535" or not a number.
        if "Port" in str(err) or "port" in str(err):
            return "has an invalid port (an integer from 1 to 65535)"
        return f"is not a valid URL ({err})"
    if parts.scheme not in ("http", "https"):
        return _NOT_HTTP
    if not parts.hostname:
        return "has no host"
    if any(c.isspace() for c in value):
        return "contains whitespace"
    if "@" in parts.netloc:
        return "carries user information; give credentials in their own settings"
    if port is not None and not 1 <= port <= 65535:
        return "has an invalid port (an integer from 1 to 65535)"
    if parts.path not in ("", "/"):
        return f"has a path ({parts.path!r}); give the server's origin only"
    if parts.query or value.rstrip("/").endswith("?"):
        return "has a query; give the server's origin only"
    if parts.fragment or "#" in value:
        return "has a fragment; give the server's origin only"
    return None


def _detail(problem: str) -> str:
    # The scheme problem is what "is not an http:// or https:// ..." already says.
    return "" if problem == _NOT_HTTP else f": it {problem}"


def _driver_name(value: str) -> str:
    """Check a DRA driver name: a lowercase DNS subdomain of at most 63 characters.

    Source: k8s.io/kubernetes pkg/apis/resource/validation (validateDriverName).
    """
    if len(value) > 63:
        raise ValueError(f"is {len(value)} characters long, at most 63 are allowed")
    if not _DNS_SUBDOMAIN.match(value):
        raise ValueError("is not a lowercase DNS subdomain")
    return value


def is_label_key(value: str) -> bool:
    """True when ``value`` is a valid Kubernetes label key (``[prefix/]name``).

    Source: k8s.io/apimachinery pkg/util/validation (IsQualifiedName): the prefix is a DNS
    subdomain of at most 253 characters, the name at most 63 characters.
    """
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _label_key(value: str) -> str:
    if not is_label_key(value):
        raise ValueError("is not a valid Kubernetes label key")
    return value


def _split_list(value: Any) -> Any:
    """Accept a list given as one string: JSON (``["a", "b"]``) or comma-separated."""
    if isinstance(value, str):
        if value.lstrip().startswith("["):
            try:
                return json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError("is neither a JSON list nor a comma-separated list") from err
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def _url_without_path(value: str | None) -> str | None:
    """An http(s) URL without a path (``kube.url``, ``node.controller_url``), without its
    trailing slash; None stays None."""
    if value is None:
        return None
    problem = http_origin_problem(value)
    if problem is not None:
        raise ValueError(f"is not an http:// or https:// URL without a path{_detail(problem)}")
    return value.rstrip("/")


def _condition_type(value: str) -> str:
    # Source: k8s.io/apimachinery metav1 validation of Condition.type (a qualified name).
    if not is_label_key(value):
        raise ValueError("is not a valid condition type (a qualified name)")
    return value


DriverName = Annotated[str, AfterValidator(_driver_name)]
ConditionType = Annotated[str, AfterValidator(_condition_type)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
Seconds = Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads YAML's true as 1: admin.port: true would listen on port 1.
        name = info.field_name
        field = cls.model_fields.get(name) if name is not None else None
        if isinstance(value, bool) and field is not None and field.annotation in (int, float):
            raise ValueError("is a boolean (true or false), not a number")
        return value


class DatabaseSettings(_Section):
    """Where the inventory and reservation journal live."""

    url: str = Field(
        default="sqlite+aiosqlite:///fabric-dra.db",
        description="a SQLAlchemy URL: sqlite+aiosqlite:///path.db or "
        "postgresql+asyncpg://user@host:5432/db",
    )
    migrate_on_start: bool = Field(
        default=True, description="true or false: upgrade the schema to head when starting"
    )
    pool_size: int = Field(default=5, ge=1, le=100, description="an integer from 1 to 100")

    @field_validator("url")
    @classmethod
    def _async_driver(cls, value: str) -> str:
        """Normalise plain ``sqlite://`` and ``postgresql://`` URLs to their async drivers."""
        scheme, sep, rest = value.partition("://")
        if not sep or not rest:
            raise ValueError("is not a URL")
        normalised = {
            "sqlite": "sqlite+aiosqlite",
            "sqlite+aiosqlite": "sqlite+aiosqlite",
            "postgresql": "postgresql+asyncpg",
            "postgres": "postgresql+asyncpg",
            "postgresql+asyncpg": "postgresql+asyncpg",
        }.get(scheme)
        if normalised is None:
            raise ValueError(f"uses the unsupported scheme {scheme!r}")
        url = f"{normalised}://{rest}"
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:  # not a number, or beyond 65535
            raise ValueError("has a port that is not a number from 1 to 65535") from None
        if port == 0:
            raise ValueError("has a port that is not a number from 1 to 65535")
        if normalised == "sqlite+aiosqlite" and parts.path in ("", "/", "/:memory:"):
            # app.db.engine.make_engine refuses it too: one shared connection breaks isolation.
            raise ValueError("names an in-memory SQLite database; give a file path")
        return url


def _manager_name(value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) > MANAGER_NAME_MAX or not _DNS_LABEL.match(value):
        raise ValueError(f"is not a lowercase DNS label of at most {MANAGER_NAME_MAX} characters")
    return value


class FabricSettings(_Section):
    """A fabric manager to inventory and to attach through."""

    name: Annotated[str | None, AfterValidator(_manager_name)] = Field(
        default=None,
        description="a lowercase DNS label of at most 32 characters naming this fabric "
        "manager, e.g. hall-a; stored with every device (default: the kind, redfish)",
    )
    kind: Literal["redfish", "cdim"] = Field(
        default="redfish",
        description="redfish (a Redfish CompositionService) or cdim (NEC CDIM's "
        "configuration-manager and layout-apply)",
    )
    url: str | None = Field(
        default=None,
        description="the fabric manager's origin, without a path, e.g. https://fm.example:443",
    )
    auth: Literal["session", "basic", "none"] = Field(
        default="session", description="session, basic or none"
    )
    username_file: Path | None = Field(
        default=None, description="path of a file holding the user name"
    )
    password_file: Path | None = Field(
        default=None, description="path of a file holding the password"
    )
    ca_bundle: Path | None = Field(
        default=None, description="path of a PEM file of CA certificates to trust"
    )
    tls_verify: bool = Field(
        default=True, description="true or false: verify the fabric manager's TLS certificate"
    )
    timeout_seconds: Seconds = Field(default=30.0, description="seconds per HTTP call, > 0")
    concurrency: int = Field(default=8, ge=1, le=256, description="an integer from 1 to 256")
    retry_attempts: int = Field(default=4, ge=1, le=20, description="an integer from 1 to 20")
    task_timeout_seconds: Seconds = Field(
        default=300.0, description="seconds to wait for a long-running attach or detach, > 0"
    )
    server_owned_blocks: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="a list (JSON or comma-separated) of fnmatch patterns of ResourceBlock Ids "
        "or URIs that belong to a server and are never devices, e.g. *-compute",
    )
    verify_poll_seconds: Seconds = Field(
        default=0.2,
        description="seconds between reads while an attach or detach the fabric "
        "reported as done is not visible yet, > 0",
    )
    verify_timeout_seconds: Seconds = Field(
        default=10.0,
        description="seconds an attach or detach the fabric reported as done may "
        "take to become visible, > 0",
    )
    device_identity: Literal["uri", "serial", "uuid"] = Field(
        default="uri",
        description="uri, serial or uuid: what makes two listed devices one physical device",
    )
    token_file: Path | None = Field(
        default=None,
        description="path of a file holding a bearer token (cdim: for the gateway in front "
        "of the installation)",
    )
    path_prefix: str = Field(
        default="",
        max_length=200,
        pattern=r"^(/?[A-Za-z0-9._~-]+)*/?$",
        description="cdim: a gateway path before /cdim/api/v1, e.g. /gw, or empty",
    )
    procedure_fields: Literal["oss", "product"] = Field(
        default="oss",
        description="cdim: the layout-apply procedure's CPU and device fields: oss "
        "(targetCPUID, targetDeviceID) or product (sourceDeviceID, destinationDeviceID)",
    )
    batch_window_seconds: float = Field(
        default=0.05,
        ge=0,
        le=10,
        description="cdim: seconds an attach or detach waits for others to share its apply "
        "(0: one apply each), from 0 to 10",
    )
    busy_timeout_seconds: Seconds = Field(
        default=120.0,
        description="cdim: seconds to keep trying an apply the installation refuses as busy "
        "(another apply runs), > 0",
    )
    cache_lag_seconds: Seconds = Field(
        default=900.0,
        description="cdim: seconds the inventory cache may lag behind an apply; for that long "
        "a device the controller connected or disconnected is taken to be where the apply "
        "put it, > 0",
    )

    @property
    def manager(self) -> str:
        """The manager's name: ``name``, or the kind when unnamed."""
        return self.name or self.kind

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = http_origin_problem(value)
        if problem is not None:
            raise ValueError(f"is not an http:// or https:// origin{_detail(problem)}")
        return value.rstrip("/")

    @field_validator("server_owned_blocks", mode="before")
    @classmethod
    def _pattern_list(cls, value: Any) -> Any:
        return _split_list(value)


class InventorySettings(_Section):
    """How often and how patiently the inventory is read from the fabric manager."""

    poll_interval_seconds: Seconds = Field(default=60.0, description="seconds, > 0")
    stale_after_failures: int = Field(
        default=3, ge=1, le=1000, description="failed syncs in a row before the inventory is stale"
    )
    events: bool = Field(
        default=True,
        description="true or false: follow the fabric manager's event stream (Redfish "
        "server-sent events) and sync at once on a change; polling stays as the safety net",
    )
    events_poll_interval_seconds: Seconds = Field(
        default=600.0,
        description="seconds between full polls while the event stream is healthy, > 0",
    )
    events_idle_seconds: Seconds = Field(
        default=600.0,
        description="seconds an event stream may stay silent before it is opened again, > 0",
    )


class PublishingSettings(_Section):
    """How the ResourceSlice publisher keeps the API server's slices right."""

    debounce_seconds: Seconds = Field(
        default=0.2,
        description="seconds a pool waits after a change before it is written, so that a "
        "burst of changes makes one write, > 0",
    )

    resync_period_seconds: Seconds = Field(
        default=600.0,
        description="seconds between full resyncs (every slice listed again, every pool "
        "checked; no write when nothing changed), > 0; upstream's 10 minutes by default",
    )


class PoolSettings(_Section):
    """How devices are grouped into DRA pools."""

    grouping_keys: Annotated[tuple[LocationKey, ...], NoDecode] = Field(
        default=("region", "rack"),
        description="a non-empty list of location keys without repeats, from: region, zone, "
        "site, row, rack, fabric, fabric_zone, chassis, manager",
    )
    mix_managers: bool = Field(
        default=False,
        description="true or false: with several fabric managers, let devices of different "
        "managers share a pool when the grouping keys alone match (by default the manager "
        "is the first grouping key)",
    )

    binds_to_node: bool = Field(
        default=True,
        description="true or false: devices carry bindsToNode and binding conditions (KEP-5007)",
    )
    binding_conditions: Annotated[tuple[ConditionType, ...], NoDecode] = Field(
        default=("FabricDeviceReady",),
        description="1 to 4 condition types the scheduler waits for before binding",
    )
    binding_failure_conditions: Annotated[tuple[ConditionType, ...], NoDecode] = Field(
        default=("FabricDeviceFailed",),
        description="1 to 4 condition types that make the scheduler give the device back",
    )
    unhealthy: Literal["taint", "withhold"] = Field(
        default="taint",
        description="taint (publish with a NoSchedule taint) or withhold (leave out of slices)",
    )
    unknown_health: Literal["taint", "withhold", "offer"] = Field(
        default="taint",
        description="taint, withhold or offer: what to do with a device whose health the "
        "fabric manager does not report (missing, null, empty or unknown Status.Health)",
    )

    @field_validator(
        "grouping_keys", "binding_conditions", "binding_failure_conditions", mode="before"
    )
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("grouping_keys", "binding_conditions", "binding_failure_conditions")
    @classmethod
    def _non_empty_unique(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("is empty")
        if len(set(value)) != len(value):
            raise ValueError("repeats an entry")
        return value

    @field_validator("binding_conditions", "binding_failure_conditions")
    @classmethod
    def _at_most_four(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Source: KEP-5007, ResourceSlice device validation (BindingConditionsMaxSize = 4).
        if len(value) > 4:
            raise ValueError(f"has {len(value)} entries, at most 4 are allowed")
        return value

    @model_validator(mode="after")
    def _no_overlap(self) -> PoolSettings:
        both = set(self.binding_conditions) & set(self.binding_failure_conditions)
        if both:
            raise ValueError(
                f"pools.binding_conditions and pools.binding_failure_conditions share "
                f"{sorted(both)}; a condition type may be in one list only"
            )
        return self


class NodeLabelSettings(_Section):
    """Which node label carries each location key (there is no standard rack label)."""

    region: LabelKey = Field(default="topology.kubernetes.io/region", description="a label key")
    zone: LabelKey = Field(default="topology.kubernetes.io/zone", description="a label key")
    site: LabelKey = Field(default="fabric-dra.io/site", description="a label key")
    row: LabelKey = Field(default="fabric-dra.io/row", description="a label key")
    rack: LabelKey = Field(default="fabric-dra.io/rack", description="a label key")
    fabric: LabelKey = Field(default="fabric-dra.io/fabric", description="a label key")
    fabric_zone: LabelKey = Field(default="fabric-dra.io/fabric-zone", description="a label key")
    chassis: LabelKey = Field(default="fabric-dra.io/chassis", description="a label key")
    manager: LabelKey = Field(default="fabric-dra.io/fabric-manager", description="a label key")

    def for_key(self, key: str) -> str:
        """The node label key that carries location ``key`` (one of :data:`LocationKey`)."""
        value = getattr(self, key)
        assert isinstance(value, str)
        return value


class KubeSettings(_Section):
    """How to reach the Kubernetes API server."""

    mode: Literal["in-cluster", "kubeconfig", "url"] = Field(
        default="in-cluster",
        description="in-cluster (the pod's service account), kubeconfig or url",
    )
    url: str | None = Field(
        default=None, description="the API server's URL for mode url, e.g. https://10.0.0.1:6443"
    )
    token_file: Path | None = Field(
        default=None, description="path of a file holding a bearer token (mode url)"
    )
    ca_bundle: Path | None = Field(
        default=None, description="path of a PEM CA bundle for the API server (mode url)"
    )
    tls_verify: bool = Field(
        default=True, description="true or false: verify the API server's certificate"
    )
    kubeconfig: Path | None = Field(default=None, description="kubeconfig path (mode kubeconfig)")
    context: str | None = Field(default=None, description="kubeconfig context name")
    resource_api_version: Literal["auto", "v1", "v1beta2", "v1beta1"] = Field(
        default="auto",
        description="auto (from discovery: v1, then v1beta2, then v1beta1) or a fixed version",
    )
    request_timeout_seconds: Seconds = Field(
        default=30.0,
        description="the longest one API request may take (watches and lists excepted: they "
        "have their own), seconds, a number > 0 and at most 86400",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return _url_without_path(value)

    @model_validator(mode="after")
    def _mode_complete(self) -> KubeSettings:
        if self.mode == "url" and self.url is None:
            raise ValueError("kube.mode is url but kube.url is not set")
        if self.mode == "kubeconfig" and self.kubeconfig is None:
            raise ValueError("kube.mode is kubeconfig but kube.kubeconfig is not set")
        return self


class HostMappingSettings(_Section):
    """How a Kubernetes node is matched to a fabric host (a Redfish ComputerSystem)."""

    match: Literal["hostname", "label", "annotation", "provider_id", "serial"] = Field(
        default="hostname",
        description="hostname (node name or kubernetes.io/hostname label = the host's HostName, "
        "short names allowed), label or annotation (its value = host id), provider_id "
        "(spec.providerID ends with the host id), or serial (the label or annotation's value = "
        "the host's serial number, e.g. a CDIM CPU's)",
    )
    key: LabelKey = Field(
        default="fabric-dra.io/host-id",
        description="the label or annotation key holding the host id (for label or annotation) "
        "or its serial number (for serial)",
    )


class AdminSettings(_Section):
    """The admin HTTP endpoint: health, readiness, metrics, status API and dashboard."""

    host: str = Field(default="0.0.0.0", description="an address to bind, e.g. 0.0.0.0")
    port: int = Field(default=8080, ge=0, le=65535, description="a TCP port, 0 to 65535")
    token_file: Path | None = Field(
        default=None,
        description="path of a file holding the bearer token for admin actions (none: the "
        "actions are refused)",
    )
    require_token_for_reads: bool = Field(
        default=False, description="true or false: the status API also needs the token"
    )
    max_request_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="largest request body in bytes, 1024 to 16777216",
    )
    history_window_seconds: Seconds = Field(
        default=3600.0,
        description="seconds of the recent past the dashboard charts, > 0, at most 86400",
    )
    history_interval_seconds: Seconds = Field(
        default=30.0, description="seconds between two samples of the dashboard's charts, > 0"
    )

    @model_validator(mode="after")
    def _history_fits(self) -> AdminSettings:
        if self.history_window_seconds < self.history_interval_seconds:
            raise ValueError(
                "admin.history_window_seconds must be at least admin.history_interval_seconds"
            )
        return self


class LeaderSettings(_Section):
    """Leader election on a coordination.k8s.io/v1 Lease: only the leader writes."""

    enabled: bool = Field(default=True, description="true or false")
    namespace: str | None = Field(
        default=None,
        description="the Lease's namespace (default: the pod's namespace, else default)",
    )
    lease_name: str = Field(default="fabric-dra", description="a DNS subdomain")
    identity: str | None = Field(
        default=None, description="this replica's identity (default: hostname and a random id)"
    )
    lease_duration_seconds: Seconds = Field(default=15.0, description="seconds, > 0")
    renew_deadline_seconds: Seconds = Field(default=10.0, description="seconds, > 0")
    retry_period_seconds: Seconds = Field(default=2.0, description="seconds, > 0")

    @model_validator(mode="after")
    def _ordered(self) -> LeaderSettings:
        # client-go's rule: leaseDuration > renewDeadline > retryPeriod.
        if not (
            self.lease_duration_seconds > self.renew_deadline_seconds > self.retry_period_seconds
        ):
            raise ValueError(
                "leader: lease_duration_seconds > renew_deadline_seconds > "
                "retry_period_seconds is required"
            )
        return self


class ControllerSettings(_Section):
    """What the controller does with claims."""

    mode: Literal["structured", "control-plane", "auto"] = Field(
        default="structured",
        description="structured (the scheduler allocates), control-plane (classic DRA), or auto "
        "(from discovery)",
    )
    workers: int = Field(default=8, ge=1, le=256, description="claims processed at once, 1-256")
    orphan_grace_seconds: Seconds = Field(
        default=60.0,
        description="seconds a device may stay attached with no claim holding it before it "
        "is detached",
    )
    detach_unmanaged: bool = Field(
        default=False,
        description="true or false: also detach devices the fabric reports attached with no "
        "reservation behind them (else they are only reported)",
    )
    detach_attempts: int = Field(
        default=15,
        ge=1,
        le=100,
        description="transient detach failures in a row before a reservation ends "
        "detach-failed, 1-100",
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _not_both(cls, value: Any) -> Any:
        # Refused here, before any connection, with the reason (app/modes.py refuses it too,
        # for callers that bypass the settings).
        if value == "both":
            raise ValueError(MODE_BOTH_REFUSED)
        return value


class NodePluginSettings(_Section):
    """The node plugin (``fabric-dra node``): the kubelet's DRA plugin on every node.

    Defaults are the kubelet's (``--root-dir`` /var/lib/kubelet) and upstream's
    ``k8s.io/dynamic-resource-allocation/kubeletplugin`` helper's: the registration socket
    ``<plugin_registry_dir>/<driver>-reg.sock``, the DRA socket
    ``<plugins_dir>/<driver>/dra.sock``.
    """

    node_name: str | None = Field(
        default=None,
        description="this node's name (default: the NODE_NAME environment variable, set from "
        "the downward API)",
    )
    plugin_registry_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins_registry"),
        description="the kubelet's plugin watcher directory (registration socket)",
    )
    plugins_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins"),
        description="the kubelet's plugins directory; the DRA socket and the checkpoint go in "
        "<plugins_dir>/<driver>/",
    )
    cdi_dir: Path = Field(default=Path("/var/run/cdi"), description="where CDI specs are written")
    host_root: Path = Field(
        default=Path("/"),
        description="where the host's /sys, /proc and /dev are seen (sysfs is read-only)",
    )
    device_wait_seconds: Seconds = Field(
        default=30.0,
        description="seconds a prepare waits for an attached device to be ready and to show up "
        "on the host (capped by the kubelet's deadline)",
    )
    device_poll_seconds: Seconds = Field(
        default=0.5, description="seconds between looks while waiting, > 0"
    )
    pci_rescan: bool = Field(
        default=False,
        description="true or false: write 1 to /sys/bus/pci/rescan when an attached device is "
        "not seen yet (needs a writable /sys)",
    )
    hook: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="a command run after a device is found, before its CDI spec is written "
        "(e.g. a driver bind): a list of words, or one string split like a shell does; empty: "
        "none",
    )
    hook_timeout_seconds: Seconds = Field(default=60.0, description="seconds, > 0")
    health_interval_seconds: Seconds = Field(
        default=10.0, description="seconds between presence checks of prepared devices"
    )
    controller_url: str | None = Field(
        default=None,
        description="the controller's admin URL (http://host:port), asked for a claim's "
        "devices when the claim has no status.devices (Kubernetes 1.31)",
    )
    controller_token_file: Path | None = Field(
        default=None,
        description="path of a file holding the admin bearer token, when the controller's "
        "admin.require_token_for_reads is on",
    )
    allowed_host_paths: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="absolute host path prefixes a FabricDeviceConfig may mount (a list, or "
        "comma-separated); empty: mounts are refused",
    )
    health_port: int = Field(
        default=8081,
        ge=0,
        le=65535,
        description="TCP port of the node plugin's /healthz, /readyz and /metrics (0: any)",
    )
    health_host: str = Field(default="0.0.0.0", description="an address to bind")

    @field_validator("allowed_host_paths", mode="before")
    @classmethod
    def _paths(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("hook", mode="before")
    @classmethod
    def _command(cls, value: Any) -> Any:
        # A JSON list of words, or one string split as a POSIX shell splits it (no shell runs).
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return _split_list(value)
            try:
                return tuple(shlex.split(value))
            except ValueError as err:
                raise ValueError(f"is not a command line: {err}") from None
        return value

    @field_validator("allowed_host_paths")
    @classmethod
    def _absolute(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if not path.startswith("/") or "/../" in path + "/" or path.endswith("/.."):
                raise ValueError(f"holds {path!r}, which is not an absolute path without ..")
        return value

    @field_validator("controller_url")
    @classmethod
    def _controller_url(cls, value: str | None) -> str | None:
        return _url_without_path(value)


class LogSettings(_Section):
    """Logging."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="DEBUG, INFO, WARNING or ERROR"
    )
    json_format: bool = Field(default=False, description="true or false: one JSON object a line")

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class Settings(BaseSettings):
    """Every setting of fabric-dra. Build it with :func:`load_settings`, not directly."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
    )

    driver_name: DriverName = Field(
        default="fabric.example.com",
        description="a lowercase DNS subdomain of at most 63 characters, e.g. fabric.example.com",
    )
    event_loop: EventLoopChoice = Field(
        default="auto",
        description="auto (uvloop when installed, else asyncio), uvloop or asyncio",
    )
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    fabric: FabricSettings = Field(default_factory=FabricSettings)
    fabrics: tuple[FabricSettings, ...] = Field(
        default=(),
        description="a list of fabric managers, each a mapping of fabric settings with its "
        "own name, used instead of fabric",
    )
    inventory: InventorySettings = Field(default_factory=InventorySettings)
    pools: PoolSettings = Field(default_factory=PoolSettings)
    publisher: PublishingSettings = Field(default_factory=PublishingSettings)
    node_labels: NodeLabelSettings = Field(default_factory=NodeLabelSettings)
    hosts: HostMappingSettings = Field(default_factory=HostMappingSettings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    leader: LeaderSettings = Field(default_factory=LeaderSettings)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    node: NodePluginSettings = Field(default_factory=NodePluginSettings)
    log: LogSettings = Field(default_factory=LogSettings)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: Any, init_settings: Any, *args: Any, **kwargs: Any
    ) -> Any:
        # Layers are merged by load_settings so that errors can name where a value came
        # from; the model itself validates only what it is given.
        return (init_settings,)

    @field_validator("event_loop")
    @classmethod
    def _event_loop_installed(cls, value: EventLoopChoice) -> EventLoopChoice:
        if value == "uvloop" and not uvloop_installed():
            raise ValueError(UVLOOP_MISSING)
        return value

    @model_validator(mode="after")
    def _fabric_complete(self) -> Settings:
        if "fabrics" in self.model_fields_set and not self.fabrics:
            # An empty list given on purpose is a mistake (a template left empty, a list
            # whose entries were all removed), not a wish for the default fabric settings.
            raise ValueError(
                "fabrics is an empty list; give at least one fabric manager in it, or leave "
                "it out and give the one fabric manager as fabric"
            )
        if self.fabrics and self.fabric != FabricSettings():
            raise ValueError(
                "both fabric and fabrics are set; give one fabric manager as fabric, or "
                "several as fabrics"
            )
        for index, entry in enumerate(self.fabrics):
            if entry.name is None:
                raise ValueError(
                    f"fabrics[{index}] has no name; give each fabric manager in fabrics its own "
                    f"name (a lowercase DNS label, e.g. hall-a)"
                )
        names = [m.manager for m in self.managers]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(
                f"several entries of fabrics are named {repeated[0]!r}; give each fabric "
                f"manager its own name (unnamed ones are named after their kind)"
            )
        for manager in self.managers:
            if manager.password_file is not None and manager.username_file is None:
                raise ValueError(
                    f"{self.setting_of(manager)}.password_file is set but "
                    f"{self.setting_of(manager)}.username_file is not"
                )
        return self

    @property
    def managers(self) -> tuple[FabricSettings, ...]:
        """Every fabric manager: ``fabrics``, or the one ``fabric`` when that list is empty."""
        return self.fabrics or (self.fabric,)

    def setting_of(self, manager: FabricSettings) -> str:
        """How errors name ``manager``'s settings: ``fabric``, or ``fabrics[<name>]``."""
        return f"fabrics[{manager.manager}]" if self.fabrics else "fabric"

    def grouping_keys(self) -> tuple[str, ...]:
        """The location keys pools are grouped by: ``pools.grouping_keys``, with ``manager``
        first when several fabric managers are configured, unless ``pools.mix_managers`` is
        set or the keys name ``manager`` already."""
        keys: tuple[str, ...] = self.pools.grouping_keys
        if len(self.managers) > 1 and not self.pools.mix_managers and "manager" not in keys:
            return ("manager", *keys)
        return keys


def redact_url(text: str) -> str:
    """Hide the user information of every URL in ``text`` (``scheme://user:pw@host`` becomes
    ``scheme://***@host``), so that URLs can be shown in errors and logs."""
    return _USERINFO.sub("://***@", text)


def read_secret(path: Path, what: str) -> SecretStr:
    """Read a secret (password, token) from a file, stripping one trailing newline.

    Args:
        path: the file.
        what: the setting's name for error messages (the secret itself is never shown).

    Raises:
        ConfigError: the file is missing, unreadable, empty, larger than 64 KiB or not text.
    """
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"setting {what}: cannot read {str(path)!r}: {err.strerror}") from None
    if len(raw) > MAX_SECRET_BYTES:
        raise ConfigError(f"setting {what}: {str(path)!r} is larger than 64 KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"setting {what}: {str(path)!r} is not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise ConfigError(f"setting {what}: {str(path)!r} is empty")
    return SecretStr(text)
