"""Update an object with retry on conflict: decide and write against the newest copy, and on a
stale write read the object again and decide again.

The shape of client-go's ``RetryOnConflict`` (``k8s.io/client-go/util/retry/util.go``): a
bounded number of attempts, only conflicts are retried, and the last conflict is raised. Two
differences: the first attempt may use a copy the caller already holds (usually the informer's,
which is current most of the time), so the read happens only after a conflict; and no pause is
taken between attempts, since the read that follows a conflict already waits for the server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from app.kube.errors import KubeConflict, KubeError, KubeNotFound

T = TypeVar("T", bound=Mapping[str, Any])
R = TypeVar("R")
DEFAULT_ATTEMPTS = 5


async def update_with_retry(
    current: T | None,
    attempt: Callable[[T], Awaitable[R]],
    read: Callable[[], Awaitable[T | None]],
    *,
    gone: R,
    attempts: int = DEFAULT_ATTEMPTS,
    uid: str | None = None,
    retry_on: tuple[type[KubeError], ...] = (KubeConflict,),
    on_conflict: Callable[[KubeError], None] | None = None,
) -> R:
    """Run ``attempt`` (decide from the object, then write it) until it returns without a
    conflict.

    Args:
        current: the copy to try first (None: the object is gone, ``gone`` is returned).
        attempt: given the newest copy, decides and writes (or decides that nothing needs
            writing) and returns the result; raises one of ``retry_on`` when the write was
            stale.
        read: reads the object afresh after a conflict; None when it is gone (404).
        gone: the result when the object is gone: ``current`` or a read is None, the object
            now has another uid, or a write answered 404.
        attempts: writes tried at most (>= 1).
        uid: when given, an object with another uid (deleted and re-created under the same
            name) counts as gone.
        retry_on: the errors that mean "read again and decide again": a 409, and for a JSON
            patch guarded by a ``test`` operation also the 422/400 of a failed test.
        on_conflict: called with each conflict, the last one included (a metric, say).

    Returns:
        What ``attempt`` returned, or ``gone``.

    Raises:
        KubeError: the last attempt's conflict, or any other failure of ``attempt`` or
            ``read`` (not retried here: the caller's work queue backs off).
    """
    if attempts < 1:
        raise ValueError("update_with_retry: attempts must be >= 1")
    for number in range(attempts):
        if current is None or (
            uid is not None and (current.get("metadata") or {}).get("uid") != uid
        ):
            return gone
        try:
            return await attempt(current)
        except KubeNotFound:
            return gone
        except retry_on as err:
            if on_conflict is not None:
                on_conflict(err)
            if number == attempts - 1:
                raise
        current = await read()
    return gone  # not reached: the last attempt returns or raises


def status_write_body(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The body of a status write (PUT ``.../status``): ``obj`` without
    ``metadata.managedFields``, a shallow copy (``obj`` is not changed).

    For a subresource write the API server ignores the managed fields of the request and
    keeps the stored ones, which its field manager then updates (k8s.io/apimachinery
    pkg/util/managedfields/internal/fieldmanager.go, ``decodeManagedFields`` with
    ``ignoreManagedFieldsFromRequestObject``, which the API installer sets for subresources).
    Sending them would only cost encoding, bytes and decoding: on a claim, they are a large
    part of the object.
    """
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or "managedFields" not in metadata:
        return dict(obj)
    return {
        **obj,
        "metadata": {k: v for k, v in metadata.items() if k != "managedFields"},
    }


__all__ = ["DEFAULT_ATTEMPTS", "status_write_body", "update_with_retry"]
