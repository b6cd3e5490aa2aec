"""Which tests share an xdist worker in the full suite's second run (`--dist loadgroup`).

pytest-xdist's own `loadgroup` reads `xdist_group` marks by appending the group to the node id in each
worker; pytest 9 keeps node ids elsewhere, so that suffix is lost and every test is scheduled alone
(seen with xdist 3.8 and pytest 9.2: `tests/cluster` ran on four workers, each starting its own cluster,
and `engine` tests ran side by side). So the groups travel another way: each worker writes the group of
every test it collected to a file the controller names (`CAI_TEST_GROUPS_FILE`, set before the workers
start), and the controller's scheduler reads it once every worker has collected, before it hands out work.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPS_FILE = "CAI_TEST_GROUPS_FILE"


def group_of(item: pytest.Item, kind: str) -> str:
    """The group of a test: none for `unit`, one for every `engine` test (they share the machine's
    engines, one at a time), else its module (its module-scoped servers start once), or its package when
    it uses a package-scoped fixture (`tests/cluster` shares one cluster, its modules in order)."""
    if kind in ("unit", "engine"):
        return "" if kind == "unit" else "engine"
    path = item.nodeid.split("::", 1)[0]
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    if any(d.scope == "package" for defs in definitions for d in defs):
        return path.rsplit("/", 1)[0]
    return path


def grouping(config: pytest.Config) -> bool:
    return config.getoption("dist", "no") == "loadgroup"


def name_the_file(config: pytest.Config) -> None:
    """In the controller, before the workers start: where they write the groups (they inherit it)."""
    if grouping(config) and not hasattr(config, "workerinput"):
        handle, path = tempfile.mkstemp(prefix="cai-test-groups-", suffix=".json")
        os.close(handle)
        os.environ[GROUPS_FILE] = path
        config.add_cleanup(lambda: Path(path).unlink(missing_ok=True))


def write(config: pytest.Config, groups: dict[str, str]) -> None:
    """In a worker: every collected test's group (all workers collect the same tests; the last write wins)."""
    path = os.environ.get(GROUPS_FILE)
    if path and hasattr(config, "workerinput"):
        staging = f"{path}.{config.workerinput['workerid']}"
        Path(staging).write_text(json.dumps(groups))
        os.replace(staging, path)


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with the groups the workers wrote: a test with a group goes with its
    group, one without one goes alone (biggest groups first, as xdist orders scopes)."""

    _groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            path = os.environ.get(GROUPS_FILE)
            self._groups = json.loads(Path(path).read_text() or "{}") if path else {}
        return self._groups.get(nodeid) or nodeid
