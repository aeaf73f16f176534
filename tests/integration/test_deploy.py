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
from click.testing import CliRunner

from app.cli import main
from app.config import ConfigError, NodePluginSettings
from app.configload import load_settings
from app.fabric.types import DeviceType
from app.node.agent import node_name as agent_node_name

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "base"
OVERLAYS = DEPLOY / "overlays"
MONITORING = DEPLOY / "monitoring"
# Kinds of the Prometheus Operator's CRDs (monitoring.coreos.com/v1): no official schema in
# kubernetes-validate, so tests/integration/test_deploy_monitoring.py checks them.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
PROJECT_IMAGE = "fabric-dra:dev"
SIM_IMAGE = "fabric-dra-sim:dev"
SIM_DOCKERFILE = ROOT / "sim" / "Dockerfile"
DRIVER = "fabric.example.com"
CONTROLLER_NAMESPACE = "fabric-dra"
NODE_NAMESPACE = "fabric-dra-node"
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
    """Every Kubernetes manifest under deploy/ (not kustomizations, not an overlay's patches,
    not compose helpers)."""
    return sorted(
        p
        for p in DEPLOY.rglob("*.yaml")
        if p.name != "kustomization.yaml"
        and not p.name.endswith(".patch.yaml")
        and "compose" not in p.relative_to(DEPLOY).parts
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

MANIFESTS = [
    (f, i, doc)
    for f in _manifest_files()
    for i, doc in enumerate(_documents(f))
    if doc.get("kind") not in OPERATOR_KINDS
]


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
    patches = [entry["path"] for entry in kustomization.get("patches") or []]
    files = {p.name for p in directory.glob("*.yaml") if p.name != "kustomization.yaml"}
    # Examples of secrets are never applied by -k, so they can never overwrite real ones.
    examples = {f for f in files if f.endswith(".example.yaml")}
    local = {entry for entry in listed if "/" not in entry}
    assert local | set(patches) == files - examples
    assert not local & examples
    assert all(p.endswith(".patch.yaml") for p in patches), patches
    assert not any(f.endswith(".patch.yaml") for f in local), "a patch listed as a resource"
    for entry in [*listed, *patches]:
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
    assert got == sorted(_listed_objects(directory))


def _listed_objects(directory: Path) -> list[tuple[str, str]]:
    """(kind, name) of what a kustomization should render: its resources (folders followed),
    less what its patches delete, plus the ConfigMaps it generates."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    found: list[tuple[str, str]] = []
    for entry in kustomization["resources"]:
        path = (directory / entry).resolve()
        if path.is_dir():
            found += _listed_objects(path)
        else:
            found += [(d["kind"], d["metadata"]["name"]) for d in _documents(path)]
    for patch in kustomization.get("patches") or []:
        for d in _documents(directory / patch["path"]):
            if d.get("$patch") == "delete":
                found.remove((d["kind"], d["metadata"]["name"]))
    found += [("ConfigMap", g["name"]) for g in kustomization.get("configMapGenerator") or []]
    return found


# -- the manifests agree with each other and with the settings ------------------------------------


def _container() -> dict[str, Any]:
    containers = _one("Deployment", "fabric-dra")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _config_yaml() -> str:
    text: str = _one("ConfigMap", "fabric-dra-config")["data"]["config.yaml"]
    return text


def _controller_environment() -> dict[str, str]:
    """The Deployment's env as its pods get it (the Secret's URL and the namespace stood in)."""
    environ: dict[str, str] = {}
    for entry in _container()["env"]:
        if "value" in entry:
            environ[entry["name"]] = entry["value"]
        elif "secretKeyRef" in entry["valueFrom"]:
            assert entry["valueFrom"]["secretKeyRef"]["key"] == "database-url"
            environ[entry["name"]] = "postgresql+asyncpg://fabric_dra:pw@postgresql:5432/fabric_dra"
        else:
            assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
            environ[entry["name"]] = CONTROLLER_NAMESPACE
    return environ


def _controller_settings(tmp_path: Path) -> Any:
    """The controller's effective settings: its ConfigMap and the Deployment's environment."""
    config = tmp_path / "controller-config.yaml"
    config.write_text(_config_yaml())
    environ = _controller_environment()
    assert environ.pop("FABRIC_DRA_CONFIG") == "/etc/fabric-dra/config.yaml"
    return _load_or_explain(config_file=config, environ=environ)


def test_the_configmap_and_deployment_environment_are_valid_settings(tmp_path: Path) -> None:
    settings = _controller_settings(tmp_path)
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


# -- the node plugin's DaemonSet and RBAC ---------------------------------------------------------

NODE_DAEMONSET = "fabric-dra-node"
NODE_ACCOUNT = "fabric-dra-node"
NODE_CONFIGMAP = "fabric-dra-node-config"
NODE_NAME_STAND_IN = "node-us-east-rack-01-1"
# Host paths the plugin reads, seen under node.host_root (finder: sysfs, NVIDIA's
# /proc/driver/nvidia, /proc/devices majors, stat of /dev).
NODE_HOST_VIEWS = ("/sys", "/proc/driver", "/proc/devices", "/dev")
# Exactly what app/node/agent.py calls: read one claim, create a core/v1 Event.
NODE_RULES = [
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def _node_daemonset() -> dict[str, Any]:
    """A deep copy of the DaemonSet, free to change."""
    copy: dict[str, Any] = json.loads(json.dumps(_one("DaemonSet", NODE_DAEMONSET)))
    return copy


def _node_container(daemonset: dict[str, Any]) -> dict[str, Any]:
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _node_environment(container: dict[str, Any]) -> dict[str, str]:
    """The container's env as the pod gets it; NODE_NAME must come from spec.nodeName."""
    environ: dict[str, str] = {}
    for entry in container["env"]:
        if "value" in entry:
            environ[entry["name"]] = entry["value"]
            continue
        field = entry["valueFrom"]["fieldRef"]["fieldPath"]
        assert (entry["name"], field) == ("NODE_NAME", "spec.nodeName"), entry
        environ[entry["name"]] = NODE_NAME_STAND_IN
    return environ


