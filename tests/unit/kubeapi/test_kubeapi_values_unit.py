"""Decoded values and defaults of the API emulator: quantities, integers, times, MicroTimes and
the resource.k8s.io defaulting functions, each as kube-apiserver answers them."""

from __future__ import annotations

from typing import Any

import pytest

from fabric_dra_sim.kubeapi import defaults
from fabric_dra_sim.kubeapi.errors import StatusError
from fabric_dra_sim.kubeapi.resources import served_types
from fabric_dra_sim.kubeapi.values import (
    QUANTITY_FORMAT_ERROR,
    ValueDecodeError,
    canonical_quantity,
    check_int,
    micro_time_from_json,
    quantity_from_json,
    time_from_json,
)

TYPES = {
    (rt.group, rt.version, rt.plural): rt
    for rt in served_types(["v1", "v1beta2", "v1beta1", "v1alpha3"])
}


def rt_of(plural: str, version: str = "v1", group: str = "resource.k8s.io") -> Any:
    return TYPES[(group, version, plural)]


# --------------------------------------------------------------------------- quantities
@pytest.mark.parametrize(
    ("written", "answered"),
    [
        ("1024Mi", "1Gi"),
        ("1000m", "1"),
        ("0.5Gi", "512Mi"),
        ("1500m", "1500m"),
        ("80Gi", "80Gi"),
        ("1.5Ki", "1536"),
        ("8Ki", "8Ki"),
        ("100Ki", "100Ki"),
        ("1000Ki", "1000Ki"),
        ("0.5", "500m"),
        ("1500000", "1500k"),
        ("1500", "1500"),
        ("1e3", "1e3"),
        ("15e2", "1500"),
        ("1e4", "10e3"),
        ("1E", "1E"),
        ("0.1n", "1n"),
        ("-1500m", "-1500m"),
        ("0", "0"),
        ("0.0", "0"),
        ("0Ki", "0"),
        ("1.5", "1500m"),
        ("16Ei", "9223372036854775807"),
        ("1025Mi", "1025Mi"),
        ("2048Ki", "2Mi"),
        ("0.5Ki", "512"),
        ("123456789012345678901", "123456789012345678901"),
        (" 2Gi ", "2Gi"),
    ],
)
def test_quantities_come_back_in_the_servers_canonical_form(written: str, answered: str) -> None:
    assert canonical_quantity(written) == answered


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("16GB", QUANTITY_FORMAT_ERROR),
        ("1.5.5", QUANTITY_FORMAT_ERROR),
        ("", QUANTITY_FORMAT_ERROR),
        ("abc", QUANTITY_FORMAT_ERROR),
        ("1gi", QUANTITY_FORMAT_ERROR),
        ("1kk", "unable to parse quantity's suffix"),
        ("1e", "unable to parse quantity's suffix"),
    ],
)
def test_malformed_quantities_fail_with_the_go_error_text(written: str, message: str) -> None:
    with pytest.raises(ValueDecodeError) as caught:
        canonical_quantity(written)
    assert str(caught.value) == message


