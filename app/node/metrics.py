"""Prometheus metrics of the node plugin, on a registry the caller owns."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "fabric_dra_node"


@dataclass(frozen=True)
class NodeMetrics:
    """Metrics of ``fabric-dra node``.

    * ``calls{method, result}``: kubelet calls (``prepare``, ``unprepare``) by result (ok,
      error: a call with at least one claim error).
    * ``claims{method, result}``: claims in those calls by result (ok, error).
    * ``prepare_seconds``: wall time of preparing one claim (waits included).
    * ``prepared_claims``: claims prepared now (the checkpoint's).
    * ``device_present{pool, device}``: 1 while a prepared device is seen on the host, else 0.
    * ``registered``: 1 after the kubelet accepted the registration, else 0.
    """

    calls: Counter
    claims: Counter
    prepare_seconds: Histogram
    prepared_claims: Gauge
    device_present: Gauge
    registered: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> NodeMetrics:
        """Register the node plugin's metrics on ``registry``."""
        return cls(
            calls=Counter(
                "calls",
                "Kubelet calls by method and result.",
                ["method", "result"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            claims=Counter(
                "claims",
                "Claims in kubelet calls by method and result.",
                ["method", "result"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            prepare_seconds=Histogram(
                "prepare_seconds",
                "Seconds to prepare one claim, waits for the device included.",
                namespace=NAMESPACE,
                registry=registry,
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            ),
            prepared_claims=Gauge(
                "prepared_claims",
                "Claims prepared on this node.",
                namespace=NAMESPACE,
                registry=registry,
            ),
            device_present=Gauge(
                "device_present",
                "1 while a prepared device is seen on the host, else 0.",
                ["pool", "device"],
                namespace=NAMESPACE,
                registry=registry,
            ),
            registered=Gauge(
                "registered",
                "1 after the kubelet accepted the plugin's registration.",
                namespace=NAMESPACE,
                registry=registry,
            ),
        )
