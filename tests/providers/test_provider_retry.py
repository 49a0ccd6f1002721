"""retry.py on its own: full-jitter backoff bounds, Retry-After parsing, the retry loop's limits; the
health transition table refuses illegal moves."""

from __future__ import annotations

import email.utils
import random
import time

import pytest
from providerkit import FAST

from keel.protocol.errors import InvalidTransitionError
from keel.server.providers.health import HEALTH_TRANSITIONS, EndpointHealth, EndpointTracker, HealthState
from keel.server.providers.retry import AttemptFailure, Backoff, FailureKind, parse_retry_after, retry_call


def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    backoff, rng = Backoff(base_s=0.1, cap_s=1.0, max_attempts=9), random.Random(7)
    for attempt, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        delays = [backoff.delay(attempt, rng) for _ in range(300)]
        assert min(delays) >= 0.0 and max(delays) <= ceiling
        assert max(delays) > ceiling * 0.8 and min(delays) < ceiling * 0.2  # spread over the whole range


def test_retry_after_seconds_and_http_date() -> None:
    now = time.time()
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


async def test_retry_call_stops_at_max_attempts_and_on_non_retry_kinds() -> None:
    calls: list[int] = []

    async def always(kind: FailureKind) -> None:
        calls.append(1)
        raise AttemptFailure(kind, "no")

    with pytest.raises(AttemptFailure):
        await retry_call(lambda: always(FailureKind.SERVER_ERROR), Backoff(0.001, 0.001, 4))
    assert len(calls) == 4
    calls.clear()
    with pytest.raises(AttemptFailure):
        await retry_call(lambda: always(FailureKind.AUTH), Backoff(0.001, 0.001, 4))
    assert len(calls) == 1


async def test_retry_call_asks_before_each_retry() -> None:
    seen: list[tuple[int, float]] = []
    attempts = iter([AttemptFailure(FailureKind.RATE_LIMITED, "slow down", 429, retry_after=0.05), None])

    async def attempt() -> str:
        failure = next(attempts)
        if failure:
            raise failure
        return "done"

    async def before(failure: AttemptFailure, number: int, wait: float) -> bool:
        seen.append((number, wait))
        return True

    assert await retry_call(attempt, Backoff(5.0, 5.0, 3), before_retry=before) == "done"
    assert seen == [(1, 0.05)]  # Retry-After, not the (long) backoff


def test_illegal_health_transition_raises() -> None:
    assert HealthState.DEGRADED not in HEALTH_TRANSITIONS[HealthState.COOLING_DOWN]
    tracker = EndpointTracker(
        EndpointHealth(
            provider="p", endpoint="0", url="http://127.0.0.1:1/v1", model="m", state=HealthState.COOLING_DOWN
        ),
        FAST,
        lambda e: None,
        lambda t: None,
    )
    with pytest.raises(InvalidTransitionError, match="p/0 cannot go from cooling_down to degraded"):
        tracker._set_state(HealthState.DEGRADED, "test")