def test_the_format_error_quotes_the_go_regular_expression() -> None:
    assert QUANTITY_FORMAT_ERROR == (
        "quantities must match the regular expression "
        "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )


def test_json_numbers_are_quantities_and_other_json_types_are_not() -> None:
    assert quantity_from_json(5) == "5"
    assert quantity_from_json(1.5) == "1500m"
    for bad in (True, [], {}):
        with pytest.raises(ValueDecodeError):
            quantity_from_json(bad)


# --------------------------------------------------------------------------- integers
@pytest.mark.parametrize(
    ("value", "bits", "kind"),
    [
        (2**31, 32, "number 2147483648"),
        (-(2**31) - 1, 32, "number -2147483649"),
        (2**63, 64, "number 9223372036854775808"),
        (1.5, 32, "number 1.5"),
        (2.0, 64, "number 2.0"),
        ("3", 32, "string"),
        (True, 64, "bool"),
    ],
)
def test_integers_out_of_range_or_not_integers_are_refused(
    value: Any, bits: int, kind: str
) -> None:
    with pytest.raises(ValueDecodeError) as caught:
        check_int(value, bits, "LeaseSpec", "spec.leaseDurationSeconds")
    assert str(caught.value) == (
        f"json: cannot unmarshal {kind} into Go struct field "
        f"LeaseSpec.spec.leaseDurationSeconds of type int{bits}"
    )


def test_integers_at_the_range_edges_are_accepted() -> None:
    for value, bits in ((2**31 - 1, 32), (-(2**31), 32), (2**63 - 1, 64), (None, 32)):
        check_int(value, bits, "S", "f")


# --------------------------------------------------------------------------- times
@pytest.mark.parametrize(
    ("written", "answered"),
    [
        ("2026-01-02T03:04:05Z", "2026-01-02T03:04:05Z"),
        ("2026-01-02T04:04:05.75+01:00", "2026-01-02T03:04:05Z"),
        ("2026-01-02T03:04:05.999999999Z", "2026-01-02T03:04:05Z"),
        ("2026-01-01T23:30:00-01:00", "2026-01-02T00:30:00Z"),
        ("2026-01-02T3:04:05Z", "2026-01-02T03:04:05Z"),
        ("0001-01-01T00:00:00Z", None),
    ],
)
def test_times_come_back_in_utc_at_whole_seconds(written: str, answered: str | None) -> None:
    assert time_from_json(written) == answered


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("x", 'parsing time "x" as "2006-01-02T15:04:05Z07:00": cannot parse "x" as "2006"'),
        ("", 'parsing time "" as "2006-01-02T15:04:05Z07:00": cannot parse "" as "2006"'),
        (
            "2026-01-02 03:04:05Z",
            'parsing time "2026-01-02 03:04:05Z" as '
            '"2006-01-02T15:04:05Z07:00": cannot parse " 03:04:05Z" as "T"',
        ),
        (
            "2026-01-02T03:04:05",
            'parsing time "2026-01-02T03:04:05" as '
            '"2006-01-02T15:04:05Z07:00": cannot parse "" as "Z07:00"',
        ),
        ("2026-13-02T03:04:05Z", 'parsing time "2026-13-02T03:04:05Z": month out of range'),
        ("2026-02-30T03:04:05Z", 'parsing time "2026-02-30T03:04:05Z": day out of range'),
        ("2026-01-02T24:04:05Z", 'parsing time "2026-01-02T24:04:05Z": hour out of range'),
        ("2026-01-02T03:04:05Zjunk", 'parsing time "2026-01-02T03:04:05Zjunk": extra text: "junk"'),
    ],
)
def test_malformed_times_fail_with_gos_parse_error(written: str, message: str) -> None:
    with pytest.raises(ValueDecodeError) as caught:
        time_from_json(written)
    assert str(caught.value) == message


def test_a_time_that_is_not_a_string_fails_like_json_unmarshal() -> None:
    with pytest.raises(ValueDecodeError) as caught:
        time_from_json(12)
    assert str(caught.value) == "json: cannot unmarshal number into Go value of type string"
    assert time_from_json(None) is None


@pytest.mark.parametrize(
    ("written", "answered"),
    [
        ("2026-01-02T03:04:05.000000Z", "2026-01-02T03:04:05.000000Z"),
        ("2026-01-02T04:04:05.123456+01:00", "2026-01-02T03:04:05.123456Z"),
    ],
)
def test_micro_times_keep_six_digits_in_utc(written: str, answered: str) -> None:
    assert micro_time_from_json(written) == answered


@pytest.mark.parametrize(
    ("written", "rest", "element"),
    [
        ("2026-01-02T03:04:05Z", "Z", ".000000"),
        ("2026-01-02T03:04:05+00:00", "+00:00", ".000000"),
        ("2026-01-02T03:04:05.123Z", ".123Z", ".000000"),
        ("2026-01-02T03:04:05.123456789Z", "789Z", "Z07:00"),
    ],
)
def test_micro_times_demand_exactly_six_fraction_digits(
    written: str, rest: str, element: str
) -> None:
    with pytest.raises(ValueDecodeError) as caught:
        micro_time_from_json(written)
    assert str(caught.value) == (
        f'parsing time "{written}" as '
        f'"2006-01-02T15:04:05.000000Z07:00": cannot parse "{rest}" '
        f'as "{element}"'
    )


# --------------------------------------------------------------------------- whole objects
def _slice(**device: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "driver": "d.example.com",
            "allNodes": True,
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "sharedCounters": [{"name": "set", "counters": {"mem": {"value": "2048Mi"}}}],
            "devices": [{"name": "d0", **device}],
        },
    }


