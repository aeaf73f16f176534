"""The :class:`~app.publisher.publisher.Publisher`'s settings: debounce, workers, write
concurrency, backoff, conflict retries, timeouts, the resync period and the informer's settings,
checked when they are made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.kube.informer import InformerSettings


@dataclass(frozen=True)
class PublisherSettings:
    """Settings of the :class:`~app.publisher.publisher.Publisher`.

    Attributes:
        debounce_s: seconds to wait after a desired change or a watch event before syncing a
            pool, so a burst of changes makes one sync (> 0).
        workers: pools synced at the same time (>= 1).
        write_concurrency: writes sent at the same time within one phase (deletes, updates or
            creates) of one pool's sync (>= 1).
        retry_base_s / retry_max_s: per-pool backoff after a failed sync: base * 2**failures,
            capped (seconds).
        conflict_retries: re-reads and re-plans within one sync after a 409, before the pool
            is requeued with backoff (>= 0).
        request_timeout_s: client timeout of each write or read, seconds (> 0).
        resync_period_s: seconds between full resyncs (> 0): the slices are listed from the API
            server, the local view is corrected, and every pool is synced (see
            :meth:`~app.publisher.publisher.Publisher.resync`). The default is upstream's 10
            minutes (``resyncPeriod`` in
            k8s.io/dynamic-resource-allocation/resourceslice/resourceslicecontroller.go).
        informer: settings of the ResourceSlice informer; its ``field_selector`` is replaced by
            ``spec.driver=<driver>``. The default lists 50 slices a page: a slice holds up to
            128 devices, so a page of 500 would be some 60 MB of JSON at once.
    """

    debounce_s: float = 1.0
    workers: int = 8
    write_concurrency: int = 8
    retry_base_s: float = 0.5
    retry_max_s: float = 300.0
    conflict_retries: int = 3
    request_timeout_s: float = 30.0
    resync_period_s: float = 600.0
    informer: InformerSettings = field(
        default_factory=lambda: InformerSettings(name="resourceslices", page_size=50)
    )

    def __post_init__(self) -> None:
        if self.debounce_s <= 0:
            raise ValueError("publisher: debounce_s must be > 0")
        if self.workers < 1 or self.write_concurrency < 1:
            raise ValueError("publisher: workers and write_concurrency must be >= 1")
        if not 0 < self.retry_base_s <= self.retry_max_s:
            raise ValueError("publisher: need 0 < retry_base_s <= retry_max_s")
        if self.conflict_retries < 0:
            raise ValueError("publisher: conflict_retries must be >= 0")
        if self.request_timeout_s <= 0:
            raise ValueError("publisher: request_timeout_s must be > 0")
        if self.resync_period_s <= 0:
            raise ValueError("publisher: resync_period_s must be > 0")
