"""``fabric-dra nodes``: which fabric host each Kubernetes node is, and which pools it reaches.

The pure part (:func:`node_selector_matches`, :func:`build_report`) matches the pools' node
selectors against node labels with the core NodeSelector rules and builds the report; the
command gathers Nodes from the API server and hosts and devices from the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import click
from kubernetes_asyncio.client import CoreV1Api
from sqlalchemy.exc import SQLAlchemyError

from app.commands.common import Settings, no_schema, run, settings_options
from app.commands.output import Format, output_option, structured, table
from app.config import redact_url
from app.db import migrate
from app.db.engine import Database, check_usable, missing_sqlite_file, unusable
from app.hostmap import (
    HOST_ID,
    SERIAL,
    SHORT_HOSTNAME,
    Ambiguity,
    HostIndex,
    HostRef,
    ambiguities,
    ambiguity_for_node,
    host_for_node,
)
from app.inventory.queries import host_refs, pool_devices
from app.jsontypes import JsonDict
from app.kube.client import call_json, connect
from app.kube.errors import KubeError
from app.kube.factory import kube_client_settings
from app.pools import DesiredPool, PoolConfig, desired_pools

_REQUEST_TIMEOUT_S = 15.0


# --------------------------------------------------------------------------- pure part
def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def requirement_matches(requirement: Mapping[str, Any], values_by_key: Mapping[str, str]) -> bool:
    """Whether one NodeSelectorRequirement holds for ``values_by_key`` (labels, or fields).

    Operators (k8s.io/component-helpers scheduling/corev1/nodeaffinity, k8s.io/apimachinery
    labels.Selector): ``In`` / ``NotIn`` (a missing key is "not in"), ``Exists`` /
    ``DoesNotExist``, ``Gt`` / ``Lt`` (one integer value, compared with the label parsed as an
    integer; a missing or non-integer label does not match). An unknown operator matches
    nothing (the API server would have refused it).
    """
    key = str(requirement.get("key") or "")
    operator = requirement.get("operator")
    values = [str(v) for v in requirement.get("values") or []]
    present = key in values_by_key
    value = values_by_key.get(key)
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        if not present or value is None or len(values) != 1:
            return False
        have, bound = _integer(value), _integer(values[0])
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str], node_name: str) -> bool:
    """Whether a NodeSelectorTerm holds: every matchExpression on the labels and every
    matchField (only ``metadata.name`` exists) on the node. An empty term matches nothing
    (core/v1 NodeSelectorTerm)."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    field_values = {"metadata.name": node_name}
    return all(requirement_matches(e, labels) for e in expressions) and all(
        requirement_matches(f, field_values) for f in fields
    )


def node_selector_matches(
    selector: Mapping[str, Any], labels: Mapping[str, str], node_name: str
) -> bool:
    """Whether a core NodeSelector selects the node: any of its terms matches (the terms are
    ORed). A selector without terms selects no node."""
    return any(term_matches(t, labels, node_name) for t in selector.get("nodeSelectorTerms") or [])


@dataclass(frozen=True)
class NodeRow:
    """One node: its host id (None when no host matches), the pools it can reach, and why it
    maps to no host when the reason is known (an identity shared by several hosts)."""

    node: str
    host: str | None
    pools: tuple[str, ...]
    reason: str | None = None


