"""Our client against the emulator: Warning headers of a write are logged once per message,
naming the call; a Strict write fails instead of losing the field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio.client import ResourceV1Api

from app.kube.client import (
    FIELD_VALIDATION_STRICT,
    KubeAuthMode,
    KubeClientSettings,
    WarningLog,
    call_json,
    connect,
)
from app.kube.errors import KubeBadRequest
from fabric_dra_sim.kubeapi import KubeEmulator

Builders = dict[str, Callable[..., dict[str, Any]]]


def _with_unknown(builders: Builders, name: str) -> dict[str, Any]:
    body = builders["slice"](name)
    body["spec"]["devices"][0]["colour"] = "red"
    return body


async def test_warnings_of_our_writes_are_logged_once_with_the_call(
    emulator: KubeEmulator,
    builders: Builders,
    caplog: pytest.LogCaptureFixture,
) -> None:
    warnings = WarningLog()
    async with await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emulator.url)) as kube:
        api: Any = ResourceV1Api(kube.api)
        with caplog.at_level("WARNING", logger="app.kube.client"):
            written = await call_json(
                api.create_resource_slice(_with_unknown(builders, "s1"), _preload_content=False),
                "create ResourceSlice s1",
                warnings=warnings,
            )
            await call_json(
                api.create_resource_slice(_with_unknown(builders, "s2"), _preload_content=False),
                "create ResourceSlice s2",
                warnings=warnings,
            )
    assert "colour" not in written["spec"]["devices"][0]
    assert [r.getMessage() for r in caplog.records] == [
        'create ResourceSlice s1: the API server warned: unknown field "spec.devices[0].colour"'
    ]


async def test_warnings_of_a_refused_write_are_logged_too(
    emulator: KubeEmulator,
    builders: Builders,
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = _with_unknown(builders, "s1")
    del body["spec"]["pool"]
    async with await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emulator.url)) as kube:
        api: Any = ResourceV1Api(kube.api)
        with caplog.at_level("WARNING", logger="app.kube.client"), pytest.raises(KubeBadRequest):
            await call_json(
                api.create_resource_slice(body, _preload_content=False),
                "create ResourceSlice s1",
                warnings=WarningLog(),
            )
    assert any("unknown field" in r.getMessage() for r in caplog.records)


async def test_a_strict_write_fails_instead_of_dropping_the_field(
    emulator: KubeEmulator,
    builders: Builders,
) -> None:
    async with await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=emulator.url)) as kube:
        api: Any = ResourceV1Api(kube.api)
        with pytest.raises(KubeBadRequest) as caught:
            await call_json(
                api.create_resource_slice(
                    _with_unknown(builders, "s1"),
                    field_validation=FIELD_VALIDATION_STRICT,
                    _preload_content=False,
                ),
                "create ResourceSlice s1",
            )
    assert 'unknown field "spec.devices[0].colour"' in str(caught.value)
    assert emulator.get("resource.k8s.io/v1", "ResourceSlice", "s1") is None
