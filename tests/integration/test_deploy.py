"""Packaging: the Kubernetes manifests under deploy/, docker-compose.yml and the Dockerfile.

No Docker engine or cluster runs here, so everything is checked statically, against the
official schemas (kubernetes-validate), the real command line (``app.cli.main``), the real
settings loader (``app.config.load_settings``) and each other: ports, names, secret keys and
the driver name must agree across files.
"""

from __future__ import annotations

import ast
import asyncio
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml
from aiohttp import web

from app.cli import main
from app.config import ConfigError
from app.configload import load_settings
from app.fabric.types import DeviceType

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
PROJECT_IMAGE = "fabric-dra:dev"
SIM_IMAGE = "fabric-dra-sim:dev"
SIM_DOCKERFILE = ROOT / "sim" / "Dockerfile"
DRIVER = "fabric.example.com"
ADMIN_PORT = 8080

# Subcommands the packaging runs. Those that must exist now are resolved and their arguments
# parsed; PENDING ones are being written elsewhere and are checked as soon as they exist.
COMMANDS = {("sim", "redfish"), ("sim", "kube"), ("db", "upgrade"), ("run",)}
# Settings the packaging sets that were added with the admin endpoint and leader election.
NEWER_SETTINGS = ("admin.port", "admin.token_file", "leader.namespace")


# -- helpers ------------------------------------------------------------------------------------


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _manifest_files() -> list[Path]:
    """Every Kubernetes manifest under deploy/ (not kustomizations, not compose helpers)."""
    return sorted(
        p
        for p in DEPLOY.rglob("*.yaml")
        if p.name != "kustomization.yaml" and "compose" not in p.relative_to(DEPLOY).parts
    )


def _kustomization_dirs() -> list[Path]:
    return sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))


def _objects(kind: str) -> list[dict[str, Any]]:
    return [d for f in _manifest_files() for d in _documents(f) if d.get("kind") == kind]


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in _objects(kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r} under deploy/, found {len(found)}"
    return found[0]


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    return data


def _interpolate(value: str) -> str:
    """Compose's ``${NAME:-default}`` / ``${NAME}`` with an empty environment."""

    def replace(match: re.Match[str]) -> str:
        return match.group(2) or ""

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}", replace, value)


def _project_services() -> dict[str, dict[str, Any]]:
    """Compose services that run the project image (or the simulators') with its entry point."""
    return {
        name: svc
        for name, svc in _compose()["services"].items()
        if svc.get("image") in (PROJECT_IMAGE, SIM_IMAGE) and "entrypoint" not in svc
    }


def _resolve(path: tuple[str, ...]) -> click.Command | None:
    command: click.Command = main
    ctx = click.Context(main, info_name="fabric-dra")
    for part in path:
        if not isinstance(command, click.Group):
            return None
        sub = command.get_command(ctx, part)
        if sub is None:
            return None
        command = sub
        ctx = click.Context(command, info_name=part, parent=ctx)
    return command