@dataclass(frozen=True)
class NodesReport:
    """Nodes, their hosts and pools, and what does not fit together.

    Attributes:
        rows: one per node, by name.
        unmapped_nodes: nodes that map to no host.
        unmatched_hosts: hosts no node maps to.
        unreachable_pools: pools whose node selector matches no node.
        pool_labels: pool name -> the node labels its selector asks for (``key=value``,
            one per ``In`` expression with a single value), so people know how to label nodes.
        ambiguous: identities shared by several hosts that the match rule uses; they map no
            node (see :func:`app.hostmap.ambiguities`).
    """

    rows: tuple[NodeRow, ...]
    unmapped_nodes: tuple[str, ...]
    unmatched_hosts: tuple[str, ...]
    unreachable_pools: tuple[str, ...]
    pool_labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    ambiguous: tuple[Ambiguity, ...] = ()

    @property
    def warnings(self) -> list[str]:
        """One line per problem."""
        reasons = {r.node: r.reason for r in self.rows if r.reason}
        # A host whose full name (or id) is shared cannot be mapped at all: its warning names
        # it, and "is not a node of this cluster" would be a guess. A shared short name leaves
        # the full name to match by.
        shared = {h for a in self.ambiguous if a.key != SHORT_HOSTNAME for h in a.hosts}
        return (
            [f"{a.message}: {a.hint}" for a in self.ambiguous]
            + [
                f"node {n} maps to no fabric host" + (f": {reasons[n]}" if n in reasons else "")
                for n in self.unmapped_nodes
            ]
            + [
                f"host {h} is not a node of this cluster"
                for h in self.unmatched_hosts
                if h not in shared
            ]
            + [
                f"pool {p} is reachable from no node; label its nodes "
                + (" ".join(self.pool_labels.get(p, ())) or "as its node selector asks")
                for p in self.unreachable_pools
            ]
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "nodes": [
                {"node": r.node, "host": r.host, "pools": list(r.pools), "reason": r.reason}
                for r in self.rows
            ],
            "unmapped_nodes": list(self.unmapped_nodes),
            "unmatched_hosts": list(self.unmatched_hosts),
            "unreachable_pools": list(self.unreachable_pools),
            "pool_labels": {p: list(labels) for p, labels in self.pool_labels.items()},
            "ambiguous_hosts": [a.to_json() for a in self.ambiguous],
            "warnings": self.warnings,
        }


def build_report(
    nodes: Sequence[Mapping[str, Any]],
    hosts: Sequence[HostRef],
    pools: Mapping[str, DesiredPool],
    match: str,
    key: str,
) -> NodesReport:
    """Map each node (core/v1 Node JSON) to a host and to the pools its labels reach.

    Args:
        nodes: Nodes as JSON dicts.
        hosts: the fabric hosts.
        pools: pool name -> desired pool (its ``node_selector`` is used).
        match, key: the host mapping rule (settings ``hosts.match`` / ``hosts.key``).

    Raises:
        ValueError: an unknown ``match``.
    """
    # The command shows the ambiguities itself; the process-wide log is for the service.
    index = HostIndex.build(hosts, report=None)
    rows: list[NodeRow] = []
    reached: set[str] = set()
    mapped_hosts: set[str] = set()
    for node in sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name") or "")):
        metadata = node.get("metadata") or {}
        name = str(metadata.get("name") or "")
        labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
        host = host_for_node(node, index, match, key)
        reason: str | None = None
        if host is not None:
            mapped_hosts.add(host)
        elif (ambiguity := ambiguity_for_node(node, index, match, key)) is not None:
            reason = ambiguity.message
        reachable = tuple(
            sorted(
                p
                for p, pool in pools.items()
                if node_selector_matches(pool.node_selector, labels, name)
            )
        )
        reached.update(reachable)
        rows.append(NodeRow(name, host, reachable, reason))
    return NodesReport(
        rows=tuple(rows),
        unmapped_nodes=tuple(r.node for r in rows if r.host is None),
        unmatched_hosts=tuple(sorted(h.host_id for h in hosts if h.host_id not in mapped_hosts)),
        unreachable_pools=tuple(sorted(p for p in pools if p not in reached)),
        pool_labels={name: _labels_asked(pool.node_selector) for name, pool in pools.items()},
        # Host names are no identity under the label, annotation and provider-id rules, and
        # serial numbers only under the serial rule.
        ambiguous=tuple(
            a
            for a in ambiguities(index, serials=match == "serial")
            if (a.key == SERIAL) == (match == "serial")
            and (match == "hostname" or a.key in (HOST_ID, SERIAL))
        ),
    )


