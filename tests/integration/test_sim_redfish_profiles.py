"""The Redfish simulator's profiles of real third-party services, spoken to over real HTTP."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from builders import REDFISH_BASIC_AUTH, REDFISH_DATA, SMALL_REDFISH
from builders import redfish_call as call
from click.testing import CliRunner

from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator, cli
from fabric_dra_sim.redfish_profiles import (
    PROFILE_NAMES,
    PROFILES,
    ProfileSwitches,
    resolve_profiles,
)

COMPOSABILITY = REDFISH_DATA / "dmtf-public-composability"
ROOT = "/redfish/v1"
BLOCKS = f"{ROOT}/CompositionService/ResourceBlocks"
AUTH = REDFISH_BASIC_AUTH
SMALL = SMALL_REDFISH
ONE = "node-us-east-rack-01-1"
TWO = "node-us-east-rack-01-2"
GPU = f"{BLOCKS}/us-east-rack-01-gpu-00"
NVME = f"{BLOCKS}/us-east-rack-01-nvme-01"

# ``serve`` (simulators started on demand, profiles first) and ``http`` are in
# tests/integration/conftest.py.
Serve = Callable[..., Awaitable[tuple[RedfishSimulator, str]]]


def refs(*uris: str) -> dict[str, Any]:
    return {"Links": {"ResourceBlocks": [{"@odata.id": u} for u in uris]}}


def system_url(url: str, system_id: str) -> str:
    return f"{url}{ROOT}/Systems/{system_id}"


def action_url(url: str, system_id: str, verb: str) -> str:
    return f"{system_url(url, system_id)}/Actions/ComputerSystem.{verb}ResourceBlock"


def block_links(body: Any) -> list[str]:
    return [r["@odata.id"] for r in body["Links"]["ResourceBlocks"]]


# ----- the profile table -------------------------------------------------------------------


def test_every_profile_is_named_described_and_the_composite_merges_its_parts() -> None:
    assert PROFILE_NAMES == (
        "server-owned-compute",
        "message-errors",
        "text-errors",
        "no-etags",
        "unknown-500",
        "placeholder-identity",
        "attach-noop",
        "double-quoted-etag",
        "task-200-body",
        "task-killed",
        "task-purged",
        "volatile-state",
        "null-health",
        "real-service",
    )
    for profile in PROFILES.values():
        assert len(profile.description) > 60, profile.name
        assert (profile.switches != ProfileSwitches()) != bool(profile.includes), profile.name
    assert resolve_profiles([]) == ProfileSwitches()
    assert resolve_profiles(["real-service"]) == ProfileSwitches(
        server_owned_compute=True,
        error_format="message",
        etag_style="none",
        block_actions=False,
        unknown_status=500,
        dangling_drives=True,
        placeholder_identity=True,
        volatile_state=True,
    )
    assert resolve_profiles(["real-service", "null-health", "no-etags"]).null_health


def test_unknown_and_contradicting_profiles_are_refused() -> None:
    with pytest.raises(ValueError, match=r"valid profiles: server-owned-compute, .*real-service"):
        RedfishSimulator(spec=SMALL, profiles=("nope",))
    with pytest.raises(ValueError, match="cannot be combined"):
        resolve_profiles(["message-errors", "text-errors"])
    with pytest.raises(ValueError, match="cannot be combined"):
        resolve_profiles(["real-service", "double-quoted-etag"])


# ----- one test per profile ----------------------------------------------------------------


async def test_server_owned_compute_refuses_a_patch_that_leaves_the_compute_block_out(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve("server-owned-compute")
    compute = sim.compute_block(ONE)
    assert compute == f"{BLOCKS}/{ONE}-compute"
    _, collection, _ = await call(http, "GET", url + BLOCKS)
    members = [m["@odata.id"] for m in collection["Members"]]
    assert members[:6] == sim.block_uris()[:6] and members[0] == GPU
    assert members[6:] == [f"{BLOCKS}/{s}-compute" for s in sim.system_ids()]
    for member in members:
        assert (await call(http, "GET", url + member))[1]["ResourceBlockType"] == []
    _, block, _ = await call(http, "GET", url + compute)
    assert block["Links"]["ComputerSystems"] == [{"@odata.id": f"{ROOT}/Systems/{ONE}"}]
    assert block["Links"]["Chassis"] == [{"@odata.id": f"{ROOT}/Chassis/us-east-rack-01"}]
    assert block["CompositionStatus"]["CompositionState"] == "Composed"
    cpu = (await call(http, "GET", url + block["Processors"][0]["@odata.id"]))[1]
    assert cpu["ProcessorType"] == "CPU"
    dimm = (await call(http, "GET", url + block["Memory"][0]["@odata.id"]))[1]
    assert dimm["MemoryDeviceType"] == "DDR5" and "CXL" not in dimm
    status, _, _ = await call(http, "GET", url + block["NetworkInterfaces"][0]["@odata.id"])
    assert status == 200
    _, system, _ = await call(http, "GET", system_url(url, ONE))
    assert block_links(system) == [compute]
    assert sim.attachments()[compute] == ONE and sim.holders(compute) == [ONE]

    status, body, _ = await call(http, "PATCH", system_url(url, ONE), json=refs(GPU))
    assert status == 406
    assert body["error"]["message"].endswith("cannot be removed from it.")
    status, _, _ = await call(
        http, "POST", action_url(url, ONE, "Remove"), json={"ResourceBlock": {"@odata.id": compute}}
    )
    assert status == 406
    assert sim.history == []
    assert block_links((await call(http, "GET", system_url(url, ONE)))[1]) == [compute]

    # Keeping it (by reference or by "{}" at its index) works; another System cannot take it.
    status, body, _ = await call(http, "PATCH", system_url(url, ONE), json=refs(compute, GPU))
    assert status == 200 and block_links(body) == [compute, GPU]
    status, body, _ = await call(
        http, "PATCH", system_url(url, ONE), json={"Links": {"ResourceBlocks": [{}]}}
    )
    assert status == 200 and block_links(body) == [compute]
    assert sim.history == [("attach", GPU, ONE), ("detach", GPU, ONE)]
    status, _, _ = await call(
        http, "PATCH", system_url(url, TWO), json=refs(f"{BLOCKS}/{TWO}-compute", compute)
    )
    assert status == 409


async def test_message_errors_answer_a_body_with_only_a_message(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve("message-errors", task_mode=True, task_polls=0)
    for method, target, kwargs, expected in (
        ("GET", f"{url}{ROOT}/NoSuchThing", {}, 404),
        ("GET", url + BLOCKS, {"auth": None}, 401),
        ("PATCH", system_url(url, ONE), {"data": "{not json"}, 400),
    ):
        status, body, headers = await call(http, method, target, **kwargs)
        assert status == expected
        assert headers["Content-Type"].startswith("application/json")
        assert set(body) == {"message"} and isinstance(body["message"], str)
    sim.attach_out_of_band(GPU, TWO)
    _, _, headers = await call(http, "PATCH", system_url(url, ONE), json=refs(GPU))
    status, body, _ = await call(http, "GET", url + headers["Location"])
    assert status == 409
    assert body == {
        "message": f"The change to the requested resource failed because the "
        f"resource {GPU} is in use by {TWO}."
    }


async def test_text_errors_answer_plain_text(serve: Serve, http: aiohttp.ClientSession) -> None:
    _, url = await serve("text-errors")
    status, body, headers = await call(http, "GET", f"{url}{ROOT}/NoSuchThing")
    assert status == 404
    assert headers["Content-Type"].startswith("text/plain")
    assert body == f"The requested resource {ROOT}/NoSuchThing was not found."
    status, body, _ = await call(http, "PATCH", system_url(url, ONE), json=refs(f"{BLOCKS}/x"))
    assert status == 404 and isinstance(body, str)


async def test_no_etags_sends_no_tags_ignores_if_match_and_offers_only_patch(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve("no-etags", require_if_match=True)
    for target in (url + ROOT, url + BLOCKS, url + GPU, system_url(url, ONE)):
        status, body, headers = await call(http, "GET", target)
        assert status == 200 and "ETag" not in headers and "@odata.etag" not in body
        status, _, _ = await call(http, "GET", target, headers={"If-None-Match": "*"})
        assert status == 200
    _, system, _ = await call(http, "GET", system_url(url, ONE))
    assert "Actions" not in system
    status, body, headers = await call(
        http, "PATCH", system_url(url, ONE), json=refs(GPU), headers={"If-Match": '"stale"'}
    )
    assert status == 200 and "ETag" not in headers and "@odata.etag" not in body
    status, _, _ = await call(http, "PATCH", system_url(url, ONE), json=refs())
    assert status == 200  # require_if_match has no effect
    for verb in ("Add", "Remove"):
        status, _, _ = await call(
            http, "POST", action_url(url, ONE, verb), json={"ResourceBlock": {"@odata.id": GPU}}
        )
        assert status == 404
    assert sim.history == [("attach", GPU, ONE), ("detach", GPU, ONE)]


async def test_unknown_500_answers_unknown_resources_and_dangling_drives_with_500(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    spec = InventorySpec(regions=1, racks_per_region=1, devices_per_rack=12, hosts_per_rack=1)
    sim, url = await serve("unknown-500", spec=spec)
    blocks = sim.block_uris()
    assert sim.dangling_uris == [f"{blocks[0]}/Drives/Dangling0", f"{blocks[10]}/Drives/Dangling0"]
    for index, block in enumerate(blocks):
        _, body, _ = await call(http, "GET", url + block)
        drives = [d["@odata.id"] for d in body.get("Drives", [])]
        assert drives == ([f"{block}/Drives/Dangling0"] if index in (0, 10) else [])
    for target in (
        *sim.dangling_uris,
        f"{ROOT}/NoSuchThing",
        f"{ROOT}/Systems/nope",
        f"{ROOT}/TaskService/TaskMonitors/9",
    ):
        status, body, _ = await call(http, "GET", url + target)
        assert status == 500, target
        assert body["error"]["code"].endswith("InternalError")
    # A reference to an unknown block inside a body is still 404.
    status, _, _ = await call(
        http, "PATCH", system_url(url, sim.system_ids()[0]), json=refs(f"{BLOCKS}/nope")
    )
    assert status == 404


async def test_placeholder_identity_gives_every_system_the_same_identity(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve("placeholder-identity")
    identities = set()
    for system_id in sim.system_ids():
        _, body, _ = await call(http, "GET", system_url(url, system_id))
        assert body["Id"] == system_id
        identities.add((body["HostName"], body["UUID"], body["SerialNumber"]))
    assert identities == {("localhost", "00000000-0000-0000-0000-000000000000", "0123456789")}


async def test_attach_noop_swallows_the_first_attach_and_makes_the_next(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve("attach-noop")
    assert sim.noop_attaches is None
    # By default every attach is swallowed, by PATCH and by action alike.
    status, body, _ = await call(http, "PATCH", system_url(url, ONE), json=refs(GPU))
    assert status == 200 and block_links(body) == [GPU]
    status, body, _ = await call(
        http, "POST", action_url(url, ONE, "Add"), json={"ResourceBlock": {"@odata.id": GPU}}
    )
    assert status == 200
    assert body["@Message.ExtendedInfo"][0]["MessageId"].endswith(".Success")
    assert sim.attachments()[GPU] is None and sim.history == []
    assert block_links((await call(http, "GET", system_url(url, ONE)))[1]) == []

    sim.noop_attaches = 1
    status, _, _ = await call(http, "PATCH", system_url(url, ONE), json=refs(GPU))
    assert status == 200 and sim.attachments()[GPU] is None
    status, body, _ = await call(http, "PATCH", system_url(url, ONE), json=refs(GPU))
    assert status == 200 and sim.attachments()[GPU] == ONE
    assert sim.noop_attaches == 0 and sim.history == [("attach", GPU, ONE)]
    # Checks still come first: a conflict is not swallowed.
    sim.noop_attaches = None
    status, _, _ = await call(http, "PATCH", system_url(url, TWO), json=refs(GPU))
    assert status == 409


async def test_double_quoted_etag_is_accepted_with_either_quoting(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    _, url = await serve("double-quoted-etag")
    target = system_url(url, ONE)
    _, body, headers = await call(http, "GET", target)
    tag = body["@odata.etag"]
    assert tag.startswith('"') and not tag.startswith('""')
    assert headers["ETag"] == f'"{tag}"'
    for wrong in (f"W/{tag}", tag.strip('"'), '"0123"'):
        status, _, _ = await call(
            http, "PATCH", target, json=refs(GPU), headers={"If-Match": wrong}
        )
        assert status == 412, wrong
    status, body, headers = await call(
        http, "PATCH", target, json=refs(GPU), headers={"If-Match": tag}
    )
    assert status == 200 and headers["ETag"] == f'"{body["@odata.etag"]}"'
    status, _, _ = await call(
        http, "PATCH", target, json=refs(GPU, NVME), headers={"If-Match": headers["ETag"]}
    )
    assert status == 200
    _, _, headers = await call(http, "GET", target)
    status, _, _ = await call(http, "GET", target, headers={"If-None-Match": headers["ETag"]})
    assert status == 304


async def test_task_200_body_answers_the_task_with_200_while_running_and_when_done(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve("task-200-body", task_mode=True, task_polls=2)
    status, _, headers = await call(http, "PATCH", system_url(url, ONE), json=refs(GPU))
    assert status == 202
    monitor = url + headers["Location"]
    answers = [await call(http, "GET", monitor) for _ in range(3)]
    assert [a[0] for a in answers] == [200, 200, 200]
    assert [(a[1]["TaskState"], a[1]["PercentComplete"]) for a in answers] == [
        ("Running", 33),
        ("Running", 66),
        ("Completed", 100),
    ]
    assert answers[2][1]["@odata.type"].startswith("#Task.")
    assert sim.attachments()[GPU] == ONE


async def test_task_killed_ends_every_task_killed_without_the_change(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve("task-killed", task_mode=True, task_polls=1)
    _, task, headers = await call(
        http, "POST", action_url(url, ONE, "Add"), json={"ResourceBlock": {"@odata.id": GPU}}
    )
    monitor = url + headers["Location"]
    assert (await call(http, "GET", monitor))[0] == 202
    status, body, _ = await call(http, "GET", monitor)
    assert status == 200
    assert (body["TaskState"], body["TaskStatus"]) == ("Killed", "Critical")
    assert body["Messages"][0]["MessageId"] == "TaskEvent.1.0.TaskAborted"
    _, again, _ = await call(http, "GET", url + task["@odata.id"])
    assert again["TaskState"] == "Killed"
    assert sim.attachments()[GPU] is None and sim.history == []


async def test_task_purged_makes_the_change_and_forgets_the_task_at_once(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve("task-purged", task_mode=True, task_polls=1)
    _, task, headers = await call(http, "PATCH", system_url(url, ONE), json=refs(GPU))
    monitor = url + headers["Location"]
    assert (await call(http, "GET", monitor))[0] == 202
    assert sim.attachments()[GPU] is None
    status, _, _ = await call(http, "GET", monitor)
    assert status == 404
    assert sim.attachments()[GPU] == ONE
    assert (await call(http, "GET", url + task["@odata.id"]))[0] == 404
    _, tasks, _ = await call(http, "GET", f"{url}{ROOT}/TaskService/Tasks")
    assert tasks["Members"] == []
    # Polling the Task resource instead: the read that runs it already answers 404.
    _, task, _ = await call(http, "PATCH", system_url(url, TWO), json=refs(NVME))
    statuses = [(await call(http, "GET", url + task["@odata.id"]))[0] for _ in range(2)]
    assert statuses == [200, 404]
    assert sim.attachments()[NVME] == TWO


async def test_volatile_state_restart_forgets_every_attachment_since_start(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve("volatile-state", "server-owned-compute", task_mode=True, task_polls=5)
    initial = sim.attachments()
    status, _, headers = await call(
        http,
        "POST",
        f"{url}{ROOT}/SessionService/Sessions",
        json={"UserName": "admin", "Password": "password"},
        auth=None,
    )
    assert status == 201
    token = headers["X-Auth-Token"]
    _, _, task_headers = await call(http, "PATCH", system_url(url, TWO), json=refs())
    sim.task_mode = False
    status, _, _ = await call(
        http, "PATCH", system_url(url, ONE), json=refs(sim.compute_block(ONE), GPU)
    )
    assert status == 200
    sim.attach_out_of_band(NVME, TWO)
    sim.detach_out_of_band(sim.compute_block(ONE))
    sim.set_health(GPU, "Warning")
    history = list(sim.history)

    sim.restart()
    assert sim.attachments() == initial
    assert sim.history == history
    for system_id in (ONE, TWO):
        _, body, _ = await call(http, "GET", system_url(url, system_id))
        assert block_links(body) == [sim.compute_block(system_id)]
    _, block, _ = await call(http, "GET", url + GPU)
    assert block["Links"]["ComputerSystems"] == []
    assert block["CompositionStatus"]["CompositionState"] == "Unused"
    assert block["Status"]["Health"] == "Warning"
    status, _, _ = await call(http, "GET", url + BLOCKS, auth=None, headers={"X-Auth-Token": token})
    assert status == 401
    assert (await call(http, "GET", url + task_headers["Location"]))[0] == 404


async def test_restart_without_volatile_state_keeps_attachments(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve()
    status, _, _ = await call(http, "PATCH", system_url(url, ONE), json=refs(GPU))
    assert status == 200
    sim.restart()
    assert sim.attachments()[GPU] == ONE
    assert block_links((await call(http, "GET", system_url(url, ONE)))[1]) == [GPU]


async def test_null_health_gives_devices_and_their_blocks_unknown_health(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve("null-health")
    expected = [
        {"Health": None, "State": "Enabled"},
        {"Health": "", "State": ""},
        {"State": None},
        None,
        {"Health": "Degraded", "State": "Enabled"},
        {"Health": "OK", "State": "Enabled"},
    ]
    for index, block_uri in enumerate(sim.block_uris()):
        _, block, _ = await call(http, "GET", url + block_uri)
        (device_uri,) = [
            r["@odata.id"] for key in ("Processors", "Drives", "Memory") for r in block.get(key, [])
        ]
        _, device, _ = await call(http, "GET", url + device_uri)
        assert device.get("Status") == expected[index], device_uri
        block_status = expected[index] if index != 4 else {"Health": None, "State": "Enabled"}
        assert block.get("Status") == block_status, block_uri


async def test_real_service_combines_its_parts(serve: Serve, http: aiohttp.ClientSession) -> None:
    sim, url = await serve("real-service")
    _, system, headers = await call(http, "GET", system_url(url, ONE))
    assert "ETag" not in headers and "Actions" not in system
    assert system["HostName"] == "localhost"
    status, body, _ = await call(http, "PATCH", system_url(url, ONE), json=refs(GPU))
    assert status == 406 and set(body) == {"message"}
    status, body, _ = await call(http, "GET", f"{url}{ROOT}/NoSuchThing")
    assert status == 500 and set(body) == {"message"}
    status, _, _ = await call(
        http, "POST", action_url(url, ONE, "Add"), json={"ResourceBlock": {"@odata.id": GPU}}
    )
    assert status == 500
    status, _, _ = await call(
        http,
        "PATCH",
        system_url(url, ONE),
        json=refs(sim.compute_block(ONE), GPU),
        headers={"If-Match": '"whatever"'},
    )
    assert status == 200 and sim.attachments()[GPU] == ONE
    sim.restart()
    assert sim.attachments()[GPU] is None


async def test_profiles_apply_to_a_mockup(serve: Serve, http: aiohttp.ClientSession) -> None:
    sim, url = await serve(
        "server-owned-compute", "no-etags", "placeholder-identity", mockup_dir=COMPOSABILITY
    )
    for system_id in sim.system_ids():
        compute = sim.compute_block(system_id)
        _, body, headers = await call(http, "GET", system_url(url, system_id))
        assert "ETag" not in headers and body["UUID"].startswith("00000000")
        assert block_links(body)[0] == compute
        assert "#ComputerSystem.AddResourceBlock" not in body.get("Actions", {})
        assert sim.holders(compute) == [system_id]
    for block_uri in sim.block_uris():
        assert (await call(http, "GET", url + block_uri))[1]["ResourceBlockType"] == []


# ----- test controls -----------------------------------------------------------------------


async def test_out_of_band_changes_show_over_http_without_history(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    sim, url = await serve()
    sim.attach_out_of_band(GPU, ONE)
    sim.attach_out_of_band(GPU, ONE)  # already held: a no-op
    assert sim.holders(GPU) == [ONE] and sim.attachments()[GPU] == ONE
    assert block_links((await call(http, "GET", system_url(url, ONE)))[1]) == [GPU]
    with pytest.raises(ValueError, match="in use"):
        sim.attach_out_of_band(GPU, TWO)
    with pytest.raises(KeyError):
        sim.attach_out_of_band(GPU, "nope")
    with pytest.raises(KeyError):
        sim.detach_out_of_band(f"{BLOCKS}/nope")
    assert sim.detach_out_of_band(GPU) == [ONE]
    assert sim.detach_out_of_band(GPU) == []
    _, block, _ = await call(http, "GET", url + GPU)
    assert block["Links"]["ComputerSystems"] == []
    assert sim.history == []
    with pytest.raises(KeyError):
        sim.compute_block(ONE)


# ----- command line ------------------------------------------------------------------------


def test_cli_refuses_an_unknown_profile_in_one_line_naming_the_valid_ones() -> None:
    result = CliRunner().invoke(cli, ["--profile", "nope"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1
    assert "'nope'" in errors[0]
    assert all(name in errors[0] for name in PROFILE_NAMES)


async def test_cli_serves_with_profiles(http: aiohttp.ClientSession) -> None:
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
        "--profile",
        "real-service",
        "--profile",
        "null-health",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        base = line.split()[3].removesuffix("/redfish/v1")
        status, body, headers = await call(http, "GET", f"{base}{ROOT}/Systems")
        assert status == 200 and "ETag" not in headers
        status, body, _ = await call(http, "GET", f"{base}{ROOT}/NoSuchThing")
        assert status == 500 and set(body) == {"message"}
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0


def test_task_profiles_answer_writes_with_tasks_and_cannot_end_tasks_two_ways() -> None:
    for profile in ("task-200-body", "task-killed", "task-purged"):
        assert RedfishSimulator(profiles=(profile,)).task_mode, profile
    assert not RedfishSimulator(profiles=("message-errors",)).task_mode
    with pytest.raises(ValueError, match=r"task-killed.*task-purged"):
        RedfishSimulator(profiles=("task-killed", "task-purged"))
