"""The subagent tests share the engine tests' helpers (mission files, the CLI as a subprocess)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))


@pytest.fixture(autouse=True)
def _on_each_backend(store_backend: str) -> str:
    """Every test of this suite runs on LMDB and on PostgreSQL."""
    return store_backend
