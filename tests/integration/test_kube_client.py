"""Client construction and version discovery against the Kubernetes API emulator."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    ResourceV1beta1Api,
    V1Namespace,
    V1ObjectMeta,
)

from app.kube.client import JsonApiClient, KubeAuthMode, KubeClientSettings, call_json, connect
from app.kube.errors import (
    KubeError,
    KubeNotFound,
    KubeTooManyRequests,
    KubeUnauthorized,
    KubeUnavailable,
    KubeVersionError,
)
from app.kube.versions import ResourceApiVersion, discover_served_versions, discover_version
from fabric_dra_sim.kubeapi import KubeEmulator


@pytest.fixture
async def secured() -> AsyncIterator[KubeEmulator]:
    emu = KubeEmulator(token="s3cret")
    await emu.start()
    try:
        yield emu
    finally:
        await emu.stop()


async def test_bearer_token_from_a_file_and_its_rotation(
    secured: KubeEmulator, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("wrong\n")
    settings = KubeClientSettings(
        mode=KubeAuthMode.URL, url=secured.url, token_file=token, token_refresh_s=0
    )
    async with await connect(settings) as client:
        core = CoreV1Api(client.api)
        with pytest.raises(KubeUnauthorized):
            await call_json(core.list_namespace(_preload_content=False), "list namespaces")
        # The kubelet rotates the token in place; the next call reads the new one.
        token.write_text("s3cret\n")
        namespaces = await call_json(core.list_namespace(_preload_content=False), "list ns")
        assert "default" in {item["metadata"]["name"] for item in namespaces["items"]}
        assert client.host == secured.url


async def test_kubeconfig_with_a_context(secured: KubeEmulator, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "elsewhere",
                "clusters": [
                    {"name": "emu", "cluster": {"server": secured.url}},
                    {"name": "other", "cluster": {"server": "http://127.0.0.1:9"}},
                ],
                "users": [{"name": "admin", "user": {"token": "s3cret"}}],
                "contexts": [
                    {"name": "test", "context": {"cluster": "emu", "user": "admin"}},
                    {"name": "elsewhere", "context": {"cluster": "other", "user": "admin"}},
                ],
            }
        )
    )
    settings = KubeClientSettings(
        mode=KubeAuthMode.KUBECONFIG, kubeconfig=kubeconfig, context="test"
    )
    async with await connect(settings) as client:
        assert await discover_version(client.api) is ResourceApiVersion.V1


async def test_an_unreadable_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    settings = KubeClientSettings(mode=KubeAuthMode.KUBECONFIG, kubeconfig=tmp_path / "none")
    with pytest.raises(KubeError, match="kubeconfig"):
        await connect(settings)


def _release_serving(served: tuple[str, ...]) -> str:
    # Classic DRA's v1alpha3 is served by 1.31 only; v1, v1beta2 and v1beta1 by 1.34 on.
    return "1.31" if "v1alpha3" in served else "1.34"


@pytest.mark.parametrize(
    ("served", "control_plane", "expected"),
    [
        (("v1", "v1beta2", "v1beta1"), False, ResourceApiVersion.V1),
        (("v1beta2", "v1beta1"), False, ResourceApiVersion.V1BETA2),
        (("v1beta1",), False, ResourceApiVersion.V1BETA1),
        (("v1alpha3",), True, ResourceApiVersion.V1ALPHA3),
    ],
)
async def test_version_choice_against_served_versions(
    served: tuple[str, ...], control_plane: bool, expected: ResourceApiVersion
) -> None:
    emu = KubeEmulator(kubernetes_version=_release_serving(served), served_resource_versions=served)
    url = await emu.start()
    try:
        async with await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=url)) as client:
            assert sorted(await discover_served_versions(client.api)) == sorted(served)
            assert await discover_version(client.api, control_plane=control_plane) is expected
    finally:
        await emu.stop()


@pytest.mark.parametrize(
    ("served", "control_plane", "message"),
    [
        (("v1alpha3",), False, "serves v1alpha3; structured parameters needs v1 or v1beta2"),
        (("v1",), True, "serves v1; the control-plane"),
    ],
)
async def test_no_fitting_version_names_what_is_served(
    served: tuple[str, ...], control_plane: bool, message: str
) -> None:
    emu = KubeEmulator(kubernetes_version=_release_serving(served), served_resource_versions=served)
    url = await emu.start()
    try:
        async with await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=url)) as client:
            with pytest.raises(KubeVersionError, match=message):
                await discover_version(client.api, control_plane=control_plane)
    finally:
        await emu.stop()


async def test_typed_errors_carry_retry_after() -> None:
    emu = KubeEmulator(served_resource_versions=("v1beta1",))
    url = await emu.start()
    try:
        async with await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=url)) as client:
            api = ResourceV1beta1Api(client.api)
            emu.fail_next(1, method="GET", path_regex="resourceslices", status=429, retry_after=2)
            with pytest.raises(KubeTooManyRequests) as caught:
                await call_json(
                    api.read_resource_slice("x", _preload_content=False), "read slice x"
                )
            assert caught.value.retry_after == 2.0
            assert caught.value.retryable
            with pytest.raises(KubeNotFound, match="read slice x: HTTP 404 NotFound"):
                await call_json(
                    api.read_resource_slice("x", _preload_content=False), "read slice x"
                )
            emu.fail_next(1, method="GET", path_regex=r"^/apis/resource\.k8s\.io/?$", status=503)
            with pytest.raises(KubeUnavailable, match=r"discover resource\.k8s\.io: HTTP 503"):
                await discover_version(client.api)
    finally:
        await emu.stop()


async def test_the_proxy_is_taken_from_the_environment_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    client = await connect(
        KubeClientSettings(mode=KubeAuthMode.URL, url="https://api.example:6443")
    )
    try:
        rest = client.api.rest_client
        assert rest.proxy == "http://proxy.example:3128"
        assert rest.proxy_headers["Proxy-Authorization"].startswith("Basic ")
        # No lookup (and no thread hop) per request any more.
        assert rest.pool_manager._trust_env is False
    finally:
        await client.close()
    monkeypatch.setenv("NO_PROXY", "api.example")
    client = await connect(
        KubeClientSettings(mode=KubeAuthMode.URL, url="https://api.example:6443")
    )
    try:
        assert not client.api.rest_client.proxy
    finally:
        await client.close()


async def test_requests_go_through_the_proxy_named_at_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A plain-HTTP "proxy" that is the emulator itself: an absolute-form request line is
    # served like any other, so the request arriving proves it went through the proxy.
    emu = KubeEmulator()
    url = await emu.start()
    try:
        monkeypatch.setenv("HTTP_PROXY", url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        async with await connect(
            KubeClientSettings(mode=KubeAuthMode.URL, url="http://kube.invalid:6443")
        ) as client:
            body = await call_json(
                CoreV1Api(client.api).list_node(_preload_content=False), "list Node"
            )
            assert body["kind"] == "NodeList"
    finally:
        await emu.stop()


async def test_json_bodies_are_sent_as_they_are_and_models_still_converted() -> None:
    emu = KubeEmulator()
    url = await emu.start()
    try:
        async with await connect(KubeClientSettings(mode=KubeAuthMode.URL, url=url)) as client:
            assert isinstance(client.api, JsonApiClient)
            body = {"metadata": {"name": "a", "labels": {"k": "v"}}}
            # A JSON body is not copied on its way out.
            assert client.api.sanitize_for_serialization(body) is body
            core = CoreV1Api(client.api)
            created = await call_json(
                core.create_namespace(body, _preload_content=False), "create Namespace a"
            )
            assert created["metadata"]["labels"]["k"] == "v"
            # A model object still goes through the library's conversion.
            model = V1Namespace(metadata=V1ObjectMeta(name="b", labels={"k": "w"}))
            created = await call_json(
                core.create_namespace(model, _preload_content=False), "create Namespace b"
            )
            assert created["metadata"]["labels"]["k"] == "w"
            # A dict holding what is not JSON is refused before anything is sent.
            bad: Any = {"metadata": {"name": "c", "labels": {"at": dt.datetime(2026, 1, 1)}}}
            with pytest.raises(KubeError, match="create Namespace c") as caught:
                await call_json(
                    core.create_namespace(bad, _preload_content=False), "create Namespace c"
                )
            assert not caught.value.retryable
            with pytest.raises(KubeNotFound):
                await call_json(
                    core.read_namespace("c", _preload_content=False), "read Namespace c"
                )
    finally:
        await emu.stop()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), _JSON, max_size=5))
def test_a_json_body_is_what_the_library_would_have_sent(body: dict[str, object]) -> None:
    ours = JsonApiClient.__new__(JsonApiClient)
    assert ours.sanitize_for_serialization(body) == ApiClient.sanitize_for_serialization(ours, body)
