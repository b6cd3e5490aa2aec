"""Vector engine conformance: the in-memory numpy engine, the embedded one (numpy written ahead to
SQLite), and Qdrant through qdrant-client (local mode).

Qdrant's local mode is the same adapter code as a Qdrant server (only the client differs); no server
binary ships on PyPI, so the suite runs it in a temporary directory.
"""

from __future__ import annotations

import pytest

from caiplatform.testing.conformance.vector import *  # noqa: F403
from caiplatform.testing.conformance.vector import apply_notimpl


@pytest.fixture(params=["memory", "local", "edge", "qdrant"])
def backend(request) -> str:
    return request.param


@pytest.fixture
async def engine(request, backend, tmp_path):
    apply_notimpl(request, backend)
    if backend == "memory":
        from caiplatform.adapters.memory.vector import InMemoryVectorEngine

        adapter = InMemoryVectorEngine()
    elif backend == "local":
        from caiplatform.adapters.local.vector import LocalVectorEngine

        adapter = LocalVectorEngine(tmp_path / "vectors")
    elif backend == "edge":
        from caiplatform.adapters.edge.vector import EdgeVectorEngine

        adapter = EdgeVectorEngine(tmp_path / "edge")
    else:
        from caiplatform.adapters.qdrant.vector import QdrantVectorEngine

        adapter = QdrantVectorEngine(path=tmp_path / "qdrant")
    await adapter.start()
    try:
        yield adapter
    finally:
        await adapter.close()
