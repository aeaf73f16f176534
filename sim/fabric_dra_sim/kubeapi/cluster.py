"""Cluster profiles: what an emulated Kubernetes release serves and switches on by default.

One :class:`Profile` per supported minor (1.31, 1.34 to 1.37). A profile knows

* the resource.k8s.io versions the release can serve and the ones it serves by default
  (k8s.io/kubernetes pkg/registry/resource/rest/storage_resource.go registers the versions;
  pkg/controlplane/apiserver/options and pkg/controlplane/instance.go keep beta and alpha
  group versions off unless ``--runtime-config`` turns them on);
* the version objects are stored in (the hub every read converts from);
* the default of each DRA feature gate (k8s.io/kubernetes pkg/features/kube_features.go, the
  versioned specs: the last entry whose version is at most the release wins), which gates
  the release knows at all and which are locked to their default;
* the ``kubernetes-validate`` schema folder (``v1.<minor>.0-local-strict``; the package ships
  1.31 and 1.34 to 1.37, so every profile has its own).

1.31 is the classic-DRA release: upstream serves resource.k8s.io/v1alpha3 only with
``--runtime-config=resource.k8s.io/v1alpha3=true`` and keeps DRAControlPlaneController off.
The emulator's 1.31 profile is always used for classic DRA, so it serves v1alpha3 and turns
DRAControlPlaneController and DynamicResourceAllocation (alpha in 1.31, upstream default off)
on by default (an explicit ``DRAControlPlaneController=false`` still turns it off).
PodSchedulingContexts are served whenever v1alpha3 is: upstream registers them
without a gate check so that leftovers can be cleaned up (storage_resource.go, release-1.31).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from .context import (
    DRA_ADMIN_ACCESS,
    DRA_CONSUMABLE_CAPACITY,
    DRA_CONTROL_PLANE_CONTROLLER,
    DRA_DEVICE_BINDING_CONDITIONS,
    DRA_DEVICE_TAINTS,
    DRA_PARTITIONABLE_DEVICES,
    DRA_PRIORITIZED_LIST,
    DRA_RESOURCE_CLAIM_DEVICE_STATUS,
    Cluster,
)

# DeviceClass.spec.extendedResourceName (pkg/registry/resource/deviceclass/strategy.go).
DRA_EXTENDED_RESOURCE = "DRAExtendedResource"
# The DRA gate itself (pkg/features/kube_features.go): the emulator serves resource.k8s.io
# whatever its value; it is known so that the flags real clusters run with are accepted.
DYNAMIC_RESOURCE_ALLOCATION = "DynamicResourceAllocation"
DEFAULT_KUBERNETES_VERSION = "1.34"

# (first minor, default, locked) per gate, oldest first: kube_features.go VersionedSpecs.
# DRAControlPlaneController existed in 1.26 to 1.31 only (removed in 1.32).
_GATE_SPECS: dict[str, tuple[tuple[int, bool, bool], ...]] = {
    DRA_CONTROL_PLANE_CONTROLLER: ((26, False, False),),
    DRA_ADMIN_ACCESS: ((32, False, False), (34, True, False), (36, True, True)),
    DRA_CONSUMABLE_CAPACITY: ((34, False, False), (36, True, False)),
    DRA_DEVICE_BINDING_CONDITIONS: ((34, False, False), (36, True, False)),
    DRA_DEVICE_TAINTS: ((33, False, False), (36, True, False), (37, True, False)),
    DRA_EXTENDED_RESOURCE: ((34, False, False), (36, True, False), (37, True, True)),
    DRA_PARTITIONABLE_DEVICES: ((33, False, False), (36, True, False)),
    DRA_PRIORITIZED_LIST: (
        (33, False, False),
        (34, True, False),
        (36, True, False),
        (37, True, True),
    ),
    DRA_RESOURCE_CLAIM_DEVICE_STATUS: ((32, False, False), (33, True, False), (37, True, True)),
    # Alpha (off) to 1.31, beta (still off) from 1.32, GA (on) in 1.34, locked from 1.35.
    DYNAMIC_RESOURCE_ALLOCATION: (
        (26, False, False),
        (32, False, False),
        (34, True, False),
        (35, True, True),
    ),
}
_GATE_LAST_MINOR = {DRA_CONTROL_PLANE_CONTROLLER: 31}
# The emulator's own defaults that differ from upstream (see the module docstring).
_PROFILE_GATE_DEFAULTS: dict[int, dict[str, bool]] = {
    31: {DRA_CONTROL_PLANE_CONTROLLER: True, DYNAMIC_RESOURCE_ALLOCATION: True},
}
# k8s.io/component-base featuregate/feature_gate.go: allAlphaGate and allBetaGate switch every
# gate of that stage; the emulator's table keeps no stage per release, so it refuses them.
_ALL_STAGE_GATES = ("AllAlpha", "AllBeta")


@dataclass(frozen=True)
class Profile:
    """One Kubernetes minor release as the emulator plays it.

    ``servable``: resource.k8s.io versions the release can serve (preferred first);
    ``default_served``: the ones served without ``--runtime-config``; ``storage_version``:
    the version objects are stored in; ``gate_defaults``: every DRA gate the release knows
    and its default; ``locked``: gates locked to their default; ``schema_version``: the
    ``kubernetes-validate`` folder minor, e.g. "1.34".
    """

    minor: int
    servable: tuple[str, ...]
    default_served: tuple[str, ...]
    storage_version: str
    gate_defaults: Mapping[str, bool]
    locked: frozenset[str]

    @property
    def version(self) -> str:
        """``"1.<minor>"``."""
        return f"1.{self.minor}"

    @property
    def schema_version(self) -> str:
        """The ``kubernetes-validate`` schema folder's Kubernetes version, e.g. "1.34"."""
        return self.version


