"""cai_agent_invokes_total and its duration for buffered and streamed invokes (errors: tests/agents/test_agents_metrics.py)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from caiplatform.testing.example_agents import LANGGRAPH_WEATHER, WEATHER_SCRIPT

AUTOMATION = {"Authorization": "Bearer automation-token-for-tests"}
LONG = "anonymous-session-0123456789"


def value(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


async def test_invokes_are_counted_by_agent_and_outcome(model, wired, client):
    target = wired.deploy("weather", "langgraph", LANGGRAPH_WEATHER)
    for path in ("/v1/agents/weather/invoke", "/v1/agents/weather/invoke/stream"):
        model.set_script(WEATHER_SCRIPT)
        r = await client.post(path, json={"message": "weather in Paris?", "session_id": LONG})
        assert r.status_code == 200, r.text
    # refused before the agent is reached (rule 1): not an invocation
    assert (await client.post("/v1/agents/weather/invoke", json={"message": ""})).status_code == 400

    text = (await client.get("/metrics", headers=AUTOMATION)).text
    labels = {"project": target.project_short, "agent": "weather"}
    assert value(text, "cai_agent_invokes_total", **labels, outcome="ok") == 2
    assert value(text, "cai_agent_invokes_total", **labels, outcome="error") == 0
    assert value(text, "cai_agent_invoke_duration_seconds_count", **labels) == 2
    assert value(text, "cai_http_requests_total", method="POST", route="/v1/agents/{name}/invoke/stream",
                 status_class="2xx") == 1
    assert LONG not in text and target.project_id not in text
