"""Several fabric managers: the settings (a list, with the single form still valid), the
fleet's routing, pools keyed by manager, names and host mapping across managers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from builders import MemoryBackend, gpu, host
from hypothesis import given
from hypothesis import strategies as st

from app.config import ConfigError
from app.configload import load_settings
from app.fabric.errors import FabricError, FabricNotFound, FabricUnavailable
from app.fabric.fleet import FabricFleet, UnknownManager, member, with_manager
from app.fabric.types import Location
from app.hostmap import HostIndex, HostRef, host_for_node, host_ref_for_node
from app.naming import device_name, is_dns_label
from app.pools import PoolConfig, PoolDevice, desired_pools, node_selector, pool_name

# -- settings --------------------------------------------------------------------------------


def _config(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_single_form_stays_valid_and_names_its_manager_by_kind() -> None:
    settings = load_settings(environ={"FABRIC_DRA_FABRIC__URL": "https://fm.example:443"})
    assert [m.manager for m in settings.managers] == ["redfish"]
    assert settings.managers[0].url == "https://fm.example:443"
    assert settings.setting_of(settings.managers[0]) == "fabric"
    assert settings.grouping_keys() == ("region", "rack")


def test_a_list_of_managers_from_the_file(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        {
            "fabrics": [
                {"name": "hall-a", "url": "https://a.example"},
                {"name": "hall-b", "url": "https://b.example", "tls_verify": False},
            ]
        },
    )
    settings = load_settings(config_file=config, environ={})
    assert [(m.manager, m.url, m.tls_verify) for m in settings.managers] == [
        ("hall-a", "https://a.example", True),
        ("hall-b", "https://b.example", False),
    ]
    assert settings.setting_of(settings.managers[1]) == "fabrics[hall-b]"
    # The manager is the first grouping key: pools never mix managers by default.
    assert settings.grouping_keys() == ("manager", "region", "rack")


def test_a_list_of_managers_from_the_environment_as_json() -> None:
    settings = load_settings(
        environ={
            "FABRIC_DRA_FABRICS": '[{"name": "a", "url": "https://a.example"}, '
            '{"name": "b", "url": "https://b.example"}]'
        }
    )
    assert [m.manager for m in settings.managers] == ["a", "b"]


def test_pools_may_mix_managers_when_asked(tmp_path: Path) -> None:
    two = [{"name": "a", "url": "https://a.example"}, {"name": "b", "url": "https://b.example"}]
    mixed = load_settings(
        config_file=_config(tmp_path, {"fabrics": two, "pools": {"mix_managers": True}}),
        environ={},
    )
    assert mixed.grouping_keys() == ("region", "rack")
    explicit = load_settings(
        config_file=_config(
            tmp_path, {"fabrics": two, "pools": {"grouping_keys": ["region", "manager"]}}
        ),
        environ={},
    )
    assert explicit.grouping_keys() == ("region", "manager")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"fabrics": [{"url": "https://a.example"}, {"url": "https://b.example"}]},
            "fabrics[0] has no name; give each fabric manager in fabrics its own name",
        ),
        (
            {
                "fabrics": [
                    {"name": "a", "url": "https://a.example"},
                    {"name": "a", "url": "https://b.example"},
                ]
            },
            "several entries of fabrics are named 'a'",
        ),
        (
            {"fabric": {"url": "https://a.example"}, "fabrics": [{"name": "b"}]},
            "both fabric and fabrics are set",
        ),
        ({"fabrics": [{"name": "Hall A"}]}, "setting fabrics[0].name (from"),
        ({"fabrics": [{"name": "x" * 33}]}, "at most 32 characters"),
        ({"fabrics": [{"name": "a", "url": "ftp://x"}]}, "setting fabrics[0].url"),
        ({"fabrics": [{"name": "a", "colour": "red"}]}, "unknown setting fabrics[0].colour"),
        (
            {"fabrics": [{"name": "a", "password_file": "/p"}]},
            "fabrics[a].password_file is set but fabrics[a].username_file is not",
        ),
        ({"fabrics": {"name": "a"}}, "setting fabrics"),
        ({"fabrics": []}, "setting fabrics (from"),
        ({"fabrics": []}, "fabrics is an empty list; give at least one fabric manager"),
    ],
)
def test_bad_manager_lists_get_one_line_naming_the_setting(
    tmp_path: Path, data: object, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(config_file=_config(tmp_path, data), environ={})
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message


def test_a_manager_without_url_is_named_in_the_error(tmp_path: Path) -> None:
    from app.fabric.factory import fleet_from_settings

    settings = load_settings(
        config_file=_config(
            tmp_path,
            {"fabrics": [{"name": "a", "url": "https://a.example", "auth": "none"}, {"name": "b"}]},
        ),
        environ={},
    )
    with pytest.raises(ConfigError, match=r"setting fabrics\[b\]\.url is not set"):
        fleet_from_settings(settings)


# -- the fleet ---------------------------------------------------------------------------------


def _fleet() -> tuple[FabricFleet, MemoryBackend, MemoryBackend]:
    a = MemoryBackend([gpu(1), gpu(2)], [host(1)], name="a")
    b = MemoryBackend([gpu(1)], [host(1)], name="b")
    return FabricFleet({"a": a, "b": b}), a, b


async def test_the_fleet_sends_each_change_to_the_devices_manager() -> None:
    fleet, a, b = _fleet()
    device = with_manager(gpu(1), "b")
    await fleet.attach(device, "us-east-rack-01-1")
    assert b.devices[0].host_id == "us-east-rack-01-1"
    assert all(d.host_id is None for d in a.devices)
    await fleet.resume("op", device, "us-east-rack-01-1", attach=False)
    assert b.devices[0].host_id is None
    await fleet.attach(with_manager(gpu(2), "a"), "h")
    await fleet.detach(with_manager(gpu(2), "a"), "h")
    assert a.devices[1].host_id is None


async def test_the_fleet_refuses_to_guess_a_manager() -> None:
    fleet, a, b = _fleet()
    with pytest.raises(UnknownManager, match="names no fabric manager"):
        await fleet.attach(gpu(1), "h")
    with pytest.raises(UnknownManager, match="'c' is not configured"):
        await fleet.detach(with_manager(gpu(1), "c"), "h")
    assert isinstance(UnknownManager("x"), FabricNotFound)
    assert all(d.host_id is None for d in a.devices + b.devices)
    # One manager: a device without one goes there.
    single = FabricFleet({"a": a})
    await single.attach(gpu(1), "h")
    assert a.devices[0].host_id == "h"
    assert member(single, None) is a and member(a, "anything") is a
    with pytest.raises(UnknownManager):
        member(fleet, None)


async def test_the_fleet_lists_every_manager_or_raises() -> None:
    fleet, a, b = _fleet()
    listing = await fleet.list_devices()
    assert sorted((d.location.manager, d.vendor_id) for d in listing.items) == sorted(
        [("a", gpu(1).vendor_id), ("a", gpu(2).vendor_id), ("b", gpu(1).vendor_id)]
    )
    assert len((await fleet.list_hosts()).items) == 2
    b.fail_with = FabricUnavailable("down")
    with pytest.raises(FabricError, match="down"):
        await fleet.list_devices()
    with pytest.raises(FabricNotFound):
        await fleet.operation_status("nope")
    assert fleet.names == ("a", "b")
    await fleet.close()
    assert a.closed and b.closed
    with pytest.raises(ValueError, match="at least one"):
        FabricFleet({})


# -- pools, names, hosts -----------------------------------------------------------------------


def _pool_device(name: str, manager: str) -> PoolDevice:
    return PoolDevice(
        name=name,
        device_type="gpu",
        location=Location(region="us-east", rack="rack-01", manager=manager),
        health="OK",
    )


def test_pools_are_keyed_by_manager_first_with_a_node_selector_on_its_label() -> None:
    config = PoolConfig(
        driver_name="fabric.example.com",
        grouping_keys=("manager", "region", "rack"),
        node_labels={
            "manager": "fabric-dra.io/fabric-manager",
            "region": "topology.kubernetes.io/region",
            "rack": "fabric-dra.io/rack",
        },
    )
    pools = desired_pools([_pool_device("d1", "hall-a"), _pool_device("d2", "hall-b")], config)
    assert sorted(pools) == ["hall-a/us-east/rack-01", "hall-b/us-east/rack-01"]
    selector = node_selector(Location(region="us-east", rack="rack-01", manager="hall-b"), config)
    assert selector["nodeSelectorTerms"][0]["matchExpressions"][0] == {
        "key": "fabric-dra.io/fabric-manager",
        "operator": "In",
        "values": ["hall-b"],
    }
    mixed = PoolConfig(driver_name="fabric.example.com", grouping_keys=("region", "rack"))
    assert sorted(
        desired_pools([_pool_device("d1", "hall-a"), _pool_device("d2", "hall-b")], mixed)
    ) == ["us-east/rack-01"]
    assert pool_name(Location(), ("manager",)) == "unknown"


@given(
    vendor_id=st.text(min_size=1, max_size=80),
    scopes=st.lists(
        st.from_regex(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?", fullmatch=True),
        min_size=2,
        max_size=4,
        unique=True,
    ),
)
def test_one_vendor_id_on_several_managers_gets_one_name_each(
    vendor_id: str, scopes: list[str]
) -> None:
    names = {device_name(vendor_id, scope=scope) for scope in scopes}
    assert len(names) == len(scopes)
    assert all(is_dns_label(n) for n in names)
    # Deterministic, and unscoped names are unchanged (a single manager keeps its names).
    assert device_name(vendor_id, scope=scopes[0]) in names
    assert device_name(vendor_id) == device_name(vendor_id, scope=None)


def test_a_host_found_by_hostname_keeps_its_manager_though_its_id_is_shared() -> None:
    index = HostIndex.build(
        [
            HostRef("Systems/1", "hall-a-node-1", "hall-a"),
            HostRef("Systems/1", "hall-b-node-1", "hall-b"),
        ],
        report=None,
    )
    node = {"metadata": {"name": "hall-b-node-1"}}
    assert host_ref_for_node(node, index, "hostname", "") == HostRef(
        "Systems/1", "hall-b-node-1", "hall-b"
    )
    assert host_for_node(node, index, "hostname", "") == "Systems/1"
    # By id alone the two cannot be told apart.
    labelled = {"metadata": {"name": "n", "labels": {"fabric-dra.io/host-id": "Systems/1"}}}
    assert host_ref_for_node(labelled, index, "label", "fabric-dra.io/host-id") is None
    # Hosts of unknown manager keep the old rule: a shared id maps no node at all.
    unknown = HostIndex.build([HostRef("Systems/1", "n1"), HostRef("Systems/1", "n2")], report=None)
    assert host_ref_for_node({"metadata": {"name": "n1"}}, unknown, "hostname", "") is None


def test_errors_of_the_whole_list_name_the_setting_and_where_it_came_from(
    tmp_path: Path,
) -> None:
    two = [{"name": "a", "url": "https://a.example"}, {"name": "a", "url": "https://b.example"}]
    with pytest.raises(ConfigError) as caught:
        load_settings(config_file=_config(tmp_path, {"fabrics": two}), environ={})
    assert str(caught.value) == (
        f"setting fabrics (from {tmp_path / 'config.yaml'}): several entries of fabrics are "
        f"named 'a'; give each fabric manager its own name (unnamed ones are named after their "
        f"kind)"
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"FABRIC_DRA_FABRICS": '[{"name": "a"'})
    assert str(caught.value).startswith("environment variable FABRIC_DRA_FABRICS: not valid JSON")
    with pytest.raises(ConfigError) as caught:
        load_settings(
            environ={
                "FABRIC_DRA_FABRIC__URL": "https://a.example",
                "FABRIC_DRA_FABRIC__PASSWORD_FILE": "/p",
            }
        )
    assert str(caught.value) == (
        "setting fabric (from environment FABRIC_DRA_FABRIC__PASSWORD_FILE): "
        "fabric.password_file is set but "
        "fabric.username_file is not"
    )


def test_an_entry_of_fabrics_from_the_environment_names_the_variable_given() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"FABRIC_DRA_FABRICS": '[{"name": "A"}]'})
    assert str(caught.value).startswith(
        "setting fabrics[0].name (from environment FABRIC_DRA_FABRICS): value 'A' "
    )
    # An object where the list belongs: the one variable is named, and the type in words.
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"FABRIC_DRA_FABRICS": '{"name": "x"}'})
    assert str(caught.value).startswith(
        "setting fabrics (from environment FABRIC_DRA_FABRICS): input should be a list; "
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(
            environ={
                "FABRIC_DRA_FABRIC__URL": "https://a.example",
                "FABRIC_DRA_FABRICS": '[{"name": "b", "url": "https://b.example"}]',
            }
        )
    assert "(from environment FABRIC_DRA_FABRIC__URL): both fabric and fabrics" in str(caught.value)
    # An empty list on purpose is refused, not read as "use fabric".
    with pytest.raises(ConfigError) as caught:
        load_settings(
            environ={"FABRIC_DRA_FABRICS": "[]", "FABRIC_DRA_FABRIC__URL": "https://a.example"}
        )
    assert "(from environment FABRIC_DRA_FABRICS): fabrics is an empty list" in str(caught.value)
    assert load_settings(environ={}).managers == (load_settings(environ={}).fabric,)
