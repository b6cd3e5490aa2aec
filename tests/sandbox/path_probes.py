"""Workload code that looks for the server's data directory in everything it can read about itself (issue 34,
"neutral paths inside"): its variables, its working directory, its command line, its mount table, its memory
maps and the files of its own tree (its code, its environment, its home, its state).

Each probe reports, for each of those places, the first excerpt that names the data directory (its absolute
path, or its own distinctive name: a mount table shows a bind mount's source relative to its file system, so a
data directory on a file system of its own would show without its parents), and nothing where it found none.
The test hands in the markers.
"""

from __future__ import annotations

import json

from .serve_support import build_step_package

BUILD_MARKER = "PATH-FINDINGS:"

PYTHON_PROBE = r'''
import json, os, sys

def _text(path, limit=1 << 20):
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("latin-1")
    except OSError:
        return ""

def _excerpt(text):
    for marker in MARKERS:
        at = text.find(marker)
        if at >= 0:
            return text[max(0, at - 120): at + len(marker) + 60]
    return None

def leaks():
    found = {}
    def look(where, text):
        excerpt = _excerpt(text)
        if excerpt is not None and where not in found:
            found[where] = excerpt
    look("environment", "\n".join(f"{k}={v}" for k, v in os.environ.items()))
    look("environment", _text("/proc/self/environ").replace("\0", "\n"))
    look("working directory", os.getcwd())
    look("command line", _text("/proc/self/cmdline").replace("\0", " ") + " " + sys.executable)
    look("mount table", _text("/proc/self/mounts", 1 << 24))
    mounts = [line.split(" ")[4] for line in _text("/proc/self/mountinfo", 1 << 24).splitlines()
              if _excerpt(line) is not None]
    look("memory maps", _text("/proc/self/maps", 1 << 24))
    look("interpreter", "\n".join([sys.prefix, sys.exec_prefix, *sys.path, __file__]))
    store = os.environ.get("CAI_SESSION_STORE", "")
    store_path = store.split(":///", 1)[-1] if store.startswith("sqlite") else store  # sqlite:////var/...
    roots = {sys.prefix, os.getcwd(), os.environ.get("HOME", ""),
             os.path.dirname(store_path) if store_path.startswith("/") else ""}
    for root in sorted(r for r in roots if r and r != "/" and os.path.isdir(r)):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in filenames:
                path = os.path.join(dirpath, name)
                text = _text(path)
                if os.path.isfile(path) and not os.path.islink(path) and "MARKERS = [" not in text:
                    look("files", path + "\n" + text)  # (not the probe's own source)
    return {"leaks": found, "mounts": mounts, "cwd": os.getcwd(), "executable": sys.executable, "prefix": sys.prefix,
            "code_dir": os.environ.get("CAI_CODE_DIR"), "home": os.environ.get("HOME"),
            "session_store": store}
'''


def _markers(markers: list[str]) -> str:
    return f"MARKERS = {json.dumps(markers)}\n"


def python_function(markers: list[str]) -> dict[str, str]:
    return {"main.py": PYTHON_PROBE + _markers(markers) + r'''
def handle(event, context):
    if event.get("action") == "fail":
        raise RuntimeError("the probe failed on purpose")
    return leaks()
'''}


def langgraph_agent(markers: list[str]) -> dict[str, str]:
    return {"graph.py": PYTHON_PROBE + _markers(markers) + r'''
from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph


def probe(state):
    return {"messages": [AIMessage(content=json.dumps(leaks()))]}


builder = StateGraph(MessagesState)
builder.add_node("probe", probe)
builder.add_edge(START, "probe")
graph = builder.compile()
'''}


def build_step(markers: list[str]) -> dict[str, str]:
    """A Python function whose requirements.txt installs a local package built by an in-tree backend: the
    backend runs inside `pip install` (the environment's build step), reports and fails the build."""
    backend = PYTHON_PROBE + _markers(markers) + f'''
import sys
print({BUILD_MARKER!r} + json.dumps(leaks()), file=sys.stderr, flush=True)
raise SystemExit(1)
'''
    return build_step_package("probepkg", backend)


def node_function(markers: list[str]) -> dict[str, str]:
    return {"index.js": f"const MARKERS = {json.dumps(markers)};\n" + r'''
const fs = require("fs");

function text(p) { try { return fs.readFileSync(p, "latin1"); } catch (e) { return ""; } }

exports.handle = async (event, context) => {
  const found = {};
  const look = (where, t) => {
    for (const m of MARKERS) {
      const at = t.indexOf(m);
      if (at >= 0 && !(where in found)) found[where] = t.slice(Math.max(0, at - 120), at + m.length + 60);
    }
  };
  look("environment", Object.entries(process.env).map(([k, v]) => `${k}=${v}`).join("\n"));
  look("working directory", process.cwd());
  look("command line", text("/proc/self/cmdline").split("\0").join(" ") + " " + process.execPath + " " + __filename);
  look("mount table", text("/proc/self/mounts"));
  look("memory maps", text("/proc/self/maps"));
  const mounts = text("/proc/self/mountinfo").split("\n").filter((l) => MARKERS.some((m) => l.includes(m)))
    .map((l) => l.split(" ")[4]);
  return { leaks: found, mounts, cwd: process.cwd() };
};
'''}


def go_function(markers: list[str]) -> dict[str, str]:
    return {"main.go": r'''package main

import (
	"os"
	"strings"
)

var markers = []string{''' + ", ".join(json.dumps(m) for m in markers) + r'''}

func text(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(data)
}

func Handle(event map[string]any, context map[string]any) (any, error) {
	found := map[string]string{}
	look := func(where, t string) {
		for _, m := range markers {
			if at := strings.Index(t, m); at >= 0 {
				if _, seen := found[where]; !seen {
					start, end := at-120, at+len(m)+60
					if start < 0 {
						start = 0
					}
					if end > len(t) {
						end = len(t)
					}
					found[where] = t[start:end]
				}
			}
		}
	}
	cwd, _ := os.Getwd()
	exe, _ := os.Executable()
	look("environment", strings.Join(os.Environ(), "\n"))
	look("working directory", cwd)
	look("command line", strings.ReplaceAll(text("/proc/self/cmdline"), "\x00", " ")+" "+exe)
	look("mount table", text("/proc/self/mounts"))
	look("memory maps", text("/proc/self/maps"))
	mounts := []string{}
	for _, line := range strings.Split(text("/proc/self/mountinfo"), "\n") {
		for _, m := range markers {
			if strings.Contains(line, m) {
				mounts = append(mounts, strings.Split(line, " ")[4])
				break
			}
		}
	}
	return map[string]any{"leaks": found, "mounts": mounts, "cwd": cwd, "executable": exe}, nil
}
'''}
