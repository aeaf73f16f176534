"""Which ResourceBlocks belong to a server and are never attached or detached.

The rules are in :mod:`app.fabric.redfish.parse.blocks`. Most follow from the block alone; the
CPU rule needs the block's processors, so its verdicts are remembered for the backend's
lifetime, learnt from listings and attach checks alike: a block's processors do not change, and
this spares an attach a read of each of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.fabric.redfish.parse.blocks import BlockInfo, DeviceSource, is_cpu, server_owned_reason
from app.fabric.redfish.parse.common import BadItem
from app.fabric.redfish.reader import ResourceReader
from app.fabric.redfish.transport import gather


def cpu_reason(processors: Sequence[tuple[str, Any]]) -> str | None:
    """The CPU rule over ``(uri, payload)`` of a block's processors, in block order: ``"it
    holds CPU <uri>"`` for the first ``ProcessorType: CPU``, else None. Never raises."""
    cpu = next((uri for uri, payload in processors if is_cpu(payload)), None)
    return None if cpu is None else f"it holds CPU {cpu}"


class ServerOwnedBlocks:
    """What is known about which blocks are a server's.

    Args:
        patterns: fnmatch patterns of ResourceBlock ``Id``s or URIs that belong to a server
            (setting ``fabric.server_owned_blocks``).
    """

    def __init__(self, patterns: Sequence[str] = ()) -> None:
        self._patterns = tuple(patterns)
        # Block URI -> why it is server-owned (None: it is not).
        self._learnt: dict[str, str | None] = {}

    def by_block(self, block: BlockInfo) -> str | None:
        """Why ``block`` is a server's judged from the block alone, or None
        (:func:`~app.fabric.redfish.parse.blocks.server_owned_reason` with the patterns)."""
        return server_owned_reason(block, self._patterns)

    def learn(self, uri: str, reason: str | None) -> None:
        """Remember the verdict on block ``uri``: ``reason`` why it is a server's, or None
        when its processors were all read and none is a CPU."""
        self._learnt[uri] = reason

    async def reason(self, block: BlockInfo, reader: ResourceReader) -> str | None:
        """Why ``block`` is a server's, or None: the block's own rules, else the verdict learnt
        earlier, else its processors read (once: the verdict is remembered when it is a CPU
        or when every processor could be read).

        Raises:
            FabricError: as :meth:`ResourceReader.read_item` for failures beyond one item.
        """
        reason = self.by_block(block)
        if reason is None and block.uri in self._learnt:
            reason = self._learnt[block.uri]
        elif reason is None:
            processors = [u for s, u in block.device_links if s is DeviceSource.PROCESSOR]

            async def read(uri: str) -> Any:
                try:
                    return await reader.read_item(uri)
                except BadItem:
                    return None

            payloads = await gather(read, processors)
            reason = cpu_reason(list(zip(processors, payloads, strict=True)))
            if reason is not None or all(p is not None for p in payloads):
                self._learnt[block.uri] = reason
        return reason
