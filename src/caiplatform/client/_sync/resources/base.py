# Generated from caiplatform/client/_async by `python -m caiplatform.client.generate`: edit that.
"""The base of every resource: it holds the client that sends."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from caiplatform.client._sync.client import Client


class Resource:
    def __init__(self, client: Client) -> None:
        self._client = client
