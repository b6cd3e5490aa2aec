"""Test helper: an MCP client (the `mcp` package's streamable-HTTP transport) with a bearer token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any


@asynccontextmanager
async def mcp_client(url: str, token: str | None, *, headers: dict[str, str] | None = None) -> AsyncIterator[Any]:
    """A connected `mcp.Client` for the endpoint at `url` (…/mcp), presenting `token` when given."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from mcp import Client

    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    async with httpx2.AsyncClient(headers=sent, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def text_of(result: Any) -> str:
    """The text a tool call answered (its content blocks joined)."""
    return "".join(getattr(block, "text", "") for block in result.content)
