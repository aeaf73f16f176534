"""An in-process fabric-dra service on a simulated cluster, with helpers to drive it."""

from __future__ import annotations

import uuid
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from reliability_driver import DRIVER, NODES, V1, Cluster, eventually, http

from app.service import Service


class Running:
    """An in-process service on a cluster, with helpers to drive and observe it."""

    def __init__(self, cluster: Cluster, service: Service) -> None:
        self.cluster = cluster
        self.service = service

    @property
    def base(self) -> str:
        """The admin endpoint's base URL."""
        return f"http://127.0.0.1:{self.service.admin_port}"

    async def metrics(self) -> str:
        """The /metrics text."""
        status, text = await http("GET", self.base + "/metrics")
        assert status == 200
        return text

    async def metric(self, name: str, **labels: str) -> float:
        """The value of one sample (0 when absent)."""
        for family in text_string_to_metric_families(await self.metrics()):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        return 0.0

    async def readyz(self) -> tuple[int, str]:
        """(status, body) of /readyz."""
        return await http("GET", self.base + "/readyz")

    async def ready(self) -> bool:
        """/readyz answers 200."""
        return (await self.readyz())[0] == 200

    def published_devices(self) -> list[str]:
        """Names of the devices in our ResourceSlices."""
        return sorted(
            d["name"]
            for s in self.cluster.emu.list(V1, "ResourceSlice")
            if s["spec"]["driver"] == DRIVER
            for d in s["spec"].get("devices", [])
        )

    def allocate(
        self,
        name: str,
        device: str,
        node: str = NODES[0],
        config: list[dict[str, Any]] | None = None,
    ) -> None:
        """Create claim ``name`` allocated ``device`` on ``node``, as the scheduler would."""
        self.cluster.create_claim(name)
        claim = self.cluster.emu.get(V1, "ResourceClaim", name, "default")
        assert claim is not None
        devices: dict[str, Any] = {
            "results": [
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": "us-east/rack-01",
                    "device": device,
                    "bindingConditions": ["FabricDeviceReady"],
                    "bindingFailureConditions": ["FabricDeviceFailed"],
                }
            ]
        }
        if config:
            devices["config"] = config
        claim["status"] = {
            "allocation": {
                "devices": devices,
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": str(uuid.uuid4())}],
        }
        self.cluster.emu.update_status(claim)

    def condition(self, name: str, type_: str) -> str | None:
        """Status of our condition ``type_`` on claim ``name`` (first device)."""
        claim = self.cluster.emu.get(V1, "ResourceClaim", name, "default") or {}
        for entry in (claim.get("status") or {}).get("devices") or []:
            for c in entry.get("conditions") or []:
                if c["type"] == type_:
                    return str(c["status"])
        return None

    def free(self, name: str) -> None:
        """Delete claim ``name`` (its allocation goes with it)."""
        self.cluster.emu.delete(V1, "ResourceClaim", name, "default")


async def start_service(cluster: Cluster, database_url: str, **extra: str) -> Running:
    """Start a service on ``cluster`` and wait for its slices and readiness."""
    service = Service(cluster.settings(database_url, **extra))
    await service.start()
    running = Running(cluster, service)
    try:
        await eventually(lambda: bool(running.published_devices()), what="published slices")
        await eventually(running.ready, what="readiness")
    except BaseException:
        await service.stop(deadline_s=5)
        raise
    return running
