"""Bad JSON-RPC input to a real `keel serve`, written byte by byte to its stdin: it never crashes and
every message with an id gets exactly one answer; the next valid request is always served."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


@pytest.fixture
def backend() -> str:
    """Protocol-level tests: the store's backend does not matter, so they run on LMDB alone."""
    return "lmdb"


INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"processId": None, "rootUri": None, "capabilities": {}},
}


def _frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _msg(obj: dict[str, Any]) -> bytes:
    return _frame(json.dumps(obj).encode())


class Server:
    def __init__(self, store: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "keel.server.cli", "serve", "--store", str(store), *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"},
        )
        self.buffer = b""

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def responses(self, timeout: float = 15.0) -> dict[Any, list[dict[str, Any]]]:
        """Every response (by id) that arrives within `timeout` s; notifications and requests dropped."""
        out: dict[Any, list[dict[str, Any]]] = {}
        for message in self.messages(timeout):
            if "method" not in message:
                out.setdefault(message.get("id"), []).append(message)
        return out

    def messages(self, timeout: float) -> list[dict[str, Any]]:
        """Every message that arrives within `timeout` s, in order."""
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self.buffer += chunk
            while b"\r\n\r\n" in self.buffer:
                head, rest = self.buffer.split(b"\r\n\r\n", 1)
                length = int(
                    next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
                )
                if len(rest) < length:
                    break
                out.append(json.loads(rest[:length]))
                self.buffer = rest[length:]
        return out

    def until(self, ids: set[Any], timeout: float = 120.0) -> dict[Any, list[dict[str, Any]]]:
        got: dict[Any, list[dict[str, Any]]] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not ids <= set(got):
            for key, items in self.responses(timeout=0.5).items():
                got.setdefault(key, []).extend(items)
        return got

    def close(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        _, err = self.proc.communicate(timeout=10)
        return err.decode(errors="replace")


@pytest.fixture
def server(tmp_path: Path) -> Any:
    s = Server(tmp_path / "store")
    s.send(_msg(INIT))
    s.send(_msg({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
    assert 1 in s.until({1})
    yield s
    s.close()


def _missions(msg_id: int) -> bytes:
    return _msg({"jsonrpc": "2.0", "id": msg_id, "method": "keel/missions", "params": {}})


def test_a_huge_content_length_is_refused_and_the_server_goes_on(server: Server) -> None:
    server.send(b'Content-Length: 99999999999\r\n\r\n{"jsonrpc": "2.0"')
    server.send(_missions(2))
    got = server.until({None, 2})
    assert got[None][0]["error"]["code"] == -32600 and "exceeds the limit" in got[None][0]["error"]["message"]
    assert "result" in got[2][0], got
    assert server.proc.poll() is None


def test_params_may_be_omitted(server: Server) -> None:
    server.send(_msg({"jsonrpc": "2.0", "id": 2, "method": "keel/missions"}))
    got = server.until({2})
    assert got[2][0].get("result") == [], got


@pytest.mark.parametrize(
    "body, code",
    [
        (b"{not json", -32700),
        (b'\xff\xfe{"jsonrpc": "2.0"}', -32700),
        (b"[1, 2]", -32600),
    ],
)
def test_a_body_that_is_not_a_message_is_answered_with_id_null(server: Server, body: bytes, code: int) -> None:
    server.send(_frame(body))
    server.send(_missions(2))
    got = server.until({None, 2})
    assert len(got[None]) == 1 and got[None][0]["error"]["code"] == code, got
    assert "result" in got[2][0]


def test_a_request_without_jsonrpc_is_answered_invalid_request(server: Server) -> None:
    server.send(_msg({"id": 7, "method": "keel/missions", "params": {}}))
    server.send(_missions(2))
    got = server.until({7, 2})
    assert len(got[7]) == 1 and got[7][0]["error"]["code"] == -32600, got
    assert "result" in got[2][0]


def test_a_header_block_without_content_length_does_not_swallow_the_next_request(server: Server) -> None:
    server.send(b'Content-Type: application/vscode-jsonrpc\r\n\r\n{"jsonrpc": "2.0", "id": 9}')
    server.send(_missions(2))
    server.send(b"X-Nonsense: " + b"y" * 20000 + b"\r\n\r\n")
    server.send(_missions(3))
    got = server.until({2, 3})
    assert "result" in got[2][0] and "result" in got[3][0], got
    assert all(len(v) == 1 for v in got.values()), got


def test_params_of_the_wrong_shape_are_answered(server: Server) -> None:
    server.send(_msg({"jsonrpc": "2.0", "id": 4, "method": "textDocument/hover", "params": 5}))
    got = server.until({4})
    assert len(got[4]) == 1 and "error" in got[4][0], got


def test_params_that_cannot_be_read_are_named_in_json_terms(server: Server) -> None:
    server.send(
        _msg(
            {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "workspace/executeCommand",
                "params": {"command": "keel.pause", "arguments": 5},
            }
        )
    )
    got = server.until({9})
    error = got[9][0]["error"]
    assert error["code"] == -32602, got
    assert error["message"].startswith('cannot read the params of "workspace/executeCommand": '), error
    assert error["message"].endswith("@ params.arguments") and "Json" not in error["message"], error


@pytest.mark.parametrize("bad_id", [{"a": 1}, [1, 2], 1.5, True, False])
def test_a_request_whose_id_is_not_jsonrpc_is_answered_invalid_request_with_id_null(
    tmp_path: Path, bad_id: Any
) -> None:
    log_file = tmp_path / "serve.log"
    s = Server(tmp_path / "store", "--log-file", str(log_file))
    try:
        s.send(_msg(INIT))
        assert 1 in s.until({1})
        s.send(_msg({"jsonrpc": "2.0", "id": bad_id, "method": "keel/missions", "params": {}}))
        s.send(_missions(2))
        got = s.until({None, 2})
        assert len(got[None]) == 1, got
        error = got[None][0]["error"]
        assert error["code"] == -32600 and "data" not in error, error
        assert "JSON-RPC ids are strings, whole numbers or null" in error["message"], error
        assert "result" in got[2][0] and set(got) == {None, 2}, got
        assert s.proc.poll() is None
    finally:
        err = s.close()
    logged = log_file.read_text() + err
    assert "Traceback" not in logged, logged
    assert sum("JSON-RPC ids are" in line for line in logged.splitlines()) == 1, logged


def test_a_whole_number_written_with_a_fraction_is_a_valid_id(server: Server) -> None:
    server.send(_msg({"jsonrpc": "2.0", "id": 5.0, "method": "keel/missions", "params": {}}))
    got = server.until({5})
    assert got[5][0].get("result") == [], got
