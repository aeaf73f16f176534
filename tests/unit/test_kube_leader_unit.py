"""Pure parts of the kube layer: MicroTime, the Lease record decisions, settings validation,
error translation and client configuration."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from multidict import CIMultiDict, CIMultiDictProxy

from app.kube.client import KubeAuthMode, KubeClientSettings, build_configuration, connect
from app.kube.errors import (
    KubeAlreadyExists,
    KubeConflict,
    KubeError,
    KubeGone,
    KubeNotFound,
    KubeTimeout,
    KubeTooManyRequests,
    KubeUnavailable,
    error_from_status,
    parse_retry_after,
    translate_error,
)
from app.kube.informer import InformerSettings
from app.kube.leader import (
    LeaderElectionSettings,
    LeaseRecord,
    format_micro_time,
    parse_micro_time,
    plan_acquire,
    plan_release,
)

MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


# ----------------------------------------------------------------------------- MicroTime
@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),  # a whole second keeps its six zeros
        datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
        datetime(2026, 1, 2, 5, 4, 5, 7, tzinfo=timezone(timedelta(hours=2))),
    ],
)
def test_micro_time_is_utc_with_six_fraction_digits_and_z(moment: datetime) -> None:
    text = format_micro_time(moment)
    assert MICRO_TIME.match(text), text
    assert parse_micro_time(text) == moment


def test_micro_time_of_a_whole_second() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert format_micro_time(moment) == "2026-01-02T03:04:05.000000Z"


def test_micro_time_refuses_a_naive_datetime() -> None:
    with pytest.raises(ValueError, match="aware"):
        format_micro_time(datetime(2026, 1, 2))


def test_parse_accepts_plain_rfc3339_and_refuses_no_zone() -> None:
    assert parse_micro_time("2026-01-02T03:04:05Z") == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    with pytest.raises(ValueError, match="zone"):
        parse_micro_time("2026-01-02T03:04:05")


# ----------------------------------------------------------------------------- Lease record
NOW = "2026-01-02T03:04:05.000000Z"


def test_a_missing_lease_is_created_held_by_us() -> None:
    record = plan_acquire(None, identity="a", now=NOW, lease_duration_s=15, held_and_valid=False)
    assert record == LeaseRecord("a", 15, NOW, NOW, 0)


def test_a_valid_lease_of_another_holder_is_left_alone() -> None:
    current = LeaseRecord("b", 15, "t0", "t1", 3)
    assert (
        plan_acquire(current, identity="a", now=NOW, lease_duration_s=15, held_and_valid=True)
        is None
    )


def test_taking_over_an_expired_lease_counts_a_transition() -> None:
    current = LeaseRecord("b", 15, "t0", "t1", 3)
    record = plan_acquire(current, identity="a", now=NOW, lease_duration_s=10, held_and_valid=False)
    assert record == LeaseRecord("a", 10, NOW, NOW, 4)


def test_taking_a_released_lease_counts_a_transition() -> None:
    released = plan_release(LeaseRecord("b", 15, "t0", "t1", 3), now="t2")
    assert released == LeaseRecord(None, 1, "t2", "t2", 3)
    record = plan_acquire(
        released, identity="a", now=NOW, lease_duration_s=15, held_and_valid=False
    )
    assert record == LeaseRecord("a", 15, NOW, NOW, 4)


def test_renewing_moves_only_renew_time() -> None:
    current = LeaseRecord("a", 15, "t0", "t1", 3)
    record = plan_acquire(current, identity="a", now=NOW, lease_duration_s=15, held_and_valid=False)
    assert record == LeaseRecord("a", 15, "t0", NOW, 3)


def test_record_round_trips_through_a_lease_and_keeps_other_spec_fields() -> None:
    lease = {
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "acquireTime": "t0",
            "renewTime": "t1",
            "leaseTransitions": 2,
            "strategy": "OldestEmulationVersion",
        }
    }
    record = LeaseRecord.from_lease(lease)
    assert record == LeaseRecord("a", 15, "t0", "t1", 2)
    released = plan_release(record, now="t2").to_spec(lease["spec"])
    assert "holderIdentity" not in released
    assert released["leaseDurationSeconds"] == 1
    assert released["strategy"] == "OldestEmulationVersion"


def test_an_empty_lease_reads_as_unheld() -> None:
    assert LeaseRecord.from_lease({}) == LeaseRecord(None, None, None, None, 0)
    assert LeaseRecord.from_lease({"spec": {"holderIdentity": ""}}).holder_identity is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lease_duration_s": 10, "renew_deadline_s": 10.0}, "lease_duration_s must be >"),
        ({"renew_deadline_s": 2.0, "retry_period_s": 2.0}, "renew_deadline_s must be >"),
        ({"identity": ""}, "identity"),
        ({"lease_duration_s": 0, "renew_deadline_s": -1.0, "retry_period_s": -1.0}, ">= 1"),
    ],
)
def test_election_settings_are_validated(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"lease_name": "l", "namespace": "ns", "identity": "a"}
    with pytest.raises(ValueError, match=message):
        LeaderElectionSettings(**{**base, **kwargs})  # type: ignore[arg-type]


def test_informer_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="page_size"):
        InformerSettings(name="x", page_size=0)
    with pytest.raises(ValueError, match="backoff"):
        InformerSettings(name="x", backoff_initial_s=5, backoff_max_s=1)


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("status", "reason", "kind", "retryable"),
    [
        (409, "AlreadyExists", KubeAlreadyExists, False),
        (409, "Conflict", KubeConflict, False),
        (404, "NotFound", KubeNotFound, False),
        (410, "Expired", KubeGone, False),
        (429, "TooManyRequests", KubeTooManyRequests, True),
        (500, "InternalError", KubeUnavailable, True),
        (504, "Timeout", KubeTimeout, True),
    ],
)
def test_statuses_become_typed_errors(
    status: int, reason: str, kind: type[KubeError], retryable: bool
) -> None:
    body = {"kind": "Status", "reason": reason, "message": "lease x: the object was modified"}
    err = error_from_status(status, "update Lease ns/x", body=body)
    assert type(err) is kind
    assert err.retryable is retryable
    assert str(err).startswith(f"update Lease ns/x: HTTP {status} {reason}")


def test_api_exception_keeps_retry_after_and_is_chained() -> None:
    original = ApiException(status=429, reason="Too Many Requests")
    original.headers = CIMultiDictProxy(CIMultiDict({"Retry-After": "3"}))
    original.body = b'{"kind":"Status","reason":"TooManyRequests","message":"slow down"}'
    try:
        try:
            raise original
        except ApiException as err:
            raise translate_error(err, "list ResourceSlices") from err
    except KubeTooManyRequests as translated:
        assert translated.retry_after == 3.0
        assert translated.__cause__ is original
        assert "slow down" in str(translated)


def test_connection_and_timeout_errors_are_temporary() -> None:
    assert isinstance(translate_error(ConnectionResetError("reset"), "x"), KubeUnavailable)
    assert isinstance(translate_error(TimeoutError(), "x"), KubeTimeout)
    assert not translate_error(ValueError("bug"), "x").retryable


def test_retry_after_forms() -> None:
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Thu, 01 Jan 2026 00:00:10 GMT", now=1767225600.0) == 10.0


# ----------------------------------------------------------------------------- client config
async def test_url_settings_configure_host_ca_and_verification(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("not parsed here")
    token = tmp_path / "token"
    token.write_text("abc\n")
    settings = KubeClientSettings(
        mode=KubeAuthMode.URL,
        url="https://10.0.0.1:6443/",
        token_file=token,
        ca_file=ca,
        verify_tls=False,
    )
    configuration = await build_configuration(settings)
    assert configuration.host == "https://10.0.0.1:6443"
    assert configuration.ssl_ca_cert == str(ca)
    assert configuration.verify_ssl is False
    assert await configuration.get_api_key_with_prefix("BearerToken") == "Bearer abc"


async def test_a_rotated_token_is_read_after_the_refresh_interval(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    clock = [0.0]
    settings = KubeClientSettings(
        mode=KubeAuthMode.URL, url="http://127.0.0.1:1", token_file=token, token_refresh_s=60
    )
    configuration = await build_configuration(settings, now=lambda: clock[0])
    token.write_text("second")
    clock[0] = 59.0
    assert await configuration.get_api_key_with_prefix("BearerToken") == "Bearer first"
    clock[0] = 60.0
    assert await configuration.get_api_key_with_prefix("BearerToken") == "Bearer second"
    token.unlink()  # a failed re-read keeps the last good token
    clock[0] = 200.0
    assert await configuration.get_api_key_with_prefix("BearerToken") == "Bearer second"


async def test_a_missing_token_file_fails_at_connect(tmp_path: Path) -> None:
    settings = KubeClientSettings(
        mode=KubeAuthMode.URL, url="http://127.0.0.1:1", token_file=tmp_path / "absent"
    )
    with pytest.raises(KubeError, match="bearer token file"):
        await connect(settings)


def test_in_cluster_settings_come_from_the_given_environment(tmp_path: Path) -> None:
    settings = KubeClientSettings.in_cluster(
        {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
        service_account_dir=tmp_path,
    )
    assert settings.url == "https://[fd00::1]:443"
    assert settings.token_file == tmp_path / "token"
    assert settings.ca_file == tmp_path / "ca.crt"
    with pytest.raises(KubeError, match="KUBERNETES_SERVICE_HOST"):
        KubeClientSettings.in_cluster({})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": KubeAuthMode.URL}, "url is required"),
        ({"mode": KubeAuthMode.KUBECONFIG}, "kubeconfig path is required"),
        ({"mode": KubeAuthMode.URL, "url": "10.0.0.1"}, "http"),
        ({"mode": KubeAuthMode.IN_CLUSTER, "url": "https://x"}, "token_file"),
    ],
)
def test_client_settings_are_validated(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KubeClientSettings(**kwargs)  # type: ignore[arg-type]
