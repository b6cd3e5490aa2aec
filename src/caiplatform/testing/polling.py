"""Bounded polling on an observable condition: what tests wait with instead of fixed sleeps."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any


async def eventually(
    condition: Callable[[], Any | Awaitable[Any]], what: str, timeout: float = 5.0, interval: float = 0.01
) -> Any:
    """Poll `condition` (sync or async) until it returns something truthy, and return that; fail with
    `what` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)
