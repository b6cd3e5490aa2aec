"""In-memory MCP host: builds are checked and hashed, serving is recorded (nothing listens)."""

from __future__ import annotations

from caiplatform.mcp.source import check_tool_source, image_digest
from caiplatform.ports.mcp_host import McpBuild, McpBuildError, McpDeployment, McpHost, McpImage


class InMemoryMcpHost(McpHost):
    def __init__(self, registry_host: str = "registry.local"):
        self.registry_host = registry_host
        self.builds: list[McpBuild] = []
        self.serving: dict[tuple[str, str], McpDeployment] = {}

    async def build(self, build: McpBuild) -> McpImage:
        for tool in build.tools:
            problem = check_tool_source(tool["name"], tool["handler"])
            if problem:
                raise McpBuildError(problem)
        self.builds.append(build)
        digest = image_digest(build.tools, project=build.project_id)
        return McpImage(f"{self.registry_host}/cai-{build.project_short}-mcp-{build.server}@{digest}", digest)

    async def serve(self, deployment: McpDeployment) -> str:
        self.serving[(deployment.project_id, deployment.server)] = deployment
        return f"http://mcp-{deployment.server}.{deployment.namespace}.svc.cluster.local/mcp"

    async def remove(self, project_id: str, server: str) -> None:
        self.serving.pop((project_id, server), None)
