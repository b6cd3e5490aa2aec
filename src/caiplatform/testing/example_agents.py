"""Small example agents and functions, one per framework, for harness and invoke tests and benchmarks.

Each is a mapping of file name to source; `write_agent(dir, files)` (from `turn_checks`) writes one.
They reach their model through `caiplatform.turns.models` (so through `MODEL_BASE_URL`), which makes
them answer from the scripted model server in tests.
"""

from __future__ import annotations

from caiplatform.testing.model_server import Step, tool_step

ADK_WEATHER = {
    "agent.py": '''
        from google.adk.agents import LlmAgent
        from caiplatform.turns.models import adk_model

        def get_weather(city: str) -> str:
            """Weather of a city."""
            return f"sunny in {city}"

        root_agent = LlmAgent(name="weather_agent", model=adk_model(), instruction="Answer about weather.",
                              tools=[get_weather])
    ''',
}

LANGGRAPH_WEATHER = {
    "tools.py": '''
        def get_weather(city: str) -> str:
            """Weather of a city."""
            return f"sunny in {city}"
    ''',
    "graph.py": '''
        from langgraph.prebuilt import create_react_agent
        from caiplatform.turns.models import chat_model
        from tools import get_weather

        graph = create_react_agent(chat_model(), [get_weather])
    ''',
}

PYTHON_FUNCTION = {
    "main.py": '''
        def handle(event, context):
            if event.get("fail"):
                raise ValueError("asked to fail")
            return {"echo": event.get("message"), "keys": sorted(event), "agent": context.agent}
    ''',
}

NODE_FUNCTION = {
    "index.js": '''
        exports.handle = async (event, context) => {
          console.log("node saw", JSON.stringify(event));
          if (event.fail) throw new Error("asked to fail");
          return { echo: event.message, keys: Object.keys(event).sort(), agent: context.agent };
        };
    ''',
}

GO_FUNCTION = {
    "main.go": '''
        package main

        import (
            "errors"
            "fmt"
            "sort"
        )

        func Handle(event map[string]any, context map[string]any) (any, error) {
            fmt.Println("go saw", event)
            if fail, _ := event["fail"].(bool); fail {
                return nil, errors.New("asked to fail")
            }
            keys := make([]string, 0, len(event))
            for key := range event {
                keys = append(keys, key)
            }
            sort.Strings(keys)
            return map[string]any{"echo": event["message"], "keys": keys, "agent": context["agent"]}, nil
        }
    ''',
}

RUBY_FUNCTION = {
    "main.rb": '''
        def handle(event, context)
          puts "ruby saw #{event}"
          raise "asked to fail" if event["fail"]
          { echo: event["message"], keys: event.keys.sort, agent: context.agent }
        end
    ''',
}

#: The same function in each language: `{echo, keys, agent}`, and an error when the event says `fail`.
ECHO_FUNCTIONS = {
    "function": PYTHON_FUNCTION,
    "function-nodejs": NODE_FUNCTION,
    "function-go": GO_FUNCTION,
    "function-ruby": RUBY_FUNCTION,
}
#: How each language reports `asked to fail`.
ECHO_FUNCTION_ERRORS = {
    "function": "ValueError: asked to fail",
    "function-nodejs": "Error: asked to fail",
    "function-go": "asked to fail",
    "function-ruby": "RuntimeError: asked to fail",
}

#: A tool call with reasoning, then the answer (the weather agents above).
WEATHER_SCRIPT = [
    tool_step("get_weather", reasoning="I should look it up.", city="Paris"),
    Step(content="It is sunny in Paris today.", reasoning="The tool answered."),
]
