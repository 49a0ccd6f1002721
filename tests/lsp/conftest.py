"""A real `keel serve` subprocess driven by pytest-lsp, a fresh store per test, and mission-file helpers.

Missions run for real: detached `keel` hosts with the scripted agent. Every test's hosts are killed at the
end (they are detached on purpose, so the server's exit does not stop them).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from tests.hosts import kill_hosts

SERVER = [sys.executable, "-m", "keel.server.cli", "serve"]


def mission_toml(name: str, units: list[dict[str, Any]]) -> str:
    """A mission file for the scripted agent; each unit is {"id", "steps", optional "after"}."""
    lines = [
        "[mission]",
        f"name = {json.dumps(name)}",
        f"agent = {json.dumps(sys.executable + ' -m keel.agents.scripted')}",
        "",
    ]
    for unit in units:
        lines += ["[[units]]", f"id = {json.dumps(unit['id'])}", f"title = {json.dumps(unit.get('title', ''))}"]
        if unit.get("after"):
            lines.append(f"after = {json.dumps(unit['after'])}")
        lines += [f"params = {{ steps = {_toml(unit.get('steps', []))} }}", ""]
    return "\n".join(lines)


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


class Env:
    """One test's workspace and store, and what the server pushed."""

    def __init__(self, root: Path, client: LanguageClient) -> None:
        self.root = root
        self.store = root / ".keel" / "store"
        self.client = client
        self.changes: list[dict[str, Any]] = []
        self.questions: list[types.ShowMessageRequestParams] = []
        self.answer: Callable[[types.ShowMessageRequestParams], types.MessageActionItem | None] = lambda p: None

    def write_mission(self, name: str, units: list[dict[str, Any]]) -> str:
        path = self.root / f"{name}.toml"
        path.write_text(mission_toml(name, units))
        return str(path)

    async def command(self, name: str, *args: Any) -> Any:
        return _plain(
            await self.client.workspace_execute_command_async(
                types.ExecuteCommandParams(command=name, arguments=list(args))
            )
        )

    async def request(self, method: str, params: Any = None) -> Any:
        return _plain(await self.client.protocol.send_request_async(method, params))

    async def wait_for(self, pred: Callable[[dict[str, Any]], bool], within: float = 120.0) -> dict[str, Any]:
        """The first keel/missionChanged payload (seen so far or arriving) that satisfies `pred`; the deadline
        is generous (a loaded machine, hosts started as subprocesses): a passing test never waits for it."""
        deadline = time.monotonic() + within
        seen = 0
        while True:
            for change in self.changes[seen:]:
                if pred(change):
                    return change
            seen = len(self.changes)
            if time.monotonic() > deadline:
                last = {c["id"]: c["state"] for c in self.changes}
                raise AssertionError(f"no matching keel/missionChanged within {within}s; last states {last}")
            await asyncio.sleep(0.02)

    def kill_hosts(self) -> None:
        kill_hosts(self.store)


async def until(pred: Callable[[], bool], within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


EDIT = (
    "import sys, time, msgspec\n"
    "from keel.storage import Store, missions as m\n"
    "with Store.open(sys.argv[1]) as s:\n"
    "    s.write(lambda t: m.put_mission(t, msgspec.structs.replace(m.get_mission(t, sys.argv[2]),"
    " error=sys.argv[3], updated_at=time.time())))\n"
)


async def edit_elsewhere(store: Path, mission_id: str, error: str) -> None:
    """Another process changes the mission's record (its `error` text) in the store."""
    argv = [sys.executable, "-c", EDIT, str(store), mission_id, error]
    await asyncio.to_thread(subprocess.run, argv, check=True, capture_output=True, text=True, timeout=30)


def capabilities() -> types.ClientCapabilities:
    return types.ClientCapabilities(
        window=types.WindowClientCapabilities(
            work_done_progress=True, show_message=types.ShowMessageRequestClientCapabilities()
        )
    )


OPTIONS = {"graceMs": 300, "backoffMs": 100}


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER))
async def client(lsp_client: LanguageClient, tmp_path: Path):
    params = types.InitializeParams(
        capabilities=capabilities(), root_uri=tmp_path.as_uri(), initialization_options=OPTIONS
    )
    await lsp_client.initialize_session(params)
    yield
    await lsp_client.shutdown_session()


def watch(client: LanguageClient, root: Path) -> Env:
    """`client`'s Env, made on first use: call it before `initialize_session` to see what the server
    sends as it starts."""
    existing: Env | None = getattr(client, "keel_env", None)
    if existing is not None:
        return existing
    e = Env(root, client)

    @client.feature("keel/missionChanged")
    def changed(params: Any) -> None:
        e.changes.append(_plain(params))

    @client.feature(types.WINDOW_SHOW_MESSAGE_REQUEST)
    def ask(params: types.ShowMessageRequestParams) -> types.MessageActionItem | None:
        e.questions.append(params)
        return e.answer(params)

    client.keel_env = e  # type: ignore[attr-defined]
    return e


@pytest.fixture
def env(client: LanguageClient, tmp_path: Path):
    e = watch(client, tmp_path)
    yield e
    e.kill_hosts()


def _plain(value: Any) -> Any:
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
