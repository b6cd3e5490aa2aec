"""Test helper: an MCP client (the `mcp` package's streamable-HTTP transport) with a bearer token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from caiplatform.routing import unix_socket_of


@asynccontextmanager
async def mcp_client(url: str, token: str | None, *, headers: dict[str, str] | None = None) -> AsyncIterator[Any]:
    """A connected `mcp.Client` for the endpoint at `url` (…/mcp), presenting `token` when given."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from mcp import Client

    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    unix = unix_socket_of(url)  # a local host's server, by its socket
    transport = httpx2.AsyncHTTPTransport(uds=unix[0]) if unix is not None else None
    url = unix[1] if unix is not None else url
    async with httpx2.AsyncClient(headers=sent, timeout=60, transport=transport) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def text_of(result: Any) -> str:
    """The text a tool call answered (its content blocks joined)."""
    return "".join(getattr(block, "text", "") for block in result.content)


def http_to(url: str, **options: Any) -> tuple[httpx.AsyncClient, str]:
    """An httpx client for a server's `url` and the URL to ask it: a local host's `unix_url` is asked over its
    socket (a closed one fails with `httpx.ConnectError`, as a closed port does)."""
    unix = unix_socket_of(url)
    if unix is None:
        return httpx.AsyncClient(**options), url
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=unix[0]), **options), unix[1]
