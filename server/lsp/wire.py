"""The language server's stdin loop: LSP base-protocol framing that bad input can never crash or stall.

pygls' own loop allocates whatever Content-Length claims (a MemoryError kills the server), answers nothing
for a body that is not JSON or not UTF-8 or a request that fails to deserialize, and after a header block
without Content-Length swallows the next message. This loop, run in its place by `KeelServer`:
- reads header lines with a size limit and answers nothing it cannot frame, but logs it and
  resynchronises on the next `Content-Length` header, so the next valid message is served;
- refuses a body larger than `MAX_MESSAGE_BYTES` before reading it (JSON-RPC -32600, id null) and
  skips ahead to the next header;
- answers every message with an id exactly once: -32700 for a body that is not JSON or not UTF-8,
  -32600 for a request that is not JSON-RPC 2.0 or whose id is not a string, a whole number or null
  (answered with id null: such an id cannot be echoed), -32602 when its params cannot be read; `params` may
  be omitted (JSON-RPC allows it).
Depends on pygls' protocol object and keel.protocol's limits only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from cattrs import transform_error
from cattrs.errors import ClassValidationError

from keel.protocol.framing import DEFAULT_MAX_SIZE

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = DEFAULT_MAX_SIZE
MAX_HEADER_LINE = 8 * 1024
_LENGTH = re.compile(rb"^content-length:\s*(\S+)\s*$", re.IGNORECASE)
PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602


class _Lines:
    """Blocking reads of the client's stream, run in a thread so the event loop never waits on them."""

    def __init__(self, stream: BinaryIO, executor: ThreadPoolExecutor | None) -> None:
        self.stream, self.executor = stream, executor

    async def line(self) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, self.stream.readline, MAX_HEADER_LINE + 1
        )

    async def exactly(self, n: int) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._read, n)

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            more = self.stream.read(n - len(data))
            if not more:
                break
            data += more
        return data


async def serve(
    stop: threading.Event, stream: BinaryIO, protocol: Any, executor: ThreadPoolExecutor | None = None
) -> None:
    """Read framed messages until end of stream (or `stop`) and hand each to pygls' protocol."""
    lines = _Lines(stream, executor)
    pending: bytes | None = None  # a Content-Length line found while skipping garbage
    while not stop.is_set():
        length, ended = await _header_block(lines, pending)
        pending = None
        if ended:
            return
        if length is None:
            continue
        if length > MAX_MESSAGE_BYTES:
            log.warning(
                "keel serve: a message claims %d bytes, over the limit of %d; skipped", length, MAX_MESSAGE_BYTES
            )
            _error(
                protocol,
                None,
                INVALID_REQUEST,
                f"message of {length} bytes exceeds the limit of {MAX_MESSAGE_BYTES} bytes",
            )
            pending = await _resync(lines)
            if pending is None:
                return
            continue
        body = await lines.exactly(length)
        if len(body) < length:
            log.warning("keel serve: the stream ended after %d of %d body bytes", len(body), length)
            return
        dispatch(protocol, body)


async def _header_block(lines: _Lines, first: bytes | None) -> tuple[int | None, bool]:
    """(Content-Length, ended) of the next header block; a block without a usable length is logged and
    gives None, so the caller goes on with the next one."""
    length: int | None = None
    problem = ""
    seen = False
    line = first
    while True:
        if line is None:
            line = await lines.line()
        if not line:
            return None, True
        if len(line) > MAX_HEADER_LINE:
            seen = True
            problem = f"a header line longer than {MAX_HEADER_LINE} bytes"
            while line and not line.endswith(b"\n"):  # drop the rest of that line
                line = await lines.line()
            line = None
            continue
        text = line.strip()
        line = None
        if not text:
            if not seen:
                continue  # stray blank lines between messages
            break
        seen = True
        at = text.lower().find(b"content-length:")  # after stray bytes of a message that could not be framed
        match = _LENGTH.match(text[at:]) if at >= 0 else None
        if match:
            raw = match.group(1)
            if raw.isdigit():
                length = int(raw)
            else:
                problem = f"Content-Length {raw[:40]!r} is not a number"
    if length is None:
        log.warning("keel serve: a header block without a usable Content-Length (%s); skipped", problem or "none given")
    return length, False


