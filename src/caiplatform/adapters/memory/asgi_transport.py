"""An httpx transport that calls an ASGI app in this process and streams its response body.

`httpx.ASGITransport` runs the app to completion and buffers every body chunk before it returns the
response, so a streamed answer (`invoke/stream`'s NDJSON lines) would arrive all at once. Here the app
runs in its own task: the response is returned as soon as `http.response.start` is sent, and each
`http.response.body` chunk reaches the reader when the app sends it, as over a socket.

Closing the response early (a reader that stops) tells the app the client went away
(`http.disconnect`) and cancels it if it keeps going. An exception the app raises before it starts
the response is raised from the request, after the start it is raised from the body iteration (as
`httpx.ASGITransport` does with `raise_app_exceptions=True`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

_END = object()


class _StreamedBody(httpx.AsyncByteStream):
    def __init__(self, chunks: asyncio.Queue[Any], task: asyncio.Task[None], disconnected: asyncio.Event,
                 failure: list[BaseException], grace: float):
        self._chunks = chunks
        self._task = task
        self._disconnected = disconnected
        self._failure = failure
        self._grace = grace

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._chunks.get()
            if chunk is _END:
                break
            yield chunk
        # The answer is complete: an app still listening hears `http.disconnect` (as with
        # httpx.ASGITransport), so waiting for it to return cannot hang.
        self._disconnected.set()
        await self._task
        if self._failure:
            raise self._failure[0]

    async def aclose(self) -> None:
        self._disconnected.set()
        if not self._task.done():
            # Give the app a moment to notice the disconnect and finish its own clean-up, as a server would.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), self._grace)
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class StreamingASGITransport(httpx.AsyncBaseTransport):
    def __init__(self, app: Any, *, client: tuple[str, int] = ("127.0.0.1", 123), root_path: str = "",
                 disconnect_grace: float = 1.0):
        self.app = app
        self.client = client
        self.root_path = root_path
        self.disconnect_grace = disconnect_grace  # seconds an app has to end after the reader left

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for (k, v) in request.headers.raw],
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port),
            "client": self.client,
            "root_path": self.root_path,
        }
        body = request.stream.__aiter__()  # type: ignore[union-attr]
        request_done = False
        disconnected = asyncio.Event()
        started = asyncio.Event()
        # Unbounded: the app never waits on a slow reader, like a server with a generous socket buffer;
        # a reader that stops closes the response, which ends the app.
        chunks: asyncio.Queue[Any] = asyncio.Queue()
        start: dict[str, Any] = {}
        failure: list[BaseException] = []

        async def receive() -> dict[str, Any]:
            nonlocal request_done
            if request_done or disconnected.is_set():
                await disconnected.wait()
                return {"type": "http.disconnect"}
            try:
                data = await body.__anext__()
            except StopAsyncIteration:
                request_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
            return {"type": "http.request", "body": data, "more_body": True}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(status=message["status"], headers=message.get("headers", []))
                started.set()
            elif message["type"] == "http.response.body" and started.is_set():
                data = message.get("body", b"")
                if data and request.method != "HEAD" and not disconnected.is_set():
                    chunks.put_nowait(bytes(data))
                if not message.get("more_body", False):
                    chunks.put_nowait(_END)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            except Exception as exc:  # noqa: BLE001 - handed to the reader, see the module doc
                failure.append(exc)
            finally:
                chunks.put_nowait(_END)
                started.set()

        task = asyncio.get_running_loop().create_task(run())
        try:
            await started.wait()
        except asyncio.CancelledError:
            task.cancel()  # the caller gave up before the response started: so does the app
            raise
        if not start:
            await task
            if failure:
                raise failure[0]
            raise RuntimeError("the ASGI app returned without starting a response")
        return httpx.Response(start["status"], headers=start["headers"],
                              stream=_StreamedBody(chunks, task, disconnected, failure, self.disconnect_grace))
