"""How the client packs a directory for deploy (issue 20): the framework read off the entry file, and a
tarball that leaves out what `.caiignore` names, version control, caches and environments."""

from __future__ import annotations

import io
import tarfile

import pytest

from caiplatform.client.source import detect_framework, tar_directory


@pytest.mark.parametrize("entry,framework", [("crew.py", "crewai"), ("graph.py", "langgraph"), ("agent.py", "adk"),
                                             ("main.py", "function"), ("index.js", "function-nodejs"),
                                             ("main.go", "function-go"), ("main.rb", "function-ruby"),
                                             ("other.py", "adk")])
def test_the_framework_comes_from_the_entry_file(tmp_path, entry, framework):
    (tmp_path / entry).write_text("x")
    assert detect_framework(tmp_path) == framework


def test_the_tarball_leaves_out_what_caiignore_names_and_the_usual_clutter(tmp_path):
    for path in ("graph.py", "tools/helper.py", "data/keep.csv", "data/big.bin", "notes.md", ".git/HEAD",
                 "__pycache__/graph.cpython-311.pyc", ".venv/bin/python", "node_modules/x/index.js"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(path)
    (tmp_path / ".caiignore").write_text("# large inputs\n*.bin\nnotes.md\n")
    with tarfile.open(fileobj=io.BytesIO(tar_directory(tmp_path)), mode="r:gz") as tar:
        names = sorted(member.name for member in tar.getmembers())
        owners = {(member.uid, member.gid) for member in tar.getmembers()}
    assert names == [".caiignore", "data/keep.csv", "graph.py", "tools/helper.py"]
    assert owners == {(0, 0)}
