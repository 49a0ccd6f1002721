"""The engine suite runs on both storage backends."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _on_each_backend(store_backend: str) -> str:
    """Every test of this suite runs on LMDB and on PostgreSQL."""
    return store_backend
