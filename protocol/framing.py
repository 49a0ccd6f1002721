"""Content-Length framing (as in LSP) for the agent protocol, sync and asyncio flavours.

A frame is `Content-Length: N\r\n` (other headers allowed and ignored), an empty line, then N bytes of
UTF-8 JSON. Limits are enforced before anything is allocated for them: a header block (all its lines)
longer than MAX_HEADER_SIZE is refused as soon as that many bytes arrived, a frame larger than `max_size`
before its body is read, and a body is read in chunks, so a peer that claims a large frame and then
sends nothing costs nothing. Asyncio streams should be made with `limit=STREAM_LIMIT`, which bounds what
a header line can make the StreamReader buffer. Depends only on the standard library and errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, BinaryIO

from keel.protocol.errors import ProtocolError

if TYPE_CHECKING:  # asyncio is imported by the async reader only: a thread-based worker never loads it
    import asyncio

DEFAULT_MAX_SIZE = 64 * 1024 * 1024
MAX_HEADER_SIZE = 8 * 1024
STREAM_LIMIT = MAX_HEADER_SIZE + 2  # a StreamReader's line limit: one header line and its CRLF
_CHUNK = 1024 * 1024


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
        raise ProtocolError(f"frame of {length} bytes exceeds the limit of {max_size} bytes")
    return length


def _header_line(line: bytes, used: int) -> bytes | None:
    """The header line without its line ending, or None for the blank separator line; `used` is the size
    of the header block so far, this line included."""
    if used > MAX_HEADER_SIZE:
        raise ProtocolError(f"frame header longer than {MAX_HEADER_SIZE} bytes")
    if not line.endswith(b"\n"):
        raise ProtocolError("stream ended inside a frame header")
    stripped = line.rstrip(b"\r\n")
    return stripped or None


def read_frame(stream: BinaryIO, max_size: int = DEFAULT_MAX_SIZE) -> bytes | None:
    """Read one frame body; None at a clean end of stream (before any header byte)."""
    headers: list[bytes] = []
    used = 0
    while True:
        line = stream.readline(MAX_HEADER_SIZE - used + 1)
        if not line and not headers:
            return None
        used += len(line)
        header = _header_line(line, used)
        if header is None:
            break
        headers.append(header)
    length = _content_length(headers, max_size)
    chunks: list[bytes] = []
    got = 0
    while got < length:  # a raw (unbuffered) stream returns what one read(2) gives
        chunk = stream.read(min(_CHUNK, length - got))
        if not chunk:
            raise ProtocolError(f"stream ended after {got} of {length} body bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


async def read_frame_async(reader: asyncio.StreamReader, max_size: int = DEFAULT_MAX_SIZE) -> bytes | None:
    """Async twin of read_frame for asyncio streams."""
    import asyncio

    headers: list[bytes] = []
    used = 0
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial and not headers:
                return None
            _header_line(exc.partial + b"\n", used + len(exc.partial))  # too long says so first
            raise ProtocolError("stream ended inside a frame header") from None
        except asyncio.LimitOverrunError:
            raise ProtocolError(f"frame header longer than {MAX_HEADER_SIZE} bytes") from None
        used += len(line)
        header = _header_line(line, used)
        if header is None:
            break
        headers.append(header)
    length = _content_length(headers, max_size)
    chunks: list[bytes] = []
    got = 0
    while got < length:
        try:
            chunk = await reader.readexactly(min(_CHUNK, length - got))
        except asyncio.IncompleteReadError as exc:
            raise ProtocolError(f"stream ended after {got + len(exc.partial)} of {length} body bytes") from None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