async def _resync(lines: _Lines) -> bytes | None:
    """Skip bytes up to the next `Content-Length` header line; returns that line (None at the end)."""
    while True:
        line = await lines.line()
        if not line:
            return None
        at = line.lower().find(b"content-length:")  # the header may follow the skipped bytes on one line
        if at >= 0 and _LENGTH.match(line[at:].strip()):
            return line[at:]


def dispatch(protocol: Any, body: bytes) -> None:
    """Decode one message and give it to pygls; answer what pygls would leave unanswered."""
    try:
        data = json.loads(body)
    except UnicodeDecodeError as exc:
        _error(protocol, None, PARSE_ERROR, f"the message is not UTF-8: {exc.reason} at byte {exc.start}")
        return
    except (ValueError, RecursionError) as exc:
        _error(protocol, None, PARSE_ERROR, f"the message is not JSON: {str(exc)[:200]}")
        return
    if not isinstance(data, dict):
        _error(protocol, None, INVALID_REQUEST, f"a JSON-RPC message is an object, not {type(data).__name__}")
        return
    msg_id, id_problem = request_id(data)
    if id_problem:
        if "method" in data:
            _error(protocol, None, INVALID_REQUEST, id_problem)
        else:
            log.warning("keel serve: a response whose id is not JSON-RPC's (%s); dropped", id_problem)
        return
    if "id" in data and data["id"] is not msg_id:
        data = {**data, "id": msg_id}  # 1.0 → 1
    if data.get("jsonrpc") != "2.0":
        if "method" in data or msg_id is not None:
            _error(protocol, msg_id, INVALID_REQUEST, 'the message lacks "jsonrpc": "2.0"')
        return
    if "method" in data and "params" not in data:
        data = {**data, "params": None}  # params may be omitted
    try:
        message = protocol.structure_message(data)
    except Exception as exc:
        if "method" in data and msg_id is not None:
            method = json.dumps(data.get("method"))
            _error(protocol, msg_id, INVALID_PARAMS, f"cannot read the params of {method}: {_params_problem(exc)}")
        log.warning("keel serve: unreadable message %s: %r", str(data)[:200], exc)
        return
    try:
        protocol.handle_message(message)
    except Exception as exc:  # pygls answers errors of handlers itself; this is a bug in dispatching
        log.exception("keel serve: could not handle a message")
        if "method" in data and msg_id is not None:
            _error(protocol, msg_id, -32603, f"internal error: {exc!r}")


def request_id(data: dict[str, Any]) -> tuple[int | str | None, str]:
    """(id, problem): JSON-RPC 2.0 allows a string, a number without a fraction or null. An object, an
    array, a boolean or a fraction is a problem (answered -32600 with id null); `1.0` is the number 1."""
    if "id" not in data:
        return None, ""
    raw = data["id"]
    if raw is None or isinstance(raw, str) or (type(raw) is int):
        return raw, ""
    if type(raw) is float and raw.is_integer():
        return int(raw), ""
    shown = json.dumps(raw)
    kind = {bool: "a boolean", float: "a number with a fraction", dict: "an object", list: "an array"}
    what = kind.get(type(raw), type(raw).__name__)
    return None, f"the id {shown[:40]} is {what}; JSON-RPC ids are strings, whole numbers or null"


def _params_problem(exc: Exception) -> str:
    """What pygls' converter could not read, with JSON's field names: `invalid value … @ params.processId`."""
    cause = exc.__cause__ or exc
    if isinstance(cause, ClassValidationError):
        lines = transform_error(cause, path="")
        return "; ".join(re.sub(r"_([a-z])", lambda m: m.group(1).upper(), line).replace("@ .", "@ ") for line in lines)
    return str(cause).splitlines()[0] if str(cause) else type(cause).__name__


def _error(protocol: Any, msg_id: int | str | None, code: int, message: str) -> None:
    log.warning("keel serve: answered %s with error %d: %s", msg_id, code, message)
    protocol._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})
