"""List options, list pages, continue tokens and the per-watch filter that turns store events
into the events one watcher sees (k8s.io/apiserver pkg/storage/cacher semantics for selectors).

The list options are parsed, defaulted and validated as kube-apiserver's list/watch handler does
(k8s.io/apiserver pkg/endpoints/handlers/get.go listOpts; k8s.io/apimachinery
pkg/apis/meta/internalversion defaults.go SetListOptionsDefaults and validation/validation.go
ValidateListOptions; k8s.io/apiserver pkg/storage/interfaces.go ValidateListOptions).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .context import Cluster
from .conversion import convert
from .errors import Cause, StatusError, bad_request, expired, invalid
from .resources import RESOURCE_GROUP, ResourceType
from .selectors import FieldRequirement, Requirement, fields_match, labels_match
from .store import StoreEvent


@dataclass(frozen=True)
class ListResult:
    """A list page: ``items``, list ``resource_version``, ``continue_token`` ('' at the end),
    ``remaining`` items after this page (None when unknown).
    """

    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str
    remaining: int | None


@dataclass(frozen=True)
class WatchFilter:
    """What one watch wants: its resource type, namespace ('' = all), selectors."""

    rt: ResourceType
    namespace: str
    labels: Sequence[Requirement]
    fields: Sequence[FieldRequirement]

    def shown(self, obj: dict[str, Any]) -> dict[str, Any]:
        """``obj`` (stored in any version) as this watch's version shows it; the stored
        object itself when no conversion is needed (callers must not mutate it)."""
        if self.rt.group == RESOURCE_GROUP:
            return convert(obj, self.rt.version)
        return obj

    def matches(self, obj: dict[str, Any] | None) -> dict[str, Any] | None:
        """The object as the watcher sees it, or None when it does not match.

        Selectors are checked on the stored form and only matches are converted: the
        selectable fields (metadata, spec.driver, spec.nodeName) have the same path in every
        resource.k8s.io version (pkg/apis/resource/v1beta1/conversion.go field label
        conversion keeps them as they are).
        """
        if obj is None:
            return None
        meta = obj.get("metadata") or {}
        if self.namespace and meta.get("namespace", "") != self.namespace:
            return None
        if not labels_match(self.labels, meta.get("labels")):
            return None
        if not fields_match(self.fields, obj):
            return None
        return self.shown(obj)

    def render(self, event: StoreEvent) -> dict[str, Any] | None:
        """The watch event JSON for ``event``, or None to skip it. An object that starts or
        stops matching the selectors is reported as ADDED or DELETED, like the watch cache does.
        """
        current = self.matches(event.obj)
        if event.type == "MODIFIED":
            before = self.matches(event.old)
            if current is not None and before is None:
                return {"type": "ADDED", "object": current}
            if current is None and before is not None:
                return {"type": "DELETED", "object": self.shown(event.obj)}
        if current is None:
            return None
        return {"type": event.type, "object": current}


def encode_continue(rv: int, namespace: str, name: str) -> str:
    """An opaque continue token: base64 of the list version and the last key returned. A
    version of -1 continues at the latest version (k8s.io/apiserver pkg/storage/continue.go
    EncodeContinue)."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": [namespace, name]})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    """Decode a continue token into (version, last key); raises StatusError 400 when it is
    not one of ours or has version 0 (k8s.io/apiserver pkg/storage/continue.go
    DecodeContinue)."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        if data.get("v") != "meta.k8s.io/v1":
            raise ValueError("incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
        rv = int(data["rv"])
        if rv == 0:
            raise ValueError("incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
        return rv, (str(data["start"][0]), str(data["start"][1]))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, binascii.Error) as err:
        raise bad_request(f"invalid continue token: {err}") from err


# -- list options -----------------------------------------------------------------------------
EXACT = "Exact"
NOT_OLDER_THAN = "NotOlderThan"

# k8s.io/apiserver pkg/storage/cacher/watch_cache.go: blockTimeout and
# resourceVersionTooHighRetrySeconds.
FRESH_WAIT_S = 3.0
TOO_LARGE_RETRY_S = 1

# k8s.io/apiserver pkg/storage/etcd3/errors.go.
LIST_TOO_OLD = "The resourceVersion for the provided list is too old."
INCONSISTENT_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)


@dataclass(frozen=True)
class ListOptions:
    """The list/watch query options: ``watch``, ``resource_version`` ('' = none),
    ``resource_version_match`` ('' = none), ``send_initial_events`` (None = not given),
    ``continue_token`` ('' = none), ``limit`` (0 = none)."""

    watch: bool = False
    resource_version: str = ""
    resource_version_match: str = ""
    send_initial_events: bool | None = None
    continue_token: str = ""
    limit: int = 0


def watch_list_enabled(cluster: Cluster) -> bool:
    """The WatchList gate's default in kube-apiserver 1.<minor>: beta and on in 1.32, off
    again in 1.33, on from 1.34 (k8s.io/apiserver pkg/features/kube_features.go WatchList).
    A cluster can also switch it on by name."""
    return cluster.enabled("WatchList") or cluster.minor == 32 or cluster.minor >= 34


def query_bool(value: str | None) -> bool:
    """A boolean query parameter as the parameter codec converts it: absent is false, "0"
    and any casing of "false" are false, every other value (even "" and "x") is true
    (k8s.io/apimachinery pkg/runtime/conversion.go Convert_Slice_string_To_bool)."""
    if value is None:
        return False
    return not (value == "0" or value.lower() == "false")


_GO_INT_RE = re.compile(r"[+-]?[0-9]+")
_INT64_MAX = 2**63 - 1


def query_int(name: str, value: str) -> int:
    """An int64 query parameter (strconv.ParseInt base 10, k8s.io/apimachinery
    pkg/runtime/conversion.go Convert_Slice_string_To_int64); "" is 0.

    Raises StatusError 400 for text that is no decimal integer or is out of the int64 range
    (k8s.io/apiserver handlers/get.go: a DecodeParameters error is a BadRequest).
    """
    if not value:
        return 0
    if not value.isascii() or not _GO_INT_RE.fullmatch(value):
        raise bad_request(f'strconv.ParseInt: parsing "{value}": invalid syntax for {name}')
    number = int(value)
    if not -_INT64_MAX - 1 <= number <= _INT64_MAX:
        raise bad_request(f'strconv.ParseInt: parsing "{value}": value out of range for {name}')
    return number


def parse_list_options(query: Mapping[str, str], *, watch_list: bool) -> ListOptions:
    """The options of a list or watch request, defaulted as kube-apiserver does with the
    WatchList gate ``watch_list`` on (a watch from "" or "0" without sendInitialEvents and
    resourceVersionMatch gets sendInitialEvents=true, NotOlderThan: k8s.io/apimachinery
    pkg/apis/meta/internalversion/defaults.go SetListOptionsDefaults), then validated.

    Raises StatusError 400 for an unparsable value, 422 Invalid (ListOptions.meta.k8s.io) for
    a forbidden combination (:func:`list_option_causes`).
    """
    watch = query_bool(query.get("watch"))
    initial_value = query.get("sendInitialEvents")
    send_initial = query_bool(initial_value) if initial_value is not None else None
    limit = query_int("limit", query.get("limit", ""))
    query_int("timeoutSeconds", query.get("timeoutSeconds", ""))
    opts = ListOptions(
        watch,
        query.get("resourceVersion", ""),
        query.get("resourceVersionMatch", ""),
        send_initial,
        query.get("continue", ""),
        limit,
    )
    if (
        watch_list
        and opts.watch
        and opts.send_initial_events is None
        and not opts.resource_version_match
        and opts.resource_version in ("", "0")
    ):
        opts = ListOptions(
            opts.watch, opts.resource_version, NOT_OLDER_THAN, True, opts.continue_token, opts.limit
        )
    causes = list_option_causes(opts, watch_list=watch_list)
    if causes:
        raise invalid("ListOptions", "meta.k8s.io", "", causes)
    return opts


def _forbidden(field_name: str, detail: str) -> Cause:
    return Cause("FieldValueForbidden", f"Forbidden: {detail}", field_name)


def _not_supported(field_name: str, value: str, supported: Sequence[str]) -> Cause:
    quoted = ", ".join(json.dumps(v) for v in supported)
    return Cause(
        "FieldValueNotSupported",
        f"Unsupported value: {json.dumps(value)}: supported values: {quoted}",
        field_name,
    )


def list_option_causes(opts: ListOptions, *, watch_list: bool) -> list[Cause]:
    """The validation errors of ``opts``, in kube-apiserver's order and words
    (k8s.io/apimachinery pkg/apis/meta/internalversion/validation/validation.go
    ValidateListOptions and validateWatchOptions)."""
    match = opts.resource_version_match
    causes: list[Cause] = []
    if opts.watch:
        if opts.send_initial_events is not None:
            if match != NOT_OLDER_THAN:
                causes.append(
                    _forbidden(
                        "resourceVersionMatch",
                        "sendInitialEvents requires "
                        f"setting resourceVersionMatch to {NOT_OLDER_THAN}",
                    )
                )
            if not watch_list:
                causes.append(
                    _forbidden(
                        "sendInitialEvents",
                        "sendInitialEvents is forbidden "
                        "for watch unless the WatchList feature gate is "
                        "enabled",
                    )
                )
        if match:
            if opts.send_initial_events is None:
                causes.append(
                    _forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is "
                        "forbidden for watch unless sendInitialEvents is "
                        "provided",
                    )
                )
            if match != NOT_OLDER_THAN:
                causes.append(_not_supported("resourceVersionMatch", match, [NOT_OLDER_THAN]))
            if opts.continue_token:
                causes.append(
                    _forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden when continue is provided",
                    )
                )
        return causes
    if match:
        if not opts.resource_version:
            causes.append(
                _forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            )
        if opts.continue_token:
            causes.append(
                _forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                )
            )
        if match not in (EXACT, NOT_OLDER_THAN):
            causes.append(
                _not_supported("resourceVersionMatch", match, [EXACT, NOT_OLDER_THAN, ""])
            )
        if match == EXACT and opts.resource_version == "0":
            causes.append(
                _forbidden(
                    "resourceVersionMatch",
                    'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                )
            )
    if opts.send_initial_events is not None:
        causes.append(_forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"))
    return causes


def _go_parse_uint(value: str) -> int | None:
    # strconv.ParseUint: decimal digits only.
    return int(value) if value.isascii() and value.isdigit() else None


def parse_list_resource_version(opts: ListOptions) -> int:
    """The list's resourceVersion as a number (0 for "" and "0") after the storage layer's
    checks (k8s.io/apiserver pkg/storage/interfaces.go ValidateListOptions): 400 for a
    resourceVersion other than "0" with a continue token, 400 for an unparsable one.
    """
    rv = opts.resource_version
    if opts.continue_token:
        decode_continue(opts.continue_token)
        if rv not in ("", "0"):
            raise bad_request("specifying resource version is not allowed when using continue")
        return 0
    if rv in ("", "0"):
        return 0
    number = _go_parse_uint(rv)
    if number is None:
        raise bad_request(
            f"invalid resource version: resourceVersion: Invalid value: "
            f'"{rv}": strconv.ParseUint: parsing "{rv}": invalid syntax'
        )
    return number


def parse_watch_resource_version(opts: ListOptions, kind: str, group: str) -> int:
    """A watch's resourceVersion as a number (0 for "" and "0"); 422 Invalid for an
    unparsable one (k8s.io/apiserver pkg/storage/api_object_versioner.go ParseResourceVersion,
    reported by pkg/storage/errors/storage.go InterpretWatchError)."""
    rv = opts.resource_version
    if rv in ("", "0"):
        return 0
    number = _go_parse_uint(rv)
    if number is None:
        raise invalid(
            kind,
            group,
            "",
            [
                Cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{rv}": strconv.ParseUint: parsing "{rv}": invalid syntax',
                    "resourceVersion",
                )
            ],
        )
    return number


def too_large_resource_version(requested: int, current: int) -> StatusError:
    """504 Timeout for a resourceVersion the server has not reached after waiting, with the
    ResourceVersionTooLarge cause and Retry-After (k8s.io/apiserver pkg/storage/errors.go
    NewTooLargeResourceVersionError, k8s.io/apimachinery pkg/api/errors NewTimeoutError)."""
    return StatusError(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {requested}, current: {current}",
        {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": TOO_LARGE_RETRY_S,
        },
        {"Retry-After": str(TOO_LARGE_RETRY_S)},
    )


def watch_too_old(requested: int, oldest: int) -> StatusError:
    """410 Expired for a watch from before the resource's window
    (k8s.io/apiserver pkg/storage/cacher/watch_cache_history.go GetIntervalLocked)."""
    return expired(f"too old resource version: {requested} ({oldest})")


@dataclass
class ExpiredContinue(StatusError):
    """410 Expired for a continue token whose version was compacted, carrying in its
    ``metadata.continue`` a token that continues at the latest version
    (k8s.io/apiserver pkg/storage/etcd3/errors.go handleCompactedErrorForPaging)."""

    continue_token: str = ""

    def body(self) -> dict[str, Any]:
        """The Status body with ``metadata.continue``."""
        out = super().body()
        out["metadata"] = {"continue": self.continue_token}
        return out


def expired_continue(start: tuple[str, str]) -> ExpiredContinue:
    """The :class:`ExpiredContinue` error for a token that stopped after key ``start``."""
    return ExpiredContinue(
        410,
        "Expired",
        INCONSISTENT_CONTINUE,
        continue_token=encode_continue(-1, start[0], start[1]),
    )
