"""keel's model proxy for one unit: an HTTP server on 127.0.0.1 that the outside agent takes for its
model provider.

Each request must carry the unit's token (as `x-api-key`, `x-goog-api-key`, `Authorization: Bearer` or
`?key=`); its path tells the API (`/v1/messages`: Anthropic, `/v1/responses`: OpenAI Responses,
`/v1beta/models/<m>:<method>`: Gemini). The body goes to `serve` (the bridge hands it to the host as a
journaled `model/forward`) and the answer, JSON or a whole event stream, goes back as the provider sent it.
A `GET`/`HEAD` (a reachability check) gets 200. Errors the host reports become 503 with the reason, so
the agent's turn fails visibly rather than hanging. `POST /mcp` (with the token) is keel's tools as an MCP
server, when the bridge offers them (`mcp.py`). HTTP/1.1 by h11; one request per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h11
import msgspec

from keel.protocol.agent import ForwardApi, ModelForwardResult

Serve = Callable[[ForwardApi, str, dict[str, Any]], Awaitable[ModelForwardResult]]
Mcp = Callable[[dict[str, Any]], Awaitable["dict[str, Any] | None"]]
_GEMINI = re.compile(r"^/v1(beta|alpha)?/(models/[^/:]+:\w+)$")
MAX_BODY = 256 * 1024 * 1024


class ProxyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Proxy:
    def __init__(self, token: str, serve: Serve, mcp: Mcp | None = None) -> None:
        self.token = token
        self._serve = serve
        self._mcp = mcp
        self._server: asyncio.Server | None = None
        self.url = ""
        self.requests = 0

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        method = b"POST"
        try:
            request, body = await _read_request(conn, reader)
            method = request.method
            status, content_type, payload = await self._answer(request, body)
        except ProxyError as exc:
            status, content_type, payload = exc.status, "application/json", _error_body(str(exc))
        except (h11.ProtocolError, ValueError) as exc:
            status, content_type, payload = 400, "application/json", _error_body(f"bad request: {exc}")
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.close()
            return
        data = payload.encode()
        headers = [("content-type", content_type), ("content-length", str(len(data))), ("connection", "close")]
        with contextlib.suppress(ConnectionError, h11.LocalProtocolError):
            writer.write(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
            if method != b"HEAD":
                writer.write(conn.send(h11.Data(data=data)) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    async def _answer(self, request: h11.Request, body: bytes) -> tuple[int, str, str]:
        target = urlsplit(request.target.decode("latin-1"))
        mcp = target.path == "/mcp" and self._mcp is not None
        if mcp and request.method != b"POST":
            raise ProxyError(405, "keel's MCP server answers POST only (no event stream)")
        if request.method in (b"GET", b"HEAD"):
            return 200, "application/json", "{}"
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in request.headers}
        if self.token not in _credentials(headers, target.query):
            raise ProxyError(401, "keel's model proxy: missing or wrong token for this unit")
        try:
            doc = msgspec.json.decode(body or b"{}")  # a conversation's whole history: faster than json
        except ValueError as exc:
            raise ProxyError(400, f"keel's model proxy: the body is not JSON: {exc}") from None
        if mcp:
            return await self._mcp_answer(doc)
        api, path = _route(target.path)
        if not isinstance(doc, dict):
            raise ProxyError(400, "keel's model proxy: the body is not a JSON object")
        self.requests += 1
        result = await self._serve(api, path, doc)
        return result.status, result.content_type, result.body

    async def _mcp_answer(self, doc: Any) -> tuple[int, str, str]:
        assert self._mcp is not None
        messages = doc if isinstance(doc, list) else [doc]
        if not all(isinstance(m, dict) for m in messages):
            raise ProxyError(400, "keel's MCP server: a message is not a JSON object")
        answers = [a for a in [await self._mcp(m) for m in messages] if a is not None]
        if not answers:
            return 202, "application/json", ""
        return 200, "application/json", json.dumps(answers if isinstance(doc, list) else answers[0])


async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> tuple[h11.Request, bytes]:
    request: h11.Request | None = None
    chunks: list[bytes] = []
    size = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            if not data and conn.their_state is h11.SEND_BODY:
                raise ConnectionError("the client closed mid-request")
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > MAX_BODY:
                raise ProxyError(413, "keel's model proxy: request body too large")
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            return request, b"".join(chunks)
        elif isinstance(event, h11.ConnectionClosed):
            raise ConnectionError("the client closed the connection")


def _credentials(headers: dict[str, str], query: str) -> set[str]:
    found = {headers.get("x-api-key", ""), headers.get("x-goog-api-key", "")}
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        found.add(auth[7:].strip())
    found.update(parse_qs(query).get("key", []))
    return found - {""}


def _route(path: str) -> tuple[ForwardApi, str]:
    if path.endswith("/messages"):
        return "anthropic", ""
    if path.endswith("/responses"):
        return "openai-responses", ""
    if match := _GEMINI.match(path):
        return "gemini", match.group(2)
    raise ProxyError(404, f"keel's model proxy serves Anthropic Messages, OpenAI Responses and Gemini; not {path}")


def _error_body(message: str) -> str:
    return json.dumps({"type": "error", "error": {"type": "keel_proxy_error", "message": message}})
