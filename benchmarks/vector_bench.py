"""How close to a plain numpy scan, and to Qdrant Edge called in process, are vector upserts and queries
through the platform?

Loads N random points (default 100k x 384, cosine) into one index of an embedded platform (the default
engine of `caiplatform serve`), through the library (`platform.indexes`) and through the HTTP API of a
real uvicorn server on a loopback port, then times top-10 queries both ways against a numpy brute-force
scan of the same vectors in the same run. Prints upsert throughput and query p50/p99, and the ratios:

- library query / numpy scan            (target: at most 2)
- HTTP query / (2 x numpy scan + empty request), where the empty request is an authenticated request
  the server answers without any work (target: at most 1)
- HTTP upsert / Qdrant Edge alone (an `EdgeShard` of the same settings in this process, fed the same
  1,000-point batches as `edge.Point`s built from the numpy rows; target: at least 0.5, issue 35)
- HTTP query p50 - (Edge alone p50 + empty request p50): the platform's own cost per query on the same
  data, both with their HNSW graph built (target: at most 1 ms, issue 35)

The vectors are uniform random (standard normal), not clustered: the hard case for HNSW, so recall@10
at the default beam is printed too.

    python benchmarks/vector_bench.py [--points 100000] [--dims 384] [--queries 200] [--engine edge]

`--engine qdrant-local` measures Qdrant's local mode instead (expect minutes per 10k points upserted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import qdrant_edge as edge
import uvicorn
from sqlalchemy import select

from caiplatform.adapters.edge.indexing import IndexSettings
from caiplatform.adapters.edge.vector import edge_config
from caiplatform.db.models import Project
from caiplatform.models.vector import IndexCreate, IndexQuery, IndexUpsert
from caiplatform.platform import Platform
from caiplatform.ports.vector import CollectionConfig
from caiplatform.principal import Principal
from caiplatform.settings import Settings
from caiplatform.supervisor import free_port
from caiplatform_server.app import create_app

ADMIN_EMAIL, ADMIN_PASSWORD = "bench@example.com", "benchmark password"
BATCH = 1000
TOP_K = 10


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def numpy_scan(rows: np.ndarray, q: np.ndarray) -> float:
    """The baseline: cosine top-k by brute force over unit-normalised float32 rows; seconds taken."""
    start = time.perf_counter()
    scores = rows @ (q / np.linalg.norm(q))
    top = np.argpartition(-scores, TOP_K)[:TOP_K]
    top[np.argsort(-scores[top])]
    return time.perf_counter() - start


def timed_request(client: httpx.Client, method: str, path: str, body: dict | None) -> float:
    start = time.perf_counter()
    response = client.request(method, path, json=body)
    elapsed = time.perf_counter() - start
    if body is not None:
        response.raise_for_status()
    return elapsed


def batches(data: np.ndarray, first_id: int) -> list[dict]:
    out = []
    for start in range(0, len(data), BATCH):
        chunk = data[start : start + BATCH]
        out.append({"points": [{"id": first_id + start + i, "vector": row.tolist(), "payload": {"n": start + i}}
                               for i, row in enumerate(chunk)]})
    return out


class EdgeAlone:
    """The baseline: Qdrant Edge without the platform, one shard with the embedded engine's settings."""

    def __init__(self, directory: Path, dims: int):
        self.settings = IndexSettings()
        self.shard = edge.EdgeShard.create(str(directory), edge_config(CollectionConfig(dimensions=dims), self.settings))

    def upsert(self, data: np.ndarray) -> float:
        start = time.perf_counter()
        for first in range(0, len(data), BATCH):
            chunk = data[first : first + BATCH]
            points = [edge.Point(first + i, row.tolist(), {"n": first + i}) for i, row in enumerate(chunk)]
            self.shard.update(edge.UpdateOperation.upsert_points(points))
        return len(data) / (time.perf_counter() - start)

    def query(self, q: np.ndarray) -> float:
        start = time.perf_counter()
        self.shard.query(edge.QueryRequest(limit=TOP_K, offset=0, query=edge.Query.Nearest(q.tolist()), filter=None,
                                           with_payload=True, with_vector=False, score_threshold=None,
                                           params=edge.SearchParams(exact=False, hnsw_ef=self.settings.ef)))
        return time.perf_counter() - start


def recall(found: list[list[int]], rows: np.ndarray, queries: np.ndarray) -> float:
    hits = 0
    for ids, q in zip(found, queries, strict=True):
        truth = set(np.argsort(-(rows @ (q / np.linalg.norm(q))))[:TOP_K].tolist())
        hits += len(truth & set(ids))
    return hits / (TOP_K * len(queries))


async def all_green(platform: Platform, ceiling: float = 1800.0) -> None:
    """Until every collection reports green (its background HNSW build done; the builds run on the
    server thread's loop, so they are watched through the engine's status rather than awaited)."""
    deadline = time.monotonic() + ceiling
    engine = platform.indexes.engine
    while True:
        infos = [await engine.collection_info(name) for name in await engine.list_collections()]
        if all(info is not None and info.status == "green" for info in infos):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the indexes were not green after {ceiling} s")
        await asyncio.sleep(0.2)


