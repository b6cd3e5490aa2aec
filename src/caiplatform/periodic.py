"""A round of work repeated every few seconds in a task of its own, until closed (the replicas' followers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger(__name__)


class PeriodicWork:
    """Subclasses define `round()`; a round that fails is logged and the next one runs as planned."""

    name = "periodic-work"

    def __init__(self, interval: float):
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    async def round(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.round()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("%s: a round failed", self.name)
            await asyncio.sleep(self.interval)
