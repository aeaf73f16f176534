"""CEL selector checks of the resource.k8s.io write rules: an expression is compiled in the
project's DRA CEL environment (:mod:`app.allocator.cel`) and a syntax or type error becomes the
422 cause kube-apiserver reports.

Port of k8s.io/kubernetes pkg/apis/resource/validation/validation.go validateCELSelector
(1.31) / validateCELExpression (1.34+) with convertCELErrorToValidationError: a too long
expression is FieldValueTooLong and not compiled, an empty one FieldValueRequired, a compile
error FieldValueInvalid with the compiler's message. The cost limit is not checked: the
runtime has no cost estimate (see :mod:`app.allocator.cel`).

Compiling is the costly part of a write, so results are cached by expression text, and the
environment is built on first use, not at import.
"""

from __future__ import annotations

from app.allocator.cel import MAX_EXPRESSION_LENGTH, CelEnvironment, CompileError

from .dra import cause_invalid, cause_required, cause_too_long
from .errors import Cause

_MAX_CACHED = 10_000


class CelChecker:
    """Compiles selector expressions once each and remembers whether they compiled.

    ``results`` maps expression text to the compiler's message ('' when it compiled).
    """

    def __init__(self) -> None:
        self._env: CelEnvironment | None = None
        self.results: dict[str, str] = {}

    def error(self, expression: str) -> str:
        """The compiler's message for ``expression``, '' when it compiles."""
        cached = self.results.get(expression)
        if cached is not None:
            return cached
        if self._env is None:
            self._env = CelEnvironment()
        try:
            self._env.compile(expression)
            message = ""
        except CompileError as err:
            message = err.detail
        if len(self.results) >= _MAX_CACHED:
            self.results.clear()
        self.results[expression] = message
        return message


_checker: CelChecker | None = None


def checker() -> CelChecker:
    """The shared :class:`CelChecker` (built on first use)."""
    global _checker
    if _checker is None:
        _checker = CelChecker()
    return _checker


def cel_expression_causes(
    expression: object, field: str, *, length_limit: bool = True
) -> list[Cause]:
    """Causes for a selector's ``cel.expression`` at ``field``: required, at most 10 KiB,
    compiles to a bool. Source: validateCELExpression / validateCELSelector.

    ``length_limit`` False: the 1.31 rules, which had no length limit (it came in 1.32); a
    longer expression is then accepted unchecked, as the project's environment cannot
    compile it.
    """
    if not isinstance(expression, str) or not expression:
        return [cause_required(field)]
    if len(expression) > MAX_EXPRESSION_LENGTH:
        return [cause_too_long(field, MAX_EXPRESSION_LENGTH)] if length_limit else []
    message = checker().error(expression)
    if message:
        return [cause_invalid(field, expression, message)]
    return []
