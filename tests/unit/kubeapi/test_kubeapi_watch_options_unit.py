"""List and watch options: kube-apiserver's ValidateListOptions table, the WatchList defaults,
the storage layer's continue/resourceVersion checks and the error bodies they produce."""

from __future__ import annotations

import pytest

from fabric_dra_sim.kubeapi.context import Cluster
from fabric_dra_sim.kubeapi.errors import StatusError
from fabric_dra_sim.kubeapi.listing import (
    INCONSISTENT_CONTINUE,
    ListOptions,
    decode_continue,
    encode_continue,
    expired_continue,
    list_option_causes,
    parse_list_options,
    parse_list_resource_version,
    parse_watch_resource_version,
    too_large_resource_version,
    watch_list_enabled,
    watch_too_old,
)

# The cases of k8s.io/apimachinery pkg/apis/meta/internalversion/validation/validation_test.go
# TestValidateListOptions: (name, options, WatchList gate on, expected "field: message" errors).
CASES: list[tuple[str, ListOptions, bool, list[str]]] = [
    ("valid-default", ListOptions(), False, []),
    (
        "valid-resourceversionmatch-exact",
        ListOptions(resource_version="1", resource_version_match="Exact"),
        False,
        [],
    ),
    (
        "invalid-resourceversionmatch-exact",
        ListOptions(resource_version="0", resource_version_match="Exact"),
        False,
        [
            'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for '
            'resourceVersion "0"'
        ],
    ),
    (
        "valid-resourceversionmatch-notolderthan",
        ListOptions(resource_version="0", resource_version_match="NotOlderThan"),
        False,
        [],
    ),
    (
        "invalid-resourceversionmatch",
        ListOptions(resource_version="0", resource_version_match="foo"),
        False,
        [
            'resourceVersionMatch: Unsupported value: "foo": supported values: "Exact", '
            '"NotOlderThan", ""'
        ],
    ),
    (
        "list-sendInitialEvents-forbidden",
        ListOptions(send_initial_events=True),
        False,
        ["sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"],
    ),
    ("valid-watch-default", ListOptions(watch=True), False, []),
    (
        "valid-watch-sendInitialEvents-on",
        ListOptions(watch=True, send_initial_events=True, resource_version_match="NotOlderThan"),
        True,
        [],
    ),
    (
        "valid-watch-sendInitialEvents-off",
        ListOptions(watch=True, send_initial_events=False, resource_version_match="NotOlderThan"),
        True,
        [],
    ),
    (
        "watch-resourceversionmatch-without-sendInitialEvents-forbidden",
        ListOptions(watch=True, resource_version_match="NotOlderThan"),
        False,
        [
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless "
            "sendInitialEvents is provided"
        ],
    ),
    (
        "watch-sendInitialEvents-without-resourceversionmatch-forbidden",
        ListOptions(watch=True, send_initial_events=True),
        False,
        [
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
            "resourceVersionMatch to NotOlderThan",
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the "
            "WatchList feature gate is enabled",
        ],
    ),
    (
        "watch-sendInitialEvents-with-exact-resourceversionmatch-forbidden",
        ListOptions(watch=True, send_initial_events=True, resource_version_match="Exact"),
        True,
        [
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
            "resourceVersionMatch to NotOlderThan",
            'resourceVersionMatch: Unsupported value: "Exact": supported values: "NotOlderThan"',
        ],
    ),
    (
        "watch-sendInitialEvents-off-with-empty-resourceversionmatch-forbidden",
        ListOptions(watch=True, send_initial_events=False),
        False,
        [
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
            "resourceVersionMatch to NotOlderThan",
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the "
            "WatchList feature gate is enabled",
        ],
    ),
    (
        "watch-sendInitialEvents-with-incorrect-resourceversionmatch-forbidden",
        ListOptions(watch=True, send_initial_events=True, resource_version_match="incorrect"),
        True,
        [
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
            "resourceVersionMatch to NotOlderThan",
            'resourceVersionMatch: Unsupported value: "incorrect": supported values: '
            '"NotOlderThan"',
        ],
    ),
    (
        "watch-sendInitialEvents-no-watchlist-fg-disabled",
        ListOptions(watch=True, send_initial_events=True, resource_version_match="NotOlderThan"),
        False,
        [
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the "
            "WatchList feature gate is enabled"
        ],
    ),
    (
        "watch-sendInitialEvents-with-continue",
        ListOptions(
            watch=True,
            send_initial_events=True,
            resource_version_match="NotOlderThan",
            continue_token="123",
        ),
        True,
        [
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is "
            "provided"
        ],
    ),
    # Our additions, each a branch of the same function.
    (
        "list-match-without-resource-version",
        ListOptions(resource_version_match="NotOlderThan"),
        False,
        [
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless "
            "resourceVersion is provided"
        ],
    ),
    (
        "list-match-with-continue",
        ListOptions(resource_version="5", resource_version_match="Exact", continue_token="x"),
        False,
        [
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is "
            "provided"
        ],
    ),
]


