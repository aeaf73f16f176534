"""Leader election against the Kubernetes API emulator: one leader among candidates, takeover
after a crash within the lease duration, immediate takeover after a release, step-down when
renewals fail, and the Lease fields written (MicroTime, transitions)."""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

from builders import eventually

from app.kube.client import KubeClient
from app.kube.leader import LeaderElectionSettings, LeaderElector
from fabric_dra_sim.kubeapi import KubeEmulator

NS = "kube-system"
LEASE = "fabric-dra"
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
LEASE_DURATION_S = 2
RETRY_PERIOD_S = 0.1


# ``emu`` (the API emulator) and ``client`` (a KubeClient on it) are in
# tests/integration/conftest.py.


class Candidate:
    """A LeaderElector plus a log of its callbacks."""

    def __init__(self, kube: KubeClient, identity: str, *, release: bool = True) -> None:
        self.log: list[str] = []
        self.stopped = asyncio.Event()
        self.elector = LeaderElector(
            kube.api,
            LeaderElectionSettings(
                lease_name=LEASE,
                namespace=NS,
                identity=identity,
                lease_duration_s=LEASE_DURATION_S,
                renew_deadline_s=0.6,
                retry_period_s=RETRY_PERIOD_S,
                release_on_cancel=release,
                request_timeout_s=0.5,
            ),
            on_started_leading=self._started,
            on_stopped_leading=self._stopped,
            rng=random.Random(identity),
        )

    async def _started(self) -> None:
        self.log.append("started")

    async def _stopped(self) -> None:
        self.log.append("stopped")
        self.stopped.set()

    @property
    def leading(self) -> bool:
        return self.elector.is_leader.is_set()


def lease_spec(emu: KubeEmulator) -> dict[str, Any]:
    lease = emu.get("coordination.k8s.io/v1", "Lease", LEASE, NS)
    assert lease is not None
    spec: dict[str, Any] = lease["spec"]
    return spec


async def first_leader(candidates: list[Candidate], timeout_s: float = 5.0) -> Candidate:
    await eventually(
        lambda: any(c.leading for c in candidates), timeout_s, "a leader", interval_s=0.01
    )
    leaders = [c for c in candidates if c.leading]
    assert len(leaders) == 1
    return leaders[0]


async def test_exactly_one_of_several_candidates_leads(
    emu: KubeEmulator, client: KubeClient
) -> None:
    candidates = [Candidate(client, f"replica-{i}") for i in range(3)]
    for candidate in candidates:
        candidate.elector.start()
    try:
        leader = await first_leader(candidates)
        # Several renewal rounds later there is still exactly one, the same one.
        for _ in range(10):
            await asyncio.sleep(RETRY_PERIOD_S)
            assert [c for c in candidates if c.leading] == [leader]
        spec = lease_spec(emu)
        assert spec["holderIdentity"] == leader.elector.settings.identity
        assert spec["leaseDurationSeconds"] == LEASE_DURATION_S
        assert MICRO_TIME.match(spec["renewTime"]), spec["renewTime"]
        assert MICRO_TIME.match(spec["acquireTime"]), spec["acquireTime"]
        assert spec["leaseTransitions"] == 0
        assert spec["renewTime"] > spec["acquireTime"]
        for candidate in candidates:
            assert candidate.elector.leader_identity == leader.elector.settings.identity
    finally:
        for candidate in candidates:
            await candidate.elector.stop()


async def test_a_killed_leader_is_replaced_within_the_lease_duration(
    emu: KubeEmulator, client: KubeClient
) -> None:
    first = Candidate(client, "first", release=False)
    second = Candidate(client, "second")
    first.elector.start()
    await asyncio.wait_for(first.elector.is_leader.wait(), 5)
    second.elector.start()
    try:
        await asyncio.sleep(3 * RETRY_PERIOD_S)  # the standby has seen the record
        assert not second.leading
        await first.elector.stop()  # no release: the Lease still names "first"
        assert lease_spec(emu)["holderIdentity"] == "first"
        took = await eventually(
            lambda: second.leading, LEASE_DURATION_S + 2.0, "the standby leads", interval_s=0.01
        )
        # The standby waits for the lease to run out, but not much longer.
        assert LEASE_DURATION_S - 0.5 <= took <= LEASE_DURATION_S + 4 * RETRY_PERIOD_S
        spec = lease_spec(emu)
        assert spec["holderIdentity"] == "second"
        assert spec["leaseTransitions"] == 1
        assert first.log == ["started", "stopped"]
    finally:
        await second.elector.stop()


