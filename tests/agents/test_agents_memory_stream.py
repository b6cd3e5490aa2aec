"""`invoke/stream` through `Platform.in_memory()` is token-sized: the first line reaches the caller while
the model is still streaming the answer (the in-memory runtime's transport streams the harness's body)."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx

from caiplatform.adapters.memory.asgi_transport import StreamingASGITransport
from caiplatform.testing.model_server import Step

from .test_agents_examples import _deploy, model_server, settings  # noqa: F401 - the same fixtures

REAL_HARNESS = True  # tests/agents/conftest.py: instances are the harness, not the tiny test app
ANSWER = "It is sunny in Paris today."


async def test_first_stream_line_arrives_while_the_model_is_still_streaming(platform, client, world, model_server):  # noqa: F811
    from caiplatform_server.app import ALL_APIS, create_app

    model, _ = model_server
    hold = threading.Event()  # the model sends its first token, then waits for this
    model.set_script(lambda request: Step(content=ANSWER, hold=hold))
    await _deploy(client, world.member, "weather", "langgraph-weather", "langgraph")
    # The caller's side streams too (the shared `client` fixture's httpx.ASGITransport buffers).
    app = create_app(platform, apis=ALL_APIS, manage_lifecycle=False)
    try:
        async with httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://testserver",
                                     timeout=30) as caller:
            # Well under the model's 30 s hold: a transport that buffers the body cannot answer in time.
            async with asyncio.timeout(15):
                response = await caller.send(caller.build_request(
                    "POST", "/v1/agents/weather/invoke/stream", json={"message": "weather in Paris?"}), stream=True)
                stream = response.aiter_lines()
                first = json.loads(await anext(stream))
            try:
                assert response.status_code == 200
                assert not hold.is_set()
                assert first["type"] == "output" and first["seq"] == 1
                assert first["text"] and ANSWER.startswith(first["text"]) and first["text"] != ANSWER
                hold.set()
                rest = [json.loads(line) async for line in stream if line.strip()]
            finally:
                await response.aclose()
    finally:
        hold.set()
    text = first["text"] + "".join(line.get("text", "") for line in rest if line["type"] == "output")
    assert text == ANSWER
    assert rest[-1]["type"] == "done"
