"""Python functions: `main.py` `handle(event, context)`, sync, async and streaming."""

from __future__ import annotations

import pytest

from caiplatform.adapters.memory.sessions import InMemorySessionStore
from caiplatform.testing.turn_checks import check_buffered_equals_stream, check_stream_shape, write_agent
from caiplatform.turns import Conversation, TurnError, load_runner
from caiplatform.turns.loader import EntryError

SYNC = {"main.py": '''
    def handle(event, context):
        return {"echo": event.get("message"), "n": len(context.history), "session": context.session_id}
'''}
ASYNC = {"main.py": '''
    import asyncio
    async def handle(event, context):
        await asyncio.sleep(0)
        return "hello " + event["name"]
'''}
GENERATOR = {"main.py": '''
    def handle(event, context):
        for word in ["one ", "two ", "three"]:
            yield word
'''}
BAD = {"main.py": '''
    def handle(event, context):
        return object()
'''}


async def test_sync_handler_gets_body_and_context(tmp_path):
    runner = load_runner("function", write_agent(tmp_path / "f", SYNC), agent="fn")
    result = await runner.run("hi", "s1", "u1", [])
    assert result.value == {"echo": "hi", "n": 0, "session": "s1"}
    assert result.output == '{"echo": "hi", "n": 0, "session": "s1"}'
    store = InMemorySessionStore()
    conv = Conversation(runner, store)
    await conv.invoke("a", "s2", "u2")
    second = await conv.invoke("b", "s2", "u2")
    assert second.value["n"] == 2  # user event + function answer of the first turn


async def test_async_handler_with_raw_body(tmp_path):
    runner = load_runner("function", write_agent(tmp_path / "f", ASYNC), agent="fn")
    result = await runner.run("", "s", "u", [], body={"name": "Ada"})
    assert result.value == "hello Ada" and result.output == "hello Ada"
    lines = [line async for line in runner.stream("", "s", "u", [], body={"name": "Ada"})]
    check_stream_shape(lines, "s", "u")
    check_buffered_equals_stream(result, lines)


async def test_generator_handler_streams_deltas(tmp_path):
    runner = load_runner("function", write_agent(tmp_path / "f", GENERATOR), agent="fn")
    lines = [line async for line in runner.stream("x", "s", "u", [])]
    assert [line["text"] for line in lines if line["type"] == "output"] == ["one ", "two ", "three"]
    assert (await runner.run("x", "s", "u", [])).output == "one two three"


async def test_failures(tmp_path):
    runner = load_runner("function", write_agent(tmp_path / "bad", BAD), agent="fn")
    with pytest.raises(TurnError, match="not JSON-serialisable"):
        await runner.run("x", "s", "u", [])
    lines = [line async for line in runner.stream("x", "s", "u", [])]
    assert lines[-1]["type"] == "error"
    with pytest.raises(EntryError, match="main.py"):
        load_runner("function", tmp_path / "empty-dir-missing", agent="fn")
    with pytest.raises(EntryError, match="handle"):
        load_runner("function", write_agent(tmp_path / "nohandle", {"main.py": "x = 1\n"}), agent="fn")
    with pytest.raises(TurnError, match="unsupported framework"):
        load_runner("cobol", tmp_path, agent="fn")


def test_debug_config_is_narrow(tmp_path):
    from caiplatform.turns import debug_config, open_session_store

    body = debug_config("bot", "adk", {"MODEL_API_KEY": "sk-secret", "MODEL_NAME": "m1"},
                        ["GREETING", "OPENAI_API_KEY", "DB_PASSWORD", "MODE"])
    assert body == {"agent": "bot", "framework": "adk", "model": "m1", "model_base_url_set": False,
                    "model_key_present": True, "config_keys": ["GREETING", "MODE"]}
    assert "sk-secret" not in str(body)
    assert debug_config("bot", "adk", {})["model_key_present"] is False
    assert type(open_session_store("sqlite", data_dir=tmp_path)).__name__ == "SQLiteSessionStore"
    assert (tmp_path / "sessions.sqlite3").exists()
