"""The served emulator keeps what it stores out of the garbage collector's full passes."""

from __future__ import annotations

import asyncio
import gc

from fabric_dra_sim.kubeapi import KubeEmulator
from fabric_dra_sim.kubeapi.cli import _freeze_stored_objects


async def _frozen_within(seconds: float) -> bool:
    for _ in range(int(seconds / 0.01)):
        if gc.get_freeze_count() > 0:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_what_the_store_holds_is_frozen_once_something_was_written() -> None:
    emulator = KubeEmulator()
    gc.unfreeze()
    freezer = asyncio.create_task(_freeze_stored_objects(emulator, every_s=0.01))
    try:
        # Nothing written: nothing to freeze.
        assert not await _frozen_within(0.1)
        emulator.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        assert await _frozen_within(5.0)
    finally:
        freezer.cancel()
        gc.unfreeze()