def test_every_quantity_field_of_a_slice_is_canonicalised() -> None:
    obj = _slice(
        capacity={
            "memory": {
                "value": "1024Mi",
                "requestPolicy": {
                    "default": "1000m",
                    "validValues": ["1024Mi", "0.5Gi"],
                    "validRange": {"min": "1024Ki", "max": "2048Mi", "step": "1000m"},
                },
            }
        },
        consumesCounters=[{"counterSet": "set", "counters": {"mem": {"value": "1024Mi"}}}],
    )
    defaults.normalise(rt_of("resourceslices"), obj)
    spec = obj["spec"]
    capacity = spec["devices"][0]["capacity"]["memory"]
    assert capacity["value"] == "1Gi"
    assert capacity["requestPolicy"] == {
        "default": "1",
        "validValues": ["1Gi", "512Mi"],
        "validRange": {"min": "1Mi", "max": "2Gi", "step": "1"},
    }
    assert spec["sharedCounters"][0]["counters"]["mem"]["value"] == "2Gi"
    assert spec["devices"][0]["consumesCounters"][0]["counters"]["mem"]["value"] == "1Gi"


def test_v1beta1_and_v1alpha3_slices_canonicalise_their_basic_capacity() -> None:
    beta = _slice(basic={"capacity": {"memory": {"value": "1024Mi"}}})
    defaults.normalise(rt_of("resourceslices", "v1beta1"), beta)
    assert beta["spec"]["devices"][0]["basic"]["capacity"]["memory"]["value"] == "1Gi"
    alpha = _slice(basic={"capacity": {"memory": "1024Mi"}})
    defaults.normalise(rt_of("resourceslices", "v1alpha3"), alpha)
    assert alpha["spec"]["devices"][0]["basic"]["capacity"]["memory"] == "1Gi"


def test_a_bad_quantity_is_a_400_naming_kind_and_version() -> None:
    obj = _slice(capacity={"memory": {"value": "16GB"}})
    with pytest.raises(StatusError) as caught:
        defaults.normalise(rt_of("resourceslices"), obj)
    assert caught.value.code == 400
    assert caught.value.message == (
        'ResourceSlice in version "v1" cannot be handled as a '
        f"ResourceSlice: {QUANTITY_FORMAT_ERROR}"
    )


def test_slice_integers_are_int64_with_the_go_struct_in_the_message() -> None:
    obj = _slice(attributes={"cores": {"int": 2**63}})
    with pytest.raises(StatusError) as caught:
        defaults.normalise(rt_of("resourceslices"), obj)
    assert caught.value.message.endswith(
        "json: cannot unmarshal number 9223372036854775808 into Go struct field "
        "DeviceAttribute.spec.devices.attributes.int of type int64"
    )
    obj = _slice()
    obj["spec"]["pool"]["generation"] = 1.5
    with pytest.raises(StatusError) as caught:
        defaults.normalise(rt_of("resourceslices"), obj)
    assert "ResourcePool.spec.pool.generation of type int64" in caught.value.message


def test_lease_integers_are_int32_and_times_are_micro_times() -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l", "namespace": "default"},
        "spec": {"leaseDurationSeconds": 2**31, "acquireTime": "2026-01-02T03:04:05Z"},
    }
    rt = rt_of("leases", "v1", "coordination.k8s.io")
    with pytest.raises(StatusError) as caught:
        defaults.normalise(rt, lease)
    assert "LeaseSpec.spec.leaseDurationSeconds of type int32" in caught.value.message
    lease["spec"]["leaseDurationSeconds"] = 15
    with pytest.raises(StatusError) as caught:
        defaults.normalise(rt, lease)
    assert 'cannot parse "Z" as ".000000"' in caught.value.message


def test_node_capacity_and_allocatable_are_canonicalised() -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n"},
        "status": {
            "capacity": {"memory": "1048576Ki", "cpu": "4000m"},
            "allocatable": {"memory": "0.5Gi"},
        },
    }
    defaults.normalise(rt_of("nodes", "v1", ""), node)
    assert node["status"] == {
        "capacity": {"memory": "1Gi", "cpu": "4"},
        "allocatable": {"memory": "512Mi"},
    }


# --------------------------------------------------------------------------- defaulting
def _claim(version: str, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "r", **request}]}},
    }


