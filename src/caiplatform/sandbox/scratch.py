"""A temporary directory of this server process, outside the data directory (a socket path has at most 107
bytes; an overlay's layer path is shown to the workload), swept once its process is gone.

`mkdtemp` makes it 0700 and the server's; an `owner` file names the process, so the next server removes the
directories a crashed one left (`atexit` removes this process's own on a normal exit).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def server_temp_dir(prefix: str) -> Path:
    """A new directory `<tmp>/<prefix>XXXXXXXX` of this process (after removing those of dead processes)."""
    sweep(prefix)
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    (directory / "owner").write_text(str(os.getpid()))
    atexit.register(shutil.rmtree, directory, True)
    return directory


def sweep(prefix: str) -> None:
    """Remove the directories of `prefix` whose server is gone (a crashed run leaves its directory)."""
    for root in Path(tempfile.gettempdir()).glob(prefix + "*"):
        with contextlib.suppress(OSError, ValueError):
            if root.is_symlink() or root.stat().st_uid != os.geteuid():
                continue
            pid = int((root / "owner").read_text().strip())
            if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(root, ignore_errors=True)
