"""Leader election against an API emulator that decodes Lease MicroTimes as kube-apiserver does
(RFC3339Micro: exactly six fraction digits): every Lease write is accepted, also at a whole
second and from a clock in another time zone."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import pytest

from app.kube.client import KubeClient
from app.kube.leader import LeaderElectionSettings, LeaderElector
from fabric_dra_sim.kubeapi import KubeEmulator

NS = "kube-system"
LEASE = "fabric-dra"


# ``emu`` (the API emulator) and ``client`` (a KubeClient on it) are in
# tests/integration/conftest.py.


def elector(kube: KubeClient, utc_now: datetime) -> LeaderElector:
    return LeaderElector(
        kube.api,
        LeaderElectionSettings(
            lease_name=LEASE,
            namespace=NS,
            identity="a",
            lease_duration_s=2,
            renew_deadline_s=0.6,
            retry_period_s=0.1,
            request_timeout_s=0.5,
        ),
        utc_now=lambda: utc_now,
    )


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        datetime(2026, 1, 2, 4, 4, 5, tzinfo=timezone(timedelta(hours=1))),
    ],
)
async def test_a_whole_second_lease_time_is_sent_with_six_fraction_digits(
    emu: KubeEmulator, client: KubeClient, moment: datetime
) -> None:
    candidate = elector(client, moment)
    candidate.start()
    try:
        await asyncio.wait_for(candidate.is_leader.wait(), 5)
        await asyncio.sleep(0.3)  # a few renewals (PUTs of the read Lease) too
        assert candidate.last_error is None
    finally:
        await candidate.stop()
    lease = emu.get("coordination.k8s.io/v1", "Lease", LEASE, NS)
    assert lease is not None
    assert lease["spec"]["acquireTime"] == "2026-01-02T03:04:05.000000Z"
    assert lease["spec"]["renewTime"] == "2026-01-02T03:04:05.000000Z"
    lease_writes = emu.writes("leases")
    assert "PUT" in {r.method for r in lease_writes}
    assert all(r.status < 400 for r in lease_writes), [(r.method, r.status) for r in lease_writes]
