"""Shared fixtures: real engines (fail loudly when one is missing) and a fresh platform per test."""

from __future__ import annotations

import gc
import inspect
import socket
import subprocess
from collections.abc import Iterator

# croniter is imported before any test runs: its import runs `file -b` on the interpreter (a child process
# that --forbid-processes would refuse in whichever unit test imported it first, when run on its own).
import croniter  # noqa: F401
import pytest

from caiplatform.testing import engines, selection
from tests import worker_groups


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--forbid-processes",
        action="store_true",
        help="fail a test marked `unit` that starts a child process (nox -s unit sets it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    worker_groups.name_the_file(config)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup` with the groups of `tests/worker_groups.py` (xdist's own lose them on pytest 9)."""
    return worker_groups.GroupScheduling(config, log) if worker_groups.grouping(config) else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    """No cyclic garbage collection while collecting: what the imports and the items make lives for the
    whole run, and every full collection would walk it again (see `pytest_collection_finish`). Not in
    xdist's controller, which collects nothing (its workers do)."""
    if not session.config.pluginmanager.has_plugin("dsession"):
        gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (modules, classes, the OpenAPI document, the items) moves to the collector's
    permanent generation, and a full collection waits for ten times as many younger ones as by default:
    tests import modules lazily, so the heap keeps growing, and each worker spent about 4 s of CPU in some
    14 full collections over all of it. Garbage cycles are still collected (docs/testing.md)."""
    gc.freeze()
    gc.set_threshold(7000, 10, 100)
    gc.enable()


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
    """Under `-m unit`, a test module none of whose tests can be `unit` is not imported at all (about a
    quarter of the collection's CPU, in every xdist worker); its tests are then not counted as deselected."""
    if (config.getoption("markexpr") or "").strip() != "unit" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    try:
        source = collection_path.read_text(encoding="utf-8")
    except OSError:
        return None
    return True if selection.never_unit(source) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its kind and deselect those that need what this machine lacks (see
    caiplatform.testing.selection and docs/testing.md), and, for the full suite's second run, tell the
    controller which tests share a worker (`tests/worker_groups.py`)."""
    kept: list[pytest.Item] = []
    lacking: dict[str, list[pytest.Item]] = {}
    groups: dict[str, str] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = dict(callspec.params) if callspec is not None else {}
        marks = [mark.name for mark in item.iter_markers()]
        function = getattr(item, "function", None)
        modules = (getattr(item, "module", None), inspect.getmodule(function) if function else None)
        kind = selection.kind_of(getattr(item, "fixturenames", ()), params, modules, marks)
        if kind not in marks:
            item.add_marker(kind)
        groups[item.nodeid] = worker_groups.group_of(item, kind)
        needs_marks = list(item.iter_markers("needs"))
        explicit = [arg for mark in needs_marks for arg in mark.args] if needs_marks else None
        missing = selection.missing_needs(selection.needs_of(params, function, explicit))
        for need in missing:
            lacking.setdefault(need, []).append(item)
        if not missing:
            kept.append(item)
    if lacking:
        kept_ids = {id(item) for item in kept}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept_ids])
        items[:] = kept
    config.stash[_LACKING] = {what: len(group) for what, group in lacking.items()}
    worker_groups.write(config, groups)


_LACKING = pytest.StashKey[dict[str, int]]()


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    for what, count in config.stash.get(_LACKING, {}).items():
        terminalreporter.write_line(
            f"DESELECTED {count} tests that need {what}, missing here (to run them: {selection.HOW_TO_GET[what]})"
        )


@pytest.fixture(autouse=True)
def _unit_stays_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under --forbid-processes a `unit` test that starts a child process or reaches beyond loopback
    fails, naming the fix (the classification at collection is then wrong for it). In-process servers
    on loopback (the in-memory memory store's RESP server) are part of unit tests."""
    if not request.config.getoption("--forbid-processes") or request.node.get_closest_marker("unit") is None:
        return

    def refused(what: object) -> AssertionError:
        return AssertionError(
            f"a test classified `unit` {what}; mark it @pytest.mark.process (or engine) or request a "
            "fixture that classifies it: see docs/testing.md"
        )

    def no_child(self, args, *rest, **kwargs):
        raise refused(f"started a child process {args!r}")

    def loopback_only(real):
        def guarded(self, address, *args, **kwargs):
            if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address):
                raise refused(f"reached for the network ({address!r})")
            return real(self, address, *args, **kwargs)

        return guarded

    monkeypatch.setattr(subprocess.Popen, "_execute_child", no_child)
    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, loopback_only(getattr(socket.socket, name)))


