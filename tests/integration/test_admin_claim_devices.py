"""``GET /api/v1/claim-devices/{uid}``: the journal's devices for a claim, by its UID, over real
HTTP against real databases (SQLite and PostgreSQL). The node plugin asks it for a claim that
has no ``status.devices`` (classic DRA, Kubernetes 1.31).

The seeded journal (``test_admin.seed``) holds for claim ``uid-a`` (team-a/claim-a) an
attached and a pending reservation in us-east/rack-01, and for ``uid-b`` a released and a
failed one in us-east/rack-02.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from builders import gpu, host
from sqlalchemy import select
from test_admin import AUTH, DRIVER, FabricDouble, Live, Seeded, assert_error, make_context, seed

from app.admin.app import make_app
from app.db.engine import Database
from app.db.models import Device
from app.fabric.types import Location
from app.inventory import InventorySync
from app.journal import ATTACHED, ATTACHING, DETACH_FAILED, DETACHING, PENDING, ClaimRef, Journal
from app.node.plan import Verdict, states_from_journal

Client = TestClient[Any, Any]


@pytest.fixture
async def seeded_client(db: Database) -> AsyncIterator[tuple[Client, Seeded]]:
    seeded = await seed(db)
    context = make_context(db, seeded, Live())
    async with TestClient(TestServer(make_app(context), host="127.0.0.1", port=0)) as client:
        yield client, seeded


async def _get(client: Client, uid: str, status: int = 200, **kw: Any) -> Any:
    response = await client.get(f"/api/v1/claim-devices/{uid}", **kw)
    body = await response.json()
    assert response.status == status, body
    return body


async def test_an_attached_reservation_gives_its_device_with_identity_data(
    seeded_client: tuple[Client, Seeded],
) -> None:
    client, seeded = seeded_client
    first, second = seeded.names["us-east/rack-01"][:2]
    body = await _get(client, "uid-a")
    assert body["claim"] == {"uid": "uid-a", "namespace": "team-a", "name": "claim-a"}
    assert body["devices"] == [
        {
            "pool": "us-east/rack-01",
            "device": first,
            "request": "gpu",
            "state": "attached",
            "node": "node-1",
            "host": "us-east-rack-01-1",
            "data": {
                "deviceType": "gpu",
                "uuid": "00000000-0000-4000-8000-000000000000",
                "serialNumber": "SN-us-east-rack-01-0000",
            },
        },
        {
            "pool": "us-east/rack-01",
            "device": second,
            "request": "gpu2",
            "state": "pending",
            "node": "node-1",
            "host": "us-east-rack-01-1",
            "data": {
                "deviceType": "gpu",
                "uuid": "00000000-0000-4000-8000-000000000001",
                "serialNumber": "SN-us-east-rack-01-0001",
            },
        },
    ]


async def test_released_reservations_are_left_out(seeded_client: tuple[Client, Seeded]) -> None:
    client, seeded = seeded_client
    body = await _get(client, "uid-b")
    assert body["claim"] == {"uid": "uid-b", "namespace": "team-b", "name": "claim-b"}
    assert [(d["device"], d["state"]) for d in body["devices"]] == [
        (seeded.names["us-east/rack-02"][1], "failed")
    ]


async def test_an_unknown_claim_is_an_empty_list_not_404(
    seeded_client: tuple[Client, Seeded],
) -> None:
    client, _ = seeded_client
    for uid in ("0b7e5c1a-2f4d-4c9e-9a51-6f3d2e1b0c99", "uid-A", "devices"):
        body = await _get(client, uid)
        assert body == {"claim": {"uid": uid, "namespace": None, "name": None}, "devices": []}


BAD_UIDS = [
    ("uid_a", "does not match"),
    ("uid.a", "does not match"),
    ("uid%20a", "does not match"),
    ("uid%2Fa", "does not match"),
    ("%C3%BCid", "does not match"),
    ("uid%0Aa", "does not match"),
    ("u" * 65, "at most 64 characters"),
]


@pytest.mark.parametrize(("uid", "words"), BAD_UIDS)
async def test_a_uid_that_is_not_a_uid_token_is_400(
    seeded_client: tuple[Client, Seeded], uid: str, words: str
) -> None:
    client, _ = seeded_client
    assert_error(await _get(client, uid, 400), 400, "parameter 'uid'", words)


async def test_an_unknown_query_parameter_is_400(seeded_client: tuple[Client, Seeded]) -> None:
    client, _ = seeded_client
    body = await _get(client, "uid-a", 400, params={"node": "node-1"})
    assert_error(body, 400, "unknown parameter 'node'")


async def test_the_claim_route_still_answers_beside_it(
    seeded_client: tuple[Client, Seeded],
) -> None:
    client, _ = seeded_client
    response = await client.get("/api/v1/claims/team-a/claim-a")
    body = await response.json()
    assert response.status == 200 and body["namespace"] == "team-a", body


async def test_the_token_is_required_when_reads_need_it(db: Database) -> None:
    seeded = await seed(db)
    context = make_context(db, seeded, Live(), require_token_for_reads=True)
    async with TestClient(TestServer(make_app(context), host="127.0.0.1", port=0)) as client:
        assert_error(await _get(client, "uid-a", 401), 401, "bearer token is required")
        wrong = {"Authorization": "Bearer nope"}
        assert_error(await _get(client, "uid-a", 403, headers=wrong), 403, "not valid")
        body = await _get(client, "uid-a", headers=AUTH)
        assert len(body["devices"]) == 2
        # Authorization comes before validation: no hint about the parameter without a token.
        assert_error(await _get(client, "uid_a", 401), 401)


async def _pci_seed(db: Database) -> tuple[Seeded, str]:
    """A fabric with one GPU that reports PCI ids and a slot, reserved with no pool stored."""
    device = replace(
        gpu(0, region="eu-west", rack="rack-09"),
        attributes={"pci_vendor_id": "0x10de", "pci_device_id": "0x2330"},
        location=Location(region="eu-west", rack="rack-09", slot="7"),
    )
    backend = FabricDouble([device], [host(1, region="eu-west", rack="rack-09")])
    assert (await InventorySync(backend, db).sync_once()).ok
    async with db.read() as session:
        name = (await session.scalars(select(Device.name))).one()
    journal = Journal(db)
    claim = ClaimRef("5d1c3b2a-0000-4000-8000-00000000abcd", "ml", "train")
    view = await journal.reserve(claim, "gpu", name, "", "classic", "node-9", "eu-west-rack-09-1")
    await journal.transition(view.id, [PENDING], ATTACHING)
    await journal.transition(view.id, [ATTACHING], ATTACHED)
    return Seeded(backend, {"eu-west/rack-09": [name]}), name


async def test_pci_ids_and_slot_are_given_and_a_missing_pool_is_computed(db: Database) -> None:
    seeded, name = await _pci_seed(db)
    context = make_context(db, seeded, Live())
    async with TestClient(TestServer(make_app(context), host="127.0.0.1", port=0)) as client:
        body = await _get(client, "5d1c3b2a-0000-4000-8000-00000000abcd")
    (device,) = body["devices"]
    assert device["pool"] == "eu-west/rack-09"
    assert device["data"] == {
        "deviceType": "gpu",
        "uuid": "00000000-0000-4000-8000-000000000000",
        "serialNumber": "SN-eu-west-rack-09-0000",
        "pciVendorId": "0x10de",
        "pciDeviceId": "0x2330",
        "slot": "7",
    }
    assert (device["device"], device["state"], device["node"]) == (name, "attached", "node-9")


async def test_the_journal_s_own_states_pass_through(db: Database) -> None:
    seeded = await seed(db)
    journal = Journal(db)
    (attached,) = [r for r in await journal.for_claim("uid-a") if r.state == ATTACHED]
    await journal.transition(attached.id, [ATTACHED], DETACHING)
    await journal.transition(attached.id, [DETACHING], DETACH_FAILED, error="fabric refused")
    context = make_context(db, seeded, Live())
    async with TestClient(TestServer(make_app(context), host="127.0.0.1", port=0)) as client:
        body = await _get(client, "uid-a")
    assert [d["state"] for d in body["devices"]] == ["detach-failed", "pending"]


async def test_the_node_plugin_reads_the_answer_as_ready_and_waiting(
    seeded_client: tuple[Client, Seeded],
) -> None:
    client, seeded = seeded_client
    first, second = seeded.names["us-east/rack-01"][:2]
    body = await _get(client, "uid-a")
    claim = {
        "metadata": {"uid": "uid-a", "namespace": "team-a", "name": "claim-a"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": "us-east/rack-01",
                            "device": first,
                        },
                        {
                            "request": "gpu2",
                            "driver": DRIVER,
                            "pool": "us-east/rack-01",
                            "device": second,
                        },
                    ]
                }
            }
        },
    }
    states = {
        s.wanted.device: s for s in states_from_journal(claim, DRIVER, "node-1", body["devices"])
    }
    assert states[first].verdict is Verdict.READY
    identity = states[first].identity
    assert identity is not None and identity.serial == "SN-us-east-rack-01-0000"
    assert states[second].verdict is Verdict.WAITING
