"""Publishing the desired pools as ResourceSlices: the pure classify / plan step (``plan``),
the informer-and-work-queue loop that applies it (``publisher``) and its metrics (``metrics``).

Importing the package defines the classes below and starts nothing.
"""

from app.publisher.metrics import PublisherMetrics
from app.publisher.publisher import PoolStatus, Publisher, PublisherSettings, PublisherStatus

__all__ = ["PoolStatus", "Publisher", "PublisherMetrics", "PublisherSettings", "PublisherStatus"]