def _split_command(args: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """Split ``sim redfish --host ...`` into the subcommand path and its arguments."""
    path: list[str] = []
    command: click.Command = main
    ctx = click.Context(main, info_name="fabric-dra")
    for arg in args:
        if not isinstance(command, click.Group) or arg.startswith("-"):
            break
        sub = command.get_command(ctx, arg)
        if sub is None:
            path.append(arg)  # an unknown (pending) command: the rest are its arguments
            break
        path.append(arg)
        command = sub
        ctx = click.Context(command, info_name=arg, parent=ctx)
    return tuple(path), args[len(path) :]


def _settings_environment(env: dict[str, str], files: Path) -> dict[str, str]:
    """``env`` with every file path replaced by a real temporary file."""
    resolved: dict[str, str] = {}
    for key, value in env.items():
        value = _interpolate(str(value))
        if key.endswith(("_FILE", "__CA_BUNDLE", "__KUBECONFIG")) or key == "FABRIC_DRA_CONFIG":
            stand_in = files / key.lower()
            stand_in.write_text("stand-in\n")
            value = str(stand_in)
        resolved[key] = value
    return resolved


def _load_or_explain(**kwargs: Any) -> Any:
    try:
        return load_settings(**kwargs)
    except ConfigError as err:
        newer = [s for s in NEWER_SETTINGS if s.split(".")[0] in str(err).lower()]
        hint = (
            f" (the packaging expects the settings {', '.join(NEWER_SETTINGS)}; "
            f"app/config.py does not have {', '.join(newer)} yet)"
            if newer
            else ""
        )
        pytest.fail(f"settings refused: {err}{hint}")


# -- (a) manifests against the official schemas ---------------------------------------------------

MANIFESTS = [(f, i, doc) for f in _manifest_files() for i, doc in enumerate(_documents(f))]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    ("path", "index", "document"),
    MANIFESTS,
    ids=[f"{p.relative_to(DEPLOY)}#{i}:{d.get('kind')}" for p, i, d in MANIFESTS],
)
def test_manifest_validates_strictly(
    path: Path, index: int, document: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(document, version, strict=True)


def test_the_schema_check_catches_a_misspelt_field() -> None:
    deployment = json.loads(json.dumps(_one("Deployment", "fabric-dra")))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.34", strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_emulator_nodes_file_holds_valid_nodes(version: str) -> None:
    nodes = yaml.safe_load((DEPLOY / "compose" / "nodes.yaml").read_text())
    assert nodes
    for node in nodes:
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "Node", **node}, version, strict=True
        )


@pytest.mark.parametrize("directory", _kustomization_dirs(), ids=lambda d: str(d.relative_to(ROOT)))
def test_kustomization_lists_every_manifest_and_nothing_else(directory: Path) -> None:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    listed = list(kustomization["resources"])
    assert len(listed) == len(set(listed)), f"listed twice: {listed}"
    files = {p.name for p in directory.glob("*.yaml") if p.name != "kustomization.yaml"}
    # Examples of secrets are never applied by -k, so they can never overwrite real ones.
    examples = {f for f in files if f.endswith(".example.yaml")}
    local = {entry for entry in listed if "/" not in entry}
    assert local == files - examples
    assert not local & examples
    for entry in listed:
        assert (directory / entry).exists(), f"{entry} is listed but does not exist"


def test_every_manifest_folder_has_a_kustomization() -> None:
    folders = {p.parent for p in _manifest_files()}
    assert folders <= set(_kustomization_dirs())


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (built-in kustomize) absent")
@pytest.mark.parametrize("directory", _kustomization_dirs(), ids=lambda d: str(d.relative_to(ROOT)))
def test_kustomize_renders_exactly_the_listed_objects(directory: Path) -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    got = sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(rendered) if d)
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    expected = sorted(
        (d["kind"], d["metadata"]["name"])
        for entry in kustomization["resources"]
        for d in _documents(directory / entry)
    )
    assert got == expected


# -- the manifests agree with each other and with the settings ------------------------------------


def _container() -> dict[str, Any]:
    containers = _one("Deployment", "fabric-dra")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _config_yaml() -> str:
    text: str = _one("ConfigMap", "fabric-dra-config")["data"]["config.yaml"]
    return text


