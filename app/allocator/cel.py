"""The DRA CEL environment, the compiled-expression cache and the class-selector result cache.

Backed by cel-expr-python (the CEL C++ runtime). What a selector sees
(k8s.io/dynamic-resource-allocation cel/compile.go):

* ``device.driver`` (string), ``device.allowMultipleAllocations`` (bool),
  ``device.attributes[domain][id]`` (int, bool, string, or a version) and
  ``device.capacity[domain][id]`` (quantities). Bare attribute names are under the driver's
  domain. Looking up an unknown domain gives an empty map (as Kubernetes'
  ``newStringInterfaceMapWithDefault``), so ``has(device.attributes["x.io"].a)`` is false and
  ``device.attributes["x.io"].a`` is a "no such key" error. The runtime's maps have no
  default, so the domains an expression indexes with a string literal
  (``attributes["x.io"]``) are added as empty maps before it runs, and iterating over
  ``device.attributes`` shows those added empty domains. A domain computed at run time
  (``device.attributes["x" + ".io"]``, ``cel.bind(d, ..., device.attributes[d])``) gets the
  empty map too: before compiling, ``device.attributes[<expr>]`` and ``device.capacity[<expr>]``
  with any index but a string literal are rewritten into a lookup function with that default
  (k8s.io/dynamic-resource-allocation cel/compile.go ``mapper.Find``). Only that spelling is
  rewritten: a computed lookup through an alias (``cel.bind(a, device.attributes, a[d])``) of a
  missing domain is still a "no such key" error.
* The Kubernetes quantity library (``quantity``, ``isQuantity``, ``compareTo``,
  ``isGreaterThan``, ``isLessThan``, ``asInteger``, ``asApproximateFloat``, ``isInteger``,
  ``sign``, ``add``, ``sub``) and semver library (``semver(s[, normalize])``,
  ``isSemver(s[, normalize])``, ``major``, ``minor``, ``patch``, ``compareTo``,
  ``isGreaterThan``, ``isLessThan``); see :mod:`app.allocator.values` for how the two types are
  carried.
* The CEL extensions Kubernetes' base environment has and the runtime ships: bindings
  (``cel.bind``), strings, math, optional types, encoders.

Limits: an expression longer than 10 KiB is refused before compiling
(``resourceapi.CELSelectorExpressionMaxLength``). Kubernetes stops an evaluation at a cost of
1,000,000 (``CELSelectorExpressionMaxCost``); the runtime has no cost meter, and its equivalent
bound is a budget of 10,000 comprehension iterations per evaluation (fixed by cel-expr-python
0.1.x) plus a parser nesting limit of 32: an evaluation past the budget is an error, like one past
the cost limit. The expression must have type bool (or dyn, then the value must be a bool).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

# cel-expr-python ships .pyi stubs but no py.typed marker.
from cel_expr_python import cel  # type: ignore[import-untyped]
from cel_expr_python.ext import (  # type: ignore[import-untyped]
    ext_bindings,
    ext_encoders,
    ext_math,
    ext_optional,
    ext_strings,
)

from app.allocator import values
from app.allocator.model import Device

MAX_EXPRESSION_LENGTH = 10 * 1024
ITERATION_BUDGET = 10_000
_MAP = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
# ``attributes["<domain>"]`` and ``capacity["<domain>"]`` with a string literal: the domains an
# expression looks up, which get the empty-map default.
_DOMAIN_LOOKUP = re.compile(
    r'(?:attributes|capacity)\s*\[\s*[rR]?(?:"(?P<a>[^"\\\n]*)"|\'(?P<b>[^\'\\\n]*)\')\s*\]'
)
_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The member function that computed domain lookups become (see _rewrite_lookups).
_LOOKUP_FUNCTION = "draDomainOrEmpty"
# ``device.attributes[`` / ``device.capacity[`` where ``device`` is the variable itself.
_COMPUTED_LOOKUP = re.compile(r"(?<![\w.])device\s*\.\s*(?:attributes|capacity)\s*\[")
_QUOTES = ('"""', "'''", '"', "'")


class CelError(Exception):
    """A selector that could not be compiled or evaluated.

    Attributes:
        expression: the CEL text.
        detail: what went wrong, as the runtime said it.
    """

    def __init__(self, expression: str, detail: str) -> None:
        super().__init__(detail)
        self.expression = expression
        self.detail = detail


class CompileError(CelError):
    """Syntax or type error, non-bool type, empty or too long expression."""


class EvaluationError(CelError):
    """Runtime error: unknown attribute, no such overload, iteration budget, non-bool value.

    Attributes:
        device: the device it happened on, when known.
    """

    device: str | None = None


