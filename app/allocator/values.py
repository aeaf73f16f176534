"""Quantities and semantic versions as the DRA CEL environment sees them.

Kubernetes gives CEL two opaque types here: ``Quantity`` (k8s.io/apiserver pkg/cel/library
quantity.go, backed by apimachinery ``resource.Quantity``) and ``Semver`` (pkg/cel/library
semverlib.go, backed by blang/semver). The CEL runtime we use cannot carry foreign objects, so a
value of either type travels through CEL as a one-entry map whose key names the type
(``{"kubernetes.Quantity": "<numerator>/<denominator>"}``, ``{"kubernetes.Semver": "1.2.3-rc.1"}``)
and whose value is a canonical form: two quantities are ``==`` exactly when they are numerically
equal ("1Gi" == "1024Mi", as ``Quantity.Equal``), two versions exactly when they have the same
precedence (build metadata is ignored, as blang's ``EQ``). This module parses, normalises and
compares those values; :mod:`app.allocator.cel` binds them to CEL functions.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

QUANTITY_KEY = "kubernetes.Quantity"
SEMVER_KEY = "kubernetes.Semver"
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# k8s.io/apimachinery pkg/api/resource quantity.go: <signedNumber><suffix>, suffix one of the
# binary SI, decimal SI or decimal exponent forms.
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# Semantic Versioning 2.0.0 (semver.org), the form of DRA version attributes.
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


class CelValueError(ValueError):
    """A quantity or version that cannot be parsed or used; the message becomes the CEL error."""


def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity string (``"1Gi"``, ``"500m"``, ``"1e3"``).

    Raises:
        CelValueError: not a quantity (apimachinery ``ParseQuantity`` rules; the decimal exponent
            is limited to +-1000 to keep the value finite).
    """
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if match is None or not text or text != text.strip():
        raise CelValueError(
            f"quantities must match the regular expression "
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    value = Fraction(match.group("number"))
    suffix = match.group("suffix") or ""
    if suffix in _BINARY:
        return value * (1 << _BINARY[suffix])
    if suffix in _DECIMAL:
        return _scale(value, _DECIMAL[suffix])
    if suffix:
        exponent = int(suffix[1:])
        if abs(exponent) > 1000:
            raise CelValueError(f"quantity exponent out of range: {text!r}")
        return _scale(value, exponent)
    return value


def _scale(value: Fraction, exponent: int) -> Fraction:
    factor = Fraction(10 ** abs(exponent))
    return value * factor if exponent >= 0 else value / factor


def quantity_value(value: Fraction) -> dict[str, str]:
    """The CEL form of a quantity."""
    return {QUANTITY_KEY: f"{value.numerator}/{value.denominator}"}


def quantity_of(value: Any) -> Fraction:
    """The exact value of a CEL quantity (as made by :func:`quantity_value`).

    Raises:
        CelValueError: ``value`` is not a quantity.
    """
    if isinstance(value, dict) and len(value) == 1 and QUANTITY_KEY in value:
        numerator, _, denominator = str(value[QUANTITY_KEY]).partition("/")
        return Fraction(int(numerator), int(denominator))
    raise CelValueError("no such overload: expected a Quantity")


def as_integer(value: Fraction) -> int:
    """``Quantity.asInteger()``: the value as int64.

    Raises:
        CelValueError: not an integer or outside int64 (as ``AsInt64`` failing in Kubernetes).
    """
    if value.denominator != 1 or not INT64_MIN <= value.numerator <= INT64_MAX:
        raise CelValueError("cannot convert value to integer")
    return value.numerator


def is_quantity(text: str) -> bool:
    """``isQuantity(string)``."""
    try:
        parse_quantity(text)
    except CelValueError:
        return False
    return True


def _normalise_version(text: str) -> str:
    # blang/semver ParseTolerant-like normalisation used by semver(s, true): drop a leading
    # "v", pad missing minor/patch with zeros, strip leading zeros of numeric parts.
    core, sep, rest = text.strip().lstrip("vV").partition("-")
    core, plus, build = core.partition("+")
    parts = core.split(".")
    if len(parts) > 3 or not all(p.isdigit() for p in parts):
        return text
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    out = ".".join(parts)
    if sep:
        out += "-" + rest
    if plus:
        out += "+" + build
    return out


def parse_semver(text: str, normalize: bool = False) -> tuple[int, int, int, tuple[str, ...]]:
    """Major, minor, patch and pre-release identifiers of a semver 2.0.0 string.

    ``normalize`` accepts ``v1``, ``1.2`` and leading zeros (the library's ``semver(s, true)``).

    Raises:
        CelValueError: not a valid semantic version.
    """
    candidate = _normalise_version(text) if normalize else text
    match = _SEMVER.match(candidate) if isinstance(candidate, str) else None
    if match is None:
        raise CelValueError(f"could not parse {text!r} as semver")
    pre = tuple(match.group(4).split(".")) if match.group(4) else ()
    return int(match.group(1)), int(match.group(2)), int(match.group(3)), pre


def semver_value(text: str, normalize: bool = False) -> dict[str, str]:
    """The CEL form of a version: its canonical text without build metadata.

    Raises:
        CelValueError: not a valid semantic version.
    """
    major, minor, patch, pre = parse_semver(text, normalize)
    canonical = f"{major}.{minor}.{patch}" + ("-" + ".".join(pre) if pre else "")
    return {SEMVER_KEY: canonical}


def semver_of(value: Any) -> tuple[int, int, int, tuple[str, ...]]:
    """The parts of a CEL version (as made by :func:`semver_value`).

    Raises:
        CelValueError: ``value`` is not a version.
    """
    if isinstance(value, dict) and len(value) == 1 and SEMVER_KEY in value:
        return parse_semver(str(value[SEMVER_KEY]))
    raise CelValueError("no such overload: expected a Semver")


def is_semver(text: str, normalize: bool = False) -> bool:
    """``isSemver(string[, bool])``."""
    try:
        parse_semver(text, normalize)
    except CelValueError:
        return False
    return True


def _pre_key(identifier: str) -> tuple[int, int, str]:
    # semver.org 11.4: numeric identifiers sort numerically and before alphanumeric ones.
    if identifier.isdigit():
        return (0, int(identifier), "")
    return (1, 0, identifier)


def compare_semver(
    left: tuple[int, int, int, tuple[str, ...]], right: tuple[int, int, int, tuple[str, ...]]
) -> int:
    """-1, 0 or 1 by semver 2.0.0 precedence (a pre-release sorts before its release)."""
    if left[:3] != right[:3]:
        return -1 if left[:3] < right[:3] else 1
    lpre, rpre = left[3], right[3]
    if lpre == rpre:
        return 0
    if not lpre or not rpre:
        return 1 if not lpre else -1
    lkey = [_pre_key(p) for p in lpre]
    rkey = [_pre_key(p) for p in rpre]
    return -1 if lkey < rkey else 1


def compare(left: Any, right: Any) -> int:
    """``compareTo`` for two quantities or two versions: -1, 0 or 1.

    Raises:
        CelValueError: the operands are not two values of the same of these types.
    """
    if isinstance(left, dict) and SEMVER_KEY in left:
        return compare_semver(semver_of(left), semver_of(right))
    a, b = quantity_of(left), quantity_of(right)
    return (a > b) - (a < b)
