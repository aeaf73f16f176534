"""Kubernetes client settings from fabric-dra's settings."""

from __future__ import annotations

import dataclasses
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
        timeout = kube.request_timeout_seconds
        if kube.mode == "in-cluster":
            return dataclasses.replace(
                KubeClientSettings.in_cluster(os.environ if environ is None else environ),
                request_timeout_s=timeout,
            )
        if kube.mode == "kubeconfig":
            return KubeClientSettings(
                mode=KubeAuthMode.KUBECONFIG,
                kubeconfig=kube.kubeconfig,
                context=kube.context,
                request_timeout_s=timeout,
            )
        return KubeClientSettings(
            mode=KubeAuthMode.URL,
            url=kube.url,
            token_file=kube.token_file,
            ca_file=kube.ca_bundle,
            verify_tls=kube.tls_verify,
            request_timeout_s=timeout,
        )
    except (KubeError, ValueError) as err:
        raise ConfigError(f"settings kube: {err}") from None
