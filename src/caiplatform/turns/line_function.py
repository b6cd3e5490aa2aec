"""Functions in another language than Python (`function-nodejs`, `function-ruby`, `function-go`).

Each runs as one long-lived child process of the harness that speaks JSON lines: its first line out
is `{ready: true}` or `{ready: false, error}` (the entry file could not be loaded); then the harness
writes `{id, event, context}` per call and the child answers `{id, value}` or `{id, error}`. Calls are
multiplexed by id, so concurrent invokes run concurrently in the child (Node's event loop, a Ruby
thread or a goroutine per call). The function's own standard output goes to standard error, so it
cannot corrupt the protocol. The value is rendered like a Python function's
(`caiplatform.turns.function`).

A subclass says which command starts the child (`command()`), raising `ToolchainMissing` when the
language's toolchain is not installed.
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
from typing import Any, ClassVar

from caiplatform.turns.base import StreamLine, TurnContext, TurnError, TurnRunner
from caiplatform.turns.function import FunctionContext, render
from caiplatform.turns.loader import EntryError

# Lines can carry an 8 MiB event; asyncio's default line limit is 64 KiB.
LINE_LIMIT = 64 * 1024 * 1024


class ToolchainMissing(EntryError):
    """The language's toolchain is not installed on this machine."""


class LineFunctionRunner(TurnRunner):
    framework: ClassVar[str]
    entry_file: ClassVar[str]
    language: ClassVar[str]  # as people name it: "Node.js", "Ruby", "Go"

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
    def from_dir(cls, code_dir: str | Path, **kwargs: Any) -> LineFunctionRunner:
        if not (Path(code_dir) / cls.entry_file).is_file():
            raise EntryError(f"{cls.framework} functions need {cls.entry_file} in the code directory")
        return cls(code_dir, **kwargs)

    def which(self, tool: str) -> str:
        """The toolchain's binary on the function's PATH, or `ToolchainMissing` naming it."""
        found = shutil.which(tool, path=self.env.get("PATH") or os.environ.get("PATH"))
        if found is None:
            raise ToolchainMissing(
                f"{self.framework} needs the {self.language} toolchain (`{tool}`), which is not installed on this machine")
        return found

    async def command(self) -> list[str]:
        """The child's argv."""
        raise NotImplementedError

    def child_env(self) -> dict[str, str]:
        return {**self.env, "PATH": self.env.get("PATH") or os.environ.get("PATH", "")}

    async def start(self) -> None:
        """Start the child and wait until the entry loaded (raises `EntryError` with the child's reason)."""
        async with self._start_lock:
            if self._process is not None and self._process.returncode is None:
                return
            argv = await self.command()
            self._process = await asyncio.create_subprocess_exec(
                *argv, cwd=str(self.code_dir), env=self.child_env(),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None, limit=LINE_LIMIT)
            assert self._process.stdout is not None
            first = await self._process.stdout.readline()
            try:
                hello = json.loads(first) if first else {
                    "ready": False, "error": f"the {self.language} process exited while loading {self.entry_file}"}
            except ValueError:
                hello = {"ready": False, "error": f"unexpected output from the {self.language} process: {first[:200]!r}"}
            if not hello.get("ready"):
                await self.aclose()
                raise EntryError(str(hello.get("error") or f"{self.entry_file} did not load"))
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
                future.set_exception(TurnError(f"the {self.language} process exited during the call"))
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


def runner_class(framework: str) -> type[LineFunctionRunner]:
    """The runner of a function framework in another language."""
    if framework == "function-nodejs":
        from caiplatform.turns.nodejs import NodeFunctionRunner

        return NodeFunctionRunner
    if framework == "function-ruby":
        from caiplatform.turns.ruby import RubyFunctionRunner

        return RubyFunctionRunner
    if framework == "function-go":
        from caiplatform.turns.golang import GoFunctionRunner

        return GoFunctionRunner
    raise EntryError(f"unsupported framework: {framework}")
