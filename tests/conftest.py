"""Fixtures every suite may use: the test run's PostgreSQL server, and stores on either backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.pgserver import PgServer

BACKENDS = ("lmdb", "postgresql")
STORE_FOLDERS = ("store", ".keel/store")  # where the engine, subagent and bundle tests keep their stores


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
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
    """A whole suite on both backends (its conftest makes this autouse): for PostgreSQL, the store folders
    the suite's tests use are made to name a fresh schema on the run's server before the test starts
    (`store_folder` makes any other). A test marked `lmdb_only("why")` runs on LMDB alone."""
    if backend == "postgresql":
        marker = request.node.get_closest_marker("lmdb_only")
        if marker is not None:
            pytest.skip(f"LMDB only: {marker.args[0]}")
        for folder in STORE_FOLDERS:
            store_folder(tmp_path / folder)
    return backend
