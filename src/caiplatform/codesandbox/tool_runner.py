"""What a sandboxed tool call runs: the agent's own tool function, imported from its code, in a sandbox.

Run with the agent's Python environment and `<code_dir>` as argument. Protocol as `runner.py`: it says
`ready`, reads one JSON line `{module_path, function, args}`, imports `<code_dir>/<module_path>` (the code
directory first on `sys.path`, so sibling modules import), calls `function(**args)` (awaiting a coroutine)
and answers one JSON line `{result}` or `{error}`. A name that holds a framework's tool object (CrewAI's or
LangChain's `@tool`) calls the function it wraps (`.func`); a method of a class (a CrewAI `BaseTool`
subclass's `_run`) is called on an instance built with no arguments.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any

from caiplatform.sandbox.limits import memory_rlimit


def call(code_dir: Path, request: dict) -> dict:
    path = code_dir / request["module_path"]
    sys.path.insert(0, str(code_dir))
    spec = importlib.util.spec_from_file_location("cai_tool_" + path.stem, path)
    if spec is None or spec.loader is None:
        return {"error": f"cannot import {request['module_path']}"}
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    target: Any = module
    for part in request["function"].split("."):
        owner, target = target, getattr(target, part)
        if inspect.isclass(owner) and inspect.isfunction(inspect.getattr_static(owner, part)):
            target = getattr(owner(), part)  # a method: on an instance, as the agent's tool object had it
        elif not inspect.isroutine(target) and not inspect.isclass(target) and callable(getattr(target, "func", None)):
            target = target.func  # a `@tool` object: the function it wraps
    value = target(**(request.get("args") or {}))
    if inspect.isawaitable(value):
        value = asyncio.run(value)  # type: ignore[arg-type]
    return {"result": value}


def main() -> int:
    channel = sys.stdout.buffer
    sys.stdout = sys.stderr  # what the tool prints goes to the sandbox's log, not the answer channel
    code_dir = Path(sys.argv[1])
    channel.write(b"ready\n")
    channel.flush()
    line = sys.stdin.buffer.readline()
    if not line:
        return 0
    try:
        answer = call(code_dir, json.loads(line))
        text = json.dumps(answer, default=str)
    except BaseException as exc:  # noqa: BLE001 - the tool's failure is the answer
        # Under the rlimit fallback an allocation fails instead of a kernel kill (the platform says `memory`).
        out_of_memory = isinstance(exc, MemoryError) and memory_rlimit() is not None
        text = json.dumps({"error": f"{type(exc).__name__}: {exc}", "out_of_memory": out_of_memory})
    channel.write(text.encode() + b"\n")
    channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