def _node_config_yaml() -> str:
    text: str = _one("ConfigMap", NODE_CONFIGMAP)["data"]["config.yaml"]
    return text


def _node_settings(container: dict[str, Any], tmp_path: Path) -> Any:
    """The node plugin's effective settings: its ConfigMap and the DaemonSet's environment."""
    config = tmp_path / "node-config.yaml"
    config.write_text(_node_config_yaml())
    environ = _node_environment(container)
    assert environ.pop("FABRIC_DRA_CONFIG") == "/etc/fabric-dra/config.yaml"
    return _load_or_explain(config_file=config, environ=environ)


def _host_mounts(daemonset: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Container mount path -> (the mount, the hostPath volume source) for hostPath volumes."""
    pod = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {
        m["mountPath"]: (m, volumes[m["name"]]["hostPath"])
        for m in _node_container(daemonset)["volumeMounts"]
        if "hostPath" in volumes[m["name"]]
    }


def _node_mount_problems(daemonset: dict[str, Any], settings: Any) -> list[str]:
    """What is wrong with the DaemonSet's host mounts for these effective settings."""
    problems: list[str] = []
    mounts = _host_mounts(daemonset)
    kubelet_dirs = {
        settings.node.plugin_registry_dir: "Directory",  # the kubelet's: never created by us
        settings.node.plugins_dir: "DirectoryOrCreate",
        settings.node.cdi_dir: "DirectoryOrCreate",
    }
    expected: dict[str, tuple[str, bool]] = {str(path): (str(path), False) for path in kubelet_dirs}
    for view in NODE_HOST_VIEWS:
        expected[str(settings.node.host_root / view.lstrip("/"))] = (view, True)
    for mount_path, (host_path, read_only) in expected.items():
        if mount_path not in mounts:
            problems.append(f"no hostPath mount at {mount_path} (host {host_path})")
            continue
        mount, source = mounts[mount_path]
        if source["path"] != host_path:
            problems.append(f"{mount_path} mounts host {source['path']}, not {host_path}")
        if bool(mount.get("readOnly")) != read_only:
            problems.append(f"{mount_path} must be {'read-only' if read_only else 'writable'}")
    for path, kind in kubelet_dirs.items():
        if str(path) in mounts and mounts[str(path)][1].get("type") != kind:
            problems.append(f"host {path} must be hostPath type {kind}")
    problems.extend(f"unexpected host mount {p}" for p in sorted(set(mounts) - set(expected)))
    return problems


def _node_security_problems(daemonset: dict[str, Any]) -> list[str]:
    """Where the DaemonSet asks for more than the node plugin needs."""
    problems: list[str] = []
    pod = daemonset["spec"]["template"]["spec"]
    context = _node_container(daemonset)["securityContext"]
    wanted: dict[str, Any] = {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    problems.extend(
        f"container securityContext.{key} is {context.get(key)!r}, not {value!r}"
        for key, value in wanted.items()
        if context.get(key) != value
    )
    problems.extend(
        f"pod spec.{key} is true"
        for key in ("hostNetwork", "hostPID", "hostIPC")
        if pod.get(key, False) is not False
    )
    if pod["securityContext"].get("seccompProfile") != {"type": "RuntimeDefault"}:
        problems.append("pod securityContext.seccompProfile is not RuntimeDefault")
    if any("secret" in v or "projected" in v for v in pod["volumes"]):
        problems.append("the node plugin mounts a Secret: it needs no credentials")
    return problems


def _node_rbac_problems(objects: list[dict[str, Any]]) -> list[str]:
    """What is wrong with the node plugin's permissions among these objects."""
    problems: list[str] = []
    roles = [
        o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == NODE_ACCOUNT
    ]
    if len(roles) != 1:
        return [f"expected one ClusterRole {NODE_ACCOUNT}, found {len(roles)}"]
    rules = roles[0]["rules"]
    for rule in rules:
        for key in ("apiGroups", "resources", "verbs", "resourceNames"):
            if "*" in rule.get(key, []):
                problems.append(f"wildcard in {key}: {rule}")
    if sorted(map(json.dumps, rules)) != sorted(map(json.dumps, NODE_RULES)):
        problems.append(f"rules are {rules}, not exactly {NODE_RULES}")
    subject = {"kind": "ServiceAccount", "name": NODE_ACCOUNT, "namespace": NODE_NAMESPACE}
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        name = binding["metadata"]["name"]
        binds_node = subject in binding.get("subjects", [])
        if name == NODE_ACCOUNT:
            if binding["subjects"] != [subject]:
                problems.append(f"{name} binds {binding['subjects']}, not {[subject]}")
            if binding["roleRef"] != {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": NODE_ACCOUNT,
            }:
                problems.append(f"{name} refers to {binding['roleRef']}")
        elif binds_node:
            problems.append(f"{binding['kind']} {name} also grants to the node plugin")
    return problems


def _all_objects() -> list[dict[str, Any]]:
    return [d for f in _manifest_files() for d in _documents(f)]


def test_the_node_daemonset_runs_the_node_command_of_the_controllers_image() -> None:
    daemonset = _node_daemonset()
    container = _node_container(daemonset)
    deployment = _one("Deployment", "fabric-dra")
    assert container["args"] == ["node"]
    assert "command" not in container, "the image's entry point is fabric-dra"
    assert container["image"] == _container()["image"]
    # Apart from the controller: its namespace admits what the node plugin needs.
    assert daemonset["metadata"]["namespace"] == NODE_NAMESPACE
    assert deployment["metadata"]["namespace"] == CONTROLLER_NAMESPACE
    assert _resolve(("node",)) is not None, "`fabric-dra node` does not exist"
    result = CliRunner().invoke(main, [*container["args"], "--help"])
    assert result.exit_code == 0, result.output
    assert "--host-root" in result.output


def test_the_node_daemonset_environment_is_valid_settings(tmp_path: Path) -> None:
    container = _node_container(_node_daemonset())
    settings = _node_settings(container, tmp_path)
    assert settings.driver_name == DRIVER
    assert settings.kube.mode == "in-cluster"
    assert settings.node.host_root == Path("/host")
    # The name comes from the downward API, not from the settings.
    assert settings.node.node_name is None
    assert agent_node_name(settings, _node_environment(container)) == NODE_NAME_STAND_IN
    controller_mounts = {m["name"]: m for m in _container()["volumeMounts"]}
    node_mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert node_mounts["config"] == controller_mounts["config"]
    pod = _node_daemonset()["spec"]["template"]["spec"]
    [config] = [v for v in pod["volumes"] if v["name"] == "config"]
    assert config["configMap"]["name"] == NODE_CONFIGMAP
    node_configmap = _one("ConfigMap", NODE_CONFIGMAP)["metadata"]
    assert node_configmap["namespace"] == _node_daemonset()["metadata"]["namespace"]


def test_the_node_daemonset_mounts_the_kubelet_dirs_and_a_read_only_host(tmp_path: Path) -> None:
    daemonset = _node_daemonset()
    settings = _node_settings(_node_container(daemonset), tmp_path)
    # The kubelet's directories are the settings' defaults: the ConfigMap does not move them.
    defaults = NodePluginSettings()
    for field in ("plugin_registry_dir", "plugins_dir", "cdi_dir"):
        assert getattr(settings.node, field) == getattr(defaults, field), field
    assert _node_mount_problems(daemonset, settings) == []
    # Read-only views stay read-only below their submounts where the runtime can do it.
    for view in NODE_HOST_VIEWS:
        mount, _ = _host_mounts(daemonset)[str(settings.node.host_root / view.lstrip("/"))]
        if view != "/proc/devices":  # a file has no submounts
            assert mount.get("recursiveReadOnly") == "IfPossible", view
    pod = daemonset["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in _node_container(daemonset)["volumeMounts"]}
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == mounts["/tmp"])


def test_the_node_mount_check_catches_mistakes(tmp_path: Path) -> None:
    daemonset = _node_daemonset()
    settings = _node_settings(_node_container(daemonset), tmp_path)
    mounts = _node_container(daemonset)["volumeMounts"]
    volumes = daemonset["spec"]["template"]["spec"]["volumes"]
    sys_mount = next(m for m in mounts if m["mountPath"] == "/host/sys")
    sys_mount["readOnly"] = False
    registry = next(
        v
        for v in volumes
        if v.get("hostPath", {}).get("path") == "/var/lib/kubelet/plugins_registry"
    )
    registry["hostPath"]["type"] = "DirectoryOrCreate"
    cdi_mount = next(m for m in mounts if m["mountPath"] == "/var/run/cdi")
    cdi_mount["mountPath"] = "/etc/cdi"
    volumes.append({"name": "host-root", "hostPath": {"path": "/"}})
    mounts.append({"name": "host-root", "mountPath": "/host/root"})
    assert _node_mount_problems(daemonset, settings) == [
        "no hostPath mount at /var/run/cdi (host /var/run/cdi)",
        "/host/sys must be read-only",
        "host /var/lib/kubelet/plugins_registry must be hostPath type Directory",
        "unexpected host mount /etc/cdi",
        "unexpected host mount /host/root",
    ]


def test_the_node_probes_ask_the_health_port_the_settings_default_to(tmp_path: Path) -> None:
    container = _node_container(_node_daemonset())
    settings = _node_settings(container, tmp_path)
    assert settings.node.health_port == NodePluginSettings().health_port
    assert settings.node.health_host == NodePluginSettings().health_host == "0.0.0.0"
    [port] = container["ports"]
    assert (port["containerPort"], port["protocol"]) == (settings.node.health_port, "TCP")
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": port["name"]}, probe


def test_the_node_daemonset_is_as_locked_down_as_the_work_allows() -> None:
    daemonset = _node_daemonset()
    spec = daemonset["spec"]
    pod = spec["template"]["spec"]
    assert _node_security_problems(daemonset) == []
    assert pod["securityContext"]["runAsUser"] == 0, "the kubelet's dirs are root's"
    assert pod["serviceAccountName"] == NODE_ACCOUNT
    assert pod["automountServiceAccountToken"] is True
    assert pod["priorityClassName"] == "system-node-critical"
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    assert {"key": "fabric-dra.io/devices", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert set(_node_container(daemonset)["resources"]) == {"requests", "limits"}
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    # The controller's Service, PodDisruptionBudget and Deployment never select node pods.
    labels = spec["template"]["metadata"]["labels"]
    controller = _one("Deployment", "fabric-dra")
    for other in (
        _one("Service", "fabric-dra")["spec"]["selector"],
        _one("PodDisruptionBudget", "fabric-dra")["spec"]["selector"]["matchLabels"],
        controller["spec"]["selector"]["matchLabels"],
    ):
        assert not other.items() <= labels.items()
    assert not selector.items() <= controller["spec"]["template"]["metadata"]["labels"].items()


def test_the_node_security_check_catches_mistakes() -> None:
    daemonset = _node_daemonset()
    pod = daemonset["spec"]["template"]["spec"]
    context = _node_container(daemonset)["securityContext"]
    context["privileged"] = True
    context["capabilities"]["add"] = ["SYS_ADMIN", "NET_ADMIN"]
    pod["hostNetwork"] = True
    pod["volumes"].append({"name": "creds", "secret": {"secretName": "fabric-dra"}})
    assert _node_security_problems(daemonset) == [
        "container securityContext.privileged is True, not False",
        "container securityContext.capabilities is "
        "{'drop': ['ALL'], 'add': ['SYS_ADMIN', 'NET_ADMIN']}, not "
        "{'drop': ['ALL'], 'add': ['SYS_ADMIN']}",
        "pod spec.hostNetwork is true",
        "the node plugin mounts a Secret: it needs no credentials",
    ]


def test_the_node_rbac_is_exactly_get_claims_and_create_events() -> None:
    objects = _all_objects()
    assert _node_rbac_problems(objects) == []
    account = _one("ServiceAccount", NODE_ACCOUNT)["metadata"]
    assert account["namespace"] == _node_daemonset()["metadata"]["namespace"]


def test_the_node_rbac_check_catches_mistakes() -> None:
    objects = json.loads(json.dumps(_all_objects()))
    role = next(
        o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == NODE_ACCOUNT
    )
    role["rules"][0]["verbs"] = ["get", "list"]
    role["rules"].append({"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]})
    leader = next(o for o in objects if o["kind"] == "RoleBinding")
    leader["subjects"].append(
        {"kind": "ServiceAccount", "name": NODE_ACCOUNT, "namespace": NODE_NAMESPACE}
    )
    problems = _node_rbac_problems(objects)
    assert (
        problems[0]
        == "wildcard in apiGroups: {'apiGroups': ['*'], 'resources': ['pods'], 'verbs': ['get']}"
    )
    assert problems[1].startswith("rules are [")
    assert problems[2] == "RoleBinding fabric-dra-leader-election also grants to the node plugin"
    assert len(problems) == 3
    assert _node_rbac_problems([o for o in objects if o["kind"] != "ClusterRole"]) == [
        f"expected one ClusterRole {NODE_ACCOUNT}, found 0"
    ]


def test_kubectl_apply_k_deploy_installs_the_node_plugin() -> None:
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    node_files = {"node-namespace.yaml", "node-rbac.yaml", "node-configmap.yaml"}
    assert {*node_files, "node-daemonset.yaml"} <= set(listed)
    [daemonset] = _documents(BASE / "node-daemonset.yaml")
    assert daemonset["kind"] == "DaemonSet"
    kinds = {name: {d["kind"] for d in _documents(BASE / name)} for name in node_files}
    assert kinds == {
        "node-namespace.yaml": {"Namespace", "ServiceAccount"},
        "node-rbac.yaml": {"ClusterRole", "ClusterRoleBinding"},
        "node-configmap.yaml": {"ConfigMap"},
    }
    # The controller's file holds the controller's identity only.
    accounts = [d["metadata"]["name"] for d in _documents(BASE / "serviceaccount.yaml")]
    assert accounts == ["fabric-dra"]


def test_namespaces_are_applied_before_what_lives_in_them() -> None:
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    assert listed[0] == "node-namespace.yaml"
    holds_namespace = ["Namespace" in {d["kind"] for d in _documents(BASE / f)} for f in listed]
    first_other = holds_namespace.index(False)
    assert not any(holds_namespace[first_other:]), listed


CLUSTER_SCOPED_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass"}


@pytest.mark.parametrize("directory", _kustomization_dirs(), ids=lambda d: str(d.relative_to(ROOT)))
def test_no_kustomization_forces_one_namespace(directory: Path) -> None:
    # A global `namespace:` would move the node plugin into the controller's restricted
    # namespace (and its ServiceAccount away from the ClusterRoleBinding's subject).
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert "namespace" not in kustomization


def test_every_namespaced_object_names_a_namespace_deploy_creates() -> None:
    created = {o["metadata"]["name"] for o in _objects("Namespace")}
    assert {CONTROLLER_NAMESPACE, NODE_NAMESPACE} <= created
    for document in _all_objects():
        where = f"{document['kind']} {document['metadata']['name']}"
        if document["kind"] in CLUSTER_SCOPED_KINDS:
            assert "namespace" not in document["metadata"], where
        else:
            assert document["metadata"].get("namespace") in created, where


# -- the node plugin's settings agree with the controller's ---------------------------------------

# What the node plugin must read exactly as the controller does: it registers under the driver
# name and looks for the binding conditions the controller sets on claims (app/node/agent.py).
SHARED_SETTINGS = ("driver_name", "pools.binding_conditions", "pools.binding_failure_conditions")


def _setting(settings: Any, dotted: str) -> Any:
    value = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _shared_setting_differences(controller: Any, node: Any) -> list[str]:
    """One line for each setting of SHARED_SETTINGS whose value differs between the two."""
    return [
        f"{dotted}: the controller has {_setting(controller, dotted)!r}, "
        f"the node plugin {_setting(node, dotted)!r}"
        for dotted in SHARED_SETTINGS
        if _setting(controller, dotted) != _setting(node, dotted)
    ]


def test_the_node_plugin_and_the_controller_share_driver_and_binding_conditions(
    tmp_path: Path,
) -> None:
    controller = _controller_settings(tmp_path)
    node = _node_settings(_node_container(_node_daemonset()), tmp_path)
    assert _shared_setting_differences(controller, node) == []
    assert node.driver_name == DRIVER


def test_the_shared_settings_check_catches_a_node_config_that_was_not_updated(
    tmp_path: Path,
) -> None:
    controller_file = tmp_path / "controller.yaml"
    controller_file.write_text(
        _config_yaml() + "pools:\n  binding_conditions: [FabricAttached]\n", encoding="utf-8"
    )
    node_file = tmp_path / "node.yaml"
    node_file.write_text(
        _node_config_yaml().replace(f"driver_name: {DRIVER}", "driver_name: fabric.example.org"),
        encoding="utf-8",
    )
    controller = load_settings(config_file=controller_file, environ={})
    node = load_settings(config_file=node_file, environ={})
    assert _shared_setting_differences(controller, node) == [
        "driver_name: the controller has 'fabric.example.com', the node plugin "
        "'fabric.example.org'",
        "pools.binding_conditions: the controller has ('FabricAttached',), the node plugin "
        "('FabricDeviceReady',)",
    ]


def test_the_node_configmaps_commented_settings_are_valid_when_uncommented(
    tmp_path: Path,
) -> None:
    lines = _node_config_yaml().splitlines()
    start = lines.index("# node:")
    block = ["node:"]
    for line in lines[start + 1 :]:
        if not line.startswith("#   "):
            break
        block.append(line.removeprefix("#"))
    assert len(block) > 5, "the node.* example block is missing"
    config = tmp_path / "node-config.yaml"
    config.write_text(_node_config_yaml() + "\n".join(block) + "\n", encoding="utf-8")
    settings = load_settings(config_file=config, environ={})
    assert settings.node.controller_url == "http://fabric-dra.fabric-dra.svc:8080"
    service = _one("Service", "fabric-dra")
    [port] = service["spec"]["ports"]
    assert settings.node.controller_url == (
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:"
        f"{port['port']}"
    )


# -- Pod Security admission -----------------------------------------------------------------------

# The Pod Security Standards (https://kubernetes.io/docs/concepts/security/pod-security-standards/;
# kubernetes/kubernetes staging/src/k8s.io/pod-security-admission/policy/check_*.go), the checks
# that bear on our pods: host namespaces, privileged, capabilities, hostPath, hostPort, seccomp
# and AppArmor (baseline); volume types, privilege escalation, non-root, uid 0, seccomp and
# capabilities (restricted). Not checked: sysctls, SELinux options, procMount, Windows.
PSS_LEVELS = ("privileged", "baseline", "restricted")
PSS_LABEL = "pod-security.kubernetes.io/"
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_VOLUME_SOURCES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)


def _namespace_level(namespace: dict[str, Any], mode: str) -> str:
    """The Pod Security level a namespace's ``mode`` label (enforce, warn, audit) sets.

    Without the label the level is "privileged" (the admission plugin's default).

    Raises:
        ValueError: the label holds something other than privileged, baseline or restricted.
    """
    level = str(namespace["metadata"].get("labels", {}).get(PSS_LABEL + mode, "privileged"))
    if level not in PSS_LEVELS:
        raise ValueError(
            f"namespace {namespace['metadata']['name']!r}: label {PSS_LABEL}{mode} is "
            f"{level!r}; expected one of {', '.join(PSS_LEVELS)}"
        )
    return level


def _all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        c
        for key in ("initContainers", "containers", "ephemeralContainers")
        for c in pod.get(key, [])
    ]


def _baseline_refusals(pod: dict[str, Any]) -> list[str]:
    refusals = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    pod_context = pod.get("securityContext", {})
    for container in _all_containers(pod):
        name, context = container["name"], container.get("securityContext", {})
        if context.get("privileged"):
            refusals.append(f"container {name!r} is privileged")
        added = set(context.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES
        if added:
            refusals.append(f"container {name!r} adds capabilities {sorted(added)}")
        if any(p.get("hostPort") for p in container.get("ports", [])):
            refusals.append(f"container {name!r} uses a hostPort")
        for key in ("seccompProfile", "appArmorProfile"):
            for where, ctx in (("pod", pod_context), (f"container {name!r}", context)):
                if ctx.get(key, {}).get("type") == "Unconfined":
                    refusals.append(f"{where} {key} is Unconfined")
    host_paths = [v["name"] for v in pod.get("volumes", []) if "hostPath" in v]
    if host_paths:
        refusals.append(f"hostPath volumes {host_paths}")
    return sorted(set(refusals), key=refusals.index)


def _restricted_refusals(pod: dict[str, Any]) -> list[str]:
    refusals: list[str] = []
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"} - RESTRICTED_VOLUME_SOURCES
        if kinds:
            refusals.append(f"volume {volume['name']!r} is of type {sorted(kinds)}")
    pod_context = pod.get("securityContext", {})
    if pod_context.get("runAsUser") == 0:
        refusals.append("pod runAsUser is 0")
    for container in _all_containers(pod):
        name, context = container["name"], container.get("securityContext", {})
        if context.get("allowPrivilegeEscalation") is not False:
            refusals.append(f"container {name!r} does not set allowPrivilegeEscalation=false")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            refusals.append(f"container {name!r} does not run as non-root")
        if context.get("runAsUser") == 0:
            refusals.append(f"container {name!r} runAsUser is 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            refusals.append(f"container {name!r} has no RuntimeDefault or Localhost seccomp")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            refusals.append(f"container {name!r} does not drop ALL capabilities")
        added = set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}
        if added:
            refusals.append(f"container {name!r} adds {sorted(added)} (restricted)")
    return refusals


def _pod_security_refusals(pod: dict[str, Any], level: str) -> list[str]:
    """Why the Pod Security ``level`` refuses a pod spec (a pod template's ``spec``); [] admits.

    Raises:
        ValueError: ``level`` is not privileged, baseline or restricted.
    """
    if level not in PSS_LEVELS:
        raise ValueError(f"Pod Security level {level!r}; expected one of {', '.join(PSS_LEVELS)}")
    if level == "privileged":
        return []
    refusals = _baseline_refusals(pod)
    if level == "restricted":
        refusals += _restricted_refusals(pod)
    return refusals


def _pod_spec(kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(json.dumps(_one(kind, name)["spec"]["template"]["spec"]))
    return spec


def test_the_namespace_pod_security_level_admits_the_node_plugin() -> None:
    daemonset = _node_daemonset()
    node_namespace = _one("Namespace", daemonset["metadata"]["namespace"])
    node_pod = daemonset["spec"]["template"]["spec"]
    assert _pod_security_refusals(node_pod, _namespace_level(node_namespace, "enforce")) == []
    assert _namespace_level(node_namespace, "enforce") == "privileged"
    # What baseline would refuse is exactly what the plugin needs, and warn/audit name it.
    assert _pod_security_refusals(node_pod, "baseline") == [
        "container 'node-plugin' adds capabilities ['SYS_ADMIN']",
        f"hostPath volumes {[v['name'] for v in node_pod['volumes'] if 'hostPath' in v]}",
    ]
    assert _namespace_level(node_namespace, "warn") == "baseline"
    assert _namespace_level(node_namespace, "audit") == "baseline"
    # The controller's namespace stays restricted, and its pods pass it.
    deployment = _one("Deployment", "fabric-dra")
    controller_namespace = _one("Namespace", deployment["metadata"]["namespace"])
    assert controller_namespace["metadata"]["name"] == CONTROLLER_NAMESPACE
    assert _namespace_level(controller_namespace, "enforce") == "restricted"
    assert _pod_security_refusals(_pod_spec("Deployment", "fabric-dra"), "restricted") == []
    for namespace in (node_namespace, controller_namespace):
        labels = namespace["metadata"]["labels"]
        for mode in ("enforce", "warn", "audit"):
            if PSS_LABEL + mode in labels:
                assert labels[f"{PSS_LABEL}{mode}-version"] == "latest", (namespace, mode)


def test_the_pod_security_check_refuses_what_each_level_refuses() -> None:
    node_pod = _pod_spec("DaemonSet", NODE_DAEMONSET)
    restricted = _pod_security_refusals(node_pod, "restricted")
    assert "pod runAsUser is 0" in restricted
    assert "volume 'plugins' is of type ['hostPath']" in restricted
    assert "container 'node-plugin' does not run as non-root" in restricted
    assert "container 'node-plugin' adds ['SYS_ADMIN'] (restricted)" in restricted
    controller_pod = _pod_spec("Deployment", "fabric-dra")
    controller_pod["hostNetwork"] = True
    context = controller_pod["containers"][0]["securityContext"]
    context["privileged"] = True
    context["allowPrivilegeEscalation"] = True
    context["capabilities"] = {"add": ["NET_BIND_SERVICE", "NET_RAW"]}
    context["seccompProfile"] = {"type": "Unconfined"}
    controller_pod["containers"][0]["ports"][0]["hostPort"] = 8080
    assert _pod_security_refusals(controller_pod, "baseline") == [
        "hostNetwork=true",
        "container 'controller' is privileged",
        "container 'controller' adds capabilities ['NET_RAW']",
        "container 'controller' uses a hostPort",
        "container 'controller' seccompProfile is Unconfined",
    ]
    assert _pod_security_refusals(controller_pod, "restricted")[5:] == [
        "container 'controller' does not set allowPrivilegeEscalation=false",
        "container 'controller' has no RuntimeDefault or Localhost seccomp",
        "container 'controller' does not drop ALL capabilities",
        "container 'controller' adds ['NET_RAW'] (restricted)",
    ]
    assert _pod_security_refusals(controller_pod, "privileged") == []


def test_the_pod_security_check_refuses_unknown_levels() -> None:
    with pytest.raises(ValueError, match="level 'strict'; expected one of privileged, baseline"):
        _pod_security_refusals(_pod_spec("Deployment", "fabric-dra"), "strict")
    namespace = json.loads(json.dumps(_one("Namespace", NODE_NAMESPACE)))
    namespace["metadata"]["labels"][PSS_LABEL + "enforce"] = "Privileged"
    with pytest.raises(
        ValueError,
        match=re.escape(
            "namespace 'fabric-dra-node': label pod-security.kubernetes.io/enforce is "
            "'Privileged'; expected one of privileged, baseline, restricted"
        ),
    ):
        _namespace_level(namespace, "enforce")
    del namespace["metadata"]["labels"][PSS_LABEL + "enforce"]
    assert _namespace_level(namespace, "enforce") == "privileged"


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
    build = subprocess.run(
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
        text=True,
        timeout=120,
    )
    # setuptools' deprecations (a license table, package data outside `packages`) stop builds
    # in later releases; the build must be clean today.
    assert "Warning" not in build.stdout + build.stderr, build.stderr
    [wheel] = (tmp_path / "wheels").glob("fabric_dra-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "fabric-dra = app.cli:main" in archive.read(entry_points).decode()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().split("\n\n", 1)[0].splitlines()
        assert "License-Expression: Apache-2.0" in headers
        assert "License-File: LICENSE" in headers
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # Every module and template of the package, including folders without an __init__.py
    # (the generated kubelet gRPC modules, the dashboard's templates).
    sources = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "app").rglob("*")
        if p.suffix in (".py", ".pyi", ".j2") and "__pycache__" not in p.parts
    }
    assert "app/node/grpcapi/dra_v1_pb2_grpc.py" in sources
    assert "app/admin/templates/dashboard.html.j2" in sources
    assert sources <= set(names), sorted(sources - set(names))
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
