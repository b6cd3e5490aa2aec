"""Resource limits of one sandboxed process: a cgroup of its own (v2, or v1's memory/cpu/pids hierarchies)
where the server can create one, else rlimits set inside the sandbox.

A cgroup is created under the server's own cgroup of each controller, so whatever limits the server
itself still bounds its workloads. The process joins it before `exec` (the launcher shell writes its own
pid into `cgroup.procs`), so nothing it starts escapes the count. When it ends, whatever is left in the
cgroup is killed and the cgroup removed; `oom_killed()` says whether the kernel killed a process for
exceeding the memory limit (Kubernetes' `OOMKilled`). Under the rlimit fallback nothing is killed: an
allocation fails, and the harness that sees it exits with `OUT_OF_MEMORY_EXIT`, which the runtime
reports the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000

_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def memory_bytes(quantity: str) -> int | None:
    """A Kubernetes memory quantity (`512Mi`, `1G`, `1048576`) in bytes; None when it cannot be read."""
    match = _QUANTITY.match(str(quantity))
    if not match:
        return None
    number, unit = float(match.group(1)), match.group(2)
    factor = _BINARY.get(unit) or _DECIMAL.get(unit)
    if unit == "m":
        factor = None  # milli-bytes exist in the grammar but mean nothing here
    return int(number * factor) if factor else None


def cpu_millis(quantity: str) -> int | None:
    """A Kubernetes CPU quantity (`250m`, `0.5`, `2`) in thousandths of a CPU; None when unreadable."""
    match = _QUANTITY.match(str(quantity))
    if not match or match.group(2) not in ("", "m"):
        return None
    number = float(match.group(1))
    return int(number if match.group(2) == "m" else number * 1000) or None


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None = None
    cpu_millis: int | None = None
    pids: int | None = None

    def describe(self) -> str:
        parts = []
        if self.memory_bytes:
            parts.append(f"memory {self.memory_bytes // 2**20} MiB")
        if self.cpu_millis:
            parts.append(f"cpu {self.cpu_millis}m")
        if self.pids:
            parts.append(f"{self.pids} processes")
        return ", ".join(parts) or "none"


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and '' for the v2 hierarchy."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                out[controller] = path
    return out


class CgroupSet:
    """The cgroup directories (one per controller on v1, one on v2) of one sandboxed run."""

    def __init__(self, directories: list[Path], version: int):
        self.directories = directories
        self.version = version

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.directories]

    def _file(self, name: str) -> Path | None:
        for directory in self.directories:
            if (directory / name).exists():
                return directory / name
        return None

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer stopped a process of this cgroup."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        path = self._file(name)
        if path is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        return False

    def pids(self) -> list[int]:
        out: set[int] = set()
        for directory in self.directories:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        return sorted(out)

    def remove(self) -> None:
        """Kill what is still inside (a fork bomb's orphans too), then remove the directories."""
        deadline = time.monotonic() + 5.0
        while True:
            left = self.pids()
            if not left:
                break
            if self.version == 2 and self._file("cgroup.kill") is not None:
                with contextlib.suppress(OSError):
                    (self.directories[0] / "cgroup.kill").write_text("1")
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                log.warning("processes %s outlived their sandbox's cgroup", left)
                break
            time.sleep(0.01)
        for directory in self.directories:
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)  # the kernel lets go of the last task a moment after it exits