async def test_a_released_lease_is_taken_over_at_once(
    emu: KubeEmulator, client: KubeClient
) -> None:
    first = Candidate(client, "first", release=True)
    second = Candidate(client, "second")
    first.elector.start()
    await asyncio.wait_for(first.elector.is_leader.wait(), 5)
    second.elector.start()
    try:
        await asyncio.sleep(3 * RETRY_PERIOD_S)
        await first.elector.stop()
        assert not first.leading
        assert first.log == ["started", "stopped"]
        # Stepping down at shutdown is not losing leadership.
        assert first.elector.lost_count == 0 and first.elector.lost_at is None
        took = await eventually(
            lambda: second.leading, LEASE_DURATION_S, "the standby leads", interval_s=0.01
        )
        assert took < LEASE_DURATION_S / 2
        spec = lease_spec(emu)
        assert spec["holderIdentity"] == "second"
        assert spec["leaseTransitions"] == 1
    finally:
        await second.elector.stop()
    # The second one released too: nobody holds the Lease, which expires in one second.
    spec = lease_spec(emu)
    assert "holderIdentity" not in spec or not spec["holderIdentity"]
    assert spec["leaseDurationSeconds"] == 1


async def test_failing_renewals_make_the_leader_step_down(
    emu: KubeEmulator, client: KubeClient
) -> None:
    leader = Candidate(client, "only")
    leader.elector.start()
    try:
        await asyncio.wait_for(leader.elector.is_leader.wait(), 5)
        # Renewals every 0.1 s and a 0.6 s deadline: about six failures make it step down;
        # the rest fail its first attempts to lead again.
        emu.fail_next(20, path_regex="leases", status=500)
        await asyncio.wait_for(leader.stopped.wait(), 0.6 + 1.0)
        assert not leader.leading
        assert leader.log == ["started", "stopped"]
        assert leader.elector.last_error is not None
        assert "500" in str(leader.elector.last_error)
        assert leader.elector.lost_count == 1 and leader.elector.lost_at is not None
        # Once the API server answers again the replica campaigns and leads again.
        await asyncio.wait_for(leader.elector.is_leader.wait(), 5)
        assert leader.log == ["started", "stopped", "started"]
        failed = [r for r in emu.requests if "leases" in r.path and r.status == 500]
        assert len(failed) == 20
    finally:
        await leader.elector.stop()


async def test_a_slow_api_server_makes_the_leader_step_down_by_the_deadline(
    emu: KubeEmulator, client: KubeClient
) -> None:
    leader = Candidate(client, "only")
    leader.elector.start()
    try:
        await asyncio.wait_for(leader.elector.is_leader.wait(), 5)
        # Every call now hangs beyond the request timeout (0.5 s) and the renew deadline.
        emu.latency_s = 1.0
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.wait_for(leader.stopped.wait(), 2.0)
        # It must stop acting before another replica could take the Lease over.
        assert loop.time() - start < LEASE_DURATION_S
        assert not leader.leading
    finally:
        await leader.elector.stop()
        emu.latency_s = 0.0
    # Let the emulator finish the requests it was still delaying before it is stopped.
    await asyncio.sleep(1.2)


async def test_a_renewal_conflict_rereads_and_keeps_leading(
    emu: KubeEmulator, client: KubeClient
) -> None:
    leader = Candidate(client, "only")
    leader.elector.start()
    try:
        await asyncio.wait_for(leader.elector.is_leader.wait(), 5)
        # A stale write: the next PUT on the Lease gets 409; the next round re-reads.
        emu.fail_next(1, method="PUT", path_regex="leases", status=409)
        await asyncio.sleep(8 * RETRY_PERIOD_S)
        assert leader.leading
        assert leader.log == ["started"]
        puts = [r for r in emu.requests if r.method == "PUT" and "leases" in r.path]
        assert 409 in {r.status for r in puts}
        assert puts[-1].status == 200
    finally:
        await leader.elector.stop()
