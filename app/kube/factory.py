"""Kubernetes client settings from fabric-dra's settings."""

from __future__ import annotations

import os
from collections.abc import Mapping

from app.config import ConfigError, KubeSettings
from app.kube.client import KubeAuthMode, KubeClientSettings
from app.kube.errors import KubeError


def kube_client_settings(
    kube: KubeSettings, environ: Mapping[str, str] | None = None
) -> KubeClientSettings:
    """The :class:`KubeClientSettings` that ``kube`` describes.

    Raises:
        ConfigError: in-cluster mode outside a pod, or an inconsistent combination.
    """
    try:
        if kube.mode == "in-cluster":
            return KubeClientSettings.in_cluster(os.environ if environ is None else environ)
        if kube.mode == "kubeconfig":
            return KubeClientSettings(
                mode=KubeAuthMode.KUBECONFIG, kubeconfig=kube.kubeconfig, context=kube.context
            )
        return KubeClientSettings(
            mode=KubeAuthMode.URL,
            url=kube.url,
            token_file=kube.token_file,
            ca_file=kube.ca_bundle,
            verify_tls=kube.tls_verify,
        )
    except (KubeError, ValueError) as err:
        raise ConfigError(f"settings kube: {err}") from None
