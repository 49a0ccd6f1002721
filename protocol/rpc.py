"""JSON-RPC 2.0 messages as tagged-by-shape Structs, with one decoder that says what was wrong.

Used by the agent protocol (host <-> agent). Params and results are left as plain JSON values here;
each method's typed payload lives with the method (protocol/agent.py).
"""

from __future__ import annotations

from typing import Any

import msgspec

from keel.protocol.errors import ProtocolError

JSONRPC = "2.0"
Id = int | str


def _version() -> str:
    return JSONRPC


# `jsonrpc` gets its default from a factory: omit_defaults leaves out plain defaults (absent params are
# not sent), but every message must carry "jsonrpc": "2.0".
class Request(msgspec.Struct, frozen=True, omit_defaults=True):
    method: str
    id: Id
    params: Any = None
    jsonrpc: str = msgspec.field(default_factory=_version)


class Notification(msgspec.Struct, frozen=True, omit_defaults=True):
    method: str
    params: Any = None
    jsonrpc: str = msgspec.field(default_factory=_version)


class ErrorObject(msgspec.Struct, frozen=True, omit_defaults=True):
    code: int
    message: str
    data: Any = None


class Response(msgspec.Struct, frozen=True):
    id: Id | None
    result: Any = None
    jsonrpc: str = JSONRPC


class ErrorResponse(msgspec.Struct, frozen=True):
    id: Id | None
    error: ErrorObject
    jsonrpc: str = JSONRPC


Message = Request | Notification | Response | ErrorResponse

# Standard JSON-RPC error codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

_encoder = msgspec.json.Encoder()
_raw = msgspec.json.Decoder(dict[str, Any])


def encode(message: Message) -> bytes:
    """JSON bytes of a message; "jsonrpc" is always written (omit_defaults would drop it)."""
    obj: dict[str, Any] = msgspec.to_builtins(message)
    obj["jsonrpc"] = JSONRPC
    return _encoder.encode(obj)


def decode(body: bytes) -> Message:
    """Decode one JSON-RPC message; any defect raises ProtocolError naming it."""
    try:
        obj = _raw.decode(body)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"message is not a JSON object: {exc}") from None
    if obj.get("jsonrpc") != JSONRPC:
        raise ProtocolError(f'message lacks "jsonrpc": "2.0" (got {obj.get("jsonrpc")!r})')
    if "method" in obj:
        kind: type[Message] = Request if "id" in obj else Notification
    elif "error" in obj:
        kind = ErrorResponse
    elif "result" in obj or "id" in obj:
        kind = Response
    else:
        raise ProtocolError("message is neither a request, a notification nor a response")
    try:
        return msgspec.convert(obj, kind)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"malformed {kind.__name__.lower()}: {exc}") from None
