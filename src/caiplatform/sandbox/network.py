"""The network of a sandboxed process on the local runtime: a network namespace of its own per run.

Every workload, MCP server and build step runs in a fresh network namespace (docs/sandbox.md, Network).
Its only way out is Debian's `pasta` (the `passt` package), user-mode networking run host-side:

- `127.0.0.1:<port>` inside reaches host loopback `<port>` for the ports the platform names (the platform
  API of `CAI_API_URL`, the model endpoint of `MODEL_BASE_URL`/`EMBED_BASE_URL`, and loopback entries of
  the operator's `CAI_SANDBOX_ALLOW`) and no other port of host loopback (pasta forwards none, `-T none`;
  `--no-map-gw`: the gateway address is not the host);
- the addresses of its project's memory stores, as the memory-store API reports them, opened and closed
  while it runs;
  both by the platform itself, listening inside the namespace and copying to the host
  (`caiplatform.sandbox.bridge`, which says why not pasta's `-T`);
- other addresses are connected to from the host by pasta, which is the public internet only: the
  namespace's own nftables rules, made by the platform and applied from the host before the process
  starts, reject loopback, link-local (169.254.0.0/16, the cloud metadata address), private and
  reserved ranges and every address of the host itself; `CAI_SANDBOX_EGRESS=none` drops all of it;
  `CAI_SANDBOX_ALLOW=cidr[:port],...` opens more;
- nothing listens for it: the platform reaches a harness through a Unix socket in a directory bound into
  that one sandbox (`caiplatform.adapters.local.runtime`), never through a port.

The namespace is made before the sandbox (a holder process's namespace kept as a descriptor), pasta
and the rules are set up on that descriptor, and the launcher enters it (`nsenter --net`) just before
bubblewrap: the workload's first instruction runs with its network complete. The namespace belongs to
the host's user namespace, so nothing inside (no capability there) can change its interfaces or rules.
pasta runs as a daemon recorded by its pid file and is stopped with the run (`Netns.close`); daemons a
crashed server left behind are stopped by `sweep()` at the next start.

Needs a root server with `pasta`, `nft` and `nsenter` (util-linux). Without them workloads are refused
(`SandboxUnavailable`, naming what to install) unless the operator chose `CAI_SANDBOX_NETWORK=host`
(the host's network, shown in `/healthz`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from caiplatform.sandbox.bridge import Bridges

MODES = ("isolated", "host")
EGRESS = ("public", "none")
SETUP_TIMEOUT_SECONDS = 20.0
# What a workload may never reach unless the operator allows it (besides every address of the host): this
# machine, link-local (the metadata address), private and shared ranges, and what is no destination at all.
# The documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) are left open:
# nothing on the internet lives there, so closing them protects no service, while some networks put their
# package mirrors there (this project's own CI reaches PyPI at one), which builds must reach.
CLOSED_V4 = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
)
CLOSED_V6 = ("::/127", "::ffff:0:0/96", "64:ff9b::/96", "100::/64", "fc00::/7", "fe80::/10", "ff00::/8")
FIX = ("install Debian's `passt` (pasta) and `nftables` packages (`apt-get install passt nftables`) and run the "
       "server as root; or opt into the host's network with CAI_SANDBOX_NETWORK=host (every workload then "
       "reaches every port of this machine)")


class NetworkUnavailable(RuntimeError):
    """The per-workload network cannot be made here (the message says what to install)."""


@dataclass(frozen=True)
class Allow:
    """One operator allowlist entry: a network, optionally one TCP/UDP port."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    port: int | None = None

    @property
    def loopback_port(self) -> int | None:
        """A host loopback port this entry opens (forwarded by pasta rather than routed)."""
        if self.network.version == 4 and self.network.num_addresses == 1 and self.network.network_address == \
                ipaddress.IPv4Address("127.0.0.1") and self.port is not None:
            return self.port
        return None


