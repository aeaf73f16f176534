"""The Redfish fabric backend (Redfish CompositionService), one module per concept.

* :mod:`~app.fabric.redfish.backend`: :class:`~app.fabric.redfish.backend.RedfishBackend`, the
  :class:`~app.fabric.backend.FabricBackend`, wiring the parts below together.
* :mod:`~app.fabric.redfish.transport`: HTTP to the service (sessions, auth, TLS, retries,
  error mapping, the concurrency limit).
* :mod:`~app.fabric.redfish.reader`: the service root, collections (``$expand``), items.
* :mod:`~app.fabric.redfish.listing`: the host and device listings;
  :mod:`~app.fabric.redfish.walk`: from one ResourceBlock to its devices;
  :mod:`~app.fabric.redfish.server_owned`: which blocks are a server's.
* :mod:`~app.fabric.redfish.composition`: attach and detach;
  :mod:`~app.fabric.redfish.task_monitor`: following long-running operations.
* :mod:`~app.fabric.redfish.parse`: pure parsing of payloads into value types, which also
  documents how Redfish locations and holders map to ours.
"""
