"""Typed fabric errors. Backends translate transport and vendor errors into these.

``retryable`` says whether repeating the same call may succeed: callers (tenacity in the
backend, the work queue above it) retry only those.
"""

from __future__ import annotations


class FabricError(Exception):
    """Base of every fabric error.

    Attributes:
        retryable: True when the same call may succeed later.
        status: the HTTP status behind the error, if any.
        vendor_code: the vendor's error or message id (Redfish ``MessageId``), if any.
    """

    retryable = False

    def __init__(self, message: str, *, status: int | None = None, vendor_code: str | None = None):
        super().__init__(message)
        self.status = status
        self.vendor_code = vendor_code


class FabricNotFound(FabricError):
    """The device, host or operation does not exist (HTTP 404)."""


class FabricConflict(FabricError):
    """The device is held by another host, or the state changed under us (HTTP 409)."""


class FabricPreconditionFailed(FabricError):
    """An ETag did not match (HTTP 412) or a required one was missing (HTTP 428)."""


class FabricUnavailable(FabricError):
    """The fabric manager could not be reached or failed (5xx, connection, partial read)."""

    retryable = True


class FabricTimeout(FabricUnavailable):
    """A call or a long-running task did not finish in time."""


class FabricAuthError(FabricError):
    """Login failed or the credentials were refused (HTTP 401/403 after a renewal)."""


class FabricInvalidData(FabricError):
    """The fabric manager answered with something that is not what the protocol says."""


class FabricServerOwned(FabricError):
    """The attach unit belongs to a server (its own CPUs, memory, NICs) and is never attached
    or detached; nothing was sent. Permanent."""


class FabricNotEffective(FabricError):
    """The service reported success, but reading the state back does not show the change.

    Retryable: attach and detach are idempotent, so a new call reads the state again and
    makes the change again only if it is still missing.
    """

    retryable = True


class FabricEventsUnsupported(FabricError):
    """The fabric manager offers no event stream this backend can read (no EventService, no
    ``ServerSentEventUri``, the service disabled): the inventory is polled instead."""
