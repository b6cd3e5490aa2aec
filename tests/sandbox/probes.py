"""Hostile workload code: it tries each escape of issue 26 and reports what it could reach.

The same checks in Python (a function, a LangGraph graph, a serverless `command`, a build step) and in
JavaScript (a Node.js function). A probe knows what a real attacker would find out by looking around: the
server's pid, the data directory and a path outside its own tree (the tests hand them in).
"""

from __future__ import annotations

import json

from .serve_support import build_step_package

PYTHON_CHECKS = r'''
import glob, json, os, re

def _readable(path):
    try:
        with open(path, "rb") as fh:
            fh.read(1)
        return True
    except OSError:
        return False

def _text(path):
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("latin-1")
    except OSError:
        return ""

def findings(data_dir, server_pid, outside):
    own_key = os.environ.get("CAI_PROJECT_KEY", "")
    keys = set()
    for path in glob.glob(data_dir + "/runtime/workloads/*.json") + glob.glob("/proc/[0-9]*/environ"):
        keys.update(re.findall(r"cai_wl_[A-Za-z0-9_-]+", _text(path)))
    keys.discard(own_key)
    sessions = [p for p in glob.glob(data_dir + "/sessions/**", recursive=True) if os.path.isfile(p) and _readable(p)]
    try:
        with open(outside, "w") as fh:
            fh.write(str(os.getuid()))
        wrote = True
    except OSError:
        wrote = False
    processes = [_text(p).replace("\0", " ") for p in glob.glob("/proc/[0-9]*/cmdline")]
    return {
        "uid": os.getuid(),
        "server_environ": "CAI_ADMIN_PASSWORD" in _text("/proc/%d/environ" % server_pid),
        "database": _readable(data_dir + "/platform.db"),
        "session_key": _readable(data_dir + "/session.key"),
        "openbao_init": _readable(data_dir + "/openbao/init.json"),
        "other_keys": sorted(keys),
        "sessions": sessions,
        "wrote_outside": wrote,
        "server_process": any("caiplatform" + " serve" in p for p in processes),  # not this probe's own text
        "processes": len(processes),
    }
'''

FORK_BOMB = r'''
import os, signal, time

def fork_bomb(limit=1500):
    children = []
    try:
        for _ in range(limit):
            pid = os.fork()
            if pid == 0:
                time.sleep(20)
                os._exit(0)
            children.append(pid)
    except OSError:
        pass
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
    return len(children)
'''

MEMORY_HOG = r'''
def memory_hog(mib=1024):
    blocks = []
    for _ in range(mib):
        block = bytearray(1024 * 1024)
        block[::4096] = b"x" * len(block[::4096])  # touched, so it is really resident
        blocks.append(block)
    return len(blocks)
'''


def _constants(data_dir: str, server_pid: int, outside: str) -> str:
    return f"DATA_DIR, SERVER_PID, OUTSIDE = {json.dumps(data_dir)}, {server_pid}, {json.dumps(outside)}\n"


def python_function(data_dir: str, server_pid: int, outside: str) -> dict[str, str]:
    main = (PYTHON_CHECKS + FORK_BOMB + MEMORY_HOG + _constants(data_dir, server_pid, outside) + r'''
def handle(event, context):
    action = event.get("action", "probe")
    if action == "forks":
        return {"forks": fork_bomb()}
    if action == "hog":
        return {"mib": memory_hog()}
    return findings(DATA_DIR, SERVER_PID, OUTSIDE)
''')
    return {"main.py": main}


def langgraph_agent(data_dir: str, server_pid: int, outside: str) -> dict[str, str]:
    graph = (PYTHON_CHECKS + _constants(data_dir, server_pid, outside) + r'''
from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph


def probe(state):
    return {"messages": [AIMessage(content=json.dumps(findings(DATA_DIR, SERVER_PID, OUTSIDE)))]}


builder = StateGraph(MessagesState)
builder.add_node("probe", probe)
builder.add_edge(START, "probe")
graph = builder.compile()
''')
    return {"graph.py": graph}


def command_server(data_dir: str, server_pid: int, outside: str) -> str:
    """Python for `python -c`: serves the findings on $PORT (a serverless `command`)."""
    return PYTHON_CHECKS + _constants(data_dir, server_pid, outside) + r'''
import http.server

class Probe(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(findings(DATA_DIR, SERVER_PID, OUTSIDE)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Probe).serve_forever()
'''


BUILD_MARKER = "PROBE-FINDINGS:"


