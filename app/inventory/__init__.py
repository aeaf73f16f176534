"""The inventory: the fabric manager's hosts and devices, kept in the database.

* :mod:`app.inventory.validate` checks vendor data (pure);
* :mod:`app.inventory.plan` computes what a sync writes (pure);
* :mod:`app.inventory.sync` lists the backend and applies the plan (I/O);
* :mod:`app.inventory.queries` reads the stored inventory for the CLI and the admin API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.lazy import lazy_exports

if TYPE_CHECKING:
    from app.inventory.sync import InventorySync, SyncResult

# Loaded on first use, so that importing a pure submodule (``validate``, ``plan``) loads no
# I/O library.
_EXPORTS = {
    "InventorySync": "app.inventory.sync",
    "SyncResult": "app.inventory.sync",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["InventorySync", "SyncResult"]
