"""Content-Length framing (as in LSP) for the agent protocol, sync and asyncio flavours.

A frame is `Content-Length: N\r\n` (other headers allowed and ignored), an empty line, then N bytes of
UTF-8 JSON. Frames larger than `max_size` are refused before their body is read.
"""

from __future__ import annotations

import asyncio
from typing import BinaryIO

from keel.protocol.errors import ProtocolError

DEFAULT_MAX_SIZE = 64 * 1024 * 1024
_MAX_HEADER_LINE = 8 * 1024


def frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _content_length(headers: list[bytes], max_size: int) -> int:
    length: int | None = None
    for line in headers:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ProtocolError(f"malformed header line {line[:80]!r}: expected 'Name: value'")
        if name.strip().lower() == b"content-length":
            text = value.strip()
            digits = text.removeprefix(b"-")
            if not digits.isdigit() or len(digits) > 18:
                raise ProtocolError(f"Content-Length is not a number: {text[:40]!r}")
            length = int(text)
    if length is None:
        raise ProtocolError("frame has no Content-Length header")
    if length < 0:
        raise ProtocolError(f"negative Content-Length {length}")
    if length > max_size:
        raise ProtocolError(f"frame of {length} bytes exceeds the maximum message size of {max_size}")
    return length


def _header_line(line: bytes) -> bytes | None:
    """The header line without its line ending, or None for the blank separator line."""
    if len(line) > _MAX_HEADER_LINE:
        raise ProtocolError(f"header line longer than {_MAX_HEADER_LINE} bytes")
    if not line.endswith(b"\n"):
        raise ProtocolError("stream ended inside a frame header")
    stripped = line.rstrip(b"\r\n")
    return stripped or None


def read_frame(stream: BinaryIO, max_size: int = DEFAULT_MAX_SIZE) -> bytes | None:
    """Read one frame body; None at a clean end of stream (before any header byte)."""
    headers: list[bytes] = []
    while True:
        line = stream.readline(_MAX_HEADER_LINE + 1)
        if not line and not headers:
            return None
        header = _header_line(line)
        if header is None:
            break
        headers.append(header)
    length = _content_length(headers, max_size)
    body = stream.read(length)
    while len(body) < length:  # an unbuffered pipe returns what it has: a big frame arrives in pieces
        more = stream.read(length - len(body))
        if not more:
            raise ProtocolError(f"stream ended after {len(body)} of {length} body bytes")
        body += more
    return body


async def read_frame_async(reader: asyncio.StreamReader, max_size: int = DEFAULT_MAX_SIZE) -> bytes | None:
    """Async twin of read_frame for asyncio streams."""
    headers: list[bytes] = []
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial and not headers:
                return None
            raise ProtocolError("stream ended inside a frame header") from None
        except asyncio.LimitOverrunError:
            raise ProtocolError("header line too long") from None
        header = _header_line(line)
        if header is None:
            break
        headers.append(header)
    length = _content_length(headers, max_size)
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError(f"stream ended after {len(exc.partial)} of {length} body bytes") from None
