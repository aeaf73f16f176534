"""A Redfish fabric manager simulator: CompositionService, Systems, sessions, tasks and faults.

It serves either a generated inventory (:class:`InventorySpec`, reproducible by seed) or a
DMTF mockup folder, over real HTTP (aiohttp), and attaches and detaches ResourceBlocks to
ComputerSystems the two ways DMTF's composability white paper (DSP2050) describes: ``PATCH``
of ``Links.ResourceBlocks`` on the System and the ``ComputerSystem.AddResourceBlock`` /
``RemoveResourceBlock`` actions. Tests, the demo and docker-compose use it; the controller
never imports it.

Behaviour a client can rely on (DSP0266, the Redfish specification, unless said otherwise):

* Authentication (``auth``): ``any`` accepts a session token (``X-Auth-Token``) or HTTP Basic;
  ``session`` only tokens; ``basic`` only Basic (session login then answers 405); ``none``
  needs nothing. ``/redfish``, the service root, ``/redfish/v1/odata``, ``$metadata`` and
  ``POST .../Sessions`` are open. Anything else without valid credentials gets 401
  ``NoValidSession``. Sessions do not time out.
* ETags: every resource has an ``ETag`` header and ``@odata.etag`` (a hash of its content).
  ``If-Match`` on PATCH and on the actions is honoured (412 ``PreconditionFailed``); with
  ``require_if_match=True`` a PATCH without it gets 428 ``PreconditionRequired``. Actions may
  carry ``ResourceBlockETag`` / ``ComputerSystemETag`` (412 on mismatch).
  ``If-None-Match`` on GET gives 304.
* Attach/detach outcomes: a change 200; re-attaching a block the System already holds, or
  removing one it does not hold, is a no-op 200 (``NoOperation``); a block held by another
  System (and not shareable with room left) 409 ``ResourceInUse``; an unknown block or System
  404 ``ResourceNotFound``. The PATCH answers the System, the actions a message body.
* ``task_mode``: writes answer 202 with ``Location`` (a task monitor) and ``Retry-After``.
  The monitor (or the task) answers 202 ``task_polls`` times; the next read runs the
  operation and answers its final status and body, as do later reads. Request checks
  (JSON, body shape, ETags) happen at once; the state checks (404 block, 409) when the
  operation runs.
* Collections are paged when ``page_size`` is set: ``$skip``/``$top`` and
  ``Members@odata.nextLink``; ``Members@odata.count`` is the full count. With ``expand``,
  ``$expand=.`` and ``$expand=.($levels=N)`` (N up to 3) are offered too (and advertised in
  ``ProtocolFeaturesSupported.ExpandQuery``): every reference outside ``Links`` is replaced by
  the resource it names, N levels deep, a page of a collection at a time; the next-page link
  keeps the ``$expand``. Expanded resources do not advance tasks or flap health, and an
  expanded answer has no ETag (nor a 304 answer). Other ``$``
  query options answer 501 ``QueryNotSupported``.
* Shareable blocks (mockups only): a block whose ``CompositionStatus`` says ``SharingCapable``
  and ``SharingEnabled`` may be held by up to ``MaxCompositions`` Systems;
  :meth:`RedfishSimulator.attachments` then names the first holder.

Test controls besides the fault knobs: :meth:`~RedfishSimulator.attach_out_of_band` and
:meth:`~RedfishSimulator.detach_out_of_band` (someone else changed the fabric; no history
entry), :meth:`~RedfishSimulator.restart` (synchronous: sessions and tasks dropped, and with
``volatile-state`` every attachment since start forgotten), ``noop_attaches`` (see
``attach-noop``) and :meth:`~RedfishSimulator.compute_block`.

Profiles
--------
``RedfishSimulator(profiles=("name", ...))`` or ``fabric-dra sim redfish --profile NAME``
(repeatable) makes the simulator behave the way real third-party Redfish composability
services do (``../shared/docs/REDFISH-REFERENCE.md``, "What a real composability service
did"). Profiles compose; no profile is the behaviour above. The definitions (a
:class:`~fabric_dra_sim.redfish_profiles.ProfileSwitches` per profile) are in
:mod:`fabric_dra_sim.redfish_profiles`. "Device block i" below is the i-th block (0-based) of the
ResourceBlocks collection as generated (one device each; a mockup's blocks in its order, its
devices the existing links of each block's Processors, Memory, Storage, Drives,
NetworkInterfaces, EthernetInterfaces and SimpleStorage).

* ``server-owned-compute``: every block reports ``ResourceBlockType: []``. Each System holds
  its own compute block ``.../ResourceBlocks/<System Id>-compute`` from the start (first in
  its ``Links.ResourceBlocks``, appended after the device blocks in the collection, Composed)
  with ``Processors/CPU0`` (``ProcessorType`` CPU), ``Memory/DIMM0`` (DDR5 DRAM, no ``CXL``)
  and ``NetworkInterfaces/NIC0``, located in the System's rack Chassis (and its region's
  zone). A PATCH of ``Links.ResourceBlocks`` leaving it out, or RemoveResourceBlock of it,
  answers 406 and changes nothing; another System asking for it gets the usual 409.
* ``message-errors``: every error body is ``{"message": "<text>"}``, nothing else.
* ``text-errors``: every error body is ``text/plain`` with the message text (it contradicts
  ``message-errors``).
* ``no-etags``: no ``ETag`` header and no ``@odata.etag`` anywhere; ``If-Match`` and
  ``require_if_match`` are ignored, ``If-None-Match`` never gives 304. Systems advertise no
  AddResourceBlock / RemoveResourceBlock and their URIs are unknown resources (404, 500 with
  ``unknown-500``): PATCH only.
* ``unknown-500``: a request for any unknown URI (resource, task monitor, action) answers 500
  ``InternalError``, not 404; an unknown block named inside a PATCH or action body is still
  404. Device blocks 0, 10, 20, ... link one more Drive, ``<block URI>/Drives/Dangling0``,
  that does not exist (``sim.dangling_uris`` lists them).
* ``placeholder-identity``: every System has HostName ``localhost``, UUID
  ``00000000-0000-0000-0000-000000000000`` and SerialNumber ``0123456789``.
* ``attach-noop``: an attach (a PATCH that would add a block, or an AddResourceBlock of a
  block not held) is checked as usual (404, 409, 406) and then answered 200 with the usual
  body (a PATCH: the System as asked for) but not made. ``sim.noop_attaches`` counts the
  attaches still to swallow (None, the profile's default: all); set it to 1 to swallow only
  the next one.
* ``double-quoted-etag``: the ``ETag`` header is ``""abc""`` while ``@odata.etag`` is
  ``"abc"``; ``If-Match`` (and the action ETag parameters, ``If-None-Match``) matches when it is
  ``"abc"`` or ``""abc""`` (or ``*``); anything else, ``W/"abc"`` included, is 412.
* ``task-200-body`` (with ``task_mode``): the monitor answers 200 with the Task body
  (``TaskState`` Running, ``PercentComplete``) while the task runs, and 200 with the Task in
  its final state (``TaskState`` Completed, or Exception for a refused change) when done.
* ``task-killed`` (with ``task_mode``): every task ends ``TaskState`` Killed, ``TaskStatus``
  Critical, one ``TaskEvent.1.0.TaskAborted`` message; the change is not made and the monitor
  answers 200 with that Task.
* ``task-purged`` (with ``task_mode``): the change is made when the task runs, and the Task
  and its monitor vanish at once: the read that ran it already answers as an unknown URI (404,
  500 with ``unknown-500``).
* ``volatile-state``: :meth:`~RedfishSimulator.restart` also forgets every attachment since
  start, through the API or out of band; each System goes back to its initial blocks.
* ``null-health``: device i gets ``Status`` ``{"Health": null, "State": "Enabled"}`` when
  ``i % 6 == 0``, ``{"Health": "", "State": ""}`` when 1, ``{"State": null}`` when 2, none
  when 3, ``{"Health": "Degraded", "State": "Enabled"}`` when 4 and keeps OK when 5; its block
  gets the same Status (``Health`` null for the Degraded one).
* ``real-service``: ``server-owned-compute``, ``message-errors``, ``no-etags``,
  ``unknown-500``, ``placeholder-identity`` and ``volatile-state`` together.

With a mockup folder every profile applies as written (a mockup System's compute block lives in
its first ``Links.Chassis`` if it has one, in no zone; "device i" counts every device of every
block, so one block may hold several variants of ``null-health`` and show the last). Not
modelled from the real service: broken session login (201 without a token), a
``CompositionState`` that never changes, and a Chassis without Location contained by itself.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import gc
import json
import logging
import random
import re
import secrets
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import click
from aiohttp import web

from app import aio
from app.commands.params import FiniteFloatRange
from fabric_dra_sim.listen import listen
from fabric_dra_sim.redfish_events import (
    EVENT_SERVICE,
    SSE_URI,
    SUBSCRIPTIONS,
    EventHub,
    FilterError,
    event_service,
    subscriptions,
)
from fabric_dra_sim.redfish_profiles import (
    PROFILE_NAMES,
    PROFILES,
    ProfileSwitches,
    add_compute_blocks,
    add_dangling_drives,
    blank_health,
    compute_block_uri,
    needs_tasks,
    placeholder_identities,
    remove_block_actions,
    resolve_profiles,
)
from fabric_dra_sim.redfish_state import (
    FabricState,
    RedfishError,
    Result,
    error_key_for,
    etag_matches,
    not_found,
    parse_block_action,
    parse_links_patch,
)
from fabric_dra_sim.redfish_tree import (
    BLOCKS,
    ROOT,
    SESSION_SERVICE,
    SESSIONS,
    TASK_MONITORS,
    TASK_SERVICE,
    TASKS,
    InventorySpec,
    JsonObject,
    Tree,
    TreeBuilder,
    collection,
    error_body,
    link,
    load_mockup,
    message,
    metadata_document,
    normalise,
    odata_service_document,
    status,
)

__all__ = [
    "PROFILES",
    "PROFILE_NAMES",
    "Faults",
    "InventorySpec",
    "ProfileSwitches",
    "RedfishSimulator",
    "cli",
]

log = logging.getLogger(__name__)
# The benchmark control (--control): not Redfish, and served only when asked for.
CONTROL_HEALTH = "/_sim/health"

AuthMode = Literal["any", "session", "basic", "none"]
MAX_EXPAND_LEVELS = 3
_EXPAND_RE = re.compile(r"\.(?:\(\$levels=(?P<levels>[0-9]+)\))?")
_ACTION_RE = re.compile(
    r"^(?P<system>.+)/Actions/ComputerSystem\.(?P<verb>Add|Remove)ResourceBlock$"
)


@dataclass
class Faults:
    """Fault knobs, all off by default; change the fields at run time through ``sim.faults``.

    Attributes:
        latency_s: seconds added before every answer.
        error_rate: probability (0..1) that a request is answered with ``error_status`` and a
            Redfish error body instead of being served.
        error_status: the HTTP status of those errors.
        drop_rate: probability that the connection is closed without any answer.
        flap_health_rate: probability that a GET of a resource with ``Status.Health`` flips
            its stored health (OK becomes Critical, anything else OK) before answering.
    """

    latency_s: float = 0.0
    error_rate: float = 0.0
    error_status: int = 503
    drop_rate: float = 0.0
    flap_health_rate: float = 0.0


@dataclass
class _FailRule:
    remaining: int
    method: str
    path_prefix: str
    status: int
    body: str | None


@dataclass
class _Task:
    task_id: str
    run: Callable[[], Result]
    polls: int = 0
    result: Result | None = None
    killed: bool = False


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


class RedfishSimulator:
    """A Redfish CompositionService over HTTP, with attach/detach, tasks and fault knobs.

    Args:
        spec: generate this inventory (default :class:`InventorySpec()` when neither ``spec``
            nor ``mockup_dir`` is given).
        mockup_dir: serve this DMTF mockup folder instead (``<dir>/redfish/v1/...``).
        username, password: the one account.
        auth: ``any``, ``session``, ``basic`` or ``none`` (see the module docstring).
        task_mode: writes answer 202 with a task monitor.
        task_polls: how many monitor reads answer 202 before the operation runs.
        page_size: page collections with this many members per page (None: no paging).
        expand: offer ``$expand=.`` with ``$levels`` up to :data:`MAX_EXPAND_LEVELS`.
        offer_actions: advertise and accept the AddResourceBlock / RemoveResourceBlock actions
            on generated Systems (mockup Systems keep what their files advertise).
        faults: the fault knobs (a new :class:`Faults` when None).
        require_if_match: PATCH without ``If-Match`` answers 428.
        retry_after_s: the ``Retry-After`` header of task answers, in seconds.
        profiles: names of behaviour profiles to apply (see the module docstring and
            :data:`fabric_dra_sim.redfish_profiles.PROFILES`); they compose.

    Attributes:
        profiles: the profile names given.
        switches: the merged :class:`ProfileSwitches` the simulator obeys.
        dangling_uris: the Drive URIs ``unknown-500`` links but does not serve.
        faults: the fault knobs; ``noop_attaches`` (a property) is the ``attach-noop`` one.

    Raises:
        ValueError: both ``spec`` and ``mockup_dir`` given, a bad spec, an unreadable
            mockup folder, an unknown profile or two profiles that contradict each other.
    """

    def __init__(
        self,
        *,
        spec: InventorySpec | None = None,
        mockup_dir: Path | None = None,
        username: str = "admin",
        password: str = "password",
        auth: AuthMode = "any",
        task_mode: bool = False,
        task_polls: int = 2,
        page_size: int | None = None,
        offer_actions: bool = True,
        faults: Faults | None = None,
        require_if_match: bool = False,
        retry_after_s: int = 0,
        expand: bool = False,
        profiles: Iterable[str] = (),
    ) -> None:
        if spec is not None and mockup_dir is not None:
            raise ValueError("give either an InventorySpec or a mockup folder, not both")
        if auth not in ("any", "session", "basic", "none"):
            raise ValueError(f"auth must be any, session, basic or none, got {auth!r}")
        if page_size is not None and page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if task_polls < 0:
            raise ValueError(f"task_polls must be >= 0, got {task_polls}")
        self.profiles: tuple[str, ...] = (
            (profiles,) if isinstance(profiles, str) else tuple(profiles)
        )
        self.switches = resolve_profiles(self.profiles)
        self.username = username
        self.password = password
        self.auth: AuthMode = auth
        # The task profiles are about tasks: they answer writes with task monitors.
        self.task_mode = task_mode or needs_tasks(self.switches)
        self.task_polls = task_polls
        self.page_size = page_size
        self.offer_actions = offer_actions
        self.faults = faults or Faults()
        self.require_if_match = require_if_match
        self.retry_after_s = retry_after_s
        self.expand = expand
        builder: TreeBuilder | None = None
        if mockup_dir is not None:
            self.tree: Tree = load_mockup(Path(mockup_dir))
            seed = 0
        else:
            builder = TreeBuilder(spec or InventorySpec())
            self.tree = builder.build()
            seed = builder.spec.seed
        self._rng = random.Random(seed)
        self.dangling_uris: list[str] = []
        owned = self._apply_profile_edits()
        self._add_service_resources()
        if expand:
            features = self.tree[ROOT].setdefault("ProtocolFeaturesSupported", {})
            features["ExpandQuery"] = {
                "ExpandAll": False,
                "Levels": True,
                "Links": False,
                "NoLinks": True,
                "MaxLevels": MAX_EXPAND_LEVELS,
            }
        self.state = FabricState(self.tree, builder)
        #: Server-sent events of every change (redfish_events; faults in events.faults).
        self.events = EventHub()
        self.state.on_change = self.events.emit
        self.state.owned = owned
        self.state.etags = self.switches.etag_style != "none"
        self.state.noop_attaches = None if self.switches.attach_noop else 0
        if builder is not None and not offer_actions:
            for uri in self.state.systems:
                self.tree[uri].pop("Actions", None)
        self._sessions: dict[str, str] = {}  # token -> session URI
        self._session_seq = 0
        self._tasks: dict[str, _Task] = {}  # task id -> task
        self._task_seq = 0
        self._fail_rules: list[_FailRule] = []
        self._runner: web.AppRunner | None = None
        #: Serve ``POST /_sim/health`` (a benchmark's way to change health from outside).
        self.control = False

    # ----- setup -----------------------------------------------------------------------------

    def _apply_profile_edits(self) -> dict[str, str]:
        """Edit the tree once for the profiles; the owned (compute) blocks by URI -> System."""
        switches = self.switches
        # The device blocks, before any compute block joins the collection.
        blocks = [
            normalise(m["@odata.id"])
            for m in self.tree.get(BLOCKS, {}).get("Members", [])
            if isinstance(m, dict) and isinstance(m.get("@odata.id"), str)
        ]
        blocks = [b for b in dict.fromkeys(blocks) if b in self.tree]
        if switches.null_health:
            blank_health(self.tree, blocks)
        if switches.dangling_drives:
            self.dangling_uris = add_dangling_drives(self.tree, blocks)
        if switches.placeholder_identity:
            placeholder_identities(self.tree)
        if not switches.block_actions:
            remove_block_actions(self.tree)
        return add_compute_blocks(self.tree) if switches.server_owned_compute else {}

    def _add_service_resources(self) -> None:
        # Sessions and tasks are live state: a mockup's recorded session is replaced by an
        # empty collection, and a TaskService is added when the mockup has none.
        for uri in [u for u in self.tree if u.startswith(SESSIONS + "/")]:
            del self.tree[uri]
        self.tree[SESSIONS] = collection(SESSIONS, "SessionCollection", "Session Collection", [])
        self.tree.setdefault(
            SESSION_SERVICE,
            {
                "@odata.id": SESSION_SERVICE,
                "@odata.type": "#SessionService.v1_2_0.SessionService",
                "Id": "SessionService",
                "Name": "Session Service",
                "ServiceEnabled": True,
                "SessionTimeout": 1800,
                "Status": status(),
                "Sessions": link(SESSIONS),
            },
        )
        self.tree.setdefault(
            TASK_SERVICE,
            {
                "@odata.id": TASK_SERVICE,
                "@odata.type": "#TaskService.v1_3_0.TaskService",
                "Id": "TaskService",
                "Name": "Task Service",
                "ServiceEnabled": True,
                "CompletedTaskOverWritePolicy": "Manual",
                "LifeCycleEventOnTaskStateChange": False,
                "Status": status(),
                "Tasks": link(TASKS),
            },
        )
        self.tree.setdefault(TASKS, collection(TASKS, "TaskCollection", "Task Collection", []))
        # The EventService with server-sent events (a mockup's own EventService is kept, and
        # then no stream is served unless it names ours).
        if EVENT_SERVICE not in self.tree:
            self.tree[EVENT_SERVICE] = event_service()
            self.tree[SUBSCRIPTIONS] = subscriptions()
            self.tree[ROOT].setdefault("EventService", link(EVENT_SERVICE))

    # ----- inspection and control for tests --------------------------------------------------

    @property
    def history(self) -> list[tuple[str, str, str]]:
        """("attach" | "detach", block URI, System Id) for every change made through the API,
        in order (out-of-band changes and :meth:`restart` write none)."""
        return self.state.history

    @history.setter
    def history(self, value: list[tuple[str, str, str]]) -> None:
        self.state.history = value

    def block_uris(self) -> list[str]:
        """Every ResourceBlock URI (``@odata.id``), in collection order."""
        return self.state.block_uris()

    def system_ids(self) -> list[str]:
        """Every ComputerSystem ``Id``, in collection order."""
        return self.state.system_ids()

    def attachments(self) -> dict[str, str | None]:
        """Block URI -> the ``Id`` of the System holding it (the first one if shared), or None."""
        return self.state.attachments()

    def holders(self, block_uri: str) -> list[str]:
        """The ``Id`` of every System holding ``block_uri`` (several for a shared block).

        Raises:
            KeyError: the block is unknown.
        """
        return self.state.holders(block_uri)

    def set_health(self, uri: str, health: str) -> None:
        """Set ``Status.Health`` of the resource at ``uri`` (a block, device or System).

        Raises:
            KeyError: no resource at ``uri``.
            ValueError: ``health`` is not OK, Warning or Critical (Resource.Health).
        """
        self.state.set_health(uri, health)

    def remove_block(self, block_uri: str) -> None:
        """Remove a block, its devices and every link to it (no history entry is written).

        Raises:
            KeyError: the block is unknown.
        """
        self.state.remove_block(block_uri)

    def add_block(self, region: str, rack: str, device_type: str = "gpu") -> str:
        """Add a device in a new ResourceBlock to an existing rack of a generated tree.

        Args:
            region: region name (``us-east``).
            rack: rack name (``rack-01``).
            device_type: ``gpu``, ``fpga``, ``nvme`` or ``cxl-memory``.

        Returns:
            The new block's URI.

        Raises:
            ValueError: the simulator serves a mockup, or the device type is unknown.
            KeyError: no such rack.
        """
        return self.state.add_block(region, rack, device_type)

    @property
    def noop_attaches(self) -> int | None:
        """How many of the next attaches are answered with success but not made (None: all).

        An attach is a PATCH that would add a block to the System, or an AddResourceBlock of
        a block it does not hold; the request checks (404, 409, 406) still come first, and a
        swallowed PATCH answers the System as asked for. 0 by default, None with the
        ``attach-noop`` profile; set it to 1 to swallow only the next attach. Works without
        the profile too.
        """
        return self.state.noop_attaches

    @noop_attaches.setter
    def noop_attaches(self, value: int | None) -> None:
        if value is not None and value < 0:
            raise ValueError(f"noop_attaches must be >= 0 or None, got {value}")
        self.state.noop_attaches = value

    def compute_block(self, system_id: str) -> str:
        """The URI of the compute block System ``system_id`` owns (``server-owned-compute``).

        Raises:
            KeyError: the profile is off or there is no such System.
        """
        uri = compute_block_uri(system_id)
        if uri not in self.state.owned:
            raise KeyError(f"no compute block for System {system_id!r}")
        return uri

    @property
    def tasks_created(self) -> int:
        """How many tasks the service has accepted since start (one per write in task mode)."""
        return self._task_seq

    def attach_out_of_band(self, block_uri: str, system_id: str) -> None:
        """Make ``system_id`` hold the block, as someone else attaching it would.

        Not written to :attr:`history`; a no-op when it holds it already.

        Raises:
            KeyError: the block or the System is unknown.
            ValueError: another System holds the block (and it is not shareable with room).
        """
        self.state.attach_out_of_band(block_uri, system_id)

    def detach_out_of_band(self, block_uri: str) -> list[str]:
        """Remove the block from every System holding it, as a detach by hand would.

        Not written to :attr:`history`. Works on an owned compute block too.

        Returns:
            The ``Id`` of every System it was removed from.

        Raises:
            KeyError: the block is unknown.
        """
        return self.state.detach_out_of_band(block_uri)

    def restart(self) -> None:
        """Act as a service restart, synchronously (the listener and its connections stay).

        Sessions and tasks are dropped (their tokens get 401, their monitors and Task
        resources are unknown). With ``volatile-state`` every attachment made since the
        simulator was created (through the API or out of band) is forgotten: each System
        goes back to its initial blocks (its compute block with ``server-owned-compute``),
        without :attr:`history` entries. Nothing else changes (health, added or removed
        blocks, faults, ``noop_attaches``).
        """
        self.expire_sessions()
        # The event streams end with the service (clients reconnect and must resync).
        self.events.close_all()
        for task_id in self._tasks:
            self.tree.pop(f"{TASKS}/{task_id}", None)
        self._tasks.clear()
        self._set_members(TASKS, [])
        if self.switches.volatile_state:
            # REDFISH-REFERENCE.md, "What a real composability service did": state is in
            # memory, a restart forgets every attachment without telling anyone.
            self.state.forget_attachments()

    def expire_sessions(self) -> None:
        """Forget every session, as a service restart or timeout would: their tokens get 401."""
        for uri in set(self._sessions.values()):
            self.tree.pop(uri, None)
        self._sessions.clear()
        self._set_members(SESSIONS, [])

    def fail_next(
        self,
        n: int,
        *,
        method: str = "*",
        path_prefix: str = "/",
        status: int = 500,
        body: str | None = None,
    ) -> None:
        """Make the next ``n`` matching requests fail, before authentication and routing.

        Args:
            n: how many requests.
            method: HTTP method to match, ``*`` for any.
            path_prefix: match requests whose path starts with this.
            status: the HTTP status to answer.
            body: a raw body (sent as ``application/json``, e.g. truncated JSON); None for a
                Redfish error body.
        """
        if n > 0:
            self._fail_rules.append(_FailRule(n, method.upper(), path_prefix, status, body))

    def clear_failures(self) -> None:
        """Drop what is left of every :meth:`fail_next` rule: later requests are served."""
        self._fail_rules.clear()

    # ----- server lifecycle ------------------------------------------------------------------

    def make_app(self) -> web.Application:
        """The aiohttp application serving the simulator (one catch-all route)."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (port 0: any free port).

        Returns:
            The base URL, e.g. ``http://127.0.0.1:PORT`` (no trailing slash).

        Raises:
            RuntimeError: already started.
            OSError: the address cannot be bound.
        """
        if self._runner is not None:
            raise RuntimeError("the simulator is already running")
        runner = web.AppRunner(self.make_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound_host, bound_port = runner.addresses[0][:2]
        host_part = f"[{bound_host}]" if ":" in bound_host else bound_host
        return f"http://{host_part}:{bound_port}"

    async def stop(self) -> None:
        """Stop serving and close every connection. Safe to call twice."""
        runner, self._runner = self._runner, None
        self.events.close_all()
        if runner is not None:
            await runner.cleanup()

    # ----- request entry ---------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        faults = self.faults
        if faults.latency_s > 0:
            await asyncio.sleep(faults.latency_s)
        rule = self._take_fail_rule(request)
        if rule is not None:
            if rule.body is not None:
                return web.Response(
                    status=rule.status, text=rule.body, content_type="application/json"
                )
            return self._error(
                RedfishError(rule.status, error_key_for(rule.status), "Injected failure.")
            )
        if faults.drop_rate > 0 and self._rng.random() < faults.drop_rate:
            if request.transport is not None:
                request.transport.close()
            # The transport is gone, so aiohttp discards whatever is returned.
            return web.Response(status=500)
        if faults.error_rate > 0 and self._rng.random() < faults.error_rate:
            return self._error(
                RedfishError(
                    faults.error_status, error_key_for(faults.error_status), "Injected failure."
                )
            )
        try:
            return await self._dispatch(request)
        except RedfishError as err:
            return self._error(err)
        except web.HTTPException as err:
            # aiohttp's own refusals (a body over client_max_size, ...) get a Redfish body too.
            return self._error(RedfishError(err.status, "GeneralError", err.reason))
        except Exception:
            log.exception("redfish simulator: %s %s failed", request.method, request.path)
            return self._error(RedfishError(500, "InternalError", "Internal error."))

    def _take_fail_rule(self, request: web.Request) -> _FailRule | None:
        for rule in self._fail_rules:
            if rule.method in ("*", request.method) and request.path.startswith(rule.path_prefix):
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self._fail_rules.remove(rule)
                return rule
        return None

    def _respond(self, result: Result) -> web.Response:
        headers = {"OData-Version": "4.0", "Cache-Control": "no-cache", **result.headers}
        etag = headers.get("ETag")
        if etag is not None and self.switches.etag_style == "none":
            # REDFISH-REFERENCE.md, "What a real composability service did": no ETags.
            del headers["ETag"]
        elif etag is not None and self.switches.etag_style == "double-quoted":
            # Public reports (REDFISH-REFERENCE.md): ETag headers quoted twice; DSP0266 wants
            # one quoted-string, as @odata.etag keeps.
            headers["ETag"] = f'"{etag}"'
        if result.text is not None:
            return web.Response(
                status=result.status, text=result.text, content_type="text/plain", headers=headers
            )
        if result.body is None:
            return web.Response(status=result.status, headers=headers)
        return web.json_response(result.body, status=result.status, headers=headers)

    def _error_result(self, err: RedfishError) -> Result:
        """The error answer in the profile's format: DSP0266's error object by default."""
        fmt = self.switches.error_format
        if fmt == "message":
            # REDFISH-REFERENCE.md, "What a real composability service did": error bodies
            # are {"message": "..."} with no Redfish error object.
            return Result(err.status, {"message": err.text}, dict(err.headers))
        if fmt == "text":
            # Public reports (REDFISH-REFERENCE.md): plain-text error bodies.
            return Result(err.status, None, dict(err.headers), text=err.text)
        return Result(err.status, error_body(err.key, err.text, args=err.args_), dict(err.headers))

    def _error(self, err: RedfishError) -> web.Response:
        result = self._error_result(err)
        if err.status == 401 and self.auth in ("any", "basic"):
            result.headers.setdefault("WWW-Authenticate", 'Basic realm="fabric-dra simulator"')
        return self._respond(result)

    def _unknown(self, path: str) -> RedfishError:
        """The error for a request naming an unknown URI: 404, or 500 with ``unknown-500``."""
        if self.switches.unknown_status == 500:
            # REDFISH-REFERENCE.md, "What a real composability service did": unknown
            # resources answer 500, not 404.
            return RedfishError(
                500, "InternalError", f"Internal error while serving {path}.", args=[]
            )
        return not_found(path)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = normalise(request.path)
        method = request.method
        if self.control and path == CONTROL_HEALTH:
            return await self._control_health(request)
        if path == "/redfish":
            self._require_method(method, "GET, HEAD")
            return self._respond(Result(200, {"v1": "/redfish/v1/"}))
        if path == f"{ROOT}/odata":
            self._require_method(method, "GET, HEAD")
            return self._respond(Result(200, odata_service_document(self.tree)))
        if path == f"{ROOT}/$metadata":
            self._require_method(method, "GET, HEAD")
            return web.Response(
                text=metadata_document(self.tree),
                content_type="application/xml",
                headers={"OData-Version": "4.0"},
            )
        odata_version = request.headers.get("OData-Version")
        if odata_version is not None and odata_version.strip() != "4.0":
            raise RedfishError(
                412,
                "PreconditionFailed",
                f"OData-Version {odata_version} is not supported; use 4.0.",
            )
        # DSP0266: a POST to a collection's Members property equals a POST to the collection.
        if path in (SESSIONS, f"{SESSIONS}/Members") and method == "POST":
            return self._respond(await self._login(request))
        if path != ROOT:
            self._authenticate(request)
        if path.startswith(TASK_MONITORS + "/"):
            return self._respond(self._task_monitor(method, path))
        if path == SSE_URI and self.tree.get(EVENT_SERVICE, {}).get("ServerSentEventUri") == path:
            self._require_method(method, "GET")
            try:
                return await self.events.stream(request)
            except FilterError as err:
                raise RedfishError(
                    400, "QueryParameterValueFormatError", f"$filter: {err}"
                ) from None
        action = _ACTION_RE.match(path)
        system_action = action is not None and self.state.is_system(action["system"])
        if action is not None and system_action and self.switches.block_actions:
            return self._respond(await self._action(request, action["system"], action["verb"]))
        if path not in self.tree:
            # Without block actions (no-etags: "PATCH only", REDFISH-REFERENCE.md) their URIs
            # are unknown resources, as on a service that never had them.
            if (
                "/Actions/" in path
                and path.split("/Actions/")[0] in self.tree
                and not system_action
            ):
                self._require_method(method, "POST")
                raise RedfishError(
                    400,
                    "ActionNotSupported",
                    f"The action {path} is not supported by the resource.",
                    args=[path],
                )
            raise self._unknown(path)
        allowed = self._allowed(path)
        self._require_method(method, allowed)
        if method in ("GET", "HEAD"):
            return self._respond(self._get(request, path, allowed))
        if method == "PATCH":
            return self._respond(await self._patch_system(request, path))
        if method == "DELETE":
            return self._respond(self._logout(path))
        raise RedfishError(405, "OperationNotAllowed", "The HTTP method is not allowed.")

    async def _control_health(self, request: web.Request) -> web.Response:
        """``POST /_sim/health {"uri", "health"}``: :meth:`set_health` from outside; 204, or
        400 with the reason."""
        self._require_method(request.method, "POST")
        body = await self._json_object(request)
        try:
            self.set_health(str(body.get("uri")), str(body.get("health")))
        except (KeyError, ValueError) as err:
            raise RedfishError(400, "GeneralError", f"cannot set health: {err}") from None
        return web.Response(status=204)

    def _allowed(self, path: str) -> str:
        if self.state.is_system(path):
            return "GET, HEAD, PATCH"
        if path == SESSIONS:
            return "GET, HEAD" if self.auth == "basic" else "GET, HEAD, POST"
        if path.startswith(SESSIONS + "/"):
            return "GET, HEAD, DELETE"
        return "GET, HEAD"

    @staticmethod
    def _require_method(method: str, allowed: str) -> None:
        if method not in allowed.split(", "):
            raise RedfishError(
                405,
                "OperationNotAllowed",
                f"The HTTP method {method} is not allowed on this resource.",
                headers={"Allow": allowed},
            )

    # ----- authentication --------------------------------------------------------------------

    def _authenticate(self, request: web.Request) -> None:
        if self.auth == "none":
            return
        token = request.headers.get("X-Auth-Token")
        if token is not None and self.auth in ("any", "session") and token in self._sessions:
            return
        header = request.headers.get("Authorization", "")
        if self.auth in ("any", "basic") and header[:6].lower() == "basic ":
            try:
                user, _, password = (
                    base64.b64decode(header[6:].strip(), validate=True)
                    .decode("utf-8")
                    .partition(":")
                )
            except (binascii.Error, UnicodeDecodeError):
                user, password = "", ""
            if self._credentials_match(user, password):
                return
        raise RedfishError(
            401, "NoValidSession", "There is no valid session established with the implementation."
        )

    def _credentials_match(self, user: str, password: str) -> bool:
        # Bytes, because compare_digest refuses non-ASCII str (a client may send any).
        user_ok = secrets.compare_digest(user.encode(), self.username.encode())
        password_ok = secrets.compare_digest(password.encode(), self.password.encode())
        return user_ok and password_ok

    async def _login(self, request: web.Request) -> Result:
        if self.auth == "basic":
            raise RedfishError(
                405,
                "OperationNotAllowed",
                "Sessions are disabled: use HTTP Basic authentication.",
                headers={"Allow": "GET, HEAD"},
            )
        body = await self._json_object(request)
        for name in ("UserName", "Password"):
            if name not in body:
                raise RedfishError(
                    400,
                    "PropertyMissing",
                    f"The property {name} is a required property and must be "
                    "included in the request.",
                    args=[name],
                )
            if not isinstance(body[name], str):
                raise RedfishError(
                    400,
                    "PropertyValueTypeError",
                    f"The value for the property {name} is of a different type "
                    "than the property can accept.",
                    args=[json.dumps(body[name]), name],
                )
        unknown = sorted(set(body) - {"UserName", "Password"} - {k for k in body if "@" in k})
        if unknown:
            raise RedfishError(
                400,
                "PropertyUnknown",
                f"The property {unknown[0]} is not in the list of valid "
                "properties for the resource.",
                args=[unknown[0]],
            )
        if not self._credentials_match(body["UserName"], body["Password"]):
            raise RedfishError(
                401,
                "ResourceAtUriUnauthorized",
                f"While accessing the resource at {SESSIONS}, the service "
                "received an authorization error: bad credentials.",
                args=[SESSIONS, "bad credentials"],
            )
        self._session_seq += 1
        session_id = str(self._session_seq)
        uri = f"{SESSIONS}/{session_id}"
        token = secrets.token_urlsafe(24)
        self.tree[uri] = {
            "@odata.id": uri,
            "@odata.type": "#Session.v1_8_0.Session",
            "Id": session_id,
            "Name": f"Session {session_id}",
            "UserName": body["UserName"],
        }
        self._sessions[token] = uri
        self._set_members(SESSIONS, [*self._member_uris(SESSIONS), uri])
        return Result(
            201,
            self.state.with_etag(uri),
            {"X-Auth-Token": token, "Location": uri, "ETag": self.state.etag(uri)},
        )

    def _logout(self, path: str) -> Result:
        del self.tree[path]
        for token in [t for t, uri in self._sessions.items() if uri == path]:
            del self._sessions[token]
        self._set_members(SESSIONS, [u for u in self._member_uris(SESSIONS) if u != path])
        return Result(204, None)

    # ----- reading ---------------------------------------------------------------------------

    def _member_uris(self, path: str) -> list[str]:
        return [m["@odata.id"] for m in self.tree[path].get("Members", [])]

    def _set_members(self, path: str, members: list[str]) -> None:
        self.tree[path]["Members"] = [link(m) for m in members]
        self.tree[path]["Members@odata.count"] = len(members)

    def _get(self, request: web.Request, path: str, allowed: str) -> Result:
        skip, top, levels = self._query(request)
        task = self._task_for_resource(path)
        if task is not None:
            self._advance(task)
            if path not in self.tree:  # task-purged: gone as soon as it has run
                raise self._unknown(path)
        self._maybe_flap(path)
        headers = {"Allow": allowed, "Link": f"<{ROOT}/$metadata>; rel=describedby"}
        if not levels and self.state.etags:
            # An expanded answer holds more than the resource, so it has no ETag of its own
            # (and hashing a large collection for every page of it would be quadratic).
            etag = self.state.etag(path)
            headers["ETag"] = etag
            if_none_match = request.headers.get("If-None-Match")
            if if_none_match is not None and self._etag_matches(if_none_match, etag):
                return Result(304, None, headers)
        members = self.tree[path].get("Members")
        if not (isinstance(members, list) and (skip or top is not None or self.page_size)):
            return Result(
                200, self._expanded(self.state.with_etag(path, etag=not levels), levels), headers
            )
        total = len(members)
        limit = min(x for x in (top, self.page_size, total) if x is not None)
        body = self.state.with_etag(path, members=slice(skip, skip + limit), etag=not levels)
        body.pop("Members@odata.nextLink", None)
        body = self._expanded(body, levels)
        if skip + limit < total and (top is None or limit < top):
            rest = "" if top is None else f"&$top={top - limit}"
            if levels:
                rest += f"&$expand={request.query['$expand']}"
            body["Members@odata.nextLink"] = f"{path}?$skip={skip + limit}{rest}"
        return Result(200, body, headers)

    def _expanded(self, body: JsonObject, levels: int) -> JsonObject:
        """``body`` with every reference outside ``Links`` replaced by its resource,
        ``levels`` deep (``$expand=.``)."""
        if levels <= 0:
            return body

        def expand(value: Any, depth: int) -> Any:
            if isinstance(value, list):
                return [expand(element, depth) for element in value]
            if not isinstance(value, dict):
                return value
            uri = value.get("@odata.id")
            if set(value) == {"@odata.id"} and isinstance(uri, str):
                target = normalise(uri)
                if target in self.tree and depth > 0:
                    return inner(self.state.with_etag(target), depth - 1)
                return value
            return inner(value, depth)

        def inner(resource: JsonObject, depth: int) -> JsonObject:
            if depth <= 0:
                return resource
            return {
                key: value if key == "Links" or key.startswith("@") else expand(value, depth)
                for key, value in resource.items()
            }

        return inner(body, levels)

    def _query(self, request: web.Request) -> tuple[int, int | None, int]:
        skip, top, levels = 0, None, 0
        for key, value in request.query.items():
            if key == "$expand" and self.expand:
                levels = self._expand_levels(value)
            elif key in ("$skip", "$top"):
                try:
                    number = int(value)
                except ValueError:
                    raise RedfishError(
                        400,
                        "QueryParameterValueTypeError",
                        f"The value {value} for the query parameter {key} is "
                        "of a different type than the parameter can accept.",
                        args=[value, key],
                    ) from None
                if number < 0:
                    raise RedfishError(
                        400,
                        "QueryParameterOutOfRange",
                        f"The value {value} for the query parameter {key} is out of range.",
                        args=[value, key, ">= 0"],
                    )
                if key == "$skip":
                    skip = number
                else:
                    top = number
            elif key.startswith("$") or key in ("only", "excerpt"):
                raise RedfishError(
                    501,
                    "QueryNotSupported",
                    f"Querying with {key} is not supported by the service.",
                )
        return skip, top, levels

    @staticmethod
    def _expand_levels(value: str) -> int:
        match = _EXPAND_RE.fullmatch(value)
        levels = 1 if match is None or match["levels"] is None else int(match["levels"])
        if match is None or not 1 <= levels <= MAX_EXPAND_LEVELS:
            raise RedfishError(
                400,
                "QueryParameterValueFormatError",
                f"The value {value} for the parameter $expand is of a different "
                "format than the parameter can accept; this service expands "
                f"'.' up to $levels={MAX_EXPAND_LEVELS}.",
                args=[value, "$expand"],
            )
        return levels

    def _maybe_flap(self, path: str) -> None:
        rate = self.faults.flap_health_rate
        resource = self.tree[path]
        current = resource.get("Status")
        if (
            rate > 0
            and isinstance(current, dict)
            and "Health" in current
            and self._rng.random() < rate
        ):
            current["Health"] = "Critical" if current["Health"] == "OK" else "OK"

    # ----- writing ---------------------------------------------------------------------------

    async def _json_object(self, request: web.Request) -> JsonObject:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested deep
            raise RedfishError(
                400,
                "MalformedJSON",
                "The request body submitted was malformed JSON and could not "
                "be parsed by the receiving service.",
            ) from None
        if not isinstance(body, dict):
            raise RedfishError(400, "MalformedJSON", "The request body must be a JSON object.")
        return body

    def _etag_matches(self, header: str, etag: str) -> bool:
        """Whether an If-Match / If-None-Match value names ``etag``, as the profile compares."""
        if self.switches.etag_style == "double-quoted":
            # The quirk of services that send ETag ""abc"": they compare the client's tag,
            # one doubled pair of quotes removed, with their own "abc" (DSP0266: If-Match
            # names a strong quoted ETag), so "abc" and ""abc"" match and W/"abc" does not.
            candidates = [c.strip() for c in header.split(",")]
            candidates = [
                c[1:-1] if len(c) >= 4 and c.startswith('""') and c.endswith('""') else c
                for c in candidates
            ]
            return "*" in candidates or etag in candidates
        return etag_matches(header, etag)

    def _check_if_match(self, request: web.Request, path: str, *, required: bool) -> None:
        if self.switches.etag_style == "none":
            # REDFISH-REFERENCE.md, "What a real composability service did": If-Match is
            # ignored (and so is require_if_match).
            return
        header = request.headers.get("If-Match")
        if header is None:
            if required:
                raise RedfishError(
                    428,
                    "PreconditionRequired",
                    "A precondition header or annotation is required to change the resource.",
                    args=[path],
                )
            return
        if not self._etag_matches(header, self.state.etag(path)):
            raise RedfishError(
                412,
                "PreconditionFailed",
                "The ETag supplied did not match the ETag required to change this resource.",
                args=[path],
            )

    async def _patch_system(self, request: web.Request, path: str) -> Result:
        body = await self._json_object(request)
        self._check_if_match(request, path, required=self.require_if_match)
        new = parse_links_patch(body, self.tree[path], self.state.system_blocks(path))
        return await self._run_or_queue(request, path, lambda: self.state.apply_set(path, new))

    async def _action(self, request: web.Request, system: str, verb: str) -> Result:
        self._require_method(request.method, "POST")
        actions = self.tree[system].get("Actions")
        name = f"#ComputerSystem.{verb}ResourceBlock"
        if not (isinstance(actions, dict) and name in actions):
            raise RedfishError(
                400,
                "ActionNotSupported",
                f"The action {name[1:]} is not supported by the resource.",
                args=[name[1:]],
            )
        body = await self._json_object(request)
        block, etags = parse_block_action(name[1:], body)
        self._check_if_match(request, system, required=False)
        for key, target in (("ComputerSystemETag", system), ("ResourceBlockETag", block)):
            if key in etags:
                if target not in self.tree:
                    raise not_found(target)
                if not self._etag_matches(etags[key], self.state.etag(target)):
                    raise RedfishError(
                        412,
                        "PreconditionFailed",
                        f"The {key} supplied did not match the current ETag of {target}.",
                        args=[target],
                    )
        apply = self.state.apply_add if verb == "Add" else self.state.apply_remove
        return await self._run_or_queue(request, system, lambda: apply(system, block))

    # ----- tasks -----------------------------------------------------------------------------

    async def _run_or_queue(
        self, request: web.Request, target: str, operation: Callable[[], Result]
    ) -> Result:
        if not self.task_mode:
            return operation()
        self._task_seq += 1
        task_id = str(self._task_seq)
        uri = f"{TASKS}/{task_id}"
        monitor = f"{TASK_MONITORS}/{task_id}"
        self._tasks[task_id] = _Task(task_id, operation)
        self.tree[uri] = {
            "@odata.id": uri,
            "@odata.type": "#Task.v1_7_4.Task",
            "Id": task_id,
            "Name": f"{request.method} {target}",
            "TaskState": "Running",
            "TaskStatus": "OK",
            "PercentComplete": 0,
            "StartTime": _now(),
            "TaskMonitor": monitor,
            "Messages": [],
            "Payload": {
                "HttpOperation": request.method,
                "TargetUri": request.path,
                "HttpHeaders": [],
                "JsonBody": (await request.read()).decode("utf-8", "replace"),
            },
        }
        self._set_members(TASKS, [*self._member_uris(TASKS), uri])
        return Result(
            202,
            self.state.with_etag(uri),
            {"Location": monitor, "Retry-After": str(self.retry_after_s)},
        )

    def _task_for_resource(self, path: str) -> _Task | None:
        if not path.startswith(TASKS + "/"):
            return None
        return self._tasks.get(path[len(TASKS) + 1 :])

    def _advance(self, task: _Task) -> None:
        """Count one read of a task or its monitor; run the operation after ``task_polls``."""
        if task.result is not None:
            return
        task.polls += 1
        uri = f"{TASKS}/{task.task_id}"
        resource = self.tree[uri]
        if task.polls <= self.task_polls:
            resource["PercentComplete"] = int(100 * task.polls / (self.task_polls + 1))
            return
        if self.switches.task_killed:
            # The Task schema: TaskState Killed, "the task is complete because an operator
            # killed it"; the operation never ran.
            task.killed = True
            task.result = Result(200, None)
            resource.update(
                {
                    "TaskState": "Killed",
                    "TaskStatus": "Critical",
                    "EndTime": _now(),
                    "Messages": [
                        {
                            "MessageId": "TaskEvent.1.0.TaskAborted",
                            "Message": f"The task with Id '{task.task_id}' has been aborted.",
                            "MessageArgs": [task.task_id],
                            "MessageSeverity": "Critical",
                            "Resolution": "None.",
                        }
                    ],
                }
            )
        else:
            error: RedfishError | None = None
            try:
                result = task.run()
            except RedfishError as err:
                error, result = err, self._error_result(err)
            task.result = result
            resource.update(
                {
                    "TaskState": "Completed" if error is None else "Exception",
                    "TaskStatus": "OK" if error is None else "Critical",
                    "PercentComplete": 100,
                    "EndTime": _now(),
                }
            )
            info = (
                [message(error.key, error.text, args=error.args_)]
                if error is not None
                else (result.body or {}).get("@Message.ExtendedInfo")
            )
            resource["Messages"] = info or [
                message("Success", "The request completed successfully.", severity="OK")
            ]
        if self.switches.task_purged:
            # Public reports (REDFISH-REFERENCE.md): task monitors that vanish once done.
            del self._tasks[task.task_id]
            del self.tree[uri]
            self._set_members(TASKS, [u for u in self._member_uris(TASKS) if u != uri])

    def _task_monitor(self, method: str, path: str) -> Result:
        task = self._tasks.get(path[len(TASK_MONITORS) + 1 :])
        if task is None:
            raise self._unknown(path)
        self._require_method(method, "GET, HEAD")
        self._advance(task)
        if task.task_id not in self._tasks:  # task-purged
            raise self._unknown(path)
        uri = f"{TASKS}/{task.task_id}"
        if task.result is None:
            if self.switches.task_200_body:
                # Public reports (REDFISH-REFERENCE.md): monitors answering 200 with a Task
                # body; DSP0266 wants 202 while the task runs.
                return Result(200, self.state.with_etag(uri), {"ETag": self.state.etag(uri)})
            return Result(
                202,
                self.state.with_etag(uri),
                {"Location": path, "Retry-After": str(self.retry_after_s)},
            )
        if task.killed or self.switches.task_200_body:
            # A killed task has no operation answer: the Task (TaskState Killed) is the answer.
            return Result(200, self.state.with_etag(uri), {"ETag": self.state.etag(uri)})
        return task.result


# ----- command line ------------------------------------------------------------------------


async def _serve_until_stopped(sim: RedfishSimulator, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    url = await listen(sim.start(host, port), host, port)
    # The generated tree lives as long as the process: keep it out of the garbage
    # collector's full passes, which otherwise pause every answer for tens of milliseconds
    # at large sizes (a real fabric manager has no such pauses to impose on its clients).
    gc.freeze()
    click.echo(f"Redfish simulator serving {url}/redfish/v1 (Ctrl-C to stop)")
    try:
        await stop.wait()
    finally:
        await sim.stop()


MAX_GENERATED_DEVICES = 500_000
"""The most devices a generated inventory has (five times the largest benchmark's): more
would take many GB before the first answer."""
MAX_GENERATED_HOSTS = 100_000
"""The most fabric hosts (servers) a generated inventory has."""


def generated_size_problem(
    regions: int, racks_per_region: int, devices_per_rack: int, hosts_per_rack: int
) -> str | None:
    """Why a generated inventory of this size is refused (more than
    :data:`MAX_GENERATED_DEVICES` devices or :data:`MAX_GENERATED_HOSTS` hosts), or None."""
    racks = f"--regions {regions} x --racks-per-region {racks_per_region}"
    devices = regions * racks_per_region * devices_per_rack
    if devices > MAX_GENERATED_DEVICES:
        return (
            f"{racks} x --devices-per-rack {devices_per_rack} makes {devices:,} devices; at "
            f"most {MAX_GENERATED_DEVICES:,} are generated"
        )
    hosts = regions * racks_per_region * hosts_per_rack
    if hosts > MAX_GENERATED_HOSTS:
        return (
            f"{racks} x --hosts-per-rack {hosts_per_rack} makes {hosts:,} hosts; at most "
            f"{MAX_GENERATED_HOSTS:,} are generated"
        )
    return None


@click.command("redfish")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to bind (0: any free port).",
)
@click.option(
    "--regions",
    default=2,
    show_default=True,
    type=click.IntRange(0, 10_000),
    help="Generated regions.",
)
@click.option("--racks-per-region", default=4, show_default=True, type=click.IntRange(0, 100_000))
@click.option("--devices-per-rack", default=16, show_default=True, type=click.IntRange(0, 100_000))
@click.option("--hosts-per-rack", default=4, show_default=True, type=click.IntRange(0, 10_000))
@click.option(
    "--device-mix",
    default="gpu",
    show_default=True,
    type=click.Choice(["gpu", "mixed"]),
    help="All GPUs, or GPU/FPGA/NVMe/CXL.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Same seed, same inventory.")
@click.option(
    "--mockup-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Serve this DMTF mockup folder instead of a generated inventory.",
)
@click.option("--username", default="admin", show_default=True)
@click.option(
    "--password-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File holding the password (default password: 'password').",
)
@click.option(
    "--auth",
    default="any",
    show_default=True,
    type=click.Choice(["any", "session", "basic", "none"]),
)
@click.option(
    "--task-mode/--no-task-mode",
    default=False,
    show_default=True,
    help="Answer writes with 202 and a task monitor.",
)
@click.option(
    "--page-size",
    type=click.IntRange(1),
    default=None,
    help="Page collections with this many members.",
)
@click.option(
    "--expand/--no-expand",
    default=False,
    show_default=True,
    help="Offer $expand=. with $levels (advertised in the service root).",
)
@click.option(
    "--latency",
    default=0.0,
    show_default=True,
    type=FiniteFloatRange(0, 600),
    help="Seconds added to every answer.",
)
@click.option(
    "--error-rate",
    default=0.0,
    show_default=True,
    type=FiniteFloatRange(0, 1),
    help="Share of requests answered with 503.",
)
@click.option(
    "--require-if-match/--no-require-if-match",
    default=False,
    show_default=True,
    help="Refuse a PATCH without If-Match (428).",
)
@click.option(
    "--profile",
    "profiles",
    multiple=True,
    type=click.Choice(PROFILE_NAMES),
    metavar="NAME",
    help="Behave like a real third-party service (repeatable; they compose): "
    + ", ".join(PROFILE_NAMES)
    + ".",
)
@click.option(
    "--control/--no-control",
    default=False,
    show_default=True,
    help='Serve POST /_sim/health {"uri": ..., "health": "Critical"} to change a '
    "resource's health from outside (benchmarks); not part of Redfish.",
)
def cli(
    host: str,
    port: int,
    regions: int,
    racks_per_region: int,
    devices_per_rack: int,
    hosts_per_rack: int,
    device_mix: str,
    seed: int,
    mockup_dir: Path | None,
    username: str,
    password_file: Path | None,
    auth: AuthMode,
    task_mode: bool,
    page_size: int | None,
    expand: bool,
    latency: float,
    error_rate: float,
    require_if_match: bool,
    profiles: tuple[str, ...],
    control: bool,
) -> None:
    """Serve a simulated Redfish fabric manager (CompositionService) until Ctrl-C or SIGTERM.

    Profiles (--profile) are described in the module docstring of fabric_dra_sim.redfish.
    """
    password = "password"
    if password_file is not None:
        try:
            password = password_file.read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) else "it is not UTF-8 text"
            raise click.BadParameter(
                f"cannot read {str(password_file)!r}: {reason}", param_hint="--password-file"
            ) from None
    if mockup_dir is None:
        problem = generated_size_problem(
            regions, racks_per_region, devices_per_rack, hosts_per_rack
        )
        if problem is not None:
            raise click.UsageError(problem)
    spec = (
        None
        if mockup_dir is not None
        else InventorySpec(
            regions=regions,
            racks_per_region=racks_per_region,
            devices_per_rack=devices_per_rack,
            hosts_per_rack=hosts_per_rack,
            device_mix=device_mix,
            seed=seed,
        )
    )
    try:
        sim = RedfishSimulator(
            spec=spec,
            mockup_dir=mockup_dir,
            username=username,
            password=password,
            auth=auth,
            task_mode=task_mode,
            page_size=page_size,
            expand=expand,
            faults=Faults(latency_s=latency, error_rate=error_rate),
            require_if_match=require_if_match,
            profiles=profiles,
        )
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    sim.control = control
    aio.run(_serve_until_stopped(sim, host, port))