def parse_allow(text: str | None) -> tuple[Allow, ...]:
    """`CAI_SANDBOX_ALLOW`: comma-separated `cidr[:port]` (`[v6cidr]:port` for IPv6 with a port)."""
    out: list[Allow] = []
    for raw in (text or "").split(","):
        item = raw.strip()
        if not item:
            continue
        port: int | None = None
        if item.startswith("["):
            address, _, rest = item[1:].partition("]")
            if rest.startswith(":"):
                port = _port(rest[1:], raw)
        elif item.count(":") == 1:
            address, _, tail = item.partition(":")
            port = _port(tail, raw)
        else:
            address = item
        try:
            network = ipaddress.ip_network(address, strict=False)
        except ValueError:
            raise ValueError(f"CAI_SANDBOX_ALLOW: {raw.strip()!r} is not cidr[:port]") from None
        out.append(Allow(network, port))
    return tuple(out)


def _port(text: str, raw: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"CAI_SANDBOX_ALLOW: {raw.strip()!r} has no valid port")
    return int(text)


def loopback_ports(urls: Iterable[str | None]) -> tuple[int, ...]:
    """The host loopback ports of the URLs a workload is given (platform API, model endpoint)."""
    ports: set[int] = set()
    for url in urls:
        if not url:
            continue
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        try:
            is_loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            is_loopback = False
        if is_loopback:
            with contextlib.suppress(ValueError):
                ports.add(parts.port or {"https": 443, "redis": 6379, "rediss": 6379}.get(parts.scheme, 80))
    return tuple(sorted(ports))


def given_ports(env: Mapping[str, str]) -> tuple[int, ...]:
    """The host loopback ports a workload's variables name (an instance's, a hosted MCP server's): the
    platform API, the code sandbox, the model and embedding endpoints, and a session store on the
    machine's Valkey (server mode: an agent's sessions live there, under its project's prefix)."""
    urls = [env.get(name) for name in ("CAI_API_URL", "SANDBOX_URL", "MODEL_BASE_URL", "EMBED_BASE_URL")]
    store = env.get("CAI_SESSION_STORE") or ""
    if store.startswith(("redis://", "rediss://")):
        urls.append(store)
    return loopback_ports(urls)


@dataclass(frozen=True)
class Policy:
    """What one run may reach: host loopback ports (forwarded), public addresses or none, and more."""

    loopback_ports: tuple[int, ...] = ()
    public: bool = True
    allow: tuple[Allow, ...] = ()

    def forwarded(self) -> tuple[int, ...]:
        extra = {a.loopback_port for a in self.allow if a.loopback_port is not None}
        return tuple(sorted(set(self.loopback_ports) | extra))


