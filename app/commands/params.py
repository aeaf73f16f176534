"""Command-line parameter types the commands and simulators share (click only)."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf``: a NaN passes every range
    check (each comparison is false), so ``--timeout nan`` would be taken and wait forever.
    Options that take seconds give a finite maximum too (at most a day)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class WholeNumberRange(click.IntRange):
    """``click.IntRange`` that calls itself a whole number: text that is not one reads
    "'abc' is not a valid whole number." rather than click's "... integer range."."""

    name = "whole number"


MAX_SECONDS = 86_400.0
"""The largest number of seconds a command-line option takes (a day)."""
