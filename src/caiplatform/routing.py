"""Host routing on one machine (DECISIONS.md): `<name>-<project-short>.<apps_domain>` reaches a published
agent, service or MCP server.

Services register the hosts they publish with an async *upstream* callable that returns an
`Upstream` (a base URL and a release hook, e.g. a runtime route slot). The HTTP layer asks this router
for every request whose `Host` falls under the apps domain and proxies to the answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote


async def _nothing() -> None:
    return None


@dataclass
class Upstream:
    base_url: str
    release: Callable[[], Awaitable[None]] = field(default=_nothing)
    timeout_seconds: float = 300.0
    # An in-process upstream (the in-memory runtime's `Endpoint.transport`, an httpx transport).
    transport: Any = None


#: The address of a server the platform reaches by a Unix socket (a hosted MCP server in its own network):
#: `http+unix://<socket path, percent-encoded>/<path>`, the form `requests-unixsocket` and Docker's clients use.
UNIX_SCHEME = "http+unix://"
#: The Host of requests sent over such a socket (the server is named by its socket, not by a host): loopback
#: with a port, which an MCP server's DNS-rebinding guard admits (`localhost:*`).
UNIX_ORIGIN = "http://localhost:8080"


def unix_url(socket_path: str, path: str = "") -> str:
    return UNIX_SCHEME + quote(socket_path, safe="") + path


def unix_socket_of(url: str) -> tuple[str, str] | None:
    """(socket path, the same URL over `UNIX_ORIGIN`) of a `unix_url`; None for any other URL."""
    if not url.startswith(UNIX_SCHEME):
        return None
    encoded, _, rest = url[len(UNIX_SCHEME):].partition("/")
    return unquote(encoded), UNIX_ORIGIN + ("/" + rest if rest else "")


def upstream_at(base_url: str) -> Upstream:
    """The upstream of a base URL: plain HTTP, or a `unix_url` (a transport over its socket, new per use:
    the proxy closes the client it makes over an upstream's transport)."""
    unix = unix_socket_of(base_url)
    if unix is None:
        return Upstream(base_url)
    import httpx

    socket_path, origin = unix
    return Upstream(origin, transport=httpx.AsyncHTTPTransport(uds=socket_path))


UpstreamFactory = Callable[[], Awaitable[Upstream]]
#: A published host's gate (auth mode, rate budget): given the method, the path and the request headers
#: (lowercase names), None lets the request through; (status, message, extra headers) refuses it.
Refusal = tuple[int, str, dict[str, str]]
HostGuard = Callable[[str, str, dict[str, str]], Awaitable[Refusal | None]]


class HostRouter:
    def __init__(self, apps_domain: str):
        self.apps_domain = apps_domain.lower().strip(".")
        self._routes: dict[str, UpstreamFactory] = {}
        self._guards: dict[str, HostGuard] = {}

    def host_for(self, name: str, project_short: str) -> str:
        return f"{name}-{project_short}.{self.apps_domain}"

    def public_url(self, name: str, project_short: str, scheme: str = "https") -> str:
        return f"{scheme}://{self.host_for(name, project_short)}"

    def register(self, host: str, upstream: UpstreamFactory, guard: HostGuard | None = None) -> None:
        self._routes[host.lower()] = upstream
        if guard is None:
            self._guards.pop(host.lower(), None)
        else:
            self._guards[host.lower()] = guard

    def unregister(self, host: str) -> None:
        self._routes.pop(host.lower(), None)
        self._guards.pop(host.lower(), None)

    def guard_for(self, host: str) -> HostGuard | None:
        return self._guards.get(host.lower().split(":", 1)[0])

    def is_apps_host(self, host: str) -> bool:
        bare = host.lower().split(":", 1)[0]
        return bare.endswith("." + self.apps_domain)

    def lookup(self, host: str) -> UpstreamFactory | None:
        return self._routes.get(host.lower().split(":", 1)[0])
