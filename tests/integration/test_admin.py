"""The admin HTTP app against real databases (SQLite and PostgreSQL) and a fake live service.

The inventory is filled by the real sync from an in-memory backend, reservations by the real
journal; the live parts (health, readiness, status, claim views, publisher, what-if) are a
small fake whose answers each test sets. The helpers here are shared with the OpenAPI and
dashboard tests.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from builders import MemoryBackend, gpu, host
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import SecretStr
from sqlalchemy import select

from app.admin import pipeline
from app.admin.actions import DatabaseActions
from app.admin.app import make_app, serve
from app.admin.context import AdminContext, Check
from app.admin.history import History, take_sample
from app.db.engine import Database
from app.db.models import Device, DeviceEvent, Reservation
from app.fabric.errors import FabricError, FabricNotFound, FabricUnavailable
from app.fabric.types import DeviceType, FabricDevice, Health, Operation
from app.inventory import InventorySync
from app.journal import ATTACHED, ATTACHING, FAILED, PENDING, RELEASED, ClaimRef, Journal
from app.pools import PoolConfig

TOKEN = "s3cret-admin-token-4f9a"
DRIVER = "fabric.example.com"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FabricDouble(MemoryBackend):
    """The in-memory backend, whose detach can be made to fail and is recorded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.detach_error: FabricError | None = None
        self.detached: list[tuple[str, str]] = []
        self.before_detach: Callable[[], Awaitable[None]] | None = None

    async def detach(
        self,
        device: FabricDevice,
        host_id: str,
        *,
        on_operation: Callable[[str], Awaitable[None]] | None = None,
    ) -> Operation:
        self.detached.append((device.vendor_id, host_id))
        if self.before_detach is not None:
            await self.before_detach()
        if self.detach_error is not None:
            raise self.detach_error
        return await super().detach(device, host_id, on_operation=on_operation)


def fabric() -> FabricDouble:
    """Three pools: us-east/rack-01 (4 GPUs, one attached to a host), us-east/rack-02 (3 GPUs,
    one Critical, one of model Z900), us-west/rack-07 (2 FPGAs)."""
    devices = [gpu(i, region="us-east", rack="rack-01") for i in range(4)]
    devices[0] = replace(devices[0], host_id="us-east-rack-01-1")
    devices += [gpu(i, region="us-east", rack="rack-02") for i in range(3)]
    devices[4] = replace(devices[4], health=Health.CRITICAL)
    devices[5] = replace(devices[5], model="Z900")
    devices += [
        gpu(i, region="us-west", rack="rack-07", device_type=DeviceType.FPGA, model="F10")
        for i in range(2)
    ]
    hosts = [host(1, region="us-east", rack="rack-01"), host(1, region="us-east", rack="rack-02")]
    return FabricDouble(devices, hosts)


@dataclass
class Seeded:
    """Names the tests refer to."""

    backend: FabricDouble
    names: dict[str, list[str]]
    attached: int = 0
    pending: int = 0
    released: int = 0
    failed: int = 0


async def seed(db: Database) -> Seeded:
    """Sync the fabric into ``db`` and journal four reservations (attached, pending, released,
    failed) for two claims."""
    backend = fabric()
    result = await InventorySync(backend, db).sync_once()
    assert result.ok
    names: dict[str, list[str]] = {}
    async with db.read() as session:
        for row in (await session.scalars(select(Device).order_by(Device.vendor_id))).all():
            names.setdefault(f"{row.region}/{row.rack}", []).append(row.name)
    journal = Journal(db)
    claim_a = ClaimRef("uid-a", "team-a", "claim-a")
    claim_b = ClaimRef("uid-b", "team-b", "claim-b")
    east1, east2 = names["us-east/rack-01"], names["us-east/rack-02"]
    attached = await journal.reserve(
        claim_a, "gpu", east1[0], "us-east/rack-01", "structured", "node-1", "us-east-rack-01-1"
    )
    await journal.transition(attached.id, [PENDING], ATTACHING)
    await journal.transition(attached.id, [ATTACHING], ATTACHED)
    pending = await journal.reserve(
        claim_a, "gpu2", east1[1], "us-east/rack-01", "structured", "node-1", "us-east-rack-01-1"
    )
    released = await journal.reserve(
        claim_b, "gpu", east2[0], "us-east/rack-02", "structured", None, None
    )
    await journal.transition(released.id, [PENDING], RELEASED)
    failed = await journal.reserve(
        claim_b, "gpu", east2[1], "us-east/rack-02", "structured", "node-2", "us-east-rack-02-1"
    )
    await journal.transition(failed.id, [PENDING], ATTACHING)
    await journal.transition(failed.id, [ATTACHING], FAILED, error="attach refused by fabric")
    return Seeded(backend, names, attached.id, pending.id, released.id, failed.id)


