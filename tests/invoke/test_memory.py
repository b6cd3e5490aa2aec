"""Long-term memory: memorize a session, then a new session of any caller recalls it."""

from __future__ import annotations

from caiplatform.services.invoke_memory import collection_for, exchanges
from caiplatform.testing.example_agents import LANGGRAPH_WEATHER

LONG = "memorized-session-0123456789"


def test_a_session_becomes_one_memory_per_exchange():
    events = [
        {"author": "user", "content": {"parts": [{"text": "my favourite colour is teal"}]}},
        {"author": "bot", "content": {"parts": [{"text": "hmm", "thought": True}, {"function_call": {"name": "f"}}]}},
        {"author": "bot", "content": {"role": "user", "parts": [{"function_response": {"name": "f"}}]}},
        {"author": "bot", "content": {"parts": [{"text": "Noted: teal."}]}},
        {"author": "user", "content": {"parts": [{"text": "thanks"}]}},
    ]
    assert exchanges(events) == ["User: my favourite colour is teal\nAssistant: Noted: teal.", "User: thanks"]


async def test_memorize_then_recall_from_a_new_session(model, wired, client, admin_headers, platform):
    target = wired.deploy("mem", "langgraph", LANGGRAPH_WEATHER)
    r = await client.post("/v1/agents/mem/invoke", json={"message": "my favourite colour is teal", "session_id": LONG})
    assert r.status_code == 200
    r = await client.post(f"/v1/agents/mem/sessions/{LONG}/memorize", headers=admin_headers)
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    info = await platform.vector_engine.collection_info(collection_for(target))
    assert info is not None and info.points_count == 1

    # another caller, another session: the model is given the memory
    r = await client.post("/v1/agents/mem/invoke", json={"message": "what is my favourite colour?"})
    assert r.status_code == 200
    seen = [m["content"] for m in model.requests[-1].messages if m["role"] == "user"][-1]
    assert "my favourite colour is teal" in seen and seen.endswith("what is my favourite colour?")
    # the transcript keeps what the caller said, not the recalled memories
    session_id = r.json()["session_id"]
    transcript = (await client.get(f"/v1/agents/mem/sessions/{session_id}", headers=admin_headers)).json()
    assert transcript["events"][0]["content"]["parts"] == [{"text": "what is my favourite colour?"}]

    # memorizing again replaces, never duplicates; memorize through invoke works for signed-in callers
    await client.post(f"/v1/agents/mem/sessions/{LONG}/memorize", headers=admin_headers)
    r = await client.post("/v1/agents/mem/invoke", headers=admin_headers,
                          json={"message": "I live in Lyon", "session_id": "s-lyon", "memorize": True})
    assert r.status_code == 200
    info = await platform.vector_engine.collection_info(collection_for(target))
    assert info.points_count == 2

    await platform.invoke.forget_agent(target)
    assert await platform.vector_engine.collection_info(collection_for(target)) is None
