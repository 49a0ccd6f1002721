"""The ids of requests keel serve sends to the editor are integers (Vim 9's LSP channel answers no other kind),
and an editor request that happens to carry the same number is served as its own: each gets its answer."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.hosts import kill_hosts
from tests.lsp.conftest import mission_toml
from tests.lsp.test_lsp_bad_input import Server, _msg

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


@pytest.fixture
def backend() -> str:
    """Protocol-level tests: the store's backend does not matter, so they run on LMDB alone."""
    return "lmdb"


def _wait(server: Server, seen: list[dict[str, Any]], pred: Any, within: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        for message in seen:
            if pred(message):
                return message
        assert time.monotonic() < deadline, f"no such message within {within} s; seen {seen[-5:]}"
        seen.extend(server.messages(0.3))


def test_server_requests_have_integer_ids_apart_from_the_clients(tmp_path: Path) -> None:
    store = tmp_path / ".keel" / "store"
    mission = tmp_path / "ids.toml"
    mission.write_text(mission_toml("ids", [{"id": "u", "steps": [{"sleep": 0.2}] * 10}]))
    server = Server(store)
    seen: list[dict[str, Any]] = []
    init = {"processId": None, "rootUri": tmp_path.as_uri(), "capabilities": {"window": {"workDoneProgress": True}}}
    try:
        server.send(_msg({"jsonrpc": "2.0", "id": 100, "method": "initialize", "params": init}))
        _wait(server, seen, lambda m: m.get("id") == 100 and "result" in m)
        server.send(_msg({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
        start = {"command": "keel.startMission", "arguments": [str(mission)]}
        server.send(_msg({"jsonrpc": "2.0", "id": 101, "method": "workspace/executeCommand", "params": start}))
        create = _wait(server, seen, lambda m: m.get("method") == "window/workDoneProgress/create")
        number = create["id"]
        assert type(number) is int, create
        # the client's own request with the same number, while the server's is still unanswered
        server.send(_msg({"jsonrpc": "2.0", "id": number, "method": "keel/missions", "params": {}}))
        mine = _wait(server, seen, lambda m: m.get("id") == number and "method" not in m)
        assert [x["name"] for x in mine["result"]] == ["ids"], mine
        server.send(_msg({"jsonrpc": "2.0", "id": number, "result": None}))  # now answer the server's
        token = create["params"]["token"]
        begin = _wait(server, seen, lambda m: m.get("method") == "$/progress" and m["params"]["token"] == token)
        assert begin["params"]["value"]["kind"] == "begin", begin
    finally:
        server.close()
        kill_hosts(store)
