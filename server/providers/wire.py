"""HTTP for model calls: one POST, plain JSON or a server-sent-event stream, every failure classified.

`post` returns the decoded JSON body, or whatever `parse_stream` builds from the stream's events. A
streamed answer is assembled in local variables and returned only once its end marker has arrived, so
a cancelled or cut call leaves nothing half-written anywhere: cancellation propagates, a cut raises
AttemptFailure(stream_cut). Every message is redacted; the request (with its headers) never escapes.
Depends on httpx and the providers' retry/errors modules only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx

from keel.server.providers.errors import redact
from keel.server.providers.retry import (
    AttemptFailure,
    FailureKind,
    classify_exception,
    classify_response,
    parse_retry_after,
)

T = TypeVar("T")
SseEvent = tuple[str, str]  # (event name, data)


async def post(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    parse_stream: Callable[[AsyncIterator[SseEvent]], Awaitable[T]] | None = None,
) -> T | Any:
    streaming = False
    try:
        async with client.stream("POST", url, headers=headers, json=body) as response:
            if response.status_code >= 400:
                raise http_failure(url, response, await response.aread())
            if parse_stream is not None:
                streaming = True
                return await parse_stream(sse_events(response))
            raw = await response.aread()
    except httpx.HTTPError as exc:
        kind = classify_exception(exc)
        if streaming and kind is FailureKind.CONNECTION:
            kind = FailureKind.STREAM_CUT
        raise AttemptFailure(kind, redact(f"{url}: {describe(exc)}")) from None
    try:
        return json.loads(raw)
    except ValueError:
        raise AttemptFailure(FailureKind.SERVER_ERROR, redact(f"{url}: answer is not JSON: {raw[:200]!r}")) from None


def describe(exc: BaseException) -> str:
    """The first non-empty message along an exception's chain, with its type."""
    current: BaseException | None = exc
    while current is not None:
        if str(current):
            return f"{type(exc).__name__}: {current}"
        current = current.__cause__ or current.__context__
    return type(exc).__name__


def http_failure(url: str, response: httpx.Response, raw: bytes) -> AttemptFailure:
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = raw.decode("utf-8", "replace")[:500]
    kind = classify_response(response.status_code, body) or FailureKind.SERVER_ERROR
    detail = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(detail, dict):
        detail = detail.get("message") or detail
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    return AttemptFailure(
        kind,
        redact(f"{url}: HTTP {response.status_code}: {str(detail)[:300]}"),
        status=response.status_code,
        retry_after=retry_after,
    )


async def sse_events(response: httpx.Response) -> AsyncIterator[SseEvent]:
    """Server-sent events as (event, data); comments and ids are skipped; multi-line data is joined."""
    event, data = "", list[str]()
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", list[str]()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line.startswith("event:"):
            event = line[6:].strip()
    if data:
        yield event or "message", "\n".join(data)


def stream_cut(url: str, what: str) -> AttemptFailure:
    return AttemptFailure(FailureKind.STREAM_CUT, f"{url}: the stream ended before {what}")


def load_event(url: str, data: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        raise AttemptFailure(FailureKind.STREAM_CUT, redact(f"{url}: unreadable stream event {data[:120]!r}")) from None
    if not isinstance(value, dict):
        raise AttemptFailure(FailureKind.STREAM_CUT, f"{url}: stream event is not an object")
    return value
