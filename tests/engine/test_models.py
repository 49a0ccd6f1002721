"""Model calls through the host: journaled with the served model, replayed without a second request,
and a lost connection stops the mission as `offline`. The model server is a real HTTP server on
127.0.0.1 speaking the OpenAI chat-completions shape; the host runs in this process so the test can
hand it a model client (the providers' router plays that part in keel itself)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_helpers import read, record, write_mission

from keel.protocol import agent as ap
from keel.protocol.errors import ErrorCode, KeelError
from keel.protocol.states import MissionState
from keel.server.engine import control
from keel.server.engine import host as host_module
from keel.server.engine.host import run_host_blocking
from keel.storage import Store
from keel.storage import missions as m


class Offline(KeelError):
    code = ErrorCode.OFFLINE


class ChatServer:
    def __init__(self) -> None:
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.requests += 1
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reply = {"model": "tiny-1", "choices": [{"finish_reason": "stop", "message": {
                    "role": "assistant", "content": f"echo: {body['messages'][-1]['content']}"}}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/chat/completions"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ChatClient:
    def __init__(self, url: str) -> None:
        self.url = url

    async def complete(self, params: ap.ModelCompleteParams) -> ap.ModelCompleteResult:
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                data = (await client.post(self.url, json={"messages": params.messages})).json()
        except httpx.ConnectError as exc:
            raise Offline(f"model server unreachable: {exc}") from None
        usage = data["usage"]
        return ap.ModelCompleteResult(message=data["choices"][0]["message"], model=data["model"],
                                      finish_reason=data["choices"][0]["finish_reason"],
                                      usage=ap.Usage(**usage))


@pytest.fixture
def chat(monkeypatch: pytest.MonkeyPatch) -> Any:
    server = ChatServer()
    monkeypatch.setattr(host_module, "MODEL_CLIENT_FACTORY", lambda host: ChatClient(server.url))
    yield server
    server.stop()


def _mission(tmp_path: Path) -> tuple[Path, str]:
    units = [{"id": "m", "params": {"steps": [
        {"model": {"messages": [{"role": "user", "content": "hi"}], "purpose": "greet"}},
        {"ask": "go on?"}]}}]
    store = tmp_path / "store"
    with Store.open(store) as s:
        mid = control.create_mission(s, write_mission(tmp_path, units)).id
    return store, mid


def test_model_call_is_journaled_and_replayed_without_a_second_request(tmp_path: Path, chat: ChatServer) -> None:
    store, mid = _mission(tmp_path)
    assert run_host_blocking(store, mid) == MissionState.WAITING_INPUT
    assert chat.requests == 1
    control.answer(store, mid, "yes", "test", resume=False)
    assert run_host_blocking(store, mid) == MissionState.COMPLETED
    assert chat.requests == 1  # replayed from the journal: no tokens spent twice
    entry = read(store, lambda t: m.journal_get(t, mid, "m", 1))
    assert entry.served_model == "tiny-1" and entry.cost.tokens == 8
    head = read(store, lambda t: m.head_checkpoint(t, mid))
    assert head.units["m"].result["outputs"] == ["echo: hi", "yes"]
    kinds = [e.kind for _, e in read(store, lambda t: list(m.evidence_after(t, mid)))]
    assert kinds == ["model"]


def test_losing_the_model_server_stops_the_mission_offline(tmp_path: Path, chat: ChatServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    store, mid = _mission(tmp_path)
    chat.stop()
    assert run_host_blocking(store, mid) == MissionState.OFFLINE
    rec = record(store, mid)
    assert rec.pause_reason is not None and rec.pause_reason.value == "offline"
    assert "unreachable" in rec.error
    assert "offline" in [p.reason for p in read(store, lambda t: m.restore_points(t, mid))]
    back = ChatServer()  # connectivity returns: a resume makes the call that was lost
    try:
        monkeypatch.setattr(host_module, "MODEL_CLIENT_FACTORY", lambda host: ChatClient(back.url))
        assert run_host_blocking(store, mid) == MissionState.WAITING_INPUT
        assert back.requests == 1 and record(store, mid).error == ""
    finally:
        back.stop()
