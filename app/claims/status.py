"""Writing the claim reconciler's ``status.devices`` entries into a ResourceClaim.

Only our driver's entries are rebuilt (:func:`app.claims.model.device_status_entries`); other
drivers' entries are copied unchanged. The write starts from the cached claim and, on a
conflict, reads the claim again and re-applies (:func:`app.kube.update.update_with_retry`);
nothing is written when the entries are already there.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from app.claims.model import DeviceReport, device_status_entries, same_device_status, wanted_devices
from app.jsontypes import JsonDict
from app.kube.client import FIELD_VALIDATION_STRICT, call_json
from app.kube.errors import KubeError, KubeNotFound
from app.kube.update import status_write_body, update_with_retry
from app.kube.versions import ResourceApiVersion, claim_from_wire, claim_to_wire
from app.metrics import ClaimMetrics

STATUS_WRITE_ATTEMPTS = 4


class ClaimStatusWriter:
    """Writes our ``status.devices`` entries of claims.

    Args:
        resources: the typed resource.k8s.io API object (:func:`app.kube.versions.resource_api`).
        version: its version.
        driver_name: our DRA driver.
        binding_conditions, binding_failure_conditions: condition types we set.
        clock: aware UTC time (condition transition times).
        metrics: optional (counts conflicts).
    """

    def __init__(
        self,
        resources: Any,
        version: ResourceApiVersion,
        driver_name: str,
        binding_conditions: tuple[str, ...],
        binding_failure_conditions: tuple[str, ...],
        clock: Callable[[], dt.datetime],
        metrics: ClaimMetrics | None = None,
    ) -> None:
        self._resources = resources
        self.version = version
        self.driver_name = driver_name
        self.binding_conditions = binding_conditions
        self.binding_failure_conditions = binding_failure_conditions
        self.clock = clock
        self.metrics = metrics

    async def write(self, claim: JsonDict, reports: list[DeviceReport]) -> JsonDict | None:
        """Write our ``status.devices`` entries. Returns the claim as the API server answered
        the write (a later write in the same pass compares with it, not with the cache), or
        None when nothing was written."""
        metadata = claim.get("metadata") or {}
        namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
        # The cached claim is usually current; a 409 means it was not, and we read it fresh.
        # Only status.devices is replaced, in a copy of the status: the cached claim is not
        # changed.
        first: JsonDict = {**claim, "status": dict(claim.get("status") or {})}

        async def read() -> JsonDict | None:
            try:
                return claim_from_wire(
                    await call_json(
                        self._resources.read_namespaced_resource_claim(
                            name, namespace, _preload_content=False
                        ),
                        f"read ResourceClaim {namespace}/{name}",
                    ),
                    self.version,
                    owned=True,
                )
            except KubeNotFound:
                return None

        async def write(fresh: JsonDict) -> JsonDict | None:
            current = list((fresh.get("status") or {}).get("devices") or [])
            wanted = set(wanted_devices(fresh, self.driver_name))
            entries = device_status_entries(
                fresh,
                self.driver_name,
                [r for r in reports if r.wanted in wanted],
                self.binding_conditions,
                self.binding_failure_conditions,
                self.clock(),
            )
            if same_device_status(entries, current):
                return None
            fresh.setdefault("status", {})["devices"] = entries
            # Strict: a device status field this server's version does not know would
            # otherwise be dropped with only a Warning header, and a lost binding condition
            # leaves the pod waiting with nobody told.
            written = await call_json(
                self._resources.replace_namespaced_resource_claim_status(
                    name,
                    namespace,
                    status_write_body(claim_to_wire(fresh, self.version)),
                    field_validation=FIELD_VALIDATION_STRICT,
                    _preload_content=False,
                ),
                f"update ResourceClaim {namespace}/{name} status",
            )
            return claim_from_wire(written, self.version, owned=True)

        def conflict(_: KubeError) -> None:
            # Someone else wrote the claim since we read it: it is read again and re-applied.
            if self.metrics:
                self.metrics.status_conflicts.inc()

        return await update_with_retry(
            first,
            write,
            read,
            gone=None,
            attempts=STATUS_WRITE_ATTEMPTS,
            uid=str(metadata.get("uid")),
            on_conflict=conflict,
        )


__all__ = ["STATUS_WRITE_ATTEMPTS", "ClaimStatusWriter"]
