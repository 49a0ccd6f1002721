"""Fixtures every suite may use: the test run's PostgreSQL server, and stores on either backend; and the
suite's tiers and its groups for parallel runs.

Tiers: the fast tier (`pytest -m "not slow"`) is the in-process tests of records, storage, tools and
providers, the layering, git-runner and payload-declaration checks, and every decision table (a module named
`test_<decision>_table.py`, wherever it lives); every other test starts hosts, agents, servers or editors
and is marked `slow` here (a test of a fast module may also be marked `slow` by hand).

Parallel runs (`pytest -n auto --dist loadgroup`, pytest-xdist): each worker is a session of its own, with
its own tmp_path root, its own PostgreSQL cluster on a free port (`pg_server`) and free ports for every
server; tests that share something outside those run on one worker (an `xdist_group`): the VS Code tests
in two groups (at most two code-servers with Chromium at once; the extension is packaged into the checkout
once per run, tests/vscode/conftest.py), the two-machine tests (each strikes on a lease's timing:
two side by side would only slow each other's takeovers) and the modules whose module-scoped fixtures are
costly (computed once, not once per worker). The groups are named before xdist reads them (tryfirst)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.pgserver import PgServer, pg_missing

TESTS = Path(__file__).resolve().parent

# keel's processes run at normal priority in the tests (server/background.py lowers them by default). A CI
# machine's two cores are kept busy by the run itself: four workers, PostgreSQL, code-server and Chromium, all
# at normal priority. Background keel processes there got a tenth of their share or less, and tests waiting on
# them ran out of time. The tests that check the priority set KEEL_NICE themselves (tests/engine/test_background.py).
os.environ.setdefault("KEEL_NICE", "0")
FAST_FOLDERS = {"protocol", "storage", "tools", "providers"}
FAST_MODULES = {"test_layering.py", "test_gitrun.py", "test_payload_declarations.py", "test_tiers.py"}
GROUPS = {  # a module's entry before its folder's
    "vscode": "vscode-a",  # the VS Code tests on two workers: each group ~3 minutes of code-server and Chromium
    "vscode/test_ui_items.py": "vscode-a",
    "vscode/test_ui.py": "vscode-a",
    "vscode/test_told_ui.py": "vscode-b",
    "vscode/test_mission_page.py": "vscode-b",
    "vscode/test_activity_ui.py": "vscode-b",
    "vscode/test_extension_host.py": "vscode-b",
    "postgres/test_machines.py": "machines",
    "postgres/test_worker_machines.py": "machines",
    "postgres/test_store_outage.py": "machines",
    "engine/test_disk_full.py": "engine/test_disk_full.py",  # module fixture: an undisturbed reference run
    "cli/test_store_damage.py": "cli/test_store_damage.py",  # module fixture: a store with a mission
    "cli/test_lmdb_damage.py": "cli/test_lmdb_damage.py",
    "cli/test_page_damage.py": "cli/test_page_damage.py",
}

LONG_GROUPS = ("vscode-a", "vscode-b", "machines")  # started first (pytest_collection_modifyitems)

BACKENDS = ("lmdb", "postgresql")
STORE_FOLDERS = ("store", ".keel/store")  # where the engine, subagent and bundle tests keep their stores


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The run's PostgreSQL cluster, started by the first test that needs it. Where PostgreSQL is not
    installed, each test that needs it is skipped with the reason, as tests of other missing tools are."""
    missing = pg_missing()
    if missing:
        pytest.skip(missing)
    server = PgServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each test that asks for it runs once per storage backend."""
    return str(request.param)


@pytest.fixture
def store_folder(backend: str, request: pytest.FixtureRequest) -> Callable[[Path], Path]:
    """Makes a folder name a new store of this test's backend: LMDB is made on first open; a
    PostgreSQL folder gets a URL naming a fresh schema on the run's server."""

    def make(folder: Path) -> Path:
        if backend == "postgresql":
            server: PgServer = request.getfixturevalue("pg_server")
            return server.store_folder(folder)
        return folder

    return make


@pytest.fixture
def store_backend(
    backend: str, store_folder: Callable[[Path], Path], request: pytest.FixtureRequest, tmp_path: Path
) -> str:
    """A test that touches a store runs on both backends by asking for this (a module whose tests all do:
    `pytestmark = pytest.mark.usefixtures("store_backend")`); a test that touches none, a decision table
    above all, does not ask, and runs once. For PostgreSQL, the store folders the tests use are made to
    name a fresh schema on the run's server before the test starts (`store_folder` makes any other). A test
    marked `lmdb_only("why")` runs on LMDB alone."""
    if backend == "postgresql":
        marker = request.node.get_closest_marker("lmdb_only")
        if marker is not None:
            pytest.skip(f"LMDB only: {marker.args[0]}")
        for folder in STORE_FOLDERS:
            store_folder(tmp_path / folder)
    return backend


def fast(relative: Path) -> bool:
    """Whether the test module at `relative` (to tests/) belongs to the fast tier."""
    return relative.parts[0] in FAST_FOLDERS or relative.name in FAST_MODULES or relative.name.endswith("_table.py")


@pytest.hookimpl(tryfirst=True)  # before xdist names each item's group in its node id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test's tier and group, and puts the groups that run longest on one worker first (the
    VS Code tests' two, then the two-machine tests: minutes each), so the other workers share out the rest
    beside them instead of one worker running them alone at the end."""
    first = {group: n for n, group in enumerate(LONG_GROUPS)}

    def order(item: pytest.Item) -> int:
        marker = item.get_closest_marker("xdist_group")
        return first.get(str(marker.args[0]) if marker else "", len(first))

    for item in items:
        relative = item.path.resolve().relative_to(TESTS)
        if not fast(relative):
            item.add_marker(pytest.mark.slow)
        group = GROUPS.get(relative.as_posix()) or GROUPS.get(relative.parts[0])
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=order)  # stable: within a group, and for the rest, the order they were collected in