@dataclass
class Live:
    """The fake live service: each answer is a field a test may change."""

    health: list[Check] = field(default_factory=lambda: [Check("loops", True, "running")])
    readiness: list[Check] = field(default_factory=lambda: [Check("database", True, "ok")])
    status: dict[str, Any] = field(default_factory=dict)
    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    publisher: dict[str, Any] = field(default_factory=dict)
    what_if_answer: dict[str, Any] = field(default_factory=lambda: {"nodes": []})
    what_if_seen: list[dict[str, Any]] = field(default_factory=list)
    changes: int = 0
    status_error: Exception | None = None
    released: list[Any] = field(default_factory=list)

    async def get_readiness(self) -> list[Check]:
        return self.readiness

    async def get_status(self) -> dict[str, Any]:
        if self.status_error is not None:
            raise self.status_error
        return self.status

    async def claim_view(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get((namespace, name))

    async def what_if(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.what_if_seen.append(spec)
        return self.what_if_answer

    def changed(self) -> None:
        self.changes += 1


def live_status(now: dt.datetime | None = None) -> dict[str, Any]:
    """A status shaped like the service's."""
    now = now or dt.datetime.now(dt.UTC)
    return {
        "identity": "fabric-dra-0",
        "driver": DRIVER,
        "mode": "structured",
        "resource_api_version": "v1",
        "leader": {"enabled": True, "is_leader": True, "holder": "fabric-dra-0"},
        "inventory": [
            {
                "backend": "memory",
                "last_success_at": (now - dt.timedelta(seconds=42)).isoformat(),
                "last_attempt_at": now.isoformat(),
                "stale": False,
                "consecutive_failures": 0,
                "last_error": None,
                "device_count": 9,
                "host_count": 2,
            }
        ],
        "publisher": {
            "synced": True,
            "queue_depth": 0,
            "writes": {"create": 3},
            "pools": {"us-west/rack-07": {"last_error": "update ResourceSlice: 409"}},
        },
        "claims": {
            "synced": True,
            "healthy": True,
            "queue_depth": 1,
            "claims_seen": 2,
            "waiting": [{"claim": "team-c/claim-c", "reason": "no node yet"}],
            "recent_errors": [
                {
                    "at": now.isoformat(),
                    "claim": "team-b/claim-b",
                    "message": "attach refused by fabric",
                }
            ],
        },
    }


def make_context(db: Database, seeded: Seeded, live: Live, **changes: Any) -> AdminContext:
    """An AdminContext over ``db`` with the fake live parts and real actions."""
    registry = CollectorRegistry()
    Counter("admin_test_requests", "A counter for the metrics test.", registry=registry).inc()
    config = PoolConfig(driver_name=DRIVER)
    actions = DatabaseActions(
        db,
        Journal(db),
        seeded.backend,
        config,
        on_change=live.changed,
        on_release=live.released.append,
    )
    context = AdminContext(
        db=db,
        registry=registry,
        health=lambda: live.health,
        readiness=live.get_readiness,
        status=live.get_status,
        actions=actions,
        driver_name=DRIVER,
        claim_view=live.claim_view,
        publisher_status=lambda: live.publisher,
        what_if=live.what_if,
        token=SecretStr(TOKEN),
        max_request_bytes=4096,
        pool_config=config,
    )
    for key, value in changes.items():
        setattr(context, key, value)
    return context


@dataclass
class Admin:
    client: TestClient[Any, Any]
    seeded: Seeded
    live: Live
    context: AdminContext
    db: Database


@pytest.fixture
async def admin(db: Database) -> AsyncIterator[Admin]:
    seeded = await seed(db)
    live = Live(status=live_status())
    live.publisher = {
        "us-east/rack-01": {"generation": 3, "resource_slices": ["s-1"], "last_error": None}
    }
    context = make_context(db, seeded, live)
    async with TestClient(TestServer(make_app(context), host="127.0.0.1", port=0)) as client:
        yield Admin(client, seeded, live, context, db)


async def get_json(admin: Admin, path: str, status: int = 200, **kw: Any) -> Any:
    response = await admin.client.get(path, **kw)
    body = await response.json()
    assert response.status == status, body
    return body


async def post_json(admin: Admin, path: str, status: int = 200, **kw: Any) -> Any:
    response = await admin.client.post(path, **kw)
    body = await response.json()
    assert response.status == status, body
    return body


def assert_error(body: Any, code: int, *words: str) -> None:
    assert set(body) == {"error"} and body["error"]["code"] == code
    for word in words:
        assert word in body["error"]["message"], body


# --------------------------------------------------------------------------- probes
async def test_healthz_is_ok_until_a_check_fails(admin: Admin) -> None:
    assert await get_json(admin, "/healthz") == {"status": "ok"}
    admin.live.health = [Check("loops", True, "running"), Check("publisher", False, "crashed")]
    body = await get_json(admin, "/healthz", 503)
    assert body == {
        "status": "failing",
        "checks": [{"name": "publisher", "ok": False, "message": "crashed"}],
    }


async def test_readyz_lists_every_check_and_fails_when_one_fails(admin: Admin) -> None:
    body = await get_json(admin, "/readyz")
    assert body == {
        "status": "ready",
        "checks": [{"name": "database", "ok": True, "message": "ok"}],
    }
    admin.live.readiness = [Check("database", True, "ok"), Check("leader", False, "unknown")]
    body = await get_json(admin, "/readyz", 503)
    assert body["status"] == "not ready" and [c["name"] for c in body["checks"]] == [
        "database",
        "leader",
    ]


async def test_metrics_are_prometheus_text_from_the_context_registry(admin: Admin) -> None:
    response = await admin.client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    assert "admin_test_requests_total 1.0" in await response.text()


# --------------------------------------------------------------------------- status, pools
async def test_status_joins_the_live_summary_and_database_counts(admin: Admin) -> None:
    body = await get_json(admin, "/api/v1/status")
    assert body["service"]["identity"] == "fabric-dra-0"
    devices = body["database"]["devices"]
    assert devices["present"] == 9
    assert devices["by_state"] == {
        "free": 6,
        "reserved": 2,
        "attached": 1,
        "held-elsewhere": 0,
        "cordoned": 0,
        "removed": 0,
    }
    assert devices["by_type"] == {"fpga": 2, "gpu": 7}
    assert devices["by_health"] == {"Critical": 1, "OK": 8}
    assert body["database"]["reservations"] == {
        "by_state": {"attached": 1, "failed": 1, "pending": 1, "released": 1},
        "active": 3,
    }
    assert body["database"]["inventory"][0]["device_count"] == 9


async def test_pools_have_counts_utilisation_and_publisher_status(admin: Admin) -> None:
    body = await get_json(admin, "/api/v1/pools")
    pools = {p["name"]: p for p in body["items"]}
    assert sorted(pools) == ["us-east/rack-01", "us-east/rack-02", "us-west/rack-07"]
    east1 = pools["us-east/rack-01"]
    assert (east1["region"], east1["rack"], east1["devices"], east1["published"]) == (
        "us-east",
        "rack-01",
        4,
        4,
    )
    assert (east1["reserved"], east1["attached"], east1["utilisation"]) == (2, 1, 0.5)
    assert east1["publisher"] == {"generation": 3, "resource_slices": ["s-1"], "last_error": None}
    east2 = pools["us-east/rack-02"]
    assert (east2["healthy"], east2["unhealthy"], east2["attach_failed"]) == (2, 1, 1)
    assert east2["publisher"] is None
    assert pools["us-west/rack-07"]["by_type"] == {"fpga": 2}


async def test_a_pool_by_its_slashed_name_has_devices_and_slices(admin: Admin) -> None:
    body = await get_json(admin, "/api/v1/pools/us-east/rack-02")
    assert body["name"] == "us-east/rack-02"
    assert sorted(d["name"] for d in body["device_list"]) == sorted(
        admin.seeded.names["us-east/rack-02"]
    )
    tainted = {d["name"] for d in body["device_list"]} - set(body["slices"][0]["devices"])
    assert not tainted  # tainted devices are still published (taint mode)
    assert body["node_selector"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [
        "us-east"
    ]
    body = await get_json(admin, "/api/v1/pools/us-east%2Frack-01")
    assert body["name"] == "us-east/rack-01"


async def test_pool_counts_agree_with_the_slices_as_published(admin: Admin) -> None:
    # The list counts in the database; the detail lays the pool out with desired_pools.
    listed = (await get_json(admin, "/api/v1/pools"))["items"]
    for pool in listed:
        detail = await get_json(admin, f"/api/v1/pools/{pool['name']}")
        assert {k: detail[k] for k in pool} == pool
        assert detail["resource_slice_count"] == len(detail["slices"])
        assert detail["published"] == sum(s["device_count"] for s in detail["slices"])
        assert detail["withheld"] == len(detail["withheld_devices"])


async def test_withheld_devices_are_not_published(db: Database) -> None:
    seeded = await seed(db)
    context = make_context(db, seeded, Live())
    context.pool_config = PoolConfig(driver_name=DRIVER, unhealthy="withhold")
    async with TestClient(TestServer(make_app(context), host="127.0.0.1")) as client:
        response = await client.get("/api/v1/pools/us-east/rack-02")
        body = await response.json()
    # One Critical device and one with a failed attach are withheld; one is published.
    assert (body["devices"], body["published"], body["withheld"]) == (3, 1, 2)
    assert len(body["withheld_devices"]) == 2 and body["slices"][0]["device_count"] == 1
    assert body["utilisation"] == 1.0  # the failed reservation still holds its device


async def test_an_unknown_pool_is_404(admin: Admin) -> None:
    assert_error(await get_json(admin, "/api/v1/pools/nowhere/rack-99", 404), 404, "nowhere")


# --------------------------------------------------------------------------- devices
DEVICE_FILTERS = [
    ("pool=us-east/rack-01", 4),
    ("region=us-west", 2),
    ("rack=rack-02", 3),
    ("type=fpga", 2),
    ("health=Critical", 1),
    ("state=attached", 1),
    ("state=reserved", 2),
    ("state=free", 6),
    ("state=cordoned", 0),
    ("state=removed", 0),
    ("q=z900", 1),
    ("q=RACK-07", 2),
    ("region=us-east&state=free&type=gpu", 4),
    ("q=%25", 0),
    ("pool=unknown/unknown", 0),
]


async def test_device_filters(admin: Admin) -> None:
    for query, expected in DEVICE_FILTERS:
        body = await get_json(admin, f"/api/v1/devices?{query}")
        assert body["total"] == expected == len(body["items"]), query
        assert body["continue"] is None


BAD_DEVICE_FILTERS = [
    ("state=bogus", ["'state'", "free, reserved"]),
    ("type=tpu", ["'type'", "gpu"]),
    ("health=ok", ["'health'", "Critical"]),
    ("limit=0", ["'limit'", "at least 1"]),
    ("limit=501", ["'limit'", "at most 500"]),
    ("limit=ten", ["'limit'", "integer"]),
    ("limit=9223372036854775808", ["'limit'", "too large"]),
    ("offset=9223372036854775807", ["'offset'", "too large"]),
    ("offset=-1", ["'offset'", "at least 0"]),
    ("colour=red", ["unknown parameter 'colour'", "state"]),
    ("state=free&state=reserved", ["more than once"]),
    ("offset=2&continue=abc", ["'offset' or 'continue'"]),
    ("continue=not-a-token", ["'continue'"]),
    ("q=", ["'q'", "empty"]),
    ("region=us%00east", ["'region'", "control characters"]),
    ("pool=" + "p" * 254, ["'pool'", "at most 253"]),
]


async def test_bad_device_filters_are_400_with_a_clear_message(admin: Admin) -> None:
    for query, words in BAD_DEVICE_FILTERS:
        assert_error(await get_json(admin, f"/api/v1/devices?{query}", 400), 400, *words)


async def test_continue_tokens_cover_the_list_exactly_once(admin: Admin) -> None:
    seen: list[str] = []
    body = await get_json(admin, "/api/v1/devices?limit=4")
    pages = 1
    while True:
        assert body["total"] == 9
        seen += [d["name"] for d in body["items"]]
        if body["continue"] is None:
            break
        body = await get_json(
            admin, "/api/v1/devices", params={"limit": "4", "continue": body["continue"]}
        )
        pages += 1
    assert pages == 3
    assert seen == sorted(seen) and len(seen) == len(set(seen)) == 9
    by_offset = []
    for offset in range(0, 9, 2):
        page = await get_json(admin, f"/api/v1/devices?limit=2&offset={offset}")
        by_offset += [d["name"] for d in page["items"]]
    assert by_offset == seen


async def test_a_continue_token_is_refused_for_other_filters(admin: Admin) -> None:
    body = await get_json(admin, "/api/v1/devices?limit=2&region=us-east")
    token = body["continue"]
    assert token
    refused = await get_json(
        admin, "/api/v1/devices", 400, params={"limit": "2", "region": "us-west", "continue": token}
    )
    assert_error(refused, 400, "other filters")


async def test_a_device_has_its_events_and_reservations(admin: Admin) -> None:
    name = admin.seeded.names["us-east/rack-01"][0]
    body = await get_json(admin, f"/api/v1/devices/{name}")
    assert body["state"] == "attached" and body["pool"] == "us-east/rack-01"
    assert body["host_id"] == "us-east-rack-01-1"
    assert [e["kind"] for e in body["events"]] == ["added"]
    assert [r["state"] for r in body["reservation_history"]] == ["attached"]
    assert body["reservation_history"][0]["claim"]["name"] == "claim-a"


async def test_unknown_and_malformed_device_names(admin: Admin) -> None:
    assert_error(
        await get_json(admin, "/api/v1/devices/no-such-device", 404), 404, "no-such-device"
    )
    assert_error(await get_json(admin, "/api/v1/devices/Not_A_Label", 400), 400, "'name'")


# --------------------------------------------------------------------------- reservations
async def test_reservations_filter_by_state_and_claim(admin: Admin) -> None:
    body = await get_json(admin, "/api/v1/reservations")
    assert [r["id"] for r in body["items"]] == sorted(
        (r["id"] for r in body["items"]), reverse=True
    )
    assert body["total"] == 4
    active = await get_json(admin, "/api/v1/reservations?state=active")
    assert active["total"] == 3
    released = await get_json(admin, "/api/v1/reservations?state=released")
    assert [r["id"] for r in released["items"]] == [admin.seeded.released]
    claim = await get_json(admin, "/api/v1/reservations?claim=team-a/claim-a")
    assert {r["id"] for r in claim["items"]} == {admin.seeded.attached, admin.seeded.pending}
    assert (await get_json(admin, "/api/v1/reservations?claim=team-a/nope"))["total"] == 0


async def test_reservation_pages_cover_the_list_once(admin: Admin) -> None:
    ids: list[int] = []
    params = {"limit": "1"}
    while True:
        body = await get_json(admin, "/api/v1/reservations", params=params)
        ids += [r["id"] for r in body["items"]]
        if body["continue"] is None:
            break
        params = {"limit": "1", "continue": body["continue"]}
    assert ids == sorted(set(ids), reverse=True) and len(ids) == 4


async def test_bad_reservation_filters_are_400(admin: Admin) -> None:
    for query in ("claim=team-a", "claim=a/b/c", "state=gone", "limit=1000", "offset=x"):
        assert_error(await get_json(admin, f"/api/v1/reservations?{query}", 400), 400)


# --------------------------------------------------------------------------- claims
async def test_a_claim_joins_the_live_view_reservations_and_fabric(admin: Admin) -> None:
    admin.live.claims[("team-a", "claim-a")] = {
        "claim": {"metadata": {"name": "claim-a", "namespace": "team-a"}},
        "errors": ["waiting for node", {"message": "attach timeout"}],
    }
    body = await get_json(admin, "/api/v1/claims/team-a/claim-a")
    assert body["claim"]["metadata"]["name"] == "claim-a" and body["live"] is True
    assert {r["id"] for r in body["reservations"]} == {admin.seeded.attached, admin.seeded.pending}
    fabric = {f["device"]: f for f in body["fabric"]}
    first, second = admin.seeded.names["us-east/rack-01"][:2]
    assert fabric[first]["host_id"] == "us-east-rack-01-1"
    assert fabric[first]["attached_as_reserved"] is True
    assert fabric[second]["attached_as_reserved"] is False
    assert [e["message"] for e in body["errors"]] == ["waiting for node", "attach timeout"]


async def test_a_claim_known_only_from_the_journal_is_shown(admin: Admin) -> None:
    body = await get_json(admin, "/api/v1/claims/team-b/claim-b")
    assert body["claim"] is None and len(body["reservations"]) == 2
    assert any(e["message"] == "attach refused by fabric" for e in body["errors"])


async def test_an_unknown_claim_is_404_and_a_malformed_one_400(admin: Admin) -> None:
    assert_error(await get_json(admin, "/api/v1/claims/team-z/nothing", 404), 404, "team-z/nothing")
    assert_error(await get_json(admin, "/api/v1/claims/Team_Z/x", 400), 400, "'namespace'")


async def test_claims_without_the_live_reconciler_come_from_the_journal(db: Database) -> None:
    seeded = await seed(db)
    context = make_context(db, seeded, Live(), claim_view=None)
    async with TestClient(TestServer(make_app(context), host="127.0.0.1")) as client:
        response = await client.get("/api/v1/claims/team-a/claim-a")
        body = await response.json()
        assert response.status == 200 and body["live"] is False
        assert len(body["reservations"]) == 2


# --------------------------------------------------------------------------- what-if
SPEC = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}


async def test_what_if_answers_from_the_allocator(admin: Admin) -> None:
    admin.live.what_if_answer = {"nodes": [{"node": "node-1", "satisfiable": True}]}
    body = await post_json(admin, "/api/v1/allocations/what-if", json=SPEC)
    assert body["nodes"][0]["satisfiable"] is True
    assert admin.live.what_if_seen == [SPEC]


JSON = {"Content-Type": "application/json"}
BAD_WHAT_IFS = [
    (b"{not json", {"Content-Type": "application/json"}, 400, ["not valid JSON"]),
    (b"[1, 2]", {"Content-Type": "application/json"}, 400, ["'devices' object"]),
    (b'{"devices": 3}', {"Content-Type": "application/json"}, 400, ["'devices' object"]),
    (b"", {"Content-Type": "application/json"}, 400, ["body is required"]),
    (b"devices: {}", {"Content-Type": "text/plain"}, 415, ["application/json"]),
    (b"{}", {"Content-Type": "application/x-www-form-urlencoded"}, 415, ["application/json"]),
    (
        b'{"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "gpu",'
        b' "count": NaN}}]}}',
        {"Content-Type": "application/json"},
        400,
        ["not valid JSON", "NaN is not a JSON number"],
    ),
    (b'{"devices": {"requests": []}, "x": -Infinity}', JSON, 400, ["-Infinity is not a JSON"]),
    (
        b'{"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "gpu",'
        b' "count": -3}}]}}',
        JSON,
        400,
        ["claim spec cannot be read", "count must be greater than 0, not -3"],
    ),
    (
        b'{"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "gpu",'
        b' "count": "two"}}]}}',
        JSON,
        400,
        ["claim spec cannot be read", "count must be an integer, not 'two'"],
    ),
    (
        b'{"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "gpu",'
        b' "count": 1.5}}]}}',
        JSON,
        400,
        ["count must be an integer, not 1.5"],
    ),
    (
        b'{"devices": {"requests": []}, "pad": "' + b"x" * 5000 + b'"}',
        {"Content-Type": "application/json"},
        413,
        ["4096 bytes"],
    ),
    # Fields of the wrong JSON type, each named by its place (they were 500s).
    *(
        (
            json.dumps({"devices": {"requests": [{"name": "a", "exactly": exactly}]}}).encode(),
            JSON,
            400,
            ["claim spec cannot be read", *words],
        )
        for exactly, words in [
            (3, ["request 'a': exactly must be an object"]),
            ({"deviceClassName": "gpu", "selectors": [5]}, ["selectors must be a list of objects"]),
            ({"deviceClassName": "gpu", "selectors": "x"}, ["selectors must be a list of objects"]),
            (
                {"deviceClassName": "gpu", "selectors": [{"cel": 1}]},
                ["selectors[0].cel must be an object"],
            ),
            (
                {"deviceClassName": "gpu", "selectors": [{"cel": {"expression": 7}}]},
                ["selectors[0] must be a string, not 7"],
            ),
            ({"deviceClassName": 5}, ["deviceClassName must be a string, not 5"]),
            ({"deviceClassName": "gpu", "allocationMode": []}, ["allocationMode must be a string"]),
            (
                {"deviceClassName": "gpu", "tolerations": [1]},
                ["tolerations must be a list of objects"],
            ),
        ]
    ),
    (
        json.dumps({"devices": {"requests": [{"name": 3, "exactly": {}}]}}).encode(),
        JSON,
        400,
        ["devices.requests[0].name must be a string, not 3"],
    ),
    (
        json.dumps({"devices": {"requests": [{"name": "a", "firstAvailable": [1]}]}}).encode(),
        JSON,
        400,
        ["request 'a': firstAvailable must be a list of objects"],
    ),
    (
        json.dumps(
            {
                "devices": {
                    "requests": [{"name": "a", "exactly": {"deviceClassName": "gpu"}}],
                    "constraints": [{"matchAttribute": 5, "requests": ["a"]}],
                }
            }
        ).encode(),
        JSON,
        400,
        ["devices.constraints[0].matchAttribute must be a string, not 5"],
    ),
    (
        json.dumps(
            {
                "devices": {
                    "requests": [{"name": "a", "exactly": {"deviceClassName": "gpu"}}],
                    "constraints": [{"matchAttribute": "x", "requests": "a"}],
                }
            }
        ).encode(),
        JSON,
        400,
        ["devices.constraints[0].requests must be a list"],
    ),
    # A body whose Content-Encoding does not match its bytes.
    (
        b"{}",
        {"Content-Type": "application/json", "Content-Encoding": "gzip"},
        400,
        ["the body cannot be read", "gzip"],
    ),
]


async def test_bad_what_if_requests(admin: Admin) -> None:
    for data, headers, status, words in BAD_WHAT_IFS:
        body = await post_json(
            admin, "/api/v1/allocations/what-if", status, data=data, headers=headers
        )
        assert_error(body, status, *words)
    assert admin.live.what_if_seen == []


async def test_a_huge_chunked_body_is_413(admin: Admin) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * 1024

    response = await admin.client.post(
        "/api/v1/allocations/what-if", data=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status == 413
    assert_error(await response.json(), 413)


@pytest.mark.parametrize(
    ("path", "data"),
    [
        # Deeper than Python's JSON decoder goes (RecursionError), and deep but decodable.
        ("/api/v1/allocations/what-if", b"[" * 2000 + b"]" * 2000),
        ("/api/v1/allocations/what-if", b'{"devices": ' + b"[" * 100 + b"]" * 100 + b"}"),
        ("/api/v1/devices/{name}/cordon", b"[" * 2000 + b"]" * 2000),
        ("/api/v1/devices/{name}/cordon", b'{"reason": ' + b"[" * 100 + b"]" * 100 + b"}"),
    ],
)
async def test_a_deeply_nested_body_is_400(
    admin: Admin, caplog: pytest.LogCaptureFixture, path: str, data: bytes
) -> None:
    caplog.set_level(logging.DEBUG)
    name = admin.seeded.names["us-west/rack-07"][0]
    body = await post_json(
        admin,
        path.format(name=name),
        400,
        data=data,
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert_error(body, 400, "nested more than 64 levels deep")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "RecursionError" not in caplog.text
    assert admin.live.what_if_seen == [] and admin.live.changes == 0


async def test_a_client_that_leaves_mid_body_is_logged_without_a_traceback(
    admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # The service's own runner: its handlers are not cancelled when the client leaves (the
    # test server's are), so the body read fails with ConnectionResetError.
    runner = await serve(admin.context, "127.0.0.1", 0)
    try:
        await _leave_mid_body(runner.addresses[0][1])
        for _ in range(100):
            if "went away" in caplog.text:
                break
            await asyncio.sleep(0.02)
    finally:
        await runner.cleanup()
    gone = [r for r in caplog.records if "went away" in r.getMessage()]
    assert [r.levelno for r in gone] == [logging.INFO]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "Traceback" not in caplog.text and admin.live.what_if_seen == []


async def _leave_mid_body(port: int) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /api/v1/allocations/what-if HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        b'{"devices": '
    )
    await writer.drain()
    await asyncio.sleep(0.1)
    writer.close()
    await writer.wait_closed()


async def test_a_body_that_stops_arriving_is_408(
    admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Part of the announced body, then nothing: answered and closed, not held for ever.
    monkeypatch.setattr(pipeline, "BODY_READ_TIMEOUT_S", 0.5)
    runner = await serve(admin.context, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", runner.addresses[0][1])
        writer.write(
            b"POST /api/v1/allocations/what-if HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            b'{"devices": '
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)  # to the server's close
        writer.close()
    finally:
        await runner.cleanup()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"Connection: close" in head
    assert_error(json.loads(body), 408, "did not arrive within 0.5 s")
    assert admin.live.what_if_seen == []


async def test_what_if_is_503_without_the_allocator(db: Database) -> None:
    seeded = await seed(db)
    context = make_context(db, seeded, Live(), what_if=None)
    async with TestClient(TestServer(make_app(context), host="127.0.0.1")) as client:
        response = await client.post("/api/v1/allocations/what-if", json=SPEC)
        assert response.status == 503
        assert_error(await response.json(), 503, "allocator")


# --------------------------------------------------------------------------- auth
async def test_actions_need_the_bearer_token(admin: Admin) -> None:
    name = admin.seeded.names["us-east/rack-01"][2]
    path = f"/api/v1/devices/{name}/cordon"
    response = await admin.client.post(path)
    assert response.status == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert_error(await response.json(), 401, "bearer token")
    response = await admin.client.post(path, headers={"Authorization": f"Basic {TOKEN}"})
    assert response.status == 401 and "WWW-Authenticate" in response.headers
    response = await admin.client.post(path, headers={"Authorization": "Bearer wrong"})
    assert response.status == 403
    assert_error(await response.json(), 403, "not valid")
    response = await admin.client.post(path, headers={"Authorization": f"Bearer {TOKEN}x"})
    assert response.status == 403
    assert admin.live.changes == 0
    assert (await get_json(admin, f"/api/v1/devices/{name}"))["state"] == "free"


async def test_a_token_that_is_not_utf8_is_refused_like_any_wrong_token(
    admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    name = admin.seeded.names["us-east/rack-01"][2]
    server = admin.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        f"POST /api/v1/devices/{name}/cordon HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
        "Connection: close\r\n".encode()
        + b"Authorization: Bearer \xff\xfe\r\n\r\n"
    )
    await writer.drain()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    assert b"not valid" in answer
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert admin.live.changes == 0


async def test_actions_are_disabled_without_a_configured_token(db: Database) -> None:
    seeded = await seed(db)
    context = make_context(db, seeded, Live(), token=None)
    async with TestClient(TestServer(make_app(context), host="127.0.0.1")) as client:
        for path in (
            f"/api/v1/devices/{seeded.names['us-east/rack-01'][2]}/uncordon",
            f"/api/v1/reservations/{seeded.pending}/release",
        ):
            response = await client.post(path, headers=AUTH)
            assert response.status == 403
            assert_error(await response.json(), 403, "disabled", "no token is configured")
        response = await client.get("/api/v1/status")
        assert response.status == 200


async def test_reads_need_the_token_when_configured(db: Database) -> None:
    seeded = await seed(db)
    live = Live(status=live_status())
    context = make_context(db, seeded, live, require_token_for_reads=True)
    async with TestClient(TestServer(make_app(context), host="127.0.0.1")) as client:
        for path in ("/api/v1/status", "/api/v1/devices", "/api/v1/pools", "/"):
            response = await client.get(path)
            assert response.status == 401, path
            response = await client.get(path, headers={"Authorization": "Bearer nope"})
            assert response.status == 403, path
            response = await client.get(path, headers=AUTH)
            assert response.status == 200, path
        for path in ("/healthz", "/readyz", "/metrics", "/api/v1/openapi.json"):
            assert (await client.get(path)).status == 200, path


async def test_no_answer_or_log_line_carries_the_token(
    admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    name = admin.seeded.names["us-east/rack-01"][2]
    texts = []
    for headers in ({}, {"Authorization": "Bearer wrong"}, AUTH):
        response = await admin.client.post(f"/api/v1/devices/{name}/cordon", headers=headers)
        texts.append(await response.text() + str(dict(response.headers)))
    for path in ("/api/v1/status", "/", "/api/v1/openapi.json"):
        response = await admin.client.get(path, headers=AUTH)
        texts.append(await response.text())
    assert all(TOKEN not in text for text in texts)
    assert TOKEN not in caplog.text


# --------------------------------------------------------------------------- actions
async def test_cordon_and_uncordon_change_the_database_and_republish(admin: Admin) -> None:
    name = admin.seeded.names["us-east/rack-01"][2]
    body = await post_json(
        admin,
        f"/api/v1/devices/{name}/cordon",
        headers=AUTH,
        json={"reason": "fan noise <b>loud</b>"},
    )
    assert body["state"] == "cordoned" and body["cordon_reason"] == "fan noise <b>loud</b>"
    assert admin.live.changes == 1
    async with admin.db.read() as session:
        row = (await session.scalars(select(Device).where(Device.name == name))).one()
        events = (
            await session.scalars(
                select(DeviceEvent.kind)
                .where(DeviceEvent.device_id == row.id)
                .order_by(DeviceEvent.id)
            )
        ).all()
    assert row.cordoned_at is not None and row.cordon_reason == "fan noise <b>loud</b>"
    assert list(events) == ["added", "cordoned"]
    pools = {p["name"]: p for p in (await get_json(admin, "/api/v1/pools"))["items"]}
    assert pools["us-east/rack-01"]["cordoned"] == 1

    # Cordoning again with the same reason changes nothing.
    await post_json(
        admin,
        f"/api/v1/devices/{name}/cordon",
        headers=AUTH,
        json={"reason": "fan noise <b>loud</b>"},
    )
    assert admin.live.changes == 1

    body = await post_json(admin, f"/api/v1/devices/{name}/uncordon", headers=AUTH)
    assert body["state"] == "free" and body["cordon_reason"] is None
    assert admin.live.changes == 2
    async with admin.db.read() as session:
        row = (await session.scalars(select(Device).where(Device.name == name))).one()
    assert row.cordoned_at is None and row.cordon_reason is None


async def test_cordon_without_a_body_has_an_empty_reason(admin: Admin) -> None:
    name = admin.seeded.names["us-west/rack-07"][0]
    body = await post_json(admin, f"/api/v1/devices/{name}/cordon", headers=AUTH)
    assert body["state"] == "cordoned" and body["cordon_reason"] == ""


BAD_CORDONS = [
    ({"reason": "x" * 256}, 400, ["at most 255"]),
    ({"reason": "maint\n2026-12-01 16:50:00,000 ERROR app.service: FAKE"}, 400, ["'reason'"]),
    ({"reason": "nul\u0000byte"}, 400, ["'reason': control characters are not allowed"]),
    ({"reason": "\x1b[31mred"}, 400, ["'reason': control characters are not allowed"]),
    ({"reason": 7}, 400, ["'reason'"]),
    ({"why": "x"}, 400, ["at most a 'reason'"]),
    ([], 400, ["object"]),
    # JSON's "\ud800" escape: not Unicode text (it was a 409 carrying a codec error).
    ({"reason": "\ud800"}, 400, ["lone surrogate"]),
    ({"reason": "ok", "\udfff": 1}, 400, ["lone surrogate"]),
]


async def test_bad_cordon_bodies(admin: Admin) -> None:
    name = admin.seeded.names["us-west/rack-07"][0]
    for payload, status, words in BAD_CORDONS:
        body = await post_json(
            admin, f"/api/v1/devices/{name}/cordon", status, headers=AUTH, json=payload
        )
        assert_error(body, status, *words)
    assert admin.live.changes == 0
    assert (await get_json(admin, f"/api/v1/devices/{name}"))["state"] == "free"


@pytest.mark.parametrize("payload", [{"bogus": 1}, {"reason": "x"}, [], "x", 5])
async def test_uncordon_and_release_refuse_a_body_with_fields(admin: Admin, payload: Any) -> None:
    name = admin.seeded.names["us-west/rack-07"][0]
    await admin.context.actions.cordon(name, "maint")
    rid = await _detach_failed(admin)
    for path, action in (
        (f"/api/v1/devices/{name}/uncordon", "uncordon"),
        (f"/api/v1/reservations/{rid}/release", "release"),
    ):
        body = await post_json(admin, path, 400, headers=AUTH, json=payload)
        assert_error(body, 400, f"{action} takes no body")
    assert (await get_json(admin, f"/api/v1/devices/{name}"))["state"] == "cordoned"
    # An empty object is no body.
    body = await post_json(admin, f"/api/v1/devices/{name}/uncordon", headers=AUTH, json={})
    assert body["state"] != "cordoned"


async def test_reasons_are_logged_escaped(admin: Admin, caplog: pytest.LogCaptureFixture) -> None:
    # The API refuses control characters; the log escapes the reason all the same.
    caplog.set_level(logging.INFO)
    name = admin.seeded.names["us-west/rack-07"][0]
    await admin.context.actions.cordon(name, "maint\nERROR app.service: FAKE")
    rid = await _detach_failed(admin)
    await admin.context.actions.forget(rid, "fixed\nERROR app.service: FAKE")
    lines = [r.getMessage() for r in caplog.records if "FAKE" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in line and "\\n" in line for line in lines)


async def test_cordon_of_unknown_or_removed_devices(admin: Admin) -> None:
    body = await post_json(admin, "/api/v1/devices/ghost/cordon", 404, headers=AUTH)
    assert_error(body, 404, "ghost")
    backend = admin.seeded.backend
    gone = backend.devices.pop()
    assert (await InventorySync(backend, admin.db).sync_once()).ok
    async with admin.db.read() as session:
        name = (
            await session.scalars(select(Device.name).where(Device.vendor_id == gone.vendor_id))
        ).one()
    body = await post_json(admin, f"/api/v1/devices/{name}/cordon", 409, headers=AUTH)
    assert_error(body, 409, "removed")
    assert (await get_json(admin, "/api/v1/devices?state=removed"))["total"] == 1


async def reservation(db: Database, reservation_id: int) -> Reservation:
    async with db.read() as session:
        row = await session.get(Reservation, reservation_id)
    assert row is not None
    return row


async def test_force_release_detaches_then_releases(admin: Admin) -> None:
    rid = admin.seeded.attached
    body = await post_json(admin, f"/api/v1/reservations/{rid}/release", headers=AUTH)
    assert body["message"] == "released" and body["reservation"]["state"] == "released"
    row = await reservation(admin.db, rid)
    assert row.state == RELEASED and row.released_at is not None and row.attempts == 1
    assert "administrator" in (row.last_error or "")
    first = admin.seeded.backend.devices[0]
    assert admin.seeded.backend.detached == [(first.vendor_id, "us-east-rack-01-1")]
    assert first.host_id is None
    assert admin.live.changes == 1
    # The controller is told to work on the claim at once (its status, an attach again).
    assert [(c.uid, c.namespace, c.name) for c in admin.live.released] == [
        (row.claim_uid, row.claim_namespace, row.claim_name)
    ]
    again = await post_json(admin, f"/api/v1/reservations/{rid}/release", 409, headers=AUTH)
    assert_error(again, 409, "released already")


async def test_force_release_of_a_pending_reservation_sends_nothing(admin: Admin) -> None:
    body = await post_json(
        admin, f"/api/v1/reservations/{admin.seeded.pending}/release", headers=AUTH
    )
    assert body["reservation"]["state"] == "released"
    assert admin.seeded.backend.detached == []


async def test_force_release_counts_a_vanished_device_as_detached(admin: Admin) -> None:
    admin.seeded.backend.detach_error = FabricNotFound("no such block")
    body = await post_json(
        admin, f"/api/v1/reservations/{admin.seeded.failed}/release", headers=AUTH
    )
    assert body["reservation"]["state"] == "released"
    assert "without detach" in body["reservation"]["last_error"]


async def test_force_release_keeps_detaching_when_the_fabric_fails(admin: Admin) -> None:
    admin.seeded.backend.detach_error = FabricUnavailable("fabric manager down")
    rid = admin.seeded.attached
    body = await post_json(admin, f"/api/v1/reservations/{rid}/release", 202, headers=AUTH)
    assert body["reservation"]["state"] == "detaching"
    assert "fabric manager down" in body["reservation"]["last_error"]
    row = await reservation(admin.db, rid)
    assert row.state == "detaching" and row.released_at is None
    admin.seeded.backend.detach_error = None
    body = await post_json(admin, f"/api/v1/reservations/{rid}/release", headers=AUTH)
    assert body["reservation"]["state"] == "released"


async def test_force_release_goes_through_the_release_routine(admin: Admin) -> None:
    """The controllers' release routine: ``detaching`` is journalled before the detach call,
    and the release clears the device's holder in the inventory (as FabricOps does)."""
    rid = admin.seeded.attached
    seen: list[tuple[str, str | None]] = []

    async def journal_at_the_call() -> None:
        row = await reservation(admin.db, rid)
        seen.append((row.state, row.last_error))

    admin.seeded.backend.before_detach = journal_at_the_call
    body = await post_json(admin, f"/api/v1/reservations/{rid}/release", headers=AUTH)
    assert seen == [("detaching", "released by an administrator: detaching")]
    assert body["reservation"]["state"] == "released"
    assert body["reservation"]["last_error"] == (
        "released by an administrator; detached from host us-east-rack-01-1"
    )
    row = await reservation(admin.db, rid)
    async with admin.db.read() as session:
        device = await session.get(Device, row.device_id)
    assert device is not None and device.host_id is None


async def test_force_release_refused_by_the_fabric_ends_detach_failed(admin: Admin) -> None:
    """A detach the fabric refuses ends ``detach-failed``, as the controllers' release does
    (not ``detaching``, which the controller would retry for ever)."""
    rid = admin.seeded.attached
    admin.seeded.backend.detach_error = FabricError("HTTP 406: block in use")
    body = await post_json(admin, f"/api/v1/reservations/{rid}/release", 202, headers=AUTH)
    assert body["reservation"]["state"] == "detach-failed"
    assert "detach-failed" in body["message"] and "forget" in body["message"]
    row = await reservation(admin.db, rid)
    assert row.state == "detach-failed" and row.released_at is None
    assert "released by an administrator, but detach" in (row.last_error or "")
    assert "block in use" in (row.last_error or "") and "forget" in (row.last_error or "")
    status = await get_json(admin, "/api/v1/status")
    assert [r["id"] for r in status["attention"]["detach_failed"]] == [rid]
    # Once the operator fixed the fabric, a force-release tries the detach again.
    admin.seeded.backend.detach_error = None
    body = await post_json(admin, f"/api/v1/reservations/{rid}/release", headers=AUTH)
    assert body["reservation"]["state"] == "released"
    assert len(admin.seeded.backend.detached) == 2


async def test_force_release_of_unknown_or_malformed_ids(admin: Admin) -> None:
    assert_error(
        await post_json(admin, "/api/v1/reservations/999999/release", 404, headers=AUTH),
        404,
        "999999",
    )
    assert_error(
        await post_json(admin, "/api/v1/reservations/abc/release", 400, headers=AUTH), 400, "'id'"
    )


async def _detach_failed(admin: Admin) -> int:
    rid = admin.seeded.attached
    journal = Journal(admin.db)
    assert await journal.begin_detach(rid) is not None
    assert (
        await journal.transition(
            rid, ["detaching"], "detach-failed", error="detach: HTTP 406: block in use"
        )
        is not None
    )
    return rid


async def test_forget_releases_a_detach_failed_reservation_without_a_detach(admin: Admin) -> None:
    rid = await _detach_failed(admin)
    status = await get_json(admin, "/api/v1/status")
    assert [r["id"] for r in status["attention"]["detach_failed"]] == [rid]
    body = await post_json(
        admin,
        f"/api/v1/reservations/{rid}/forget",
        json={"reason": "pulled the cable and re-seated the GPU"},
        headers=AUTH,
    )
    assert body["reservation"]["state"] == "released"
    row = await reservation(admin.db, rid)
    assert row.state == RELEASED and "re-seated" in (row.last_error or "")
    assert admin.seeded.backend.detached == []  # nothing was sent to the fabric
    async with admin.db.read() as session:
        events = (
            await session.scalars(select(DeviceEvent).where(DeviceEvent.kind == "forgotten"))
        ).all()
    assert [(e.old, e.new) for e in events] == [
        ("detach-failed", "pulled the cable and re-seated the GPU")
    ]
    assert admin.live.changes == 1
    assert [c.uid for c in admin.live.released] == [row.claim_uid]
    status = await get_json(admin, "/api/v1/status")
    assert status["attention"]["detach_failed"] == []


@pytest.mark.parametrize(
    ("payload", "status", "words"),
    [
        (None, 400, ("JSON body",)),
        ({}, 400, ("reason",)),
        ({"reason": ""}, 400, ("non-empty",)),
        ({"reason": "   "}, 400, ("non-empty",)),
        ({"reason": 7}, 400, ("string",)),
        ({"reason": "x" * 256}, 400, ("255",)),
        ({"reason": "ok", "extra": 1}, 400, ("exactly",)),
        ({"reason": "fixed\nERROR app.service: FAKE"}, 400, ("'reason'", "control characters")),
        ({"reason": "fixed\u0000"}, 400, ("'reason': control characters are not allowed",)),
    ],
)
async def test_forget_needs_a_reason(
    admin: Admin, payload: Any, status: int, words: tuple[str, ...]
) -> None:
    rid = await _detach_failed(admin)
    kwargs = {} if payload is None else {"json": payload}
    body = await post_json(
        admin, f"/api/v1/reservations/{rid}/forget", status, headers=AUTH, **kwargs
    )
    assert_error(body, status, *words)
    assert (await reservation(admin.db, rid)).state == "detach-failed"


async def test_forget_of_released_pending_or_unknown_reservations_is_refused(admin: Admin) -> None:
    reason = {"reason": "fixed"}
    assert_error(
        await post_json(
            admin, "/api/v1/reservations/999999/forget", 404, json=reason, headers=AUTH
        ),
        404,
        "999999",
    )
    assert_error(
        await post_json(
            admin,
            f"/api/v1/reservations/{admin.seeded.pending}/forget",
            409,
            json=reason,
            headers=AUTH,
        ),
        409,
        "release it instead",
    )
    # An attached reservation's pod may be using the device: never forgotten.
    assert_error(
        await post_json(
            admin,
            f"/api/v1/reservations/{admin.seeded.attached}/forget",
            409,
            json=reason,
            headers=AUTH,
        ),
        409,
        "live claim",
    )
    assert (await reservation(admin.db, admin.seeded.attached)).state == ATTACHED
    await post_json(admin, f"/api/v1/reservations/{admin.seeded.attached}/release", headers=AUTH)
    assert_error(
        await post_json(
            admin,
            f"/api/v1/reservations/{admin.seeded.attached}/forget",
            409,
            json=reason,
            headers=AUTH,
        ),
        409,
        "nothing to forget",
    )


async def test_forget_needs_the_admin_token(admin: Admin) -> None:
    rid = await _detach_failed(admin)
    body = await post_json(
        admin, f"/api/v1/reservations/{rid}/forget", 401, json={"reason": "fixed"}
    )
    assert_error(body, 401, "token")
    assert (await reservation(admin.db, rid)).state == "detach-failed"


async def test_force_release_may_try_a_detach_failed_reservation_again(admin: Admin) -> None:
    rid = await _detach_failed(admin)
    body = await post_json(admin, f"/api/v1/reservations/{rid}/release", headers=AUTH)
    assert body["reservation"]["state"] == "released"
    assert len(admin.seeded.backend.detached) == 1


async def _cli(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_forget_command_releases_through_the_admin_api(
    admin: Admin, tmp_path: Path
) -> None:
    rid = await _detach_failed(admin)
    url = str(admin.client.make_url("")).rstrip("/")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    code, out, err = await _cli("forget", str(rid), "--reason", "re-seated", "--admin-url", url)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--token-file" in err
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token\n")
    code, out, err = await _cli(
        "forget", str(rid), "--reason", "re-seated", "--admin-url", url, "--token-file", str(wrong)
    )
    assert code == 1 and len(err.strip().splitlines()) == 1 and "403" in err
    assert "--token-file" in err
    assert (await reservation(admin.db, rid)).state == "detach-failed"
    code, out, err = await _cli(
        "forget", str(rid), "--reason", "re-seated", "--admin-url", url, "--token-file", str(token)
    )
    assert code == 0, err
    assert f"reservation {rid}" in out and "without a detach" in out
    assert (await reservation(admin.db, rid)).state == RELEASED
    code, _, err = await _cli(
        "forget", str(rid), "--reason", "again", "--admin-url", url, "--token-file", str(token)
    )
    assert code == 1 and "nothing to forget" in err and len(err.strip().splitlines()) == 1
    assert "{" not in err  # the controller's message, not its JSON body
    for args in (
        [str(rid), "--reason", "x" * 256, "--admin-url", url],
        [str(rid), "--reason", "x", "--admin-url", "ftp://127.0.0.1:1"],
        [str(rid), "--reason", "  ", "--admin-url", url],
        [str(rid), "--admin-url", url],
        ["abc", "--reason", "x", "--admin-url", url],
    ):
        code, _, err = await _cli("forget", *args)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
    # A token file that cannot be used is a usage error, as a missing one is.
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for given, why in ((tmp_path / "missing", "No such file"), (empty, "the file is empty")):
        code, _, err = await _cli(
            "forget", str(rid), "--reason", "x", "--admin-url", url, "--token-file", str(given)
        )
        assert code == 2 and "--token-file" in err and why in err, err
        assert len(err.strip().splitlines()) == 1, err


# --------------------------------------------------------------------------- errors, headers
async def test_unknown_routes_and_methods_answer_json(admin: Admin) -> None:
    assert_error(await get_json(admin, "/api/v1/nothing", 404), 404, "no route")
    response = await admin.client.delete("/api/v1/devices")
    assert response.status == 405 and response.headers["Allow"] == "GET,HEAD"
    assert_error(await response.json(), 405, "DELETE", "GET")
    response = await admin.client.get("/api/v1/reservations/1/release")
    assert response.status == 405
    # HEAD wherever GET is (RFC 9110 9.3.2): GET's status and headers, no body.
    for path in ("/", "/api/v1/devices", "/healthz"):
        got = await admin.client.get(path)
        head = await admin.client.head(path)
        assert head.status == got.status == 200, path
        assert head.headers["Content-Type"] == got.headers["Content-Type"]
        assert await head.read() == b""
    assert (await admin.client.head("/api/v1/reservations/1/release")).status == 405
    assert (await admin.client.get("/healthz")).headers["Server"] == "fabric-dra"


async def test_an_unexpected_failure_is_500_without_a_traceback(
    admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    admin.live.status_error = RuntimeError("secret internals at /srv/x.py line 3")
    response = await admin.client.get("/api/v1/status")
    body = await response.json()
    assert response.status == 500
    request_id = body["error"]["request_id"]
    assert request_id in body["error"]["message"] and "secret" not in await response.text()
    assert response.headers["X-Request-Id"] == request_id
    assert "secret internals" in caplog.text and request_id in caplog.text
    # The dashboard still renders from the database when the live status fails.
    response = await admin.client.get("/")
    assert response.status == 200 and "could not be read" in await response.text()


async def test_security_headers_on_every_answer(admin: Admin) -> None:
    for path in ("/api/v1/status", "/healthz", "/metrics", "/api/v1/nothing", "/"):
        response = await admin.client.get(path)
        assert response.headers["X-Content-Type-Options"] == "nosniff", path
        assert response.headers["Cache-Control"] == "no-store", path
        csp = response.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, path
    response = await admin.client.get("/")
    csp = response.headers["Content-Security-Policy"]
    nonce = csp.split("'nonce-")[1].split("'")[0]
    assert f'<style nonce="{nonce}">' in await response.text()
    assert "unsafe-inline" not in csp and "script-src" not in csp


async def test_dashboard_shows_pools_errors_freshness_and_attention(admin: Admin) -> None:
    name = admin.seeded.names["us-east/rack-01"][3]
    await post_json(
        admin,
        f"/api/v1/devices/{name}/cordon",
        headers=AUTH,
        json={"reason": "<script>alert(1)</script>"},
    )
    response = await admin.client.get("/")
    html = await response.text()
    assert response.status == 200 and response.content_type == "text/html"
    for text in (
        "us-east/rack-01",
        "us-east/rack-02",
        "us-west/rack-07",
        "50.0 %",
        "update ResourceSlice: 409",
        "attach refused by fabric",
        "team-c/claim-c",
        "42 s ago",
        "fabric-dra-0",
        '<meta http-equiv="refresh" content="10">',
        admin.seeded.names["us-east/rack-02"][0],
    ):
        assert text in html, text
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "http://" not in html and "https://" not in html


async def test_the_dashboard_charts_the_last_hour_from_sampled_history(admin: Admin) -> None:
    # No history: no charts, and nothing breaks.
    html = await (await admin.client.get("/")).text()
    assert 'id="history"' not in html
    history = History(window_s=3600, interval_s=30)
    admin.context.history = history
    attach = Histogram(
        "attach_seconds", "test", namespace="fabric_dra", registry=admin.context.registry
    )
    html = await (await admin.client.get("/")).text()
    assert 'id="history"' in html and "Collecting: 0 sample" in html
    now = time.time()
    first = await take_sample(admin.context, history, now - 60)
    assert first.attach_seconds is None and first.attaches == 0
    attach.observe(1.5)
    attach.observe(2.5)
    second = await take_sample(admin.context, history, now - 30)
    assert second.attach_seconds == 2.0 and second.attaches == 2
    # The seeded database: us-east/rack-01 has 4 devices, 2 of them reserved.
    assert second.utilisation["us-east/rack-01"] == 0.5
    assert second.claims_waiting >= 1  # team-c/claim-c waits for a node
    await take_sample(admin.context, history, now)
    html = await (await admin.client.get("/")).text()
    assert "Collecting" not in html and "latest" in html
    assert "peak 2.00 s" in html and '<svg class="spark small"' in html
    assert html.count("<polyline points=") >= 2 + len(second.utilisation)
    # A failing live status leaves the waiting claims from the database alone.
    admin.live.status_error = RuntimeError("down")
    assert (await take_sample(admin.context, history, now + 30)).claims_waiting >= 0


# --------------------------------------------------------------------------- operator commands
async def test_status_prints_leader_freshness_counts_waiting_and_attention(
    admin: Admin, tmp_path: Path
) -> None:
    url = str(admin.client.make_url("")).rstrip("/")
    code, out, err = await _cli("status", "--admin-url", url)
    assert code == 0, err
    assert "leader: this replica" in out
    assert "fabric manager memory: fresh" in out and "9 devices, 2 hosts" in out
    assert "claims waiting: 1" in out and "claim team-c/claim-c, reason no node yet" in out
    code, wide, err = await _cli("status", "--admin-url", url, "-o", "wide")
    assert code == 0, err
    assert wide.startswith(out.rstrip("\n")) and "loops:" in wide
    for output, load in (("json", json.loads), ("yaml", yaml.safe_load)):
        code, text, err = await _cli("status", "--admin-url", url, "-o", output)
        assert code == 0, err
        document = load(text)
        assert document["service"]["leader"]["is_leader"] is True
        assert document["database"]["devices"]["present"] > 0
    admin.live.status["inventory"][0]["stale"] = True
    admin.context.status = admin.live.get_status
    code, out, _ = await _cli("status", "--admin-url", url)
    assert code == 0 and "STALE" in out


async def test_reservations_lists_in_every_output_format(admin: Admin) -> None:
    rid = await _detach_failed(admin)
    url = str(admin.client.make_url("")).rstrip("/")
    code, out, err = await _cli("reservations", "--admin-url", url, "--state", "detach-failed")
    assert code == 0, err
    header, *rows = out.strip().splitlines()
    assert header.split()[:3] == ["ID", "STATE", "CLAIM"] and "LAST" not in header
    assert [row.split()[:2] for row in rows] == [[str(rid), "detach-failed"]]
    code, out, err = await _cli("reservations", "--admin-url", url, "-o", "wide")
    assert code == 0 and "LAST ERROR" in out.splitlines()[0] and "block in use" in out
    code, out, err = await _cli("reservations", "--admin-url", url, "-o", "json")
    assert code == 0 and any(item["id"] == rid for item in json.loads(out)["items"])
    # "active", as the API takes it: every state that holds a device, none released.
    code, out, err = await _cli("reservations", "--admin-url", url, "--state", "active")
    assert code == 0, err
    states = {row.split()[0]: row.split()[1] for row in out.strip().splitlines()[1:]}
    assert states[str(rid)] == "detach-failed" and str(admin.seeded.attached) in states
    assert "released" not in states.values()
    code, out, err = await _cli("reservations", "--admin-url", url, "--state", "nothing-like-it")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is not one of" in err
    # The API refuses it too, for other clients.
    await get_json(admin, "/api/v1/reservations?state=nothing-like-it", 400, headers=AUTH)


async def test_cordon_uncordon_and_release_act_through_the_admin_api(
    admin: Admin, tmp_path: Path
) -> None:
    url = str(admin.client.make_url("")).rstrip("/")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    name = admin.seeded.names["us-east/rack-01"][0]
    with_token = ("--admin-url", url, "--token-file", str(token))
    code, out, err = await _cli("cordon", name, "--reason", "fan noise", *with_token)
    assert code == 0 and f"device {name} cordoned" in out, err
    async with admin.db.read() as session:
        row = (await session.scalars(select(Device).where(Device.name == name))).one()
    assert row.cordon_reason == "fan noise"
    code, out, err = await _cli("uncordon", name, *with_token)
    assert code == 0 and "uncordoned" in out, err
    async with admin.db.read() as session:
        row = (await session.scalars(select(Device).where(Device.name == name))).one()
    assert row.cordoned_at is None
    # Bad input, each one line: no such device, a reason too long, no token, a URL that is
    # not the admin API.
    code, _, err = await _cli("cordon", "no-such-device", *with_token)
    assert code == 1 and "HTTP 404" in err and len(err.strip().splitlines()) == 1
    code, _, err = await _cli("cordon", name, "--reason", "x" * 256, *with_token)
    assert code == 2 and "at most 255" in err and len(err.strip().splitlines()) == 1
    code, _, err = await _cli("uncordon", name, "--admin-url", url)
    assert code == 2 and "--token-file" in err
    code, _, err = await _cli("status", "--admin-url", url + "/healthz-nothing")
    assert code == 1 and len(err.strip().splitlines()) == 1
    rid = await _detach_failed(admin)
    code, out, err = await _cli("release", str(rid), *with_token)
    assert code == 0 and f"reservation {rid}" in out and "released" in out, err
    assert (await reservation(admin.db, rid)).state == RELEASED


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (
            b"GET /status HTTP/1.1\r\nAuthorization: Bearer sup3rsecret\x01x\r\n\r\n",
            "Invalid header value char",
        ),
        (
            b"GET /status HTTP/1.1\r\nAuthorization: Bearer sup3rsecret"
            + b"s" * 9000
            + b"\r\n\r\n",
            "Got more than 8190 bytes when reading",
        ),
        (
            b"GET /status HTTP/1.1\r\nContent-Length: sup3rsecret\r\n\r\n",
            "Invalid character in Content-Length",
        ),
    ],
)
async def test_a_request_that_cannot_be_parsed_is_one_warning_line_without_its_bytes(
    admin: Admin, caplog: pytest.LogCaptureFixture, raw: bytes, reason: str
) -> None:
    from app.logs import install_bad_request_filter

    installed = install_bad_request_filter()
    try:
        caplog.set_level("DEBUG", logger="aiohttp.server")
        server = admin.client.server
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(raw)
        await writer.drain()
        answer = await reader.read(200)
        writer.close()
        await writer.wait_closed()
    finally:
        logging.getLogger("aiohttp.server").removeFilter(installed)
    assert answer.startswith(b"HTTP/1.0 400"), answer
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert [(r.levelname, r.exc_info) for r in records] == [("WARNING", None)]
    assert records[0].getMessage() == f"bad HTTP request from 127.0.0.1: {reason} (answered 400)"
    assert "sup3rsecret" not in caplog.text
    # The endpoint goes on answering.
    assert await get_json(admin, "/healthz") == {"status": "ok"}


@pytest.mark.parametrize(
    ("status", "body", "content_type"),
    [
        # A Redfish service (the simulator's port given by mistake): its error has a text code.
        (
            401,
            '{"error": {"code": "Base.1.0.InsufficientPrivilege", "message": "no session"}}',
            "application/json",
        ),
        # A proxy in between, or any other server: a page.
        (502, "<html><body>Bad Gateway</body></html>", "text/html"),
        (404, "", "text/plain"),
    ],
)
async def test_an_answer_not_from_the_admin_api_names_the_url_not_the_token(
    status: int, body: str, content_type: str
) -> None:
    async def answer(_request: web.Request) -> web.Response:
        return web.Response(status=status, text=body, content_type=content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with TestServer(app) as server:
        url = str(server.make_url("")).rstrip("/")
        code, _, err = await _cli("status", "--admin-url", url)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"{url} answered HTTP {status}" in err
    assert "is --admin-url the controller's admin endpoint?" in err
    assert "--token-file" not in err
