"""The relay in front of a workload's own server: `python -I relay.py <socket> <port> -- <command...>`.

A serverless service (or any revision with its own `command`) listens on TCP `$PORT`, like a container,
but its network namespace is its own (caiplatform.sandbox.network): the platform cannot connect to that
port. This relay runs inside the same sandbox: it starts the command, waits until `127.0.0.1:<port>`
accepts, then listens on the Unix socket the platform reaches the instance by (in the directory bound
into this sandbox alone) and copies every connection to the port, both ways. The socket appears only
once the port answers: the platform's readiness check (a connection to the socket) is the TCP probe.
It ends with the command, with its exit status; SIGTERM and SIGINT are passed on to it.

Standard library only (it runs with `-I`, before and beside the tenant's code).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys

POLL_SECONDS = 0.02
BUFFER = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(BUFFER):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        # A reset on one side: the other side is closed too (what was written is still sent first), so the
        # copy the other way ends as well rather than waiting on a peer that waits for this side's end.
        writer.close()


async def splice(host: str, port: int, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
    """Copy one accepted connection to `host:port` and back until both sides are done (also the platform's
    bridges into a run's network, caiplatform.sandbox.bridge)."""
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(_pipe(client_reader, upstream_writer), _pipe(upstream_reader, client_writer))
    finally:
        for writer in (client_writer, upstream_writer):
            with contextlib.suppress(Exception):
                writer.close()


async def _port_open(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


async def main(path: str, port: int, argv: list[str]) -> int:
    child = await asyncio.create_subprocess_exec(*argv)
    loop = asyncio.get_running_loop()

    def pass_on(sig: int) -> None:
        if child.returncode is None:
            child.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, pass_on, sig)
    exited = asyncio.ensure_future(child.wait())
    while not exited.done() and not await _port_open(port):
        await asyncio.wait([exited], timeout=POLL_SECONDS)
    if exited.done():
        return exited.result()
    for stale in (path, path + ".new"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")  # renamed into place once listening: a connection never finds it half-made
    listener.listen(128)
    os.rename(path + ".new", path)
    server = await asyncio.start_unix_server(lambda r, w: splice("127.0.0.1", port, r, w), sock=listener)
    async with server:
        code = await exited
    return code


if __name__ == "__main__":
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        print("usage: relay.py <socket> <port> -- <command...>", file=sys.stderr)
        sys.exit(2)
    status = asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[4:]))
    sys.exit(status if status >= 0 else 128 - status)
