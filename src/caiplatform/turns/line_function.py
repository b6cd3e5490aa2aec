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

The child's standard error passes through the harness, which keeps its last lines: a child that ran out of
memory (its runtime's own words: V8's "JavaScript heap out of memory", C++'s `std::bad_alloc`, Go's
"runtime: out of memory", Ruby's `NoMemoryError`), or a call that failed to allocate (the Node.js and
Ruby shims' `out_of_memory` answer), marks the runner `out_of_memory`, which the harness acts on under a memory
rlimit (docs/decisions/sandbox.md).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from caiplatform.sandbox.limits import OUT_OF_MEMORY_SIGNS, STDERR_TAIL
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
        self._stderr: asyncio.Task[None] | None = None
        self._stderr_tail = b""

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
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                limit=LINE_LIMIT)
            assert self._process.stdout is not None and self._process.stderr is not None
            self._stderr_tail = b""
            self._stderr = asyncio.create_task(self._relay_stderr(self._process.stderr))
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

    async def _relay_stderr(self, stream: asyncio.StreamReader) -> None:
        """The child's standard error to the harness's own (the instance's log), keeping its tail."""
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        while chunk := await stream.read(65536):
            self._stderr_tail = (self._stderr_tail + chunk)[-STDERR_TAIL:]
            if out is not None:
                out.write(chunk)
                out.flush()
            else:
                sys.stderr.write(chunk.decode("utf-8", "replace"))

    async def _child_ended(self, process: asyncio.subprocess.Process) -> None:
        """The child closed its output: wait for its last words, note whether it ran out of memory."""
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(process.wait())]
        if self._stderr is not None:
            waits.append(self._stderr)
        await asyncio.wait(waits, timeout=5)  # bounded: a grandchild may hold the pipe open
        tail = self._stderr_tail.decode("utf-8", "replace")
        if any(sign in tail for sign in OUT_OF_MEMORY_SIGNS):
            self.out_of_memory = True

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        process, stdout = self._process, self._process.stdout
        while line := await stdout.readline():
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            future = self._pending.pop(answer.get("id"), None)
            if future is not None and not future.done():
                future.set_result(answer)
        await self._child_ended(process)
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
            if answer.get("out_of_memory"):
                self.out_of_memory = True
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
        for task in (self._reader, self._stderr):
            if task is not None:
                task.cancel()
        self._reader = self._stderr = None


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
