"""keel serve with clients that differ from VS Code: one that announces no window capabilities (eglot 1.9 in
Emacs 28: it is asked with `showMessageRequest` all the same, and gets progress as messages, since it drops
`$/progress` and log messages), one that refuses `showMessageRequest` with an error (Helix), and a server
started over a store whose missions are already finished (no start-up noise)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcMethodNotFound
from pytest_lsp import ClientServerConfig, LanguageClient
from pytest_lsp.client import captured_exception_key

from tests.lsp.conftest import OPTIONS, SERVER, Env, capabilities, edit_elsewhere, mission_toml, until, watch

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


@pytest.fixture
def backend() -> str:
    """Protocol-level tests: the store's backend does not matter, so they run on LMDB alone."""
    return "lmdb"


ASKS = [{"id": "q", "steps": [{"ask": "Ship it?", "choices": ["yes", "no"]}, {"sleep": 0.1}]}]


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER))
async def bare(lsp_client: LanguageClient, tmp_path: Path):
    """A client that announces no window capabilities at all."""
    watch(lsp_client, tmp_path)
    params = types.InitializeParams(
        capabilities=types.ClientCapabilities(), root_uri=tmp_path.as_uri(), initialization_options=OPTIONS
    )
    await lsp_client.initialize_session(params)
    yield
    await lsp_client.shutdown_session()


@pytest.fixture
def bare_env(bare: LanguageClient, tmp_path: Path):
    e = watch(bare, tmp_path)
    yield e
    e.kill_hosts()


def _shown(env: Env) -> list[str]:
    return [m.message for m in env.client.messages]


async def _still_waiting(env: Env, mid: str) -> None:
    await asyncio.sleep(1.0)  # time for a wrong answer to be sent (none may be)
    (mission,) = await env.request("keel/missions")
    assert mission["id"] == mid and mission["state"] == "waiting_input", mission


async def test_a_client_without_window_capabilities_is_asked_the_question(bare_env: Env) -> None:
    """Stock eglot (1.9, Emacs 28) announces no window capability but prompts with a request's actions."""
    env = bare_env
    env.answer = lambda params: types.MessageActionItem(title="yes")
    mid = (await env.command("keel.startMission", env.write_mission("asks", ASKS)))["id"]
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed", within=60)
    [asked] = env.questions
    assert asked.message == "keel · asks asks: Ship it?"
    assert [a.title for a in asked.actions or []] == ["yes", "no"]
    assert not any("keel answer" in text for text in _shown(env)), _shown(env)


async def test_question_refused_by_the_client_is_shown_instead(env: Env) -> None:
    def refuse(params: types.ShowMessageRequestParams) -> types.MessageActionItem | None:
        raise JsonRpcMethodNotFound(message="window/showMessageRequest is not supported")

    env.answer = refuse
    mid = (await env.command("keel.startMission", env.write_mission("asks", ASKS)))["id"]
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "waiting_input")
    line = f"`keel answer {mid} yes` · `keel answer {mid} no`"
    await until(lambda: any(line in text for text in _shown(env)), within=60)
    assert len(env.questions) == 1
    _refusal_was_meant(env.client)
    await _still_waiting(env, mid)
    answered = await env.command("keel.answer", mid, "no")
    assert answered["state"] in ("running", "completed"), answered
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed", within=30)


def _refusal_was_meant(client: LanguageClient) -> None:
    """pytest-lsp fails a test whose client handler raised; here the client's refusal is the point."""
    item = client._pytest_item
    if item is not None:
        item.stash[captured_exception_key] = None


async def test_progress_as_messages_without_work_done_progress(bare_env: Env) -> None:
    env = bare_env
    two = [
        {"id": "a", "title": "first", "steps": [{"sleep": 0.3}]},
        {"id": "b", "after": ["a"], "steps": [{"sleep": 0.2}] * 5},  # a second at 50%: seen by any poll
    ]
    mid = (await env.command("keel.startMission", env.write_mission("two", two)))["id"]
    await env.wait_for(lambda c: c["id"] == mid and c["state"] == "completed")
    prefix = f"keel: two ({mid}) "

    def progress() -> list[str]:  # shown: eglot 1.9 drops log messages
        return [m.message for m in env.client.messages if m.message.startswith(prefix)]

    await until(lambda: bool(progress()) and progress()[-1] == prefix + "completed (100%)", within=60)
    assert any(line.endswith(" · 1/2 (50%)") for line in progress()), progress()
    assert all(m.type == types.MessageType.Info for m in env.client.messages if m.message.startswith(prefix))
    assert env.client.progress_reports == {}


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER))
async def restarted(lsp_client: LanguageClient, tmp_path: Path):
    """A server started over a store that already holds three finished missions."""
    store = tmp_path / ".keel" / "store"
    for name in ("one", "two", "three"):
        path = tmp_path / f"{name}.toml"
        path.write_text(mission_toml(name, [{"id": "u", "steps": []}]))
        cli = [sys.executable, "-m", "keel.server.cli", "run", str(path), "--store", str(store), "--plain"]
        await asyncio.to_thread(subprocess.run, cli, check=True, capture_output=True, timeout=120, cwd=tmp_path)
    watch(lsp_client, tmp_path)
    params = types.InitializeParams(
        capabilities=capabilities(), root_uri=tmp_path.as_uri(), initialization_options=OPTIONS
    )
    await lsp_client.initialize_session(params)
    yield
    await lsp_client.shutdown_session()


async def test_start_sends_no_mission_changes_until_one_changes(restarted: LanguageClient, tmp_path: Path) -> None:
    env = watch(restarted, tmp_path)
    missions = await env.request("keel/missions")
    assert [m["name"] for m in missions] == ["one", "two", "three"]
    assert {m["state"] for m in missions} == {"completed"}
    await asyncio.sleep(2.5)  # the watcher reads the store at start and again at every 1 s sweep
    assert env.changes == []
    edited = missions[1]["id"]
    await edit_elsewhere(env.store, edited, "edited elsewhere")
    await env.wait_for(lambda c: c["id"] == edited and c.get("error") == "edited elsewhere", within=60)
    await asyncio.sleep(2.5)
    assert [(c["id"], c.get("error")) for c in env.changes] == [(edited, "edited elsewhere")]
