"""The documentation's copy-paste recipes and tables stay true to the code they describe."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from fabric_dra_sim.redfish_profiles import PROFILE_NAMES
from fabric_dra_sim.redfish_tree import InventorySpec, TreeBuilder

ROOT = Path(__file__).resolve().parents[2]


def test_the_redfish_page_has_a_row_for_every_simulator_profile() -> None:
    page = (ROOT / "docs" / "fabric-redfish.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    named = {name for row in rows for name in re.findall(r"`([a-z0-9-]+)`", row.split("|")[2])}
    assert named == set(PROFILE_NAMES)


def test_run_without_a_cluster_declares_the_simulated_fabrics_servers_as_nodes() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Run without a cluster", 1)[1].split("\n## ", 1)[0]
    redfish = next(line for line in section.splitlines() if "fabric-dra sim redfish" in line)
    numbers = dict(re.findall(r"--(racks-per-region|hosts-per-rack) (\d+)", redfish))
    spec = InventorySpec(
        racks_per_region=int(numbers["racks-per-region"]),
        hosts_per_rack=int(numbers["hosts-per-rack"]),
        device_mix="mixed",
    )
    tree = TreeBuilder(spec).build()
    hosts = {
        body["HostName"]
        for uri, body in tree.items()
        if uri.startswith("/redfish/v1/Systems/") and "HostName" in body
    }
    assert "--nodes-file deploy/compose/nodes.yaml" in section
    nodes = yaml.safe_load((ROOT / "deploy" / "compose" / "nodes.yaml").read_text())
    assert {n["metadata"]["labels"]["kubernetes.io/hostname"] for n in nodes} == hosts
    devices = spec.regions * spec.racks_per_region * spec.devices_per_rack
    assert f"# {devices} devices in {spec.regions * spec.racks_per_region} racks" in section
