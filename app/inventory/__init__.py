"""The inventory: the fabric manager's hosts and devices, kept in the database.

* :mod:`app.inventory.validate` checks vendor data (pure);
* :mod:`app.inventory.plan` computes what a sync writes (pure);
* :mod:`app.inventory.sync` lists the backend and applies the plan (I/O);
* :mod:`app.inventory.queries` reads the stored inventory for the CLI and the admin API.
"""

from app.inventory.sync import InventorySync, SyncResult

__all__ = ["InventorySync", "SyncResult"]
