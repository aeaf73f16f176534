"""The deployment kit: the kustomize overlays (dev, production, controlplane) as kubectl
renders them, and the monitoring kit (ServiceMonitor, PrometheusRule, Grafana dashboard)
against the Service, the admin port and the metrics the controller really exports."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import generate_latest
from test_deploy import (
    ADMIN_PORT,
    CONTROLLER_NAMESPACE,
    KUBERNETES_VERSIONS,
    MONITORING,
    OPERATOR_KINDS,
    OVERLAYS,
    _documents,
    _load_or_explain,
)

from app.config import NodePluginSettings
from app.configload import load_settings
from app.service import Service

OVERLAY_NAMES = ("dev", "production", "controlplane")
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (built-in kustomize) absent")


@functools.cache
def _render(overlay: str) -> tuple[dict[str, Any], ...]:
    assert KUBECTL is not None
    rendered = subprocess.run(
        [KUBECTL, "kustomize", str(OVERLAYS / overlay)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return tuple(d for d in yaml.safe_load_all(rendered) if d)


def _find(overlay: str, kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d
        for d in _render(overlay)
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def _controller(overlay: str) -> dict[str, Any]:
    [deployment] = _find(overlay, "Deployment", "fabric-dra")
    return deployment


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _overlay_settings(overlay: str, tmp_path: Path) -> Any:
    """The controller's effective settings in ``overlay``: its ConfigMap and the Deployment's
    environment (the Secret's database URL and the namespace stood in)."""
    [config_map] = _find(overlay, "ConfigMap", "fabric-dra-config")
    config = tmp_path / f"{overlay}.yaml"
    config.write_text(config_map["data"]["config.yaml"])
    environ: dict[str, str] = {}
    for name, value in _env(
        _controller(overlay)["spec"]["template"]["spec"]["containers"][0]
    ).items():
        if isinstance(value, str):
            environ[name] = value
        elif "secretKeyRef" in value:
            environ[name] = "postgresql+asyncpg://fabric_dra:pw@postgresql:5432/fabric_dra"
        else:
            environ[name] = CONTROLLER_NAMESPACE
    environ.pop("FABRIC_DRA_CONFIG")
    return _load_or_explain(config_file=config, environ=environ)


# -- overlays ---------------------------------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_every_rendered_object_validates_strictly(overlay: str, version: str) -> None:
    kinds = set()
    for document in _render(overlay):
        kinds.add(document["kind"])
        if document["kind"] not in OPERATOR_KINDS:
            kubernetes_validate.validate(document, version, strict=True)
    assert {"Deployment", "DaemonSet", "ClusterRole", "Service"} <= kinds


@needs_kubectl
def test_dev_is_one_replica_on_sqlite_with_no_disruption_budget(tmp_path: Path) -> None:
    deployment = _controller("dev")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    [entry] = [e for e in container["env"] if e["name"] == "FABRIC_DRA_DATABASE__URL"]
    assert entry == {
        "name": "FABRIC_DRA_DATABASE__URL",
        "value": "sqlite+aiosqlite:////var/lib/fabric-dra/fabric-dra.db",
    }
    # The file sits on the writable data volume.
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/fabric-dra" in mounts
    assert _find("dev", "PodDisruptionBudget") == []
    assert _find("dev", "NetworkPolicy") == [] and _find("dev", "ServiceMonitor") == []
    settings = _overlay_settings("dev", tmp_path)
    assert settings.database.url.startswith("sqlite+aiosqlite:////var/lib/fabric-dra/")


@needs_kubectl
def test_production_is_two_replicas_on_postgresql_with_budget_policy_and_monitoring(
    tmp_path: Path,
) -> None:
    deployment = _controller("production")
    assert deployment["spec"]["replicas"] == 2
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert _env(container)["FABRIC_DRA_DATABASE__URL"] == {
        "secretKeyRef": {"name": "fabric-dra", "key": "database-url"}
    }
    assert _overlay_settings("production", tmp_path).database.url.startswith("postgresql")
    [budget] = _find("production", "PodDisruptionBudget")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    [policy] = _find("production", "NetworkPolicy")
    assert policy["metadata"]["namespace"] == CONTROLLER_NAMESPACE
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    [rule] = policy["spec"]["ingress"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert [p["port"] for p in rule["ports"]] == ["admin"] and ports["admin"] == ADMIN_PORT
    sources = [
        s["namespaceSelector"]["matchLabels"] for s in rule["from"] if "namespaceSelector" in s
    ]
    node_namespace = _find("production", "DaemonSet", "fabric-dra-node")[0]["metadata"]["namespace"]
    assert {"kubernetes.io/metadata.name": node_namespace} in sources
    assert {"ServiceMonitor", "PrometheusRule"} <= {d["kind"] for d in _render("production")}
    assert _find("production", "ConfigMap", "fabric-dra-grafana-dashboard")


@needs_kubectl
def test_controlplane_runs_the_classic_mode_with_its_permissions(tmp_path: Path) -> None:
    settings = _overlay_settings("controlplane", tmp_path)
    assert settings.controller.mode == "control-plane"
    assert _find("controlplane", "ClusterRole", "fabric-dra-controlplane")
    [daemonset] = _find("controlplane", "DaemonSet", "fabric-dra-node")
    env = _env(daemonset["spec"]["template"]["spec"]["containers"][0])
    url = env["FABRIC_DRA_NODE__CONTROLLER_URL"]
    [service] = _find("controlplane", "Service", "fabric-dra")
    assert url == (
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:"
        f"{service['spec']['ports'][0]['port']}"
    )
    assert NodePluginSettings(controller_url=url).controller_url == url
    # Everything production has, and more.
    assert {(d["kind"], d["metadata"]["name"]) for d in _render("production")} < {
        (d["kind"], d["metadata"]["name"]) for d in _render("controlplane")
    }


# -- monitoring -------------------------------------------------------------------------------

# Fields of the Prometheus Operator's monitoring.coreos.com/v1 types that this kit may use
# (prometheus-operator pkg/apis/monitoring/v1/servicemonitor_types.go and
# prometheusrule_types.go); anything else is a typo the operator would refuse or ignore.
SERVICE_MONITOR_SPEC = {"selector", "namespaceSelector", "endpoints", "jobLabel"}
ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "scheme", "authorization"}
RULE_GROUP_FIELDS = {"name", "interval", "rules"}
ALERT_FIELDS = {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


def _monitoring(kind: str) -> dict[str, Any]:
    [document] = [
        d for f in sorted(MONITORING.glob("*.yaml")) for d in _documents(f) if d["kind"] == kind
    ]
    return document


@functools.cache
def _exported_metrics() -> frozenset[str]:
    """Every sample name the controller's /metrics can show: each family's name with the
    suffixes its type gives (a counter's ``_total``, a histogram's ``_bucket`` ...)."""
    settings = load_settings(
        environ={
            "FABRIC_DRA_FABRIC__URL": "http://127.0.0.1:9",
            "FABRIC_DRA_KUBE__MODE": "url",
            "FABRIC_DRA_KUBE__URL": "http://127.0.0.1:9",
        }
    )
    text = generate_latest(Service(settings).metrics.registry).decode()
    names: set[str] = set()
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
    }
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            base = name.removesuffix("_total") if kind == "counter" else name
            names.update(base + suffix for suffix in suffixes.get(kind, ("",)))
    return frozenset(names)


def _unknown_metrics(expr: str) -> list[str]:
    return [m for m in re.findall(r"\bfabric_dra_[a-z0-9_]+", expr) if m not in _exported_metrics()]


def _balanced(expr: str) -> bool:
    depth = 0
    for char in expr:
        depth += {"(": 1, ")": -1, "{": 1, "}": -1, "[": 1, "]": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def test_the_metric_check_knows_the_exported_names_and_catches_a_typo() -> None:
    assert _unknown_metrics("rate(fabric_dra_attach_seconds_bucket[5m])") == []
    assert _unknown_metrics("fabric_dra_leader + fabric_dra_leader_transitions_total") == []
    assert _unknown_metrics("fabric_dra_inventory_stale_total") == [
        "fabric_dra_inventory_stale_total"
    ]
    assert _unknown_metrics("max(fabric_dra_attach_second_bucket)") == [
        "fabric_dra_attach_second_bucket"
    ]


def test_the_service_monitor_scrapes_the_controllers_admin_port() -> None:
    monitor = _monitoring("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= SERVICE_MONITOR_SPEC
    [service] = [
        d for d in _documents(MONITORING.parent / "base" / "service.yaml") if d["kind"] == "Service"
    ]
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [CONTROLLER_NAMESPACE]}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert set(endpoint) <= ENDPOINT_FIELDS
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert DURATION.match(endpoint["interval"]) and DURATION.match(endpoint["scrapeTimeout"])


def test_every_alert_is_well_formed_and_names_only_exported_metrics() -> None:
    rule = _monitoring("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    alerts = []
    for group in rule["spec"]["groups"]:
        assert set(group) <= RULE_GROUP_FIELDS
        for alert in group["rules"]:
            assert set(alert) <= ALERT_FIELDS, alert.get("alert")
            alerts.append(alert)
            name, expr = alert["alert"], alert["expr"]
            assert re.fullmatch(r"FabricDra[A-Za-z]+", name), name
            assert _balanced(expr), name
            assert re.search(r"fabric_dra_[a-z_]+", expr), name
            assert _unknown_metrics(expr) == [], name
            assert alert["labels"]["severity"] in ("critical", "warning"), name
            assert {"summary", "description"} <= set(alert["annotations"]), name
            if "for" in alert:
                assert DURATION.match(alert["for"]), name
    names = [a["alert"] for a in alerts]
    assert len(names) == len(set(names))
    # The alerts the kit promises: stale inventory, detach failed, attach latency, leader
    # flapping, dropped fields.
    covered = " ".join(a["expr"] for a in alerts)
    for metric in (
        "fabric_dra_inventory_stale",
        'fabric_dra_reservations{state="detach-failed"}',
        "fabric_dra_attach_seconds_bucket",
        "fabric_dra_leader_transitions_total",
        "fabric_dra_publisher_dropped_fields",
    ):
        assert metric in covered, metric


def test_the_grafana_dashboard_names_only_exported_metrics() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert dashboard["uid"] == "fabric-dra"
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    exprs = []
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert _balanced(target["expr"]), panel["title"]
            assert _unknown_metrics(target["expr"]) == [], panel["title"]
            exprs.append(target["expr"])
    used = {m for e in exprs for m in re.findall(r"\bfabric_dra_[a-z0-9_]+", e)}
    assert len(used) >= 12
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    [generator] = kustomization["configMapGenerator"]
    assert generator["files"] == ["fabric-dra.json=grafana-dashboard.json"]
    assert generator["options"]["labels"]["grafana_dashboard"] == "1"
