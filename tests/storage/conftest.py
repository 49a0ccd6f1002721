"""Fixtures for storage tests: real stores in tmp_path, one per backend (LMDB, PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keel.storage import Store


@pytest.fixture
def store(tmp_path: Path, store_folder: Callable[[Path], Path]) -> Iterator[Store]:
    with Store.open(store_folder(tmp_path / "store")) as s:
        yield s
