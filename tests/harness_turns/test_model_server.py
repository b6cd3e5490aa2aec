"""The scripted OpenAI-compatible model server, through the official OpenAI client and raw HTTP."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from caiplatform.embeddings import local_embed
from caiplatform.testing.model_server import ScriptedModel, Step, tokens, tool_step


def test_tokens_join_back_exactly():
    for text in ["", "hello", "  two  words here ", "line\nbreak\ttab"]:
        assert "".join(tokens(text)) == text


def test_local_embed_is_deterministic_normalised_and_meaningful():
    a, b, c = local_embed(["the cat sat on the mat", "a cat on a mat", "quarterly tax filing deadline"], 64)
    assert len(a) == 64 and local_embed("the cat sat on the mat", 64)[0] == a
    for v in (a, b, c):
        assert math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-9)
    cos = lambda x, y: sum(p * q for p, q in zip(x, y, strict=True))  # noqa: E731
    assert cos(a, b) > cos(a, c)
    assert len(local_embed([""], 8)[0]) == 8


async def test_echo_buffered_and_streamed_in_process():
    model = ScriptedModel()
    transport = httpx.ASGITransport(app=model.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://model") as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "ping pong"}]}
        r = await client.post("/v1/chat/completions", json=body)
        data = r.json()
        assert data["choices"][0]["message"]["content"] == "you said: ping pong"
        assert data["usage"]["total_tokens"] > 0
        r = await client.post("/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}})
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(x) for x in lines[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == "you said: ping pong"
        assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) > 1
        assert chunks[-1]["usage"]["completion_tokens"] > 0
        r = await client.post("/v1/chat/completions", json={"nope": 1})
        assert r.status_code == 400
        r = await client.post("/v1/embeddings", json={"input": ["a", "b"], "dimensions": 16})
        assert [len(d["embedding"]) for d in r.json()["data"]] == [16, 16]


def test_openai_client_sees_tool_calls_reasoning_and_script_steps():
    openai = pytest.importorskip("openai")
    model = ScriptedModel([
        tool_step("get_weather", reasoning="need the weather", city="Paris"),
        Step(content="It is sunny in Paris.", reasoning="the tool said sunny"),
    ])
    with model.serve() as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="k")
        messages = [{"role": "user", "content": "weather in Paris?"}]
        first = client.chat.completions.create(model="m", messages=messages)
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        assert first.choices[0].message.model_extra["reasoning_content"] == "need the weather"
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        stream = client.chat.completions.create(model="m", messages=messages, stream=True)
        text, thoughts = "", ""
        for chunk in stream:
            delta = chunk.choices[0].delta
            text += delta.content or ""
            thoughts += (delta.model_extra or {}).get("reasoning_content") or ""
        assert text == "It is sunny in Paris." and thoughts == "the tool said sunny"
        assert model.requests[-1].tool_results == ["sunny"]
        # past the end of the script: echo
        again = client.chat.completions.create(model="m", messages=messages + [
            {"role": "assistant", "content": "x"}, {"role": "user", "content": "bye"}])
        assert again.choices[0].message.content == "you said: bye"


def test_rule_scripts_and_sequential_mode():
    model = ScriptedModel(lambda req: f"{len(req.messages)} messages" if "count" in req.last_text() else None)
    with model.serve() as base_url:
        post = lambda text: httpx.post(f"{base_url}/chat/completions",  # noqa: E731
                                       json={"messages": [{"role": "user", "content": text}]}).json()
        assert post("count")["choices"][0]["message"]["content"] == "1 messages"
        assert post("other")["choices"][0]["message"]["content"] == "you said: other"
        model.set_script(["one", "two"], mode="sequential")
        assert [post("x")["choices"][0]["message"]["content"] for _ in range(3)] == ["one", "two", "you said: x"]
