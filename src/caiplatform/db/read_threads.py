"""A few threads that run the database reads made on every request, off the event loop.

The round trip is the cost of those reads on a loaded machine, not the read: `anyio.to_thread` spends
about 130 µs of CPU per call (capacity limiter, cancel scope), `loop.run_in_executor` about 65 µs
(`concurrent.futures` futures chained to asyncio ones, a semaphore per submit), this about 25 µs: a queue
of `(loop, future, call)` and one `call_soon_threadsafe` back. Measured on the 2-core machine of
docs/performance.md with 8 callers at once.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_STOP = None


class ReadThreads:
    def __init__(self, count: int, name: str):
        self._count = count
        self._name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def call(self, fn: Callable[[Any], T], arg: Any) -> asyncio.Future[T]:
        """`fn(arg)` in one of the threads; a cancelled caller leaves it to finish there (it is a read)."""
        if len(self._threads) < self._count:
            self._start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((loop, future, fn, arg))
        return future

    def stop(self) -> None:
        with self._lock:
            for _ in self._threads:
                self._queue.put(_STOP)
            self._threads = []

    def _start(self) -> None:
        with self._lock:
            while len(self._threads) < self._count:
                thread = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            loop, future, fn, arg = item
            try:
                result, error = fn(arg), None
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, as an executor would
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the caller's loop has closed: nobody waits for this read any more
                pass


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