def test_the_configmap_and_deployment_environment_are_valid_settings(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(_config_yaml())
    environ: dict[str, str] = {}
    for entry in _container()["env"]:
        if "value" in entry:
            environ[entry["name"]] = entry["value"]
        elif "secretKeyRef" in entry["valueFrom"]:
            assert entry["valueFrom"]["secretKeyRef"]["key"] == "database-url"
            environ[entry["name"]] = "postgresql+asyncpg://fabric_dra:pw@postgresql:5432/fabric_dra"
        else:
            assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
            environ[entry["name"]] = "fabric-dra"
    assert environ.pop("FABRIC_DRA_CONFIG") == "/etc/fabric-dra/config.yaml"
    settings = _load_or_explain(config_file=config, environ=environ)
    assert settings.driver_name == DRIVER
    assert settings.kube.mode == "in-cluster"
    assert settings.database.url.startswith("postgresql+asyncpg://")
    assert settings.admin.port == ADMIN_PORT
    assert settings.leader.namespace == "fabric-dra"
    mounts = {m["name"]: m["mountPath"] for m in _container()["volumeMounts"]}
    secret_dir = Path(mounts["secrets"])
    example = _one("Secret", "fabric-dra")
    keys = set(example["stringData"])
    for path in (
        settings.fabric.username_file,
        settings.fabric.password_file,
        settings.admin.token_file,
    ):
        assert path is not None
        assert path.parent == secret_dir, f"{path} is not in the Secret's volume"
        assert path.name in keys, f"the example Secret has no key {path.name!r}"
    assert "database-url" in keys
    assert mounts["config"] == "/etc/fabric-dra/config.yaml"


def test_the_driver_name_agrees_across_config_rbac_and_device_classes(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(_config_yaml())
    driver = load_settings(config_file=config, environ={}).driver_name
    rules = _one("ClusterRole", "fabric-dra")["rules"]
    named = [r for r in rules if r["resources"] == ["resourceclaims/driver"]]
    assert named == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/driver"],
            "resourceNames": [driver],
            "verbs": ["arbitrary-node:update", "arbitrary-node:patch"],
        }
    ]
    classes = _objects("DeviceClass")
    assert {c["metadata"]["name"] for c in classes} == {
        f"{t}.{driver}" for t in ("gpu", "fpga", "nvme", "cxl-memory")
    }
    for device_class in classes:
        device_type = device_class["metadata"]["name"].removesuffix(f".{driver}")
        [selector] = device_class["spec"]["selectors"]
        assert selector["cel"]["expression"] == (
            f'device.driver == "{driver}" && '
            f'device.attributes["{driver}"].deviceType == "{device_type}"'
        )


def test_device_classes_name_device_types_the_inventory_produces() -> None:
    for device_class in _objects("DeviceClass"):
        device_type = device_class["metadata"]["name"].removesuffix(f".{DRIVER}")
        assert device_type in {t.value for t in DeviceType}


def test_the_demo_pod_uses_the_claim_template_and_a_gpu_class() -> None:
    template = _one("ResourceClaimTemplate", "fabric-gpu")
    pod = _one("Pod", "fabric-gpu-demo")
    assert pod["metadata"]["namespace"] == template["metadata"]["namespace"]
    [claim] = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == "fabric-gpu"
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == f"gpu.{DRIVER}"
    assert request["exactly"]["count"] == 1
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": claim["name"]}]


def test_service_probes_and_container_share_the_admin_port() -> None:
    container = _container()
    [port] = container["ports"]
    assert (port["name"], port["containerPort"]) == ("admin", ADMIN_PORT)
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": "admin"}
    [service_port] = _one("Service", "fabric-dra")["spec"]["ports"]
    assert (service_port["port"], service_port["targetPort"]) == (ADMIN_PORT, "admin")
    assert "EXPOSE 8080" in DOCKERFILE.read_text().splitlines()


