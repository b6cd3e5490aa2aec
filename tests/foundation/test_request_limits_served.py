"""Issue 26: limits on the request head and the query, answered in the envelope by the server that
`caiplatform serve` runs (uvicorn with the project's h11 protocol), never a plain-text 400 or a reset."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest
import uvicorn

from caiplatform_server.app import create_app
from caiplatform_server.http import (
    HEADERS_TOO_LARGE,
    MAX_HEADER_BYTES,
    MAX_QUERY_PARAMETERS,
    MAX_URI_BYTES,
    TOO_MANY_QUERY_PARAMETERS,
    URI_TOO_LONG,
)
from caiplatform_server.serving import uvicorn_config


@pytest.fixture
async def served(platform):
    """The app on a loopback port, served as `caiplatform serve` serves it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(create_app(platform, manage_lifecycle=False), host="127.0.0.1",
                                           port=port, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        yield client
    server.should_exit = True
    await task
    sock.close()


def assert_envelope(r: httpx.Response, status: int, error: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"error": error, "request_id": r.headers["x-request-id"]}


async def test_a_one_megabyte_header_is_431_in_the_envelope(served):
    r = await served.get("/healthz", headers={"X-Big": "a" * (1024 * 1024)})
    assert_envelope(r, 431, HEADERS_TOO_LARGE)
    r = await served.get("/healthz", headers={f"X-{i}": "a" * 1000 for i in range(MAX_HEADER_BYTES // 1000)})
    assert_envelope(r, 431, HEADERS_TOO_LARGE)  # in one piece, past h11
    assert (await served.get("/healthz")).status_code == 200  # the server is fine


@pytest.mark.parametrize("size", [MAX_URI_BYTES + 1, MAX_HEADER_BYTES + 10])
async def test_an_overlong_uri_is_414(served, size):
    line = b"GET /healthz?q=" + b"a" * (size - len("/healthz?q=")) + b" HTTP/1.1\r\n"
    head, body = await exchange(served, line + b"Host: x\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 414 ") and b"content-type: application/json" in head
    assert json.loads(body)["error"] == URI_TOO_LONG


async def test_twenty_thousand_query_parameters_are_answered_in_the_envelope(served):
    assert_envelope(await served.get("/v1/projects?" + "&".join(["a"] * 20_000)), 414, URI_TOO_LONG)
    r = await served.get("/v1/projects?" + "&".join(f"p{i}" for i in range(MAX_QUERY_PARAMETERS + 1)))
    assert_envelope(r, 400, TOO_MANY_QUERY_PARAMETERS)
    assert (await served.get("/healthz?" + "&".join(f"p{i}" for i in range(MAX_QUERY_PARAMETERS)))).status_code == 200


async def test_a_malformed_request_is_400_in_the_envelope(served):
    head, body = await exchange(served, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nBad Header Line\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head
    assert json.loads(body)["error"] == "invalid HTTP request"


async def exchange(client: httpx.AsyncClient, request: bytes) -> tuple[bytes, bytes]:
    """Send raw bytes (httpx refuses what these tests send) and read the answer to the server's close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", client.base_url.port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body
