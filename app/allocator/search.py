"""The backtracking allocator: the claims of one pod, on one node.

Rules (k8s.io/dynamic-resource-allocation structured/internal allocator, and DRA-REFERENCE.md
"Classic DRA"):

* Candidates come from complete, valid pools only, and only devices that reach the node; pools in
  name order (those with binding conditions last, see :mod:`app.allocator.pools`), devices by
  name. Every reachable device is checked against the class selectors, then the request
  selectors; a CEL error on any of them aborts the allocation with an error naming the class or
  the request and the expression.
* ``ExactCount`` takes ``count`` devices; ``All`` takes every matching device, needs at least
  one, and fails while a pool reaching the node is incomplete or invalid, or while one of its
  devices is in use (unless the request has admin access) -- the v1 ``DeviceRequest`` doc -- or
  has a taint the request does not tolerate: ``All`` never takes a subset (upstream
  structured/internal/experimental/allocator_experimental.go lists every selectable device
  for ``All`` and gives up when ``allocateDevice`` refuses one, tainted ones included).
* A device already in use, or chosen earlier in this search, is skipped unless the request has
  admin access; admin-access choices do not make a device unavailable to other claims. Within
  one claim no device is chosen twice, admin access or not (allocator_experimental.go
  ``allocatingDeviceForClaim``). A device with a ``NoSchedule`` or ``NoExecute`` taint is
  skipped unless the request tolerates it (KEP-5055), admin access or not.
* Constraints are per claim: ``matchAttribute`` needs every device of the listed requests (all
  when the list is empty; a request name covers its subrequests) to have the same value of the
  attribute, ``distinctAttribute`` pairwise different values; a device lacking the attribute is
  refused. Values compare by type and value (versions as written).
* ``firstAvailable`` subrequests are tried in order for each request.
* One claim's allocation holds at most 32 devices (``AllocationResultsMaxSize``): a request
  needing more fails at once, and the search never places a 33rd device in a claim.
* The search walks requests in claim order and devices in candidate order, and takes the first
  complete solution. It gives up after ``max_steps`` device placements and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from app.allocator import outcome as oc
from app.allocator.cel import CelEnvironment, CompileError, EvaluationError, SelectorCache
from app.allocator.model import (
    ALLOCATION_MODE_ALL,
    Claim,
    Constraint,
    Device,
    DeviceClass,
    DeviceId,
    DeviceRequest,
    Node,
    qualify,
)
from app.allocator.pools import Pool, reach_matches
from app.allocator.results import allocation

_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
# resourceapi.AllocationResultsMaxSize: results one claim's allocation may hold.
MAX_RESULTS = 32
# Failures a skipped pool may explain: their messages name the skipped pools.
_SHORTAGES = frozenset(
    {
        oc.NOT_ENOUGH_DEVICES,
        oc.DEVICES_CONTENDED,
        oc.CONSTRAINT_FAILED,
        oc.DEVICES_NOT_FREE,
        oc.DEVICES_TAINTED,
    }
)


class _Abort(Exception):
    def __init__(self, failure: oc.Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class _Limit(Exception):
    pass


@dataclass(slots=True)
class _Candidates:
    devices: list[Device]
    report: oc.RequestReport


def _attribute(device: Device, name: str) -> tuple[str, Any] | None:
    value = device.attributes.get(qualify(name, device.driver))
    if value is None:
        return None
    kind, raw = value
    return (kind, tuple(raw)) if isinstance(raw, list) else (kind, raw)


class Allocator:
    """Allocates devices to the claims of a pod; holds the CEL and selector caches.

    One instance serves many allocations (the caches make repeated ones fast); it is not
    thread-safe.

    Args:
        max_steps: device placements tried before a search gives up (each failure analysis
            re-run gets as many again).
        cache_entries: pool results the selector cache holds.
    """

    def __init__(self, *, max_steps: int = 200_000, cache_entries: int = 100_000) -> None:
        self.environment = CelEnvironment()
        self.selectors = SelectorCache(self.environment, cache_entries)
        self.max_steps = max_steps
        self._tainted: dict[tuple[str, str, str], bool] = {}
        self._tainted_entries = cache_entries

    def allocate(
        self,
        claims: Sequence[Claim],
        classes: Mapping[str, DeviceClass],
        pools: Sequence[Pool],
        in_use: Collection[DeviceId],
        node: Node,
    ) -> oc.Outcome:
        """Allocations for all ``claims`` of one pod on ``node``, or a :class:`Failure`.

        Args:
            claims: the pod's unallocated claims, allocated together (no device is shared
                between them unless admin access).
            classes: device classes by name.
            pools: from :func:`app.allocator.pools.gather_pools`, in allocation order.
            in_use: (driver, pool, device) of devices allocated to other claims.
            node: the node the pod goes to.

        Never raises for bad claims, classes, selectors or pools: those are failures.
        """
        run = _Run(self, claims, classes, pools, in_use, node)
        try:
            return run.execute()
        except _Abort as abort:
            return oc.Outcome(failure=abort.failure, reports=tuple(run.reports()))

    def has_taints(self, pool: Pool) -> bool:
        """Whether any device of ``pool`` has a taint (remembered by the pool's content key,
        which covers its devices' taints)."""
        known = self._tainted.get(pool.key)
        if known is None:
            if len(self._tainted) >= self._tainted_entries:
                self._tainted.clear()
            known = self._tainted[pool.key] = any(d.taints for d in pool.devices)
        return known

    def stats(self) -> dict[str, int]:
        """Cache counters: compiled expressions and pool selector results."""
        return {
            "compile_hits": self.environment.compile_hits,
            "compile_misses": self.environment.compile_misses,
            "selector_hits": self.selectors.hits,
            "selector_misses": self.selectors.misses,
            "selector_evaluations": self.selectors.evaluations,
        }


def _pools_in_use(
    in_use: Collection[DeviceId], reachable_devices: int
) -> Callable[[str, str], bool]:
    """Whether a pool (driver, name) may have a device in ``in_use``: False means none has,
    so the pool's devices need no check one by one.

    An ``in_use`` with a ``may_hold_pool(driver, pool)`` method (the control plane's
    :class:`app.controlplane.plan.InUseView`) answers itself. Any other collection is indexed
    once, unless it is larger than the devices the allocation looks at (then every pool may).
    """
    probe = getattr(in_use, "may_hold_pool", None)
    if callable(probe):
        return cast(Callable[[str, str], bool], probe)
    if len(in_use) > reachable_devices:
        return lambda driver, pool: True
    pools = {(driver, pool) for driver, pool, _ in in_use}
    return lambda driver, pool: (driver, pool) in pools


class _Run:
    """One allocation attempt: candidate gathering, search, failure analysis."""

    def __init__(
        self,
        allocator: Allocator,
        claims: Sequence[Claim],
        classes: Mapping[str, DeviceClass],
        pools: Sequence[Pool],
        in_use: Collection[DeviceId],
        node: Node,
    ) -> None:
        self.allocator = allocator
        self.claims = claims
        self.classes = classes
        self.in_use = in_use
        self.node = node
        self.slots = [(ci, r) for ci, claim in enumerate(claims) for r in claim.requests]
        # Pools of one reach (the slices of a rack all select the same nodes, say) are
        # checked against the node once: the check costs microseconds, the pools are many.
        reach_memo: dict[str, bool] = {}

        def reaches(pool: Pool) -> bool:
            if not pool.reach_key:
                return pool.reaches_node(node)
            known = reach_memo.get(pool.reach_key)
            if known is None:
                known = reach_memo[pool.reach_key] = pool.reaches_node(node)
            return known

        reaching = [p for p in pools if reaches(p)]
        self.pools = [p for p in reaching if p.usable]
        # A pool whose slices disagree on their count is reported as invalid only.
        self.incomplete = tuple(p.describe() for p in reaching if not p.complete and p.consistent)
        self.invalid = tuple(
            f"{p.describe()} ({p.invalid_reason})" for p in reaching if p.invalid_reason is not None
        )
        self.candidates: dict[tuple[int, str], _Candidates] = {}
        self.may_hold_pool = _pools_in_use(in_use, sum(len(p.devices) for p in self.pools))
        # An in_use with an ``in_use_of_pool(driver, pool)`` method (the control plane's
        # InUseView) gives each pool's devices in use as a plain collection.
        of_pool = getattr(in_use, "in_use_of_pool", None)
        self.in_use_of_pool: Callable[[str, str], Collection[DeviceId]] = (
            of_pool if callable(of_pool) else lambda driver, pool: in_use
        )

    def reports(self) -> list[oc.RequestReport]:
        return [c.report for c in self.candidates.values()]

    def _fail(self, reason: str, message: str, **details: Any) -> _Abort:
        if reason in _SHORTAGES and (self.incomplete or self.invalid):
            # Whoever reads only the message (claim events, the scheduler's log) learns
            # why devices it may expect were not offered.
            skipped = [f"{p} (incomplete)" for p in self.incomplete] + list(self.invalid)
            message += "; pools reaching the node that were skipped: " + ", ".join(skipped)
        return _Abort(
            oc.Failure(
                reason,
                message,
                incomplete_pools=self.incomplete,
                invalid_pools=self.invalid,
                **details,
            )
        )

    def execute(self) -> oc.Outcome:
        for claim in self.claims:
            least = sum(
                min(
                    1 if a.allocation_mode == ALLOCATION_MODE_ALL else a.count
                    for a in r.alternatives
                )
                for r in claim.requests
            )
            if least > MAX_RESULTS:
                raise self._fail(
                    oc.TOO_MANY_DEVICES,
                    f"claim {claim.ref}: its requests need "
                    f"at least {least} devices; an allocation holds at most "
                    f"{MAX_RESULTS}",
                    claim=claim.ref,
                )
        for ci, request in self.slots:
            for alternative in request.alternatives:
                self.gather(ci, alternative)
        try:
            picks = _Search(self, self.allocator.max_steps, None).run()
        except _Limit:
            raise self._fail(
                oc.SEARCH_LIMIT,
                f"no allocation found within "
                f"{self.allocator.max_steps} steps; the claims' requests and "
                "constraints leave too many combinations",
            ) from None
        if picks is None:
            raise self.explain()
        allocations: dict[str, Any] = {}
        for ci, claim in enumerate(self.claims):
            mine = [(alt, dev) for c, alt, dev in picks if c == ci]
            used: list[DeviceRequest] = []
            for alt, _ in mine:
                if alt not in used:
                    used.append(alt)
            allocations[claim.uid or claim.ref] = allocation(
                claim, used, mine, self.classes, self.node
            )
        return oc.Outcome(allocations=allocations, reports=tuple(self.reports()))

    def gather(self, ci: int, request: DeviceRequest) -> _Candidates:
        """The candidates of one request alternative (selectors, reach, use, taints)."""
        key = (ci, request.name)
        if key in self.candidates:
            return self.candidates[key]
        claim = self.claims[ci]
        device_class = self.classes.get(request.device_class_name)
        where = {
            "claim": claim.ref,
            "request": request.name,
            "device_class": request.device_class_name,
        }
        if device_class is None:
            raise self._fail(
                oc.CLASS_NOT_FOUND,
                f"claim {claim.ref}, request "
                f"{request.name!r}: device class {request.device_class_name!r} "
                "does not exist",
                **where,
            )
        considered = matched = in_use = tainted = 0
        devices: list[Device] = []
        pools: list[str] = []
        reach_memo: dict[int, bool] = {}
        class_owner = f"class {device_class.name}"
        for pool in self.pools:
            try:
                owner = class_owner
                selected = self.allocator.selectors.select(
                    owner, device_class.selectors, pool.key, pool.devices
                )
                owner = "request"
                selected = self.allocator.selectors.select(
                    owner,
                    request.selectors,
                    pool.key,
                    pool.devices,
                    within=selected,
                    within_key=(device_class.name, device_class.selectors),
                )
            except CompileError as err:
                raise self._selector_failure(
                    oc.SELECTOR_INVALID, owner, claim, request, err
                ) from err
            except EvaluationError as err:
                raise self._selector_failure(
                    oc.SELECTOR_FAILED, owner, claim, request, err, pool
                ) from err
            uniform = pool.uniform_reach
            considered += (
                len(pool.devices)
                if uniform
                else sum(1 for d in pool.devices if self._reaches(d, reach_memo))
            )
            before = len(devices)
            counts = self._take(pool, selected, request, reach_memo, devices)
            matched += counts[0]
            in_use += counts[1]
            tainted += counts[2]
            if len(devices) > before:
                pools.append(pool.describe())
        blocked = None
        needed = request.count
        if request.allocation_mode == ALLOCATION_MODE_ALL:
            needed = max(1, matched)
            if self.incomplete or self.invalid:
                blocked = oc.POOLS_NOT_READY
            elif in_use:
                blocked = oc.DEVICES_NOT_FREE
            elif tainted:
                blocked = oc.DEVICES_TAINTED
            elif not devices:
                blocked = oc.NOT_ENOUGH_DEVICES
        if needed > MAX_RESULTS:
            blocked = oc.TOO_MANY_DEVICES
        report = oc.RequestReport(
            claim=claim.ref,
            request=request.name,
            device_class=device_class.name,
            allocation_mode=request.allocation_mode,
            needed=needed,
            considered=considered,
            matched=matched,
            in_use=in_use,
            tainted=tainted,
            available=len(devices),
            pools=tuple(pools),
            blocked=blocked,
        )
        self.candidates[key] = _Candidates(devices, report)
        return self.candidates[key]

    def _take(
        self,
        pool: Pool,
        selected: tuple[int, ...],
        request: DeviceRequest,
        reach_memo: dict[int, bool],
        devices: list[Device],
    ) -> tuple[int, int, int]:
        """Append to ``devices`` the ``selected`` devices of ``pool`` that reach the node,
        are free (or the request has admin access) and have no taint the request does not
        tolerate. Returns (matched: selected and reaching, in use, tainted)."""
        if (
            pool.uniform_reach
            and not self.allocator.has_taints(pool)
            and (request.admin_access or not self.may_hold_pool(pool.driver, pool.name))
        ):
            # The common case: every selected device reaches the node, is free and has no
            # taint; no need to look at each one.
            devices.extend(map(pool.devices.__getitem__, selected))
            return len(selected), 0, 0
        matched = in_use = tainted = 0
        used = self.in_use_of_pool(pool.driver, pool.name)
        for index in selected:
            device = pool.devices[index]
            if not pool.uniform_reach and not self._reaches(device, reach_memo):
                continue
            matched += 1
            if not request.admin_access and device.device_id in used:
                in_use += 1
            elif device.taints and any(
                t.effect in _BLOCKING_EFFECTS
                and not any(tol.tolerates(t) for tol in request.tolerations)
                for t in device.taints
            ):
                tainted += 1
            else:
                devices.append(device)
        return matched, in_use, tainted

    def _reaches(self, device: Device, memo: dict[int, bool]) -> bool:
        known = memo.get(id(device.reach))
        if known is None:
            known = memo[id(device.reach)] = reach_matches(device.reach, self.node)
        return known

    def _selector_failure(
        self,
        reason: str,
        owner: str,
        claim: Claim,
        request: DeviceRequest,
        err: CompileError | EvaluationError,
        pool: Pool | None = None,
    ) -> _Abort:
        whose = (
            f"device class {request.device_class_name!r}"
            if owner != "request"
            else f"claim {claim.ref}, request {request.name!r}"
        )
        device = getattr(err, "device", None)
        on = f" on device {pool.describe()}/{device}" if pool is not None and device else ""
        verb = "cannot be compiled" if reason == oc.SELECTOR_INVALID else "failed"
        return self._fail(
            reason,
            f"{whose}: selector {err.expression[:200]!r} {verb}{on}: {err.detail}",
            claim=claim.ref,
            request=request.name,
            device_class=request.device_class_name,
            expression=err.expression,
            device=device,
        )

    def explain(self) -> _Abort:
        """The failure of a search that found nothing: first a request that cannot be met on
        its own, then a constraint that cannot hold, then contention between requests."""
        for ci, request in self.slots:
            candidates = [self.candidates[(ci, a.name)] for a in request.alternatives]
            if any(
                c.report.blocked is None and c.report.available >= c.report.needed
                for c in candidates
            ):
                continue
            report = candidates[0].report
            reason = report.blocked or oc.NOT_ENOUGH_DEVICES
            if reason == oc.POOLS_NOT_READY:
                why = "it asks for all devices, but pools reaching the node are not ready: " + (
                    ", ".join(self.incomplete + self.invalid)
                )
            elif reason == oc.DEVICES_NOT_FREE:
                why = "it asks for all devices, but some of them are in use"
            elif reason == oc.DEVICES_TAINTED:
                why = "it asks for all devices, but some of them have taints it does not tolerate"
            elif reason == oc.TOO_MANY_DEVICES:
                why = f"an allocation holds at most {MAX_RESULTS} devices"
            else:
                why = "not enough devices"
            details = "; ".join(c.report.summary() for c in candidates)
            return self._fail(
                reason,
                f"claim {report.claim}, request {request.name!r}: {why}: {details}",
                claim=report.claim,
                request=request.name,
                device_class=report.device_class,
                requests=tuple(c.report for c in candidates),
            )
        steps = self.allocator.max_steps
        try:
            if _Search(self, steps, frozenset()).run() is not None:
                for claim in self.claims:
                    for constraint in claim.constraints:
                        if _Search(self, steps, frozenset({id(constraint)})).run() is None:
                            return self._constraint_failure(claim, constraint)
                claim = next(c for c in self.claims if c.constraints)
                return self._fail(
                    oc.CONSTRAINT_FAILED,
                    f"claim {claim.ref}: its constraints cannot all hold together on this node",
                    claim=claim.ref,
                    requests=tuple(self.reports()),
                )
        except _Limit:
            return self._fail(
                oc.SEARCH_LIMIT,
                f"no allocation found, and the search for the reason gave up after {steps} steps",
            )
        names = ", ".join(f"{self.claims[ci].ref}:{r.name}" for ci, r in self.slots)
        return self._fail(
            oc.DEVICES_CONTENDED,
            f"requests {names} cannot all get distinct "
            "free devices on this node: " + "; ".join(r.summary() for r in self.reports()),
            requests=tuple(self.reports()),
        )

    def _constraint_failure(self, claim: Claim, constraint: Constraint) -> _Abort:
        attribute = constraint.match_attribute or constraint.distinct_attribute or ""
        kind = "matchAttribute" if constraint.match_attribute else "distinctAttribute"
        scope = ", ".join(repr(r) for r in constraint.requests) or "all requests"
        return self._fail(
            oc.CONSTRAINT_FAILED,
            f"claim {claim.ref}: constraint {kind} "
            f"{attribute!r} over {scope} cannot hold: no devices with "
            f"{'one common' if constraint.match_attribute else 'distinct'} value "
            "of it (a device lacking the attribute is refused)",
            claim=claim.ref,
            constraint=attribute,
            requests=tuple(self.reports()),
        )


class _Search:
    """Depth-first search with backtracking over requests, alternatives and devices.

    ``only`` None enforces every constraint; otherwise only those whose id it holds.
    """

    def __init__(self, run: _Run, max_steps: int, only: frozenset[int] | None) -> None:
        self.run_ = run
        self.steps_left = max_steps
        self.taken: set[DeviceId] = set()
        # Per claim, every device chosen for it, admin access included.
        self.claim_taken: list[set[DeviceId]] = [set() for _ in run.claims]
        self.picks: list[tuple[int, DeviceRequest, Device]] = []
        self.values: dict[int, list[tuple[str, Any]]] = {}
        self.per_claim = [0] * len(run.claims)
        self.active = [
            [c for c in claim.constraints if only is None or id(c) in only] for claim in run.claims
        ]

    def run(self) -> list[tuple[int, DeviceRequest, Device]] | None:
        """The picks of the first solution, or None; raises _Limit past the step budget."""
        return list(self.picks) if self._solve(0) else None

    def _solve(self, slot: int) -> bool:
        if slot == len(self.run_.slots):
            return True
        ci, request = self.run_.slots[slot]
        for alternative in request.alternatives:
            candidates = self.run_.candidates[(ci, alternative.name)]
            if candidates.report.blocked is not None:
                continue
            if alternative.allocation_mode == ALLOCATION_MODE_ALL:
                if self._take_all(slot, ci, alternative, candidates.devices):
                    return True
            elif self._pick(slot, ci, alternative, candidates.devices, 0, alternative.count):
                return True
        return False

    def _take_all(
        self, slot: int, ci: int, request: DeviceRequest, devices: Sequence[Device]
    ) -> bool:
        pushed = 0
        for device in devices:
            if not self._push(ci, request, device):
                break
            pushed += 1
        else:
            if self._solve(slot + 1):
                return True
        for _ in range(pushed):
            self._pop(ci, request)
        return False

    def _pick(
        self,
        slot: int,
        ci: int,
        request: DeviceRequest,
        devices: Sequence[Device],
        start: int,
        remaining: int,
    ) -> bool:
        if remaining == 0:
            return self._solve(slot + 1)
        for index in range(start, len(devices) - remaining + 1):
            if self._push(ci, request, devices[index]):
                if self._pick(slot, ci, request, devices, index + 1, remaining - 1):
                    return True
                self._pop(ci, request)
        return False

    def _push(self, ci: int, request: DeviceRequest, device: Device) -> bool:
        self.steps_left -= 1
        if self.steps_left < 0:
            raise _Limit
        if device.device_id in self.claim_taken[ci]:
            return False
        if not request.admin_access and device.device_id in self.taken:
            return False
        if self.per_claim[ci] >= MAX_RESULTS:
            return False
        applicable = [c for c in self.active[ci] if c.applies_to(request)]
        found: list[tuple[str, Any]] = []
        for constraint in applicable:
            value = _attribute(
                device, constraint.match_attribute or constraint.distinct_attribute or ""
            )
            if value is None:
                return False
            seen = self.values.get(id(constraint), [])
            if constraint.match_attribute and seen and seen[0] != value:
                return False
            if constraint.distinct_attribute and value in seen:
                return False
            found.append(value)
        for constraint, value in zip(applicable, found, strict=True):
            self.values.setdefault(id(constraint), []).append(value)
        if not request.admin_access:
            self.taken.add(device.device_id)
        self.claim_taken[ci].add(device.device_id)
        self.picks.append((ci, request, device))
        self.per_claim[ci] += 1
        return True

    def _pop(self, ci: int, request: DeviceRequest) -> None:
        _, _, device = self.picks.pop()
        self.per_claim[ci] -= 1
        for constraint in self.active[ci]:
            if constraint.applies_to(request):
                self.values[id(constraint)].pop()
        if not request.admin_access:
            self.taken.discard(device.device_id)
        self.claim_taken[ci].discard(device.device_id)
