"""What a code sandbox pod runs on a cluster (standard library and `runner.py` only): one snippet, over HTTP.

`python -m caiplatform.codesandbox.pod_server <port> <work dir>` serves `GET /ready` (the pod's readiness
probe) and `POST /run` with the runner's request (`runner.py`); it runs that one snippet, answers the
runner's JSON and exits, so the pod is never reused (the platform deletes it). A second `/run` is 409.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from caiplatform.codesandbox.runner import run_request

MAX_REQUEST = 16 * 1024 * 1024  # the platform's 8 MiB body, base64 and JSON-escaped


class OneSnippet:
    """The state of one pod: whether its snippet has been taken."""

    def __init__(self, work: Path):
        self.work = work
        self.lock = threading.Lock()
        self.taken = False
        self.done = threading.Event()

    def take(self) -> bool:
        with self.lock:
            if self.taken:
                return False
            self.taken = True
            return True


def handler(state: OneSnippet) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path != "/ready":
                self._answer(404, {"error": "not found"})
            elif state.taken:
                self._answer(503, {"error": "used"})
            else:
                self._answer(200, {"status": "ready"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            if self.path != "/run":
                self._answer(404, {"error": "not found"})
                return
            if length <= 0 or length > MAX_REQUEST:
                self._answer(413, {"error": "request too large"})
                return
            if not state.take():
                self._answer(409, {"error": "this sandbox already ran its snippet"})
                return
            try:
                answer = run_request(state.work, json.loads(self.rfile.read(length)))
                self._answer(200, answer)
            finally:
                state.done.set()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet: no request log
            return

    return Handler


def serve(port: int, work: Path) -> int:
    state = OneSnippet(work)
    server = ThreadingHTTPServer(("0.0.0.0", port), handler(state))  # noqa: S104 - the pod's own address
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.done.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]) if len(sys.argv) > 1 else 8080, Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/work")))
