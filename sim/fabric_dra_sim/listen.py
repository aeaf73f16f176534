"""Starting a simulator's server from the command line: a port or address that cannot be
bound is one flag error (``--port`` or ``--host``), not a traceback."""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable
from typing import TypeVar

import click

T = TypeVar("T")


async def listen(start: Awaitable[T], host: str, port: int) -> T:
    """Await ``start`` (the server's start, binding ``host``:``port``) and return its result.

    Raises:
        click.BadParameter: the port is taken or not allowed (``--port``), or the address is
            unknown or not this machine's (``--host``), with the errno's own text.
    """
    try:
        return await start
    except OSError as err:
        # asyncio's bind error repeats the address in strerror; the errno's own text is enough
        # (socket.gaierror's errno is negative: its strerror is the resolver's text).
        reason = os.strerror(err.errno) if err.errno and err.errno > 0 else err.strerror or str(err)
        if err.errno in (errno.EADDRINUSE, errno.EACCES):
            raise click.BadParameter(
                f"cannot listen on {host} port {port}: {reason}", param_hint="--port"
            ) from None
        raise click.BadParameter(
            f"cannot listen on {host!r}: {reason}", param_hint="--host"
        ) from None
