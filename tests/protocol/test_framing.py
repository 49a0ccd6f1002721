"""Content-Length framing and JSON-RPC decoding: round trips, and every malformed input named.

Sync readers run over real pipes (os.pipe), asyncio readers over real StreamReaders fed the same bytes.
"""

from __future__ import annotations

import asyncio
import io
import os
import threading
from typing import Any

import pytest

from keel.protocol import rpc
from keel.protocol.errors import ProtocolError
from keel.protocol.framing import (
    DEFAULT_MAX_SIZE,
    MAX_HEADER_SIZE,
    STREAM_LIMIT,
    frame,
    read_frame,
    read_frame_async,
)


def _read_all_sync(data: bytes, max_size: int = 1024) -> list[bytes | None]:
    """Frames read from a real pipe holding `data` (writer closed), until the clean end."""
    r, w = os.pipe()
    threading.Thread(target=lambda: (os.write(w, data), os.close(w)), daemon=True).start()
    out: list[bytes | None] = []
    with os.fdopen(r, "rb") as stream:
        while (body := read_frame(stream, max_size)) is not None:
            out.append(body)
    return out


async def _read_all_async(data: bytes, max_size: int = 1024) -> list[bytes | None]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    out: list[bytes | None] = []
    while (body := await read_frame_async(reader, max_size)) is not None:
        out.append(body)
    return out


def _both(data: bytes, max_size: int = 1024) -> tuple[Any, Any]:
    """(sync result or error, async result or error) for the same bytes."""
    results: list[Any] = []
    for reader in (lambda: _read_all_sync(data, max_size), lambda: asyncio.run(_read_all_async(data, max_size))):
        try:
            results.append(reader())
        except ProtocolError as exc:
            results.append(exc)
    return results[0], results[1]


BODIES = [b"{}", b'{"jsonrpc":"2.0","method":"now","id":1}', '{"x":"\u00e9\u2603"}'.encode(), b"x" * 1000]


def test_frames_round_trip_sync_and_async() -> None:
    data = b"".join(frame(b) for b in BODIES)
    assert _both(data) == (BODIES, BODIES)


def test_other_headers_are_ignored_and_lf_only_is_accepted() -> None:
    data = b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}" + b"content-length: 2\n\n[]"
    assert _both(data) == ([b"{}", b"[]"], [b"{}", b"[]"])


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"Content-Type: x\r\n\r\n{}", "no Content-Length"),
        (b"Content-Length: ten\r\n\r\n{}", "not a number"),
        (b"Content-Length: 1_0\r\n\r\n0123456789", "not a number"),
        (b"Content-Length: -5\r\n\r\n{}", "negative Content-Length"),
        (b"Content-Length: 5000\r\n\r\n{}", "frame of 5000 bytes exceeds the limit of 1024 bytes"),
        (b"Content-Length: 10\r\n\r\n{}", "stream ended after 2 of 10 body bytes"),
        (b"Content-Length 2\r\n\r\n{}", "expected 'Name: value'"),
        (b"Content-Length: 2\r\n", "stream ended inside a frame header"),
        (b"Content-Len", "stream ended inside a frame header"),
        (b"X: " + b"a" * 9000 + b"\r\n\r\n", "frame header longer than 8192 bytes"),
        (b"X: " + b"a" * 20000, "frame header longer than 8192 bytes"),
        (b"X: a\r\n" * 2000 + b"Content-Length: 2\r\n\r\n{}", "frame header longer than 8192 bytes"),
    ],
    ids=[
        "no-length",
        "non-numeric",
        "underscore",
        "negative",
        "oversize",
        "truncated-body",
        "no-colon",
        "eof-after-header",
        "eof-mid-header",
        "long-header",
        "long-header-no-newline",
        "many-header-lines",
    ],
)
def test_malformed_frames_say_what(data: bytes, expected: str) -> None:
    sync, async_ = _both(data)
    for result in (sync, async_):
        assert isinstance(result, ProtocolError), result
        assert expected in result.message


def test_clean_end_of_stream_is_none() -> None:
    assert _both(b"") == ([], [])
    assert read_frame(io.BytesIO(b"")) is None


def test_oversize_frame_is_refused_before_the_body_arrives() -> None:
    """The writer sends only the header and keeps the pipe open: reading the body would block forever."""
    r, w = os.pipe()
    os.write(w, b"Content-Length: 999999\r\n\r\n")
    outcome: list[BaseException | bytes | None] = []

    def read() -> None:
        with os.fdopen(r, "rb") as stream:
            try:
                outcome.append(read_frame(stream, max_size=1000))
            except ProtocolError as exc:
                outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(5)
    os.close(w)
    thread.join(5)
    assert outcome and isinstance(outcome[0], ProtocolError), outcome
    assert "exceeds the limit of 1000 bytes" in str(outcome[0])

    async def read_async() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(b"Content-Length: 999999\r\n\r\n")  # no EOF: a body read would wait
        with pytest.raises(ProtocolError, match="exceeds the limit of 1000 bytes"):
            await asyncio.wait_for(read_frame_async(reader, max_size=1000), 5)

    asyncio.run(read_async())


