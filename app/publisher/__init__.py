"""Publishing the desired pools as ResourceSlices: the pure classify / plan step (``plan``),
the informer-and-work-queue loop that applies it (``publisher``), its settings (``settings``),
its status snapshots (``status``) and its metrics (``metrics``).

Importing the package defines the classes below and starts nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.lazy import lazy_exports

if TYPE_CHECKING:
    from app.publisher.metrics import PublisherMetrics
    from app.publisher.publisher import Publisher
    from app.publisher.settings import PublisherSettings
    from app.publisher.status import PoolStatus, PublisherStatus

# Loaded on first use, so that importing a pure submodule (``plan``) loads no I/O library.
_EXPORTS = {
    "PublisherMetrics": "app.publisher.metrics",
    "PoolStatus": "app.publisher.status",
    "Publisher": "app.publisher.publisher",
    "PublisherSettings": "app.publisher.settings",
    "PublisherStatus": "app.publisher.status",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["PoolStatus", "Publisher", "PublisherMetrics", "PublisherSettings", "PublisherStatus"]
