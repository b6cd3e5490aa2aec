"""The in-memory runtime's streaming ASGI transport: chunks as sent, disconnect on close, app errors."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from caiplatform.adapters.memory.asgi_transport import StreamingASGITransport


def chunked_app(gate: asyncio.Event, seen: list[str]):
    async def app(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message["body"]
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-echo", body)]})
        await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
        await gate.wait()
        await send({"type": "http.response.body", "body": b"second\n", "more_body": False})
        seen.append((await receive())["type"])  # what a server says once the answer is complete

    return app


async def test_chunks_arrive_as_the_app_sends_them():
    gate, seen = asyncio.Event(), []
    async with httpx.AsyncClient(transport=StreamingASGITransport(chunked_app(gate, seen)), base_url="http://t") as c:
        async with c.stream("POST", "/", content=b"hi") as response:
            assert response.status_code == 201 and response.headers["x-echo"] == "hi"
            lines = response.aiter_lines()
            assert await asyncio.wait_for(anext(lines), 2) == "first"
            gate.set()
            assert [line async for line in lines] == ["second"]
    assert seen == ["http.disconnect"]


async def test_closing_early_disconnects_and_ends_the_app():
    gate, seen = asyncio.Event(), []
    # The app below never ends on its own: it is cancelled once its grace after the disconnect is over.
    transport = StreamingASGITransport(chunked_app(gate, seen), disconnect_grace=0.05)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        async with c.stream("POST", "/", content=b"x") as response:
            assert await anext(response.aiter_lines()) == "first"
    # The app was still waiting on the gate: it was cancelled, nothing left running.
    assert seen == []
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


async def test_app_errors_reach_the_caller():
    async def before(scope, receive, send):
        raise ValueError("broken before the start")

    async def after(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise ValueError("broken mid-body")

    async with httpx.AsyncClient(transport=StreamingASGITransport(before), base_url="http://t") as c:
        with pytest.raises(ValueError, match="before the start"):
            await c.get("/")
    async with httpx.AsyncClient(transport=StreamingASGITransport(after), base_url="http://t") as c:
        with pytest.raises(ValueError, match="mid-body"):
            await c.get("/")
