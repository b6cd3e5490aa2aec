"""Vector engine conformance: the in-memory numpy engine (`memory`), Qdrant Edge (`edge`, the embedded
default), and the Qdrant adapter in qdrant-client's local mode (`qdrant`) and on its server path (`qdrant-rest`: qdrant-client over HTTP to `QdrantRestFake`, Qdrant's
REST API answered in process by Qdrant Edge). Each backend's engine serves all the module's tests.

No Qdrant server ships on PyPI. To run the suite against a real one as well, set `CAI_TEST_QDRANT_URL`
(and `CAI_TEST_QDRANT_API_KEY` when it wants a key): the backend `qdrant-server` is then added. Every
test uses its own randomly named collection and drops it.
"""

from __future__ import annotations

import os

import anyio.to_thread
import pytest
import pytest_asyncio

from caiplatform.testing.conformance.vector import *  # noqa: F403
from caiplatform.testing.conformance.vector import apply_notimpl, release_filter_collection

SERVER_URL = os.environ.get("CAI_TEST_QDRANT_URL")
BACKENDS = ["memory", "edge", "qdrant", "qdrant-rest"] + (["qdrant-server"] if SERVER_URL else [])


# One engine per backend for the module's tests (each test uses collections of its own names, as the
# suite requires), on the module's event loop: the filter cases then share one collection per engine
# (see `filter_collection`) instead of making 36 Edge shards of some 32 MB of files each.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_engine(backend, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp(backend)
    fake = None
    if backend == "memory":
        from caiplatform.adapters.memory.vector import InMemoryVectorEngine

        adapter = InMemoryVectorEngine()
    elif backend == "edge":
        from caiplatform.adapters.edge.vector import EdgeVectorEngine

        adapter = EdgeVectorEngine(tmp_path / "edge")
    elif backend == "qdrant":
        from caiplatform.adapters.qdrant.vector import QdrantVectorEngine

        adapter = QdrantVectorEngine(path=tmp_path / "qdrant")
    elif backend == "qdrant-rest":
        from caiplatform.adapters.qdrant.vector import QdrantVectorEngine
        from caiplatform.testing.qdrant_rest import QdrantRestFake

        fake = QdrantRestFake(directory=tmp_path)
        adapter = QdrantVectorEngine("http://qdrant.test:6333", transport=fake)
    else:
        from caiplatform.adapters.qdrant.vector import QdrantVectorEngine

        adapter = QdrantVectorEngine(SERVER_URL, api_key=os.environ.get("CAI_TEST_QDRANT_API_KEY"))
    await adapter.start()
    try:
        yield adapter
    finally:
        await release_filter_collection(adapter)
        await adapter.close()
        if fake is not None:
            await anyio.to_thread.run_sync(fake.shutdown)


@pytest.fixture
def engine(request, backend, shared_engine):
    apply_notimpl(request, backend)
    return shared_engine
