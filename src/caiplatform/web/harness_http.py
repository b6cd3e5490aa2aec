"""The platform's HTTP/1.1 client to agents' harnesses: pooled keep-alive connections on asyncio streams.

Every invoke crosses this client, so its per-request cost is latency on a busy machine: `httpx` (with
`httpcore` and `h11` below it) spent about 2.5 ms of CPU per request here, this client about a tenth
of that (docs/performance.md, "Invoke"). It speaks only what a harness needs: a request with a body
of known length, and a response framed by `Content-Length`, `chunked` or the connection's close; its
body is handed on in the pieces it arrives in, so a streamed line leaves as soon as it came.

An idle connection is dropped before the server's keep-alive timeout (uvicorn's is 5 s), and one that
the server closed while idle is found closed when taken from the pool. A request on a reused
connection that gets no byte of an answer is sent once more on a new connection: the server closed
that connection before it read the request, so the request was not run.

A harness on the local runtime listens on a Unix socket (`request(..., uds=path)`; the URL then only
gives the path and the Host header): its connections are pooled by that path.

Deadlines are the caller's (`anyio.fail_after` around the calls); a request cancelled midway closes its
connection instead of returning it to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from functools import lru_cache
from urllib.parse import urlencode, urlsplit

IDLE_SECONDS = 4.0  # under uvicorn's 5 s keep-alive, so a pooled connection is still open
MAX_IDLE_PER_HOST = 100
HEAD_LIMIT = 64 * 1024  # the response's status line and headers
READ_SIZE = 64 * 1024


class UpstreamError(Exception):
    """The exchange with the harness failed (the class name goes into the caller's 502 message)."""


class ConnectError(UpstreamError):
    pass


class RemoteProtocolError(UpstreamError):
    pass


class ReadError(UpstreamError):
    pass


@lru_cache(maxsize=1024)
def _origin(url: str) -> tuple[str, int, str, bytes]:
    """host, port, base path and the Host header of an `http://` URL."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http:// URL: {url}")
    port = parts.port or 80
    host = parts.hostname
    host_header = (f"[{host}]" if ":" in host else host) + ("" if port == 80 else f":{port}")
    return host, port, parts.path.rstrip("/"), host_header.encode("ascii")


def supports(url: str) -> bool:
    try:
        _origin(url)
    except ValueError:
        return False
    return True


class _Connection:
    __slots__ = ("reader", "writer", "loop", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.loop = asyncio.get_running_loop()
        self.idle_since = 0.0

    def usable(self, now: float, loop: asyncio.AbstractEventLoop) -> bool:
        return (self.loop is loop and not self.writer.is_closing() and not self.reader.at_eof()
                and now - self.idle_since < IDLE_SECONDS)

    def close(self) -> None:
        # a connection left from an event loop that has ended (a library user's earlier `asyncio.run`)
        with contextlib.suppress(RuntimeError):
            self.writer.close()


class HarnessResponse:
    """A response whose head has been read; read the body with `chunks()`, always `aclose()`."""

    def __init__(self, client: HarnessClient, key: tuple[str, int], conn: _Connection, status: int,
                 headers: dict[str, str], framing: str, length: int, reusable: bool):
        self.status_code = status
        self.headers = headers
        self._client = client
        self._key = key
        self._conn: _Connection | None = conn
        self._framing = framing  # "length" | "chunked" | "close"
        self._remaining = length
        self._reusable = reusable
        self._done = framing == "length" and length == 0

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, in the pieces it arrives in."""
        conn = self._conn
        if conn is None or self._done:
            return
        reader = conn.reader
        try:
            if self._framing == "length":
                while self._remaining > 0:
                    piece = await reader.read(min(self._remaining, READ_SIZE))
                    if not piece:
                        raise RemoteProtocolError("the connection closed before the end of the response")
                    self._remaining -= len(piece)
                    yield piece
            elif self._framing == "chunked":
                while True:
                    line = await reader.readuntil(b"\r\n")
                    try:
                        size = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise RemoteProtocolError("invalid chunk size in the response") from None
                    if size == 0:
                        while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                            pass
                        break
                    while size > 0:
                        piece = await reader.read(min(size, READ_SIZE))
                        if not piece:
                            raise RemoteProtocolError("the connection closed inside a chunk")
                        size -= len(piece)
                        yield piece
                    if await reader.readexactly(2) != b"\r\n":
                        raise RemoteProtocolError("a chunk does not end with CRLF")
            else:
                while piece := await reader.read(READ_SIZE):
                    yield piece
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise RemoteProtocolError(f"the response ended early or is malformed: {exc}") from None
        except (ConnectionError, OSError) as exc:
            raise ReadError(str(exc) or type(exc).__name__) from None
        self._done = True

    async def aread(self) -> bytes:
        return b"".join([piece async for piece in self.chunks()])

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._reusable:
            self._client._put(self._key, conn)
        else:
            conn.close()


class HarnessClient:
    def __init__(self) -> None:
        # By (host, port), or ("unix:<path>", 0) for a harness on a Unix socket.
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._closed = False

    def _take(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        while idle:
            conn = idle.pop()
            if conn.usable(now, loop):
                return conn
            conn.close()
        return None

    def _put(self, key: tuple[str, int], conn: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if self._closed or len(idle) >= MAX_IDLE_PER_HOST:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                      content: bytes | None = None, params: dict[str, object] | None = None,
                      uds: str | None = None) -> HarnessResponse:
        """Send the request and read the response's head (`url` is the full `http://` URL; `uds`: connect
        to that Unix socket instead of the URL's host and port)."""
        host, port, _, host_header = _origin(url)
        target = urlsplit(url)
        path = (target.path or "/") + (f"?{target.query}" if target.query else "")
        if params:
            path += ("&" if "?" in path else "?") + urlencode({k: str(v) for k, v in params.items()})
        head = _head(method, path, host_header, headers or {}, content)
        key = (f"unix:{uds}", 0) if uds is not None else (host, port)
        conn = self._take(key)
        if conn is not None:
            try:
                return await self._exchange(key, conn, method, head, content)
            except _NothingAnswered:
                pass  # the server closed the idle connection before reading this request
        conn = await self._connect(host, port, uds)
        try:
            return await self._exchange(key, conn, method, head, content)
        except _NothingAnswered as exc:
            raise RemoteProtocolError(f"the server closed the connection without answering: {exc.reason}") from None

    async def _connect(self, host: str, port: int, uds: str | None = None) -> _Connection:
        try:
            if uds is not None:
                reader, writer = await asyncio.open_unix_connection(uds, limit=HEAD_LIMIT)
            else:
                reader, writer = await asyncio.open_connection(host, port, limit=HEAD_LIMIT)
        except OSError as exc:
            raise ConnectError(str(exc) or type(exc).__name__) from None
        return _Connection(reader, writer)

    async def _exchange(self, key: tuple[str, int], conn: _Connection, method: str, head: bytes,
                        content: bytes | None) -> HarnessResponse:
        try:
            conn.writer.write(head + content if content else head)
            try:
                while True:
                    version, status, raw_headers = _parse_head(await conn.reader.readuntil(b"\r\n\r\n"))
                    if status >= 200:
                        break  # an interim answer (100 Continue) is skipped
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise _NothingAnswered("end of stream") from None
                raise RemoteProtocolError("the connection closed inside the response's head") from None
            except (ConnectionResetError, BrokenPipeError) as exc:
                raise _NothingAnswered(str(exc) or type(exc).__name__) from None
            except asyncio.LimitOverrunError:
                raise RemoteProtocolError(f"the response's head is larger than {HEAD_LIMIT} bytes") from None
            except OSError as exc:
                raise ReadError(str(exc) or type(exc).__name__) from None
        except BaseException:
            conn.close()
            raise
        connection = raw_headers.get("connection", "").lower()
        reusable = version == b"HTTP/1.1" and "close" not in connection
        if method == "HEAD" or status in (204, 304):
            framing, length = "length", 0
        elif "chunked" in raw_headers.get("transfer-encoding", "").lower():
            framing, length = "chunked", 0
        elif "content-length" in raw_headers:
            try:
                length = int(raw_headers["content-length"])
            except ValueError:
                conn.close()
                raise RemoteProtocolError("invalid Content-Length in the response") from None
            framing = "length"
        else:
            framing, length, reusable = "close", 0, False
        return HarnessResponse(self, key, conn, status, raw_headers, framing, length, reusable)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


class _NothingAnswered(Exception):
    def __init__(self, reason: str):
        self.reason = reason


def _head(method: str, path: str, host: bytes, headers: dict[str, str], content: bytes | None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode("ascii"), b"Host: " + host]
    for name, value in headers.items():
        if name.lower() in ("host", "content-length", "transfer-encoding", "connection"):
            continue
        line = f"{name}: {value}"
        if "\r" in line or "\n" in line:  # no header may smuggle another into the request
            raise ValueError(f"invalid header {name!r}")
        lines.append(line.encode("latin-1"))
    if content is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(b"Content-Length: %d" % (len(content) if content else 0))
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _parse_head(head: bytes) -> tuple[bytes, int, dict[str, str]]:
    status_line, _, rest = head.partition(b"\r\n")
    version, _, tail = status_line.partition(b" ")
    try:
        status = int(tail[:3])
    except ValueError:
        raise RemoteProtocolError("invalid status line in the response") from None
    if not version.startswith(b"HTTP/1."):
        raise RemoteProtocolError("the response is not HTTP/1.x")
    headers: dict[str, str] = {}
    for line in rest[:-4].split(b"\r\n") if len(rest) > 4 else ():
        name, sep, value = line.partition(b":")
        if not sep:
            raise RemoteProtocolError("invalid header line in the response")
        key = name.strip().lower().decode("latin-1")
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return version, status, headers