class CgroupFactory:
    """Creates a cgroup per sandboxed run, or says why it cannot (then rlimits are used)."""

    def __init__(self, root: Path = CGROUP_ROOT, *, enabled: bool = True):
        self.root = root
        self.problem: str | None = None
        self._parents: list[Path] | None = None
        self.version = 0
        if enabled:
            self._detect()
        else:
            self.problem = "CAI_SANDBOX_LIMITS=rlimits"

    def _detect(self) -> None:
        own = _own_cgroups()
        unified = self.root / "cgroup.controllers"
        if unified.is_file():
            available = set(unified.read_text().split())
            parent = self.root / own.get("", "/").lstrip("/")
            if {"memory", "pids"} <= available and os.access(parent, os.W_OK):
                self._parents, self.version = [parent], 2
                return
            self.problem = "cgroup v2 without the memory and pids controllers writable here"
            return
        parents = []
        for controller in V1_CONTROLLERS:
            mount = self.root / controller
            if not mount.is_dir():
                self.problem = f"no cgroup v1 hierarchy for {controller} at {mount}"
                return
            parent = mount / own.get(controller, "/").lstrip("/")
            if not os.access(parent, os.W_OK):
                self.problem = f"cannot create cgroups under {parent}"
                return
            parents.append(parent)
        self._parents, self.version = parents, 1

    @property
    def available(self) -> bool:
        return self._parents is not None

    def sweep(self) -> None:
        """Remove the empty cgroups a server that was killed left behind (their processes died with it);
        a minute old at least, so one another server has just made and not yet entered stays."""
        for parent in self._parents or []:
            for directory in parent.glob("cai-*"):
                with contextlib.suppress(OSError):
                    old = time.time() - directory.stat().st_mtime > 60
                    if old and not (directory / "cgroup.procs").read_text().strip():
                        directory.rmdir()

    def create(self, label: str, limits: Limits) -> CgroupSet:
        """A new cgroup with `limits` (raises OSError when the kernel refuses)."""
        assert self._parents is not None
        name = f"cai-{re.sub(r'[^a-zA-Z0-9_.-]', '_', label)[:80]}-{secrets.token_hex(4)}"
        directories = []
        try:
            for parent in self._parents:
                directory = parent / name
                directory.mkdir()
                directories.append(directory)
            group = CgroupSet(directories, self.version)
            if self.version == 2:
                self._limit_v2(directories[0], limits)
            else:
                self._limit_v1(dict(zip(V1_CONTROLLERS, directories, strict=True)), limits)
        except OSError:
            CgroupSet(directories, self.version).remove()
            raise
        return group

    @staticmethod
    def _limit_v1(directories: dict[str, Path], limits: Limits) -> None:
        memory = directories["memory"]
        if limits.memory_bytes:
            (memory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
            swap = memory / "memory.memsw.limit_in_bytes"  # present when swap accounting is on
            if swap.exists():
                with contextlib.suppress(OSError):
                    swap.write_text(str(limits.memory_bytes))
        if limits.cpu_millis:
            (directories["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (directories["cpu"] / "cpu.cfs_quota_us").write_text(str(limits.cpu_millis * CPU_PERIOD_US // 1000))
        if limits.pids:
            (directories["pids"] / "pids.max").write_text(str(limits.pids))

    @staticmethod
    def _limit_v2(directory: Path, limits: Limits) -> None:
        if limits.memory_bytes:
            (directory / "memory.max").write_text(str(limits.memory_bytes))
            with contextlib.suppress(OSError):
                (directory / "memory.swap.max").write_text("0")
        if limits.cpu_millis:
            (directory / "cpu.max").write_text(f"{limits.cpu_millis * CPU_PERIOD_US // 1000} {CPU_PERIOD_US}")
        if limits.pids:
            (directory / "pids.max").write_text(str(limits.pids))


def rlimit_argv(limits: Limits) -> list[str]:
    """`prlimit` in front of the workload when no cgroup can be had: private writable memory (`--data`)
    and processes (of the sandbox uid, shared by every sandbox) instead of memory and a process count of
    its own; no CPU share.

    `RLIMIT_DATA` (since Linux 4.7: every private writable mapping, the heap and anonymous `mmap`s) and not
    the address space: V8 reserves far more address space than it uses (about 700 MiB before the first
    line of JavaScript), so Node.js could not start under an address-space limit of a small workload."""
    args = []
    if limits.memory_bytes:
        args.append(f"--data={limits.memory_bytes}")
    if limits.pids:
        args.append(f"--nproc={limits.pids}")
    return ["prlimit", *args, "--"] if args else []


# How a process that ran out of memory under the rlimit fallback ends (the harness, when an allocation
# failed against the limit): the runtime reports it as `OOMKilled`, as it does the cgroup's kill.
OUT_OF_MEMORY_EXIT = 113
# What a language runtime writes when it dies because an allocation failed (Python's `MemoryError`, V8,
# C++, Go, Ruby, and the Node.js and Ruby shims' own words).
OUT_OF_MEMORY_SIGNS = ("MemoryError", "JavaScript heap out of memory", "std::bad_alloc", "runtime: out of memory",
                       "failed to allocate memory", "NoMemoryError")
# How much of a sandboxed process's standard error is kept (bytes): its last lines, where those signs and
# the error a caller is shown are.
STDERR_TAIL = 8192


def ran_out_of_memory(exit_code: int | None, stderr_tail: str) -> bool:
    """Under the rlimit fallback: whether a process that failed did so because an allocation failed
    against the memory limit (its runtime says so on its standard error). Never true under a cgroup,
    whose kernel kill is read from the cgroup instead."""
    return (memory_rlimit() is not None and exit_code not in (0, None)
            and any(sign in stderr_tail for sign in OUT_OF_MEMORY_SIGNS))


def memory_rlimit() -> int | None:
    """The memory rlimit this process runs under (the rlimit fallback's), None when there is none: then
    an allocation that fails is not the sandbox's limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    return None if soft == resource.RLIM_INFINITY else soft
