"""The first step of every build, shared by the builder adapters."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anyio

from caiplatform.build.checks import check_source, framework_for
from caiplatform.build.digest import image_reference, source_digest
from caiplatform.ports.builder import BuildError, BuildRequest


@dataclass(frozen=True)
class CheckedSource:
    source: Path
    framework: str  # `function` + runtime resolved (`function-nodejs`, ...)
    digest: str
    reference: str


async def check_request(request: BuildRequest, registry_host: str, *, toolchains: bool = True) -> CheckedSource:
    """The first step of every build: check the entry file, then hash the tree (off the event loop).
    `toolchains` False: a function's language toolchain is in the image the build starts from, not here."""
    framework = framework_for(request.framework, request.runtime)
    source = Path(request.source_dir)
    if not source.is_dir():
        raise BuildError(f"the source directory of {request.workload} is missing")
    await anyio.to_thread.run_sync(lambda: check_source(source, framework, request.runtime, toolchains=toolchains))
    digest = await anyio.to_thread.run_sync(lambda: source_digest(source, framework, request.runtime,
                                                                 project=request.project_id))
    reference = image_reference(registry_host, request.project_short, request.workload, digest)
    return CheckedSource(source, framework, digest, reference)
