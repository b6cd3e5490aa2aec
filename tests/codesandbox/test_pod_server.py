"""What a code sandbox pod runs on a cluster (`codesandbox/pod_server.py`), as a real process on loopback:
ready until its one snippet, which it runs and answers, then it exits (the pod is never reused)."""

from __future__ import annotations

import base64
import subprocess
import sys
import time

import httpx

from caiplatform.codesandbox import CODE
from caiplatform.supervisor import free_port


def test_the_pod_server_runs_one_snippet_then_exits(tmp_path):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "caiplatform.codesandbox.pod_server", str(port), str(tmp_path / "work")])
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(f"{base}/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        request = {"argv": [sys.executable, ".cai/snippet.py"], "timeout_s": 5, "stdout_cap": CODE.stdout_cap,
                   "stderr_cap": CODE.stderr_cap, "files_cap": CODE.files_cap, "max_files": CODE.max_files,
                   "files": [{"path": ".cai/snippet.py", "content_base64": base64.b64encode(
                       b"import os\nprint(open('in.txt').read())\nopen(os.environ['OUTPUT_DIR'] + '/o', 'w').write('z')").decode()},
                             {"path": "in.txt", "content_base64": base64.b64encode(b"hello").decode()}]}
        answer = httpx.post(f"{base}/run", json=request, timeout=30)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["exit_code"], body["stdout"], body["timed_out"]) == (0, "hello\n", False)
        assert body["files"] == [{"path": "o", "size": 1, "content_base64": "eg=="}]
        assert process.wait(timeout=10) == 0  # one snippet, then the pod's process ends
    finally:
        process.kill()
