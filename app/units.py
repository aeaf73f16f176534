"""Sizes for people: one formatter for every memory or capacity size the CLI and admin show.

Pure; imports nothing of the project, so commands, the admin API and the dashboard can share it.
"""

from __future__ import annotations

_MIB_PER_GIB = 1024


def format_mib(mib: int) -> str:
    """``mib`` MiB as people read it, never rounded.

    Whole GiB print as GiB (``80 GiB``); below 1 GiB as MiB (``512 MiB``, ``0 MiB``); other
    sizes with one decimal when that is exact (``1.5 GiB``), else in MiB (``1300 MiB``).
    Negative sizes keep their sign.
    """
    sign, size = ("-" if mib < 0 else ""), abs(mib)
    if size < _MIB_PER_GIB:
        return f"{mib} MiB"
    tenths, rest = divmod(size * 10, _MIB_PER_GIB)
    if rest:
        return f"{mib} MiB"
    whole, tenth = divmod(tenths, 10)
    return f"{sign}{whole} GiB" if tenth == 0 else f"{sign}{whole}.{tenth} GiB"
