"""The sandbox's limits without cgroups (a server that is not root, or `CAI_SANDBOX_LIMITS=rlimits`): the
memory limit is `RLIMIT_DATA`, under which Node.js starts and a memory hog is still stopped; a harness
whose allocation fails against it ends with `OUT_OF_MEMORY_EXIT`, which the runtime reports as
`OOMKilled` (docs/decisions/sandbox.md)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from caiplatform.sandbox import Launch
from caiplatform.sandbox.limits import OUT_OF_MEMORY_EXIT, Limits, rlimit_argv
from caiplatform.supervisor import free_port
from caiplatform.turns.base import ran_out_of_memory

MiB = 2**20
FALLBACK = rlimit_argv(Limits(memory_bytes=128 * MiB))
SRC = str(Path(__file__).resolve().parents[2] / "src")

PYTHON_HOG = '''
def handle(event, context):
    if event.get("action") == "hog":
        blocks = [bytearray(MiB) for _ in range(1024)]
        return {"mib": len(blocks)}
    if event.get("action") == "big":
        return {"len": len(bytearray(10 ** 15))}  # refused by the kernel whatever the limit
    return {"ok": True}

MiB = 2 ** 20
'''
NODE_HOG = '''
exports.handle = async (event) => {
  if (event.action === "hog") {
    const blocks = [];
    for (let i = 0; i < 1024; i++) blocks.push(Buffer.alloc(1024 * 1024, 1));
    return { mib: blocks.length };
  }
  return { ok: true };
};
'''


def test_the_fallback_limits_private_memory_not_address_space():
    assert FALLBACK[0] == "prlimit" and f"--data={128 * MiB}" in FALLBACK
    assert not any(arg.startswith("--as") for arg in FALLBACK)


def test_an_out_of_memory_exit_is_oomkilled_only_under_the_rlimit_fallback():
    rlimited = Launch(["x"], rlimited=True)
    assert rlimited.oom_killed(OUT_OF_MEMORY_EXIT)
    assert not rlimited.oom_killed(1) and not rlimited.oom_killed(None) and not rlimited.oom_killed(-9)
    assert not Launch(["x"]).oom_killed(OUT_OF_MEMORY_EXIT)  # no rlimit: the code is the program's own


def test_a_memory_error_is_recognised_behind_the_errors_that_wrap_it():
    try:
        try:
            raise MemoryError
        except MemoryError as exc:
            raise RuntimeError("node failed") from exc
    except RuntimeError as wrapped:
        assert ran_out_of_memory(wrapped)
    assert not ran_out_of_memory(ValueError("no"))


@pytest.mark.parametrize("code", [
    "console.log('up')",  # V8 reserves about 700 MiB of address space before this line runs
])
def test_node_starts_under_the_fallback(code):
    node = shutil.which("node")
    assert node is not None, "Node.js"
    done = subprocess.run([*FALLBACK, node, "-e", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "up", done.stderr


def test_a_python_hog_is_stopped_by_the_fallback():
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(2**20))\n    blocks[-1][::4096] = b'x' * 256"
    done = subprocess.run([*FALLBACK, sys.executable, "-c", hog], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 1 and "MemoryError" in done.stderr, done.stderr


class Harness:
    """`python -m caiplatform.harness` under the fallback's limit, as the sandbox runs it without cgroups."""

    def __init__(self, tmp_path: Path, framework: str, files: dict[str, str]):
        code = tmp_path / "code"
        code.mkdir(parents=True)
        for name, text in files.items():
            (code / name).write_text(text)
        self.port = free_port()
        env = {"CAI_FRAMEWORK": framework, "CAI_CODE_DIR": str(code), "AGENT_NAME": "hog",
               "CAI_SESSION_STORE": "memory", "PORT": str(self.port), "PATH": os.environ.get("PATH", ""),
               "HOME": str(tmp_path), "PYTHONPATH": SRC}
        self.log = (tmp_path / "harness.log").open("wb")
        self.proc = subprocess.Popen([*FALLBACK, sys.executable, "-m", "caiplatform.harness"], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=str(code),
                                     start_new_session=True)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.output()
            try:
                if self.http.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.05)

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def invoke(self, action: str) -> httpx.Response:
        return self.http.post("/invoke", json={"action": action})

    def close(self) -> None:
        self.http.close()
        with contextlib.suppress(ProcessLookupError):  # the harness and its language process
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


@pytest.fixture
def harness(tmp_path):
    made: list[Harness] = []

    def start(framework: str, files: dict[str, str]) -> Harness:
        made.append(Harness(tmp_path / framework, framework, files))
        made[-1].wait_healthy()  # once recorded: one that never gets healthy is killed all the same
        return made[-1]

    yield start
    for h in made:
        h.close()


@pytest.mark.parametrize("framework, files", [
    ("function", {"main.py": PYTHON_HOG}),
    ("function-nodejs", {"index.js": NODE_HOG}),
], ids=["python", "nodejs"])
def test_a_harness_that_runs_out_of_memory_answers_then_ends_as_out_of_memory(harness, framework, files):
    h = harness(framework, files)
    assert h.invoke("probe").json() == {"ok": True}  # it serves within the limit
    answer = h.invoke("hog")
    assert answer.status_code == 500, answer.text
    assert h.proc.wait(timeout=30) == OUT_OF_MEMORY_EXIT, h.output()
    assert "out of memory" in h.output()


def test_an_allocation_no_machine_could_make_is_not_the_limit_without_one(harness, monkeypatch):
    """The fallback's exit is for a harness under a memory rlimit only; without one (a cgroup, or no
    sandbox) a failed allocation is the function's own error and the instance keeps serving."""
    monkeypatch.setattr(sys.modules[__name__], "FALLBACK", [])
    h = harness("function", {"main.py": PYTHON_HOG})
    assert h.invoke("big").status_code == 500
    assert h.invoke("probe").json() == {"ok": True}
    assert h.proc.poll() is None