@pytest.mark.parametrize(
    ("options", "watch_list", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_validate_list_options_matches_kube_apiserver(
    options: ListOptions,
    watch_list: bool,
    expected: list[str],
) -> None:
    causes = list_option_causes(options, watch_list=watch_list)
    assert [f"{c.field}: {c.message}" for c in causes] == expected


def test_invalid_options_are_422_list_options_with_every_cause() -> None:
    with pytest.raises(StatusError) as caught:
        parse_list_options({"watch": "true", "sendInitialEvents": "true"}, watch_list=False)
    body = caught.value.body()
    assert (body["code"], body["reason"]) == (422, "Invalid")
    assert body["message"].startswith('ListOptions.meta.k8s.io "" is invalid: [')
    assert body["details"]["kind"] == "ListOptions"
    assert body["details"]["group"] == "meta.k8s.io"
    assert [c["reason"] for c in body["details"]["causes"]] == ["FieldValueForbidden"] * 2


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"watch": "true"}, (True, "NotOlderThan")),
        ({"watch": "true", "resourceVersion": "0"}, (True, "NotOlderThan")),
        ({"watch": "true", "resourceVersion": "7"}, (None, "")),
        (
            {"watch": "true", "sendInitialEvents": "false", "resourceVersionMatch": "NotOlderThan"},
            (False, "NotOlderThan"),
        ),
        ({}, (None, "")),
    ],
)
def test_watch_list_defaults_a_legacy_watch_to_initial_events(
    query: dict[str, str],
    expected: tuple[bool | None, str],
) -> None:
    # k8s.io/apimachinery pkg/apis/meta/internalversion/defaults.go SetListOptionsDefaults
    opts = parse_list_options(query, watch_list=True)
    assert (opts.send_initial_events, opts.resource_version_match) == expected


def test_without_watch_list_a_legacy_watch_stays_as_it_is() -> None:
    opts = parse_list_options({"watch": "1"}, watch_list=False)
    assert (opts.watch, opts.send_initial_events, opts.resource_version_match) == (True, None, "")


@pytest.mark.parametrize(
    ("minor", "enabled"), [(31, False), (32, True), (33, False), (34, True), (37, True)]
)
def test_watch_list_gate_follows_the_release(minor: int, enabled: bool) -> None:
    assert watch_list_enabled(Cluster(minor, frozenset())) is enabled


def test_unparsable_limits_are_400_and_booleans_other_than_false_are_true() -> None:
    # k8s.io/apimachinery pkg/runtime/conversion.go: ParseInt for limit; for booleans only
    # "0" and "false" are false.
    with pytest.raises(StatusError) as caught:
        parse_list_options({"limit": "ten"}, watch_list=True)
    assert caught.value.code == 400
    assert parse_list_options({"watch": "maybe"}, watch_list=True).watch is True
    assert (
        parse_list_options(
            {"watch": "maybe", "sendInitialEvents": "yes", "resourceVersionMatch": "NotOlderThan"},
            watch_list=True,
        ).send_initial_events
        is True
    )


def test_resource_version_with_continue_is_400_but_zero_is_allowed() -> None:
    token = encode_continue(5, "", "a")
    with pytest.raises(StatusError) as caught:
        parse_list_resource_version(ListOptions(resource_version="5", continue_token=token))
    assert (caught.value.code, caught.value.message) == (
        400,
        "specifying resource version is not allowed when using continue",
    )
    assert parse_list_resource_version(ListOptions(resource_version="0", continue_token=token)) == 0


def test_unparsable_resource_versions_are_400_on_list_and_422_on_watch() -> None:
    with pytest.raises(StatusError) as caught:
        parse_list_resource_version(ListOptions(resource_version="abc"))
    assert caught.value.code == 400
    assert caught.value.message == (
        "invalid resource version: resourceVersion: Invalid "
        'value: "abc": strconv.ParseUint: parsing "abc": invalid '
        "syntax"
    )
    with pytest.raises(StatusError) as caught:
        parse_watch_resource_version(
            ListOptions(watch=True, resource_version="-1"), "resourceslices", "resource.k8s.io"
        )
    assert caught.value.code == 422
    assert (
        parse_watch_resource_version(ListOptions(watch=True, resource_version="12"), "nodes", "")
        == 12
    )


def test_continue_tokens_round_trip_and_reject_version_zero() -> None:
    assert decode_continue(encode_continue(-1, "ns", "b")) == (-1, ("ns", "b"))
    for bad in (encode_continue(0, "", "a"), "not-base64!", "e30="):
        with pytest.raises(StatusError) as caught:
            decode_continue(bad)
        assert caught.value.code == 400
        assert caught.value.message.startswith("invalid continue token: ")


def test_too_large_resource_version_is_504_with_cause_and_retry_after() -> None:
    err = too_large_resource_version(20, 12)
    body = err.body()
    assert (body["code"], body["reason"]) == (504, "Timeout")
    assert body["message"] == "Timeout: Too large resource version: 20, current: 12"
    assert body["details"] == {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }
    assert err.headers == {"Retry-After": "1"}


def test_expired_messages_are_kube_apiservers() -> None:
    assert watch_too_old(3, 9).body()["message"] == "too old resource version: 3 (9)"
    err = expired_continue(("default", "b"))
    body = err.body()
    assert (body["code"], body["reason"], body["message"]) == (
        410,
        "Expired",
        INCONSISTENT_CONTINUE,
    )
    assert decode_continue(body["metadata"]["continue"]) == (-1, ("default", "b"))
