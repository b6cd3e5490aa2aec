"""Document 1's two sets of sandbox limits (Limits table), and what we chose where it says nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from caiplatform.errors import BadRequest

MiB = 1024 * 1024


@dataclass(frozen=True)
class SandboxLimits:
    timeout_default: int
    timeout_max: int
    cpu: str
    memory: str
    pool_size: int
    wait_seconds: float  # how long a caller waits for a warm sandbox
    body_bytes: int
    stdout_cap: int = 1 * MiB
    stderr_cap: int = 1 * MiB
    files_cap: int = 4 * MiB  # output files, together
    max_files: int = 100
    pids: int = 256
    response_bytes: int = 8 * MiB  # a tool call's answer, larger is refused
    timeout_min: int = 1

    @property
    def timeout_message(self) -> str:
        return f"timeout_s must be between {self.timeout_min} and {self.timeout_max}"

    def check_timeout(self, value: Any) -> int:
        """`timeout_s` as given (an integer within bounds), the default when absent; else the 400."""
        if value is None:
            return self.timeout_default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value \
                or not self.timeout_min <= int(value) <= self.timeout_max:
            raise BadRequest(self.timeout_message)
        return int(value)


# Code sandbox execution: timeout_s default 20, 1..60; warm pool of 3; 1 CPU, 512 MiB; 30 s wait.
CODE = SandboxLimits(timeout_default=20, timeout_max=60, cpu="1", memory="512Mi", pool_size=3, wait_seconds=30.0,
                     body_bytes=8 * MiB)
# Sandboxed tool call: timeout_s default 30, 1..120; body 1 MiB; response 8 MiB; readiness wait 110 s; 2 CPU 1 GiB.
TOOL = SandboxLimits(timeout_default=30, timeout_max=120, cpu="2", memory="1Gi", pool_size=3, wait_seconds=110.0,
                     body_bytes=1 * MiB)

NO_WARM_SANDBOX = "no warm sandbox pod available, try again shortly"
