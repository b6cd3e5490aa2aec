"""A few threads that run the database reads made on every request, off the event loop.

The round trip is the cost of those reads, not the read: `anyio.to_thread` spends about 130 µs of CPU per
call (capacity limiter, cancel scope), `loop.run_in_executor` about 65 µs (`concurrent.futures` futures
chained to asyncio ones, a semaphore per submit), a plain queue of `(loop, future, call)` with one
`call_soon_threadsafe` back about 25 µs (measured on the 2-core machine of docs/performance.md with 8
callers at once).

What remains of a round trip is system calls and the GIL changing hands: a futex to wake the thread, the
thread contending for the GIL with the loop that is still running, a write to the loop's self-pipe and its
read. Traced per request under 8 concurrent callers, one read each: 7 to 8 futex calls, a pipe write and
read, against none for a route without a read. So the reads a loop asks for in one pass of its ready
callbacks travel together: they are handed over at the end of that pass (a `call_soon` queued behind the
callbacks already ready), when the loop is about to wait for I/O and leaves the GIL to the thread, and
their outcomes come back in one callback. With several threads (PostgreSQL, where a read is a network
round trip) a pass's reads are split across them, so reads still overlap.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_STOP = None

Read = tuple["asyncio.Future[Any]", Callable[[Any], Any], Any]


class ReadThreads:
    def __init__(self, count: int, name: str):
        self._count = count
        self._name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        # The reads asked for during the current pass of each loop, handed over when the pass ends. Only
        # that loop's own thread touches its entry.
        self._pending: dict[asyncio.AbstractEventLoop, list[Read]] = {}

    def call(self, fn: Callable[[Any], T], arg: Any) -> asyncio.Future[T]:
        """`fn(arg)` in one of the threads; a cancelled caller leaves it to finish there (it is a read)."""
        if len(self._threads) < self._count:
            self._start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        pending = self._pending.get(loop)
        if pending is None:
            pending = self._pending[loop] = []
            loop.call_soon(self._hand_over, loop)
        pending.append((future, fn, arg))
        return future

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        reads = self._pending.pop(loop, None)
        if not reads:
            return
        shares = min(len(reads), max(len(self._threads), 1))
        for n in range(shares):
            self._queue.put((loop, reads[n::shares]))

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
            loop, reads = item
            outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
            for future, fn, arg in reads:
                try:
                    outcomes.append((future, fn(arg), None))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, as an executor would
                    outcomes.append((future, None, exc))
            try:
                loop.call_soon_threadsafe(_settle, outcomes)
            except RuntimeError:  # the caller's loop has closed: nobody waits for these reads any more
                pass


def _settle(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in outcomes:
        if future.cancelled():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
