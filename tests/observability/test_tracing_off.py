"""Tracing off costs no SDK: a server that answers requests without OTEL_* has none of the platform's
modules import `opentelemetry.sdk` (FastAPI imports the API, redis-py the SDK where it is installed: those
are theirs)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.process

SCRIPT = textwrap.dedent("""
    import asyncio, sys

    imported_by_us = []

    class Watch:
        def find_spec(self, name, path=None, target=None):
            if name.startswith("opentelemetry.sdk"):
                frame = sys._getframe(1)
                # the nearest importer that is neither the import machinery nor OpenTelemetry itself
                while frame is not None and ("importlib" in frame.f_code.co_filename
                                             or "/opentelemetry/" in frame.f_code.co_filename):
                    frame = frame.f_back
                where = frame.f_code.co_filename if frame is not None else ""
                if "/caiplatform/" in where or "/caiplatform_server/" in where:
                    imported_by_us.append((name, where))
            return None

    sys.meta_path.insert(0, Watch())
    from caiplatform.platform import Platform
    from caiplatform.testing.http import asgi_client
    import caiplatform.harness.app, caiplatform.harness.__main__

    async def main():
        platform = Platform.in_memory()
        await platform.start()
        async with asgi_client(platform) as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/v1/agents/nobody")).status_code in (401, 404)
        await platform.aclose()

    asyncio.run(main())
    assert not imported_by_us, imported_by_us
    print("no sdk")
""")


def test_no_sdk_is_imported_when_tracing_is_off():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "no sdk" in done.stdout, done.stderr[-3000:]
