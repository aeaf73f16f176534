"""The committed kubelet gRPC stubs (app/node/grpcapi) are what `make protos` makes from the
.proto files, and the .proto files declare the kubelet's published names: a stale or hand-edited
stub, or a renamed package, service or field, fails here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "app" / "node" / "grpcapi"


def test_generated_stubs_match_the_proto_files(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    target = tmp_path / "app" / "node" / "grpcapi"
    target.mkdir(parents=True)
    protos = sorted(API.glob("*.proto"))
    for proto in protos:
        shutil.copy(proto, target / proto.name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            "--python_out=.",
            "--pyi_out=.",
            "--grpc_python_out=.",
            *(str(p.relative_to(ROOT)) for p in protos),
        ],
        cwd=tmp_path,
        check=True,
    )
    made = sorted(p.name for p in target.iterdir() if p.suffix != ".proto")
    committed = sorted(p.name for p in API.iterdir() if "_pb2" in p.name)
    assert made == committed
    for name in made:
        assert (target / name).read_bytes() == (API / name).read_bytes(), f"{name} is stale"


def test_the_published_names() -> None:
    # kubernetes/kubernetes staging/src/k8s.io/kubelet/pkg/apis/{dra/v1,dra/v1beta1,
    # pluginregistration/v1,dra-health/v1}/api.proto
    from app.node.grpcapi import (
        dra_v1_pb2,
        dra_v1alpha4_pb2,
        dra_v1beta1_pb2,
        drahealth_v1_pb2,
        drahealth_v1alpha1_pb2,
        drahealth_v1beta1_pb2,
        pluginregistration_v1_pb2,
    )

    def service(module: object, name: str) -> str:
        return str(module.DESCRIPTOR.services_by_name[name].full_name)  # type: ignore[attr-defined]

    assert service(dra_v1_pb2, "DRAPlugin") == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert service(dra_v1beta1_pb2, "DRAPlugin") == "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    # Kubernetes 1.31: dra/v1alpha4 kept the package v1alpha3
    assert service(dra_v1alpha4_pb2, "Node") == "v1alpha3.Node"
    assert service(pluginregistration_v1_pb2, "Registration") == "pluginregistration.Registration"
    for module, package in (
        (drahealth_v1_pb2, "v1"),
        (drahealth_v1beta1_pb2, "v1beta1"),
        (drahealth_v1alpha1_pb2, "v1alpha1"),
    ):
        assert service(module, "DRAResourceHealth") == f"{package}.DRAResourceHealth"
    fields = {
        f.name: f.number
        for f in dra_v1_pb2.Device.DESCRIPTOR.fields  # type: ignore[attr-defined]
    }
    assert fields == {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    info = {f.name: f.number for f in pluginregistration_v1_pb2.PluginInfo.DESCRIPTOR.fields}
    assert info == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
