"""The ``fabric-dra inventory`` table: device memory sizes."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from app.commands.inventory import never_synced, render_table, unconfigured
from app.inventory.queries import DeviceView


def device(name: str, memory_mib: int | None) -> DeviceView:
    return DeviceView(
        name=name,
        vendor_id=f"/redfish/v1/{name}",
        device_type="gpu",
        vendor="Example",
        model="X100",
        memory_mib=memory_mib,
        region="us-east",
        zone=None,
        row=None,
        rack="rack-01",
        chassis=None,
        slot=None,
        fabric=None,
        health="OK",
        state=None,
        host_id=None,
        removed_at=None,
    )


@pytest.mark.parametrize(
    ("memory_mib", "shown"),
    [
        (512, "512 MiB"),
        (81920, "80 GiB"),
        (1536, "1.5 GiB"),
        (1300, "1300 MiB"),
        (0, "0 MiB"),
        (None, "-"),
    ],
)
def test_the_memory_column_never_shows_a_rounded_size(memory_mib: int | None, shown: str) -> None:
    lines = render_table([device("gpu-1", memory_mib)], []).splitlines()
    header = next(re.split(r"\s{2,}", line.strip()) for line in lines if "MEMORY" in line)
    row = next(re.split(r"\s{2,}", line.strip()) for line in lines if "gpu-1" in line)
    assert row[header.index("MEMORY")] == shown


def test_the_devices_of_a_manager_no_longer_configured_are_marked_as_not_published() -> None:
    devices = [
        replace(device("gpu-1", None), backend="redfish"),
        replace(device("gpu-2", None), backend="hall-a"),
        replace(device("gpu-3", None), backend="hall-a"),
    ]
    assert unconfigured(devices, ["redfish"]) == {"hall-a": 2}
    table = render_table(devices, [], configured=["redfish"])
    assert "hall-a: us-east / rack-01: 2 devices (fabric manager not configured" in table
    assert "redfish: us-east / rack-01: 1 devices\n" in table + "\n"
    assert table.endswith(
        "fabric manager hall-a is not configured: its 2 devices are not published (was it renamed?)"
    )
    # One manager, renamed in the settings: its devices are named and marked too.
    alone = render_table(devices[1:], [], configured=["redfish"])
    assert "hall-a: us-east / rack-01: 2 devices (fabric manager not configured" in alone
    # Without the settings (or every manager configured), nothing is marked.
    assert "not configured" not in render_table(devices, [])
    assert "not configured" not in render_table(devices, [], configured=["redfish", "hall-a"])


def test_a_configured_manager_never_synced_into_the_database_is_named() -> None:
    devices = [replace(device("gpu-1", None), backend="redfish")]
    assert never_synced(devices, [], ["redfish", "hall-b"]) == ["hall-b"]
    table = render_table(devices, [], configured=["redfish", "hall-b"])
    assert table.endswith(
        "fabric manager hall-b: never synced into this database (start the controller on it, "
        "or run fabric-dra inventory --sync)"
    )
    assert "redfish: never synced" not in table
    empty = render_table([], [], configured=["redfish"])
    assert empty.startswith("0 devices in 0 racks")
    assert "fabric manager redfish: never synced" in empty
    # Without the settings, nothing is said.
    assert "never synced" not in render_table([], [])
