"""Harness and invoke tests: a scripted model on a loopback port and agent code directories."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from caiplatform.harness.app import create_harness_app
from caiplatform.testing.model_server import ScriptedModel, model_env
from caiplatform.testing.turn_checks import write_agent
from caiplatform.turns.browse import workload_internal_token


@pytest.fixture(scope="session")
def _scripted():
    model = ScriptedModel()
    with model.serve() as base_url:
        yield model, base_url


@pytest.fixture
def model(_scripted):
    server, _ = _scripted
    server.set_script(None, mode="conversation")
    server.requests.clear()
    yield server
    server.set_script(None, mode="conversation")


@pytest.fixture
def model_vars(_scripted) -> dict[str, str]:
    """MODEL_* for an agent's env mapping (never os.environ: several agents share this process)."""
    return model_env(_scripted[1])


@pytest.fixture
def harness_env(tmp_path: Path, model_vars):
    """Build the env mapping of one harness for `framework` and `files`."""

    def build(framework: str, files: dict[str, str], **extra: str) -> dict[str, str]:
        name = extra.pop("AGENT_NAME", f"agent-{uuid.uuid4().hex[:6]}")
        code = write_agent(tmp_path / name, files)
        return {"CAI_FRAMEWORK": framework, "CAI_CODE_DIR": str(code), "AGENT_NAME": name,
                "AGENT_IMAGE": f"registry.local/cai-test-{name}@sha256:{'0' * 64}", "CAI_SESSION_STORE": "memory",
                "CAI_PROJECT_ID": str(uuid.uuid4()), **model_vars, **extra}

    return build


@pytest.fixture
async def harness_client():
    """An httpx client on an in-process harness app; the harness (and a Node process) closes with the test."""
    clients: list[httpx.AsyncClient] = []

    def make(env: dict[str, str]) -> httpx.AsyncClient:
        app = create_harness_app(env)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://harness", timeout=60)
        client.harness = app.harness  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
        await client.harness.aclose()


@pytest.fixture
async def wired(platform, harness_env):
    """The platform's invoke service over a fixed directory and in-process harnesses.

    `wired.deploy(name, framework, files, **env)` makes an agent invocable and returns its target."""
    from caiplatform.testing.invoke import InProcessHarnesses, StaticDirectory, target_for

    directory = StaticDirectory()
    harnesses = InProcessHarnesses()
    platform.invoke.attach(directory=directory, runtime=harnesses)

    class Wired:
        def __init__(self):
            self.directory = directory
            self.harnesses = harnesses

        def deploy(self, name: str, framework: str, files: dict[str, str], *, project_short: str = "p0001", **env: str):
            target = directory.add(target_for(name, framework, project_short=project_short))
            token = platform.settings.internal_token
            if token:  # each agent holds its own, derived from the platform's
                env.setdefault("CAI_INTERNAL_TOKEN", workload_internal_token(token, target.workload.key))
            harnesses.serve(target.workload, harness_env(framework, files, AGENT_NAME=name,
                                                         CAI_PROJECT_ID=target.project_id, **env))
            return target

    yield Wired()
    await harnesses.aclose()
