"""The system-call filter of every sandboxed process: Docker's default seccomp profile, plus no terminal injection.

`seccomp_default.json` beside this file is moby's `profiles/seccomp/default.json` (github.com/moby/profiles,
commit cd3bed8061c7b7378b61fc6827c7885779417a75, Apache License 2.0), unchanged. It is read the way Docker
reads it for a container that has **no capabilities** (a sandboxed process has none after its privileges
are dropped): a rule that needs a capability (`includes.caps`) is left out, a rule that applies without one
(`excludes.caps`) is kept, rules for another architecture are left out. So, as in a Docker container:
`unshare`, `setns`, `mount`, `bpf`, `keyctl`, `add_key`, `kexec_*`, module loading, ... fail with `EPERM`;
`clone` may not ask for a new namespace (`CLONE_NEWUSER` among them); `clone3` fails with `ENOSYS` (the C
libraries then fall back to `clone`, whose flags can be checked); sockets of `AF_VSOCK` are refused.

A second, small program denies `ioctl(TIOCSTI)` (push characters into a terminal's input) and
`ioctl(TIOCLINUX)` (whose selection subcommands do the same on a Linux console), comparing only the low 32
bits of the request as the kernel does. It is a program of its own because libseccomp lets an unconditional
rule (Docker's `ioctl: allow`) win over a conditional one for the same call; the kernel runs both programs and
the stricter answer wins.

Compiled with libseccomp (PyPI `pyseccomp`, a ctypes binding to the system's `libseccomp.so.2`) into
classic BPF once per process, and handed to bubblewrap (`--add-seccomp-fd`), which loads the programs just
before it runs the sandboxed command.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import platform
import termios
from pathlib import Path
from typing import Any

PROFILE = Path(__file__).with_name("seccomp_default.json")
# Docker's names for architectures (`includes.arches`) and libseccomp's, by `uname -m`.
_MACHINES = {"x86_64": "amd64", "aarch64": "arm64"}
TIOCSTI = termios.TIOCSTI
TIOCLINUX = getattr(termios, "TIOCLINUX", 0x541C)
DENIED_IOCTLS = (TIOCSTI, TIOCLINUX)


class SeccompUnavailable(RuntimeError):
    """The filter cannot be compiled here (no libseccomp, an architecture the profile does not know)."""


def _libseccomp() -> Any:
    try:
        import pyseccomp
    except (ImportError, OSError) as exc:  # the binding is missing, or it found no libseccomp.so.2
        raise SeccompUnavailable(f"libseccomp cannot be loaded ({exc}): install `pyseccomp` and the system's "
                                 "libseccomp (Debian's `libseccomp2`)") from None
    return pyseccomp


def _kernel() -> tuple[int, int]:
    parts = platform.release().split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return 0, 0


def _arches(sc: Any, profile: dict[str, Any]) -> tuple[str, list[Any]]:
    """Docker's name of this machine's architecture, and the sub-architectures to filter as well (32-bit
    programs on a 64-bit kernel: filtered like the native ones instead of killed)."""
    machine = platform.machine()
    name = _MACHINES.get(machine)
    if name is None:
        raise SeccompUnavailable(f"no seccomp profile for this architecture ({machine})")
    native = {"amd64": "SCMP_ARCH_X86_64", "arm64": "SCMP_ARCH_AARCH64"}[name]
    subs: list[Any] = []
    for entry in profile.get("archMap", []):
        if entry.get("architecture") == native:
            for sub in entry.get("subArchitectures", []):
                arch = getattr(sc.Arch, sub.removeprefix("SCMP_ARCH_"), None)
                if arch is not None:
                    subs.append(arch)
    return name, subs


def _applies(rule: dict[str, Any], arch: str, kernel: tuple[int, int]) -> bool:
    """Whether a profile rule applies to a process with no capabilities on this architecture and kernel."""
    includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
    if includes.get("caps"):
        return False
    if includes.get("arches") and arch not in includes["arches"]:
        return False
    if arch in (excludes.get("arches") or []):
        return False
    minimum = includes.get("minKernel")
    if minimum:
        major, _, minor = str(minimum).partition(".")
        if kernel < (int(major), int(minor or 0)):
            return False
    return True


_OPS = {"SCMP_CMP_NE": "NE", "SCMP_CMP_LT": "LT", "SCMP_CMP_LE": "LE", "SCMP_CMP_EQ": "EQ", "SCMP_CMP_GE": "GE",
        "SCMP_CMP_GT": "GT", "SCMP_CMP_MASKED_EQ": "MASKED_EQ"}


def _action(sc: Any, rule: dict[str, Any], default_errno: int) -> Any:
    name = rule["action"]
    if name == "SCMP_ACT_ALLOW":
        return sc.ALLOW
    if name == "SCMP_ACT_ERRNO":
        return sc.ERRNO(int(rule.get("errnoRet", default_errno)))
    raise SeccompUnavailable(f"the seccomp profile uses an action this platform does not apply: {name}")


def _export(filt: Any) -> bytes:
    fd = os.memfd_create("cai-seccomp", os.MFD_CLOEXEC)
    with os.fdopen(fd, "w+b") as fh:
        filt.export_bpf(fh)
        fh.flush()
        fh.seek(0)
        return fh.read()


def _docker_program(sc: Any) -> bytes:
    profile = json.loads(PROFILE.read_text())
    arch, subs = _arches(sc, profile)
    default_errno = int(profile.get("defaultErrnoRet", errno.EPERM))
    if profile.get("defaultAction") != "SCMP_ACT_ERRNO":
        raise SeccompUnavailable(f"unexpected default action {profile.get('defaultAction')} in {PROFILE.name}")
    filt = sc.SyscallFilter(sc.ERRNO(default_errno))
    for sub in subs:
        filt.add_arch(sub)
    kernel = _kernel()
    for rule in profile["syscalls"]:
        if not _applies(rule, arch, kernel):
            continue
        action = _action(sc, rule, default_errno)
        args = [sc.Arg(int(a["index"]), getattr(sc, _OPS[a["op"]]), int(a["value"]), int(a.get("valueTwo", 0)))
                for a in rule.get("args") or []]
        for name in rule["names"]:
            if sc.resolve_syscall(sc.Arch.NATIVE, name) == -1:  # a call libseccomp does not know (as Docker: skip)
                continue
            try:
                filt.add_rule(action, name, *args)
            except OSError as exc:
                if exc.errno == errno.EACCES:  # the action is the default one: nothing to add
                    continue
                raise SeccompUnavailable(f"seccomp rule for {name} cannot be added: {exc}") from None
    return _export(filt)


def _terminal_program(sc: Any) -> bytes:
    profile = json.loads(PROFILE.read_text())
    _, subs = _arches(sc, profile)
    filt = sc.SyscallFilter(sc.ALLOW)
    for sub in subs:
        filt.add_arch(sub)
    for request in DENIED_IOCTLS:
        filt.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    return _export(filt)


@functools.cache
def programs() -> tuple[bytes, ...]:
    """The BPF programs, in the order bubblewrap loads them (every one but the last must allow `seccomp()`:
    the terminal program allows everything else; Docker's allows `seccomp` and `prctl`)."""
    sc = _libseccomp()
    try:
        return _terminal_program(sc), _docker_program(sc)
    except OSError as exc:
        raise SeccompUnavailable(f"the seccomp filter cannot be compiled: {exc}") from None


def program_fds() -> list[int]:
    """One fresh descriptor per program (bubblewrap reads each from its start), close-on-exec in this
    process (the launch passes them on); the caller closes them."""
    fds = []
    for number, program in enumerate(programs()):
        fd = os.memfd_create(f"cai-seccomp-{number}", os.MFD_CLOEXEC)
        view = memoryview(program)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
        fds.append(fd)
    return fds
