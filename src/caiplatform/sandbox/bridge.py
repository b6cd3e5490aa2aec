"""Bridges into runs' network namespaces: the host loopback endpoints a run is given, some opened live.

A run reaches two kinds of host loopback endpoints: the fixed ones of its policy (the platform API, the
model and embedding endpoints, an operator's `CAI_SANDBOX_ALLOW` port; caiplatform.sandbox.network), and
its project's memory stores, which come and go while its workloads run. pasta could forward the fixed ones
(`-T`), but Debian 12's pasta (0.0~git20230309) loses the end of a response on about one connection in
three hundred when the server closes right after answering (an `IncompleteRead` in the workload), and
cannot take ports later anyway. So the platform itself listens inside each run's namespace on the exact address the memory-store API reports
(`127.x.y.z:6379`, or `127.0.0.1:<port>` where the system cannot bind another loopback address) and copies
every connection to that same address on the host. Nothing else of the host is opened:

- a run has its fixed endpoints, given when it is attached, for its whole life;
- a run belongs to one *group* (its project); `publish(group, endpoints)` says which host endpoints the
  group reaches now, and every live run of the group gets a listener for each new one and loses the
  listener of each one that went away (`attach` gives a new run the group's current set before it starts);
- a listener is made by a short-lived thread that enters the run's namespace (`setns`, which moves that
  thread alone) and binds there; the socket stays in that namespace, owned by the server (in the host's
  user namespace: nothing inside can close or rebind it), and is served on this module's own event loop,
  a thread of its own, which is in the host's namespace and so connects to the host's address;
- the namespace's own rules accept loopback traffic, so a workload reaches a listener and nothing where
  there is none (a connection to another project's store address is refused: no listener there).

A workload that bound a store's address inside its namespace before the store existed keeps it (the
listener for it is not made, and that is logged): it can only have hidden its own project's store from itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import socket
import threading
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from caiplatform.sandbox.relay import splice

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
SETUP_TIMEOUT_SECONDS = 20.0
Endpoint = tuple[str, int]


def listen_in(netns_fd: int, endpoint: Endpoint) -> socket.socket:
    """A TCP socket listening on `endpoint` inside the network namespace `netns_fd` (needs CAP_SYS_ADMIN
    over it: a root server's own namespaces)."""
    made: list[socket.socket] = []
    failed: list[OSError] = []

    def make() -> None:  # in a thread of its own: setns moves the calling thread only, and it ends here
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            if libc.setns(netns_fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns: {os.strerror(err)}")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(endpoint)
                sock.listen(128)
                sock.setblocking(False)
            except OSError:
                sock.close()
                raise
            made.append(sock)
        except OSError as exc:
            failed.append(exc)

    thread = threading.Thread(target=make, name="cai-bridge-listen", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


@dataclass(eq=False)
class _Run:
    fd: int
    group: str | None
    fixed: frozenset[Endpoint] = frozenset()
    servers: dict[Endpoint, asyncio.AbstractServer] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one change of its listeners at a time


class Bridges:
    """The live listeners of every run that belongs to a group; thread-safe, blocking calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._published: dict[str, frozenset[Endpoint]] = {}
        self._runs: dict[int, _Run] = {}  # by id(), each run's Netns holds its handle

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="cai-bridges", daemon=True).start()
                self._loop = loop
            return self._loop

    def _run(self, coro: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        return asyncio.run_coroutine_threadsafe(coro, self._event_loop())

    def groups(self) -> set[str]:
        """The groups some live run belongs to."""
        with self._lock:
            return {run.group for run in self._runs.values() if run.group is not None}

    def published(self, group: str) -> frozenset[Endpoint]:
        with self._lock:
            return self._published.get(group, frozenset())

    def publish(self, group: str, endpoints: Iterable[Endpoint]) -> concurrent.futures.Future[None]:
        """The group reaches exactly `endpoints` from now on; done once every live run of it agrees."""
        wanted = frozenset((str(host), int(port)) for host, port in endpoints)
        with self._lock:
            self._published[group] = wanted
            runs = [run for run in self._runs.values() if run.group == group]
        return self._run(self._sync_all(runs))

    def attach(self, netns_fd: int, group: str | None, fixed: Iterable[Endpoint] = ()) -> _Run:
        """A new run of `group` (before its process starts): its `fixed` endpoints and the group's,
        listening in it."""
        run = _Run(netns_fd, group, frozenset((str(host), int(port)) for host, port in fixed))
        with self._lock:
            self._runs[id(run)] = run
        try:
            self._run(self._sync(run)).result(SETUP_TIMEOUT_SECONDS)
        except BaseException:
            self.detach(run)
            raise
        return run

    def detach(self, run: _Run) -> None:
        """The run ended: its listeners close (before its namespace descriptor does)."""
        with self._lock:
            self._runs.pop(id(run), None)
        if self._loop is not None:
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                self._run(self._close_all(run)).result(SETUP_TIMEOUT_SECONDS)

    async def _sync_all(self, runs: list[_Run]) -> None:
        for run in runs:
            await self._sync(run)

    async def _sync(self, run: _Run) -> None:
        async with run.lock:
            with self._lock:
                if id(run) not in self._runs:
                    return  # detached meanwhile: its namespace descriptor may be closed already
                wanted = run.fixed | (self._published.get(run.group, frozenset()) if run.group else frozenset())
            for endpoint in set(run.servers) - wanted:
                run.servers.pop(endpoint).close()
            for endpoint in sorted(wanted - set(run.servers)):
                try:
                    sock = await asyncio.to_thread(listen_in, run.fd, endpoint)
                except OSError as exc:
                    log.warning("cannot open %s:%d in a run of %s: %s", *endpoint, run.group, exc)
                    continue
                run.servers[endpoint] = await asyncio.start_server(functools.partial(splice, *endpoint), sock=sock)

    @staticmethod
    async def _close_all(run: _Run) -> None:
        async with run.lock:
            for server in run.servers.values():
                server.close()
            run.servers.clear()
