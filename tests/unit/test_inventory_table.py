"""The ``fabric-dra inventory`` table: device memory sizes."""

from __future__ import annotations

import re

import pytest

from app.commands.inventory import render_table
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