def test_v1_exact_requests_and_subrequests_default_to_one_exact_device() -> None:
    claim = _claim("v1", {"exactly": {"deviceClassName": "gpu", "tolerations": [{"key": "k"}]}})
    claim["spec"]["devices"]["requests"].append(
        {
            "name": "alt",
            "firstAvailable": [
                {"name": "a", "deviceClassName": "gpu"},
                {"name": "b", "deviceClassName": "gpu", "allocationMode": "All"},
            ],
        }
    )
    defaults.apply_defaults(rt_of("resourceclaims"), claim)
    exact, alt = claim["spec"]["devices"]["requests"]
    assert exact["exactly"] == {
        "deviceClassName": "gpu",
        "allocationMode": "ExactCount",
        "count": 1,
        "tolerations": [{"key": "k", "operator": "Equal"}],
    }
    assert alt["firstAvailable"][0]["allocationMode"] == "ExactCount"
    assert alt["firstAvailable"][0]["count"] == 1
    assert alt["firstAvailable"][1] == {
        "name": "b",
        "deviceClassName": "gpu",
        "allocationMode": "All",
    }


def test_v1beta1_defaults_only_requests_with_a_class() -> None:
    claim = _claim("v1beta1", {"deviceClassName": "gpu", "tolerations": [{"key": "k"}]})
    claim["spec"]["devices"]["requests"].append(
        {"name": "alt", "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]}
    )
    defaults.apply_defaults(rt_of("resourceclaims", "v1beta1"), claim)
    plain, alt = claim["spec"]["devices"]["requests"]
    assert (plain["allocationMode"], plain["count"]) == ("ExactCount", 1)
    assert plain["tolerations"] == [{"key": "k", "operator": "Equal"}]
    assert "allocationMode" not in alt
    assert (alt["firstAvailable"][0]["allocationMode"], alt["firstAvailable"][0]["count"]) == (
        "ExactCount",
        1,
    )


def test_v1alpha3_requests_default_to_exact_count_one() -> None:
    claim = _claim("v1alpha3", {"deviceClassName": "gpu"})
    defaults.apply_defaults(rt_of("resourceclaims", "v1alpha3"), claim)
    assert claim["spec"]["devices"]["requests"][0]["count"] == 1


def test_claim_templates_default_their_claim_spec() -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}
            }
        },
    }
    defaults.apply_defaults(rt_of("resourceclaimtemplates"), template)
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1


def test_explicit_count_and_all_mode_are_kept() -> None:
    claim = _claim("v1", {"exactly": {"deviceClassName": "gpu", "count": 3}})
    defaults.apply_defaults(rt_of("resourceclaims"), claim)
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["count"] == 3


def test_allocated_tolerations_get_the_equal_operator() -> None:
    claim = _claim("v1", {"exactly": {"deviceClassName": "gpu"}})
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "r",
                        "driver": "d",
                        "pool": "p",
                        "device": "x",
                        "tolerations": [{"key": "k"}],
                    }
                ]
            }
        }
    }
    defaults.apply_defaults(rt_of("resourceclaims"), claim)
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert result["tolerations"] == [{"key": "k", "operator": "Equal"}]


def test_taints_without_a_time_get_the_current_one_and_set_times_are_kept() -> None:
    obj = _slice(
        taints=[
            {"key": "a", "effect": "NoSchedule"},
            {"key": "b", "effect": "NoSchedule", "timeAdded": "2025-01-01T00:00:00Z"},
        ]
    )
    defaults.apply_defaults(rt_of("resourceslices"), obj, now=lambda: "2026-06-01T00:00:00Z")
    taints = obj["spec"]["devices"][0]["taints"]
    assert [t["timeAdded"] for t in taints] == ["2026-06-01T00:00:00Z", "2025-01-01T00:00:00Z"]
    beta = _slice(basic={"taints": [{"key": "a", "effect": "NoSchedule"}]})
    defaults.apply_defaults(rt_of("resourceslices", "v1beta1"), beta, now=lambda: "T")
    assert beta["spec"]["devices"][0]["basic"]["taints"][0]["timeAdded"] == "T"


def test_prepare_leaves_malformed_shapes_for_validation() -> None:
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": {"requests": "nope"}},
    }
    defaults.prepare(rt_of("resourceclaims"), obj)
    assert obj["spec"]["devices"]["requests"] == "nope"
