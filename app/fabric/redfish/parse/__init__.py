"""Pure parsing of Redfish payloads (decoded JSON) into the fabric value types.

No I/O here: :mod:`app.fabric.redfish.reader` fetches the resources and hands the decoded JSON
to these functions. Every function either returns a value or raises
:class:`~app.fabric.redfish.parse.common.BadItem` (one item is wrong, the caller turns it into
a :class:`~app.fabric.types.Rejected`) or :class:`~app.fabric.errors.FabricError` (the answer
as a whole is unusable).

One module per resource kind or concept, each documenting the rules it follows:
:mod:`~app.fabric.redfish.parse.common` (property readers, health),
:mod:`~app.fabric.redfish.parse.collection` (collection pages, ``$expand``),
:mod:`~app.fabric.redfish.parse.chassis` (location),
:mod:`~app.fabric.redfish.parse.blocks` (ResourceBlocks, server-owned blocks, holders),
:mod:`~app.fabric.redfish.parse.devices` (devices by kind),
:mod:`~app.fabric.redfish.parse.identity` (one physical device under two URIs),
:mod:`~app.fabric.redfish.parse.systems` (ComputerSystems, hosts),
:mod:`~app.fabric.redfish.parse.errors` (error answers),
:mod:`~app.fabric.redfish.parse.headers` (ETags, ``Retry-After``) and
:mod:`~app.fabric.redfish.parse.tasks` (Tasks).
"""