def test_a_header_block_of_exactly_the_limit_is_read() -> None:
    tail = b"\r\nContent-Length: 2\r\n\r\n"
    data = b"X: " + b"a" * (MAX_HEADER_SIZE - len(b"X: ") - len(tail)) + tail + b"{}"
    assert _both(data, 1024) == ([b"{}"], [b"{}"])
    assert isinstance(_both(b"X: a" + data[3:], 1024)[0], ProtocolError)


def test_a_large_body_arrives_whole_from_an_unbuffered_pipe() -> None:
    """A raw pipe (what Popen(bufsize=0) gives) returns at most a pipe's worth per read: the reader loops."""
    body = b'{"x":"' + b"y" * 3_000_000 + b'"}'
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, frame(body)) and None, os.close(w)), daemon=True)
    writer.start()
    with os.fdopen(r, "rb", buffering=0) as stream:
        assert read_frame(stream) == body
        assert read_frame(stream) is None
    writer.join(10)


def test_a_long_header_line_is_refused_before_it_is_buffered() -> None:
    """With STREAM_LIMIT, a header line with no end is refused once the limit is reached, not at EOF."""

    async def read() -> None:
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        reader.feed_data(b"X-Pad: " + b"a" * 20_000)  # no newline, no EOF: only the limit ends the read
        with pytest.raises(ProtocolError, match="frame header longer than 8192 bytes"):
            await asyncio.wait_for(read_frame_async(reader), 5)

    asyncio.run(read())


def test_a_claimed_huge_frame_is_refused_whatever_follows() -> None:
    sync, async_ = _both(b"Content-Length: 73400320\r\n\r\n" + b"\x00garbage" * 10, DEFAULT_MAX_SIZE)
    for result in (sync, async_):
        assert isinstance(result, ProtocolError)
        assert result.message == f"frame of 73400320 bytes exceeds the limit of {DEFAULT_MAX_SIZE} bytes"


# -- JSON-RPC -------------------------------------------------------------------------------------------

MESSAGES: list[rpc.Message] = [
    rpc.Request(method="tool/run", id=1, params={"tool": "read_file", "args": {"path": "a"}}),
    rpc.Request(method="now", id="abc"),
    rpc.Notification(method="$/log", params=["x"]),
    rpc.Response(id=1, result={"ok": True}),
    rpc.Response(id="x", result=None),
    rpc.ErrorResponse(id=2, error=rpc.ErrorObject(code=-32601, message="no such method", data={"m": "x"})),
    rpc.ErrorResponse(id=None, error=rpc.ErrorObject(code=-32700, message="parse error")),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_rpc_round_trip_through_frames(message: rpc.Message) -> None:
    (body,), _ = _both(frame(rpc.encode(message)))
    assert rpc.decode(body) == message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"{not json", "not a JSON object"),
        (b"[1, 2]", "not a JSON object"),
        (b'"text"', "not a JSON object"),
        (b'{"method": "now", "id": 1}', 'lacks "jsonrpc": "2.0"'),
        (b'{"jsonrpc": "1.0", "method": "now", "id": 1}', "got '1.0'"),
        (b'{"jsonrpc": "2.0"}', "neither a request, a notification nor a response"),
        (b'{"jsonrpc": "2.0", "method": 5, "id": 1}', "malformed request"),
        (b'{"jsonrpc": "2.0", "method": "now", "id": 1.5}', "malformed request"),
        (b'{"jsonrpc": "2.0", "method": "now", "id": [1]}', "malformed request"),
        (b'{"jsonrpc": "2.0", "id": 1, "error": {"code": "x", "message": "m"}}', "malformed errorresponse"),
        (b'{"jsonrpc": "2.0", "id": 1, "error": {"code": 1}}', "malformed errorresponse"),
        (b"\xff\xfe", "not a JSON object"),
    ],
)
def test_malformed_json_rpc_says_what(body: bytes, expected: str) -> None:
    with pytest.raises(ProtocolError) as info:
        rpc.decode(body)
    assert expected in info.value.message


def test_big_frame_from_an_unbuffered_pipe_arrives_whole() -> None:
    """A subagent reads its agent's stdout unbuffered (bufsize=0): a body larger than the pipe's buffer
    comes in several reads, and every one of them belongs to the same frame."""
    body = b'{"content":"' + b"x" * 300_000 + b'"}'
    r, w = os.pipe()

    def write() -> None:
        data = frame(body) + frame(b"{}")
        for at in range(0, len(data), 10_000):  # in pieces, so the reader surely sees a short read
            os.write(w, data[at : at + 10_000])
        os.close(w)

    threading.Thread(target=write, daemon=True).start()
    with os.fdopen(r, "rb", buffering=0) as stream:
        assert read_frame(stream) == body
        assert read_frame(stream) == b"{}"
        assert read_frame(stream) is None
