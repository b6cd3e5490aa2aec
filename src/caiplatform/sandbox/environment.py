"""How a sandboxed program gets its variables without any process outside the sandbox having them.

The variables of a workload are a tenant's choice (`PATCH /v1/agents/{name}/env`, a service's `env`, an MCP
server's): `LD_PRELOAD`, `BASH_ENV`, `GCONV_PATH`, ... change what a dynamically linked program or a shell
does before its first line. So nothing that runs with the platform's rights sees them: the host-side
launcher (`/bin/sh`, then `bwrap`) runs with `LAUNCHER_ENV` alone, bubblewrap clears the environment
(`--clearenv`) for everything it starts, and `setpriv` (which drops root inside the user namespace) runs with
that empty environment too. The variables travel as a file: bubblewrap copies the contents of a descriptor
(a memfd, never a path on disk) to `ENV_FILE` inside the sandbox (`--ro-bind-data`), and the last step
before the program, running as the unprivileged uid with no capabilities, loads it and `exec`s the program:

- `/bin/sh` started with an empty environment (so no `ENV`/`BASH_ENV` of its own) sources a file of
  `export NAME='value'` lines, values single-quoted (a quote inside is written `'\\''`): nothing in a value is
  ever evaluated. The common case, about a millisecond.
- Names a POSIX shell cannot export (the env route accepts any name; Kubernetes allows `a.b` or `a-b`) or
  that a shell treats specially (`LINENO`, `RANDOM`, bash's read-only `UID`, ...) make the loader the
  platform's own Python (`-I -S`: no variable, no site directory changes it) reading NUL-separated
  `NAME=value` entries instead.

No value is ever on a command line (every user of the host reads `/proc/<pid>/cmdline`), and the loader's
own behaviour depends on no variable: it starts with none.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from caiplatform.sandbox import paths

# Beside, not inside, the socket directory bound at /run/cai (a file made there would land in the host directory).
ENV_FILE = "/run/cai-env"
# The whole environment of the host-side launcher chain; nothing of the workload's.
LAUNCHER_ENV: dict[str, str] = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Names some /bin/sh (dash or bash) gives a meaning of its own: exported from a script they would not carry
# the value the workload was given, or (bash's read-only ones) stop the script.
_SHELL_SPECIAL = frozenset({
    "LINENO", "RANDOM", "SRANDOM", "SECONDS", "EPOCHSECONDS", "EPOCHREALTIME", "HISTCMD", "UID", "EUID", "PPID",
    "GROUPS", "FUNCNAME", "SHELLOPTS", "DIRSTACK", "OPTIND", "OPTARG", "IFS", "PS4", "_", "COMP_WORDBREAKS",
})
SHELL_LOADER = f'. {ENV_FILE} && exec "$@"'
PYTHON_LOADER = (
    "import os,sys\n"
    f"data=open({ENV_FILE!r},'rb').read()\n"
    "env=dict(e.split(b'=',1) for e in data.split(b'\\0') if e)\n"
    "os.execvpe(sys.argv[1],sys.argv[1:],env)\n"
)


def _shell_quoted(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def shell_safe(env: Mapping[str, str]) -> bool:
    """Whether a POSIX shell can export every one of these variables as it is."""
    return all(_SHELL_NAME.match(name) and name not in _SHELL_SPECIAL and not name.startswith("BASH")
               for name in env)


def loader(env: Mapping[str, str], python: str | None = None) -> tuple[list[str], bytes]:
    """The command that loads `env` from `ENV_FILE` and then runs the rest of its arguments, and the file's
    contents."""
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise ValueError(f"not an environment variable: {name!r}")
    if shell_safe(env):
        data = "".join(f"export {name}={_shell_quoted(value)}\n" for name, value in env.items())
        return ["/bin/sh", "-c", SHELL_LOADER, "cai-env"], data.encode()
    data = "".join(f"{name}={value}\0" for name, value in env.items())
    return [python or paths.python(), "-I", "-S", "-c", PYTHON_LOADER], data.encode("utf-8", "surrogateescape")


def memfd(data: bytes, name: str) -> int:
    """A descriptor whose file holds `data`, read from its start (close-on-exec here; a launch passes it)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
