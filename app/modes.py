"""Which allocation mode runs: structured parameters or the control-plane controller.

Rules (DESIGN.md "Two allocation modes"; DRA-REFERENCE.md "Versions" and "Classic DRA"):

* structured mode needs resource.k8s.io v1, v1beta2 or v1beta1 (preferred in that order, see
  :func:`app.kube.versions.choose_version`): Kubernetes 1.32 and later;
* the control-plane (classic DRA) mode needs v1alpha3 with the ``podschedulingcontexts``
  resource, which only Kubernetes 1.31 serves, with the DRAControlPlaneController gate on
  (classic DRA was removed in 1.32; k8s.io/kubernetes CHANGELOG-1.32);
* so no cluster serves both: ``both`` always fails, with a message saying why, and ``auto``
  runs the one mode the server supports (structured first, should a server ever offer both)
  and fails when it supports neither;
* ``structured`` and ``control-plane`` fail with a message that names what the server serves
  when the chosen mode is not served.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from app.kube.errors import KubeVersionError
from app.kube.versions import STRUCTURED_PREFERENCE, ResourceApiVersion

ModeSetting = Literal["structured", "control-plane", "both", "auto"]
MODE_SETTINGS: tuple[str, ...] = ("structured", "control-plane", "both", "auto")
POD_SCHEDULING_CONTEXTS = "podschedulingcontexts"


class ModeError(KubeVersionError):
    """The chosen mode is not served by the API server (or the setting is unknown)."""


@dataclass(frozen=True, slots=True)
class Modes:
    """The modes to run.

    Attributes:
        structured: the resource.k8s.io version of the structured mode, or None when it does
            not run.
        control_plane: True when the control-plane controller runs (on v1alpha3).
    """

    structured: ResourceApiVersion | None
    control_plane: bool

    def describe(self) -> str:
        """``structured (v1)``, ``control-plane (v1alpha3)`` or both joined by ``and``."""
        parts = []
        if self.structured is not None:
            parts.append(f"structured ({self.structured.value})")
        if self.control_plane:
            parts.append("control-plane (v1alpha3)")
        return " and ".join(parts) or "none"


def choose_modes(
    setting: str,
    served_versions: Sequence[str],
    v1alpha3_resources: Collection[str] | None = None,
) -> Modes:
    """Decide the mode from the setting and discovery.

    Args:
        setting: ``structured``, ``control-plane``, ``both`` or ``auto``.
        served_versions: resource.k8s.io versions from ``GET /apis/resource.k8s.io``.
        v1alpha3_resources: resource names from ``GET /apis/resource.k8s.io/v1alpha3`` when
            it was asked; None means "not asked": v1alpha3 then counts as serving
            PodSchedulingContexts. When given, ``podschedulingcontexts`` must be in it.

    Returns:
        :class:`Modes`, with at most one mode set.

    Raises:
        ModeError: an unknown setting, ``both`` (no Kubernetes release serves both), or a
            chosen mode the server does not serve; the message names the served versions and
            what the mode needs.
    """
    if setting not in MODE_SETTINGS:
        raise ModeError(f"controller.mode {setting!r} is not one of {', '.join(MODE_SETTINGS)}")
    served = list(served_versions)
    structured = next((v for v in STRUCTURED_PREFERENCE if v.value in served), None)
    classic = ResourceApiVersion.V1ALPHA3.value in served and (
        v1alpha3_resources is None or POD_SCHEDULING_CONTEXTS in v1alpha3_resources
    )
    shown = ", ".join(served) if served else "no version"
    needs_structured = (
        f"structured parameters need resource.k8s.io "
        f"{' or '.join(v.value for v in STRUCTURED_PREFERENCE)}"
    )
    needs_classic = (
        "the control-plane (classic DRA) mode needs resource.k8s.io/v1alpha3 with "
        "podschedulingcontexts (Kubernetes 1.31 with the DRAControlPlaneController "
        "feature gate)"
    )
    if setting == "both":
        raise ModeError(
            f"controller.mode both: no Kubernetes release serves both modes "
            f"({needs_structured}, Kubernetes 1.32 and later; {needs_classic}, "
            f"which 1.32 removed); this API server serves {shown}: use auto, "
            f"structured or control-plane"
        )
    if setting == "auto":
        if structured is None and not classic:
            raise ModeError(
                f"controller.mode auto: the API server serves {shown}; "
                f"{needs_structured}, {needs_classic}"
            )
        return Modes(structured, classic and structured is None)
    missing = []
    if setting == "structured" and structured is None:
        missing.append(needs_structured)
    if setting == "control-plane" and not classic:
        extra = (
            " (v1alpha3 is served without podschedulingcontexts: the feature gate is off)"
            if ResourceApiVersion.V1ALPHA3.value in served
            else ""
        )
        missing.append(needs_classic + extra)
    if missing:
        raise ModeError(
            f"controller.mode {setting}: the API server serves {shown}; " + "; ".join(missing)
        )
    return Modes(structured if setting == "structured" else None, setting == "control-plane")


async def discover_modes(api_client: object, setting: str) -> Modes:
    """Ask the API server (discovery) and :func:`choose_modes`.

    Args:
        api_client: a kubernetes-asyncio ``ApiClient``.
        setting: as for :func:`choose_modes`.

    Raises:
        ModeError: see :func:`choose_modes`.
        KubeError: a discovery call failed.
    """
    from kubernetes_asyncio.client import ApiClient, CustomObjectsApi

    from app.kube.client import call_json
    from app.kube.versions import GROUP, discover_served_versions

    assert isinstance(api_client, ApiClient)
    served = await discover_served_versions(api_client)
    resources: list[str] | None = None
    if ResourceApiVersion.V1ALPHA3.value in served:
        document = await call_json(
            CustomObjectsApi(api_client).get_api_resources(
                GROUP, ResourceApiVersion.V1ALPHA3.value, _preload_content=False
            ),
            f"discover {GROUP}/v1alpha3",
        )
        resources = [
            str(r.get("name")) for r in document.get("resources") or [] if isinstance(r, dict)
        ]
    return choose_modes(setting, served, resources)


__all__ = ["MODE_SETTINGS", "ModeError", "ModeSetting", "Modes", "choose_modes", "discover_modes"]
