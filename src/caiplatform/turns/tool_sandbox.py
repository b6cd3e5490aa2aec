"""`TOOL_SANDBOX` set on an agent: its own tool functions run in the platform's tool sandbox, not in its process.

The harness calls `sandbox_tools(runner, code_dir)` after loading the agent. Every tool function defined in
the agent's code directory (a module-level function or a class attribute, found by its source file and
qualified name) is replaced by a proxy with the same name, signature and docstring that sends the call to
`POST {SANDBOX_URL}/tool-calls` with the agent's workload key; the platform imports the function from the
agent's image in a fresh sandbox (2 CPU, 1 GiB, `timeout_s` 30 s) and answers its return value. A tool the
proxy cannot describe that way (a closure, a library's tool) keeps running in the process, and is logged.

Frameworks: LangGraph (the tools of every `ToolNode` of the compiled graph), ADK (function tools of the
root agent and its sub-agents) and CrewAI (the tools of every agent and task of each crew a turn kicks off:
a `@tool` function's `func`, or the `_run` of a `BaseTool` subclass that builds with no arguments, which the
sandbox then builds the same way).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from caiplatform.turns.code_tool import HTTP_SLACK_SECONDS, _endpoint

log = logging.getLogger(__name__)

OFF = ("", "0", "false", "no", "off")
DEFAULT_TIMEOUT_S = 30


class SandboxedToolError(RuntimeError):
    """The sandboxed call failed: the tool raised, was killed, or the platform refused the call."""


def enabled(env: Any) -> bool:
    return str(env.get("TOOL_SANDBOX") or "").strip().lower() not in OFF


def _address(func: Callable[..., Any], code_dir: Path) -> tuple[str, str] | None:
    """(module path relative to the code directory, qualified name), or None when not the agent's own."""
    func = inspect.unwrap(func)
    try:
        source = Path(inspect.getsourcefile(func) or "").resolve()
    except TypeError:
        return None
    if code_dir not in source.parents or "<locals>" in func.__qualname__:
        return None
    return str(source.relative_to(code_dir)), func.__qualname__


def _answer(response: httpx.Response) -> Any:
    try:
        data = response.json()
    except ValueError:
        raise SandboxedToolError(f"the tool sandbox answered {response.status_code}") from None
    if response.status_code != 200:
        raise SandboxedToolError(data.get("error", f"status {response.status_code}"))
    if data.get("killed") or data.get("message") or "error" in data:
        raise SandboxedToolError(data.get("error") or data.get("message"))
    return data.get("result")


