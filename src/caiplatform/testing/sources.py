"""Small source trees per framework, for builder tests and benchmarks (written into a directory)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

LANGGRAPH = {
    "graph.py": (
        "from langgraph.graph import END, START, MessagesState, StateGraph\n\n\n"
        "def respond(state: MessagesState):\n"
        "    return {'messages': [('ai', 'echo: ' + state['messages'][-1].content)]}\n\n\n"
        "builder = StateGraph(MessagesState)\n"
        "builder.add_node('respond', respond)\n"
        "builder.add_edge(START, 'respond')\n"
        "builder.add_edge('respond', END)\n"
        "graph = builder.compile()\n"
    ),
}
ADK = {"agent.py": "from google.adk.agents import Agent\n\nroot_agent = Agent(name='echo', model='gpt-4o-mini')\n"}
CREWAI = {
    "crew.py": (
        "from crewai import Agent, Crew, Task\n\n"
        "writer = Agent(role='writer', goal='answer', backstory='helpful')\n"
        "task = Task(description='Answer: {message}', expected_output='an answer', agent=writer)\n"
        "crew = Crew(agents=[writer], tasks=[task])\n"
    ),
}
FUNCTION = {"main.py": "def handle(event, context):\n    return {'echo': event}\n"}
NODE_FUNCTION = {"index.js": "exports.handle = async (event, context) => ({ echo: event });\n"}
GO_FUNCTION = {
    "main.go": "package main\n\nfunc Handle(event map[string]any, context map[string]any) (any, error) {\n"
               "\treturn map[string]any{\"echo\": event}, nil\n}\n",
}
RUBY_FUNCTION = {"main.rb": "def handle(event, context)\n  { echo: event }\nend\n"}

BY_FRAMEWORK = {
    "langgraph": LANGGRAPH,
    "adk": ADK,
    "crewai": CREWAI,
    "function": FUNCTION,
    "function-nodejs": NODE_FUNCTION,
    "function-go": GO_FUNCTION,
    "function-ruby": RUBY_FUNCTION,
}


def write_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def directory_tarball(root: Path) -> bytes:
    """A `.tar.gz` of the files under `root` (what a person uploads as `code`), without `__pycache__`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.add(path, arcname=str(path.relative_to(root)))
    return buffer.getvalue()
