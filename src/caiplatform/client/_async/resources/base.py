"""The base of every resource: it holds the client that sends."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from caiplatform.client._async.client import AsyncClient


class AsyncResource:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client
