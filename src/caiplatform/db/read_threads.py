"""A few threads that run the database reads made on every request, off the event loop.

The round trip is the cost of those reads, not the read: `anyio.to_thread` spends about 130 µs of CPU per
call (capacity limiter, cancel scope), `loop.run_in_executor` about 65 µs (`concurrent.futures` futures
chained to asyncio ones, a semaphore per submit), a plain queue of `(loop, future, call)` with one
`call_soon_threadsafe` back about 25 µs (measured on the 2-core machine of docs/performance.md with 8
callers at once).

What remains of a round trip is system calls and the GIL changing hands:

- **Passes.** The reads a loop asks for in one pass of its ready callbacks travel together: they are
  handed over at the end of that pass (a `call_soon` queued behind the callbacks already ready) and their
  outcomes come back in one callback. Traced under 8 concurrent requests with one read each, that took
  the futex calls per request from 7.7 to 0.7 and the self-pipe writes from 1 to 0.16. With several
  threads (PostgreSQL, where a read is a network round trip) a pass's reads are split across them, so
  they still overlap.
- **A short wait (SQLite).** A read thread running Python on one core while the loop runs Python on the
  other makes them take the GIL from each other across cores on every switch: on an idle 2-core machine
  that doubled the CPU of both (`GET /v1/agents/{name}`: the read thread 75 → 180 µs, the loop 200 → 360
  µs per request, against the same process pinned to one core). Under the GIL the two cannot run Python
  at once anyway, so the loop lends the thread its turn: it waits up to `wait` seconds (2 ms for SQLite,
  whose reads take tens of microseconds) for the pass's reads, with the GIL released, and settles them
  itself. A read that outlasts the wait is answered through the loop as usual, and until it has finished
  the loop does not wait again, so a stuck read costs the loop one wait, not one per pass. PostgreSQL's
  reads wait on the network and are not waited for.
- **The same CPU (Linux, SQLite).** The read thread is kept on the CPU the loop runs on (the loop asks
  `sched_getcpu` at each hand-over and moves the thread when the loop has moved), which is idle while the
  loop waits for it: the read finds the request's objects in that CPU's cache. On the idle 2-core
  machine that took `GET /v1/agents/{name}` from 2,400-2,600 to 2,600-3,050 requests/s and the read
  thread from 93-105 to 84-92 µs per request, close to the whole process pinned to one core (3,050-3,200).
  The server's other threads and the processes it starts keep their affinity.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_STOP = None


def _libc_sched_getcpu() -> Any:
    try:
        return ctypes.CDLL(None).sched_getcpu  # glibc and musl; absent elsewhere (macOS)
    except (OSError, AttributeError):
        return None


_current_cpu = _libc_sched_getcpu() if hasattr(os, "sched_setaffinity") else None

Read = tuple["asyncio.Future[Any]", Callable[[Any], Any], Any]
Outcome = tuple["asyncio.Future[Any]", Any, "BaseException | None"]


class _Batch:
    """Reads handed over together, and their outcomes once the thread has made them."""

    __slots__ = ("loop", "outcomes", "reads", "ready", "send_back")

    def __init__(self, loop: asyncio.AbstractEventLoop, reads: list[Read], send_back: bool):
        self.loop = loop
        self.reads = reads
        self.outcomes: list[Outcome] | None = None
        self.send_back = send_back  # the thread sends the outcomes to the loop (the loop is not waiting)
        # Held until the outcomes are in (a plain lock: an Event is a condition, a lock and a list).
        self.ready = threading.Lock()
        self.ready.acquire()


class ReadThreads:
    def __init__(self, count: int, name: str, wait: float = 0.0):
        self._count = count
        self._name = name
        self._wait = wait
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        # The reads asked for during the current pass of each loop, handed over when the pass ends. Only
        # that loop's own thread touches its entry.
        self._pending: dict[asyncio.AbstractEventLoop, list[Read]] = {}
        self._late: _Batch | None = None  # the last batch the loop stopped waiting for
        self._decide = threading.Lock()  # who sends a batch's outcomes: the thread, or the waiting loop
        self._native_ids: list[int] = []
        self._cpu = -1

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
        # Not while an earlier read is still running: waiting now would only stall the loop again.
        wait = bool(self._wait) and shares == 1 and (self._late is None or self._late.outcomes is not None)
        batches = [_Batch(loop, reads[n::shares], send_back=not wait) for n in range(shares)]
        for batch in batches:
            self._queue.put(batch)
        if wait:
            self._follow_the_loop()
            self._await_briefly(batches[0])

    def _follow_the_loop(self) -> None:
        """Keep the (one) read thread on the CPU the loop runs on, which is idle while the loop waits for it:
        the read then finds the request's objects in that CPU's cache instead of pulling them across."""
        if _current_cpu is None or not self._native_ids:
            return
        cpu = _current_cpu()
        if cpu == self._cpu or cpu < 0:
            return
        try:
            for native_id in self._native_ids:
                os.sched_setaffinity(native_id, {cpu})
            self._cpu = cpu
        except (OSError, AttributeError):  # not allowed here (a cpuset, a sandbox): leave the thread be
            self._native_ids = []

    def _await_briefly(self, batch: _Batch) -> None:
        """Lend the loop's turn to the thread for at most `wait` seconds, and settle the outcomes here."""
        if not batch.ready.acquire(timeout=self._wait):
            with self._decide:
                if batch.outcomes is None:
                    batch.send_back = True
                    self._late = batch
                    return
        assert batch.outcomes is not None
        _settle(batch.outcomes)

    def stop(self) -> None:
        with self._lock:
            for _ in self._threads:
                self._queue.put(_STOP)
            self._threads = []
            self._native_ids = []
            self._cpu = -1

    def _start(self) -> None:
        with self._lock:
            while len(self._threads) < self._count:
                thread = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _run(self) -> None:
        self._native_ids.append(threading.get_native_id())
        while (batch := self._queue.get()) is not _STOP:
            outcomes: list[Outcome] = []
            for future, fn, arg in batch.reads:
                try:
                    outcomes.append((future, fn(arg), None))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, as an executor would
                    outcomes.append((future, None, exc))
            with self._decide:
                batch.outcomes = outcomes
                send_back = batch.send_back
            batch.ready.release()
            if send_back:
                try:
                    batch.loop.call_soon_threadsafe(_settle, outcomes)
                except RuntimeError:  # the caller's loop has closed: nobody waits for these reads any more
                    pass


def _settle(outcomes: list[Outcome]) -> None:
    for future, result, error in outcomes:
        if future.cancelled():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
