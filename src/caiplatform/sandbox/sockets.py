"""Directories for the Unix sockets the platform reaches sandboxed servers by (instances, hosted MCP servers).

A server in a network namespace of its own listens on no port the host can reach: it listens on a Unix
socket in a directory made for that one run and bound into its sandbox alone (`Confinement.socket_dir`,
seen at `/run/cai` inside). The directories live under one owner-only root per server process in the
system's temporary directory (a Unix socket path has at most 107 bytes, so no data-directory path), named
`cai-run-*` (`scratch.server_temp_dir`: a root whose server is gone, after a crash, is removed by the next
server that makes one).
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

from caiplatform.sandbox.scratch import server_temp_dir

PREFIX = "cai-run-"


class SocketDirs:
    """This server's socket directories: `new()` one per run, `remove(dir)` when it ends, `close()` all."""

    def __init__(self) -> None:
        self._root: Path | None = None

    def new(self) -> Path:
        """A new directory for one run's socket (hand it to the sandbox uid before the run starts)."""
        if self._root is None:
            self._root = server_temp_dir(PREFIX)  # 0700, the server's
        directory = self._root / secrets.token_hex(6)
        directory.mkdir(mode=0o700)
        return directory

    @staticmethod
    def remove(directory: Path) -> None:
        shutil.rmtree(directory, ignore_errors=True)

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

