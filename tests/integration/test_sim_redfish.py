"""The Redfish fabric simulator, spoken to over real HTTP with aiohttp."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from builders import REDFISH_BASIC_AUTH, REDFISH_DATA, SMALL_REDFISH
from builders import redfish_call as call

from fabric_dra_sim.redfish import Faults, InventorySpec, RedfishSimulator

MOCKUPS = REDFISH_DATA
COMPOSABILITY = MOCKUPS / "dmtf-public-composability"
BLOCKS = "/redfish/v1/CompositionService/ResourceBlocks"
AUTH = REDFISH_BASIC_AUTH
SMALL = SMALL_REDFISH
DEEP = "[" * 30000 + "]" * 30000  # deeper than Python's JSON decoder goes: RecursionError

# ``serve`` (simulators started on demand) and ``http`` are in tests/integration/conftest.py.
Serve = Callable[..., Awaitable[tuple[RedfishSimulator, str]]]


def error_id(body: Any) -> str:
    """The MessageId of a Redfish error body, checking the body's shape on the way."""
    error = body["error"]
    assert isinstance(error["message"], str)
    info = error["@Message.ExtendedInfo"]
    assert info
    assert error["code"] == info[0]["MessageId"]
    return str(error["code"]).split(".")[-1]


async def walk(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """Every resource reachable from the service root by @odata.id links, by URI."""
    seen: dict[str, Any] = {}
    todo = ["/redfish/v1"]

    def links(value: Any) -> list[str]:
        if isinstance(value, dict):
            found = [value["@odata.id"]] if isinstance(value.get("@odata.id"), str) else []
            for key, item in value.items():
                if key != "@odata.id":
                    found += links(item)
            return found
        if isinstance(value, list):
            return [u for item in value for u in links(item)]
        return []

    while todo:
        uri = todo.pop()
        if uri in seen:
            continue
        status, body, headers = await call(http, "GET", url + uri)
        assert status == 200, uri
        assert headers["ETag"] == body["@odata.etag"]
        seen[uri] = body
        todo += [u.split("?")[0] for u in links(body) if u.split("?")[0] not in seen]
    return seen


# ----- generated tree --------------------------------------------------------------------


async def test_generated_tree_is_walkable_from_the_root(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve()
    tree = await walk(http, url)
    root = tree["/redfish/v1"]
    for name in ("CompositionService", "Systems", "Chassis", "SessionService", "Tasks"):
        assert root[name]["@odata.id"] in tree
    assert "ProtocolFeaturesSupported" in root
    blocks = tree[BLOCKS]["Members"]
    assert len(blocks) == tree[BLOCKS]["Members@odata.count"] == 2 * 3
    assert sorted(m["@odata.id"] for m in blocks) == sorted(sim.block_uris())
    assert sorted(sim.system_ids()) == [
        "node-us-east-rack-01-1",
        "node-us-east-rack-01-2",
        "node-us-east-rack-02-1",
        "node-us-east-rack-02-2",
    ]
    system = tree["/redfish/v1/Systems/node-us-east-rack-02-1"]
    assert system["HostName"] == "node-us-east-rack-02-1"
    assert system["SystemType"] == "Physical"
    assert system["Links"]["Chassis"] == [{"@odata.id": "/redfish/v1/Chassis/us-east-rack-02"}]
    assert "#ComputerSystem.AddResourceBlock" in system["Actions"]
    rack = tree["/redfish/v1/Chassis/us-east-rack-02"]
    assert rack["ChassisType"] == "Rack"
    assert rack["Location"]["PostalAddress"]["Territory"] == "us-east"
    assert rack["Location"]["PostalAddress"]["Building"] == "dc-us-east"
    assert rack["Location"]["Placement"] == {"Row": "row-1", "Rack": "rack-02"}
    kinds: dict[str, int] = {}
    for member in blocks:
        block = tree[member["@odata.id"]]
        assert block["CompositionStatus"]["CompositionState"] == "Unused"
        assert block["Links"]["ComputerSystems"] == []
        assert block["Links"]["Zones"] == [
            {"@odata.id": "/redfish/v1/CompositionService/ResourceZones/zone-us-east"}
        ]
        enclosure = tree[block["Links"]["Chassis"][0]["@odata.id"]]
        assert enclosure["ChassisType"] == "Enclosure"
        assert tree[enclosure["Links"]["ContainedBy"]["@odata.id"]]["ChassisType"] == "Rack"
        assert enclosure["Location"]["Placement"]["RackOffsetUnits"] == "EIA_310"
        for prop in ("Processors", "Drives", "Memory"):
            for ref in block.get(prop, []):
                device = tree[ref["@odata.id"]]
                kinds[prop] = kinds.get(prop, 0) + 1
                assert device["Status"] == {"State": "Enabled", "Health": "OK"}
                assert device["SerialNumber"]
                assert device["Manufacturer"]
                if prop == "Processors":
                    assert block["ResourceBlockType"] == ["Processor"]
                    assert device["ProcessorType"] in ("GPU", "FPGA")
                    assert device["ProcessorMemory"][0]["CapacityMiB"] > 0
                    assert device["FirmwareVersion"].count(".") == 2
                    assert device["Location"]["PartLocation"]["LocationType"] == "Slot"
                elif prop == "Drives":
                    assert block["ResourceBlockType"] == ["Storage"]
                    assert device["Protocol"] == "NVMe"
                    assert device["CapacityBytes"] > 0
                else:
                    assert block["ResourceBlockType"] == ["Memory"]
                    assert device["CapacityMiB"] > 0
    assert kinds == {"Processors": 2, "Drives": 2, "Memory": 2}


async def test_same_seed_gives_an_identical_tree_and_another_seed_does_not(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    _, first = await serve()
    _, second = await serve(spec=InventorySpec(**{**SMALL.__dict__}))
    _, other = await serve(spec=InventorySpec(**{**SMALL.__dict__, "seed": 8}))
    tree_a, tree_b, tree_c = (
        await walk(http, first),
        await walk(http, second),
        await walk(http, other),
    )
    assert tree_a == tree_b
    assert tree_a.keys() == tree_c.keys()
    assert tree_a != tree_c
    gpu = f"{BLOCKS}/us-east-rack-01-gpu-00/Processors/GPU0"
    assert tree_a[gpu]["UUID"] != tree_c[gpu]["UUID"]


def test_region_names_follow_the_list_then_number() -> None:
    sim = RedfishSimulator(
        spec=InventorySpec(regions=8, racks_per_region=1, devices_per_rack=1, hosts_per_rack=1)
    )
    regions = [uri.rsplit("/", 1)[1].split("-rack-")[0] for uri in sim.block_uris()]
    assert regions == [
        "us-east",
        "us-west",
        "eu-central",
        "eu-west",
        "ap-south",
        "ap-northeast",
        "region-7",
        "region-8",
    ]


def test_bad_specs_and_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="device_mix"):
        RedfishSimulator(spec=InventorySpec(device_mix="tpu"))
    with pytest.raises(ValueError, match="not both"):
        RedfishSimulator(spec=SMALL, mockup_dir=COMPOSABILITY)
    with pytest.raises(ValueError, match="mockup"):
        RedfishSimulator(mockup_dir=MOCKUPS / "csdl")


# ----- authentication --------------------------------------------------------------------


async def test_session_login_use_and_logout(serve: Serve, http: aiohttp.ClientSession) -> None:
    _, url = await serve()
    sessions = f"{url}/redfish/v1/SessionService/Sessions"
    status, body, headers = await call(
        http, "POST", sessions, auth=None, json={"UserName": "admin", "Password": "password"}
    )
    assert status == 201
    token, location = headers["X-Auth-Token"], headers["Location"]
    assert body["@odata.id"] == location
    assert body["UserName"] == "admin"
    token_header = {"X-Auth-Token": token}
    status, body, _ = await call(
        http, "GET", f"{url}/redfish/v1/Systems", auth=None, headers=token_header
    )
    assert status == 200
    assert body["Members"]
    status, body, _ = await call(http, "GET", sessions, auth=None, headers=token_header)
    assert [m["@odata.id"] for m in body["Members"]] == [location]
    status, _, _ = await call(http, "DELETE", url + location, auth=None, headers=token_header)
    assert status == 204
    status, body, _ = await call(
        http, "GET", f"{url}/redfish/v1/Systems", auth=None, headers=token_header
    )
    assert status == 401
    assert error_id(body) == "NoValidSession"


async def test_expired_sessions_get_401(serve: Serve, http: aiohttp.ClientSession) -> None:
    sim, url = await serve(auth="session")
    _, _, headers = await call(
        http,
        "POST",
        f"{url}/redfish/v1/SessionService/Sessions",
        auth=None,
        json={"UserName": "admin", "Password": "password"},
    )
    token_header = {"X-Auth-Token": headers["X-Auth-Token"]}
    status, _, _ = await call(
        http, "GET", f"{url}/redfish/v1/Systems", auth=None, headers=token_header
    )
    assert status == 200
    sim.expire_sessions()
    status, body, _ = await call(
        http, "GET", f"{url}/redfish/v1/Systems", auth=None, headers=token_header
    )
    assert status == 401
    assert error_id(body) == "NoValidSession"


async def test_oversized_bodies_get_a_redfish_error(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve()
    status, body, _ = await call(
        http,
        "PATCH",
        f"{url}/redfish/v1/Systems/{sim.system_ids()[0]}",
        data=io.BytesIO(b"{" + b" " * (2 * 1024 * 1024) + b"}"),
        headers={"Content-Type": "application/json"},
    )
    assert status == 413
    assert error_id(body) == "GeneralError"


async def test_refused_credentials_get_401_with_a_redfish_error(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    _, url = await serve()
    sessions = f"{url}/redfish/v1/SessionService/Sessions"
    status, body, _ = await call(
        http, "POST", sessions, auth=None, json={"UserName": "admin", "Password": "wrong"}
    )
    assert status == 401
    assert error_id(body) == "ResourceAtUriUnauthorized"
    status, body, headers = await call(http, "GET", f"{url}/redfish/v1/Systems", auth=None)
    assert status == 401
    assert error_id(body) == "NoValidSession"
    assert headers["WWW-Authenticate"].startswith("Basic")
    status, _, _ = await call(
        http, "GET", f"{url}/redfish/v1/Systems", auth=aiohttp.encode_basic_auth("admin", "nope")
    )
    assert status == 401
    status, body, _ = await call(
        http, "POST", sessions, auth=None, json={"UserName": "admin", "Password": "pässwörd"}
    )
    assert status == 401
    status, _, _ = await call(
        http,
        "GET",
        f"{url}/redfish/v1/Systems",
        auth=aiohttp.encode_basic_auth("ädmin", "pässwörd"),
    )
    assert status == 401
    status, _, _ = await call(
        http,
        "GET",
        f"{url}/redfish/v1/Systems",
        auth=None,
        headers={"Authorization": "Basic !!notbase64!!"},
    )
    assert status == 401
    status, _, _ = await call(
        http, "GET", f"{url}/redfish/v1/Systems", auth=None, headers={"X-Auth-Token": "made-up"}
    )
    assert status == 401
    # The service root and /redfish are open (DSP0266 lets clients discover without logging in).
    for open_path in ("/redfish", "/redfish/v1", "/redfish/v1/", "/redfish/v1/odata"):
        status, _, _ = await call(http, "GET", url + open_path, auth=None)
        assert status == 200, open_path


@pytest.mark.parametrize(
    ("auth", "basic_ok", "login_status"),
    [("any", True, 201), ("session", False, 201), ("basic", True, 405), ("none", True, 201)],
)
async def test_auth_modes_decide_which_credentials_count(
    serve: Serve, http: aiohttp.ClientSession, auth: str, basic_ok: bool, login_status: int
) -> None:
    _, url = await serve(auth=auth)
    status, _, _ = await call(http, "GET", f"{url}/redfish/v1/Systems")
    assert (status == 200) is basic_ok
    status, body, headers = await call(
        http,
        "POST",
        f"{url}/redfish/v1/SessionService/Sessions",
        auth=None,
        json={"UserName": "admin", "Password": "password"},
    )
    assert status == login_status
    if status == 201:
        status, _, _ = await call(
            http,
            "GET",
            f"{url}/redfish/v1/Systems",
            auth=None,
            headers={"X-Auth-Token": headers["X-Auth-Token"]},
        )
        assert status == 200
    else:
        assert error_id(body) == "OperationNotAllowed"
    status, _, _ = await call(http, "GET", f"{url}/redfish/v1/Systems", auth=None)
    assert (status == 200) is (auth == "none")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ('{"UserName": "admin", "Password": ', "MalformedJSON"),
        ("[1, 2]", "MalformedJSON"),
        (DEEP, "MalformedJSON"),
        ('{"UserName": "admin"}', "PropertyMissing"),
        ('{"UserName": "admin", "Password": 5}', "PropertyValueTypeError"),
        ('{"UserName": "admin", "Password": "password", "Role": "x"}', "PropertyUnknown"),
    ],
)
async def test_malformed_login_bodies_get_400(
    serve: Serve, http: aiohttp.ClientSession, data: str, expected: str
) -> None:
    _, url = await serve()
    status, body, _ = await call(
        http,
        "POST",
        f"{url}/redfish/v1/SessionService/Sessions",
        auth=None,
        data=data,
        headers={"Content-Type": "application/json"},
    )
    assert status == 400
    assert error_id(body) == expected


# ----- protocol details --------------------------------------------------------------------


async def test_collections_are_paged_with_next_links(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve(
        spec=InventorySpec(regions=1, racks_per_region=1, devices_per_rack=12, hosts_per_rack=1),
        page_size=5,
    )
    members: list[str] = []
    next_uri: str | None = BLOCKS
    pages = 0
    while next_uri:
        status, body, _ = await call(http, "GET", url + next_uri)
        assert status == 200
        assert body["Members@odata.count"] == 12
        assert len(body["Members"]) <= 5
        members += [m["@odata.id"] for m in body["Members"]]
        next_uri = body.get("Members@odata.nextLink")
        pages += 1
    assert pages == 3
    assert members == sim.block_uris()
    # $top beyond a page: the next link carries what is left of it.
    status, body, _ = await call(http, "GET", f"{url}{BLOCKS}?$skip=1&$top=7")
    assert body["Members@odata.nextLink"] == f"{BLOCKS}?$skip=6&$top=2"
    status, body, _ = await call(http, "GET", url + body["Members@odata.nextLink"])
    assert [m["@odata.id"] for m in body["Members"]] == sim.block_uris()[6:8]
    assert "Members@odata.nextLink" not in body
    status, body, _ = await call(http, "GET", f"{url}{BLOCKS}?$skip=10&$top=1")
    assert [m["@odata.id"] for m in body["Members"]] == sim.block_uris()[10:11]
    assert "Members@odata.nextLink" not in body
    for query, expected_status, expected in (
        ("$skip=x", 400, "QueryParameterValueTypeError"),
        ("$skip=-1", 400, "QueryParameterOutOfRange"),
        ("$expand=*", 501, "QueryNotSupported"),
    ):
        status, body, _ = await call(http, "GET", f"{url}{BLOCKS}?{query}")
        assert status == expected_status and error_id(body) == expected, query


async def test_unpaged_collections_list_every_member(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve()
    _, body, _ = await call(http, "GET", url + BLOCKS)
    assert [m["@odata.id"] for m in body["Members"]] == sim.block_uris()
    assert "Members@odata.nextLink" not in body


async def test_wrong_methods_unknown_paths_and_headers(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve()
    system = f"{url}/redfish/v1/Systems/{sim.system_ids()[0]}"
    for method, target in (
        ("PUT", system),
        ("DELETE", system),
        ("POST", f"{url}{BLOCKS}"),
        ("PATCH", f"{url}{BLOCKS}"),
        ("POST", f"{url}/redfish/v1"),
        ("GET", f"{system}/Actions/ComputerSystem.AddResourceBlock"),
    ):
        status, body, headers = await call(http, method, target, json={})
        assert status == 405, (method, target)
        assert error_id(body) == "OperationNotAllowed"
        assert "GET" in headers["Allow"] or "POST" in headers["Allow"]
    status, body, _ = await call(http, "GET", f"{url}/redfish/v1/NoSuchThing")
    assert status == 404
    assert error_id(body) == "ResourceNotFound"
    status, body, _ = await call(
        http, "PATCH", f"{url}/redfish/v1/Systems/nope", json={"Links": {"ResourceBlocks": []}}
    )
    assert status == 404
    assert error_id(body) == "ResourceNotFound"
    status, body, _ = await call(
        http, "POST", f"{system}/Actions/ComputerSystem.Reset", json={"ResetType": "On"}
    )
    assert status == 400
    assert error_id(body) == "ActionNotSupported"
    status, body, _ = await call(http, "GET", f"{url}/redfish/v1", headers={"OData-Version": "4.1"})
    assert status == 412
    assert error_id(body) == "PreconditionFailed"


async def test_etags_head_and_if_none_match(serve: Serve, http: aiohttp.ClientSession) -> None:
    sim, url = await serve()
    block = url + sim.block_uris()[0]
    status, body, headers = await call(http, "GET", block)
    assert headers["ETag"] == body["@odata.etag"]
    assert headers["OData-Version"] == "4.0"
    status, body, head_headers = await call(http, "HEAD", block)
    assert status == 200
    assert body is None
    assert head_headers["ETag"] == headers["ETag"]
    status, _, _ = await call(http, "GET", block, headers={"If-None-Match": headers["ETag"]})
    assert status == 304
    sim.set_health(sim.block_uris()[0], "Warning")
    status, body, new_headers = await call(
        http, "GET", block, headers={"If-None-Match": headers["ETag"]}
    )
    assert status == 200
    assert body["Status"]["Health"] == "Warning"
    assert new_headers["ETag"] != headers["ETag"]
    async with http.get(f"{url}/redfish/v1/$metadata") as resp:
        text = await resp.text()
    assert resp.status == 200
    assert 'Namespace="ResourceBlock.v1_4_3"' in text


# ----- attach and detach -------------------------------------------------------------------


async def get_etag(http: aiohttp.ClientSession, url: str) -> str:
    status, _, headers = await call(http, "GET", url)
    assert status == 200
    return str(headers["ETag"])


def refs(*uris: str) -> dict[str, Any]:
    return {"Links": {"ResourceBlocks": [{"@odata.id": u} for u in uris]}}


async def test_attach_and_detach_by_patch(serve: Serve, http: aiohttp.ClientSession) -> None:
    sim, url = await serve()
    one, two = sim.system_ids()[:2]
    block, other_block = sim.block_uris()[:2]
    system_url = f"{url}/redfish/v1/Systems/{one}"
    etag = await get_etag(http, system_url)
    status, body, headers = await call(
        http, "PATCH", system_url, json=refs(block), headers={"If-Match": etag}
    )
    assert status == 200
    assert body["Links"]["ResourceBlocks"] == [{"@odata.id": block}]
    assert headers["ETag"] != etag
    assert sim.attachments()[block] == one
    assert sim.history == [("attach", block, one)]
    _, body, _ = await call(http, "GET", url + block)
    assert body["Links"]["ComputerSystems"] == [{"@odata.id": f"/redfish/v1/Systems/{one}"}]
    assert body["CompositionStatus"]["CompositionState"] == "Composed"
    assert body["CompositionStatus"]["NumberOfCompositions"] == 1

    # The same list again is a no-op 200; "{}" keeps the element at its index.
    status, _, _ = await call(http, "PATCH", system_url, json={"Links": {"ResourceBlocks": [{}]}})
    assert status == 200
    assert len(sim.history) == 1
    # A stale ETag is refused.
    status, body, _ = await call(
        http, "PATCH", system_url, json=refs(block, other_block), headers={"If-Match": etag}
    )
    assert status == 412
    assert error_id(body) == "PreconditionFailed"
    # A block held by another system is in use.
    status, body, _ = await call(http, "PATCH", f"{url}/redfish/v1/Systems/{two}", json=refs(block))
    assert status == 409
    assert error_id(body) == "ResourceInUse"
    status, body, _ = await call(http, "PATCH", system_url, json=refs(block, f"{BLOCKS}/nope"))
    assert status == 404
    assert error_id(body) == "ResourceNotFound"
    assert sim.attachments()[block] == one
    assert len(sim.history) == 1

    status, body, _ = await call(
        http,
        "PATCH",
        system_url,
        json=refs(other_block),
        headers={"If-Match": await get_etag(http, system_url)},
    )
    assert status == 200
    assert sim.history[1:] == [("detach", block, one), ("attach", other_block, one)]
    assert sim.attachments() == {b: (one if b == other_block else None) for b in sim.block_uris()}
    _, body, _ = await call(http, "GET", url + block)
    assert body["Links"]["ComputerSystems"] == []
    assert body["CompositionStatus"]["CompositionState"] == "Unused"


async def test_if_match_can_be_required(serve: Serve, http: aiohttp.ClientSession) -> None:
    sim, url = await serve(require_if_match=True)
    system_url = f"{url}/redfish/v1/Systems/{sim.system_ids()[0]}"
    status, body, _ = await call(http, "PATCH", system_url, json=refs(sim.block_uris()[0]))
    assert status == 428
    assert error_id(body) == "PreconditionRequired"
    status, _, _ = await call(
        http, "PATCH", system_url, json=refs(sim.block_uris()[0]), headers={"If-Match": "*"}
    )
    assert status == 200


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ("{not json", "MalformedJSON"),
        ('"a string"', "MalformedJSON"),
        (DEEP, "MalformedJSON"),
        ('{"Links": ' + "[" * 500 + "]" * 500 + "}", "PropertyValueTypeError"),
        ("{}", "PropertyMissing"),
        ('{"Links": []}', "PropertyValueTypeError"),
        ('{"Links": {}}', "PropertyMissing"),
        ('{"Links": {"ResourceBlocks": {"@odata.id": "x"}}}', "PropertyValueTypeError"),
        ('{"Links": {"ResourceBlocks": ["x"]}}', "PropertyValueTypeError"),
        ('{"Links": {"ResourceBlocks": [{"@odata.id": 5}]}}', "PropertyValueTypeError"),
        ('{"Links": {"ResourceBlocks": [{}]}}', "PropertyValueError"),
        ('{"Links": {"Chassis": []}}', "PropertyNotWritable"),
        ('{"HostName": "x"}', "PropertyNotWritable"),
        ('{"Colour": "blue"}', "PropertyUnknown"),
    ],
)
async def test_malformed_patch_bodies_get_400(
    serve: Serve, http: aiohttp.ClientSession, payload: str, expected: str
) -> None:
    sim, url = await serve()
    status, body, _ = await call(
        http,
        "PATCH",
        f"{url}/redfish/v1/Systems/{sim.system_ids()[0]}",
        data=payload,
        headers={"Content-Type": "application/json"},
    )
    assert status == 400
    assert error_id(body) == expected
    assert sim.history == []


async def test_attach_and_detach_by_action(serve: Serve, http: aiohttp.ClientSession) -> None:
    sim, url = await serve()
    one, two = sim.system_ids()[:2]
    block = sim.block_uris()[0]
    actions = f"{url}/redfish/v1/Systems/{one}/Actions/ComputerSystem"
    add, remove = f"{actions}.AddResourceBlock", f"{actions}.RemoveResourceBlock"
    ref = {"ResourceBlock": {"@odata.id": block}}

    status, body, _ = await call(http, "POST", add, json=ref)
    assert status == 200
    assert body["@Message.ExtendedInfo"][0]["MessageId"].endswith(".Success")
    status, body, _ = await call(http, "POST", add, json=ref)
    assert status == 200
    assert body["@Message.ExtendedInfo"][0]["MessageId"].endswith(".NoOperation")
    status, body, _ = await call(
        http,
        "POST",
        f"{url}/redfish/v1/Systems/{two}/Actions/ComputerSystem.AddResourceBlock",
        json=ref,
    )
    assert status == 409
    assert error_id(body) == "ResourceInUse"
    status, body, _ = await call(
        http, "POST", add, json={"ResourceBlock": {"@odata.id": f"{BLOCKS}/nope"}}
    )
    assert status == 404
    assert error_id(body) == "ResourceNotFound"
    assert sim.history == [("attach", block, one)]

    stale = {**ref, "ResourceBlockETag": '"stale"'}
    status, body, _ = await call(http, "POST", remove, json=stale)
    assert status == 412
    assert error_id(body) == "PreconditionFailed"
    status, body, _ = await call(
        http, "POST", remove, json={**ref, "ComputerSystemETag": '"stale"'}
    )
    assert status == 412
    good = {
        **ref,
        "ResourceBlockETag": await get_etag(http, url + block),
        "ComputerSystemETag": await get_etag(http, f"{url}/redfish/v1/Systems/{one}"),
    }
    status, body, _ = await call(http, "POST", remove, json=good)
    assert status == 200
    status, body, _ = await call(http, "POST", remove, json=ref)
    assert status == 200
    assert body["@Message.ExtendedInfo"][0]["MessageId"].endswith(".NoOperation")
    assert sim.history == [("attach", block, one), ("detach", block, one)]
    assert sim.attachments()[block] is None


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ("[", "MalformedJSON"),
        (DEEP, "MalformedJSON"),
        ("{}", "ActionParameterMissing"),
        ('{"ResourceBlock": "x"}', "ActionParameterValueTypeError"),
        ('{"ResourceBlock": {"@odata.id": 1}}', "ActionParameterValueTypeError"),
        (
            '{"ResourceBlock": {"@odata.id": "x"}, "ResourceBlockETag": 3}',
            "ActionParameterValueTypeError",
        ),
        ('{"ResourceBlock": {"@odata.id": "x"}, "Force": true}', "ActionParameterUnknown"),
    ],
)
async def test_malformed_action_bodies_get_400(
    serve: Serve, http: aiohttp.ClientSession, payload: str, expected: str
) -> None:
    sim, url = await serve()
    status, body, _ = await call(
        http,
        "POST",
        f"{url}/redfish/v1/Systems/{sim.system_ids()[0]}/Actions/ComputerSystem.AddResourceBlock",
        data=payload,
        headers={"Content-Type": "application/json"},
    )
    assert status == 400
    assert error_id(body) == expected


async def test_actions_are_absent_when_not_offered(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve(offer_actions=False)
    system_url = f"{url}/redfish/v1/Systems/{sim.system_ids()[0]}"
    _, body, _ = await call(http, "GET", system_url)
    assert "Actions" not in body
    status, body, _ = await call(
        http,
        "POST",
        f"{system_url}/Actions/ComputerSystem.AddResourceBlock",
        json={"ResourceBlock": {"@odata.id": sim.block_uris()[0]}},
    )
    assert status == 400
    assert error_id(body) == "ActionNotSupported"
    status, _, _ = await call(http, "PATCH", system_url, json=refs(sim.block_uris()[0]))
    assert status == 200


async def test_task_mode_answers_202_until_the_task_completes(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve(task_mode=True, task_polls=2)
    one, two = sim.system_ids()[:2]
    block = sim.block_uris()[0]
    status, body, headers = await call(
        http, "PATCH", f"{url}/redfish/v1/Systems/{one}", json=refs(block)
    )
    assert status == 202
    assert "Retry-After" in headers
    monitor = headers["Location"]
    assert monitor.startswith("/redfish/v1/TaskService/TaskMonitors/")
    task_uri = body["@odata.id"]
    assert body["TaskState"] == "Running"
    for _ in range(2):
        status, body, _ = await call(http, "GET", url + monitor)
        assert status == 202
        assert body["TaskState"] == "Running"
        assert sim.attachments()[block] is None
    status, body, _ = await call(http, "GET", url + monitor)
    assert status == 200
    assert body["Links"]["ResourceBlocks"] == [{"@odata.id": block}]
    assert sim.history == [("attach", block, one)]
    _, task, _ = await call(http, "GET", url + task_uri)
    assert json.loads(task["Payload"]["JsonBody"]) == refs(block)
    assert task["TaskState"] == "Completed"
    assert task["PercentComplete"] == 100
    _, tasks, _ = await call(http, "GET", f"{url}/redfish/v1/TaskService/Tasks")
    assert {"@odata.id": task_uri} in tasks["Members"]

    # The conflict is found when the task runs, and reported by the monitor.
    status, _, headers = await call(
        http,
        "POST",
        f"{url}/redfish/v1/Systems/{two}/Actions/ComputerSystem.AddResourceBlock",
        json={"ResourceBlock": {"@odata.id": block}},
    )
    assert status == 202
    monitor = headers["Location"]
    statuses = [(await call(http, "GET", url + monitor))[0] for _ in range(3)]
    assert statuses == [202, 202, 409]
    status, body, _ = await call(http, "GET", url + monitor)
    assert status == 409
    assert error_id(body) == "ResourceInUse"
    task_uri = monitor.replace("TaskMonitors", "Tasks")
    _, task, _ = await call(http, "GET", url + task_uri)
    assert task["TaskState"] == "Exception"
    assert task["Messages"][0]["MessageId"].endswith("ResourceInUse")
    status, body, _ = await call(http, "GET", f"{url}/redfish/v1/TaskService/TaskMonitors/99")
    assert status == 404
    assert error_id(body) == "ResourceNotFound"


async def test_task_progresses_when_the_task_resource_is_polled(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve(task_mode=True, task_polls=1)
    one = sim.system_ids()[0]
    block = sim.block_uris()[0]
    _, body, _ = await call(
        http,
        "POST",
        f"{url}/redfish/v1/Systems/{one}/Actions/ComputerSystem.AddResourceBlock",
        json={"ResourceBlock": {"@odata.id": block}},
    )
    task_url = url + body["@odata.id"]
    states = [(await call(http, "GET", task_url))[1]["TaskState"] for _ in range(2)]
    assert states == ["Running", "Completed"]
    assert sim.attachments()[block] == one


# ----- faults --------------------------------------------------------------------------------


async def test_latency_delays_answers(serve: Serve, http: aiohttp.ClientSession) -> None:
    sim, url = await serve(faults=Faults(latency_s=0.2))
    started = time.monotonic()
    status, _, _ = await call(http, "GET", f"{url}/redfish/v1")
    assert status == 200
    assert time.monotonic() - started >= 0.2
    sim.faults.latency_s = 0.0
    started = time.monotonic()
    await call(http, "GET", f"{url}/redfish/v1")
    assert time.monotonic() - started < 0.2


async def test_error_rate_answers_with_the_configured_status(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve()
    sim.faults.error_rate = 1.0
    status, body, _ = await call(http, "GET", f"{url}/redfish/v1/Systems")
    assert status == 503
    assert error_id(body) == "ServiceTemporarilyUnavailable"
    sim.faults.error_status = 500
    status, body, _ = await call(http, "GET", f"{url}/redfish/v1/Systems")
    assert status == 500
    assert error_id(body) == "InternalError"
    sim.faults.error_rate = 0.5
    statuses = [(await call(http, "GET", f"{url}/redfish/v1"))[0] for _ in range(40)]
    assert {200, 500} == set(statuses)
    sim.faults.error_rate = 0.0
    status, _, _ = await call(http, "GET", f"{url}/redfish/v1/Systems")
    assert status == 200


async def test_dropped_connections_close_without_an_answer(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve(faults=Faults(drop_rate=1.0))
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await call(http, "GET", f"{url}/redfish/v1")
    sim.faults.drop_rate = 0.0
    status, _, _ = await call(http, "GET", f"{url}/redfish/v1")
    assert status == 200


async def test_flapping_health_changes_between_reads(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve(faults=Faults(flap_health_rate=1.0))
    block = url + sim.block_uris()[0]
    healths = [(await call(http, "GET", block))[1]["Status"]["Health"] for _ in range(4)]
    assert healths == ["Critical", "OK", "Critical", "OK"]
    sim.faults.flap_health_rate = 0.0
    healths = [(await call(http, "GET", block))[1]["Status"]["Health"] for _ in range(2)]
    assert healths == ["OK", "OK"]


async def test_fail_next_matches_method_and_path_then_stops(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve()
    sim.fail_next(2, method="GET", path_prefix="/redfish/v1/Systems", status=502)
    status, _, _ = await call(http, "GET", f"{url}/redfish/v1/Chassis")
    assert status == 200
    status, _, _ = await call(
        http, "PATCH", f"{url}/redfish/v1/Systems/{sim.system_ids()[0]}", json=refs()
    )
    assert status == 200
    for _ in range(2):
        status, body, _ = await call(http, "GET", f"{url}/redfish/v1/Systems")
        assert status == 502
        assert error_id(body) == "GeneralError"
    status, _, _ = await call(http, "GET", f"{url}/redfish/v1/Systems")
    assert status == 200


async def test_fail_next_can_send_a_truncated_answer(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve()
    sim.fail_next(1, status=200, body='{"Members": [{"@odata.id": "/redfish/v1/Sys')
    async with http.get(f"{url}/redfish/v1/Systems", headers={"Authorization": AUTH}) as resp:
        assert resp.status == 200
        with pytest.raises(json.JSONDecodeError):
            await resp.json()
    status, body, _ = await call(http, "GET", f"{url}/redfish/v1/Systems")
    assert status == 200
    assert body["Members"]


# ----- run-time changes ------------------------------------------------------------------------


async def test_health_removal_and_addition_show_over_http(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve()
    first = sim.block_uris()[0]
    device = (await call(http, "GET", url + first))[1]["Processors"][0]["@odata.id"]
    sim.set_health(device, "Critical")
    assert (await call(http, "GET", url + device))[1]["Status"]["Health"] == "Critical"
    with pytest.raises(ValueError, match="health"):
        sim.set_health(device, "Broken")
    with pytest.raises(KeyError):
        sim.set_health("/redfish/v1/nope", "OK")

    await call(http, "PATCH", f"{url}/redfish/v1/Systems/{sim.system_ids()[0]}", json=refs(first))
    sim.remove_block(first)
    assert first not in sim.block_uris()
    assert first not in sim.attachments()
    status, _, _ = await call(http, "GET", url + first)
    assert status == 404
    status, _, _ = await call(http, "GET", url + device)
    assert status == 404
    _, system, _ = await call(http, "GET", f"{url}/redfish/v1/Systems/{sim.system_ids()[0]}")
    assert system["Links"]["ResourceBlocks"] == []
    _, blocks, _ = await call(http, "GET", url + BLOCKS)
    assert blocks["Members@odata.count"] == len(sim.block_uris()) == 5

    new = sim.add_block("us-east", "rack-02", "nvme")
    status, body, _ = await call(http, "GET", url + new)
    assert status == 200
    assert body["ResourceBlockType"] == ["Storage"]
    assert sim.attachments()[new] is None
    _, zone, _ = await call(
        http, "GET", f"{url}/redfish/v1/CompositionService/ResourceZones/zone-us-east"
    )
    assert {"@odata.id": new} in zone["Links"]["ResourceBlocks"]
    with pytest.raises(KeyError):
        sim.add_block("us-east", "rack-09")
    with pytest.raises(ValueError, match="device type"):
        sim.add_block("us-east", "rack-01", "tpu")


# ----- DMTF mockups ---------------------------------------------------------------------------


async def test_composability_mockup_is_served_as_it_is(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve(mockup_dir=COMPOSABILITY)
    _, systems, _ = await call(http, "GET", f"{url}/redfish/v1/Systems")
    # The original says 2 members and lists 5: served unchanged.
    assert systems["Members@odata.count"] == 2
    assert len(systems["Members"]) == 5
    original = json.loads(
        (
            COMPOSABILITY / "redfish/v1/CompositionService/ResourceBlocks/OffloadBlock9/index.json"
        ).read_text()
    )
    _, block, _ = await call(http, "GET", f"{url}{BLOCKS}/OffloadBlock9")
    assert {k: v for k, v in block.items() if k != "@odata.etag"} == original
    assert len(sim.block_uris()) == 12
    attachments = sim.attachments()
    assert attachments[f"{BLOCKS}/ComputeBlock1"] == "ComposedSystem"
    assert attachments[f"{BLOCKS}/OffloadBlock9"] is None
    # SystemBlock12 is named only from the System's side.
    assert attachments[f"{BLOCKS}/SystemBlock12"] == "SystemAfterAddResourceAction"
    assert sim.holders(f"{BLOCKS}/DriveBlock3") == ["ComposedSystem", "ComposedSystem2"]
    tree = await walk(http, url)
    assert f"{BLOCKS}/OffloadBlock9/Processors/Block9GPU" in tree


async def test_mockup_attach_and_detach_update_the_block(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve(mockup_dir=COMPOSABILITY)
    gpu = f"{BLOCKS}/OffloadBlock9"
    system = "/redfish/v1/Systems/SystemAfterAddResourceAction"
    status, _, _ = await call(
        http,
        "POST",
        f"{url}{system}/Actions/ComputerSystem.AddResourceBlock",
        json={"ResourceBlock": {"@odata.id": gpu}},
    )
    assert status == 200
    _, block, _ = await call(http, "GET", url + gpu)
    assert block["Links"]["ComputerSystems"] == [{"@odata.id": system}]
    assert block["CompositionStatus"]["CompositionState"] == "Composed"
    _, body, _ = await call(http, "GET", url + system)
    assert {"@odata.id": gpu} in body["Links"]["ResourceBlocks"]
    status, body, _ = await call(
        http,
        "POST",
        f"{url}/redfish/v1/Systems/ComposedSystem/Actions/ComputerSystem.AddResourceBlock",
        json={"ResourceBlock": {"@odata.id": gpu}},
    )
    assert status == 409
    assert error_id(body) == "ResourceInUse"
    # A PATCH that drops the GPU detaches it.
    kept = [r for r in body_links(await call(http, "GET", url + system)) if r != gpu]
    status, _, _ = await call(http, "PATCH", url + system, json=refs(*kept))
    assert status == 200
    _, block, _ = await call(http, "GET", url + gpu)
    assert block["Links"]["ComputerSystems"] == []
    assert block["CompositionStatus"]["CompositionState"] == "Unused"
    assert sim.history == [
        ("attach", gpu, "SystemAfterAddResourceAction"),
        ("detach", gpu, "SystemAfterAddResourceAction"),
    ]
    # A shareable drive block takes a second holder; the System without the action refuses it.
    shared = f"{BLOCKS}/DriveBlock5"
    for holder in ("ComposedSystem", "ComposedSystem2"):
        status, _, _ = await call(
            http,
            "POST",
            f"{url}/redfish/v1/Systems/{holder}/Actions/ComputerSystem.AddResourceBlock",
            json={"ResourceBlock": {"@odata.id": shared}},
        )
        assert status == 200
    assert sim.holders(shared) == ["ComposedSystem", "ComposedSystem2"]
    _, block, _ = await call(http, "GET", url + shared)
    assert block["CompositionStatus"]["CompositionState"] == "ComposedAndAvailable"
    status, body, _ = await call(
        http,
        "POST",
        f"{url}/redfish/v1/Systems/SystemPreResourceBlock/Actions/ComputerSystem.AddResourceBlock",
        json={"ResourceBlock": {"@odata.id": shared}},
    )
    assert status == 400
    assert error_id(body) == "ActionNotSupported"
    with pytest.raises(ValueError, match="mockup"):
        sim.add_block("us-east", "rack-01")


def body_links(answer: tuple[int, Any, Any]) -> list[str]:
    return [r["@odata.id"] for r in answer[1]["Links"]["ResourceBlocks"]]


@pytest.mark.parametrize(
    "folder", ["dmtf-public-constrained-composition", "dmtf-public-bladed-partitions"]
)
async def test_other_mockups_are_walkable(
    serve: Serve, http: aiohttp.ClientSession, folder: str
) -> None:
    sim, url = await serve(mockup_dir=MOCKUPS / folder)
    tree = await walk(http, url)
    assert all(uri in tree for uri in sim.block_uris())


# ----- command line ----------------------------------------------------------------------------


async def test_cli_serves_until_sigterm(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from fabric_dra_sim.redfish import cli; cli()",
        "--port",
        "0",
        "--regions",
        "1",
        "--racks-per-region",
        "1",
        "--devices-per-rack",
        "2",
        "--hosts-per-rack",
        "1",
        "--username",
        "root",
        "--password-file",
        str(secret),
        "--auth",
        "basic",
        "--page-size",
        "1",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        base = line.split()[3].removesuffix("/redfish/v1")
        assert base.startswith("http://127.0.0.1:")
        status, body, _ = await call(
            http, "GET", f"{base}{BLOCKS}", auth=aiohttp.encode_basic_auth("root", "s3cret")
        )
        assert status == 200
        assert body["Members@odata.count"] == 2
        assert len(body["Members"]) == 1
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
