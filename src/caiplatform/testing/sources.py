"""Small source trees per framework, for builder tests and benchmarks (written into a directory)."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import zipfile
from collections.abc import Mapping
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


def write_tree(root: Path, files: Mapping[str, str | bytes]) -> Path:
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


def pure_python_wheel(name: str, module_source: str, version: str = "1.0") -> bytes:
    """The bytes of a minimal pure-Python wheel holding one module `name`, so that a build installs a
    requirement from a file of the source tree (`--no-index`) instead of a package index."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": module_source.encode(),
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: caiplatform-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for path, data in files.items()
    ]
    files[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
    return buffer.getvalue()
