"""Helpers for engine tests that make real model calls: provider config files, fault servers, journal reads."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import read, toml_value

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/faultserver.py

from faultserver import FaultServer, delay, error, ok

from keel.protocol.records import Evidence, JournalEntry, RestorePoint
from keel.storage import missions as m

__all__ = ["FaultServer", "delay", "error", "ok"]  # re-exported: tests import the fault server from here

KEY = "sk-wire-Hq3vLmP8tRz5Kd2W"  # a made-up key, only ever sent to 127.0.0.1
KEY_VAR = "KEEL_WIRE_PROVIDER_PASS"  # not caught by the agent env's name filter: hidden by api_key_env alone
NO_KEYRING = {"PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}
FAST = {
    "connect_timeout_s": 0.5,
    "read_timeout_s": 5.0,
    "base_delay_s": 0.01,
    "max_delay_s": 0.05,
    "max_attempts": 2,
    "failures_to_cool_down": 10,
    "cooldown_s": 0.2,
    "down_cooldown_s": 30.0,
    "probe_base_delay_s": 0.05,
    "probe_max_delay_s": 0.2,
}


def write_config(workspace: Path, providers: list[dict[str, Any]], network: dict[str, Any] | None = None) -> Path:
    """`.keel/config.toml` in the workspace: [network] plus one [[providers]] table per dict."""
    lines = ["[network]"] + [f"{k} = {toml_value(v)}" for k, v in (network or FAST).items()]
    for p in providers:
        lines += ["", "[[providers]]"] + [f"{k} = {toml_value(v)}" for k, v in p.items()]
    path = workspace / ".keel" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def provider(name: str, server: FaultServer | str, **extra: Any) -> dict[str, Any]:
    url = server if isinstance(server, str) else server.url
    return {
        "name": name,
        "kind": "openai-compatible",
        "model": f"{name}-model",
        "capabilities": {"tools": True, "context_window": 32000},
        "endpoints": [{"url": url}],
        **extra,
    }


@pytest.fixture(name="faults")
def fault_servers() -> Iterator[Callable[..., FaultServer]]:
    servers: list[FaultServer] = []

    def make(**kwargs: Any) -> FaultServer:
        server = FaultServer(**kwargs).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def journal(store: Path, mission_id: str, unit: str) -> list[JournalEntry]:
    return read(store, lambda t: m.journal_entries(t, mission_id, unit))  # type: ignore[no-any-return]


def evidence(store: Path, mission_id: str) -> list[Evidence]:
    return [e for _, e in read(store, lambda t: list(m.evidence_after(t, mission_id)))]


def points(store: Path, mission_id: str) -> list[RestorePoint]:
    return read(store, lambda t: m.restore_points(t, mission_id))  # type: ignore[no-any-return]


def config_blob(store: Path, point: RestorePoint) -> dict[str, Any]:
    def load(t: Any) -> dict[str, Any]:
        return t.get_object(m.get_checkpoint(t, point.checkpoint).config, dict)  # type: ignore[no-any-return]

    return read(store, load)  # type: ignore[no-any-return]


def files_containing(root: Path, secret: str) -> list[str]:
    """Every file under root whose bytes contain the secret (store, logs, sandboxes: everything)."""
    needle = secret.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def agent_pids(sandbox_hint: str) -> list[int]:
    """Running agent processes (python -m keel.agents.*) whose working directory is under sandbox_hint."""
    pids = []
    for entry in os.listdir("/proc"):
        if not re.fullmatch(r"\d+", entry):
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if b"keel.agents." in cmdline and cwd.startswith(sandbox_hint):
            pids.append(int(entry))
    return pids