def build_step(data_dir: str, server_pid: int, outside: str) -> dict[str, str]:
    """A Python function whose requirements.txt installs a local package built by an in-tree backend: the
    backend runs during `pip install` (the build step), reports, and fails the build so the report is in
    the build's message."""
    backend = PYTHON_CHECKS + _constants(data_dir, server_pid, outside) + f'''
import sys
print({BUILD_MARKER!r} + json.dumps(findings(DATA_DIR, SERVER_PID, OUTSIDE)), file=sys.stderr, flush=True)
raise SystemExit(1)
'''
    return build_step_package("probepkg", backend)


def node_function(data_dir: str, server_pid: int, outside: str) -> dict[str, str]:
    constants = f"const DATA_DIR = {json.dumps(data_dir)}, SERVER_PID = {server_pid}, OUTSIDE = {json.dumps(outside)};\n"
    return {"index.js": constants + r'''
const fs = require("fs");
const path = require("path");

function text(p) { try { return fs.readFileSync(p, "latin1"); } catch (e) { return ""; } }
function readable(p) { try { fs.readFileSync(p); return true; } catch (e) { return false; } }
function list(dir) { try { return fs.readdirSync(dir); } catch (e) { return []; } }
function files(dir) {
  let out = [];
  for (const name of list(dir)) {
    const p = path.join(dir, name);
    let st; try { st = fs.statSync(p); } catch (e) { continue; }
    if (st.isDirectory()) out = out.concat(files(p)); else if (readable(p)) out.push(p);
  }
  return out;
}

async function forkBomb(limit = 1500) {
  const { spawn } = require("child_process");
  const children = [];
  for (let i = 0; i < limit; i++) {
    let child;
    try { child = spawn("sleep", ["20"], { stdio: "ignore" }); } catch (e) { break; }
    child.on("error", () => {});
    if (child.pid === undefined) break;
    children.push(child);
  }
  for (const child of children) child.kill("SIGKILL");
  return children.length;
}

function memoryHog(mib = 1024) {
  const blocks = [];
  for (let i = 0; i < mib; i++) blocks.push(Buffer.alloc(1024 * 1024, 1));
  return blocks.length;
}

exports.handle = async (event, context) => {
  if (event.action === "forks") return { forks: await forkBomb() };
  if (event.action === "hog") return { mib: memoryHog() };
  const pids = list("/proc").filter((n) => /^\d+$/.test(n));
  const keys = new Set();
  const sources = list(DATA_DIR + "/runtime/workloads").map((n) => DATA_DIR + "/runtime/workloads/" + n)
    .concat(pids.map((p) => `/proc/${p}/environ`));
  for (const p of sources) for (const m of text(p).matchAll(/cai_wl_[A-Za-z0-9_-]+/g)) keys.add(m[0]);
  keys.delete(process.env.CAI_PROJECT_KEY || "");
  let wrote = false;
  try { fs.writeFileSync(OUTSIDE, String(process.getuid())); wrote = true; } catch (e) {}
  const processes = pids.map((p) => text(`/proc/${p}/cmdline`).split("\0").join(" "));
  return {
    uid: process.getuid(),
    server_environ: text(`/proc/${SERVER_PID}/environ`).includes("CAI_ADMIN_PASSWORD"),
    database: readable(DATA_DIR + "/platform.db"),
    session_key: readable(DATA_DIR + "/session.key"),
    openbao_init: readable(DATA_DIR + "/openbao/init.json"),
    other_keys: [...keys].sort(),
    sessions: files(DATA_DIR + "/sessions"),
    wrote_outside: wrote,
    server_process: processes.some((p) => p.includes("caiplatform serve")),
    processes: processes.length,
  };
};
'''}


def npm_build_step(data_dir: str, server_pid: int, outside: str) -> dict[str, str]:
    """A Node.js function whose package.json has a `preinstall` script: `npm install` (the build step) runs
    the probe, which reports and fails the build."""
    files = node_function(data_dir, server_pid, outside)
    files["probe.js"] = (
        'require("./index.js").handle({}, {}).then((found) => {\n'
        f'  console.error({BUILD_MARKER!r} + JSON.stringify(found));\n'
        "  process.exit(1);\n"
        "});\n"
    )
    files["package.json"] = json.dumps({"name": "probe", "version": "1.0.0", "scripts": {"preinstall": "node probe.js"},
                                        "dependencies": {"dep": "file:./dep"}})
    files["dep/package.json"] = json.dumps({"name": "dep", "version": "1.0.0"})
    return files