def _gates_of(minor: int) -> tuple[dict[str, bool], frozenset[str]]:
    defaults: dict[str, bool] = {}
    locked: set[str] = set()
    for gate, specs in _GATE_SPECS.items():
        if minor > _GATE_LAST_MINOR.get(gate, 99):
            continue
        known = [s for s in specs if s[0] <= minor]
        if not known:
            continue  # not yet introduced: kube-apiserver does not recognise the name
        _, default, lock = known[-1]
        defaults[gate] = default
        if lock:
            locked.add(gate)
    defaults.update(_PROFILE_GATE_DEFAULTS.get(minor, {}))
    return defaults, frozenset(locked)


def _profile(minor: int) -> Profile:
    defaults, locked = _gates_of(minor)
    if minor == 31:
        return Profile(minor, ("v1alpha3",), ("v1alpha3",), "v1alpha3", defaults, locked)
    # v1 is GA and on by default from 1.34; v1beta2 and v1beta1 are registered but listed in
    # betaAPIGroupVersionsDisabledByDefault, so only --runtime-config turns them on.
    return Profile(minor, ("v1", "v1beta2", "v1beta1"), ("v1",), "v1", defaults, locked)


PROFILES: dict[str, Profile] = {p.version: p for p in map(_profile, (31, 34, 35, 36, 37))}


def parse_version(text: str) -> str:
    """``"1.34"``, ``"v1.34"`` or ``"v1.34.2"`` -> ``"1.34"``.

    Raises ValueError (one line, listing the supported versions) for anything else or an
    unsupported minor.
    """
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?", text.strip())
    version = f"{m.group(1)}.{m.group(2)}" if m else ""
    if version not in PROFILES:
        raise ValueError(
            f"unsupported Kubernetes version {text!r}; supported: {', '.join(PROFILES)}"
        )
    return version


def git_version(text: str) -> str:
    """The ``/version`` gitVersion for ``text``: ``"1.34"`` -> ``"v1.34.0"``, ``"v1.34.2"``
    kept. Raises ValueError like :func:`parse_version`.
    """
    parse_version(text)
    parts = text.strip().lstrip("v").split(".")
    return "v" + ".".join(parts + ["0"] * (3 - len(parts)))


