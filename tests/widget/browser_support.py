"""What the widget's browser tests need besides the platform: Debian's Chromium driven by Playwright
(nothing downloaded: the system browser, see `backends/toolchains/install.sh`), and host pages served
from their own loopback origin with the one-tag snippet a site owner pastes."""

from __future__ import annotations

import html
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

CHROMIUM_FLAGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OUTPUT_DIR = Path(__file__).resolve().parents[2] / "test-output" / "widget"


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Chromium is missing: run `bash backends/toolchains/install.sh` (installs Debian's "
                    "`chromium` package)", pytrace=False)
    return path


@contextmanager
def chromium() -> Iterator[object]:
    """One headless Chromium for a test module (a context per test keeps each tab's storage apart)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


THEMES = {
    "light": ("#ffffff", "#1f2937"),
    "dark": ("#0b1120", "#e5e7eb"),
}


def host_page(script_url: str, key: str, theme: str) -> str:
    """A site owner's page: some content, aggressive styles of its own that must not reach the widget,
    and the snippet."""
    background, text = THEMES[theme]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Acme parcels</title>
<style>
  body {{ margin: 0; padding: 48px 64px; background: {background}; color: {text};
         font: 18px/1.6 Georgia, serif; }}
  * {{ font-family: Georgia, serif !important; letter-spacing: 0.08em; }}
  button, input, div {{ background: hotpink !important; border: 4px dashed lime !important; }}
  h1 {{ font-size: 40px; margin: 0 0 16px; }}
</style></head>
<body>
  <h1>Acme parcels</h1>
  <p>Track a parcel, change a delivery day or ask us anything: our assistant answers right away.</p>
  <p><a href="#track" style="color: inherit">Track a parcel</a></p>
  <script src="{html.escape(script_url)}" data-embed-key="{html.escape(key)}" async></script>
</body></html>
"""


class _PageHandler(BaseHTTPRequestHandler):
    script_url = ""

    def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
        query = parse_qs(urlparse(self.path).query)
        page = host_page(self.script_url, query.get("key", [""])[0], query.get("theme", ["light"])[0])
        body = page.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def page_origin(script_url: str) -> Iterator[str]:
    """A static site on its own loopback origin; `<origin>/?key=<embed key>&theme=dark` is a page."""
    handler = type("PageHandler", (_PageHandler,), {"script_url": script_url})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
