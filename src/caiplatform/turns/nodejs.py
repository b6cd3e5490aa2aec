"""`framework=function-nodejs`: `index.js` exports `handle(event, context)` (sync or async).

`node node_shim.mjs <code dir>` imports `index.js` (CommonJS or ES module) and speaks the JSON-lines
protocol of `caiplatform.turns.line_function`.
"""

from __future__ import annotations

from pathlib import Path

from caiplatform.sandbox.limits import memory_rlimit
from caiplatform.turns.line_function import LineFunctionRunner

SHIM = Path(__file__).with_name("node_shim.mjs")


class NodeFunctionRunner(LineFunctionRunner):
    framework = "function-nodejs"
    entry_file = "index.js"
    language = "Node.js"

    async def command(self) -> list[str]:
        return [self.which("node"), *heap_flags(), str(SHIM), str(self.code_dir)]


def heap_flags() -> list[str]:
    """Under a memory rlimit, V8's heap gets half of it: Node.js sizes its heap from a cgroup's limit but
    cannot see an rlimit, and a heap that outgrows it dies of a failed allocation without saying so (a
    segmentation fault) instead of V8's "heap out of memory" (docs/decisions/sandbox.md)."""
    limit = memory_rlimit()
    return [f"--max-old-space-size={max(16, limit // 2 // 2**20)}"] if limit is not None else []
