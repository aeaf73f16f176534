"""Typed scalar values as kube-apiserver decodes and re-encodes them: quantities, integers
with Go's ranges, ``metav1.Time`` and ``metav1.MicroTime``.

The server decodes every body into Go structs and encodes them again, so what a client reads
back is the canonical form of what it wrote: ``1024Mi`` becomes ``1Gi``, a time with an offset
becomes UTC, a ``metav1.Time`` loses its fraction. A value the Go decoder refuses makes the whole
request a 400 (``<Kind> in version "<v>" cannot be handled as a <Kind>: <error>``, from
k8s.io/apimachinery pkg/runtime/serializer and the handlers' decode step).

Sources:

* quantities: k8s.io/apimachinery pkg/api/resource quantity.go (ParseQuantity,
  parseQuantityString, CanonicalizeBytes, MarshalJSON), suffix.go, amount.go;
* times: k8s.io/apimachinery pkg/apis/meta/v1 time.go and micro_time.go (UnmarshalJSON /
  MarshalJSON) over Go's time.Parse (src/time/format.go) with the layouts ``time.RFC3339`` and
  ``RFC3339Micro``;
* integers: encoding/json (as forked in sigs.k8s.io/json) UnmarshalTypeError messages.

Which fields hold which type is in :mod:`.defaults` (the per-kind tables).
"""

from __future__ import annotations

import calendar
import datetime
import functools
from fractions import Fraction
from typing import Any

# quantity.go splitREString / ErrFormatWrong, ErrNumeric, ErrSuffix.
QUANTITY_FORMAT_ERROR = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
QUANTITY_NUMERIC_ERROR = "unable to parse numeric part of quantity"
QUANTITY_SUFFIX_ERROR = "unable to parse quantity's suffix"

RFC3339 = "2006-01-02T15:04:05Z07:00"
RFC3339_MICRO = "2006-01-02T15:04:05.000000Z07:00"

_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
# suffix.go newSuffixer: suffix -> (base, exponent, format).
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_BY_EXPONENT = {e: s for s, e in _DECIMAL.items()}
_BINARY_BY_EXPONENT = {e: s for s, e in _BINARY.items()}
_MAX_INT64 = 2**63 - 1
_NANO = 10**9
# quantity.go: maxInt64Factors, the digits an int64 mantissa holds safely.
_MAX_INT64_FACTORS = 18

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


class ValueDecodeError(ValueError):
    """A value the Go decoder refuses; ``str(err)`` is the decoder's message."""


# --------------------------------------------------------------------------- quantities
def _scan(text: str) -> tuple[bool, str, str, str, str]:
    """quantity.go parseQuantityString: (positive, value, num, denom, suffix).

    Raises ValueDecodeError (ErrFormatWrong) when the suffix holds a non-digit after its sign.
    """
    positive, pos, end = True, 0, len(text)
    if pos < end and text[0] in "+-":
        positive = text[0] == "+"
        pos += 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "0", "", ""
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos >= end:
        return positive, text, text[start:], "", ""
    num = text[start:pos] or "0"
    denom = ""
    if text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
        if pos >= end:
            return positive, text, num, denom, ""
    value = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos >= end:
        return positive, value, num, denom, text[suffix_start:]
    if text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos >= end:
        return positive, value, num, denom, text[suffix_start:]
    raise ValueDecodeError(QUANTITY_FORMAT_ERROR)


def _interpret(suffix: str) -> tuple[int, int, str]:
    """suffix.go interpret: (base, exponent, format); ValueDecodeError (ErrSuffix) otherwise."""
    if suffix in _DECIMAL:
        return 10, _DECIMAL[suffix], "DecimalSI"
    if suffix in _BINARY:
        return 2, _BINARY[suffix], "BinarySI"
    if len(suffix) > 1 and suffix[0] in "eE":
        digits = suffix[1:]
        body = digits[1:] if digits[:1] in ("+", "-") else digits
        if body and all(c in _DIGITS for c in body):
            return 10, int(digits), "DecimalExponent"
    raise ValueDecodeError(QUANTITY_SUFFIX_ERROR)


