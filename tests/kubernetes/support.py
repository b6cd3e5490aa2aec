"""A bounded wait for a condition that the emulator's controller doubles bring about beside a test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(check: Callable[[], object], timeout: float = 20.0) -> None:
    """Return once `check()` is true, polling every 20 ms; fail after `timeout` seconds."""
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")
