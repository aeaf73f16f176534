"""``fabric-dra sim ...``: the simulators' commands.

The product's command line (:mod:`app.cli`) finds this group, and ``fabric-dra demo``, through
the ``fabric_dra.commands`` entry points of this distribution (sim/pyproject.toml).
"""

from __future__ import annotations

import click

from app.cli import LazyGroup


@click.group(
    cls=LazyGroup,
    lazy={
        "redfish": "fabric_dra_sim.redfish:cli",
        "cdim": "fabric_dra_sim.cdim:cli",
        "kube": "fabric_dra_sim.kubeapi:cli",
        "scheduler": "fabric_dra_sim.scheduler:cli",
        "claim-controller": "fabric_dra_sim.scheduler:claim_controller_cli",
    },
)
def sim() -> None:
    """Simulators for demos and tests: a Redfish fabric manager, a NEC CDIM installation, a
    Kubernetes API, and stand-ins for kube-scheduler and the claim controller."""
