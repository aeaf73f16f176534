"""Serving the admin app from the running service: the :class:`AdminContext` the service
hands over, and the live answers behind it (claim view, what-if, publisher status)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from aiohttp import web

from app.admin.actions import DatabaseActions
from app.admin.app import serve
from app.admin.context import AdminContext, Check
from app.allocator import Allocator, device_class_from_json, gather_pools, node_from_json, what_if
from app.config import read_secret
from app.inventory.queries import pool_devices
from app.journal import Journal
from app.kube.client import call_json
from app.kube.versions import device_class_from_wire, resource_api
from app.pools import PoolConfig, desired_pools, resource_slice_spec

if TYPE_CHECKING:
    from app.service import Service


async def start_admin(service: Service) -> web.AppRunner:
    """Start the admin HTTP server on ``admin.host``:``admin.port`` for ``service``.

    The bound port is stored in ``service.admin_port`` (useful with port 0).

    Raises:
        ConfigError: the admin token file cannot be read.
        OSError: the address is in use or cannot be bound.
    """
    settings = service.settings
    assert service.backend is not None
    token = (read_secret(settings.admin.token_file, "admin.token_file")
             if settings.admin.token_file else None)
    pool_config = PoolConfig.from_settings(settings)
    allocator = Allocator()

    async def readiness() -> list[Check]:
        return [Check(n, ok, m) for n, ok, m in await service.readiness_checks()]

    async def claim_view(namespace: str, name: str) -> dict[str, Any] | None:
        leading = service.leading
        if leading is None or leading.claims is None:
            return None
        reconciler = leading.claims
        claim = reconciler.claims.get(name, namespace)
        errors = [
            {"at": e.at.isoformat(), "message": e.message}
            for e in reconciler.recent_errors if e.claim == f"{namespace}/{name}"
        ]
        return {"claim": claim, "errors": errors}

    def publisher_status() -> dict[str, Any]:
        leading = service.leading
        if leading is None or not leading.publishers:
            return {}
        publisher = (leading.publishers.get(service.version) if service.version else None) or \
            next(iter(leading.publishers.values()))
        pools = publisher.status().to_json().get("pools") or {}
        return dict(pools) if isinstance(pools, dict) else {
            str(p.get("name")): p for p in pools if isinstance(p, dict)
        }

    async def ask_what_if(spec: dict[str, Any]) -> dict[str, Any]:
        return await _what_if(service, allocator, spec)

    actions = DatabaseActions(service.db, Journal(service.db), service.backend, pool_config,
                              on_change=service.request_publish)
    context = AdminContext(
        db=service.db,
        registry=service.metrics.registry,
        health=lambda: [Check(n, ok, m) for n, ok, m in service.health_checks()],
        readiness=readiness,
        status=service.status,
        actions=actions,
        driver_name=settings.driver_name,
        claim_view=claim_view,
        publisher_status=publisher_status,
        what_if=ask_what_if if service.kube is not None else None,
        token=token,
        require_token_for_reads=settings.admin.require_token_for_reads,
        max_request_bytes=settings.admin.max_request_bytes,
        pool_config=pool_config,
    )
    runner = await serve(context, settings.admin.host, settings.admin.port)
    address = runner.addresses[0] if runner.addresses else None
    service.admin_port = address[1] if isinstance(address, tuple) else settings.admin.port
    return runner


async def _what_if(service: Service, allocator: Allocator, spec: dict[str, Any]) -> dict[str, Any]:
    """Which nodes and pools could satisfy ``spec`` now: the allocator over the pools as we
    publish them, the API server's DeviceClasses and Nodes, and the devices reserved now."""
    assert service.kube is not None
    settings = service.settings
    version = service.version
    classes = {}
    if version is not None:
        body = await call_json(resource_api(service.kube.api, version).list_device_class(
            _preload_content=False), "list DeviceClasses")
        for item in body.get("items") or []:
            parsed = device_class_from_json(device_class_from_wire(item, version))
            classes[parsed.name] = parsed
    nodes = [node_from_json(n) for n in await service.list_nodes()]
    pools = desired_pools(await pool_devices(service.db), PoolConfig.from_settings(settings))
    slices = [
        {"spec": resource_slice_spec(settings.driver_name, pool, content, 0)}
        for pool in pools.values() for content in pool.slices
    ]
    in_use = {
        (settings.driver_name, r.pool, r.device_name)
        for r in await Journal(service.db).active()
    }
    answers = what_if(spec, classes, gather_pools(slices), in_use, nodes, allocator)
    return {"nodes": [_answer_json(a) for a in answers]}


def _answer_json(answer: Any) -> dict[str, Any]:
    data = {
        "node": answer.node,
        "satisfiable": answer.satisfiable,
        "pools": list(answer.pools),
        "allocation": answer.allocation,
    }
    if answer.failure is not None:
        failure = dataclasses.asdict(answer.failure)
        failure["requests"] = [r.summary() for r in answer.failure.requests]
        data["failure"] = failure
    return data