def _labels_asked(selector: Mapping[str, Any]) -> tuple[str, ...]:
    terms = selector.get("nodeSelectorTerms") or []
    if len(terms) != 1:
        return ()
    return tuple(
        f"{e['key']}={e['values'][0]}"
        for e in terms[0].get("matchExpressions") or []
        if e.get("operator") == "In" and len(e.get("values") or []) == 1
    )


def render_table(report: NodesReport, *, wide: bool = False) -> str:
    """The report as a text table followed by its warnings; ``wide`` adds the REASON a
    node maps to no host (a shared name, say)."""
    if wide:
        lines = [
            table(
                ("NODE", "HOST", "POOLS", "REASON"),
                [(r.node, r.host, ", ".join(r.pools), r.reason) for r in report.rows],
                empty="(no nodes)",
            )
        ]
    else:
        header = ("NODE", "HOST", "POOLS")
        cells = [(r.node, r.host or "-", ", ".join(r.pools) or "-") for r in report.rows]
        widths = [max([len(header[i])] + [len(c[i]) for c in cells]) for i in range(2)]
        lines = [f"{header[0].ljust(widths[0])}  {header[1].ljust(widths[1])}  {header[2]}"]
        lines += [f"{a.ljust(widths[0])}  {b.ljust(widths[1])}  {c}" for a, b, c in cells]
        if not report.rows:
            lines.append("(no nodes)")
    warnings = report.warnings
    if warnings:
        lines.append("")
        lines.append(f"{len(warnings)} warnings:")
        lines += [f"  {w}" for w in warnings]
    return "\n".join(lines)


# --------------------------------------------------------------------------- I/O
async def _read_database(settings: Settings) -> tuple[list[HostRef], dict[str, DesiredPool]]:
    where = f"database {redact_url(settings.database.url)}"
    database = Database.connect(settings.database.url)
    try:
        missing = missing_sqlite_file(database.engine)
        if missing is not None:
            raise no_schema(settings, missing)
        await check_usable(database.engine)
        if await migrate.current(database.engine) is None:
            raise no_schema(settings)
        hosts = await host_refs(database)
        devices = await pool_devices(database)
    except (SQLAlchemyError, OSError) as err:
        raise unusable(database.engine, err) from None
    finally:
        await database.dispose()
    try:
        return hosts, desired_pools(devices, PoolConfig.from_settings(settings))
    except ValueError as err:
        raise click.ClickException(f"{where}: {err}") from None


async def _read_nodes(settings: Settings) -> list[JsonDict]:
    try:
        client = await connect(kube_client_settings(settings.kube))
    except KubeError as err:
        # The kubeconfig or the token file cannot be used (the message names which).
        raise click.ClickException(f"Kubernetes client: {err}") from None
    try:
        api = CoreV1Api(client.api)
        nodes: list[JsonDict] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": 500}
            if token:
                kwargs["_continue"] = token
            page = await call_json(
                api.list_node(
                    _preload_content=False, _request_timeout=_REQUEST_TIMEOUT_S, **kwargs
                ),
                "list Nodes",
            )
            nodes.extend(item for item in page.get("items") or [] if isinstance(item, dict))
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return nodes
    except KubeError as err:
        raise click.ClickException(f"Kubernetes API {client.host}: {err}") from None
    finally:
        await client.close()


async def _report(settings: Settings) -> NodesReport:
    hosts, pools = await _read_database(settings)
    nodes = await _read_nodes(settings)
    return build_report(nodes, hosts, pools, settings.hosts.match, settings.hosts.key)


@click.command()
@output_option
@click.option("--json", "as_json", is_flag=True, help="The same as -o json.")
@settings_options
def nodes(output: Format, as_json: bool, settings: Settings) -> None:
    """Show each Kubernetes node's fabric host and the pools it can reach, with warnings."""
    report = run(_report(settings), settings.event_loop)
    if as_json:
        output = "json"
    if output in ("json", "yaml"):
        click.echo(structured(report.to_json(), output))
    else:
        click.echo(render_table(report, wide=output == "wide"))
