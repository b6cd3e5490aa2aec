"""`caiplatform serve` as a real process on a loopback port, for end-to-end tests.

The process runs the `caiplatform` package the tests import (its source directory goes first on
`PYTHONPATH`), signs in the bootstrap admin of `caiplatform.testing.http`, writes its output to a log
file beside the data dir, and runs in a session of its own so that a stop reaches what it started.
`start()` waits until `/healthz` answers with anything but `starting` (the server answers while its
engines come up; see `caiplatform_server.app.gates_of`); `stop()` ends it (SIGTERM, then SIGKILL to the whole session).
Start and stop again on the same port and data dir to test a restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import httpx

import caiplatform
from caiplatform.testing.engines import free_port
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD

SOURCE_DIR = Path(caiplatform.__file__).resolve().parents[1]


class ServeFailed(AssertionError):
    """The server exited early or did not answer in time; the message carries the end of its log."""


class ServeProcess:
    def __init__(
        self,
        data_dir: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
        unset: Iterable[str] = (),
        port: int | None = None,
        startup_timeout: float = 90.0,
        python: str | None = None,
        cwd: Path | None = None,
        answering: bool = False,
    ):
        self.data_dir = Path(data_dir)
        self.args = args
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.data_dir.parent / f"serve-{self.port}.log"
        self.startup_timeout = startup_timeout
        # The interpreter as an operator names it (a relative path is relative to `cwd`, where it starts).
        self.python = python or sys.executable
        self.cwd = cwd
        self.answering = answering  # `start()` returns at the first answer, `starting` included
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, (str(SOURCE_DIR), os.environ.get("PYTHONPATH")))),
            "CAI_ADMIN_EMAIL": ADMIN_EMAIL,
            "CAI_ADMIN_PASSWORD": ADMIN_PASSWORD,
        }
        for name in unset:
            self.env.pop(name, None)
        self.env.update(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def start(self) -> ServeProcess:
        argv = [self.python, "-m", "caiplatform", "serve", "--port", str(self.port),
                "--data-dir", str(self.data_dir), *self.args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=self.cwd)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServeFailed(f"caiplatform serve exited early:\n{self.log_tail()}")
            try:
                # Any answer but `starting` (the server answers while its engines come up): started.
                health = httpx.get(f"{self.base_url}/healthz", timeout=1)
                if self.answering or not _starting(health):
                    return self
                time.sleep(0.05)
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise ServeFailed(f"caiplatform serve did not answer in {self.startup_timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _starting(health: httpx.Response) -> bool:
    """`/healthz` says the server is still bringing its engines up (503 `{"status": "starting"}`)."""
    if health.status_code != 503:
        return False
    try:
        return bool(health.json().get("status") == "starting")
    except ValueError:
        return False
