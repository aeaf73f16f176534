"""DMTF's Redfish Service Validator walks a generated simulator tree and finds no failure.

The validator runs offline against the DMTF schema files in the shared data folder (see
``../shared/data/redfish/README.md``) as a subprocess, while the simulator serves from this
test's event loop.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
from pathlib import Path

import aiohttp
import pytest
from builders import REDFISH_DATA

from fabric_dra_sim.redfish import InventorySpec, RedfishSimulator

CSDL = REDFISH_DATA / "csdl"
SUMMARY = re.compile(
    r"\|\s*PASS\s*\|\s*WARN\s*\|\s*FAIL\s*\|\s*NOT TESTED\s*\|\s*\n"
    r"\+[-+]+\+\s*\n\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|"
)


def validator_command() -> str:
    """The validator's console script, next to this interpreter or on PATH."""
    beside = Path(sys.executable).parent / "rf_service_validator"
    found = str(beside) if beside.exists() else shutil.which("rf_service_validator")
    if found is None:
        pytest.fail("rf_service_validator is not installed (pip: redfish-service-validator)")
    return found


def parse_summary(output: str) -> tuple[int, int, int, int]:
    """(pass, warn, fail, not tested) from the validator's closing table.

    Raises:
        AssertionError: the table is missing (the validator did not finish).
    """
    match = SUMMARY.search(output)
    assert match is not None, f"no summary table in the validator output:\n{output[-3000:]}"
    passed, warned, failed, untested = (int(g) for g in match.groups())
    return passed, warned, failed, untested


def test_summary_parser_reads_the_closing_table() -> None:
    output = (
        "+------+\n|     PASS     |     WARN     |     FAIL     |  NOT TESTED  |\n"
        "+--------------+--------------+--------------+--------------+\n"
        "|     426      |      0       |      2       |     804      |\n"
    )
    assert parse_summary(output) == (426, 0, 2, 804)
    with pytest.raises(AssertionError):
        parse_summary("Traceback (most recent call last): ...")


@pytest.mark.slow
async def test_service_validator_finds_no_failure(tmp_path: Path) -> None:
    sim = RedfishSimulator(
        spec=InventorySpec(
            regions=1,
            racks_per_region=1,
            devices_per_rack=4,
            hosts_per_rack=2,
            device_mix="mixed",
            seed=3,
        ),
        username="validator",
        password="validator-pw",
        task_mode=True,
        task_polls=0,
    )
    url = await sim.start()
    try:
        # Attach one block through a task first, so that a held block, a System with blocks
        # and a completed Task are part of the walk.
        system, block = sim.system_ids()[0], sim.block_uris()[0]
        headers = {"Authorization": aiohttp.encode_basic_auth("validator", "validator-pw")}
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.patch(
                f"{url}/redfish/v1/Systems/{system}",
                json={"Links": {"ResourceBlocks": [{"@odata.id": block}]}},
            ) as resp:
                assert resp.status == 202
                monitor = resp.headers["Location"]
            async with http.get(url + monitor) as resp:
                assert resp.status == 200
        assert sim.attachments()[block] == system

        proc = await asyncio.create_subprocess_exec(
            validator_command(),
            "--rhost",
            url,
            "--user",
            "validator",
            "--password",
            "validator-pw",
            "--authtype",
            "Session",
            "--schema_directory",
            str(CSDL),
            "--skipschema",
            "--nooemcheck",
            "--logdir",
            str(tmp_path / "logs"),
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 100)
    finally:
        await sim.stop()
    output = out.decode(errors="replace")
    passed, _, failed, _ = parse_summary(output)
    failures = [line for line in output.splitlines() if "FAIL -" in line or "ERROR" in line]
    assert failed == 0, "\n".join(failures) or output[-3000:]
    assert proc.returncode == 0
    # Every kind of resource was reached: blocks, the three device schemas, tasks, sessions.
    for fragment in (
        "/Processors/GPU0",
        "/Drives/NVMe0",
        "/Memory/CXL0",
        "/TaskService/Tasks/1",
        "/SessionService/Sessions/1",
        "/ResourceZones/",
    ):
        assert f"{fragment}" in output, fragment
    assert passed > 400