def _strip(number: int, factor: int) -> tuple[int, int]:
    times = 0
    while number and number % factor == 0:
        number //= factor
        times += 1
    return number, times


def _decimal_form(nanos: int, fmt: str) -> str:
    """CanonicalizeBytes for DecimalSI / DecimalExponent (amount.go AsCanonicalBytes):
    trailing zeros moved into the exponent, the exponent lowered to a multiple of 3."""
    sign = "-" if nanos < 0 else ""
    mantissa, zeros = _strip(abs(nanos), 10)
    exponent = zeros - 9
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    if fmt == "DecimalSI":
        suffix = _DECIMAL_BY_EXPONENT.get(exponent, "")
    else:
        suffix = f"e{exponent}" if exponent else ""
    return f"{sign}{mantissa}{suffix}"


def _canonical(nanos: int, fmt: str) -> str:
    """quantity.go CanonicalizeBytes of a value held in nano units."""
    if nanos == 0:
        return "0"
    if fmt == "BinarySI":
        # Between -1024 and 1024, or not a whole number: shown as DecimalSI.
        if -1024 * _NANO < nanos < 1024 * _NANO or nanos % _NANO:
            return _decimal_form(nanos, "DecimalSI")
        whole = abs(nanos) // _NANO
        mantissa, power = _strip(whole, 1024)
        sign = "-" if nanos < 0 else ""
        return f"{sign}{mantissa}{_BINARY_BY_EXPONENT.get(power * 10, '')}"
    return _decimal_form(nanos, fmt)


@functools.lru_cache(maxsize=8192)
def canonical_quantity(text: str) -> str:
    """The form kube-apiserver answers for quantity ``text`` (what ``MarshalJSON`` writes after
    ``UnmarshalJSON``): ``1024Mi`` -> ``1Gi``, ``1000m`` -> ``1``, ``0.5Gi`` -> ``512Mi``,
    ``1500m`` -> ``1500m`` (a string already canonical is kept byte for byte, signs included).

    Raises:
        ValueDecodeError: not a quantity; the message is the Go error text.
    """
    text = text.strip()
    if not text:
        raise ValueDecodeError(QUANTITY_FORMAT_ERROR)
    if text == "0":
        return text
    positive, value, num, denom, suffix = _scan(text)
    base, exponent, fmt = _interpret(suffix)
    # The int64 fast path keeps the input when it is already canonical.
    if fmt == "BinarySI":
        precision = (15 - len(num) - int(exponent * 3 / 10) - 1) if not denom else -1
        scale = 0
    else:
        precision = _MAX_INT64_FACTORS - (len(num) + len(denom))
        scale = exponent
    if precision >= 0:
        scale -= len(denom)
        if scale >= -9:
            shifted = num + denom
            mantissa = int(shifted)
            if mantissa > _MAX_INT64:
                raise ValueDecodeError(QUANTITY_NUMERIC_ERROR)
            factor = 2**exponent if fmt == "BinarySI" else 1
            amount = mantissa * factor
            if amount <= _MAX_INT64:
                if fmt == "BinarySI":
                    if mantissa & 0x07:
                        return text
                elif scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0":
                    return text
                signed = amount if positive else -amount
                nanos = signed * 10 ** (scale + 9)
                return _canonical(nanos, fmt)
    # The inf.Dec path: exact value, magnitude rounded up to a whole nano.
    try:
        magnitude = abs(Fraction(value.lstrip("+-") or "0"))
    except ValueError as err:
        raise ValueDecodeError(QUANTITY_NUMERIC_ERROR) from err
    magnitude *= Fraction(base) ** exponent
    nanos = -((-magnitude * _NANO).__floor__())
    if fmt == "BinarySI" and nanos > _MAX_INT64 * _NANO:
        nanos = _MAX_INT64 * _NANO
    if fmt == "BinarySI" and 0 < nanos < _NANO:
        fmt = "DecimalSI"
    return _canonical(nanos if positive else -nanos, fmt)


