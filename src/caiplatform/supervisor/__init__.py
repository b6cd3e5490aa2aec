"""Engine process supervision for one machine: NATS, OpenBao, Valkey and workload processes.

Typical use (the platform's `start()`): one `ProcessSupervisor(data_dir / "run")`, `reap_stale()` once,
then `start_nats`, `start_openbao`, and `sup.start(valkey_spec(...))` per memory store; `stop_all()` on
shutdown.
"""

from caiplatform.supervisor.engines import (
    EngineBinaryMissing,
    OpenBaoHandle,
    find_binary,
    start_nats,
    start_openbao,
    valkey_ping,
    valkey_spec,
)
from caiplatform.supervisor.process import (
    ManagedProcess,
    ProcessSpec,
    ProcessStartError,
    ProcessSupervisor,
    free_port,
    loopback_address_for,
    port_is_free,
    tcp_ready,
)

__all__ = [
    "EngineBinaryMissing",
    "ManagedProcess",
    "OpenBaoHandle",
    "ProcessSpec",
    "ProcessStartError",
    "ProcessSupervisor",
    "find_binary",
    "free_port",
    "loopback_address_for",
    "port_is_free",
    "start_nats",
    "start_openbao",
    "tcp_ready",
    "valkey_ping",
    "valkey_spec",
]
