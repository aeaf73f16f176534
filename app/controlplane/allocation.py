"""The control-plane claim pass: attach the devices of a claim we allocated, and give them back
when the claim is deallocated or deleted.

One pass per claim (key ``("claim", uid, "")``), under the claim's lock, so that it never
runs beside the scheduling pass that allocates the same claim (:mod:`.scheduling`):

* gone, foreign or still pending: release whatever control-plane reservations it holds
  (pending ones were left by an allocation that stopped before its status write: nothing was
  sent to the fabric for them);
* allocated: plan with :func:`app.claims.plan.plan_claim` and attach (the journal records
  ``attaching`` before each call; Events Attached / AttachFailed);
* deallocation requested or being deleted, with nothing in ``reservedFor``: detach and
  release, then clear ``allocation`` and ``deallocationRequested`` in one status update, then
  remove our finalizer by a JSON patch guarded by a ``test`` of the finalizers list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.claims.model import (
    EffectiveConfig,
    InvalidClaimConfig,
    effective_config,
    node_from_allocation,
)
from app.claims.plan import ClaimWants, plan_claim
from app.controlplane import plan as cp
from app.journal import ClaimRef, DeviceHeld, ReservationView, UnknownDevice
from app.jsontypes import JsonDict
from app.kube.versions import ResourceApiVersion

if TYPE_CHECKING:
    from app.controlplane.controller import ControlPlaneController

MODE = "control-plane"
VERSION = ResourceApiVersion.V1ALPHA3
WRITE_ATTEMPTS = 5
JSON_PATCH = "application/json-patch+json"
REASON_DEVICE_TAKEN = "DeviceTaken"
REASON_DEALLOCATED = "Deallocated"


class ClaimPass:
    """Attaches and deallocates the claims of one :class:`ControlPlaneController`, whose
    informers, journal, fabric operations and claim writes it uses."""

    def __init__(self, controller: ControlPlaneController) -> None:
        self.controller = controller

    async def sync(self, uid: str) -> bool:
        """Attach, or deallocate, one claim. Returns True to look again later.

        Raises:
            KubeError, FabricError, SQLAlchemyError: a failure to retry with backoff.
        """
        async with self.controller.claim_lock(uid):
            return await self._sync(uid)

    async def _sync(self, uid: str) -> bool:
        c = self.controller
        claim = c.claim_by_uid(uid)
        reservations = [r for r in await c.journal.for_claim(uid) if r.mode == MODE]
        phase = cp.claim_phase(claim, c.settings.driver_name)
        if phase in ("gone", "foreign", "pending"):
            # Pending: reservations left by an allocation that stopped before its status
            # write; nothing was sent to the fabric for them. Gone: detach what it held.
            done = True
            for reservation in reservations:
                done &= await c.ops.release(reservation, claim)
            return not done
        assert claim is not None
        if phase == "deleting":
            return False
        if phase == "deallocate":
            return await self._deallocate(claim, reservations)
        return await self._attach(claim, reservations)

    async def _attach(self, claim: JsonDict, reservations: list[ReservationView]) -> bool:
        c = self.controller
        driver = c.settings.driver_name
        allocation = cp.allocation_of(claim) or {}
        if allocation.get("controller") not in (None, driver):
            return False
        wanted = cp.wanted_results(claim, driver)
        configs: dict[str, EffectiveConfig] = {}
        config_error = None
        try:
            configs = effective_config(claim, driver, {w.request for w in wanted})
        except InvalidClaimConfig as err:
            config_error = f"invalid configuration for {driver}: {err}"
        node = (
            next((r.node for r in reservations if r.node), None)
            or node_from_allocation(claim)
            or self._consumer_node(claim)
        )
        host = None
        if node is not None:
            host = next(
                (r.host_id for r in reservations if r.node == node and r.host_id), None
            ) or (await c.snapshots.host_map()).get(node)
        plan = plan_claim(ClaimWants(wanted, node, host, config_error), reservations, c.clock())
        requeue = plan.requeue
        for reservation in plan.release:
            requeue |= not await c.ops.release(reservation, claim)
        attach = list(plan.attach)
        for reservation in plan.retry:
            again = await c.ops.retry_repair(reservation, claim)
            if again is not None:
                attach.append(again)
        metadata = claim["metadata"]
        ref = ClaimRef(str(metadata["uid"]), str(metadata["namespace"]), str(metadata["name"]))
        for item in plan.reserve:
            try:
                attach.append(
                    await c.journal.reserve(
                        ref,
                        item.request,
                        item.device,
                        item.pool,
                        MODE,
                        node,
                        host,
                        manager=c.snapshots.manager_of(node) if node else None,
                    )
                )
            except (DeviceHeld, UnknownDevice) as err:
                await c.warn(
                    claim, REASON_DEVICE_TAKEN, f"device {item.device} cannot be reserved: {err}"
                )
        for reservation in attach:
            _, retry = await c.ops.attach(
                reservation, claim, configs.get(reservation.request, EffectiveConfig())
            )
            requeue |= retry
        for _, reason in plan.refuse[:1]:
            await c.warn(claim, "InvalidConfig", reason)
        return requeue

    def _consumer_node(self, claim: JsonDict) -> str | None:
        c = self.controller
        namespace = str((claim.get("metadata") or {}).get("namespace") or "")
        for consumer in cp.reserved_for(claim):
            if consumer.get("resource") != "pods":
                continue
            name = str(consumer.get("name"))
            pod = c.pods.get(name, namespace)
            if pod and (pod.get("spec") or {}).get("nodeName"):
                return str(pod["spec"]["nodeName"])
            context = c.contexts.get(name, namespace)
            if context and (context.get("spec") or {}).get("selectedNode"):
                return str(context["spec"]["selectedNode"])
        return None

    async def _deallocate(self, claim: JsonDict, reservations: list[ReservationView]) -> bool:
        c = self.controller
        done = True
        for reservation in reservations:
            done &= await c.ops.release(reservation, claim)
        if not done:
            return True
        metadata = claim.get("metadata") or {}
        namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
        uid = str(metadata.get("uid"))

        async def give_back(current: JsonDict) -> bool:
            if cp.claim_phase(current, c.settings.driver_name) != "deallocate":
                return True  # a consumer came back meanwhile: look again
            if cp.needs_status_clear(current):
                current = await c.write_claim_status(cp.cleared_status(current))
                if reservations:
                    await c.events.record(
                        current,
                        "Normal",
                        REASON_DEALLOCATED,
                        "devices released; allocation cleared",
                    )
            patch = cp.remove_finalizer_patch(current, c.finalizer)
            if patch is not None:
                await c.patch_claim(
                    namespace,
                    name,
                    patch,
                    f"remove finalizer {c.finalizer} from ResourceClaim {namespace}/{name}",
                )
            c.warned.pop(uid, None)
            return False

        return await c.update_claim(claim, give_back, gone=False, guarded_patch=True)


__all__ = ["ClaimPass"]
