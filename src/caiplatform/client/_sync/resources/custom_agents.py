# Generated from caiplatform/client/_async by `python -m caiplatform.client.generate`: edit that.
"""Agents: the generated routes, plus deploying from a directory, a tarball or bytes, and waiting."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from caiplatform.client._sync.resources.agents import AgentsResource as GeneratedAgents
from caiplatform.client._base import NOT_GIVEN, NotGiven, body_of
from caiplatform.client.source import detect_framework, tar_directory
from caiplatform.models.invoke import STREAM_EVENT, InvokeRequest, InvokeResponse, StreamEvent

READY_TIMEOUT = 600.0


class AgentsResource(GeneratedAgents):
    def deploy_source(self, source: str | Path | bytes, *, name: str, framework: str | None = None,
                            project: str | None = None, runtime: str | None = None) -> Any:
        """Deploy from a directory (tarred here, `.caiignore` honoured, the framework read off its entry
        file), a `.tar.gz` path, or the tarball's bytes. Answers the 202 body: `{agent, build_id, ...}`."""
        if isinstance(source, bytes):
            code = source
        else:
            path = Path(source)
            if path.is_dir():
                framework = framework or detect_framework(path)
                code = tar_directory(path)
            else:
                code = path.read_bytes()
        fields = {"name": name, **({"framework": framework} if framework else {}),
                  **({"runtime": runtime} if runtime else {})}
        response = self._client._send(
            "POST", "/v1/agents", params={"project": project}, data=fields,
            files={"code": ("code.tar.gz", code, "application/gzip")})
        return response.json()

    def wait_ready(self, name: str, *, project: str | None = None, timeout: float = READY_TIMEOUT,
                         interval: float = 0.5) -> Any:
        """The agent once it is ready (polling its view); a failed build raises
        `caiplatform.FailedDependency` with the build's message."""
        from caiplatform.errors import FailedDependency

        def fetch() -> Any:
            return self._client.request_json("GET", f"/v1/agents/{name}", params={"project": project})

        def settled(agent: Any) -> bool:
            view = agent.to_json() if hasattr(agent, "to_json") else agent
            if view.get("state") == "failed":
                raise FailedDependency(view.get("message") or f"the build of {name} failed")
            return bool(view.get("ready"))

        return self._client.poll(fetch, settled, timeout=timeout, interval=interval)

    def invoke(self, name: str, body: InvokeRequest | None = None, /, *, project: str | None = None,
                     timeout: float | None | NotGiven = NOT_GIVEN, **fields: Any) -> InvokeResponse | Any:
        """One message in, one reply out: an agent's `InvokeResponse`; a function's own return value as it
        returned it."""
        model = body if body is not None else InvokeRequest.parse(fields)
        answer = self._client.request_json("POST", f"/v1/agents/{name}/invoke", params={"project": project},
                                                  timeout=timeout, json=body_of(model))
        try:
            return InvokeResponse.model_validate(answer)
        except ValidationError:
            return answer

    def invoke_stream(self, name: str, body: InvokeRequest | None = None, /, *,
                            project: str | None = None, timeout: float | None | NotGiven = NOT_GIVEN,
                            **fields: Any) -> Iterator[StreamEvent]:
        """The same turn, event by event as the agent writes it; the `output` deltas add up to the reply."""
        model = body if body is not None else InvokeRequest.parse(fields)
        for line in self._client.stream_lines("POST", f"/v1/agents/{name}/invoke/stream",
                                                    params={"project": project}, timeout=timeout,
                                                    json=body_of(model)):
            yield STREAM_EVENT.validate_json(line)

    def build_log(self, name: str, /, *, project: str | None = None, follow: bool | None = None,
                        timeout: float | None | NotGiven = NOT_GIVEN) -> Iterator[str]:  # type: ignore[override]
        """The latest build's log lines; with `follow`, each as the build writes it, until the build ends."""
        for line in self._client.stream_lines("GET", f"/v1/agents/{name}/logs/build",
                                                    params={"project": project, "follow": follow},
                                                    timeout=None if follow else timeout):
            yield line

    def logs(self, name: str, /, *, project: str | None = None, follow: bool | None = None,
                   timeout: float | None | NotGiven = NOT_GIVEN) -> Iterator[str]:  # type: ignore[override]
        """The newest instance's log lines as they arrive; with `follow`, until the caller stops."""
        for line in self._client.stream_lines("GET", f"/v1/agents/{name}/logs",
                                                    params={"project": project, "follow": follow},
                                                    timeout=None if follow else timeout):
            yield line
