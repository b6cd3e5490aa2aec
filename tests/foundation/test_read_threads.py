"""The read path's threads (`caiplatform.db.read_threads`): the reads a loop asks for in one pass travel
together, split across the threads, and each caller gets its own outcome."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from caiplatform.db.read_threads import ReadThreads


@pytest.mark.parametrize("threads", [1, 3])
async def test_each_read_of_a_pass_gets_its_own_outcome(threads):
    readers = ReadThreads(threads, "test-read")
    ran_in: list[str] = []
    # The first read of each share waits for the others': they can only all pass if the shares overlap.
    overlap = threading.Barrier(threads, timeout=5)

    def read(n: int) -> int:
        ran_in.append(threading.current_thread().name)
        if n < threads:
            overlap.wait()
        if n == 3:
            raise LookupError("three")
        return n * 10

    try:
        outcomes = await asyncio.gather(*(readers.call(read, n) for n in range(8)), return_exceptions=True)
    finally:
        readers.stop()
    assert [o if not isinstance(o, Exception) else repr(o) for o in outcomes] == [
        0, 10, 20, "LookupError('three')", 40, 50, 60, 70]
    assert threading.current_thread().name not in ran_in  # never on the loop's thread
    assert len(set(ran_in)) == threads  # one pass's eight reads shared by every thread, at once


async def test_reads_of_one_pass_are_handed_over_once_the_pass_ends():
    readers = ReadThreads(1, "test-read")
    started = threading.Event()
    try:
        first = readers.call(lambda _: started.set(), None)
        # Still in the pass that asked: nothing has reached the thread yet.
        assert not started.wait(0.05)
        await first
        assert started.is_set()
    finally:
        readers.stop()


async def test_a_cancelled_caller_leaves_the_others_their_answers():
    readers = ReadThreads(1, "test-read")
    release = threading.Event()
    try:
        slow = asyncio.ensure_future(readers.call(lambda _: release.wait(5), None))
        fast = readers.call(lambda n: n + 1, 41)
        await asyncio.sleep(0.01)
        slow.cancel()
        release.set()
        assert await fast == 42
        with pytest.raises(asyncio.CancelledError):
            await slow
    finally:
        readers.stop()


async def test_a_read_that_outlasts_the_wait_is_answered_through_the_loop():
    readers = ReadThreads(1, "test-read", wait=0.01)
    release = threading.Event()
    threading.Timer(0.2, release.set).start()
    try:
        assert await asyncio.wait_for(readers.call(lambda _: release.wait(5) and "late", None), 5) == "late"
        assert await readers.call(lambda n: n * 2, 21) == 42  # and the next pass is waited for again
    finally:
        release.set()
        readers.stop()


async def test_while_a_read_is_late_the_loop_does_not_wait_again():
    readers = ReadThreads(1, "test-read", wait=0.3)
    release = threading.Event()
    try:
        late = readers.call(lambda _: release.wait(5), None)
        await asyncio.sleep(0)  # the pass that waits 0.3 s for it, then gives up
        started = time.monotonic()
        queued = readers.call(lambda n: n, 7)  # behind the late read in the thread's queue
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert time.monotonic() - started < 0.2  # its pass did not wait
        release.set()
        assert await late is True and await queued == 7
    finally:
        release.set()
        readers.stop()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
async def test_the_waited_for_thread_runs_on_the_loops_cpu():
    readers = ReadThreads(1, "test-read", wait=1.0)
    try:
        await readers.call(lambda _: None, None)  # starts the thread
        seen = await readers.call(lambda _: os.sched_getaffinity(0), None)
        assert len(seen) == 1 and seen <= os.sched_getaffinity(0)
    finally:
        readers.stop()
    assert os.sched_getaffinity(0) != seen or len(os.sched_getaffinity(0)) == 1  # the loop's own thread is not pinned
