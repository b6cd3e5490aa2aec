"""`framework=function-nodejs`: `index.js` exports `handle(event, context)` (sync or async).

`node node_shim.mjs <code dir>` imports `index.js` (CommonJS or ES module) and speaks the JSON-lines
protocol of `caiplatform.turns.line_function`.
"""

from __future__ import annotations

from pathlib import Path

from caiplatform.turns.line_function import LineFunctionRunner

SHIM = Path(__file__).with_name("node_shim.mjs")


class NodeFunctionRunner(LineFunctionRunner):
    framework = "function-nodejs"
    entry_file = "index.js"
    language = "Node.js"

    async def command(self) -> list[str]:
        return [self.which("node"), str(SHIM), str(self.code_dir)]