def test_the_deployment_is_locked_down() -> None:
    deployment = _one("Deployment", "fabric-dra")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] == 2
    assert tuple(_container()["args"]) in COMMANDS
    assert pod["serviceAccountName"] == "fabric-dra"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = _container()["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    resources = _container()["resources"]
    assert set(resources) == {"requests", "limits"}
    mounts = {m["mountPath"]: m["name"] for m in _container()["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # Writable places on a read-only root: /tmp and the SQLite working directory.
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert "emptyDir" in volumes[mounts["/var/lib/fabric-dra"]]
    selector = spec["selector"]["matchLabels"]
    assert _one("PodDisruptionBudget", "fabric-dra")["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": selector},
    }
    assert _one("Service", "fabric-dra")["spec"]["selector"] == selector
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()


def test_rbac_binds_the_deployments_service_account() -> None:
    account = _one("ServiceAccount", "fabric-dra")["metadata"]
    subject = {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    assert _one("Deployment", "fabric-dra")["metadata"]["namespace"] == account["namespace"]
    for kind, name in (
        ("ClusterRoleBinding", "fabric-dra"),
        ("ClusterRoleBinding", "fabric-dra-controlplane"),
        ("RoleBinding", "fabric-dra-leader-election"),
    ):
        binding = _one(kind, name)
        assert binding["subjects"] == [subject]
        role_kind = binding["roleRef"]["kind"]
        _one(role_kind, binding["roleRef"]["name"])
    lease_role = _one("Role", "fabric-dra-leader-election")
    assert lease_role["metadata"]["namespace"] == account["namespace"]


# -- (b) docker-compose.yml -----------------------------------------------------------------------


def test_compose_services_start_in_order_of_health() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            expected = (
                "service_completed_successfully"
                if services[dependency].get("healthcheck", {}).get("disable")
                else "service_healthy"
            )
            assert condition == {"condition": expected}, f"{name} -> {dependency}"
            if expected == "service_healthy":
                assert services[dependency]["healthcheck"]["test"], dependency
    for controller in ("controller", "controller-emulator"):
        depends = set(services[controller]["depends_on"])
        assert {"postgres", "migrate", "redfish"} <= depends
        assert services[controller]["command"] == ["run"]
        assert services[controller]["healthcheck"]["test"]
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["postgres"]["image"] == "postgres:16"
    assert services["k3s"]["privileged"] is True


@pytest.mark.parametrize("service", sorted(_project_services()))
def test_compose_commands_are_fabric_dra_subcommands(service: str, tmp_path: Path) -> None:
    args = list(_project_services()[service]["command"])
    path, rest = _split_command(args)
    assert path in COMMANDS, (
        f"service {service} runs `fabric-dra {' '.join(path)}`, not an expected command"
    )
    command = _resolve(path)
    assert command is not None, f"`fabric-dra {' '.join(path)}` does not exist"
    # Files the container gets (secrets, the mounted deploy folder) exist here as stand-ins.
    stand_ins = []
    for arg in rest:
        if arg.startswith("/run/secrets/"):
            stand_in = tmp_path / arg.rsplit("/", 1)[-1]
            stand_in.write_text("stand-in\n")
            stand_ins.append(str(stand_in))
        elif arg.startswith("/deploy/"):
            stand_ins.append(str(DEPLOY / arg.removeprefix("/deploy/")))
        else:
            stand_ins.append(arg)
    # Parsing checks every option and value without running the command.
    command.make_context(path[-1], stand_ins)


def test_compose_secrets_exist_and_are_given_to_their_users() -> None:
    compose = _compose()
    declared = compose["secrets"]
    for name, secret in declared.items():
        path = ROOT / secret["file"]
        assert path.is_file(), f"secret {name}: {path} is missing"
        # Bind-mounted with the host's mode: user 65532 must be able to read it.
        assert path.stat().st_mode & 0o004, f"{path} is not world-readable"
    for name, service in compose["services"].items():
        given = set(service.get("secrets") or [])
        assert given <= set(declared), name
        text = json.dumps([service.get("command"), service.get("environment")])
        used = set(re.findall(r"/run/secrets/([A-Za-z0-9_-]+)", text))
        assert used <= given, f"{name} reads secrets it is not given: {used - given}"


@pytest.mark.parametrize(
    "service",
    sorted(
        name
        for name, svc in _compose()["services"].items()
        if any(k.startswith("FABRIC_DRA_") for k in svc.get("environment") or {})
    ),
)
def test_compose_environment_names_real_settings(service: str, tmp_path: Path) -> None:
    environment = _compose()["services"][service]["environment"]
    settings = _load_or_explain(environ=_settings_environment(dict(environment), tmp_path))
    assert (
        settings.database.url
        == _load_or_explain(
            environ=_settings_environment(
                dict(_compose()["services"]["controller"]["environment"]), tmp_path
            )
        ).database.url
    ), "all services share one database"


@pytest.mark.parametrize("service", ["controller", "controller-emulator"])
def test_compose_controller_environment_names_real_settings(service: str, tmp_path: Path) -> None:
    compose = _compose()
    environment = compose["services"][service]["environment"]
    assert all(key.startswith("FABRIC_DRA_") for key in environment)
    environ = _settings_environment(dict(environment), tmp_path)
    settings = _load_or_explain(environ=environ)
    assert settings.driver_name == DRIVER
    assert settings.database.migrate_on_start is False, "the migrate service upgrades"
    assert settings.database.url.startswith("postgresql+asyncpg://fabric_dra:")
    assert settings.database.url.endswith("@postgres:5432/fabric_dra")
    postgres = compose["services"]["postgres"]["environment"]
    password = _interpolate(postgres["POSTGRES_PASSWORD"])
    assert f"fabric_dra:{password}@" in settings.database.url
    # Ports: the admin port is the published container port and the health check's.
    assert settings.admin.port == ADMIN_PORT
    published = [p.split(":")[-1] for p in compose["services"][service]["ports"]]
    assert published == [str(ADMIN_PORT)]
    health = " ".join(compose["services"][service]["healthcheck"]["test"])
    assert f"127.0.0.1:{ADMIN_PORT}/healthz" in health
    # The fabric manager URL is the simulator's service and port.
    redfish = compose["services"]["redfish"]
    redfish_port = redfish["command"][redfish["command"].index("--port") + 1]
    assert settings.fabric.url == f"http://redfish:{redfish_port}"
    assert [p.split(":")[-1] for p in redfish["ports"]] == [redfish_port]
    if settings.kube.mode == "url":
        emulator = compose["services"]["kube-emulator"]["command"]
        assert settings.kube.url == f"http://kube-emulator:{emulator[emulator.index('--port') + 1]}"
        assert settings.leader.namespace == "fabric-dra"
        token_file = environment["FABRIC_DRA_KUBE__TOKEN_FILE"]
        assert token_file == emulator[emulator.index("--rbac-token-file") + 1]
    else:
        assert settings.kube.mode == "kubeconfig"
        assert environment["FABRIC_DRA_KUBE__KUBECONFIG"] == "/kube/kubeconfig-compose.yaml"


def test_compose_python_snippets_compile() -> None:
    for name, service in _compose()["services"].items():
        snippets = [
            *((service.get("healthcheck") or {}).get("test") or []),
            *(service.get("entrypoint") or []),
        ]
        for index, part in enumerate(snippets[:-1]):
            if part == "-c" and snippets[index - 1] == "python":
                compile(snippets[index + 1], f"{name}", "exec")


def test_the_kubeconfig_rewrite_points_at_the_k3s_service(tmp_path: Path) -> None:
    service = _compose()["services"]["kubeconfig"]
    code = service["entrypoint"][service["entrypoint"].index("-c") + 1]
    (tmp_path / "kubeconfig.yaml").write_text(
        "clusters:\n- cluster:\n    server: https://127.0.0.1:6443\n  name: default\n"
    )
    subprocess.run(
        [sys.executable, "-c", code.replace("/output", str(tmp_path))], check=True, timeout=30
    )
    written = yaml.safe_load((tmp_path / "kubeconfig-compose.yaml").read_text())
    assert written["clusters"][0]["cluster"]["server"] == "https://k3s:6443"
    assert "--tls-san=k3s" in _compose()["services"]["k3s"]["command"]


# -- (b) the Dockerfile ---------------------------------------------------------------------------


def _instructions(dockerfile: Path = DOCKERFILE) -> list[tuple[str, str]]:
    text = dockerfile.read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_dockerfile_builds_a_wheel_then_installs_only_wheels() -> None:
    instructions = _instructions()
    stages = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert stages == ["python:3.11-slim AS builder", "python:3.11-slim"]
    final_from = max(i for i, (k, _) in enumerate(instructions) if k == "FROM")
    builder = instructions[:final_from]
    final = instructions[final_from:]
    assert any(k == "RUN" and "pip wheel" in r for k, r in builder)
    final_runs = " ".join(r for k, r in final if k == "RUN")
    assert "--no-index" in final_runs and "--find-links=/wheels" in final_runs
    # No compilers or package installs in the final image.
    assert not re.search(r"apt-get|gcc|build-essential", final_runs)
    assert not any(k in ("COPY", "ADD") for k, _ in final), "the final stage copies files"
    final_keywords = dict(final)
    assert final_keywords["USER"] == "65532:65532"
    assert final_keywords["WORKDIR"] == "/var/lib/fabric-dra"
    assert json.loads(final_keywords["ENTRYPOINT"]) == ["fabric-dra"]
    assert json.loads(final_keywords["CMD"]) == ["run"]
    assert final_keywords["EXPOSE"] == str(ADMIN_PORT)
    assert "65532" in final_runs and "/var/lib/fabric-dra" in final_runs


def test_the_image_entry_point_is_the_projects_console_script() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["fabric-dra"] == "app.cli:main"
    assert _resolve(()) is main
    assert project["requires-python"] == ">=3.11"


def _ignored(relative: str, patterns: list[str]) -> bool:
    """Docker's rule, as far as our patterns need it: a path is excluded when it or a parent
    folder matches, ``**/`` matches at any depth, and the last matching pattern wins (``!``
    re-includes). fnmatch's ``*`` also crosses ``/``, so this errs towards "excluded"."""
    parts = Path(relative).parts
    ignored = False
    for raw in patterns:
        pattern = raw.removeprefix("!").rstrip("/")
        if pattern.startswith("**/"):
            tail = pattern.removeprefix("**/")
            hit = any(
                fnmatch.fnmatch("/".join(parts[i:j]), tail)
                for i in range(len(parts))
                for j in range(i + 1, len(parts) + 1)
            )
        else:
            hit = any(fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) for i in range(len(parts)))
        if hit:
            ignored = not raw.startswith("!")
    return ignored


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _builder_copies() -> list[str]:
    sources: list[str] = []
    for keyword, rest in _instructions():
        if keyword == "COPY" and "--from" not in rest:
            sources.extend(rest.split()[:-1])
    return sources


def test_dockerfile_copies_only_what_exists_and_is_not_ignored() -> None:
    patterns = _dockerignore()
    sources = _builder_copies()
    assert {"pyproject.toml", "setup.py", "README.md", "app", "migrations"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not _ignored(source, patterns), f"{source} is excluded by .dockerignore"
    for heavy in (
        ".venv",
        ".git",
        ".mypy_cache",
        ".pytest_cache",
        ".hypothesis",
        "tests",
        "app/__pycache__",
        "fabric_dra.egg-info",
    ):
        assert _ignored(heavy, patterns), f"{heavy} is sent to the build"


def _healthcheck_code() -> str:
    [healthcheck] = [rest for keyword, rest in _instructions() if keyword == "HEALTHCHECK"]
    command = json.loads(healthcheck[healthcheck.index("CMD") + 3 :].strip())
    assert command[:2] == ["python", "-c"]
    code: str = command[2]
    return code


@pytest.fixture
async def health_server() -> AsyncIterator[tuple[int, dict[str, int]]]:
    state = {"status": 200}

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(status=state["status"], text="ok")

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield int(runner.addresses[0][1]), state
    finally:
        await runner.cleanup()


async def test_the_image_health_check_asks_healthz_on_the_admin_port(
    health_server: tuple[int, dict[str, int]],
) -> None:
    port, state = health_server
    code = _healthcheck_code()
    ast.parse(code)
    env = {**os.environ, "FABRIC_DRA_ADMIN__PORT": str(port)}

    async def run() -> int:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return await asyncio.wait_for(process.wait(), 30)

    assert await run() == 0
    state["status"] = 503
    assert await run() != 0


@pytest.mark.slow
def test_the_builder_stage_sources_make_a_wheel_with_migrations_and_the_script(
    tmp_path: Path,
) -> None:
    # What `pip wheel .` sees in the builder: only the copied sources (no .egg-info, no tests).
    source = tmp_path / "src"
    source.mkdir()
    for entry in _builder_copies():
        if (ROOT / entry).is_dir():
            shutil.copytree(
                ROOT / entry, source / entry, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(ROOT / entry, source / entry)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--wheel-dir",
            str(tmp_path / "wheels"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    [wheel] = (tmp_path / "wheels").glob("fabric_dra-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "fabric-dra = app.cli:main" in archive.read(entry_points).decode()
    assert "app/migrations/env.py" in names
    assert any(n.startswith("app/migrations/versions/") for n in names)
    assert not any(
        n.split("/")[:2] == ["app", "sim"] or n.startswith("fabric_dra_sim/") for n in names
    ), "the product's wheel carries simulators"


def test_only_the_simulators_image_runs_the_simulators() -> None:
    services = _compose()["services"]
    for name, service in _project_services().items():
        expected = SIM_IMAGE if service["command"][0] == "sim" else PROJECT_IMAGE
        assert service["image"] == expected, name
        if expected == SIM_IMAGE:
            assert service["build"] == {"context": ".", "dockerfile": "sim/Dockerfile"}, name
    assert {"redfish", "kube-emulator"} <= {
        n for n, s in services.items() if s.get("image") == SIM_IMAGE
    }


def test_the_simulators_image_adds_fabric_dra_sim_to_the_projects_build() -> None:
    instructions = _instructions(SIM_DOCKERFILE)
    assert [r for k, r in instructions if k == "FROM"] == [
        "python:3.11-slim AS builder",
        "python:3.11-slim",
    ]
    copies = [s for k, r in instructions if k == "COPY" for s in r.split()[:-1]]
    assert set(copies) == {*_builder_copies(), "sim"}
    patterns = _dockerignore()
    assert not _ignored("sim", patterns)
    for stale in ("sim/fabric_dra_sim.egg-info", "sim/build"):
        assert _ignored(stale, patterns), f"{stale} is sent to the build"
    runs = " ".join(r for k, r in instructions if k == "RUN")
    assert "pip wheel --wheel-dir /wheels . ./sim" in runs
    assert "--no-index --find-links=/wheels fabric-dra-sim" in runs
    assert dict(instructions)["USER"] == "65532:65532"
    assert json.loads(dict(instructions)["ENTRYPOINT"]) == ["fabric-dra"]
    assert "sim" not in _builder_copies(), "the project image copies the simulators"


def test_the_simulators_are_a_distribution_of_their_own() -> None:
    import tomllib

    product = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    sim = tomllib.loads((ROOT / "sim" / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("kubernetes-validate") for d in product["dependencies"])
    assert any(d.startswith("kubernetes-validate") for d in sim["dependencies"])
    assert f"fabric-dra=={product['version']}" in sim["dependencies"]
    assert sim["entry-points"]["fabric_dra.commands"] == {
        "demo": "fabric_dra_sim.demo:demo",
        "sim": "fabric_dra_sim.cli:sim",
    }


@pytest.mark.slow
def test_the_simulators_wheel_has_the_package_its_data_and_the_entry_points(
    tmp_path: Path,
) -> None:
    source = tmp_path / "sim"
    shutil.copytree(
        ROOT / "sim",
        source,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--wheel-dir",
            str(tmp_path / "wheels"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    [wheel] = (tmp_path / "wheels").glob("fabric_dra_sim-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "[fabric_dra.commands]" in archive.read(entry_points).decode()
    shipped = {
        str(p.relative_to(ROOT / "sim"))
        for p in (ROOT / "sim" / "fabric_dra_sim").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert shipped <= names, sorted(shipped - names)
    assert "fabric_dra_sim/py.typed" in names and "fabric_dra_sim/demo.py" in names
    assert not any(n.startswith("app/") for n in names)
