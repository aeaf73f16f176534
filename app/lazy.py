"""Package exports loaded on first use, so that importing a package's pure submodule loads
none of the I/O libraries its other modules need.

A package lists its exports under ``TYPE_CHECKING`` (so that type checkers see them) and sets
``__getattr__ = lazy_exports(__name__, {"Name": "package.module", ...})``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: the exported name, imported from the module
    ``exports`` names for it on first use.

    The returned function raises AttributeError for a name that is not exported.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
