"""Fixtures for provider tests: fault servers on loopback (stopped after each test), an event list."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/faultserver.py

from faultserver import FaultServer

from keel.server.providers import ProviderEvent


@pytest.fixture
def fault_factory() -> Iterator[Callable[..., FaultServer]]:
    servers: list[FaultServer] = []

    def make(**kwargs: object) -> FaultServer:
        server = FaultServer(**kwargs).start()  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def fault(fault_factory: Callable[..., FaultServer]) -> FaultServer:
    return fault_factory()


@pytest.fixture
def events() -> list[ProviderEvent]:
    return []
