"""The sandbox of workload processes and build steps on the local runtime (bubblewrap + cgroups)."""

from caiplatform.sandbox.bubblewrap import (
    DEFAULT_HOST_UID,
    Confinement,
    Launch,
    Sandbox,
    SandboxUnavailable,
    sandbox_env,
    shared_sandbox,
    workload_limits,
)
from caiplatform.sandbox.limits import Limits, cpu_millis, memory_bytes

__all__ = [
    "DEFAULT_HOST_UID",
    "Confinement",
    "Launch",
    "Limits",
    "Sandbox",
    "SandboxUnavailable",
    "cpu_millis",
    "memory_bytes",
    "sandbox_env",
    "shared_sandbox",
    "workload_limits",
]
