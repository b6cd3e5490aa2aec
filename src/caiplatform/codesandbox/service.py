"""The code sandbox service: a running agent sends a snippet, a fresh warm sandbox runs it, then is discarded.

Only a workload credential (`cai_wl_...`, the `CAI_PROJECT_KEY` of an agent or MCP server) of the
project named in the path may call it: no credential is 401, any other credential 403, another
project's workload 404 (as for the project secret token of document 2).
"""

from __future__ import annotations

import base64
import logging
import shutil
import time
from typing import Any, Literal, Protocol

from caiplatform.codesandbox.limits import SandboxLimits
from caiplatform.codesandbox.models import ExecuteRequest, ExecuteResult
from caiplatform.codesandbox.pool import GRACE_SECONDS, RunOutcome, WarmPool
from caiplatform.domain.codesandbox import SNIPPET_DIR, check_files
from caiplatform.errors import BadRequest, Forbidden, NotFound, Unauthenticated
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.sandbox import paths
from caiplatform.services.access import AUTH_REQUIRED
from caiplatform.validation import project_uuid

log = logging.getLogger(__name__)

WORKLOAD_ONLY = "the code sandbox only accepts an agent's workload credential (CAI_PROJECT_KEY)"


def languages() -> dict[str, list[str]]:
    """Language -> interpreter argv (the snippet's path is appended), for those present on this server."""
    found: dict[str, list[str]] = {"python": [paths.python()]}
    shell = shutil.which("bash") or shutil.which("sh")
    if shell:
        found["shell"] = [shell]
    node = shutil.which("node") or shutil.which("nodejs")
    if node:
        found["nodejs"] = [node]
    return found


EXTENSIONS = {"python": "py", "shell": "sh", "nodejs": "js"}


class SandboxPool(Protocol):
    """A warm pool: `WarmPool` here, `adapters.kubernetes.codepool.KubernetesWarmPool` on a cluster."""

    def start(self) -> None: ...
    async def acquire(self) -> tuple[Any, float]: ...
    async def release(self, sandbox: Any, *, ran: bool = True) -> None: ...
    def describe(self) -> dict[str, Any]: ...
    async def close(self) -> None: ...


class CodeSandboxService:
    def __init__(self, pool: WarmPool | SandboxPool, limits: SandboxLimits):
        self.pool = pool
        self.limits = limits
        # The interpreters where the snippets run: this server's, or those of the pool's pod image.
        self.languages: dict[str, list[str]] = getattr(pool, "languages", None) or languages()

    # -- who may call ------------------------------------------------------------------------------

    @staticmethod
    def authorize(principal: Principal, project_id: str) -> str:
        if not principal.authenticated:
            raise Unauthenticated(AUTH_REQUIRED)
        if principal.kind is not PrincipalKind.WORKLOAD:
            raise Forbidden(WORKLOAD_ONLY)
        try:
            pid = project_uuid(project_id)
        except BadRequest:
            raise NotFound("not found") from None
        if principal.project_id != pid:
            raise NotFound("not found")
        return pid

    # -- input -------------------------------------------------------------------------------------

    def _language(self, value: Any) -> str:
        language = "python" if value is None else value
        if language not in self.languages:
            raise BadRequest(f"unsupported 'language': {language} (available here: {', '.join(self.languages)})")
        return str(language)

    @staticmethod
    def _files(value: Any) -> list[dict[str, str]]:
        return check_files(value)

    # -- the call ----------------------------------------------------------------------------------

    async def execute(self, principal: Principal, project_id: str, request: ExecuteRequest) -> ExecuteResult:
        pid = self.authorize(principal, project_id)
        code = request.code
        timeout_s = self.limits.check_timeout(request.timeout_s)
        language = self._language(request.language)
        files = self._files([file.model_dump() for file in request.files])
        snippet = f"{SNIPPET_DIR}/snippet.{EXTENSIONS[language]}"
        files.append({"path": snippet, "content_base64": base64.b64encode(code.encode()).decode()})
        run = {
            "argv": [*self.languages[language], snippet], "files": files, "timeout_s": timeout_s,
            "stdout_cap": self.limits.stdout_cap, "stderr_cap": self.limits.stderr_cap,
            "files_cap": self.limits.files_cap, "max_files": self.limits.max_files,
        }
        sandbox, waited = await self.pool.acquire()
        begun = time.monotonic()
        try:
            outcome = await sandbox.run(run, timeout_s + GRACE_SECONDS)
        finally:
            await self.pool.release(sandbox)
        duration = time.monotonic() - begun
        result = self._result(outcome, language, timeout_s, duration, waited)
        log.info("code sandbox: %s ran a %s snippet for project %s (key %s): exit %s%s in %d ms", sandbox.id,
                 language, pid, principal.key_id, result.exit_code,
                 f", killed ({result.killed})" if result.killed else "", result.duration_ms)
        return result

    def _result(self, outcome: RunOutcome, language: str, timeout_s: int, duration: float, waited: float) -> ExecuteResult:
        answer = outcome.answer or {}
        killed: Literal["timeout", "memory"] | None = None
        message = None
        if outcome.oom_killed:
            killed = "memory"
            message = (f"the snippet was killed: it used more than the sandbox's memory limit "
                       f"({self.limits.memory}) (OOMKilled)")
        elif answer.get("timed_out") or (outcome.answer is None and duration >= timeout_s):
            killed = "timeout"
            message = f"the snippet was killed: it ran longer than timeout_s ({timeout_s} s)"
        elif outcome.answer is None:
            message = f"the sandbox stopped before the snippet finished: {outcome.stderr.strip() or 'no answer'}"
        result = ExecuteResult(
            exit_code=answer.get("exit_code"), stdout=answer.get("stdout", ""), stderr=answer.get("stderr", ""),
            stdout_truncated=bool(answer.get("stdout_truncated")), stderr_truncated=bool(answer.get("stderr_truncated")),
            duration_ms=int(duration * 1000), waited_ms=int(waited * 1000), killed=killed, message=message,
            files=answer.get("files") or [], files_truncated=bool(answer.get("files_truncated")),
            language=language,  # type: ignore[arg-type]
            timeout_s=timeout_s,
        )
        return result
