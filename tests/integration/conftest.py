"""Fixtures shared by the integration tests: the Kubernetes API emulator as a gated 1.34 cluster
with a real client on it, and Redfish simulators started on demand over real HTTP.

Fixtures:

- ``emu``: a started :class:`KubeEmulator` playing Kubernetes 1.34 with every DRA feature gate
  on (1.34 keeps device taints, binding conditions, partitionable devices and consumable
  capacity behind alpha or beta gates that are off by default; the publisher writes taints and
  binding conditions, so these tests turn them on, as a cluster using them does), and watch
  bookmarks every 0.2 s.
- ``client``: a :class:`KubeClient` connected to ``emu`` by URL, closed after the test.
- ``serve``: ``await serve(*profiles, **options)`` starts a :class:`RedfishSimulator` on
  127.0.0.1, port 0 (``spec`` defaults to ``builders.SMALL_REDFISH`` unless ``mockup_dir`` is
  given) and returns ``(simulator, url)``; every one is stopped after the test. (The Redfish
  client tests in test_fabric_redfish*.py define a ``serve`` of their own, which serves a given
  simulator's app behind a recording middleware.)
- ``http``: an ``aiohttp.ClientSession`` for raw requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from builders import SMALL_REDFISH

from app.kube.client import KubeAuthMode, KubeClient, KubeClientSettings, connect
from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cluster import all_gates_on
from fabric_dra_sim.redfish import RedfishSimulator

ServeRedfish = Callable[..., Awaitable[tuple[RedfishSimulator, str]]]


@pytest.fixture
async def emu() -> AsyncIterator[KubeEmulator]:
    """A started Kubernetes 1.34 emulator with every DRA gate on, bookmarks every 0.2 s."""
    emulator = KubeEmulator(
        kubernetes_version="1.34", feature_gates=all_gates_on("1.34"), bookmark_interval_s=0.2
    )
    await emulator.start()
    try:
        yield emulator
    finally:
        await emulator.stop()


@pytest.fixture
async def client(emu: KubeEmulator) -> AsyncIterator[KubeClient]:
    """fabric-dra's Kubernetes client on ``emu`` (mode ``url``); closed after the test."""
    kube = await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emu.url))
    try:
        yield kube
    finally:
        await kube.close()


@pytest.fixture
async def serve() -> AsyncIterator[ServeRedfish]:
    """Start Redfish simulators on 127.0.0.1, port 0; stop them all after the test."""
    running: list[RedfishSimulator] = []

    async def _serve(*profiles: str, **options: Any) -> tuple[RedfishSimulator, str]:
        options.setdefault("spec", None if "mockup_dir" in options else SMALL_REDFISH)
        sim = RedfishSimulator(profiles=profiles, **options)
        url = await sim.start()
        running.append(sim)
        return sim, url

    yield _serve
    for sim in running:
        await sim.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """An aiohttp session for raw requests; closed after the test."""
    async with aiohttp.ClientSession() as session:
        yield session
