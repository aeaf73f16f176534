"""The inventory: the fabric manager's hosts and devices, kept in the database.

* :mod:`app.inventory.validate` checks vendor data (pure);
* :mod:`app.inventory.plan` computes what a sync writes (pure);
* :mod:`app.inventory.sync` lists the backend and applies the plan (I/O);
* :mod:`app.inventory.queries` reads the stored inventory for the CLI and the admin API.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.inventory.sync import InventorySync, SyncResult

# Loaded on first use, so that importing a pure submodule (``validate``, ``plan``) loads no
# I/O library.
_EXPORTS = {
    "InventorySync": "app.inventory.sync",
    "SyncResult": "app.inventory.sync",
}


def __getattr__(name: str) -> Any:
    """The exported class ``name``, imported from its module on first use.

    Raises:
        AttributeError: ``name`` is not exported.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["InventorySync", "SyncResult"]