def quantity_from_json(value: Any) -> str:
    """Quantity.UnmarshalJSON + MarshalJSON of a decoded JSON value: strings and numbers are
    parsed (a number as its text), anything else fails like the Go parser does.

    Raises:
        ValueDecodeError: the Go error text.
    """
    if isinstance(value, str):
        return canonical_quantity(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueDecodeError(QUANTITY_FORMAT_ERROR)
    return canonical_quantity(repr(value))


# --------------------------------------------------------------------------- integers
def json_kind(value: Any) -> str:
    """The encoding/json name of a decoded value's JSON type (for UnmarshalTypeError)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {value!r}" if isinstance(value, float) else f"number {value}"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def check_int(value: Any, bits: int, struct: str, path: str) -> None:
    """Refuse what encoding/json refuses for an ``int<bits>`` field: floats (even ``2.0``),
    non-numbers and out-of-range numbers. ``struct``/``path`` name the field in the message
    (``json: cannot unmarshal number 1.5 into Go struct field LeaseSpec.spec.leaseDurationSeconds
    of type int32``). None is accepted (a null leaves the field unset).

    Raises:
        ValueDecodeError: the decoder's message.
    """
    if value is None:
        return
    low, high = INT32 if bits == 32 else INT64
    if type(value) is int and low <= value <= high:
        return
    raise ValueDecodeError(
        f"json: cannot unmarshal {json_kind(value)} into Go struct field "
        f"{struct}.{path} of type int{bits}"
    )


# --------------------------------------------------------------------------- times
def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _TimeParseError(Exception):
    def __init__(self, value_elem: str, layout_elem: str, message: str = "") -> None:
        super().__init__(value_elem)
        self.value_elem, self.layout_elem, self.message = value_elem, layout_elem, message


def _getnum(text: str, fixed: bool, elem: str) -> tuple[int, str]:
    # format.go getnum: one or two digits (exactly two when fixed).
    if not text or text[0] not in _DIGITS:
        raise _TimeParseError(text, elem)
    if len(text) < 2 or text[1] not in _DIGITS:
        if fixed:
            raise _TimeParseError(text, elem)
        return int(text[0]), text[1:]
    return int(text[:2]), text[2:]


def _literal(text: str, char: str) -> str:
    if not text or text[0] != char:
        raise _TimeParseError(text, char)
    return text[1:]


def _parse_go_time(text: str, micro: bool) -> tuple[datetime.datetime | None, int]:
    """Go's time.Parse with RFC3339 (``micro`` False) or RFC3339Micro: (UTC instant at second
    precision or None for year 0, nanoseconds). Raises _TimeParseError."""
    rest = text
    if len(rest) < 4 or not all(c in _DIGITS for c in rest[:4]):
        raise _TimeParseError(rest, "2006")
    year, rest = int(rest[:4]), rest[4:]
    rest = _literal(rest, "-")
    month, after = _getnum(rest, True, "01")
    if not 1 <= month <= 12:
        raise _TimeParseError(after, "01", ": month out of range")
    rest = _literal(after, "-")
    day, rest = _getnum(rest, True, "02")
    rest = _literal(rest, "T")
    hour, after = _getnum(rest, False, "15")
    if hour >= 24:
        raise _TimeParseError(after, "15", ": hour out of range")
    rest = _literal(after, ":")
    minute, after = _getnum(rest, True, "04")
    if minute >= 60:
        raise _TimeParseError(after, "04", ": minute out of range")
    rest = _literal(after, ":")
    second, rest = _getnum(rest, True, "05")
    if second >= 60:
        raise _TimeParseError(rest, "05", ": second out of range")
    nanos = 0
    if micro:
        # stdFracSecond0 demands exactly the layout's six digits.
        if len(rest) < 7 or rest[0] not in ".," or not all(c in _DIGITS for c in rest[1:7]):
            raise _TimeParseError(rest, ".000000")
        nanos, rest = int(rest[1:7]) * 1000, rest[7:]
    elif len(rest) >= 2 and rest[0] in ".," and rest[1] in _DIGITS:
        # A fraction the layout does not have is accepted after the seconds.
        n = 2
        while n < len(rest) and rest[n] in _DIGITS:
            n += 1
        nanos, rest = int(rest[1 : min(n, 10)].ljust(9, "0")), rest[n:]
    offset = 0
    if rest[:1] == "Z":
        rest = rest[1:]
    else:
        if (
            len(rest) < 6
            or rest[3] != ":"
            or rest[0] not in "+-"
            or not all(c in _DIGITS for c in rest[1:3] + rest[4:6])
        ):
            raise _TimeParseError(rest, "Z07:00")
        hours, minutes = int(rest[1:3]), int(rest[4:6])
        if hours > 24:
            raise _TimeParseError(rest[6:], "Z07:00", ": time zone offset hour out of range")
        if minutes > 60:
            raise _TimeParseError(rest[6:], "Z07:00", ": time zone offset minute out of range")
        offset = (hours * 60 + minutes) * 60 * (1 if rest[0] == "+" else -1)
        rest = rest[6:]
    if rest:
        raise _TimeParseError(rest, "", ": extra text: " + _quote(rest))
    days_in = calendar.monthrange(year or 2000, month)[1]
    if day < 1 or day > days_in:
        raise _TimeParseError("", "", ": day out of range")
    if year == 0:
        return None, nanos
    local = datetime.datetime(year, month, day, hour, minute, second)
    try:
        return local - datetime.timedelta(seconds=offset), nanos
    except OverflowError:
        return None, nanos


def _time_from_json(value: Any, micro: bool) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        kind = json_kind(value).split(" ")[0]
        raise ValueDecodeError(f"json: cannot unmarshal {kind} into Go value of type string")
    layout = RFC3339_MICRO if micro else RFC3339
    try:
        instant, nanos = _parse_go_time(value, micro)
    except _TimeParseError as err:
        head = f"parsing time {_quote(value)}"
        if err.message:
            raise ValueDecodeError(head + err.message) from None
        raise ValueDecodeError(
            f"{head} as {_quote(layout)}: cannot parse "
            f"{_quote(err.value_elem)} as {_quote(err.layout_elem)}"
        ) from None
    if instant is None:
        return value  # years the Python calendar lacks: kept as written
    if instant == datetime.datetime(1, 1, 1) and nanos == 0:
        return None  # the zero time is written as null
    if micro:
        return instant.strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos // 1000:06d}Z"
    return instant.strftime("%Y-%m-%dT%H:%M:%SZ")


@functools.lru_cache(maxsize=4096)
def _cached_time(value: str, micro: bool) -> str | None:
    return _time_from_json(value, micro)


def time_from_json(value: Any) -> str | None:
    """metav1.Time UnmarshalJSON + MarshalJSON: RFC 3339 in, UTC at whole seconds out
    (``2026-01-02T04:04:05.75+01:00`` -> ``2026-01-02T03:04:05Z``); null and the zero time
    give None.

    Raises:
        ValueDecodeError: Go's parse error text.
    """
    if isinstance(value, str):
        return _cached_time(value, False)
    return _time_from_json(value, False)


def micro_time_from_json(value: Any) -> str | None:
    """metav1.MicroTime UnmarshalJSON + MarshalJSON: RFC3339Micro, exactly six fraction digits
    (Go's ``.000000`` layout element), UTC out; null and the zero time give None.

    Raises:
        ValueDecodeError: Go's parse error text (``cannot parse "Z" as ".000000"`` for a time
            without its fraction).
    """
    if isinstance(value, str):
        return _cached_time(value, True)
    return _time_from_json(value, True)


__all__ = [
    "INT32",
    "INT64",
    "QUANTITY_FORMAT_ERROR",
    "ValueDecodeError",
    "canonical_quantity",
    "check_int",
    "micro_time_from_json",
    "quantity_from_json",
    "time_from_json",
]