def profile(version: str) -> Profile:
    """The profile of ``version`` (any form :func:`parse_version` takes); ValueError if
    unsupported."""
    return PROFILES[parse_version(version)]


def resolve_gates(prof: Profile, overrides: Mapping[str, bool] | None) -> frozenset[str]:
    """The gates switched on: the profile defaults with ``overrides`` applied.

    Raises ValueError like kube-apiserver's ``--feature-gates`` parsing
    (k8s.io/component-base featuregate.SetFromMap): an unknown name is "unrecognized feature
    gate", a locked gate set away from its default "cannot set feature gate ... locked".
    """
    gates = dict(prof.gate_defaults)
    for name, value in (overrides or {}).items():
        if name in _ALL_STAGE_GATES:
            raise ValueError(
                f"feature gate {name} is not supported by the emulator; name "
                f"each gate instead (Kubernetes {prof.version} knows "
                f"{', '.join(sorted(prof.gate_defaults))})"
            )
        if name not in prof.gate_defaults:
            raise ValueError(
                f"unrecognized feature gate: {name} (Kubernetes {prof.version} "
                f"knows {', '.join(sorted(prof.gate_defaults))})"
            )
        if name in prof.locked and value != prof.gate_defaults[name]:
            raise ValueError(
                f"cannot set feature gate {name} to {str(value).lower()}, "
                f"feature is locked to {str(prof.gate_defaults[name]).lower()}"
            )
        gates[name] = bool(value)
    return frozenset(g for g, on in gates.items() if on)


def resolve_served(prof: Profile, served: Sequence[str] | None) -> tuple[str, ...]:
    """The resource.k8s.io versions to serve: ``served`` (first = preferred) or the
    profile's default. Raises ValueError for an empty list, a duplicate, or a version the
    release cannot serve.
    """
    if served is None:
        return prof.default_served
    versions = tuple(served)
    if not versions:
        raise ValueError("serve at least one resource.k8s.io version")
    if len(set(versions)) != len(versions):
        raise ValueError(f"resource.k8s.io versions listed twice: {', '.join(versions)}")
    bad = [v for v in versions if v not in prof.servable]
    if bad:
        raise ValueError(
            f"Kubernetes {prof.version} cannot serve resource.k8s.io "
            f"{', '.join(bad)}; it serves {', '.join(prof.servable)}"
        )
    return versions


def build_cluster(version: str, overrides: Mapping[str, bool] | None = None) -> Cluster:
    """The :class:`Cluster` of ``version`` with gate ``overrides``; ValueError as above."""
    prof = profile(version)
    return Cluster(prof.minor, resolve_gates(prof, overrides))


def parse_feature_gates(text: str) -> dict[str, bool]:
    """``"A=true,B=false"`` -> ``{"A": True, "B": False}`` (kube-apiserver's
    ``--feature-gates`` syntax). Raises ValueError for a malformed pair or value.
    """
    out: dict[str, bool] = {}
    for item in _items(text.split(",")):
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip().lower()
        if not eq or not name:
            raise ValueError(f"missing bool value for feature gate {item!r} (use Name=true)")
        if value not in ("true", "false"):
            raise ValueError(
                f"invalid value of {name}={value}, err: strconv.ParseBool: "
                f"parsing {value!r}: invalid syntax"
            )
        out[name] = value == "true"
    return out


def _items(parts: Iterable[str]) -> list[str]:
    return [p.strip() for p in parts if p.strip()]


@cache
def known_gates(minor: int) -> frozenset[str]:
    """The DRA gates Kubernetes ``1.<minor>`` knows (introduced and not yet removed)."""
    return frozenset(_gates_of(minor)[0])


def all_gates_on(version: str = DEFAULT_KUBERNETES_VERSION) -> dict[str, bool]:
    """Overrides that switch on every DRA gate ``version`` knows, alpha ones included
    (``{"DRADeviceTaints": True, ...}``), for tests and demos that exercise every field.
    Gates locked to their default are left out. Raises ValueError for an unsupported
    version.
    """
    prof = profile(version)
    return {gate: True for gate in sorted(prof.gate_defaults) if gate not in prof.locked}
