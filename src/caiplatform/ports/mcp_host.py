"""Port: build a hosted MCP server version into an image and serve it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


class McpBuildError(Exception):
    """The version cannot be built; the message is what the server's `message` shows."""


class McpServeError(Exception):
    """The image cannot be served (it did not start or answer its health check); what ran before keeps running."""


@dataclass(frozen=True)
class McpBuild:
    project_id: str
    project_short: str
    namespace: str
    server: str
    version: int
    tools: list[dict[str, Any]]  # {name, description, handler, schema, credential_keys}
    credential_keys: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class McpImage:
    image: str  # "<registry>/cai-<short>-mcp-<server>@sha256:<digest>"
    digest: str  # "sha256:<hex>"


@dataclass(frozen=True)
class McpDeployment:
    project_id: str
    project_short: str
    namespace: str
    server: str
    version: int
    image: McpImage
    expose: str
    env: dict[str, str]  # plain variables
    secret_env: dict[str, str]  # values that a cluster keeps in a Secret


class McpHost(ABC):
    #: True when every replica of the platform serves through the same host (a cluster): a server runs once
    #: for all replicas and is never taken over.
    shared: bool = False

    @abstractmethod
    async def build(self, build: McpBuild) -> McpImage:
        """Build the whole tool set into an image; the same tool set builds to the same digest."""

    @abstractmethod
    async def serve(self, deployment: McpDeployment) -> str:
        """Serve that image (replacing what the server ran before); return the MCP endpoint URL."""

    @abstractmethod
    async def remove(self, project_id: str, server: str) -> None:
        """Stop serving and forget the server. Idempotent."""

    async def still_serving(self, project_id: str, project_short: str, server: str, version: int) -> str | None:
        """After a platform restart: the MCP endpoint URL when `version` of the server still serves, ready,
        with what its last rollout gave it (a host whose servers outlive the platform's process, such as a
        cluster's); None when the platform must serve it again (the default: its servers went with it)."""
        return None
