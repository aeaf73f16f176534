"""``fabric-dra node`` as it runs in production, except that the process kills itself with
SIGKILL right after its first CDI spec write, before the checkpoint says ``prepared`` and before
the kubelet gets an answer. Run as ``python node_crash_plugin.py`` with the usual
``FABRIC_DRA_*`` environment; used by test_node_crash.py."""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import app.node.agent
from app.node import cdi
from app.node.plugin import NodePlugin


def write_then_die(directory: Path, file_name: str, spec: Mapping[str, object]) -> Path:
    path = cdi.write_spec(directory, file_name, spec)
    os.kill(os.getpid(), signal.SIGKILL)
    return path


def main() -> None:
    crashing: Any = functools.partial(NodePlugin, write_spec=write_then_die)
    app.node.agent.NodePlugin = crashing  # type: ignore[misc]
    from app.cli import main as cli

    sys.argv = ["fabric-dra", "node"]
    cli()


if __name__ == "__main__":
    main()
