# Generated from caiplatform/client/_async by `python -m caiplatform.client.generate`: edit that.
"""The resources of a client, grouped as the specification groups its routes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from caiplatform.client._sync.client import Client


class Resource:
    def __init__(self, client: Client) -> None:
        self._client = client


def attach(client: Client) -> None:
    from caiplatform.client._sync.resources.vector import Indexes

    client.indexes = Indexes(client)  # type: ignore[attr-defined]
