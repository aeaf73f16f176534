"""The settings both claim controllers share: the structured reconciler's
(:class:`app.claims.reconciler.ClaimSettings`) and the control-plane controller's
(:class:`app.controlplane.controller.ControlPlaneSettings`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.claims.fabric_ops import DEFAULT_DETACH_ATTEMPTS
from app.kube.informer import InformerSettings
from app.kube.workqueue import WorkQueueSettings


@dataclass(frozen=True)
class ControllerSettings:
    """Settings of a claim controller.

    Attributes:
        driver_name: our DRA driver.
        host_match, host_key: node -> fabric host rule (see :mod:`app.hostmap`).
        workers: keys reconciled at once.
        hosts_refresh_s: how long the node -> host index is reused.
        max_detach_attempts: transient detach failures in a row before ``detach-failed``.
        informer: base settings of the informers (the name is replaced).
        queue: work queue settings.
        identity: this replica's name, for Events.
    """

    driver_name: str
    host_match: str = "hostname"
    host_key: str = "fabric-dra.io/host-id"
    workers: int = 8
    hosts_refresh_s: float = 10.0
    max_detach_attempts: int = DEFAULT_DETACH_ATTEMPTS
    informer: InformerSettings = field(default_factory=lambda: InformerSettings(name="claims"))
    queue: WorkQueueSettings = field(default_factory=WorkQueueSettings)
    identity: str = "fabric-dra"


__all__ = ["ControllerSettings"]
