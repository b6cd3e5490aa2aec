"""The program a warm sandbox runs (standard library only): it starts, says `ready`, and waits.

Protocol on its own stdin/stdout (never the snippet's): it writes `ready\\n`; it reads one JSON line
`{argv, files, timeout_s, stdout_cap, stderr_cap, files_cap, max_files}`; it writes the input files
into its work directory, runs `argv` there (a session of its own, so the whole tree can be killed),
keeps at most `*_cap` bytes of each output stream (draining the rest), kills the snippet at `timeout_s`,
and answers one JSON line `{exit_code, stdout, stderr, *_truncated, timed_out, files, files_truncated}`
before it exits. The sandbox is then discarded by the platform, whatever happened.

The memory limit and the hard deadline are enforced from outside (the cgroup, the platform), so a
snippet that kills this program only loses its own answer.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from caiplatform.sandbox.limits import STDERR_TAIL, ran_out_of_memory

JOIN_SECONDS = 1.0


def _drain(stream, cap: int, sink: dict) -> None:  # type: ignore[no-untyped-def]
    kept = bytearray()
    truncated = False
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            break
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > max(room, 0):
            truncated = True
    sink["data"] = bytes(kept)
    sink["truncated"] = truncated


def _write_inputs(work: Path, files: list[dict]) -> None:
    for item in files:
        target = work / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(item["content_base64"]))


def _outputs(output: Path, cap: int, max_files: int) -> tuple[list[dict], bool]:
    found: list[dict] = []
    total = 0
    truncated = False
    for path in sorted(p for p in output.rglob("*") if p.is_file() and not p.is_symlink()):
        size = path.stat().st_size
        if len(found) >= max_files or total + size > cap:
            truncated = True
            continue
        total += size
        found.append({"path": str(path.relative_to(output)), "size": size,
                      "content_base64": base64.b64encode(path.read_bytes()).decode()})
    return found, truncated


def run_request(work: Path, request: dict) -> dict:
    """Run one snippet request in `work`; its answer (also what a cluster pod's `pod_server` answers)."""
    output = work / "output"
    output.mkdir(parents=True, exist_ok=True)
    _write_inputs(work, request.get("files") or [])
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(work), "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "OUTPUT_DIR": str(output), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    child = subprocess.Popen(request["argv"], cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    sinks: dict[str, dict] = {"stdout": {}, "stderr": {}}
    readers = [threading.Thread(target=_drain, args=(getattr(child, name), request[f"{name}_cap"], sinks[name]),
                                daemon=True) for name in sinks]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        child.wait(timeout=request["timeout_s"])
    except subprocess.TimeoutExpired:
        timed_out = True
    try:
        os.killpg(child.pid, signal.SIGKILL)  # what it left running too
    except (ProcessLookupError, PermissionError):
        pass
    code = child.wait()
    for reader in readers:
        reader.join(JOIN_SECONDS)
    files, files_truncated = _outputs(output, request["files_cap"], request["max_files"])
    answer = {"exit_code": code, "timed_out": timed_out, "files": files, "files_truncated": files_truncated}
    for name, sink in sinks.items():
        answer[name] = sink.get("data", b"").decode("utf-8", "replace")
        answer[f"{name}_truncated"] = bool(sink.get("truncated"))
    # Under the rlimit fallback an allocation fails instead of a kernel kill: the snippet's runtime says so.
    stderr_tail = sinks["stderr"].get("data", b"")[-STDERR_TAIL:].decode("utf-8", "replace")
    answer["out_of_memory"] = not timed_out and ran_out_of_memory(code, stderr_tail)
    return answer


def main() -> int:
    channel = sys.stdout.buffer
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/work")
    channel.write(b"ready\n")
    channel.flush()
    line = sys.stdin.buffer.readline()
    if not line:
        return 0  # discarded before it ran anything
    answer = run_request(work, json.loads(line))
    channel.write(json.dumps(answer).encode() + b"\n")
    channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