def proxy(func: Callable[..., Any], module_path: str, qualname: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """A sync and an async stand-in for `func` that run it in the tool sandbox."""
    signature = inspect.signature(func)

    def request(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, dict[str, str], dict[str, Any]]:
        bound = signature.bind(*args, **kwargs)
        url, headers = _endpoint()
        url = url.removesuffix("/execute") + "/tool-calls"
        return url, headers, {"module_path": module_path, "function": qualname, "args": dict(bound.arguments)}

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        url, headers, body = request(args, kwargs)
        return _answer(httpx.post(url, json=body, headers=headers, timeout=DEFAULT_TIMEOUT_S + HTTP_SLACK_SECONDS))

    @functools.wraps(func)
    async def acall(*args: Any, **kwargs: Any) -> Any:
        url, headers, body = request(args, kwargs)
        async with httpx.AsyncClient(timeout=DEFAULT_TIMEOUT_S + HTTP_SLACK_SECONDS) as client:
            return _answer(await client.post(url, json=body, headers=headers))

    return call, acall


def _langgraph(graph: Any, code_dir: Path) -> list[str]:
    from langgraph.prebuilt import ToolNode

    moved = []
    for node in getattr(graph, "nodes", {}).values():
        bound = getattr(node, "bound", None)
        if not isinstance(bound, ToolNode):
            continue
        for tool in bound.tools_by_name.values():
            func = getattr(tool, "func", None) or getattr(tool, "coroutine", None)
            if func is None:
                continue
            address = _address(func, code_dir)
            if address is None:
                continue
            tool.func, tool.coroutine = proxy(func, *address)
            moved.append(tool.name)
    return moved


def _adk(agent: Any, code_dir: Path) -> list[str]:
    moved = []
    tools = getattr(agent, "tools", None)
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            if not inspect.isfunction(tool) or "tool_context" in inspect.signature(tool).parameters:
                continue
            address = _address(tool, code_dir)
            if address is None:
                continue
            sync, asynchronous = proxy(tool, *address)
            tools[i] = asynchronous if inspect.iscoroutinefunction(tool) else sync
            moved.append(tool.__name__)
    for sub in getattr(agent, "sub_agents", None) or []:
        moved += _adk(sub, code_dir)
    return moved


SANDBOXED = "__cai_tool_sandbox__"  # set on a CrewAI tool once its callable is a proxy


def _crewai_tool(tool: Any, code_dir: Path) -> bool:
    """Point one CrewAI tool at the tool sandbox (in place); whether it now runs there."""
    if getattr(tool, SANDBOXED, False):
        return True
    func = getattr(tool, "func", None)
    if callable(func) and "func" in type(tool).model_fields:  # `@tool` / `Tool(func=...)`
        address = _address(func, code_dir)
        if address is None:
            return False
        sync, asynchronous = proxy(func, *address)
        object.__setattr__(tool, "func", asynchronous if inspect.iscoroutinefunction(func) else sync)
    else:  # a BaseTool subclass of the agent's own: the sandbox builds it with no arguments and calls _run
        run = inspect.getattr_static(type(tool), "_run", None)
        address = _address(run, code_dir) if inspect.isfunction(run) else None
        if address is None or not _rebuilds(tool):
            return False
        sync, _ = proxy(tool._run, *address)  # the bound method: the model's arguments, without self
        object.__setattr__(tool, "_run", sync)
    object.__setattr__(tool, SANDBOXED, True)
    return True


def _rebuilds(tool: Any) -> bool:
    """Whether `type(tool)()` is this same tool (so the sandbox, which builds it that way, runs what the agent has)."""
    derived = {"args_schema", "current_usage_count"}  # made per instance from `_run`'s signature; a counter
    try:
        return bool(type(tool)().model_dump(exclude=derived) == tool.model_dump(exclude=derived))
    except Exception:  # noqa: BLE001 - needs arguments, or does not compare: it stays in the process
        return False


def crewai_tools(crew: Any, code_dir: Path) -> list[str]:
    """Route the crew's own tools (its agents', manager's and tasks') through the tool sandbox."""
    moved: list[str] = []
    kept: list[str] = []
    holders = [*(getattr(crew, "agents", None) or []), getattr(crew, "manager_agent", None),
               *(getattr(crew, "tasks", None) or [])]
    for holder in holders:
        for tool in getattr(holder, "tools", None) or []:
            (moved if _crewai_tool(tool, code_dir) else kept).append(str(getattr(tool, "name", tool)))
    if kept:
        log.debug("TOOL_SANDBOX: CrewAI tools %s are not the agent's own (or need arguments) and stay in the process",
                  ", ".join(kept))
    return list(dict.fromkeys(moved))


def sandbox_tools(runner: Any, code_dir: str | Path) -> list[str]:
    """Route the agent's own tools through the tool sandbox; the names of those moved."""
    root = Path(code_dir).resolve()
    framework = getattr(runner, "framework", "")
    if framework == "langgraph":
        moved = _langgraph(runner.graph, root)
    elif framework == "adk":
        moved = _adk(runner.root_agent, root)
    elif framework == "crewai":  # a turn kicks off a fresh crew: each one's tools are routed before it runs
        runner.prepare_crew = functools.partial(crewai_tools, code_dir=root)
        moved = crewai_tools(runner.fresh_crew(), root)
    else:
        log.warning("TOOL_SANDBOX is set but %s tools are not run in the tool sandbox yet", framework)
        return []
    log.info("TOOL_SANDBOX: tools %s run in the tool sandbox", ", ".join(moved) or "(none of the agent's own)")
    return moved