@dataclass(frozen=True, slots=True)
class CompiledExpression:
    """A compiled selector.

    Attributes:
        text: the expression.
        program: the runtime's compiled form.
        domains: the literal domains the expression indexes ``attributes`` or ``capacity``
            with.
    """

    text: str
    program: Any
    domains: frozenset[str]


def _quantity_op(fn: Callable[[Fraction, Fraction], Any]) -> Callable[[Any, Any], Any]:
    def apply(left: Any, right: Any) -> Any:
        other = (
            Fraction(right)
            if isinstance(right, int) and not isinstance(right, bool)
            else (values.quantity_of(right))
        )
        return values.quantity_value(fn(values.quantity_of(left), other))

    return apply


def _semver_part(index: int) -> Callable[[Any], int]:
    def part(value: Any) -> int:
        major, minor, patch, _ = values.semver_of(value)
        return (major, minor, patch)[index]

    return part


def _overload(
    name: str, params: Sequence[Any], result: Any, impl: Callable[..., Any], member: bool = False
) -> cel.Overload:
    return cel.Overload(
        name, return_type=result, parameters=list(params), is_member=member, impl=impl
    )


def _functions() -> list[cel.FunctionDecl]:
    string, boolean, integer, double = (
        cel.Type.STRING,
        cel.Type.BOOL,
        cel.Type.INT,
        cel.Type.DOUBLE,
    )

    def quantity(text: str) -> Any:
        return values.quantity_value(values.parse_quantity(text))

    def q_sign(value: Any) -> int:
        q = values.quantity_of(value)
        return (q > 0) - (q < 0)

    return [
        cel.FunctionDecl("quantity", [_overload("string_to_quantity", [string], _MAP, quantity)]),
        cel.FunctionDecl(
            "isQuantity", [_overload("is_quantity_string", [string], boolean, values.is_quantity)]
        ),
        cel.FunctionDecl(
            "semver",
            [
                _overload("string_to_semver", [string], _MAP, values.semver_value),
                _overload("string_bool_to_semver", [string, boolean], _MAP, values.semver_value),
            ],
        ),
        cel.FunctionDecl(
            "isSemver",
            [
                _overload("is_semver_string", [string], boolean, values.is_semver),
                _overload("is_semver_string_bool", [string, boolean], boolean, values.is_semver),
            ],
        ),
        cel.FunctionDecl(
            "compareTo",
            [_overload("dra_compare_to", [_MAP, _MAP], integer, values.compare, member=True)],
        ),
        cel.FunctionDecl(
            "isGreaterThan",
            [
                _overload(
                    "dra_is_greater_than",
                    [_MAP, _MAP],
                    boolean,
                    lambda a, b: values.compare(a, b) > 0,
                    member=True,
                )
            ],
        ),
        cel.FunctionDecl(
            "isLessThan",
            [
                _overload(
                    "dra_is_less_than",
                    [_MAP, _MAP],
                    boolean,
                    lambda a, b: values.compare(a, b) < 0,
                    member=True,
                )
            ],
        ),
        cel.FunctionDecl(
            "major", [_overload("semver_major", [_MAP], integer, _semver_part(0), member=True)]
        ),
        cel.FunctionDecl(
            "minor", [_overload("semver_minor", [_MAP], integer, _semver_part(1), member=True)]
        ),
        cel.FunctionDecl(
            "patch", [_overload("semver_patch", [_MAP], integer, _semver_part(2), member=True)]
        ),
        cel.FunctionDecl(
            "asInteger",
            [
                _overload(
                    "quantity_as_integer",
                    [_MAP],
                    integer,
                    lambda v: values.as_integer(values.quantity_of(v)),
                    member=True,
                )
            ],
        ),
        cel.FunctionDecl(
            "asApproximateFloat",
            [
                _overload(
                    "quantity_as_float",
                    [_MAP],
                    double,
                    lambda v: float(values.quantity_of(v)),
                    member=True,
                )
            ],
        ),
        cel.FunctionDecl(
            "isInteger",
            [
                _overload(
                    "quantity_is_integer",
                    [_MAP],
                    boolean,
                    lambda v: values.quantity_of(v).denominator == 1,
                    member=True,
                )
            ],
        ),
        cel.FunctionDecl("sign", [_overload("quantity_sign", [_MAP], integer, q_sign, True)]),
        cel.FunctionDecl(
            _LOOKUP_FUNCTION,
            [
                _overload(
                    "dra_domain_or_empty",
                    [_MAP, string],
                    _MAP,
                    lambda domains, domain: domains.get(domain, {}),
                    member=True,
                )
            ],
        ),
        cel.FunctionDecl(
            "add",
            [
                _overload(
                    "quantity_add", [_MAP, _MAP], _MAP, _quantity_op(lambda a, b: a + b), True
                ),
                _overload(
                    "quantity_add_int",
                    [_MAP, integer],
                    _MAP,
                    _quantity_op(lambda a, b: a + b),
                    True,
                ),
            ],
        ),
        cel.FunctionDecl(
            "sub",
            [
                _overload(
                    "quantity_sub", [_MAP, _MAP], _MAP, _quantity_op(lambda a, b: a - b), True
                ),
                _overload(
                    "quantity_sub_int",
                    [_MAP, integer],
                    _MAP,
                    _quantity_op(lambda a, b: a - b),
                    True,
                ),
            ],
        ),
    ]