class Server:
    """`caiplatform serve`'s app under uvicorn in a thread, on a free loopback port."""

    def __init__(self, platform: Platform):
        self.port = free_port()
        config = uvicorn.Config(create_app(platform, manage_lifecycle=False), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--engine", default="edge", choices=["edge", "qdrant-local"])
    args = parser.parse_args()

    rng = np.random.default_rng(7)
    data = rng.standard_normal((args.points, args.dims)).astype(np.float32)
    queries = rng.standard_normal((args.queries, args.dims)).astype(np.float32)

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(CAI_ADMIN_EMAIL=ADMIN_EMAIL, CAI_ADMIN_PASSWORD=ADMIN_PASSWORD, RATELIMIT_RPS=1e9,
                            RATELIMIT_BURST=10**9, CAI_VECTOR_ENGINE=args.engine)
        platform = Platform.embedded(Path(tmp), settings)
        await platform.start()
        try:
            signed_in = await platform.auth.login(ADMIN_EMAIL, ADMIN_PASSWORD, client_ip=None)
            admin: Principal = await platform.auth.authenticate(signed_in.token)
            project_id = await platform.db.run(
                lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
            lib, http_index = "bench-lib", "bench-http"
            for name in (lib, http_index):
                await platform.indexes.create(admin, project_id, IndexCreate(name=name, dimensions=args.dims))
            await platform.indexes.wait_reconciled()

            # ---- upsert: through the library into one index, through HTTP into the other
            start = time.perf_counter()
            for body in batches(data, 0):
                await platform.indexes.upsert(admin, project_id, lib, IndexUpsert.parse(body))
            lib_upsert = len(data) / (time.perf_counter() - start)

            # ---- the baseline: Edge alone on the same batches, then its graph built in process
            alone = EdgeAlone(Path(tmp) / "edge-alone", args.dims)
            edge_upsert = alone.upsert(data)

            headers = {"Authorization": f"Bearer {signed_in.token}"}
            base = f"/v1/projects/{project_id}/indexes/{http_index}"
            with Server(platform) as url, httpx.Client(base_url=url, headers=headers, timeout=120) as client:

                # Encoded before the clock starts: the client shares this process (and its GIL) with the
                # server, and its JSON encoding is not the platform's work.
                encoded = [json.dumps(body).encode() for body in batches(data, 0)]

                def http_upsert_all() -> float:
                    t0 = time.perf_counter()
                    for content in encoded:
                        client.post(f"{base}:upsert", content=content,
                                    headers={"content-type": "application/json"}).raise_for_status()
                    return len(data) / (time.perf_counter() - t0)

                http_upsert = await asyncio.to_thread(http_upsert_all)
                # time to green: the platform's background HNSW build after the last write
                t0 = time.perf_counter()
                await all_green(platform)
                green = time.perf_counter() - t0
                t0 = time.perf_counter()
                await asyncio.to_thread(alone.shard.optimize)
                alone_green = time.perf_counter() - t0

                # ---- queries, interleaved so that machine noise hits every path alike
                rows = data / np.linalg.norm(data, axis=1, keepdims=True)
                numpy_times, lib_times, empty_times, http_times, edge_times = [], [], [], [], []
                found: list[list[int]] = []
                for q in queries:
                    numpy_times.append(numpy_scan(rows, q))
                    edge_times.append(alone.query(q))
                    body = {"vector": q.tolist(), "top_k": TOP_K}
                    t = time.perf_counter()
                    answer = await platform.indexes.query(admin, project_id, lib, IndexQuery.parse(body))
                    lib_times.append(time.perf_counter() - t)
                    found.append([int(hit.id) for hit in answer.results])
                    # An authenticated request the server answers without work (an unrouted path).
                    empty_times.append(await asyncio.to_thread(timed_request, client, "GET", "/v1/nothing-here", None))
                    http_times.append(await asyncio.to_thread(timed_request, client, "POST", f"{base}:query", body))
        finally:
            await platform.aclose()
            if "alone" in locals():
                alone.shard.close()

    np50, np99 = percentiles(numpy_times)
    lib50, lib99 = percentiles(lib_times)
    http50, http99 = percentiles(http_times)
    empty50, _ = percentiles(empty_times)
    edge50, edge99 = percentiles(edge_times)
    ms = 1000
    print(f"{args.points} points x {args.dims} dims, cosine, top {TOP_K}, {args.queries} queries, engine {args.engine}")
    print(f"upsert       library {lib_upsert:10.0f} points/s   HTTP {http_upsert:10.0f} points/s"
          f"   Edge alone {edge_upsert:10.0f} points/s")
    print(f"time to green after the last upsert: platform {green:.1f} s (background build), "
          f"Edge alone {alone_green:.1f} s (optimize in process)")
    print(f"Edge alone   p50 {edge50 * ms:8.2f} ms   p99 {edge99 * ms:8.2f} ms")
    print(f"numpy scan   p50 {np50 * ms:8.2f} ms   p99 {np99 * ms:8.2f} ms")
    print(f"library      p50 {lib50 * ms:8.2f} ms   p99 {lib99 * ms:8.2f} ms")
    print(f"HTTP         p50 {http50 * ms:8.2f} ms   p99 {http99 * ms:8.2f} ms   (empty request p50 {empty50 * ms:.2f} ms)")
    print(f"ratio library/numpy              p50 {lib50 / np50:5.2f}   p99 {lib99 / np99:5.2f}   (target <= 2)")
    print(f"ratio HTTP/(2 x numpy + empty)   p50 {http50 / (2 * np50 + empty50):5.2f}"
          f"   p99 {http99 / (2 * np99 + empty50):5.2f}   (target <= 1)")
    print(f"ratio upsert HTTP/Edge alone     {http_upsert / edge_upsert:5.2f}   (target >= 0.5)")
    print(f"query added over Edge + empty    p50 {(http50 - edge50 - empty50) * ms:+.2f} ms   (target <= +1 ms)")
    print(f"recall@10 at the default beam    {recall(found, rows, queries):.3f}   (uniform random vectors)")


if __name__ == "__main__":
    asyncio.run(main())
