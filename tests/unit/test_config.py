"""Settings: layers, precedence, validation messages, secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import ConfigError, is_label_key, read_secret
from app.configload import load_settings


def test_defaults_need_nothing() -> None:
    settings = load_settings(environ={})
    assert settings.driver_name == "fabric.example.com"
    assert settings.database.url == "sqlite+aiosqlite:///fabric-dra.db"
    assert settings.fabric.tls_verify is True
    assert settings.pools.grouping_keys == ("region", "rack")
    assert settings.node_labels.region == "topology.kubernetes.io/region"


def test_flags_override_environment_which_overrides_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "driver_name: file.example.com\n"
        "fabric:\n  url: https://file:443\n  timeout_seconds: 5\n"
        "inventory:\n  poll_interval_seconds: 10\n"
    )
    environ = {
        "FABRIC_DRA_FABRIC__URL": "https://env:443",
        "FABRIC_DRA_INVENTORY__POLL_INTERVAL_SECONDS": "20",
    }
    settings = load_settings(
        config, flags={"inventory": {"poll_interval_seconds": 30}}, environ=environ
    )
    assert settings.driver_name == "file.example.com"
    assert settings.fabric.url == "https://env:443"
    assert settings.fabric.timeout_seconds == 5
    assert settings.inventory.poll_interval_seconds == 30


@pytest.mark.parametrize(
    ("text", "environ", "flags", "words"),
    [
        (
            "database: true\n",
            {"FABRIC_DRA_DATABASE__URL": "sqlite+aiosqlite:///x.db"},
            None,
            "setting database (from {file}): value True is not a section",
        ),
        (
            "kube: [1, 2]\n",
            {"FABRIC_DRA_KUBE__MODE": "url"},
            None,
            "setting kube (from {file}): value [1, 2] is not a section",
        ),
        (
            "inventory: poll\n",
            {},
            {"inventory": {"poll_interval_seconds": 3}},
            "setting inventory (from {file}): value 'poll' is not a section",
        ),
    ],
)
def test_a_scalar_in_the_file_where_a_section_goes_is_refused_even_when_others_set_it(
    tmp_path: Path, text: str, environ: dict[str, str], flags: dict | None, words: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(config, flags=flags, environ=environ)
    assert str(caught.value).startswith(words.format(file=config)), caught.value


def test_an_empty_section_in_the_file_is_filled_from_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("database:\n")
    settings = load_settings(
        config, environ={"FABRIC_DRA_DATABASE__URL": "sqlite+aiosqlite:///x.db"}
    )
    assert settings.database.url == "sqlite+aiosqlite:///x.db"


def test_the_publisher_resync_period_defaults_to_upstreams_ten_minutes() -> None:
    assert load_settings(environ={}).publisher.resync_period_seconds == 600.0
    settings = load_settings(environ={"FABRIC_DRA_PUBLISHER__RESYNC_PERIOD_SECONDS": "120"})
    assert settings.publisher.resync_period_seconds == 120.0


def test_config_file_named_by_environment(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("driver_name: env-file.example.com\n")
    settings = load_settings(environ={"FABRIC_DRA_CONFIG": str(config)})
    assert settings.driver_name == "env-file.example.com"


def test_unset_flags_do_not_override(tmp_path: Path) -> None:
    settings = load_settings(
        flags={"fabric": {"url": None}, "driver_name": None},
        environ={"FABRIC_DRA_FABRIC__URL": "http://fm:8000"},
    )
    assert settings.fabric.url == "http://fm:8000"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"FABRIC_DRA_FABRIC__URL": "ftp://x"},
            "setting fabric.url (from environment FABRIC_DRA_FABRIC__URL): value 'ftp://x' is not "
            "an http:// or https:// origin; expected the fabric manager's origin, without a path",
        ),
        ({"FABRIC_DRA_FABRIC__URL": "https://fm:443/redfish/v1"}, "is not an http:// or https://"),
        ({"FABRIC_DRA_FABRIC__URL": "https://user:pw@fm:443"}, "is not an http:// or https://"),
        (
            {"FABRIC_DRA_DRIVER_NAME": "Bad_Name"},
            "setting driver_name (from environment FABRIC_DRA_DRIVER_NAME): "
            "value 'Bad_Name' is not "
            "a lowercase DNS subdomain",
        ),
        ({"FABRIC_DRA_DRIVER_NAME": "a" * 64}, "is 64 characters long, at most 63 are allowed"),
        (
            {"FABRIC_DRA_FABRIC__TIMEOUT_SECONDS": "-1"},
            "setting fabric.timeout_seconds (from environment FABRIC_DRA_FABRIC__TIMEOUT_SECONDS): "
            "value '-1': input should be greater than 0; expected seconds per HTTP call, > 0",
        ),
        ({"FABRIC_DRA_FABRIC__TLS_VERIFY": "maybe"}, "setting fabric.tls_verify"),
        ({"FABRIC_DRA_DATABASE__URL": "mysql://h/db"}, "unsupported scheme 'mysql'"),
        (
            {"FABRIC_DRA_DATABASE__URL": "postgresql://root@127.0.0.1:99999/x"},
            "has a port that is not a number from 1 to 65535",
        ),
        (
            {"FABRIC_DRA_DATABASE__URL": "postgresql://root@127.0.0.1:abc/x"},
            "has a port that is not a number from 1 to 65535",
        ),
        ({"FABRIC_DRA_DATABASE__URL": "sqlite+aiosqlite:///"}, "in-memory SQLite database"),
        ({"FABRIC_DRA_DATABASE__URL": "sqlite:///:memory:"}, "in-memory SQLite database"),
        (
            {"FABRIC_DRA_POOLS__GROUPING_KEYS": "region,shelf"},
            "setting pools.grouping_keys[1] (from environment FABRIC_DRA_POOLS__GROUPING_KEYS): "
            "value 'shelf': input should be 'region'",
        ),
        ({"FABRIC_DRA_POOLS__GROUPING_KEYS": "rack,rack"}, "repeats an entry"),
        ({"FABRIC_DRA_POOLS__BINDING_CONDITIONS": "A,B,C,D,E"}, "has 5 entries, at most 4"),
        (
            {
                "FABRIC_DRA_POOLS__BINDING_CONDITIONS": "Ready",
                "FABRIC_DRA_POOLS__BINDING_FAILURE_CONDITIONS": "Ready",
            },
            "share ['Ready']",
        ),
        ({"FABRIC_DRA_POOLS__BINDING_CONDITIONS": "not valid!"}, "is not a valid condition type"),
        ({"FABRIC_DRA_POOLS__UNHEALTHY": "ignore"}, "setting pools.unhealthy"),
        ({"FABRIC_DRA_POOLS__GROUPING_KEYS": " , "}, "is empty"),
        ({"FABRIC_DRA_NODE_LABELS__RACK": "not a label!"}, "is not a valid Kubernetes label key"),
        (
            {"FABRIC_DRA_FABRICURL": "x"},
            "environment variable FABRIC_DRA_FABRICURL: no such setting",
        ),
        ({"FABRIC_DRA_FABRIC__NOPE": "x"}, "FABRIC_DRA_FABRIC__NOPE: no such setting"),
        # driver_name is a setting, not a section: the message lists it apart.
        (
            {"FABRIC_DRA_DRIVER_NAME__X": "1"},
            "FABRIC_DRA_<NAME> (names: driver_name, event_loop, fabrics) or "
            "FABRIC_DRA_<SECTION>__<NAME> (sections: admin, controller, database, fabric, "
            "hosts, inventory, kube, leader, log, node, node_labels, pools, publisher)",
        ),
        (
            {"FABRIC_DRA_FABRIC__PASSWORD": "hunter2"},
            "FABRIC_DRA_FABRIC__PASSWORD: no such setting "
            "(did you mean FABRIC_DRA_FABRIC__PASSWORD_FILE?)",
        ),
        ({"FABRIC_DRA_FABRIK__URL": "x"}, "(did you mean FABRIC_DRA_FABRIC__URL?)"),
        ({"FABRIC_DRA_LOG__LEVEL": "loud"}, "setting log.level"),
        (
            {"FABRIC_DRA_PUBLISHER__RESYNC_PERIOD_SECONDS": "0"},
            "setting publisher.resync_period_seconds (from environment "
            "FABRIC_DRA_PUBLISHER__RESYNC_PERIOD_SECONDS): value '0': input should be greater "
            "than 0",
        ),
        ({"FABRIC_DRA_FABRIC__PASSWORD_FILE": "/p"}, "fabric.username_file is not"),
        (
            {"FABRIC_DRA_EVENT_LOOP": "trio"},
            "setting event_loop (from environment FABRIC_DRA_EVENT_LOOP): value 'trio': input "
            "should be 'auto', 'uvloop' or 'asyncio'",
        ),
    ],
)
def test_bad_environment_values_fail_with_one_clear_line(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(environ=environ)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def _refused(tmp_path: Path, text: str) -> tuple[Path, str]:
    """Write ``text`` as a config file; the file and the ConfigError loading it raises."""
    config = tmp_path / "config.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(config, environ={})
    return config, str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("driver_name: [unclosed\n", "not valid YAML at line 2: expected ',' or ']'"),
        (
            "fabric:\n  url: http://a\nfabric:\n  url: http://b\n",
            "not valid YAML at line 3: found the key 'fabric' twice",
        ),
        ("fabric:\n  url: http://a\n  url: http://b\n", "found the key 'url' twice"),
        ("a: !!python/object/apply:os.system [x]\n", "could not determine a constructor"),
        ("fabric:\n  timeout_seconds: .nan\n", "input should be a finite number"),
        # Some other file given as the config: its lines are not echoed.
        ("root:*:20228:0:99999:7:::\n", "unknown setting: a key that is no setting's name"),
        ("- a\n- b\n", "expected a mapping of settings at the top level, found list"),
        ("fabric:\n  urll: http://x\n", "unknown setting fabric.urll (from"),
        ("inventory:\n  poll_interval_seconds: soon\n", "setting inventory.poll_interval_seconds"),
    ],
)
def test_bad_config_files_name_the_file_and_setting(
    tmp_path: Path, text: str, message: str
) -> None:
    _, error = _refused(tmp_path, text)
    assert message in error


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "fabric:\n  password: hunter2\n",
            "unknown setting fabric.password (from {path}); did you mean fabric.password_file?",
        ),
        ("kube:\n  token: hunter2\n", "unknown setting kube.token (from {path}); did you mean"),
        ("fabrik:\n  url: hunter2\n", "unknown setting fabrik (from {path}); did you mean fabric?"),
        ("zzz: hunter2\n", "unknown setting zzz (from {path})"),
        ("admin:\n  token_file: [hunter2]\n", "setting admin.token_file (from {path}): input"),
    ],
)
def test_unknown_and_secret_settings_never_show_their_value(
    tmp_path: Path, text: str, message: str
) -> None:
    config, error = _refused(tmp_path, text)
    assert message.format(path=config) in error
    assert "hunter2" not in error and "extra inputs" not in error


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1: 2\n", "key 1 at the top level is not a setting name (setting names are text)"),
        ("null: 2\n", "key null at the top level is not a setting name"),
        ("true: 2\n", "key true at the top level is not a setting name"),
        ("admin:\n  null: 2\n", "key null under admin is not a setting name"),
        (
            "fabric:\n  managers:\n    - {url: 'http://a', 3: x}\n",
            "key 3 under fabric.managers[0] is not a setting name",
        ),
        # Deep enough for a RecursionError in PyYAML, and readable but deeper than settings go.
        ("a: " + "[" * 2000 + "]" * 2000 + "\n", "nested too deeply to read"),
        ("a: " + "[" * 20 + "]" * 20 + "\n", "nested more than 16 levels deep (at a[0][0]...)"),
    ],
)
def test_config_files_of_the_wrong_shape_are_refused_in_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    config, error = _refused(tmp_path, text)
    assert f"config file {str(config)!r}: {message}" in error
    assert "\n" not in error


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_settings(tmp_path / "nope.yaml", environ={})


def test_binary_config_file(tmp_path: Path) -> None:
    config = tmp_path / "bin.yaml"
    config.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_settings(config, environ={})


def test_bad_flag_names_the_command_line() -> None:
    with pytest.raises(ConfigError, match=r"setting fabric.url \(from the command line\)"):
        load_settings(flags={"fabric": {"url": "nope"}}, environ={})


def test_plain_database_urls_get_async_drivers() -> None:
    settings = load_settings(environ={"FABRIC_DRA_DATABASE__URL": "postgresql://u@h:5432/d"})
    assert settings.database.url == "postgresql+asyncpg://u@h:5432/d"


def test_secret_is_read_stripped_and_never_printed(tmp_path: Path) -> None:
    path = tmp_path / "password"
    path.write_text("s3cret-value\n")
    secret = read_secret(path, "fabric.password_file")
    assert secret.get_secret_value() == "s3cret-value"
    assert "s3cret" not in repr(secret) and "s3cret" not in str(secret)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"\n", "is empty"),
        (b"\xff\xfe", "not UTF-8"),
        (b"x" * (64 * 1024 + 1), "larger than 64 KiB"),
    ],
)
def test_bad_secret_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "secret"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as err:
        read_secret(path, "fabric.password_file")
    assert "fabric.password_file" in str(err.value)


def test_missing_secret_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_secret(tmp_path / "absent", "fabric.password_file")


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("topology.kubernetes.io/region", True),
        ("rack", True),
        ("a/b", True),
        ("Upper.Case/x", False),
        ("x/", False),
        ("/x", False),
        ("a" * 64, False),
        ("example.com/" + "a" * 63, True),
        ("bad key", False),
    ],
)
def test_label_keys(key: str, valid: bool) -> None:
    assert is_label_key(key) is valid


@pytest.mark.parametrize(
    "environ",
    [
        {"FABRIC_DRA_FABRIC__URL": "https://admin:hunter2@fm:443"},
        {"FABRIC_DRA_DATABASE__URL": "mysql://admin:hunter2@db/x"},
    ],
)
def test_credentials_in_bad_urls_are_not_echoed(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(environ=environ)
    assert "hunter2" not in str(err.value) and "***@" in str(err.value)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"FABRIC_DRA_KUBE__MODE": "url"}, "kube.mode is url but kube.url is not set"),
        ({"FABRIC_DRA_KUBE__MODE": "kubeconfig"}, "kube.kubeconfig is not set"),
        (
            {"FABRIC_DRA_KUBE__MODE": "url", "FABRIC_DRA_KUBE__URL": "ftp://x"},
            "setting kube.url (from environment FABRIC_DRA_KUBE__URL)",
        ),
        ({"FABRIC_DRA_KUBE__RESOURCE_API_VERSION": "v2"}, "setting kube.resource_api_version"),
        ({"FABRIC_DRA_HOSTS__MATCH": "guess"}, "setting hosts.match"),
    ],
)
def test_bad_kube_and_host_settings(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(environ=environ)


def test_kube_client_settings_from_settings(tmp_path: Path) -> None:
    from app.kube.client import KubeAuthMode
    from app.kube.factory import kube_client_settings

    settings = load_settings(
        environ={"FABRIC_DRA_KUBE__MODE": "url", "FABRIC_DRA_KUBE__URL": "http://127.0.0.1:6443"}
    )
    client = kube_client_settings(settings.kube)
    assert client.mode is KubeAuthMode.URL and client.url == "http://127.0.0.1:6443"
    with pytest.raises(ConfigError, match="settings kube: in-cluster config"):
        kube_client_settings(load_settings(environ={}).kube, environ={})


def test_leader_timing_must_be_ordered() -> None:
    with pytest.raises(ConfigError, match="lease_duration_seconds > renew_deadline_seconds"):
        load_settings(environ={"FABRIC_DRA_LEADER__RENEW_DEADLINE_SECONDS": "20"})


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"FABRIC_DRA_ADMIN__PORT": "70000"}, "setting admin.port"),
        ({"FABRIC_DRA_CONTROLLER__MODE": "classic"}, "setting controller.mode"),
        ({"FABRIC_DRA_CONTROLLER__WORKERS": "0"}, "setting controller.workers"),
    ],
)
def test_bad_service_settings(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(environ=environ)


def test_merge_keys_may_be_overridden_but_a_key_not_given_twice(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "x-common: &common {timeout_seconds: 5, url: http://a.example}\n"
        "fabric:\n  <<: *common\n  url: http://b.example\n"
    )
    with pytest.raises(ConfigError, match="unknown setting x-common"):
        load_settings(config, environ={})  # the anchor's holder is a setting like any other
    config.write_text("fabric: &f\n  url: http://b.example\n  <<: {timeout_seconds: 5}\n")
    settings = load_settings(config, environ={})
    assert settings.fabric.url == "http://b.example" and settings.fabric.timeout_seconds == 5


def test_a_foreign_file_given_as_the_config_is_not_echoed(tmp_path: Path) -> None:
    config = tmp_path / "shadow"
    config.write_text("root:$6$secret-hash:20228:0:99999:7:::\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config, environ={})
    assert "secret-hash" not in str(caught.value) and "root:" not in str(caught.value)


def test_the_operator_commands_and_test_variables_are_not_settings() -> None:
    # The README has operators export these for `status` and the other client commands; the
    # settings loader must let every other command run in that shell.
    settings = load_settings(
        environ={
            "FABRIC_DRA_ADMIN_URL": "http://127.0.0.1:8080",
            "FABRIC_DRA_TOKEN_FILE": "/run/secrets/token",
            "FABRIC_DRA_TEST_DATABASES": "sqlite",
            "FABRIC_DRA_BENCH_PG_ADMIN_URL": "postgresql://x@y/z",
            "FABRIC_DRA_SHARED_DATA": "/data",
        }
    )
    assert settings.admin.port == 8080
    with pytest.raises(ConfigError, match="FABRIC_DRA_ADMIN_URLS: no such setting"):
        load_settings(environ={"FABRIC_DRA_ADMIN_URLS": "x"})


@pytest.mark.parametrize(
    ("text", "setting"),
    [
        ("admin:\n  port: true\n", "admin.port"),
        ("inventory:\n  poll_interval_seconds: false\n", "inventory.poll_interval_seconds"),
        ("database:\n  pool_size: true\n", "database.pool_size"),
    ],
)
def test_a_yaml_boolean_is_not_taken_for_a_number(tmp_path: Path, text: str, setting: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(config, environ={})
    assert str(caught.value).startswith(f"setting {setting} (from {config}): value ")
    assert "is a boolean (true or false), not a number" in str(caught.value)


def test_a_boolean_setting_still_takes_a_yaml_boolean(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("database:\n  migrate_on_start: false\n")
    assert load_settings(config, environ={}).database.migrate_on_start is False


def test_the_event_loop_is_auto_by_default_and_may_be_chosen() -> None:
    assert load_settings(environ={}).event_loop == "auto"
    assert load_settings(environ={"FABRIC_DRA_EVENT_LOOP": "asyncio"}).event_loop == "asyncio"
    assert load_settings(environ={"FABRIC_DRA_EVENT_LOOP": "uvloop"}).event_loop == "uvloop"


def test_uvloop_chosen_where_it_is_not_installed_stops_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import app.config

    monkeypatch.setattr(app.config, "uvloop_installed", lambda: False)
    with pytest.raises(ConfigError) as err:
        load_settings(environ={"FABRIC_DRA_EVENT_LOOP": "uvloop"})
    assert "setting event_loop (from environment FABRIC_DRA_EVENT_LOOP)" in str(err.value)
    assert "uvloop is not installed; install it (pip install uvloop)" in str(err.value)
    assert "\n" not in str(err.value)
    assert load_settings(environ={"FABRIC_DRA_EVENT_LOOP": "auto"}).event_loop == "auto"
