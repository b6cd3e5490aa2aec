"""Engine process supervision for one machine: NATS, OpenBao, Valkey and workload processes."""

from caiplatform.supervisor.process import (
    ManagedProcess,
    ProcessSpec,
    ProcessStartError,
    ProcessSupervisor,
    free_port,
    port_is_free,
    tcp_ready,
)

__all__ = [
    "ManagedProcess",
    "ProcessSpec",
    "ProcessStartError",
    "ProcessSupervisor",
    "free_port",
    "port_is_free",
    "tcp_ready",
]
