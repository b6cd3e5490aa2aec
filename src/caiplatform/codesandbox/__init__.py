"""The code sandbox of document 1: agents run snippets in fresh sandboxes taken from a warm pool.

`WarmPool` (pool.py) keeps bubblewrap sandboxes started and waiting; `CodeSandboxService` (service.py)
checks the caller (a workload credential of the project) and the input, runs the snippet in one warm
sandbox and discards it; `runner.py` is what runs inside. Limits and messages: limits.py.
"""

from caiplatform.codesandbox.limits import CODE, NO_WARM_SANDBOX, TOOL, SandboxLimits
from caiplatform.codesandbox.pool import WarmPool
from caiplatform.codesandbox.service import CodeSandboxService

__all__ = ["CODE", "NO_WARM_SANDBOX", "TOOL", "CodeSandboxService", "SandboxLimits", "WarmPool"]
