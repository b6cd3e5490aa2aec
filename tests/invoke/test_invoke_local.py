"""Invoke on the embedded platform: the local builder's image, the local runtime's supervised harness
process, the control plane in between (what `caiplatform serve` does)."""

from __future__ import annotations

import json
import textwrap
import uuid

from caiplatform.platform import Platform
from caiplatform.ports.builder import BuildRequest
from caiplatform.ports.runtime import RevisionSpec, WorkloadRef
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.services.agent_directory import InvokeTarget
from caiplatform.testing.example_agents import PYTHON_FUNCTION
from caiplatform.testing.invoke import StaticDirectory
from caiplatform.testing.turn_checks import write_agent

ANONYMOUS = Principal.anonymous("127.0.0.1")


async def test_function_through_the_local_runtime(settings, tmp_path):
    project_id, short, name = str(uuid.uuid4()), "loc01", "fn"
    ref = WorkloadRef(project_id, short, name, "function")
    target = InvokeTarget(name, str(uuid.uuid4()), project_id, short, "function", "function", ref)
    data_dir = tmp_path / "data"
    sessions = data_dir / "sessions" / f"{short}-{name}.sqlite3"

    async with Platform.embedded(data_dir, settings) as platform:
        files = {k: textwrap.dedent(v) for k, v in PYTHON_FUNCTION.items()}
        image = await platform.builder.build(BuildRequest(project_id, short, name, "function",
                                                          write_agent(tmp_path / "src", files)))
        env = {"AGENT_NAME": name, "AGENT_IMAGE": image.reference, "CAI_PROJECT_ID": project_id,
               "CAI_SESSION_STORE": f"sqlite:///{sessions}"}
        await platform.runtime.apply(RevisionSpec(ref, f"{name}-00001", 1, image.reference, env=env,
                                                  secret_env={"CAI_INTERNAL_TOKEN": settings.internal_token}))
        platform.invoke.attach(directory=StaticDirectory([target]))
        reply = await platform.invoke.invoke(ANONYMOUS, name, None, b'{"message": "hello"}')
        assert json.loads(reply.content) == {"echo": "hello", "keys": ["message"], "agent": name}
        session_id = reply.headers["X-CAI-Session-Id"]
        turn = await platform.invoke.stream(ANONYMOUS, name, None, json.dumps(
            {"message": "again", "session_id": session_id}).encode())
        try:
            lines = [json.loads(line) for chunk in [b"".join([c async for c in turn.lines])]
                     for line in chunk.splitlines()]
        finally:
            await turn.aclose()
        assert lines[-1]["type"] == "done" and lines[-1]["session_id"] == session_id
        transcript = await platform.invoke.transcript(Principal(PrincipalKind.AUTOMATION), name, None, session_id)
        texts = [e["content"]["parts"][0]["text"] for e in transcript["events"] if e["author"] == "user"]
        assert texts == ["hello", "again"]
    assert sessions.is_file()  # the transcript lives in the data dir, past the instance's life
