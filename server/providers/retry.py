"""Retry for any network client (model providers now, tool servers later): classification, backoff, loop.

- `FailureKind` names what went wrong; `CLASSIFICATION` says what to do about it (docs/providers.md has
  the same table in prose, and tests/providers/test_classification.py drives one real fault per row).
- `classify_exception` / `classify_response` turn httpx and OS errors and HTTP answers into a kind.
- `Backoff` is exponential backoff with full jitter, a cap and a maximum number of attempts.
- `parse_retry_after` reads Retry-After in seconds or as an HTTP-date.
- `retry_call` is the loop: it runs an attempt, retries what the table says to retry, honours
  Retry-After (up to a cap) and asks the caller before each retry.

Depends on the standard library and httpx only; knows nothing of providers, health or the store.
"""

from __future__ import annotations

import email.utils
import enum
import random
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import httpx

T = TypeVar("T")


class FailureKind(enum.StrEnum):
    TIMEOUT = "timeout"  # connect or read timeout
    CONNECTION = "connection"  # refused, reset, closed without an answer
    SERVER_ERROR = "server_error"  # HTTP 5xx (and 529 "overloaded")
    RATE_LIMITED = "rate_limited"  # HTTP 429
    STREAM_CUT = "stream_cut"  # a streamed answer that stopped before its end marker
    DNS = "dns"  # the host name does not resolve
    TLS = "tls"  # certificate or handshake failure
    AUTH = "auth"  # HTTP 401 / 403, or no key where one is needed
    UNKNOWN_MODEL = "unknown_model"  # HTTP 404 or error code model_not_found
    CONTEXT_EXCEEDED = "context_exceeded"  # the prompt does not fit the model's context window
    BAD_REQUEST = "bad_request"  # any other 4xx: the request itself is wrong


class Action(enum.StrEnum):
    RETRY = "retry"  # the same endpoint again, after a backoff (or Retry-After)
    FAILOVER = "failover"  # the next candidate at once
    FAILOVER_LARGER = "failover_larger"  # the next candidate with a larger context window only
    FAIL = "fail"  # no retry, no failover: the caller gets the error


K, A = FailureKind, Action
CLASSIFICATION: dict[FailureKind, Action] = {
    K.TIMEOUT: A.RETRY,
    K.CONNECTION: A.RETRY,
    K.SERVER_ERROR: A.RETRY,
    K.RATE_LIMITED: A.RETRY,
    K.STREAM_CUT: A.RETRY,
    K.DNS: A.FAILOVER,
    K.TLS: A.FAILOVER,
    K.AUTH: A.FAILOVER,
    K.UNKNOWN_MODEL: A.FAILOVER,
    K.CONTEXT_EXCEEDED: A.FAILOVER_LARGER,
    K.BAD_REQUEST: A.FAIL,
}

#: Failures where no HTTP answer arrived at all; when every candidate ends in one of these, we are offline.
CONNECTION_LEVEL = frozenset({K.TIMEOUT, K.CONNECTION, K.DNS})


@dataclass
class AttemptFailure(Exception):
    """One failed attempt, classified; `message` is already free of secrets."""

    kind: FailureKind
    message: str
    status: int | None = None
    retry_after: float | None = None  # seconds, from a Retry-After header

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"

    @property
    def action(self) -> Action:
        return CLASSIFICATION[self.kind]


_DNS_TEXT = (
    "name or service not known",
    "temporary failure in name resolution",
    "nodename nor servname",
    "getaddrinfo failed",
    "no address associated with hostname",
)


def classify_exception(exc: BaseException) -> FailureKind:
    """The kind of a transport-level failure (httpx or plain socket errors)."""
    chain = _chain(exc)
    text = " ".join(str(e).lower() for e in chain)
    if any(isinstance(e, socket.gaierror) for e in chain) or any(t in text for t in _DNS_TEXT):
        return K.DNS
    if any(isinstance(e, ssl.SSLError | ssl.CertificateError) for e in chain) or "certificate_verify_failed" in text:
        return K.TLS
    if any(isinstance(e, httpx.TimeoutException | TimeoutError) for e in chain):
        return K.TIMEOUT
    return K.CONNECTION


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


_CONTEXT_TEXT = (
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "prompt is too long",
    "too many tokens",
    "context window",
)


def classify_response(status: int, body: Any) -> FailureKind | None:
    """The kind of an HTTP answer (None: success). `body` is the decoded JSON error body, or text."""
    if status < 400:
        return None
    code, message = _error_fields(body)
    if code == "model_not_found" or status == 404:
        return K.UNKNOWN_MODEL
    if code == "context_length_exceeded" or (status in (400, 413, 422) and any(t in message for t in _CONTEXT_TEXT)):
        return K.CONTEXT_EXCEEDED
    if status in (401, 403):
        return K.AUTH
    if status == 429:
        return K.RATE_LIMITED
    if status == 408:
        return K.TIMEOUT
    if status >= 500:
        return K.SERVER_ERROR
    return K.BAD_REQUEST


def _error_fields(body: Any) -> tuple[str, str]:
    """(code, lower-case message) from OpenAI-style {"error": {...}} or Anthropic-style bodies."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            code = str(error.get("code") or error.get("type") or "")
            return code, str(error.get("message", "")).lower()
        return "", str(error).lower()
    return "", str(body).lower()


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds from now: a number of seconds or an HTTP-date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(cap, base * 2**(n-1)))."""

    base_s: float = 0.5
    cap_s: float = 30.0
    max_attempts: int = 4

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        ceiling = min(self.cap_s, self.base_s * (2 ** max(0, attempt - 1)))
        return (rng or random).uniform(0.0, ceiling)


#: Called before a retry with (failure, attempt just failed, delay to wait); returning False stops retrying.
BeforeRetry = Callable[[AttemptFailure, int, float], Awaitable[bool]]


async def retry_call(
    attempt: Callable[[], Awaitable[T]],
    backoff: Backoff,
    *,
    retry_after_cap_s: float = 120.0,
    before_retry: BeforeRetry | None = None,
) -> T:
    """Run `attempt` until it succeeds, fails with a non-retry kind, or the attempts are used up.

    `attempt` raises AttemptFailure for a classified failure; anything else propagates untouched
    (cancellation included). The last AttemptFailure is raised when retrying stops.
    """
    number = 0
    while True:
        number += 1
        try:
            return await attempt()
        except AttemptFailure as failure:
            if failure.action is not Action.RETRY or number >= backoff.max_attempts:
                raise
            if failure.retry_after is not None and failure.retry_after > retry_after_cap_s:
                raise
            wait = failure.retry_after if failure.retry_after is not None else backoff.delay(number)
            if before_retry is not None and not await before_retry(failure, number, wait):
                raise
            await anyio.sleep(wait)
