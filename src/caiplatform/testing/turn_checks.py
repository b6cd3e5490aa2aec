"""Checks shared by every framework's turn test (shipped so harness servers can reuse them)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from caiplatform.turns import TurnResult


def joined(lines: list[dict], kind: str) -> str:
    return "".join(line["text"] for line in lines if line["type"] == kind)


def check_stream_shape(lines: list[dict], session_id: str, user_id: str) -> None:
    assert lines[-1] == {"type": "done", "session_id": session_id, "user_id": user_id}, lines[-1]
    seqs = [line["seq"] for line in lines if "seq" in line]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    allowed = {
        "thinking": {"type", "seq", "text"}, "output": {"type", "seq", "text"},
        "block_end": {"type", "seq", "kind"}, "tool_call": {"type", "name", "args"},
        "tool_result": {"type", "name", "result"}, "done": {"type", "session_id", "user_id"},
    }
    open_block = None
    for line in lines:
        assert set(line) == allowed[line["type"]], line
        if line["type"] in ("thinking", "output"):
            assert open_block in (None, line["type"]), f"{line} inside an open {open_block} block"
            open_block = line["type"]
        elif line["type"] == "block_end":
            assert line["kind"] == open_block
            open_block = None
        else:
            assert open_block is None, f"{line} while a {open_block} block is open"


def check_buffered_equals_stream(result: TurnResult, lines: list[dict]) -> None:
    assert joined(lines, "output") == result.output
    assert joined(lines, "thinking") == result.reasoning
    assert [line["name"] for line in lines if line["type"] == "tool_call"] == [c["name"] for c in result.tool_calls]


def check_transcript(events: list[dict], agent: str) -> None:
    assert events and events[0]["author"] == "user"
    for event in events:
        assert event["author"] in ("user", agent)
        assert {"author", "timestamp", "invocation_id", "content"} <= set(event)
        assert isinstance(event["content"]["parts"], list)


def write_agent(root: Path, files: dict[str, str]) -> Path:
    """Write a code directory (file name to dedented text) and return it."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return root
