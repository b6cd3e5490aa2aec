"""The builder port: a source tree becomes an immutable image.

An image reference is `{registry_host}/cai-<project-short>-<workload>@sha256:<digest>`, the digest being
a content hash of what was built (source plus framework plus runtime plus the platform's harness
version), so the same source builds to the same image and a builder reuses it instead of building again.

The builder checks the entry file of each framework before it installs anything (`agent.py` with
`root_agent`, `graph.py` with `graph`, `crew.py` with `crew`, functions per DECISIONS.md), so a broken
upload fails the build with a clear message rather than the first invoke.

An image also says how an instance of it starts (`Image.command`, `Image.env`); a workload runtime of
the same family (in-memory with in-memory, local with local, Kubernetes with a registry) runs it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: What a build's `message` may carry at most before it is cut (document 1, States).
BUILD_MESSAGE_LIMIT = 4000
TRUNCATED_SUFFIX = "...(truncated)"

#: Frameworks the builder knows. `function-*` are functions in another language; `mcp` is a hosted MCP
#: server's tool set; `container` is a prebuilt image (nothing to build).
AGENT_FRAMEWORKS = ("adk", "langgraph", "crewai")
FUNCTION_FRAMEWORKS = ("function", "function-nodejs", "function-go", "function-ruby")


def truncate_build_message(text: str) -> str:
    """The spec's rule for a failed build's `message`: at most 4000 characters, then `...(truncated)`."""
    if len(text) <= BUILD_MESSAGE_LIMIT:
        return text
    return text[:BUILD_MESSAGE_LIMIT] + TRUNCATED_SUFFIX


class BuildError(Exception):
    """The build failed; `message` is what the agent's `message` shows (already truncated)."""

    def __init__(self, message: str):
        self.message = truncate_build_message(message)
        super().__init__(self.message)


@dataclass(frozen=True)
class BuildRequest:
    project_id: str
    project_short: str
    workload: str  # agent, function or service name (a DNS label)
    framework: str  # one of AGENT_FRAMEWORKS or FUNCTION_FRAMEWORKS
    source_dir: Path  # the extracted, already-checked source tree; the builder copies what it keeps
    runtime: str | None = None  # functions: python | nodejs | go | ruby


@dataclass(frozen=True)
class Image:
    reference: str  # "{registry_host}/cai-<short>-<workload>@sha256:<hex>"
    digest: str  # "sha256:<hex>"
    framework: str
    runtime: str | None = None
    # How an instance starts: argv and plain variables the image itself sets (a runtime adds the
    # revision's env, secrets and `PORT` on top). Empty for images the runtime runs by reference only.
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Where the adapter keeps the image (a directory for the local builder); opaque to services.
    location: str = ""
    reused: bool = False  # True when an identical image existed and nothing was built


BuildLog = Callable[[str], None]


class Builder(ABC):
    #: adapter name as registered (`memory`, `local`, ...)
    name: str = ""

    @abstractmethod
    async def build(self, request: BuildRequest, log: BuildLog | None = None) -> Image:
        """Build (or reuse) the image for this source. Raises `BuildError` with a readable message."""

    @abstractmethod
    async def resolve(self, reference: str) -> Image | None:
        """The image a reference names, or None when this builder never built it (or it was removed)."""

    @abstractmethod
    async def remove(self, reference: str) -> None:
        """Forget an image that nothing references any more. Idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients and caches."""
