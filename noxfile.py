"""Project automation: `nox -s tests` is the one command that CI (.ci/run) and the README use."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
# uv makes and fills the sessions' environments when it is installed (`pip install nox uv`, as the README
# and .ci/run do): about 20 s instead of two minutes for pip on a clean clone.
nox.options.default_venv_backend = "uv|virtualenv"
ROOT = Path(__file__).parent
# Tests write bytecode even where the machine's environment forbids it (PYTHONDONTWRITEBYTECODE=1 on some CI
# images): without it pytest rewrites and Python compiles some 560 modules again in every worker of every run,
# about 8 s of a unit run. Workloads set their own (an image directory never changes).
BYTECODE: dict[str, str | None] = {"PYTHONDONTWRITEBYTECODE": None}


def start_engines(session: nox.Session) -> None:
    """Start the machine's PostgreSQL, Redis and NATS when it has them and they are not answering (else
    the test session starts portable ones from pip packages), and install the toolchains of functions in
    other languages and the Chromium of the widget tests when they are missing (idempotent)."""
    for engine in ("postgres", "redis", "nats"):
        script = ROOT / "backends" / engine / "start.sh"
        if script.exists():
            session.run("bash", str(script), external=True)
    session.run("bash", str(ROOT / "backends" / "toolchains" / "install.sh"), external=True)
    session.run("bash", str(ROOT / "backends" / "toolchains" / "sandbox.sh"), "--tests", external=True)


@contextlib.contextmanager
def memory_basetemp() -> Iterator[list[str]]:
    """`--basetemp` on a memory file system when the machine has one, for the unit tests: their
    temporary directories (vector collections, SQLite files, sources) are written and synced to disk
    otherwise, which made the Qdrant Edge conformance tests wait on I/O for about twice their CPU time.
    A directory of this run's own, removed afterwards (pytest empties a `--basetemp` it is given)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield []
        return
    path = tempfile.mkdtemp(prefix="caiplatform-unit-", dir=shm)
    try:
        yield ["--basetemp", path]
    finally:
        shutil.rmtree(path, ignore_errors=True)


@nox.session
def tests(session: nox.Session) -> None:
    """Every test. Without arguments in two runs: the unit tests on two workers (they share nothing, as
    `nox -s unit` proves on every save); then the rest on four workers, because those tests mostly wait
    (for servers to start, builds, engines) and four overlap their waits on two cores: the tests on the
    machine's shared engines all on one worker, one at a time, and the tests that start processes and
    servers of their own (data dirs, ports and engines of their own) a module per worker
    (`--dist loadgroup` with the groups `tests/conftest.py` gives)."""
    session.install("-e", ".[all,agents,dev]")
    start_engines(session)
    env = {**dict(os.environ), "PYTHONUNBUFFERED": "1", **BYTECODE}
    if session.posargs:
        session.run("python", "-m", "pytest", *session.posargs, env=env)
        return
    with memory_basetemp() as basetemp:
        session.run("python", "-m", "pytest", "-m", "unit", "--forbid-processes", "-n", "2", *basetemp, env=env)
    session.run("python", "-m", "pytest", "-m", "not unit", "-n", "4", "--dist", "loadgroup", "--durations", "15", env=env)


@nox.session
def unit(session: nox.Session) -> None:
    """The one-minute loop: every test that needs no engine, no child process and no network, on two
    workers; a `unit` test that starts a process or opens a socket fails (see docs/testing.md)."""
    session.install("-e", ".[all,agents,dev]")
    # One generated case per operation for the contract test here and no coverage phase, three fuzzed bodies
    # per route (the full suite runs four cases, every boundary case the document defines, and ten bodies).
    with memory_basetemp() as basetemp:
        session.run("python", "-m", "pytest", "-m", "unit", "--forbid-processes", "-n", "2", "-q", *basetemp,
                    *session.posargs, env={"CAI_CONTRACT_EXAMPLES": "1", "CAI_CONTRACT_PHASES": "examples,fuzzing",
                                           "CAI_FUZZ_EXAMPLES": "3", **BYTECODE})


@nox.session
def portable_engines(session: nox.Session) -> None:
    """The `engine` tests against engines started from pip packages only (no machine server, no root):
    what `nox -s tests` does on a machine without PostgreSQL, Redis or NATS."""
    session.install("-e", ".[all,agents,dev]")
    session.run("python", "-m", "pytest", "-m", "engine", *session.posargs, env={"CAI_TEST_ENGINES": "portable"})


@nox.session
def cassettes(session: nox.Session) -> None:
    """Re-record the client's cassettes from a live `caiplatform serve` (tests/client/cassettes/)."""
    session.install("-e", ".[all,agents,dev]")
    session.run("python", "-m", "pytest", "tests/client/test_cassettes.py", "-k", "live", *session.posargs,
                env={"CAI_RECORD_CASSETTES": "1"})


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "src", "tests")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[all,dev]")
    session.run("mypy", "src")


@nox.session(name="bench")
def bench(session: nox.Session) -> None:
    """The hot paths against their baselines, measured in the same run; writes the table of
    docs/performance.md. `nox -s bench -- --quick` stays under about two minutes."""
    session.install("-e", ".[all,agents,dev]")
    start_engines(session)
    session.run("python", str(ROOT / "benchmarks" / "run.py"), *session.posargs)


@nox.session
def benchmarks(session: nox.Session) -> None:
    """Every benchmark of benchmarks/, the table's and the others (deploy, serverless, memory stores)."""
    session.install("-e", ".[all,agents,dev]")
    start_engines(session)
    session.run("python", str(ROOT / "benchmarks" / "run.py"), *session.posargs)
    for name in ("agents", "memorystore", "serverless"):
        session.run("python", str(ROOT / "benchmarks" / f"{name}_bench.py"))
