"""Hostile workload code of issue 34: variables that run code in whatever starts the workload, and the kernel
surface a sandboxed process must not have (nested user namespaces, terminal injection, no syscall filter).
"""

from __future__ import annotations

import json

from .serve_support import build_step_package

# A shared library whose constructor records where it ran: in `outside` (a host path no sandbox sees) when
# a process outside the sandbox (or before its privileges are dropped) loaded it, in the sandbox's own /tmp
# when the workload did (so the workload still got its LD_PRELOAD).
PRELOAD_C = r'''
#include <stdio.h>
#include <unistd.h>

__attribute__((constructor)) static void cai_preload_probe(void) {
    char ns[128] = {0};
    if (readlink("/proc/self/ns/mnt", ns, sizeof ns - 1) < 0) ns[0] = '?';
    const char *paths[] = {OUTSIDE_MARKER, "/tmp/preloaded"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(paths[i], "a");
        if (f) { fprintf(f, "uid=%d ns=%s\n", (int)getuid(), ns); fclose(f); }
    }
}
'''


def preload_source(outside_marker: str) -> str:
    return f"#define OUTSIDE_MARKER {json.dumps(outside_marker)}\n" + PRELOAD_C


def bash_env_script(outside_marker: str) -> str:
    """What `BASH_ENV` names: run by any bash that starts non-interactively with that variable."""
    return f'echo "uid=$(id -u)" >> {outside_marker}\n'


KERNEL_CHECKS = r'''
import ctypes, errno, json, os, subprocess, sys

CLONE_NEWUSER = 0x10000000

TIOCSTI_CHILD = r"""
import fcntl, os, pty, sys, termios
os.setsid()
master, slave = pty.openpty()
fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
try:
    fcntl.ioctl(slave, termios.TIOCSTI, b"x")
except OSError as exc:
    sys.exit(exc.errno)
sys.exit(0)
"""

def _errno_name(code):
    return errno.errorcode.get(code, str(code))

def kernel_findings():
    libc = ctypes.CDLL(None, use_errno=True)
    status = open("/proc/self/status").read()
    seccomp = next((line.split()[1] for line in status.splitlines() if line.startswith("Seccomp:")), "?")
    # unshare(CLONE_NEWUSER) in a child, so a success changes nothing here.
    child = subprocess.run([sys.executable, "-c",
                            "import ctypes,os,sys;l=ctypes.CDLL(None,use_errno=True);"
                            "sys.exit(0 if l.unshare(0x10000000)==0 else ctypes.get_errno())"])
    try:
        tool = subprocess.run(["unshare", "-Ur", "sh", "-c", "grep CapEff /proc/self/status"],
                              capture_output=True, text=True, timeout=30)
        tool_result = [tool.returncode, (tool.stdout + tool.stderr).strip()[-200:]]
    except (OSError, subprocess.SubprocessError) as exc:
        tool_result = [-1, repr(exc)]
    try:
        fd = os.open("/dev/tty", os.O_RDWR)
        try:
            import fcntl, termios
            fcntl.ioctl(fd, termios.TIOCSTI, b"x")
            dev_tty = "injected"
        except OSError as exc:
            dev_tty = _errno_name(exc.errno)
        finally:
            os.close(fd)
    except OSError as exc:
        dev_tty = "no terminal: " + _errno_name(exc.errno)
    own_pty = subprocess.run([sys.executable, "-c", TIOCSTI_CHILD]).returncode
    return {
        "seccomp": seccomp,
        "unshare_newuser": 0 if child.returncode == 0 else _errno_name(child.returncode),
        "unshare_tool": tool_result,
        "dev_tty": dev_tty,
        "tiocsti_own_terminal": 0 if own_pty == 0 else _errno_name(own_pty),
    }
'''

MARKER = "KERNEL-FINDINGS:"


def function(preload_so: bytes, bash_env: str) -> dict[str, str | bytes]:
    """A Python function that answers its environment, what its own LD_PRELOAD recorded, and the kernel
    findings; it ships the preload library and the BASH_ENV script in its own tarball."""
    main = KERNEL_CHECKS + r'''
def handle(event, context):
    if event.get("action") == "kernel":
        return kernel_findings()
    try:
        preloaded = open("/tmp/preloaded").read()
    except OSError:
        preloaded = ""
    return {"env": dict(os.environ), "preloaded": preloaded, "code_dir": os.environ.get("CAI_CODE_DIR", ""),
            "cwd": os.getcwd(), "uid": os.getuid()}
'''
    return {"main.py": main, "probe.so": preload_so, "probe.sh": bash_env}


def build_step() -> dict[str, str]:
    """A Python function whose requirements.txt builds a local package: its backend (a build step) reports
    the kernel findings and fails the build, so they are in the build's message."""
    backend = KERNEL_CHECKS + f'''
print({MARKER!r} + json.dumps(kernel_findings()), file=sys.stderr, flush=True)
raise SystemExit(1)
'''
    return build_step_package("kernelpkg", backend)