def _is_string_start(text: str, i: int) -> bool:
    if text[i] in "\"'":
        return True
    if text[i] not in "rRbB" or (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
        return False
    rest = text[i + 1 : i + 3]
    return bool(rest) and (rest[0] in "\"'" or (rest[0] in "rRbB" and rest[1:] in ('"', "'")))


def _skip_string(text: str, i: int) -> int:
    # Just past the string (or bytes) literal that starts at ``i``, prefix included.
    raw = False
    while text[i] in "rRbB":
        raw = raw or text[i] in "rR"
        i += 1
    quote = next(q for q in _QUOTES if text.startswith(q, i))
    i += len(quote)
    while i < len(text):
        if text[i] == "\\" and not raw:
            i += 2
        elif text.startswith(quote, i):
            return i + len(quote)
        elif text[i] == "\n" and len(quote) == 1:
            return i  # unterminated: the parser reports it
        else:
            i += 1
    return len(text)


def _skip_comment(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _closing_bracket(text: str, i: int) -> int | None:
    # The index of the ``]`` closing the bracket opened just before ``i``, or None.
    depth = 0
    while i < len(text):
        if text.startswith("//", i):
            i = _skip_comment(text, i)
            continue
        if _is_string_start(text, i):
            i = _skip_string(text, i)
            continue
        char = text[i]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return i if char == "]" else None
            depth -= 1
        i += 1
    return None


def _literal_domain(index: str) -> bool:
    # The index is a string literal that _domains picks up (its empty map is added).
    match = _DOMAIN_LOOKUP.fullmatch(f"attributes[{index.strip()}]")
    return match is not None and bool(_domains(match.group(0)))


def _rewrite_lookups(expression: str) -> str:
    """``expression`` with every ``device.attributes[<index>]`` and ``device.capacity[<index>]``
    whose index is not a literal domain turned into ``device.attributes.draDomainOrEmpty(
    <index>)`` (a missing domain is an empty map, as in Kubernetes). Text inside string
    literals and comments is left alone; an optional index (``[?...]``) too. Unchanged when
    there is nothing to rewrite or the brackets do not balance (the parser then says why)."""
    out: list[str] = []
    i = start = 0
    while i < len(expression):
        if expression.startswith("//", i):
            i = _skip_comment(expression, i)
            continue
        if _is_string_start(expression, i):
            i = _skip_string(expression, i)
            continue
        match = _COMPUTED_LOOKUP.match(expression, i)
        if match is None:
            i += 1
            continue
        close = _closing_bracket(expression, match.end())
        index = expression[match.end() : close] if close is not None else ""
        if close is None or index.lstrip().startswith("?") or _literal_domain(index):
            i = match.end()
            continue
        out.append(expression[start : match.end() - 1])
        out.append(f".{_LOOKUP_FUNCTION}({_rewrite_lookups(index)})")
        i = start = close + 1
    if not out:
        return expression
    out.append(expression[start:])
    return "".join(out)


def _domains(expression: str) -> frozenset[str]:
    found = set()
    for match in _DOMAIN_LOOKUP.finditer(expression):
        text = next((g for g in match.groups() if g is not None), "")
        if len(text) <= 63 and _DOMAIN.match(text):
            found.add(text)
    return frozenset(found)


class CelEnvironment:
    """The DRA CEL environment with a cache of compiled expressions, keyed by text.

    Compile failures are cached too. Not thread-safe; one per allocator.
    """

    def __init__(self) -> None:
        self._env = cel.NewEnv(
            variables={"device": _MAP},
            extensions=[
                ext_bindings.ExtBindings(),
                ext_strings.ExtStrings(),
                ext_math.ExtMath(),
                ext_optional.ExtOptional(),
                ext_encoders.ExtEncoders(),
            ],
            functions=_functions(),
        )
        self._compiled: dict[str, CompiledExpression | CompileError] = {}
        self.compile_hits = 0
        self.compile_misses = 0

    def compile(self, expression: str) -> CompiledExpression:
        """The compiled form of ``expression``, from the cache when seen before.

        Raises:
            CompileError: empty, longer than 10 KiB, syntax or type error, or not of type bool.
        """
        cached = self._compiled.get(expression)
        if cached is None:
            self.compile_misses += 1
            cached = self._compile(expression)
            self._compiled[expression] = cached
        else:
            self.compile_hits += 1
        if isinstance(cached, CompileError):
            raise cached
        return cached

    def _compile(self, expression: str) -> CompiledExpression | CompileError:
        if not expression.strip():
            return CompileError(expression, "expression is empty")
        if len(expression) > MAX_EXPRESSION_LENGTH:
            return CompileError(
                expression,
                f"expression is {len(expression)} bytes long, more "
                f"than the limit of {MAX_EXPRESSION_LENGTH}",
            )
        try:
            program = self._env.compile(_rewrite_lookups(expression))
        except RuntimeError as err:
            return CompileError(expression, f"compilation failed: {err}")
        kind = program.return_type()
        if kind != cel.Type.BOOL and kind != cel.Type.DYN:
            return CompileError(expression, f"must evaluate to bool, not {kind.name()}")
        return CompiledExpression(expression, program, _domains(expression))

    def evaluate(self, expressions: Sequence[CompiledExpression], device: Device) -> bool:
        """True when every expression is true for ``device`` (evaluated in order, stopping at
        the first false).

        Raises:
            EvaluationError: a runtime error or a non-bool value, naming the expression.
        """
        if not expressions:
            return True
        data = device.cel_device
        wanted = (
            expressions[0].domains
            if len(expressions) == 1
            else frozenset().union(*(e.domains for e in expressions))
        )
        attributes, capacity = data["attributes"], data["capacity"]
        missing = [d for d in wanted if d not in attributes or d not in capacity]
        if missing:
            data = dict(data)
            data["attributes"] = {**{d: {} for d in missing}, **attributes}
            data["capacity"] = {**{d: {} for d in missing}, **capacity}
        activation = self._env.Activation({"device": data})
        for expression in expressions:
            try:
                result = expression.program.eval(activation)
            except RuntimeError as err:
                raise EvaluationError(expression.text, str(err)) from err
            if result.type() == cel.Type.ERROR:
                raise EvaluationError(expression.text, str(result.value()))
            value = result.value()
            if not isinstance(value, bool):
                raise EvaluationError(
                    expression.text, f"CEL result of type {result.type().name()} is not a bool"
                )
            if not value:
                return False
        return True


class SelectorCache:
    """Results of a list of selectors over the devices of a pool, so repeated allocations do
    not evaluate CEL again.

    Keyed by the owner (``class <name>`` or ``request``), the selector texts, the owner of
    the candidates they were evaluated on (None for all devices), and the pool's driver, name
    and content fingerprint: a pool republished under a new generation with the same devices
    keeps its results, a changed device invalidates its pool's. Evaluation errors are cached
    too. Holds at most ``max_entries`` pool results; when full it starts afresh.
    """

    def __init__(self, environment: CelEnvironment, max_entries: int = 100_000) -> None:
        self._environment = environment
        self._results: dict[tuple[Any, ...], tuple[int, ...] | EvaluationError] = {}
        self._max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self.evaluations = 0

    def select(
        self,
        owner: str,
        selectors: tuple[str, ...],
        pool_key: tuple[str, str, str],
        devices: Sequence[Device],
        within: tuple[int, ...] | None = None,
        within_key: Any = None,
    ) -> tuple[int, ...]:
        """Indexes of the devices of a pool that pass every selector, looking only at the
        indexes in ``within`` (an earlier selection, identified by ``within_key``) when given.

        Raises:
            CompileError: a selector does not compile.
            EvaluationError: a selector fails on a device (``device`` set to its name).
        """
        key = (owner, selectors, within_key, *pool_key)
        cached = self._results.get(key)
        if cached is not None:
            self.hits += 1
        else:
            self.misses += 1
            compiled = [self._environment.compile(s) for s in selectors]
            cached = self._evaluate(compiled, devices, within)
            if len(self._results) >= self._max_entries:
                self._results.clear()
            self._results[key] = cached
        if isinstance(cached, EvaluationError):
            raise cached
        return cached

    def _evaluate(
        self,
        compiled: list[CompiledExpression],
        devices: Sequence[Device],
        within: tuple[int, ...] | None,
    ) -> tuple[int, ...] | EvaluationError:
        indexes = range(len(devices)) if within is None else within
        if not compiled:
            return tuple(indexes)
        out: list[int] = []
        for index in indexes:
            self.evaluations += 1
            try:
                if self._environment.evaluate(compiled, devices[index]):
                    out.append(index)
            except EvaluationError as err:
                err.device = devices[index].name
                return err
        return tuple(out)
