"""The resources of a client, grouped as the specification groups its routes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from caiplatform.client._async.client import AsyncClient


class AsyncResource:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client


def attach(client: AsyncClient) -> None:
    from caiplatform.client._async.resources.vector import AsyncIndexes

    client.indexes = AsyncIndexes(client)  # type: ignore[attr-defined]
