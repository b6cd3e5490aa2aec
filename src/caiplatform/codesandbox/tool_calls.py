"""Sandboxed tool calls (document 1, Limits): with `TOOL_SANDBOX` set on an agent, the harness sends each call
of the agent's own tool functions here instead of running it in the agent's process.

`POST {SANDBOX_URL}/tool-calls` with the agent's workload key: `{module_path, function, args, timeout_s}`.
The call runs in a fresh sandbox holding the agent's image (code and Python environment, read-only), with
2 CPU and 1 GiB, the agent's own configuration variables but none of its credentials, and the host network
(a tool reaches its APIs as the agent would). `timeout_s` default 30, 1 to 120; body 1 MiB; an answer over
8 MiB is refused; the sandbox has 110 s to become ready.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select

from caiplatform.codesandbox.limits import TOOL, MiB
from caiplatform.codesandbox.pool import sandbox_limits, start_sandbox
from caiplatform.codesandbox.service import CodeSandboxService
from caiplatform.db import Database
from caiplatform.errors import Forbidden, Unavailable
from caiplatform.models.agents import SandboxToolAnswer, SandboxToolCall
from caiplatform.principal import Principal
from caiplatform.sandbox import Confinement, Sandbox, paths

log = logging.getLogger(__name__)

TOOL_RUNNER = Path(__file__).with_name("tool_runner.py")
AGENTS_ONLY = "sandboxed tool calls are for agents: this workload key belongs to no agent"
# Reserved and credential variables an agent has that its tools, outside its process, do not get.
WITHHELD = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE")


class ToolCallService:
    def __init__(self, db: Database, sandbox: Sandbox, resolve_image: Callable[[str], Awaitable[Any]],
                 *, unavailable: str | None = None):
        self.db = db
        self.sandbox = sandbox
        self.resolve_image = resolve_image
        self.unavailable = unavailable  # why this platform cannot run tool calls (503), if it cannot
        self.limits = TOOL
        self._ids = itertools.count(1)

    async def _agent(self, principal: Principal) -> tuple[str, Any, dict[str, str]]:
        from caiplatform.db.models import Agent

        agent = await self.db.run(lambda s: s.scalar(select(Agent).where(Agent.workload_key_id == principal.key_id)))
        if agent is None or not agent.image:
            raise Forbidden(AGENTS_ONLY)
        image = await self.resolve_image(agent.image)
        if image is None or "CAI_CODE_DIR" not in image.env:
            raise Unavailable(f"the image of agent {agent.name} is not on this machine")
        env = {k: str(v) for k, v in (agent.env or {}).items() if not any(w in k.upper() for w in WITHHELD)}
        return agent.name, image, env

    async def call(self, principal: Principal, project_id: str, request: SandboxToolCall) -> SandboxToolAnswer:
        CodeSandboxService.authorize(principal, project_id)
        module_path, function, args = request.module_path, request.function, request.args
        timeout_s = self.limits.check_timeout(request.timeout_s)
        if self.unavailable:
            raise Unavailable(self.unavailable)
        name, image, env = await self._agent(principal)
        code_dir = image.env["CAI_CODE_DIR"]
        python = image.command[0] if image.command and Path(image.command[0]).is_absolute() else "python3"
        own = paths.image_places(image.env, image.command)  # its code and environment, at /app/...
        ident = f"tool-{os.getpid()}-{next(self._ids)}"
        confinement = Confinement(read_only=tuple(host for host, _ in own), places=own,
                                  limits=sandbox_limits(self.limits), label=ident)
        begun = time.monotonic()
        try:
            started = await start_sandbox(self.sandbox, [python, str(TOOL_RUNNER), code_dir], confinement, ident,
                                          self.limits.wait_seconds, env=env, answer_limit=self.limits.response_bytes)
        except RuntimeError as exc:
            raise Unavailable(f"the tool sandbox did not become ready: {exc}") from None
        ready = time.monotonic()
        try:
            outcome = await started.run({"module_path": module_path, "function": function, "args": args},
                                        timeout_s)
        finally:
            await started.discard()
        duration = time.monotonic() - ready
        answer: dict[str, Any] = {"killed": None, "message": None, "duration_ms": int(duration * 1000),
                                  "startup_ms": int((ready - begun) * 1000), "timeout_s": timeout_s}
        if outcome.oom_killed:
            answer.update(killed="memory", message=f"the tool call was killed: it used more than {self.limits.memory}")
        elif outcome.answer is None and duration >= timeout_s:
            answer.update(killed="timeout", message=f"the tool call was killed: it ran longer than timeout_s ({timeout_s} s)")
        elif outcome.answer is None:
            answer["message"] = (f"the tool call returned no answer (its answer is capped at {self.limits.response_bytes // MiB} MiB, "
                                 f"or the sandbox died): {outcome.stderr.strip()[-500:]}")
        else:
            answer.update(outcome.answer)
        log.info("tool sandbox: %s ran %s:%s of agent %s in %d ms%s", ident, module_path, function, name,
                 answer["duration_ms"], f" (killed: {answer['killed']})" if answer["killed"] else "")
        return SandboxToolAnswer.model_validate(json.loads(json.dumps(answer, default=str)))
