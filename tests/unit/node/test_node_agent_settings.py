"""What `fabric-dra node` refuses before it connects anywhere: one line naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import ConfigError, Settings
from app.node.agent import check_node_settings, node_name


def settings(tmp_path: Path, **node: object) -> Settings:
    (tmp_path / "host" / "sys").mkdir(parents=True, exist_ok=True)
    base = {"host_root": str(tmp_path / "host"), "cdi_dir": str(tmp_path / "cdi")}
    return Settings.model_validate({"node": {**base, **node}})


def test_good_settings_pass(tmp_path: Path) -> None:
    check_node_settings(settings(tmp_path, hook="/bin/true --flag"))
    check_node_settings(settings(tmp_path, hook=["true"]))


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (
            {"host_root": "/nonexistent-host"},
            "setting node.host_root: '/nonexistent-host' has no sys",
        ),
        ({"cdi_dir": "cdi"}, "setting node.cdi_dir: 'cdi' is not an absolute path"),
        ({"hook": "/no/such/hook arg"}, "setting node.hook: '/no/such/hook' is not an executable"),
        ({"hook": "no-such-program-here"}, "setting node.hook: 'no-such-program-here' is not an"),
    ],
)
def test_bad_settings_are_one_line(tmp_path: Path, node: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_node_settings(settings(tmp_path, **node))
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_the_node_name_comes_from_the_setting_or_the_downward_api(tmp_path: Path) -> None:
    assert node_name(settings(tmp_path, node_name="n1"), {}) == "n1"
    assert node_name(settings(tmp_path), {"NODE_NAME": "n2"}) == "n2"
    with pytest.raises(ConfigError, match="NODE_NAME is not in the environment"):
        node_name(settings(tmp_path), {})
