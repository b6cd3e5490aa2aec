"""The clients over an in-process platform: its ASGI app through httpx, no socket, no server.

The async client uses `httpx.ASGITransport` on the caller's own loop. The sync client cannot (an ASGI app
is async), so its transport runs the app on an event loop in a thread of its own, where it also starts
the platform, and hands each request over to it. httpx's ASGI transport answers once the app has
finished, so in process a streamed answer arrives whole (a followed log: use a served platform).
"""

from __future__ import annotations

from typing import Any

import anyio.from_thread
import httpx


def _app(platform: Any) -> Any:
    from caiplatform_server.app import create_app

    return create_app(platform, manage_lifecycle=False)


def async_transport(platform: Any) -> httpx.AsyncBaseTransport:
    return httpx.ASGITransport(app=_app(platform))


class ThreadedASGITransport(httpx.BaseTransport):
    """A sync transport over an ASGI app that runs on a private event loop thread."""

    def __init__(self, platform: Any) -> None:
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._platform = platform
        self._portal.call(platform.start)
        self._inner = httpx.ASGITransport(app=_app(platform))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()

        async def send() -> httpx.Response:
            forwarded = httpx.Request(request.method, request.url, headers=request.headers, content=body,
                                      extensions=request.extensions)
            response = await self._inner.handle_async_request(forwarded)
            content = b"".join([chunk async for chunk in response.stream])  # type: ignore[union-attr]
            return httpx.Response(response.status_code, headers=response.headers, content=content,
                                  extensions=response.extensions)

        return self._portal.call(send)

    def close(self) -> None:
        if self._portal_cm is not None:
            try:
                self._portal.call(self._platform.aclose)
            finally:
                self._portal_cm.__exit__(None, None, None)
                self._portal_cm = None  # type: ignore[assignment]


def sync_transport(platform: Any) -> httpx.BaseTransport:
    return ThreadedASGITransport(platform)
