"""``GET /api/v1/status`` names the host identities shared by several hosts, over real HTTP
against real databases (SQLite and PostgreSQL) filled by the real inventory sync."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from builders import gpu, host
from test_admin import AUTH, FabricDouble, Live, Seeded, live_status, make_context

from app.admin.app import make_app
from app.db.engine import Database
from app.inventory import InventorySync


async def status_of(db: Database, backend: FabricDouble) -> dict[str, Any]:
    assert (await InventorySync(backend, db).sync_once()).ok
    context = make_context(db, Seeded(backend, {}), Live(status=live_status()))
    async with TestClient(TestServer(make_app(context), host="127.0.0.1", port=0)) as client:
        response = await client.get("/api/v1/status", headers=AUTH)
        body: dict[str, Any] = await response.json()
        assert response.status == 200, body
    return body


async def test_status_lists_hostnames_shared_by_several_hosts(db: Database) -> None:
    backend = FabricDouble(
        [gpu(0)],
        [
            host(1, hostname="localhost"),
            host(2, hostname="LocalHost"),
            host(3, hostname="localhost"),
            host(4),
        ],
    )
    body = await status_of(db, backend)
    assert body["database"]["ambiguousHosts"] == [
        {
            "key": "hostname",
            "value": "localhost",
            "hosts": ["us-east-rack-01-1", "us-east-rack-01-2", "us-east-rack-01-3"],
        }
    ]


async def test_status_lists_no_shared_hostname_when_every_host_has_its_own(db: Database) -> None:
    backend = FabricDouble([gpu(0)], [host(1), host(2), host(3, hostname=None)])
    body = await status_of(db, backend)
    assert body["database"]["ambiguousHosts"] == []


async def test_a_host_removed_from_the_fabric_no_longer_counts(db: Database) -> None:
    backend = FabricDouble([gpu(0)], [host(1, hostname="localhost"), host(2, hostname="localhost")])
    assert (await InventorySync(backend, db).sync_once()).ok
    backend.hosts = backend.hosts[:1]
    body = await status_of(db, backend)
    assert body["database"]["ambiguousHosts"] == []
