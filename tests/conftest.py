"""Fixtures every suite may use: the test run's PostgreSQL server, and stores on either backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.pgserver import PgServer

BACKENDS = ("lmdb", "postgresql")


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
