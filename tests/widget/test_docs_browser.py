"""`/docs` renders the served `/openapi.json` in a real browser with no internet (issue 19): every asset
comes from the platform itself; a request to any other host fails the test."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
import uvicorn

from caiplatform_server.app import create_app
from caiplatform_server.serving import uvicorn_config

from .browser_support import chromium


@pytest.fixture(scope="module")
def docs_server() -> Iterator[str]:
    from caiplatform.platform import Platform

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(create_app(Platform.in_memory()), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        threading.Event().wait(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def test_the_docs_page_renders_every_tag_from_local_assets_only(docs_server):
    elsewhere: list[str] = []
    with chromium() as browser:
        page = browser.new_page()

        def only_loopback(route):  # type: ignore[no-untyped-def]
            if urlparse(route.request.url).hostname != "127.0.0.1":
                elsewhere.append(route.request.url)
                route.abort()
            else:
                route.continue_()

        page.route("**/*", only_loopback)
        page.goto(f"{docs_server}/docs")
        page.wait_for_selector(".opblock-tag", timeout=30_000)
        tags = {text.strip() for text in page.locator(".opblock-tag").all_inner_texts()}
        assert {"vectordb", "health"} <= {t.split("\n")[0] for t in tags}, tags
        page.wait_for_selector("text=Create a vector index", timeout=10_000)
        assert not page.locator(".errors-wrapper").count(), page.locator(".errors-wrapper").all_inner_texts()
    assert elsewhere == []
