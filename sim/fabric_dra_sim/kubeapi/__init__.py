"""A Kubernetes API emulator for tests and demos: resource.k8s.io, core and coordination
objects over plain HTTP, faithful enough for the real kubernetes-asyncio client.
"""

from .cli import cli
from .emulator import KubeEmulator
from .errors import StatusError
from .faults import RequestRecord
from .rbac import RbacPolicy

__all__ = ["KubeEmulator", "RbacPolicy", "RequestRecord", "StatusError", "cli"]
