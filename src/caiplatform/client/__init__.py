"""The platform over HTTP: `Client` and `AsyncClient`, with the very models the services use.

    from caiplatform.client import Client
    client = Client("http://127.0.0.1:8080", token=...)      # or CAI_BASE_URL / CAI_TOKEN / CAI_API_KEY
    index = client.indexes.create(project_id, name="docs", dimensions=3)

`Client.in_process(platform)` and `AsyncClient.in_process(platform)` serve an in-process platform's app,
so a notebook and a unit test use the same calls with no server. Errors are the platform's own classes
(`caiplatform.NotFound`, ...) with the answer's `request_id`.
"""

from caiplatform.client._async.client import AsyncClient
from caiplatform.client._errors import APIConnectionError, APIStatusError, APITimeoutError
from caiplatform.client._sync.client import Client

__all__ = ["APIConnectionError", "APIStatusError", "APITimeoutError", "AsyncClient", "Client"]
