"""`framework=function-nodejs`: `index.js` exports `handle(event, context)` (sync or async).

One long-lived `node` process per harness runs `node_shim.mjs`, which imports `index.js` (CommonJS or
ES module) and answers JSON lines: the harness writes `{id, event, context}`, the shim answers
`{id, value}` or `{id, error}`. Calls are multiplexed by id, so concurrent invokes run concurrently in
Node's event loop. The value is rendered like a Python function's (`caiplatform.turns.function`).

Go and Ruby functions follow the same shape in their language; where their toolchain is not installed,
loading fails with `ToolchainMissing`, whose message says so.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from caiplatform.turns.base import StreamLine, TurnContext, TurnError, TurnRunner
from caiplatform.turns.function import FunctionContext, render
from caiplatform.turns.loader import EntryError

SHIM = Path(__file__).with_name("node_shim.mjs")
# Lines can carry an 8 MiB event; asyncio's default line limit is 64 KiB.
LINE_LIMIT = 64 * 1024 * 1024

TOOLCHAINS = {"function-go": ("go", "Go"), "function-ruby": ("ruby", "Ruby")}


class ToolchainMissing(EntryError):
    """The language's toolchain is not installed on this machine."""


def check_toolchain(framework: str, env: Mapping[str, str] | None = None) -> None:
    """Go and Ruby functions need their toolchain; say clearly that it is missing."""
    binary, language = TOOLCHAINS[framework]
    search_path = (env or {}).get("PATH") or os.environ.get("PATH")
    if shutil.which(binary, path=search_path) is None:
        raise ToolchainMissing(
            f"{framework} needs the {language} toolchain (`{binary}`), which is not installed on this machine")
    raise ToolchainMissing(f"{framework} functions are not supported by this harness yet")


class NodeFunctionRunner(TurnRunner):
    framework = "function-nodejs"

    def __init__(self, code_dir: str | Path, *, env: Mapping[str, str] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.code_dir = Path(code_dir).resolve()
        self.env = dict(env if env is not None else os.environ)
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._start_lock = asyncio.Lock()

    @classmethod
    def from_dir(cls, code_dir: str | Path, **kwargs: Any) -> NodeFunctionRunner:
        if not (Path(code_dir) / "index.js").is_file():
            raise EntryError("function-nodejs functions need index.js in the code directory")
        return cls(code_dir, **kwargs)

    def _node(self) -> str:
        node = shutil.which("node", path=self.env.get("PATH") or os.environ.get("PATH"))
        if node is None:
            raise ToolchainMissing("function-nodejs needs Node.js (`node`), which is not installed on this machine")
        return node

    async def start(self) -> None:
        """Start node and wait until index.js loaded (raises `EntryError` with Node's reason)."""
        async with self._start_lock:
            if self._process is not None and self._process.returncode is None:
                return
            env = {**self.env, "PATH": self.env.get("PATH") or os.environ.get("PATH", "")}
            self._process = await asyncio.create_subprocess_exec(
                self._node(), str(SHIM), str(self.code_dir), cwd=str(self.code_dir), env=env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None, limit=LINE_LIMIT)
            assert self._process.stdout is not None
            first = await self._process.stdout.readline()
            try:
                hello = json.loads(first) if first else {"ready": False, "error": "node exited while loading index.js"}
            except ValueError:
                hello = {"ready": False, "error": f"unexpected output from node: {first[:200]!r}"}
            if not hello.get("ready"):
                await self.aclose()
                raise EntryError(str(hello.get("error") or "index.js did not load"))
            self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        stdout = self._process.stdout
        while line := await stdout.readline():
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            future = self._pending.pop(answer.get("id"), None)
            if future is not None and not future.done():
                future.set_result(answer)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(TurnError("the Node.js process exited during the call"))
        self._pending.clear()

    async def call(self, event: Any, context: dict[str, Any]) -> Any:
        await self.start()
        assert self._process is not None and self._process.stdin is not None
        call_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            payload = json.dumps({"id": call_id, "event": event, "context": context}, ensure_ascii=False)
            self._process.stdin.write(payload.encode() + b"\n")
            await self._process.stdin.drain()
            answer = await future
        finally:
            self._pending.pop(call_id, None)
        if "error" in answer:
            raise TurnError(str(answer["error"]))
        return answer.get("value")

    async def _turn(self, ctx: TurnContext) -> AsyncIterator[StreamLine]:
        event = ctx.body if ctx.body is not None else {
            "message": ctx.message, "session_id": ctx.session_id, "user_id": ctx.user_id}
        context = asdict(FunctionContext(self.agent, ctx.session_id, ctx.user_id, ctx.invocation_id, ctx.history))
        value = await self.call(event, context)
        ctx.value = value
        for line in ctx.output(render(value) if value is not None else ""):
            yield line

    async def aclose(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            if process.stdin is not None:
                process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), 2)
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
