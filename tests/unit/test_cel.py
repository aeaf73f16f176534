"""The DRA CEL environment: what a selector sees, the quantity and semver libraries, limits and
errors, and the caches."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_allocator_builders import DRIVER, device

from app.allocator import values
from app.allocator.cel import CelEnvironment, CompileError, EvaluationError, SelectorCache
from app.allocator.model import Device, Reach, device_from_json

GPU = device_from_json(
    DRIVER,
    "us-east/rack-12",
    device(
        "gpu-0",
        model="H100",
        cores=132,
        healthy=True,
        firmware="v:1.2.3-rc.1",
        qualified={"ext.io/family": "hopper"},
        capacity={"memory": "80Gi", "power": "700", "ratio": "500m"},
    ),
    Reach(all_nodes=True),
)


def run(expression: str, on: Device = GPU) -> bool:
    environment = CelEnvironment()
    return environment.evaluate([environment.compile(expression)], on)


@pytest.mark.parametrize(
    "expression",
    [
        'device.driver == "fabric.example.com"',
        'device.attributes["fabric.example.com"].model == "H100"',
        'device.attributes["fabric.example.com"].cores > 100',
        'device.attributes["fabric.example.com"].healthy',
        'device.attributes["ext.io"].family == "hopper"',
        "device.allowMultipleAllocations == false",
        'cel.bind(d, device.attributes["fabric.example.com"], d.model == "H100" && d.cores == 132)',
        'device.attributes["fabric.example.com"].model.lowerAscii() == "h100"',
        'device.attributes["fabric.example.com"].model.matches("^H[0-9]+$")',
        'device.capacity["fabric.example.com"].memory.compareTo(quantity("80Gi")) == 0',
        'device.capacity["fabric.example.com"].memory == quantity("81920Mi")',
        'device.capacity["fabric.example.com"].memory.isGreaterThan(quantity("64Gi"))',
        'device.capacity["fabric.example.com"].power.isLessThan(quantity("1k"))',
        'device.capacity["fabric.example.com"].memory.asInteger() == 85899345920',
        'device.capacity["fabric.example.com"].ratio.asApproximateFloat() == 0.5',
        '!device.capacity["fabric.example.com"].ratio.isInteger()',
        'device.capacity["fabric.example.com"].power.sign() == 1',
        'device.capacity["fabric.example.com"].power.add(300) == quantity("1k")',
        'device.capacity["fabric.example.com"].power.sub(quantity("0.7k")) == quantity("0")',
        'isQuantity("1Gi") && !isQuantity("1 Gi")',
        'device.attributes["fabric.example.com"].firmware.isLessThan(semver("1.2.3"))',
        'device.attributes["fabric.example.com"].firmware.isGreaterThan(semver("1.2.3-beta.9"))',
        'device.attributes["fabric.example.com"].firmware.compareTo(semver("1.2.3-rc.1")) == 0',
        'device.attributes["fabric.example.com"].firmware.major() == 1',
        'device.attributes["fabric.example.com"].firmware.minor() == 2',
        'device.attributes["fabric.example.com"].firmware.patch() == 3',
        'semver("v1.2", true) == semver("1.2.0") && semver("1.0.0+build.5") == semver("1.0.0")',
        'isSemver("1.2.3") && !isSemver("1.2") && isSemver("1.2", true)',
        '!has(device.attributes["other.example.com"].model)',
        '!has(device.attributes["fabric.example.com"].nothere)',
        'device.attributes["fabric.example.com"].cores > 100 || '
        'device.attributes["fabric.example.com"].nothere',
    ],
)
def test_a_selector_sees_the_device_as_kubernetes_shows_it(expression: str) -> None:
    assert run(expression) is True


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ('device.attributes["fabric.example.com"].nothere == 1', "nothere"),
        ('device.attributes["other.example.com"].model == "x"', "model"),
        ('device.attributes["fabric.example.com"].model', "not a bool"),
        ('device.attributes["fabric.example.com"].cores + "a" == "b"', "overload"),
        ('device.attributes["fabric.example.com"].firmware.isLessThan(quantity("1"))', "Semver"),
        ('device.capacity["fabric.example.com"].memory.major() == 1', "Semver"),
        ('quantity("1x") == quantity("1")', "quantities must match"),
        ('semver("1.2") == semver("1.2.0")', "semver"),
        ('quantity("1.5").asInteger() == 1', "integer"),
        (
            "["
            + ",".join(["1"] * 101)
            + "].all(a, ["
            + ",".join(["1"] * 100)
            + "].all(b, a == b))",
            "budget",
        ),
    ],
)
def test_runtime_errors_are_evaluation_errors_with_the_runtime_message(
    expression: str, fragment: str
) -> None:
    with pytest.raises(EvaluationError) as caught:
        run(expression)
    assert caught.value.expression == expression
    assert fragment in caught.value.detail


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("", "empty"),
        ("device.driver ==", "Syntax error"),
        ("device.nope(1)", "undeclared"),
        ('device.driver + "x"', "must evaluate to bool, not STRING"),
        ("true && " * 1400 + "true", "10240"),
        ("(" * 40 + "true" + ")" * 40, "recursion"),
    ],
)
def test_expressions_that_cannot_compile_are_compile_errors(expression: str, fragment: str) -> None:
    with pytest.raises(CompileError) as caught:
        CelEnvironment().compile(expression)
    assert fragment in caught.value.detail


def test_compiled_expressions_and_compile_errors_are_cached_by_text() -> None:
    environment = CelEnvironment()
    first = environment.compile("device.driver != ''")
    assert environment.compile("device.driver != ''") is first
    for _ in range(2):
        with pytest.raises(CompileError):
            environment.compile("1 +")
    assert (environment.compile_hits, environment.compile_misses) == (2, 2)


def test_the_selector_cache_keeps_results_per_pool_content() -> None:
    environment = CelEnvironment()
    cache = SelectorCache(environment)
    other = device_from_json(DRIVER, "p", device("gpu-1", model="A100"), Reach(all_nodes=True))
    devices = [GPU, other]
    key = ("fabric.example.com", "p", "content-1")
    selectors = ('device.attributes["fabric.example.com"].model == "A100"',)
    assert cache.select("class a", selectors, key, devices) == (1,)
    assert cache.select("class a", selectors, key, devices) == (1,)
    assert (cache.hits, cache.misses, cache.evaluations) == (1, 1, 2)
    assert cache.select("request", ("true",), key, devices, within=(1,), within_key="a") == (1,)
    assert cache.evaluations == 3


def test_a_cached_evaluation_error_is_raised_again() -> None:
    cache = SelectorCache(CelEnvironment())
    selectors = ('device.attributes["fabric.example.com"].nothere',)
    for _ in range(2):
        with pytest.raises(EvaluationError) as caught:
            cache.select("class a", selectors, (DRIVER, "p", "x"), [GPU])
        assert caught.value.device == "gpu-0"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 2**30),
        ("500m", Fraction(1, 2)),
        ("1e3", 1000),
        ("1.5k", 1500),
        ("+2Ki", 2048),
        ("-1", -1),
        (".5", Fraction(1, 2)),
        ("1E-2", Fraction(1, 100)),
        ("3n", Fraction(3, 10**9)),
    ],
)
def test_quantities_parse_to_their_exact_value(text: str, value: Fraction) -> None:
    assert values.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "1 Gi", "Gi", "1gi", "1e", "--1", "1e9999"])
def test_malformed_quantities_are_refused(text: str) -> None:
    with pytest.raises(values.CelValueError):
        values.parse_quantity(text)


def test_semver_precedence_follows_semver_org() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.1.0",
        "2.0.0",
    ]
    parsed = [values.parse_semver(v) for v in ordered]
    for i, left in enumerate(parsed):
        for j, right in enumerate(parsed):
            assert values.compare_semver(left, right) == (i > j) - (i < j)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**40), st.sampled_from(["", "Ki", "Mi", "k", "M"]))
def test_quantity_comparisons_in_cel_agree_with_exact_arithmetic(amount: int, suffix: str) -> None:
    environment = CelEnvironment()
    text = f"{amount}{suffix}"
    exact = values.parse_quantity(text)
    expression = environment.compile(
        f'quantity("{text}").compareTo(quantity("1Mi")) == {(exact > 2**20) - (exact < 2**20)}'
    )
    assert environment.evaluate([expression], GPU) is True


@pytest.mark.parametrize(
    "expression",
    [
        'device.attributes["dra.example.com" + ""].size() == 0',
        'device.capacity["dra.example.com" + ""].size() == 0',
        'cel.bind(d, "other" + ".example.com", device.attributes[d].size() == 0)',
        'cel.bind(d, "other" + ".example.com", !has(device.attributes[d].model))',
        'device.attributes["fabric.example" + ".com"].model == "H100"',
        'device.attributes[device.attributes["fabric.example.com"].model + ".io"] == {}',
        'device.capacity[device.driver].memory == quantity("80Gi")',
        'device.attributes["EXT.IO"].size() == 0',
        '"device.attributes[x]" != "" && device.attributes["ext.io"].family == "hopper"',
    ],
)
def test_a_computed_domain_the_device_lacks_is_an_empty_map(expression: str) -> None:
    # k8s.io/dynamic-resource-allocation cel/compile.go: mapper.Find gives the empty map for
    # any domain it does not find, whatever the index expression.
    assert run(expression) is True


def test_a_computed_domain_lookup_keeps_the_runtime_errors_of_a_missing_id() -> None:
    with pytest.raises(EvaluationError) as caught:
        run('device.attributes["other" + ".io"].model == "x"')
    assert "model" in caught.value.detail
    assert caught.value.expression == 'device.attributes["other" + ".io"].model == "x"'


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["fabric.example.com", "ext.io", "other.example.com", "x"]), st.integers(0, 3)
)
def test_a_domain_reads_alike_from_a_literal_and_from_a_computed_index(
    domain: str,
    split: int,
) -> None:
    computed = " + ".join(f'"{part}"' for part in (domain[:split], domain[split:]))
    literal = run(f'device.attributes["{domain}"].size() == 0')
    assert run(f"device.attributes[{computed}].size() == 0") is literal
    assert run(f"cel.bind(d, {computed}, device.capacity[d].size() == 0)") is run(
        f'device.capacity["{domain}"].size() == 0'
    )