def _loopback(address: object) -> bool:
    host = address[0] if isinstance(address, tuple) else address
    return isinstance(host, str) and (host.startswith("127.") or host in ("::1", "localhost"))


@pytest.fixture(scope="session", autouse=True)
def _cheap_password_hashing() -> Iterator[None]:
    """argon2id at its minimal cost for every test in this process: the same algorithm, encoding and
    checks (a wrong password still fails), without ~0.3 s of CPU per hash and per sign-in. Servers that
    tests start as processes keep the production cost."""
    from argon2 import PasswordHasher

    from caiplatform import security

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(security, "_hasher", PasswordHasher(time_cost=1, memory_cost=64, parallelism=1))
        security.dummy_password_hash.cache_clear()  # made again, at this cost, on first use
        yield
        security.dummy_password_hash.cache_clear()


@pytest.fixture(scope="session", autouse=True)
def _shared_route_handlers() -> Iterator[None]:
    """The apps of this process share FastAPI's per-route handlers instead of building them per app on
    their first request (~0.1 s of CPU per test: see `caiplatform.testing.http.shared_route_handlers`)."""
    from caiplatform.testing.http import shared_route_handlers

    with shared_route_handlers():
        yield


def _engine(engine: str) -> str:
    try:
        return engines.engine_url(engine)
    except engines.EngineUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session (the machine's server or a portable one)."""
    with engines.fresh_postgres_database(_engine("postgres")) as url:
        yield url


@pytest.fixture
def fresh_postgres_url(postgres_url: str) -> Iterator[str]:
    """A database of its own for one test, on the session's PostgreSQL (requested by a test whose
    parameter names `postgres`, which makes it an `engine` test)."""
    with engines.fresh_postgres_database() as url:
        yield url


@pytest.fixture
def own_openbao() -> Iterator[engines.OpenBaoDev]:
    """A `bao server -dev` of one test's own, which it may seal or stop without disturbing any other."""
    try:
        server = engines.start_openbao_dev()
    except engines.EngineUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _engine("redis")


@pytest.fixture(scope="session")
def nats_url() -> str:
    return _engine("nats")


@pytest.fixture(scope="session")
def openbao() -> Iterator[engines.OpenBaoDev]:
    try:
        server = engines.start_openbao_dev()
    except engines.EngineUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def clock():
    from caiplatform.clock import ManualClock

    return ManualClock()


@pytest.fixture
def settings():
    from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
    from tests.settings_support import settings_for

    return settings_for(
        CAI_ADMIN_EMAIL=ADMIN_EMAIL,
        CAI_ADMIN_PASSWORD=ADMIN_PASSWORD,
        CAI_AUTOMATION_TOKEN="automation-token-for-tests",
        CAI_INTERNAL_TOKEN="internal-token-for-tests",
        RATELIMIT_RPS=10_000,
        RATELIMIT_BURST=10_000,
    )


@pytest.fixture
async def platform(settings, clock):
    """An in-memory platform with the bootstrap admin, on a manual clock."""
    from caiplatform.platform import Platform

    p = Platform.in_memory(settings, clock=clock)
    await p.start()
    yield p
    await p.aclose()


@pytest.fixture
async def client(platform):
    from caiplatform.testing.http import asgi_client

    async with asgi_client(platform) as c:
        yield c


@pytest.fixture
async def admin_headers(client):
    from caiplatform.testing.http import login

    return await login(client)


@pytest.fixture(scope="module")
def world():
    """A platform full of objects served in process, on its own loop (tests/world_support.py)."""
    import anyio.from_thread

    from tests.world_support import World

    with anyio.from_thread.start_blocking_portal() as portal:
        created = portal.call(World.create)
        yield portal, created
        portal.call(created.aclose)
