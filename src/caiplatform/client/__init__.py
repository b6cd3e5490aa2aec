"""The platform over HTTP: `Client` and `AsyncClient`, with the very models the services use.

    from caiplatform.client import Client
    client = Client("http://127.0.0.1:8080", token=...)      # or CAI_BASE_URL / CAI_TOKEN / CAI_API_KEY
    index = client.indexes.create(project_id, name="docs", dimensions=3)

`Client.in_process(platform)` and `AsyncClient.in_process(platform)` serve an in-process platform's app,
so a notebook and a unit test use the same calls with no server. Errors are the platform's own classes
(`caiplatform.NotFound`, ...) with the answer's `request_id`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["APIConnectionError", "APIStatusError", "APITimeoutError", "AsyncClient", "Client"]

_EXPORTS = {
    "AsyncClient": "caiplatform.client._async.client",
    "Client": "caiplatform.client._sync.client",
    "APIConnectionError": "caiplatform.client._errors",
    "APIStatusError": "caiplatform.client._errors",
    "APITimeoutError": "caiplatform.client._errors",
}

if TYPE_CHECKING:
    from caiplatform.client._async.client import AsyncClient
    from caiplatform.client._errors import APIConnectionError, APIStatusError, APITimeoutError
    from caiplatform.client._sync.client import Client


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'caiplatform.client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
