"""A real fault-injecting model server on 127.0.0.1, scripted per test (reusable by any keel test).

Routes: POST /v1/chat/completions (OpenAI-compatible, JSON or SSE when the body says "stream": true),
POST /v1/messages (Anthropic Messages, JSON or its event stream), GET /v1/models (the probe; always
answers while the server runs). Each POST takes the next behaviour from a queue (`push`), or the
default: ok(), delay(), reset() (RST via SO_LINGER 0), error(500/503), rate_limited(retry_after),
cut_stream(), error(401/403), unknown_model(), context_exceeded(). Every request is recorded with its
headers and JSON body. `stop()` closes the listener and every open connection (total network loss);
`start()` listens again on the same port. Optional TLS with a given certificate. Loopback only.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Behaviour:
    kind: str  # ok | delay | reset | error | cut
    content: str = "ok"
    tool_calls: tuple[dict[str, Any], ...] = ()
    model: str = ""  # the model named in the answer (default: the model asked for)
    seconds: float = 0.0  # delay: before answering; ok: between stream chunks
    then: Behaviour | None = None
    status: int = 200
    code: str = ""
    message: str = ""
    retry_after: str | None = None
    chunks: int = 2  # cut: events sent before the connection drops


def ok(
    content: str = "ok", tool_calls: tuple[dict[str, Any], ...] = (), model: str = "", chunk_delay: float = 0.0
) -> Behaviour:
    return Behaviour("ok", content=content, tool_calls=tool_calls, model=model, seconds=chunk_delay)


def delay(seconds: float, then: Behaviour | None = None) -> Behaviour:
    return Behaviour("delay", seconds=seconds, then=then or ok())


def reset() -> Behaviour:
    return Behaviour("reset")


def error(status: int, code: str = "", message: str = "", retry_after: str | None = None) -> Behaviour:
    return Behaviour(
        "error", status=status, code=code, message=message or f"injected HTTP {status}", retry_after=retry_after
    )


def rate_limited(retry_after: str | None) -> Behaviour:
    return error(429, "rate_limit_exceeded", "Rate limit reached", retry_after)


def unknown_model() -> Behaviour:
    return error(404, "model_not_found", "The model does not exist or you do not have access to it.")


def context_exceeded() -> Behaviour:
    return error(
        400,
        "context_length_exceeded",
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
    )


def cut_stream(chunks: int = 2) -> Behaviour:
    return Behaviour("cut", content="this answer will never be complete", chunks=chunks)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float = field(default_factory=time.monotonic)


class FaultServer:
    def __init__(self, tls: ssl.SSLContext | None = None, default: Behaviour | None = None) -> None:
        self.tls = tls
        self.default = default or ok()
        self.requests: list[Recorded] = []
        self._queue: deque[Behaviour] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- control -----------------------------------------------------------------------------------
    @property
    def root(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.root + "/v1"

    @property
    def posts(self) -> list[Recorded]:
        return [r for r in self.requests if r.method == "POST"]

    def push(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self._queue.extend(behaviours)

    def start(self) -> FaultServer:
        self._stopping.clear()
        httpd = _QuietServer(("127.0.0.1", self.port), _handler_for(self))
        if self.tls is not None:
            httpd.socket = self.tls.wrap_socket(httpd.socket, server_side=True)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop every open connection (what a lost network looks like to a client)."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:
            for conn in list(self._connections):
                _abort(conn)
            self._connections.clear()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next(self) -> Behaviour:
        with self._lock:
            return self._queue.popleft() if self._queue else self.default


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # resets and dropped connections are what this server is for


def _abort(conn: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): the peer sees 'connection reset', not an orderly end."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    except OSError:
        pass


def _handler_for(server: FaultServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            with server._lock:
                server._connections.add(self.connection)

        def finish(self) -> None:
            with contextlib.suppress(OSError, ValueError):
                super().finish()
            with server._lock:
                server._connections.discard(self.connection)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._record(None)
            if self.path.rstrip("/").endswith("/models"):
                self._json(200, {"object": "list", "data": [{"id": "fault-model", "object": "model"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}", "code": "not_found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            self._record(body)
            anthropic = self.path.rstrip("/").endswith("/messages")
            if not anthropic and not self.path.rstrip("/").endswith("/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}", "code": "not_found"}})
                return
            self._serve(server._next(), body if isinstance(body, dict) else {}, anthropic)

        def _record(self, body: Any) -> None:
            with server._lock:
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append(Recorded(self.command, self.path, headers, body))

        def _serve(self, b: Behaviour, body: dict[str, Any], anthropic: bool) -> None:
            if b.kind == "delay":
                if server._stopping.wait(b.seconds):
                    return
                assert b.then is not None
                self._serve(b.then, body, anthropic)
            elif b.kind == "reset":
                self.close_connection = True
                _abort(self.connection)
            elif b.kind == "error":
                self._error(b, anthropic)
            else:
                model = b.model or str(body.get("model", "fault-model"))
                events = _anthropic_events(b, model) if anthropic else _openai_events(b, model)
                if body.get("stream"):
                    self._stream(events, b, anthropic)
                else:
                    self._json(200, _anthropic_json(b, model) if anthropic else _openai_json(b, model))

        def _error(self, b: Behaviour, anthropic: bool) -> None:
            if anthropic:
                kind = {
                    400: "invalid_request_error",
                    401: "authentication_error",
                    403: "permission_error",
                    404: "not_found_error",
                    429: "rate_limit_error",
                }.get(b.status, "api_error")
                message = (
                    "prompt is too long: 9000 tokens > 8192 maximum"
                    if b.code == "context_length_exceeded"
                    else b.message
                )
                payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
            else:
                payload = {"error": {"message": b.message, "type": "invalid_request_error", "code": b.code or None}}
            self._json(b.status, payload, {"Retry-After": b.retry_after} if b.retry_after is not None else {})

        def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, events: list[tuple[str, Any]], b: Behaviour, anthropic: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for number, (name, data) in enumerate(events):
                if b.kind == "cut" and number >= b.chunks:
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                text = data if isinstance(data, str) else json.dumps(data)
                frame = (f"event: {name}\n" if anthropic else "") + f"data: {text}\n\n"
                chunk = frame.encode()
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
                if b.seconds and server._stopping.wait(b.seconds):
                    return
            self.wfile.write(b"0\r\n\r\n")

    return Handler


def _pieces(text: str) -> list[str]:
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]


def _openai_json(b: Behaviour, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": b.content if not b.tool_calls else None}
    if b.tool_calls:
        message["tool_calls"] = [dict(c) for c in b.tool_calls]
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if b.tool_calls else "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }


def _openai_events(b: Behaviour, model: str) -> list[tuple[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[str, Any]:
        return "message", {
            "id": "chatcmpl-fault",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    events = [chunk({"role": "assistant", "content": ""})]
    if b.tool_calls:
        for index, call in enumerate(b.tool_calls):
            fn = call["function"]
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": fn["name"], "arguments": ""},
                            }
                        ]
                    }
                )
            )
            half = len(fn["arguments"]) // 2
            for part in (fn["arguments"][:half], fn["arguments"][half:]):
                events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]}))
    else:
        events += [chunk({"content": piece}) for piece in _pieces(b.content)]
    events.append(chunk({}, "tool_calls" if b.tool_calls else "stop"))
    events.append(
        (
            "message",
            {
                "id": "chatcmpl-fault",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3},
            },
        )
    )
    events.append(("message", "[DONE]"))
    return events


def _anthropic_json(b: Behaviour, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": b.content}] if not b.tool_calls else []
    content += [
        {
            "type": "tool_use",
            "id": c["id"],
            "name": c["function"]["name"],
            "input": json.loads(c["function"]["arguments"]),
        }
        for c in b.tool_calls
    ]
    return {
        "id": "msg_fault",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if b.tool_calls else "end_turn",
        "usage": {"input_tokens": 7, "output_tokens": 3},
    }


def _anthropic_events(b: Behaviour, model: str) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_fault",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "usage": {"input_tokens": 7, "output_tokens": 0},
                },
            },
        )
    ]
    if b.tool_calls:
        for index, call in enumerate(b.tool_calls):
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {
                            "type": "tool_use",
                            "id": call["id"],
                            "name": call["function"]["name"],
                            "input": {},
                        },
                    },
                )
            )
            args = call["function"]["arguments"]
            for part in (args[: len(args) // 2], args[len(args) // 2 :]):
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": part},
                        },
                    )
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    else:
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            )
        )
        events += [
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
            )
            for piece in _pieces(b.content)
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use" if b.tool_calls else "end_turn"},
                "usage": {"output_tokens": 3},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events