def host_addresses() -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every address of this machine (a workload connecting to one would reach the host's services)."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    with contextlib.suppress(OSError):
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for i, line in enumerate(lines):
            if "/32 host LOCAL" in line and i > 0:
                with contextlib.suppress(ValueError, IndexError):
                    found.add(ipaddress.IPv4Address(lines[i - 1].split()[-1]))
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            with contextlib.suppress(ValueError):
                found.add(ipaddress.IPv6Address(":".join(raw[i:i + 4] for i in range(0, 32, 4))))
    return sorted(found, key=lambda a: (a.version, int(a)))


def nameservers(path: str = "/etc/resolv.conf") -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The host's resolvers (the sandbox reads the same resolv.conf): a run may ask them on port 53, even
    where they sit in a private range (a cloud's resolver often does)."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    address = ipaddress.ip_address(parts[1].split("%", 1)[0])
                    if not address.is_loopback:
                        found.append(address)
    return found


def nft_rules(policy: Policy) -> str:
    """The namespace's own filter, made by the platform (nothing tenant-chosen in it)."""
    lines = ["table inet cai_sandbox {", " chain output {",
             f"  type filter hook output priority 0; policy {'accept' if policy.public else 'drop'};",
             # Loopback inside the namespace: the workload's own sockets and pasta's forwarded ports.
             '  oifname "lo" accept']
    for resolver in nameservers() if policy.public else []:
        family = "ip" if resolver.version == 4 else "ip6"
        lines += [f"  {family} daddr {resolver} udp dport 53 accept", f"  {family} daddr {resolver} tcp dport 53 accept"]
    for entry in policy.allow:
        if entry.loopback_port is not None:
            continue
        family = "ip" if entry.network.version == 4 else "ip6"
        match = f"{family} daddr {entry.network}"
        if entry.port is None:
            lines.append(f"  {match} accept")
        else:
            lines += [f"  {match} tcp dport {entry.port} accept", f"  {match} udp dport {entry.port} accept"]
    own = host_addresses()
    v4 = [*CLOSED_V4, *(str(a) for a in own if a.version == 4)]
    v6 = [*CLOSED_V6, *(str(a) for a in own if a.version == 6)]
    lines.append(f"  ip daddr {{ {', '.join(v4)} }} reject with icmp type admin-prohibited")
    lines.append(f"  ip6 daddr {{ {', '.join(v6)} }} reject with icmpv6 type admin-prohibited")
    lines += [" }", "}", ""]
    return "\n".join(lines)


@dataclass
class Netns:
    """One run's network namespace (a descriptor to pass to the launcher) and its pasta."""

    fd: int
    pasta_pid: int | None = None
    pidfile: Path | None = None
    setup_ms: float = 0.0
    # Run before the descriptor closes: the platform's bridges into it (caiplatform.sandbox.bridge).
    on_close: list[Callable[[], None]] = field(default_factory=list)
    _closed: bool = field(default=False, repr=False)

    def enter_argv(self) -> list[str]:
        """What the launcher runs before bubblewrap (the descriptor is passed to it)."""
        nsenter = shutil.which("nsenter") or "nsenter"
        return [nsenter, f"--net=/proc/self/fd/{self.fd}", "--"]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for callback in self.on_close:
            with contextlib.suppress(Exception):
                callback()
        if self.pasta_pid is not None:
            _stop(self.pasta_pid)
        if self.pidfile is not None:
            with contextlib.suppress(OSError):
                self.pidfile.unlink()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _stop(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)


class Network:
    """The per-run network of one `Sandbox`: `CAI_SANDBOX_NETWORK`, `CAI_SANDBOX_EGRESS`, `CAI_SANDBOX_ALLOW`."""

    def __init__(self, mode: str = "isolated", egress: str = "public", allow: str | None = None,
                 run_dir: Path | None = None):
        mode = (mode or "isolated").strip().lower()
        egress = (egress or "public").strip().lower()
        if mode not in MODES:
            raise ValueError(f"CAI_SANDBOX_NETWORK must be one of {', '.join(MODES)}, not {mode!r}")
        if egress not in EGRESS:
            raise ValueError(f"CAI_SANDBOX_EGRESS must be one of {', '.join(EGRESS)}, not {egress!r}")
        self.mode = mode
        self.public = egress == "public"
        self.allow = parse_allow(allow)
        self.pasta = shutil.which("pasta")
        self.nft = shutil.which("nft")
        self.nsenter = shutil.which("nsenter")
        self.unshare = shutil.which("unshare")
        self.run_dir = run_dir or Path(tempfile.gettempdir()) / f"cai-pasta-{os.getuid()}"
        self._lock = threading.RLock()  # problem() makes a namespace, which sweeps first
        self._problem: str | None = None
        self._swept = False
        # What runs of a group (a project) reach besides their policy, opened and closed live.
        self.bridges = Bridges()

    @property
    def isolated(self) -> bool:
        return self.mode == "isolated"

    def policy(self, loopback: Iterable[int] = (), *, public: bool | None = None) -> Policy:
        return Policy(tuple(sorted(set(loopback))), self.public if public is None else public, self.allow)

    def problem(self) -> str:
        """'' when a per-run network can be made here, else why not and what to do."""
        if not self.isolated:
            return ""
        with self._lock:
            if self._problem is None:
                self._problem = self._find_problem()
        return self._problem

    def _find_problem(self) -> str:
        missing = [name for name, path in (("pasta", self.pasta), ("nft", self.nft), ("nsenter", self.nsenter),
                                           ("unshare", self.unshare)) if path is None]
        if missing:
            return f"the per-workload network needs {', '.join(missing)}, which is not installed; {FIX}"
        if os.geteuid() != 0:
            return f"the per-workload network needs a server running as root (this one runs as uid {os.geteuid()}); {FIX}"
        try:
            self.create(Policy()).close()
        except NetworkUnavailable as exc:
            return f"{exc}; {FIX}"
        return ""

    def describe(self) -> str:
        if not self.isolated:
            return "host network (CAI_SANDBOX_NETWORK=host): workloads reach every port of this machine"
        egress = "public internet" if self.public else "no internet (CAI_SANDBOX_EGRESS=none)"
        extra = f", allowlist {', '.join(_allow_text(a) for a in self.allow)}" if self.allow else ""
        return f"a network namespace per workload (pasta); egress: {egress}{extra}"

    def sweep(self) -> None:
        """Stop the pasta daemons of runs a crashed server left behind."""
        with self._lock:
            if self._swept:
                return
            self._swept = True
        for pidfile in self.run_dir.glob("*.pid") if self.run_dir.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text().strip())
                if Path(f"/proc/{pid}/comm").read_text().strip() == "pasta":
                    _stop(pid)
            with contextlib.suppress(OSError):
                pidfile.unlink()

    def create(self, policy: Policy, group: str | None = None) -> Netns:
        """A new network namespace with pasta and the policy's rules in place, and the endpoints published
        for `group` (its project's memory stores) listening in it."""
        if self.pasta is None or self.nft is None or self.nsenter is None or self.unshare is None:
            raise NetworkUnavailable("pasta, nft, nsenter or unshare is not installed")
        self.sweep()
        begun = time.perf_counter()
        fd = _new_netns(self.unshare)
        netns = Netns(fd)
        try:
            self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            pidfile = self.run_dir / f"{os.getpid()}-{fd}-{time.monotonic_ns()}.pid"
            netns.pidfile = pidfile
            # `-T none`: pasta's default is `-T auto`, every port bound on host loopback (the engines' too),
            # rescanned while it runs. The ports the run is given are bridged by the platform instead
            # (caiplatform.sandbox.bridge says why not by pasta).
            argv = [self.pasta, "--runas", "0", "--config-net", "--no-map-gw", "-q", "-T", "none",
                    "-u", "none", "-U", "none", "-t", "none",
                    "--netns", f"/proc/self/fd/{fd}", "--netns-only", "-P", str(pidfile)]
            done = subprocess.run(argv, pass_fds=(fd,), capture_output=True, timeout=SETUP_TIMEOUT_SECONDS,
                                  env={"PATH": os.defpath}, check=False)
            if done.returncode != 0:
                raise NetworkUnavailable(f"pasta could not set up the network: {_last_line(done.stderr, done.returncode)}")
            with contextlib.suppress(OSError, ValueError):
                netns.pasta_pid = int(pidfile.read_text().strip())
            rules = subprocess.run([self.nsenter, f"--net=/proc/self/fd/{fd}", "--", self.nft, "-f", "-"],
                                   input=nft_rules(policy).encode(), pass_fds=(fd,), capture_output=True,
                                   timeout=SETUP_TIMEOUT_SECONDS, env={"PATH": os.defpath}, check=False)
            if rules.returncode != 0:
                raise NetworkUnavailable(f"nft could not apply the sandbox's rules: {_last_line(rules.stderr, rules.returncode)}")
            fixed = [("127.0.0.1", port) for port in policy.forwarded()]
            if group is not None or fixed:
                run = self.bridges.attach(fd, group, fixed)
                netns.on_close.append(lambda: self.bridges.detach(run))
        except (OSError, subprocess.SubprocessError) as exc:
            netns.close()
            raise NetworkUnavailable(f"the per-workload network could not be made: {exc}") from None
        except NetworkUnavailable:
            netns.close()
            raise
        netns.setup_ms = (time.perf_counter() - begun) * 1000
        return netns


def _allow_text(entry: Allow) -> str:
    if entry.port is None:
        return str(entry.network)
    return f"[{entry.network}]:{entry.port}" if entry.network.version == 6 else f"{entry.network}:{entry.port}"


def _last_line(stderr: bytes, code: int) -> str:
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else f"exit code {code}"


def _new_netns(unshare: str) -> int:
    """A descriptor of a new, empty network namespace (its holder process is gone once it is open)."""
    holder = subprocess.Popen([unshare, "--net", "sleep", "60"], stdin=subprocess.DEVNULL,
                              env={"PATH": os.defpath})
    try:
        path = f"/proc/{holder.pid}/ns/net"
        own = os.stat("/proc/self/ns/net").st_ino
        deadline = time.monotonic() + SETUP_TIMEOUT_SECONDS
        while os.stat(path).st_ino == own:  # until the child has entered its namespace
            if holder.poll() is not None or time.monotonic() > deadline:
                raise NetworkUnavailable("unshare could not create a network namespace")
            time.sleep(0.001)
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetworkUnavailable(f"cannot create a network namespace: {exc}") from None
    finally:
        holder.kill()
        holder.wait()
