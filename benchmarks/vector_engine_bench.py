"""Which embedded vector engine: a numpy scan, Qdrant Edge exact, or Qdrant Edge with HNSW?

A clustered data set (points drawn around a few hundred random centres, queries drawn the same way and
not among the points) of N x 384 cosine vectors goes through the `VectorEngine` port of each engine,
each in a child process of its own so that resident memory is its own. For each: upsert rate (batches
of 1000), query p50/p99 (top 10, no filter), recall@10 against the exact answer (numpy, computed here),
resident memory after loading, and reopen time (close, open the same directory, first query). The numpy
engine is the in-memory one (the search of the former embedded engine, which wrote it ahead to SQLite;
it keeps nothing, so it has no reopen time). Edge HNSW
also reports its background build time and the query/upsert p99 while the build runs, and recall and
p50 at a few search beams (`ef`). The baseline is the numpy engine in the same run: the ratio column is
query p50 / numpy's.

    python benchmarks/vector_engine_bench.py            # 10k and 100k points (several minutes)
    python benchmarks/vector_engine_bench.py --quick    # 10k points, fewer queries (under 2 minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from caiplatform.ports.vector import CollectionConfig, Point, VectorEngine

DIMS = 384
TOP_K = 10
BATCH = 1000
EFS = (64, 128, 256)


def clustered(n: int, queries: int, *, clusters: int = 200, spread: float = 0.06, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Points and queries around `clusters` random unit centres (per-dimension noise `spread`)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, DIMS)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)

    def draw(count: int) -> np.ndarray:
        rows = centres[rng.integers(0, clusters, count)] + rng.normal(scale=spread, size=(count, DIMS)).astype(np.float32)
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)

    return draw(n), draw(queries)


def exact_top(points: np.ndarray, queries: np.ndarray) -> list[set[int]]:
    answers = []
    for q in queries:
        scores = points @ q
        answers.append(set(np.argpartition(-scores, TOP_K)[:TOP_K].tolist()))
    return answers


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_engine(kind: str, directory: Path) -> VectorEngine:
    if kind == "numpy":
        from caiplatform.adapters.memory.vector import InMemoryVectorEngine

        return InMemoryVectorEngine()
    from caiplatform.adapters.edge.indexing import IndexSettings
    from caiplatform.adapters.edge.vector import EdgeVectorEngine

    # exact: never index; hnsw: index whatever is there (1 KB), so both sizes get a graph
    return EdgeVectorEngine(directory, index=IndexSettings(threshold_kb=10**9 if kind == "edge-exact" else 1))


async def query_times(engine: VectorEngine, queries: np.ndarray, truth: list[set[int]]) -> tuple[list[float], float]:
    times, hits = [], 0
    for q, expected in zip(queries, truth, strict=True):
        start = time.perf_counter()
        found = await engine.query("bench", q.tolist(), top_k=TOP_K, with_payload=False)
        times.append(time.perf_counter() - start)
        hits += len(expected & {int(h.id) for h in found})
    return times, hits / (TOP_K * len(queries))


async def during_build(engine: Any, extra: np.ndarray, queries: np.ndarray) -> dict[str, float]:
    """Queries and small upserts while the background build runs: their p99 shows whether it blocks."""
    query_ms, upsert_ms, at = [], [], 0
    while engine._builder._tasks:
        start = time.perf_counter()
        await engine.query("bench", queries[at % len(queries)].tolist(), top_k=TOP_K, with_payload=False)
        query_ms.append(time.perf_counter() - start)
        if at < len(extra):
            start = time.perf_counter()
            await engine.upsert("bench", [Point(10_000_000 + at, extra[at].tolist())])
            upsert_ms.append(time.perf_counter() - start)
        at += 1
        await asyncio.sleep(0.02)
    return {
        "build_query_p99_ms": 1000 * percentiles(query_ms or [0.0])[1],
        "build_upsert_p99_ms": 1000 * percentiles(upsert_ms or [0.0])[1],
        "build_writes": float(min(at, len(extra))),
    }


async def measure(kind: str, n: int, queries_count: int) -> dict[str, float]:
    points, queries = clustered(n, queries_count)
    truth = exact_top(points, queries)
    result: dict[str, float] = {}
    base_rss = rss_mb()
    with tempfile.TemporaryDirectory() as tmp:
        engine = open_engine(kind, Path(tmp))
        await engine.start()
        await engine.create_collection("bench", CollectionConfig(dimensions=DIMS))
        start = time.perf_counter()
        for at in range(0, n, BATCH):
            await engine.upsert("bench", [Point(i, points[i].tolist()) for i in range(at, min(n, at + BATCH))])
        result["upsert_per_s"] = n / (time.perf_counter() - start)
        if kind == "edge-hnsw":
            start = time.perf_counter()
            extra, _ = clustered(200, 1, seed=11)
            result.update(await during_build(engine, extra, queries))
            await engine.wait_indexed()
            result["build_s"] = time.perf_counter() - start
        for _ in range(3):  # warm up
            await engine.query("bench", queries[0].tolist(), top_k=TOP_K)
        times, result["recall"] = await query_times(engine, queries, truth)
        p50, p99 = percentiles(times)
        result["p50_ms"], result["p99_ms"] = 1000 * p50, 1000 * p99
        if kind == "edge-hnsw":
            for ef in EFS:
                engine.index = replace(engine.index, ef=ef)  # type: ignore[attr-defined]
                times, recall = await query_times(engine, queries, truth)
                result[f"ef{ef}_recall"], result[f"ef{ef}_p50_ms"] = recall, 1000 * percentiles(times)[0]
        result["rss_mb"] = rss_mb() - base_rss
        if kind.startswith("edge"):
            shard = engine._collections["bench"].shard  # type: ignore[attr-defined]
            result["indexed"] = shard.info().indexed_vectors_count / n
        await engine.close()
        if kind == "numpy":
            result["reopen_s"] = float("nan")
            return result
        start = time.perf_counter()
        again = open_engine(kind, Path(tmp))
        await again.start()
        await again.query("bench", queries[0].tolist(), top_k=TOP_K)
        result["reopen_s"] = time.perf_counter() - start
        await again.close()
    return result


def child(kind: str, n: int, queries: int, out: Any) -> None:
    out.send(asyncio.run(measure(kind, n, queries)))


def run(kind: str, n: int, queries: int) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=child, args=(kind, n, queries, send))
    process.start()
    while not receive.poll(1.0):
        if not process.is_alive():
            raise SystemExit(f"the {kind} run at {n} points failed (exit code {process.exitcode})")
    result = receive.recv()
    process.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10k points and 100 queries only")
    parser.add_argument("--sizes", type=int, nargs="*", default=None)
    parser.add_argument("--queries", type=int, default=None)
    parser.add_argument("--engines", nargs="*", default=["numpy", "edge-exact", "edge-hnsw"])
    args = parser.parse_args()
    sizes = args.sizes or ([10_000] if args.quick else [10_000, 100_000])
    queries = args.queries or (100 if args.quick else 300)
    print(f"clustered {DIMS}-d cosine, top {TOP_K}, {queries} queries, upsert batches of {BATCH}")
    header = ("points", "engine", "upsert/s", "p50 ms", "p99 ms", "x numpy p50", "recall@10", "RSS MB", "reopen s",
              "in HNSW")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for n in sizes:
        results = {kind: run(kind, n, queries) for kind in args.engines}
        baseline = results.get("numpy", {}).get("p50_ms")
        for kind, r in results.items():
            ratio = f"{r['p50_ms'] / baseline:.2f}" if baseline else "-"
            print(f"| {n:,} | {kind} | {r['upsert_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {ratio} | "
                  f"{r['recall']:.3f} | {r['rss_mb']:.0f} | {r['reopen_s']:.2f} | {r.get('indexed', 0):.0%} |")
        hnsw = results.get("edge-hnsw")
        if hnsw:
            beams = ", ".join(f"ef {ef}: recall {hnsw[f'ef{ef}_recall']:.3f} p50 {hnsw[f'ef{ef}_p50_ms']:.2f} ms" for ef in EFS)
            print(f"  {n:,} edge-hnsw: background build {hnsw['build_s']:.1f} s; while it ran, query p99 "
                  f"{hnsw['build_query_p99_ms']:.1f} ms and upsert p99 {hnsw['build_upsert_p99_ms']:.1f} ms "
                  f"over {hnsw['build_writes']:.0f} writes; {beams}")


if __name__ == "__main__":
    main()
